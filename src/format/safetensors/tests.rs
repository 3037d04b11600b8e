//! Tests of [`super`].

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;

use super::*;

/// The `N` bytes and file length of a file with header JSON `text` (padded to 8 as the
/// library pads) and `data_len` bytes of data.
fn framed(text: &str, data_len: u64) -> (Vec<u8>, u64) {
    let mut json = text.as_bytes().to_vec();
    json.resize(json.len().next_multiple_of(8), b' ');
    let file_len = 8 + json.len() as u64 + data_len;
    (json, file_len)
}

fn parse(text: &str, data_len: u64) -> FormatResult<SafetensorsHeader> {
    let (json, file_len) = framed(text, data_len);
    parse_header(&json, file_len)
}

fn refused(text: &str, data_len: u64) -> String {
    match parse(text, data_len) {
        Err(e) => e.to_string(),
        Ok(h) => panic!("{text} should be refused, got {h:?}"),
    }
}

fn names(header: &SafetensorsHeader) -> Vec<&str> {
    header.tensors.iter().map(|t| t.name.as_str()).collect()
}

#[test]
fn header_len_limits_from_both_sides() {
    let le = |n: u64| n.to_le_bytes();
    assert_eq!(
        header_len(&le(MAX_HEADER_BYTES), 8 + MAX_HEADER_BYTES).unwrap(),
        MAX_HEADER_BYTES
    );
    let m = header_len(&le(MAX_HEADER_BYTES + 1), u64::MAX)
        .unwrap_err()
        .to_string();
    assert!(m.contains("limit"), "{m}");
    assert!(header_len(&le(u64::MAX), u64::MAX).is_err());
    // Exactly long enough, then one byte short.
    assert_eq!(header_len(&le(16), 24).unwrap(), 16);
    let m = header_len(&le(16), 23).unwrap_err().to_string();
    assert!(m.contains("past the end of a 23-byte file"), "{m}");
    // Shorter than the length itself.
    assert!(header_len(&le(0)[..7], 7).is_err());
    assert!(header_len(&le(0), 7).is_err());
    assert_eq!(header_len(&le(0), 8).unwrap(), 0);
    // More than eight bytes given: the first eight are the length.
    assert_eq!(header_len(&[8, 0, 0, 0, 0, 0, 0, 0, b'{'], 16).unwrap(), 8);
}

#[test]
fn parse_header_limits_its_own_length_and_the_file() {
    let big = vec![b' '; MAX_HEADER_BYTES as usize + 1];
    assert!(parse_header(&big, u64::MAX)
        .unwrap_err()
        .to_string()
        .contains("limit"));
    assert!(parse_header(b"{}      ", 15)
        .unwrap_err()
        .to_string()
        .contains("does not fit"));
    let empty = parse_header(b"{}      ", 16).unwrap();
    assert_eq!(empty.json_len, 8);
    assert_eq!(empty.data_start(), 16);
    assert_eq!(empty.data_len(), 0);
    assert!(empty.tensors.is_empty() && empty.metadata.is_none());
}

#[test]
fn a_valid_header_reads_in_data_order() {
    let text = r#"{"__metadata__":{"format":"pt","b":"x\ny"},
        "w":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]},
        "s":{"dtype":"BF16","shape":[],"data_offsets":[6,8]},
        "m":{"dtype":"BOOL","shape":[4],"data_offsets":[0,4]},
        "f8":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[4,6]},
        "z":{"dtype":"F8_E5M2FNUZ","shape":[0,7],"data_offsets":[32,32]}}"#;
    let h = parse(text, 32).unwrap();
    assert_eq!(names(&h), ["m", "f8", "s", "w", "z"]);
    assert_eq!(
        h.metadata,
        Some(vec![
            ("format".into(), "pt".into()),
            ("b".into(), "x\ny".into())
        ])
    );
    assert_eq!(h.tensors[2].shape, Vec::<u64>::new());
    assert_eq!(h.tensors[3].dtype, Dtype::F32);
    assert_eq!(h.data_len(), 32);
}

#[test]
fn zero_length_tensors_may_share_an_offset() {
    let text = r#"{"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},
        "z2":{"dtype":"U8","shape":[0],"data_offsets":[4,4]},
        "z1":{"dtype":"I64","shape":[3,0],"data_offsets":[0,0]},
        "z0":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},
        "c":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
    let h = parse(text, 8).unwrap();
    // By (begin, end); equal ranges keep document order.
    assert_eq!(names(&h), ["z1", "z0", "b", "z2", "c"]);
    // A zero-length tensor inside another's range overlaps it.
    let inside = r#"{"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
        "z":{"dtype":"U8","shape":[0],"data_offsets":[4,4]}}"#;
    assert!(refused(inside, 8).contains("overlaps"));
}

