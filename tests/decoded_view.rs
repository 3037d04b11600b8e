//! The decoded view: `<lane>@decoded` in the mount and `export --decode` show encoded tensors
//! as plain tensors of their logical dtype, decoded.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use common::*;
use tensorfs::format::header::HEADER_FORMAT;
use tensorfs::format::{
    Body, ClassRef, Component, Dtype, Encoding, Header, Location, Part, Repo, Tensor, Tree, Value,
};
use tensorfs::store::Store;

/// A store holding `local/q`: one lane `int8` whose `w` is int8.rowwise ([2, 4], BF16) and
/// whose `b` is plain F32.
fn quantized_store(root: &Path) {
    let store = Store::open(root).unwrap();
    let weight: Vec<u8> = [1i8, -2, 3, -4, 5, -6, 7, -8]
        .iter()
        .map(|&v| v as u8)
        .collect();
    let mut chunk = vec![0u8; 8192 + 8];
    chunk[..8].copy_from_slice(&weight);
    chunk[4096..4104].copy_from_slice(
        &[0.5f32, 2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<_>>(),
    );
    chunk[8192..].copy_from_slice(
        &[1.0f32, 2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<_>>(),
    );
    let chunk = store.put_bytes(&chunk).unwrap();
    let location = |offset, length| Location {
        chunk: 0,
        offset,
        length,
    };
    let header = Header {
        format: HEADER_FORMAT.into(),
        chunks: vec![chunk],
        encodings: vec![Encoding {
            scheme: "int8.rowwise".into(),
            params: BTreeMap::new(),
        }],
        pipeline: None,
        components: vec![Component {
            name: "model".into(),
            class: ClassRef {
                library: "transformers".into(),
                version: "4.44.0".into(),
                name: "BertModel".into(),
            },
            config: BTreeMap::from([
                (
                    "architectures".to_owned(),
                    Value::Array(vec![Value::Text("BertModel".into())]),
                ),
                (
                    "quantization_config".to_owned(),
                    Value::map([("quant_method".to_owned(), Value::Text("x".into()))]),
                ),
            ]),
            tensors: vec![
                Tensor {
                    key: "w".into(),
                    dtype: Dtype::BF16,
                    shape: vec![2, 4],
                    body: Body::Encoded {
                        encoding: 0,
                        parts: vec![
                            Part {
                                role: "weight".into(),
                                dtype: Dtype::I8,
                                shape: vec![2, 4],
                                location: location(0, 8),
                            },
                            Part {
                                role: "scale".into(),
                                dtype: Dtype::F32,
                                shape: vec![2],
                                location: location(4096, 8),
                            },
                        ],
                    },
                },
                Tensor {
                    key: "b".into(),
                    dtype: Dtype::F32,
                    shape: vec![2],
                    body: Body::Plain(location(8192, 8)),
                },
            ],
            assets: BTreeMap::new(),
            config_file: None,
        }],
        metadata: BTreeMap::new(),
    };
    let header = store.put_bytes(&header.to_cbor().unwrap()).unwrap();
    let tree = Tree {
        lane: Some("int8".into()),
        files: BTreeMap::from([("model.cozytensors".to_owned(), header)]),
    };
    let commit = store.put_bytes(&tree.to_json()).unwrap();
    store
        .update_repo("local/q", |_| Repo {
            name: "local/q".into(),
            releases: vec![],
            commits: vec![commit],
        })
        .unwrap();
}

fn check_decoded(file: &Path) {
    let bytes = fs::read(file).unwrap();
    let parsed = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names = parsed.names();
    names.sort();
    assert_eq!(names, ["b", "w"], "companion parts are gone");
    let w = parsed.tensor("w").unwrap();
    assert_eq!(
        (w.dtype(), w.shape()),
        (safetensors::Dtype::BF16, &[2usize, 4][..])
    );
    let values: Vec<f32> = w
        .data()
        .chunks(2)
        .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
        .collect();
    assert_eq!(values, [0.5, -1.0, 1.5, -2.0, 10.0, -12.0, 14.0, -16.0]);
}

#[test]
fn export_decode_writes_plain_logical_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    quantized_store(&store);
    let stored = dir.path().join("stored");
    ok(&store, &["export", "local/q", stored.to_str().unwrap()]);
    let names =
        safetensors::SafeTensors::deserialize(&fs::read(stored.join("model.safetensors")).unwrap())
            .unwrap()
            .names()
            .len();
    assert_eq!(names, 3, "as stored, the scale is a tensor of its own");
    let decoded = dir.path().join("decoded");
    ok(
        &store,
        &["export", "local/q", decoded.to_str().unwrap(), "--decode"],
    );
    check_decoded(&decoded.join("model.safetensors"));
    let config = fs::read_to_string(decoded.join("config.json")).unwrap();
    assert!(!config.contains("quantization_config"), "{config}");
}

#[test]
fn the_mount_shows_a_decoded_view_beside_each_encoded_lane() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    quantized_store(&store);
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let log = dir.path().join("mount.log");
    ok(
        &store,
        &[
            "mount",
            mnt.to_str().unwrap(),
            "--log-file",
            log.to_str().unwrap(),
        ],
    );
    let result = std::panic::catch_unwind(|| {
        let latest = mnt.join("local/q/latest");
        let mut lanes: Vec<String> = fs::read_dir(&latest)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        lanes.sort();
        assert_eq!(lanes, ["int8", "int8@decoded"]);
        check_decoded(&latest.join("int8@decoded/model.safetensors"));
        assert_eq!(
            fs::read(latest.join("int8/model.safetensors"))
                .unwrap()
                .len(),
            fs::metadata(latest.join("int8/model.safetensors"))
                .unwrap()
                .len() as usize
        );
    });
    ok(&store, &["unmount", mnt.to_str().unwrap()]);
    result.unwrap();
}
