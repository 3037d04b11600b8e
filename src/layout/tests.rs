//! Lane views and reads, against an in-memory object source.

use std::collections::{BTreeMap, HashMap};
use std::io;

use super::{Content, LaneView};
use crate::format::header::HEADER_FORMAT;
use crate::format::{Body, ClassRef, Component, Dtype, Header, Location, ObjectRef, Tree};
use crate::io::ObjectSource;

/// Objects in memory.
struct Memory {
    objects: HashMap<ObjectRef, Vec<u8>>,
}

impl ObjectSource for Memory {
    fn read_object(&self, object: &ObjectRef, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let bytes = &self.objects[object];
        buf.copy_from_slice(&bytes[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
}

/// A model of two tensors whose second spans two chunks, laid out canonically.
fn model() -> (Memory, LaneView, Vec<u8>) {
    let (memory, header, a, b) = two_tensors();
    let tree = Tree {
        lane: Some("u8".into()),
        files: BTreeMap::from([("model.cozytensors".to_owned(), ObjectRef::of(b"header"))]),
    };
    let view = LaneView::build(&ObjectRef::of(b"commit"), &tree, &header).unwrap();
    let file = view.file("model.safetensors").expect("the weights file");
    let mut expected = vec![0u8; file.content.size() as usize];
    file.content.read_at(&memory, 0, &mut expected).unwrap();
    let mut tail = a.clone();
    tail.extend_from_slice(&b);
    assert!(
        expected.ends_with(&tail),
        "tensors follow the header in safetensors order"
    );
    (memory, view, expected)
}

/// Component `model` of U8 tensors `a` (16 bytes) and `b` (40 bytes, spanning two chunks),
/// the chunks in memory, and the tensors' bytes.
fn two_tensors() -> (Memory, Header, Vec<u8>, Vec<u8>) {
    let a: Vec<u8> = (0..16u8).collect();
    let b: Vec<u8> = (0..40u32).map(|i| (i * 7) as u8).collect();
    // chunk 0: a at 0, b's first 24 bytes at 4096; chunk 1: b's last 16 bytes.
    let mut chunk0 = vec![0u8; 4096 + 24];
    chunk0[..16].copy_from_slice(&a);
    chunk0[4096..].copy_from_slice(&b[..24]);
    let chunk1 = b[24..].to_vec();
    let chunks = vec![ObjectRef::of(&chunk0), ObjectRef::of(&chunk1)];
    let tensor = |key: &str, shape: u64, location| crate::format::Tensor {
        key: key.into(),
        dtype: Dtype::U8,
        shape: vec![shape],
        body: Body::Plain(location),
    };
    let header = Header {
        format: HEADER_FORMAT.into(),
        chunks: chunks.clone(),
        encodings: vec![],
        pipeline: None,
        components: vec![Component {
            name: "model".into(),
            class: ClassRef::default(),
            config: BTreeMap::new(),
            tensors: vec![
                tensor(
                    "a",
                    16,
                    Location {
                        chunk: 0,
                        offset: 0,
                        length: 16,
                    },
                ),
                tensor(
                    "b",
                    40,
                    Location {
                        chunk: 0,
                        offset: 4096,
                        length: 40,
                    },
                ),
            ],
            assets: BTreeMap::new(),
            config_file: None,
        }],
        metadata: BTreeMap::new(),
    };
    let objects = HashMap::from([(chunks[0], chunk0), (chunks[1], chunk1)]);
    (Memory { objects }, header, a, b)
}

#[test]
fn an_array_of_a_tensors_rows_in_another_order_reads_them_across_chunks() {
    use super::recipe::{ArraySource, SourceFile, SourceFiles, TensorRows, SOURCE_FILES};
    let (memory, mut header, _, b) = two_tensors();
    // An original adaLN projection: the second part of b's rows (all in chunk 1, past the
    // 24 bytes in chunk 0), then the first (across the chunk boundary).
    let json = r#"{"ba":{"dtype":"U8","shape":[40],"data_offsets":[0,40]}}"#;
    let rows = vec![
        TensorRows::part("b", (30, 40)),
        TensorRows::part("b", (0, 30)),
    ];
    let recipe = SourceFiles(BTreeMap::from([(
        "original.safetensors".to_owned(),
        SourceFile::Safetensors {
            component: "model".into(),
            header: json.into(),
            arrays: BTreeMap::from([(
                "ba".to_owned(),
                ArraySource::Rows {
                    component: "model".into(),
                    tensors: rows,
                },
            )]),
        },
    )]));
    header
        .metadata
        .insert(SOURCE_FILES.into(), recipe.to_value());
    assert_eq!(SourceFiles::of(&header).unwrap().as_ref(), Some(&recipe));
    let tree = Tree {
        lane: Some("u8".into()),
        files: BTreeMap::from([("model.cozytensors".to_owned(), ObjectRef::of(b"header"))]),
    };
    let view = LaneView::build(&ObjectRef::of(b"commit"), &tree, &header).unwrap();
    let file = view
        .file("original.safetensors")
        .expect("the recorded file");
    let mut got = vec![0u8; file.content.size() as usize];
    file.content.read_at(&memory, 0, &mut got).unwrap();
    let mut want = (json.len() as u64).to_le_bytes().to_vec();
    want.extend_from_slice(json.as_bytes());
    want.extend_from_slice(&b[30..]);
    want.extend_from_slice(&b[..30]);
    assert_eq!(got, want);

    // Rows past the tensor's, or none, are a malformed recipe.
    let mut bad = header.clone();
    let text = |s: &str| crate::format::Value::Text(s.into());
    let piece = |range: [u64; 2]| {
        crate::format::Value::map([
            ("tensor".to_owned(), text("b")),
            (
                "rows".to_owned(),
                crate::format::Value::Array(range.map(crate::format::Value::Uint).to_vec()),
            ),
        ])
    };
    for range in [[5, 5], [9, 3]] {
        let value = crate::format::Value::map([(
            "original.safetensors".to_owned(),
            crate::format::Value::map([
                ("component".to_owned(), text("model")),
                ("header".to_owned(), text(json)),
                (
                    "arrays".to_owned(),
                    crate::format::Value::map([(
                        "ba".to_owned(),
                        crate::format::Value::map([
                            ("component".to_owned(), text("model")),
                            (
                                "rows".to_owned(),
                                crate::format::Value::Array(vec![piece(range)]),
                            ),
                        ]),
                    )]),
                ),
            ]),
        )]);
        bad.metadata.insert(SOURCE_FILES.into(), value);
        assert!(SourceFiles::of(&bad).is_err(), "rows {range:?}");
    }
    let mut past = header.clone();
    let mut short = recipe.clone();
    if let Some(SourceFile::Safetensors { arrays, .. }) = short.0.get_mut("original.safetensors") {
        arrays.insert(
            "ba".into(),
            ArraySource::Rows {
                component: "model".into(),
                tensors: vec![TensorRows::part("b", (30, 41))],
            },
        );
    }
    past.metadata.insert(SOURCE_FILES.into(), short.to_value());
    let err = LaneView::build(&ObjectRef::of(b"commit"), &tree, &past).unwrap_err();
    assert!(err.to_string().contains("rows 30..41"), "{err}");
}

#[test]
fn every_range_reads_the_bytes_of_the_whole_file() {
    let (memory, view, expected) = model();
    let content: &Content = &view.file("model.safetensors").unwrap().content;
    let size = expected.len();
    for offset in 0..=size + 2 {
        for len in [0, 1, 7, 16, 23, 24, 25, 40, 64, size] {
            let mut buf = vec![0u8; len];
            let n = content.read_at(&memory, offset as u64, &mut buf).unwrap();
            let want = &expected[offset.min(size)..(offset + len).min(size)];
            assert_eq!(&buf[..n], want, "offset {offset}, len {len}");
        }
    }
}

#[test]
fn a_read_past_the_end_gives_nothing() {
    let (memory, view, expected) = model();
    let content = &view.file("model.safetensors").unwrap().content;
    let mut buf = [0u8; 8];
    assert_eq!(
        content
            .read_at(&memory, expected.len() as u64, &mut buf)
            .unwrap(),
        0
    );
    assert_eq!(content.read_at(&memory, u64::MAX, &mut buf).unwrap(), 0);
}

#[test]
fn chunks_from_names_the_chunks_ahead_in_file_order() {
    let (_, view, expected) = model();
    let chunks = &view.header.chunks;
    let content = &view.file("model.safetensors").unwrap().content;
    let size = expected.len() as u64;
    assert_eq!(content.chunks_from(0, 5), [chunks[0], chunks[1]]);
    assert_eq!(content.chunks_from(0, 1), [chunks[0]]);
    // The last 16 bytes of `b` are chunk 1's.
    assert_eq!(content.chunks_from(size - 16, 5), [chunks[1]]);
    assert_eq!(content.chunks_from(size - 17, 5), [chunks[0], chunks[1]]);
    assert!(content.chunks_from(size, 5).is_empty());
    assert!(content.chunks_from(0, 0).is_empty());
    let inline = Content::Inline(b"{}".to_vec().into());
    assert!(inline.chunks_from(0, 5).is_empty());
    assert!(Content::Object(chunks[0]).chunks_from(0, 5).is_empty());
}

/// The digest of `view`'s weights file.
fn weights_digest(view: &LaneView) -> crate::format::Sha256 {
    match &view.file("model.safetensors").unwrap().content {
        Content::Safetensors(plan) => plan.digest(),
        other => panic!("a synthesized weights file, not {other:?}"),
    }
}

#[test]
fn a_plan_digest_changes_with_any_byte_source_and_only_then() {
    let (_, view, _) = model();
    let tree = Tree {
        lane: Some("u8".into()),
        files: BTreeMap::from([("model.cozytensors".to_owned(), ObjectRef::of(b"header"))]),
    };
    let rebuild = |header: &Header| {
        LaneView::build(&ObjectRef::of(b"another commit"), &tree, header).unwrap()
    };
    let digest = weights_digest(&view);
    assert_eq!(
        weights_digest(&rebuild(&view.header)),
        digest,
        "same bytes, same name"
    );

    let mut other_chunk = (*view.header).clone();
    other_chunk.chunks[1] = ObjectRef::of(b"other bytes of the same length..");
    assert_ne!(weights_digest(&rebuild(&other_chunk)), digest);

    let mut moved = (*view.header).clone();
    let Body::Plain(location) = &mut moved.components[0].tensors[1].body else {
        unreachable!()
    };
    location.offset -= 1;
    assert_ne!(weights_digest(&rebuild(&moved)), digest);

    let mut renamed = (*view.header).clone();
    renamed.components[0].tensors[0].key = "c".into();
    assert_ne!(
        weights_digest(&rebuild(&renamed)),
        digest,
        "the header is in the prefix"
    );
}

/// A view of one component `model` whose weights file holds `n` tensors with long keys.
fn many_tensors(n: usize) -> LaneView {
    let tensors = (0..n)
        .map(|i| crate::format::Tensor {
            key: format!("layers.{i}.a_rather_long_module_name_to_fill_pages.weight"),
            dtype: Dtype::U8,
            shape: vec![0],
            body: Body::Plain(Location::default()),
        })
        .collect();
    let header = Header {
        format: HEADER_FORMAT.into(),
        chunks: vec![],
        encodings: vec![],
        pipeline: None,
        components: vec![Component {
            name: "model".into(),
            class: ClassRef {
                library: "transformers".into(),
                version: "4.44.0".into(),
                name: "BertModel".into(),
            },
            config: BTreeMap::new(),
            tensors,
            assets: BTreeMap::new(),
            config_file: None,
        }],
        metadata: BTreeMap::new(),
    };
    let tree = Tree {
        lane: Some("u8".into()),
        files: BTreeMap::from([("model.cozytensors".to_owned(), ObjectRef::of(b"header"))]),
    };
    LaneView::build(&ObjectRef::of(b"commit"), &tree, &header).unwrap()
}

#[test]
fn tensor_keys_are_paged_so_no_value_or_list_overflows() {
    use super::attrs::{self, Item};
    let view = many_tensors(5000);
    let file = Item::File(view.file("model.safetensors").unwrap());
    let text = |name: &str| String::from_utf8(attrs::value(&view, file, name).unwrap()).unwrap();
    let summary: serde_json::Value = serde_json::from_str(&text(attrs::TENSORS)).unwrap();
    assert_eq!(summary["count"], 5000);
    let pages = summary["pages"].as_u64().unwrap();
    assert!(pages > 1, "5000 long keys take several pages");
    let mut keys = Vec::new();
    for p in 0..pages {
        let page = text(&format!("{}{p}", attrs::TENSORS_PAGE));
        assert!(
            page.len() <= attrs::PAGE_BYTES,
            "page {p} is {} bytes",
            page.len()
        );
        keys.extend(serde_json::from_str::<Vec<String>>(&page).unwrap());
    }
    assert_eq!(keys.len(), 5000);
    assert_eq!(
        keys[4999],
        "layers.4999.a_rather_long_module_name_to_fill_pages.weight"
    );
    let names = attrs::names(&view, file);
    assert_eq!(names.len(), 2 + 2 + 1 + pages as usize, "{names:?}");
    let list_bytes: usize = names.iter().map(|n| n.len() + 1).sum();
    assert!(
        list_bytes < 64 << 10,
        "the name list fits listxattr's limit"
    );
    let by_index: serde_json::Value =
        serde_json::from_str(&text(&format!("{}#4999", attrs::TENSOR))).unwrap();
    let by_key: serde_json::Value =
        serde_json::from_str(&text(&format!("{}{}", attrs::TENSOR, keys[4999]))).unwrap();
    assert_eq!(by_index, by_key);
    assert_eq!(by_key["dtype"], "U8");
    assert!(attrs::value(&view, file, &format!("{}#5000", attrs::TENSOR)).is_none());
    assert!(attrs::value(&view, file, &format!("{}{pages}", attrs::TENSORS_PAGE)).is_none());
}

#[test]
fn folders_and_files_name_their_component_and_class() {
    use super::attrs::{self, Item};
    let view = many_tensors(1);
    let class = attrs::value(&view, Item::Folder(""), attrs::CLASS).unwrap();
    assert_eq!(class, br#"["transformers","4.44.0","BertModel"]"#);
    assert_eq!(
        attrs::value(&view, Item::Folder(""), attrs::COMPONENT).unwrap(),
        b"model"
    );
    assert!(
        attrs::value(&view, Item::Folder(""), attrs::PIPELINE).is_none(),
        "no pipeline"
    );
    assert!(attrs::value(&view, Item::Folder("other"), attrs::COMPONENT).is_none());
}

#[test]
fn the_decoded_view_shows_encoded_tensors_as_plain_logical_ones() {
    use crate::format::{Encoding, Part};
    let weight: Vec<u8> = [1i8, -2, 3, -4, 5, -6, 7, -8]
        .iter()
        .map(|&v| v as u8)
        .collect();
    let scale: Vec<u8> = [0.5f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let bias: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut chunk = vec![0u8; 8192 + 8];
    chunk[..8].copy_from_slice(&weight);
    chunk[4096..4104].copy_from_slice(&scale);
    chunk[8192..].copy_from_slice(&bias);
    let chunks = vec![ObjectRef::of(&chunk)];
    let header = Header {
        format: HEADER_FORMAT.into(),
        chunks: chunks.clone(),
        encodings: vec![Encoding {
            scheme: "int8.rowwise".into(),
            params: BTreeMap::new(),
        }],
        pipeline: None,
        components: vec![Component {
            name: "model".into(),
            class: ClassRef::default(),
            config: BTreeMap::from([
                ("hidden_size".to_owned(), crate::format::Value::Uint(4)),
                (
                    "quantization_config".to_owned(),
                    crate::format::Value::map([]),
                ),
            ]),
            tensors: vec![
                crate::format::Tensor {
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
                                location: Location {
                                    chunk: 0,
                                    offset: 0,
                                    length: 8,
                                },
                            },
                            Part {
                                role: "scale".into(),
                                dtype: Dtype::F32,
                                shape: vec![2],
                                location: Location {
                                    chunk: 0,
                                    offset: 4096,
                                    length: 8,
                                },
                            },
                        ],
                    },
                },
                crate::format::Tensor {
                    key: "b".into(),
                    dtype: Dtype::F32,
                    shape: vec![2],
                    body: Body::Plain(Location {
                        chunk: 0,
                        offset: 8192,
                        length: 8,
                    }),
                },
            ],
            assets: BTreeMap::new(),
            config_file: None,
        }],
        metadata: BTreeMap::new(),
    };
    let tree = Tree {
        lane: Some("int8.rowwise".into()),
        files: BTreeMap::from([(
            "model.cozytensors".to_owned(),
            ObjectRef::of(b"decoded-view-header"),
        )]),
    };
    let memory = Memory {
        objects: HashMap::from([(chunks[0], chunk)]),
    };
    let read_all = |view: &LaneView, path: &str| {
        let content = &view.file(path).unwrap().content;
        let mut out = vec![0u8; content.size() as usize];
        content.read_at(&memory, 0, &mut out).unwrap();
        out
    };

    let stored = LaneView::build(&ObjectRef::of(b"c"), &tree, &header).unwrap();
    let bytes = read_all(&stored, "model.safetensors");
    let parsed = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names = parsed.names();
    names.sort();
    assert_eq!(names, ["b", "w", "w_scale"], "as stored: parts as tensors");
    assert!(String::from_utf8(read_all(&stored, "config.json"))
        .unwrap()
        .contains("quantization_config"));

    let decoded = LaneView::build_decoded(&ObjectRef::of(b"c"), &tree, &header).unwrap();
    let bytes = read_all(&decoded, "model.safetensors");
    let parsed = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names = parsed.names();
    names.sort();
    assert_eq!(names, ["b", "w"]);
    let w = parsed.tensor("w").unwrap();
    assert_eq!(w.dtype(), safetensors::Dtype::BF16);
    assert_eq!(w.shape(), [2, 4]);
    let values: Vec<f32> = w
        .data()
        .chunks(2)
        .map(|c| crate::decode::elem::bf16(u16::from_le_bytes([c[0], c[1]])))
        .collect();
    assert_eq!(values, [0.5, -1.0, 1.5, -2.0, 10.0, -12.0, 14.0, -16.0]);
    assert_eq!(parsed.tensor("b").unwrap().data(), &bias[..]);
    let config = String::from_utf8(read_all(&decoded, "config.json")).unwrap();
    assert!(
        !config.contains("quantization_config") && config.contains("hidden_size"),
        "{config}"
    );
}