#[test]
fn empty_metadata_is_legal() {
    let h = parse(r#"{"__metadata__":{}}"#, 0).unwrap();
    assert_eq!(h.metadata, Some(vec![]));
}

#[test]
fn data_after_the_last_tensor_or_missing_is_refused() {
    let text = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#;
    assert!(parse(text, 4).is_ok());
    let m = refused(text, 5);
    assert!(m.contains("1 bytes follow the last tensor"), "{m}");
    let m = refused(text, 3);
    assert!(m.contains("past the end"), "{m}");
    assert!(refused("{}", 1).contains("follow"));
}

#[test]
fn holes_and_overlaps_are_refused() {
    let hole = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
        "b":{"dtype":"U8","shape":[4],"data_offsets":[5,9]}}"#;
    let m = refused(hole, 9);
    assert!(
        m.contains("\"b\"") && m.contains("hole") && m.contains("\"a\" [0, 4]"),
        "{m}"
    );
    let late_start = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[1,5]}}"#;
    assert!(refused(late_start, 5).contains("start of the data"));
    let overlap = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
        "b":{"dtype":"U8","shape":[4],"data_offsets":[3,7]}}"#;
    assert!(refused(overlap, 7).contains("overlaps"));
    let twice = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
        "b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#;
    assert!(refused(twice, 4).contains("overlaps"));
}

