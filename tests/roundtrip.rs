//! Property: any valid safetensors file, whatever its header's key order, spacing, padding
//! and metadata, imports and is synthesized back byte for byte, parses with the safetensors
//! crate, and gives the same ids when imported again.

use std::collections::BTreeSet;
use std::fs;

use proptest::prelude::*;
use tensorfs::import::{import, ImportConfig, Quiet};
use tensorfs::io::{BlobReader, BlobReaderConfig};
use tensorfs::layout::LaneView;
use tensorfs::store::Store;

const DTYPES: [(&str, usize); 9] = [
    ("BOOL", 1),
    ("U8", 1),
    ("I8", 1),
    ("F8_E4M3", 1),
    ("F16", 2),
    ("BF16", 2),
    ("F32", 4),
    ("I64", 8),
    ("F64", 8),
];

#[derive(Debug, Clone)]
struct Spec {
    /// (name, dtype index, shape)
    tensors: Vec<(String, usize, Vec<usize>)>,
    metadata: Option<Vec<(String, String)>>,
    /// Header layout: metadata position, key order reversal, spaces after separators.
    metadata_last: bool,
    reverse: bool,
    spaced: bool,
    padding: usize,
}

fn spec() -> impl Strategy<Value = Spec> {
    let name = "[a-z]{1,6}(\\.[0-9]{1,2})?(\\.[a-z_]{1,8}){0,2}";
    let tensor = (
        name,
        0..DTYPES.len(),
        prop::collection::vec(0usize..5, 0..4),
    );
    let meta = prop::option::of(prop::collection::vec(("[a-z_]{1,8}", "[ -~é]{0,12}"), 0..4));
    (
        prop::collection::vec(tensor, 0..8),
        meta,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        0usize..9,
    )
        .prop_map(
            |(tensors, metadata, metadata_last, reverse, spaced, padding)| {
                let mut seen = BTreeSet::new();
                let tensors = tensors
                    .into_iter()
                    .filter(|(n, _, _)| seen.insert(n.clone()))
                    .collect();
                let metadata = metadata.map(|m| {
                    let mut keys = BTreeSet::new();
                    m.into_iter()
                        .filter(|(k, _)| keys.insert(k.clone()))
                        .collect()
                });
                Spec {
                    tensors,
                    metadata,
                    metadata_last,
                    reverse,
                    spaced,
                    padding,
                }
            },
        )
}

/// A safetensors file as some producer might write it: data in tensor order, header keys in
/// any order, with or without spaces and padding.
fn file(spec: &Spec) -> Vec<u8> {
    let sep = if spec.spaced { ", " } else { "," };
    let colon = if spec.spaced { ": " } else { ":" };
    let mut entries = Vec::new();
    let mut data = Vec::new();
    for (i, (name, dtype, shape)) in spec.tensors.iter().enumerate() {
        let (dtype, width) = DTYPES[*dtype];
        let n: usize = shape.iter().product::<usize>() * width;
        let begin = data.len();
        data.extend((0..n).map(|j| (i * 31 + j * 7) as u8 % if dtype == "BOOL" { 2 } else { 251 }));
        let shape: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        entries.push(format!(
            "{}{colon}{{\"dtype\"{colon}\"{dtype}\"{sep}\"shape\"{colon}[{}]{sep}\"data_offsets\"{colon}[{begin}{sep}{}]}}",
            serde_json::to_string(name).unwrap(),
            shape.join(sep),
            data.len()
        ));
    }
    if spec.reverse {
        entries.reverse();
    }
    if let Some(meta) = &spec.metadata {
        let pairs: Vec<String> = meta
            .iter()
            .map(|(k, v)| {
                format!(
                    "{}{colon}{}",
                    serde_json::to_string(k).unwrap(),
                    serde_json::to_string(v).unwrap()
                )
            })
            .collect();
        let entry = format!("\"__metadata__\"{colon}{{{}}}", pairs.join(sep));
        if spec.metadata_last {
            entries.push(entry);
        } else {
            entries.insert(0, entry);
        }
    }
    let mut header = format!("{{{}}}", entries.join(sep));
    header.push_str(&" ".repeat(spec.padding));
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&data);
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn any_valid_file_round_trips_byte_for_byte(spec in spec()) {
        let bytes = file(&spec);
        safetensors::SafeTensors::deserialize(&bytes).expect("the generator writes valid files");
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("w.safetensors");
        fs::write(&src, &bytes).unwrap();
        let store = Store::open(dir.path().join("store")).unwrap();
        let report = import(&store, std::slice::from_ref(&src), "local/w", &ImportConfig::default(), &Quiet).unwrap();
        let again = import(&store, &[src], "local/w", &ImportConfig::default(), &Quiet).unwrap();
        prop_assert_eq!(&report.lanes[0].commit, &again.lanes[0].commit);

        let repo = store.repo("local/w").unwrap().unwrap();
        let commit = store.commit(repo.commits.last().unwrap()).unwrap();
        let view = LaneView::build(&commit.id, &commit.tree, &commit.header).unwrap();
        let content = &view.file("w.safetensors").expect("the file keeps its name").content;
        let reader = BlobReader::new(store.clone(), BlobReaderConfig::default());
        let mut out = vec![0u8; content.size() as usize];
        let n = content.read_at(&reader, 0, &mut out).unwrap();
        prop_assert_eq!(n, bytes.len());
        prop_assert_eq!(out, bytes);
    }
}