#[test]
fn entries_breaking_a_rule_are_refused_by_name() {
    let t = |name: &str, body: &str| {
        let mut text = String::from("{");
        json::write_string(name, &mut text);
        format!("{text}:{body}}}")
    };
    let ok = r#"{"dtype":"F32","shape":[2],"data_offsets":[0,8]}"#;
    for (text, data, says) in [
        (r#"{"a":1,"a":2}"#.to_string(), 0, "repeated key \"a\""),
        (
            t("a", r#"{"dtype":"F12","shape":[2],"data_offsets":[0,8]}"#),
            8,
            "unknown dtype \"F12\"",
        ),
        (
            t("a", r#"{"dtype":"","shape":[2],"data_offsets":[0,8]}"#),
            8,
            "unknown dtype",
        ),
        (
            t("a", r#"{"dtype":5,"shape":[2],"data_offsets":[0,8]}"#),
            8,
            "not a string",
        ),
        (t("a\u{0}b", ok), 8, "control"),
        (t("a\nb", ok), 8, "control"),
        (t("a\u{85}b", ok), 8, "control"),
        (t("", ok), 8, "empty name"),
        (
            r#"{"__metadata__":{"n":1}}"#.into(),
            0,
            "\"n\" is an integer",
        ),
        (r#"{"__metadata__":{"k":null}}"#.into(), 0, "not a string"),
        (r#"{"__metadata__":[]}"#.into(), 0, "not a map"),
        (r#"{"__metadata__":null}"#.into(), 0, "not a map"),
        (t("__metadata__", ok), 8, "shaped like a tensor"),
        (
            t(
                "a",
                r#"{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}"#,
            ),
            8,
            "unknown field \"x\"",
        ),
        (
            t("a", r#"{"shape":[2],"data_offsets":[0,8]}"#),
            8,
            "no `dtype`",
        ),
        (
            t("a", r#"{"dtype":"F32","data_offsets":[0,8]}"#),
            8,
            "no `shape`",
        ),
        (
            t("a", r#"{"dtype":"F32","shape":[2]}"#),
            8,
            "no `data_offsets`",
        ),
        (
            t("a", r#"{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}"#),
            8,
            "holds -2",
        ),
        (
            t("a", r#"{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}"#),
            8,
            "`shape` holds a number",
        ),
        (
            t("a", r#"{"dtype":"F32","shape":2,"data_offsets":[0,8]}"#),
            8,
            "`shape` is an integer",
        ),
        (
            t("a", r#"{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}"#),
            8,
            "holds 3 integers",
        ),
        (
            t("a", r#"{"dtype":"F32","shape":[2],"data_offsets":[8,0]}"#),
            8,
            "ends before it begins",
        ),
        (
            t("a", r#"{"dtype":"F32","shape":[2],"data_offsets":[0,7]}"#),
            7,
            "span 7 bytes, but F32 [2] is 8",
        ),
        (
            t("a", r#"{"dtype":"F4","shape":[3],"data_offsets":[0,1]}"#),
            1,
            "whole number of bytes",
        ),
        (
            t(
                "a",
                r#"{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}"#,
            ),
            0,
            "overflows",
        ),
        (t("a", "[]"), 0, "not an object"),
        ("[]".into(), 0, "JSON object"),
        ("{".into(), 0, "invalid JSON"),
        ("{\"a\":NaN}".into(), 0, "NaN"),
    ] {
        let m = refused(&text, data);
        assert!(m.contains(says), "{text}: {m}");
    }
    // Invalid UTF-8 in the header.
    let (mut json, len) = framed(r#"{"a\u00e9":{}}"#, 0);
    json[3] = 0xff;
    assert!(parse_header(&json, len)
        .unwrap_err()
        .to_string()
        .contains("UTF-8"));
}

#[test]
fn sub_byte_dtypes_need_whole_bytes() {
    let f4 = r#"{"a":{"dtype":"F4","shape":[3,2],"data_offsets":[0,3]}}"#;
    assert_eq!(parse(f4, 3).unwrap().tensors[0].dtype, Dtype::F4);
    let f6 = r#"{"a":{"dtype":"F6_E3M2","shape":[4],"data_offsets":[0,3]}}"#;
    assert!(parse(f6, 3).is_ok());
}

#[test]
fn large_headers_parse_in_linear_time() {
    let count = 20_000;
    let mut text = String::from("{");
    for i in 0..count {
        if i > 0 {
            text.push(',');
        }
        text.push_str(&format!(
            r#""model.layers.{i}.weight":{{"dtype":"BF16","shape":[64,64],"data_offsets":[{},{}]}}"#,
            i * 8192,
            (i + 1) * 8192
        ));
    }
    text.push('}');
    let h = parse(&text, count * 8192).unwrap();
    assert_eq!(h.tensors.len(), count as usize);
}

const KNOWN: [&str; 22] = [
    "BOOL",
    "F4",
    "F6_E2M3",
    "F6_E3M2",
    "U8",
    "I8",
    "F8_E5M2",
    "F8_E4M3",
    "F8_E8M0",
    "F8_E4M3FNUZ",
    "F8_E5M2FNUZ",
    "I16",
    "U16",
    "F16",
    "BF16",
    "I32",
    "U32",
    "F32",
    "C64",
    "F64",
    "I64",
    "U64",
];

fn library_dtype(dtype: &Dtype) -> safetensors::Dtype {
    serde_json::from_value(serde_json::Value::String(dtype.name().into())).unwrap()
}

/// A tensor: dtype and a shape whose size is whole bytes.
fn tensor() -> impl Strategy<Value = (Dtype, Vec<u64>)> {
    (0..KNOWN.len(), prop::collection::vec(0u64..6, 0..4)).prop_map(|(i, shape)| {
        let dtype = Dtype::known(KNOWN[i]).unwrap();
        match dtype.byte_len(&shape) {
            Ok(_) => (dtype, shape),
            Err(_) => (dtype, vec![8]),
        }
    })
}

fn name() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9_.é漢😀 \"\\\\/\t\u{1}\u{7f}-]{1,12}"
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn canonical_header_is_the_librarys_and_reads_back(
        tensors in prop::collection::btree_map(name(), tensor(), 0..10),
        metadata in prop::option::of(prop::collection::btree_map(name(), name(), 0..=1)),
    ) {
        let tensors: BTreeMap<String, (Dtype, Vec<u64>)> =
            tensors.into_iter().filter(|(n, _)| n != METADATA_KEY).collect();
        let metadata: Option<Vec<(String, String)>> =
            metadata.map(|m| m.into_iter().collect());
        let owned: Vec<(String, Dtype, Vec<u64>, u64)> = tensors
            .iter()
            .map(|(n, (d, s))| (n.clone(), d.clone(), s.clone(), d.byte_len(s).unwrap().unwrap()))
            .collect();
        let entries: Vec<Entry<'_>> = owned
            .iter()
            .map(|(name, dtype, shape, length)| Entry { name, dtype, shape, length: *length })
            .collect();
        let (prefix, order) = canonical_header(&entries, metadata.as_deref());

        // The library's own file for the same tensors.
        let buffers: Vec<Vec<u8>> = owned.iter().map(|t| vec![0u8; t.3 as usize]).collect();
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = owned
            .iter()
            .zip(&buffers)
            .map(|((name, dtype, shape, _), data)| {
                let shape = shape.iter().map(|&e| e as usize).collect();
                (name.clone(), safetensors::tensor::TensorView::new(library_dtype(dtype), shape, data).unwrap())
            })
            .collect();
        let info: Option<HashMap<String, String>> =
            metadata.clone().map(|m| m.into_iter().collect());
        // The library writes `{},"__metadata__":{}}`, not JSON, for empty metadata and no
        // tensors (serde_json trusts its zero length hint); there we keep to valid JSON.
        prop_assume!(!(owned.is_empty() && metadata.as_ref().is_some_and(Vec::is_empty)));
        let library = safetensors::serialize(views, info).unwrap();
        prop_assert_eq!(&library[..prefix.len()], &prefix[..]);
        let data_len: u64 = owned.iter().map(|t| t.3).sum();
        prop_assert_eq!(library.len() as u64, prefix.len() as u64 + data_len);

        // The library reads our prefix with its data.
        let mut file = prefix.clone();
        file.resize(prefix.len() + data_len as usize, 0);
        let read = safetensors::SafeTensors::deserialize(&file).unwrap();
        prop_assert_eq!(read.len(), owned.len());

        // And so do we, unless a name holds a control character, which we refuse.
        let n = header_len(&file, file.len() as u64).unwrap();
        let parsed = parse_header(&file[8..8 + n as usize], file.len() as u64);
        if owned.iter().any(|t| names::has_control(&t.0)) {
            prop_assert!(parsed.is_err());
        } else {
            let parsed = parsed.unwrap();
            prop_assert_eq!(parsed.json_len as usize, prefix.len() - 8);
            prop_assert_eq!(&parsed.metadata, &metadata);
            prop_assert_eq!(parsed.tensors.len(), order.len());
            let mut offset = 0;
            for (tensor, &i) in parsed.tensors.iter().zip(&order) {
                let (name, dtype, shape, length) = &owned[i];
                prop_assert_eq!(&tensor.name, name);
                prop_assert_eq!(&tensor.dtype, dtype);
                prop_assert_eq!(&tensor.shape, shape);
                prop_assert_eq!((tensor.begin, tensor.end), (offset, offset + length));
                let info = read.tensor(name).unwrap();
                prop_assert_eq!(info.data().len() as u64, *length);
                offset += length;
            }
        }
    }
}

#[test]
fn metadata_of_several_keys_is_written_in_the_order_given() {
    let metadata = vec![
        ("z".to_string(), "1".to_string()),
        ("a".to_string(), "\"2\"".to_string()),
    ];
    let shape = [2u64];
    let entries = [Entry {
        name: "w",
        dtype: &Dtype::F16,
        shape: &shape,
        length: 4,
    }];
    let (prefix, order) = canonical_header(&entries, Some(&metadata));
    assert_eq!(order, [0]);
    let text = std::str::from_utf8(&prefix[8..]).unwrap();
    assert_eq!(
        text.trim_end(),
        r#"{"__metadata__":{"z":"1","a":"\"2\""},"w":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}"#
    );
    assert_eq!(prefix.len() % 8, 0);
    let parsed = parse_header(&prefix[8..], prefix.len() as u64 + 4).unwrap();
    assert_eq!(parsed.metadata.as_deref(), Some(&metadata[..]));
    let mut file = prefix;
    file.extend_from_slice(&[0; 4]);
    let (_, read) = safetensors::SafeTensors::read_metadata(&file).unwrap();
    assert_eq!(read.metadata().as_ref().unwrap()["a"], "\"2\"");
}

/// A text file saved as `.safetensors` (here a Git LFS pointer) is named as not a safetensors
/// file, with the text it starts with, instead of a header of an absurd length.
#[test]
fn a_text_file_is_not_a_safetensors_file() {
    let text = b"version https://git-lfs.github.com/spec/v1\n";
    let m = header_len(text, text.len() as u64).unwrap_err().to_string();
    assert!(m.starts_with("not a safetensors file"), "{m}");
    assert!(m.contains("\"version \""), "{m}");
    let m = header_len(&[0xff; 8], 100).unwrap_err().to_string();
    assert!(m.starts_with("not a safetensors file: "), "{m}");
}
