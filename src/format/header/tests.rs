//! Tests of [`super`].

use super::*;
use crate::format::cbor::{decode, encode};
use proptest::prelude::*;

fn t(text: &str) -> Value {
    Value::Text(text.into())
}

fn u(n: u64) -> Value {
    Value::Uint(n)
}

fn a(items: Vec<Value>) -> Value {
    Value::Array(items)
}

fn m(entries: Vec<(&str, Value)>) -> Value {
    Value::map(entries.into_iter().map(|(k, v)| (k.to_owned(), v)))
}

fn object(seed: u8, length: u64) -> Value {
    a(vec![Value::Bytes(vec![seed; 32]), u(length)])
}

fn class(library: &str, version: &str, name: &str) -> Value {
    a(vec![t(library), t(version), t(name)])
}

fn location(chunk: u64, offset: u64, length: u64) -> Value {
    a(vec![u(chunk), u(offset), u(length)])
}

/// A valid header touching every record: two chunks, two encodings, a pipeline, a
/// component with a plain and two encoded tensors, an asset and a `config_file`, and a
/// second component without one.
fn base() -> Value {
    a(vec![
        t("cozytensors/1"),
        a(vec![object(1, 8192), object(2, 4096)]),
        a(vec![
            a(vec![t("fp8.rowwise"), m(vec![])]),
            a(vec![t("int8.convrot"), m(vec![("rotation_size", u(256))])]),
        ]),
        a(vec![
            class("diffusers", "0.30.0", "FluxPipeline"),
            m(vec![
                ("_class_name", t("FluxPipeline")),
                ("eps", Value::Float(1e-6)),
            ]),
        ]),
        a(vec![
            a(vec![
                t("unet"),
                class("diffusers", "0.30.0", "UNet2DConditionModel"),
                m(vec![("scale", Value::Float(0.5)), ("none", Value::Null)]),
                a(vec![
                    a(vec![
                        t("w"),
                        t("F32"),
                        a(vec![u(2), u(2)]),
                        u(0),
                        location(0, 0, 16),
                    ]),
                    a(vec![
                        t("q"),
                        t("BF16"),
                        a(vec![u(64), u(64)]),
                        u(1),
                        a(vec![
                            a(vec![
                                t("weight"),
                                t("F8_E4M3"),
                                a(vec![u(64), u(64)]),
                                location(0, 4096, 4096),
                            ]),
                            a(vec![
                                t("scale"),
                                t("F32"),
                                a(vec![u(64)]),
                                location(1, 0, 256),
                            ]),
                        ]),
                    ]),
                    a(vec![
                        t("r"),
                        t("BF16"),
                        a(vec![u(4)]),
                        u(2),
                        a(vec![a(vec![
                            t("weight"),
                            t("I8"),
                            a(vec![u(4)]),
                            location(0, 0, 4),
                        ])]),
                    ]),
                ]),
                m(vec![("tokenizer.json", object(3, 10))]),
                t("unet_config.json"),
            ]),
            a(vec![
                t("vae"),
                class("", "", ""),
                m(vec![]),
                a(vec![a(vec![
                    t("w"),
                    t("X9"),
                    a(vec![u(3)]),
                    u(0),
                    location(1, 0, 7),
                ])]),
                m(vec![]),
            ]),
        ]),
        m(vec![
            ("source", t("hf://a/b@c")),
            ("tags", a(vec![t("x"), u(1)])),
        ]),
    ])
}

/// The value at `path`: array indices, or entry indices in a map (its value).
fn at<'v>(v: &'v mut Value, path: &[usize]) -> &'v mut Value {
    path.iter().fold(v, |v, &i| match v {
        Value::Array(items) => &mut items[i],
        Value::Map(entries) => &mut entries[i].1,
        other => panic!("no index {i} in {other:?}"),
    })
}

fn items<'v>(v: &'v mut Value, path: &[usize]) -> &'v mut Vec<Value> {
    match at(v, path) {
        Value::Array(items) => items,
        other => panic!("{other:?} is not an array"),
    }
}

const CHUNKS: &[usize] = &[1];
const ENCODINGS: &[usize] = &[2];
const PIPELINE: &[usize] = &[3];
const UNET: &[usize] = &[4, 0];
const PLAIN: &[usize] = &[4, 0, 3, 0];
const ENCODED: &[usize] = &[4, 0, 3, 1];
const PART: &[usize] = &[4, 0, 3, 1, 4, 0];
const METADATA: &[usize] = &[5];

fn with(path: &[usize], new: Value) -> Value {
    let mut v = base();
    *at(&mut v, path) = new;
    v
}

fn edited(edit: impl FnOnce(&mut Value)) -> Value {
    let mut v = base();
    edit(&mut v);
    v
}

fn parse(v: &Value) -> FormatResult<Header> {
    Header::from_cbor(&encode(v).expect("test headers encode"))
}

#[track_caller]
fn ok(v: &Value) -> Header {
    let bytes = encode(v).unwrap();
    let header = Header::from_cbor(&bytes).unwrap_or_else(|e| panic!("{e}"));
    let again = header.to_cbor().unwrap();
    assert_eq!(Header::from_cbor(&again).unwrap(), header);
    header
}

#[track_caller]
fn refused(v: &Value, needle: &str) -> FormatError {
    match parse(v) {
        Ok(h) => panic!("accepted, expected a refusal naming {needle:?}: {h:?}"),
        Err(e) => {
            assert!(e.to_string().contains(needle), "{e:?} lacks {needle:?}");
            e
        }
    }
}

fn golden(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/data/header/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_reference_imports_header_decodes_and_reencodes_byte_identically() {
    let bytes = golden("minilm.cozytensors");
    assert_eq!(
        ObjectRef::of(&bytes).sha256.hex(),
        "32e56e3b632692babcb607703bc547195077b4e19280153b97f2fd2a8a0d63bf"
    );
    let header = Header::from_cbor(&bytes).unwrap();
    assert_eq!(header.components.len(), 1);
    assert_eq!(header.components[0].tensors.len(), 104);
    assert_eq!(header.pipeline, None);
    assert_eq!(header.to_cbor().unwrap(), bytes);
    assert_eq!(encode(&decode(&bytes).unwrap()).unwrap(), bytes);
}

#[test]
fn the_reference_writers_header_with_encodings_reencodes_byte_identically() {
    let bytes = golden("dev-ckpt-mixed.cozytensors");
    let header = Header::from_cbor(&bytes).unwrap();
    assert_eq!(header.encodings.len(), 7);
    assert_eq!(header.encodings[1].scheme, "int8.convrot");
    let Body::Encoded { encoding, parts } = &header.components[0].tensors[1].body else {
        panic!("the second tensor is encoded");
    };
    assert_eq!((*encoding, parts.len()), (1, 2));
    assert_eq!(header.to_cbor().unwrap(), bytes);
}

#[test]
fn the_spec_example_headers_reencode_byte_identically() {
    for name in ["header-basic.cozytensors", "header-configs.cozytensors"] {
        let bytes = golden(name);
        let header = Header::from_cbor(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(header.to_cbor().unwrap(), bytes, "{name}");
    }
    let configs = Header::from_cbor(&golden("header-configs.cozytensors")).unwrap();
    let config = &configs.pipeline.unwrap().config;
    assert!(matches!(config["negative-zero"], Value::Float(z) if z.is_sign_negative()));
    assert_eq!(config["f64-subnormal"], Value::Float(5e-324));
    assert_eq!(config["i64"], Value::Nint(i64::MAX as u64));
}

#[test]
fn the_base_header_decodes_to_its_records_and_round_trips() {
    let bytes = encode(&base()).unwrap();
    let header = Header::from_cbor(&bytes).unwrap();
    assert_eq!(header.to_cbor().unwrap(), bytes);
    let unet = header.component("unet").unwrap();
    assert_eq!(unet.config_name(), "unet_config.json");
    assert_eq!(
        unet.tensors[0].body,
        Body::Plain(Location {
            chunk: 0,
            offset: 0,
            length: 16
        })
    );
    assert!(matches!(
        unet.tensors[1].body,
        Body::Encoded { encoding: 0, .. }
    ));
    assert!(matches!(
        unet.tensors[2].body,
        Body::Encoded { encoding: 1, .. }
    ));
    let vae = header.component("vae").unwrap();
    assert_eq!(vae.config_name(), "config.json");
    assert_eq!(vae.tensors[0].dtype, Dtype::Other("X9".into()));
}

#[test]
fn the_format_tag_accepts_major_one_with_any_decimal_minor() {
    for tag in [
        "cozytensors/1",
        "cozytensors/1.0",
        "cozytensors/1.12",
        "cozytensors/1.007",
    ] {
        let header = ok(&with(&[0], t(tag)));
        assert_eq!(header.format, tag);
        assert_eq!(
            header.to_cbor().unwrap(),
            encode(&with(&[0], t(tag))).unwrap()
        );
    }
}

#[test]
fn the_format_tag_refuses_another_kind_or_major() {
    for tag in [
        "cozytensors/2",
        "cozytensors/10",
        "cozytensors/1.",
        "cozytensors/1.x",
        "cozytensors/1.1a",
        "cozytensors/01",
        "cozytensors.tree/1",
        "cozytensors",
        "",
    ] {
        let err = parse(&with(&[0], t(tag))).unwrap_err();
        assert_eq!(
            err,
            FormatError::Format {
                found: tag.into(),
                expected: HEADER_FORMAT
            },
            "{tag}"
        );
    }
    refused(&with(&[0], u(1)), "the format tag is an unsigned integer");
}

#[test]
fn a_root_of_exactly_five_elements_is_refused_as_a_pre_cut_layout() {
    let five = edited(|v| drop(items(v, &[]).pop()));
    refused(&five, "pre-cut layout");
    let four = edited(|v| items(v, &[]).truncate(4));
    refused(&four, "4 elements, fewer than the 6 listed");
    refused(&a(vec![]), "no format tag");
    refused(
        &t("cozytensors/1"),
        "the root is a text string, not an array",
    );
}

#[test]
fn later_elements_of_the_root_and_every_record_are_skipped() {
    let extension = || {
        a(vec![
            Value::Bytes(vec![7; 3]),
            m(vec![("k", a(vec![u(1), Value::Nint(5)]))]),
        ])
    };
    let paths: [&[usize]; 11] = [
        &[],
        &[1, 0],
        &[2, 0],
        PIPELINE,
        UNET,
        PLAIN,
        &[4, 0, 3, 0, 4],
        PART,
        &[4, 0, 3, 1, 4, 0, 3],
        &[4, 0, 4, 0],
        ENCODED,
    ];
    for path in paths {
        let v = edited(|v| items(v, path).push(extension()));
        let header = ok(&v);
        assert_eq!(
            header,
            Header::from_cbor(&encode(&base()).unwrap()).unwrap(),
            "{path:?}"
        );
        assert_eq!(header.to_cbor().unwrap(), encode(&base()).unwrap());
    }
}

#[test]
fn later_elements_stay_in_the_value_domain() {
    refused(
        &edited(|v| items(v, PLAIN).push(Value::Float(1.0))),
        "a float outside a config",
    );
    refused(
        &edited(|v| items(v, &[]).push(Value::Null)),
        "null outside a config",
    );
    refused(
        &edited(|v| items(v, UNET).push(a(vec![m(vec![("x", Value::Float(0.5))])]))),
        "a float outside a config",
    );
    ok(&edited(|v| items(v, PART).push(Value::Bytes(vec![]))));
    let mut with_tag = encode(&edited(|v| items(v, &[]).push(u(0)))).unwrap();
    let last = with_tag.len() - 1;
    with_tag[last] = 0xc0;
    with_tag.push(0x00);
    assert!(Header::from_cbor(&with_tag)
        .unwrap_err()
        .to_string()
        .contains("a tag"));
}

#[test]
fn records_with_fewer_elements_than_listed_are_refused() {
    let cases: [(&[usize], usize, &str); 7] = [
        (
            &[1, 0],
            1,
            "chunk 0 has 1 elements, fewer than the 2 listed",
        ),
        (
            &[2, 0],
            1,
            "encoding 1 has 1 elements, fewer than the 2 listed",
        ),
        (
            UNET,
            4,
            "component 0 has 4 elements, fewer than the 5 listed",
        ),
        (PLAIN, 4, "tensor 0 has 4 elements, fewer than the 5 listed"),
        (PART, 3, "part 0 has 3 elements, fewer than the 4 listed"),
        (
            &[4, 0, 3, 0, 4],
            2,
            "the location has 2 elements, fewer than the 3 listed",
        ),
        (&[4, 0, 4, 0], 1, "asset \"tokenizer.json\" has 1 elements"),
    ];
    for (path, keep, needle) in cases {
        refused(&edited(|v| items(v, path).truncate(keep)), needle);
    }
    refused(
        &edited(|v| items(v, PIPELINE).truncate(1)),
        "the pipeline has 1 element",
    );
}

#[test]
fn the_pipeline_is_empty_or_a_class_and_config() {
    assert_eq!(ok(&with(PIPELINE, a(vec![]))).pipeline, None);
    let pipeline = ok(&base()).pipeline.unwrap();
    assert_eq!(pipeline.class.name, "FluxPipeline");
    refused(
        &with(&[3, 1], a(vec![])),
        "the pipeline's config is an array, not a map",
    );
}

#[test]
fn a_class_is_exactly_three_texts() {
    refused(
        &with(&[4, 0, 1], a(vec![t("a"), t("b")])),
        "not exactly three texts",
    );
    refused(
        &with(&[4, 0, 1], a(vec![t("a"), t("b"), t("c"), t("d")])),
        "not exactly three texts",
    );
    refused(
        &with(&[4, 0, 1, 2], u(3)),
        "the class's name is an unsigned integer",
    );
    refused(
        &with(&[3, 0, 0], Value::Null),
        "the pipeline's class's library is null",
    );
}

#[test]
fn an_empty_library_with_a_name_or_version_is_refused() {
    refused(
        &with(&[4, 1, 1], class("", "", "X")),
        "has a version or name but no library",
    );
    refused(
        &with(&[4, 1, 1], class("", "1.0", "")),
        "has a version or name but no library",
    );
    refused(&with(&[3, 0], class("", "1.0", "P")), "the pipeline class");
    ok(&with(&[4, 1, 1], class("", "", "")));
    ok(&with(&[4, 1, 1], class("x", "", "")));
    ok(&with(&[3, 0], class("", "", "")));
}

#[test]
fn component_names_are_unique_path_segments() {
    for bad in ["", ".", "..", "a/b", "a\\b", "a\0b"] {
        refused(&with(&[4, 1, 0], t(bad)), "is not a path segment");
    }
    for good in ["...", ".hidden", "text encoder"] {
        ok(&with(&[4, 1, 0], t(good)));
    }
    refused(
        &with(&[4, 1, 0], t("unet")),
        "component name \"unet\" is repeated",
    );
}

#[test]
fn tensor_keys_are_non_empty_and_unique_within_their_component() {
    refused(
        &with(&[4, 0, 3, 0, 0], t("")),
        "component \"unet\": a tensor key is empty",
    );
    refused(
        &with(&[4, 0, 3, 0, 0], t("q")),
        "component \"unet\": tensor key \"q\" is repeated",
    );
    // The same key in another component is another tensor.
    assert_eq!(ok(&base()).components[1].tensors[0].key, "w");
}

#[test]
fn roles_are_non_empty_and_unique_within_their_tensor() {
    refused(
        &with(&[4, 0, 3, 1, 4, 1, 0], t("")),
        "tensor \"q\": a part role is empty",
    );
    refused(
        &with(&[4, 0, 3, 1, 4, 1, 0], t("weight")),
        "part role \"weight\" is repeated",
    );
    // Another tensor's parts may reuse a role.
    ok(&base());
}

#[test]
fn an_encoded_tensor_needs_at_least_one_part() {
    refused(
        &with(&[4, 0, 3, 2, 4], a(vec![])),
        "tensor \"r\": an encoded tensor has no parts",
    );
}

#[test]
fn an_encoding_index_must_cite_a_listed_encoding() {
    refused(
        &with(&[4, 0, 3, 2, 3], u(3)),
        "encoding index 3 is out of range: the header lists 2 encodings",
    );
    refused(&with(&[4, 0, 3, 2, 3], u(u64::MAX)), "is out of range");
    // Index 2 is the last one listed.
    ok(&base());
}

#[test]
fn encodings_are_listed_in_order_of_first_citation() {
    let swapped = edited(|v| {
        *at(v, &[4, 0, 3, 1, 3]) = u(2);
        *at(v, &[4, 0, 3, 2, 3]) = u(1);
    });
    refused(&swapped, "encoding index 2 is cited before encoding 1");
    // The table follows the citations, whatever the schemes.
    let swapped_table = edited(|v| items(v, ENCODINGS).swap(0, 1));
    assert_eq!(ok(&swapped_table).encodings[0].scheme, "int8.convrot");
    // Citing an earlier encoding again later is fine.
    let again = edited(|v| {
        let mut third = at(v, ENCODED).clone();
        *at(&mut third, &[0]) = t("q2");
        items(v, &[4, 0, 3]).push(third);
    });
    ok(&again);
}

#[test]
fn every_listed_encoding_must_be_cited() {
    let uncited = edited(|v| items(v, ENCODINGS).push(a(vec![t("nvfp4"), m(vec![])])));
    refused(&uncited, "encoding 3 is never cited");
    let cited_once = with(&[4, 0, 3, 2, 3], u(1));
    refused(&cited_once, "encoding 2 is never cited");
}

#[test]
fn a_repeated_encoding_is_refused() {
    let repeated = edited(|v| *at(v, &[2, 1]) = a(vec![t("fp8.rowwise"), m(vec![])]));
    refused(
        &repeated,
        "encoding 2 (\"fp8.rowwise\") repeats an earlier one",
    );
    let other_params =
        edited(|v| *at(v, &[2, 1]) = a(vec![t("fp8.rowwise"), m(vec![("a", u(1))])]));
    ok(&other_params);
}

#[test]
fn an_encoding_scheme_is_non_empty_and_its_params_are_document_values() {
    refused(&with(&[2, 0, 0], t("")), "encoding 1 has an empty scheme");
    refused(
        &with(&[2, 1, 1, 0], Value::Float(256.0)),
        "a float outside a config",
    );
    refused(
        &with(&[2, 1, 1, 0], Value::Bytes(vec![1])),
        "a byte string outside",
    );
    refused(
        &with(&[2, 1, 1], a(vec![])),
        "encoding 2's params is an array, not a map",
    );
}

#[test]
fn floats_and_null_are_allowed_only_inside_configs() {
    ok(&with(
        &[4, 0, 2, 0],
        a(vec![
            Value::Float(-0.0),
            Value::Null,
            m(vec![("x", Value::Float(0.1))]),
        ]),
    ));
    ok(&with(&[3, 1, 0], Value::Null));
    refused(&with(&[5, 0], Value::Float(0.5)), "the metadata: CBOR byte");
    refused(
        &with(&[5, 1], a(vec![Value::Null])),
        "null outside a config",
    );
    refused(
        &with(&[4, 0, 3, 0, 4, 2], Value::Float(16.0)),
        "the location's length is a float",
    );
}

#[test]
fn byte_strings_are_allowed_only_as_object_digests_and_in_later_fields() {
    refused(
        &with(&[4, 0, 2, 0], Value::Bytes(vec![1])),
        "component \"unet\": the config: CBOR byte",
    );
    refused(
        &with(&[5, 0], Value::Bytes(vec![])),
        "a byte string outside",
    );
    refused(
        &with(&[1, 0, 0], Value::Bytes(vec![0; 31])),
        "chunk 0's sha256 is 31 bytes, not 32",
    );
    refused(
        &with(&[1, 0, 0], Value::Bytes(vec![0; 33])),
        "chunk 0's sha256 is 33 bytes, not 32",
    );
    refused(
        &with(&[4, 0, 4, 0, 0], Value::Bytes(vec![0; 31])),
        "is 31 bytes, not 32",
    );
    refused(
        &with(&[1, 0, 0], t("ab")),
        "chunk 0 is a text string, not a byte string",
    );
}

#[test]
fn dtypes_are_non_empty_texts_and_unknown_ones_are_read_raw() {
    refused(
        &with(&[4, 0, 3, 0, 1], t("")),
        "spec §5: component \"unet\" tensor \"w\": a dtype is a non-empty name",
    );
    refused(
        &with(&[4, 0, 3, 1, 4, 0, 1], t("")),
        "part \"weight\": a dtype is a non-empty name",
    );
    refused(
        &with(&[4, 0, 3, 0, 1], u(1)),
        "the dtype is an unsigned integer",
    );
    // An unknown dtype's length stands as written, even one no known dtype could have.
    ok(&with(&[4, 1, 3, 0, 4, 2], u(4095)));
}

#[test]
fn shapes_are_arrays_of_unsigned_integers() {
    refused(
        &with(&[4, 0, 3, 0, 2, 0], Value::Nint(1)),
        "shape extent 0 is a negative integer",
    );
    refused(
        &with(&[4, 0, 3, 0, 2], u(4)),
        "the shape is an unsigned integer, not an array",
    );
    ok(&with(&[4, 0, 3, 0, 2], a(vec![u(4)])));
    let scalar = ok(&edited(|v| {
        *at(v, &[4, 0, 3, 0, 2]) = a(vec![]);
        *at(v, &[4, 0, 3, 0, 4, 2]) = u(4);
    }));
    assert!(scalar.components[0].tensors[0].shape.is_empty());
}

#[test]
fn a_located_chunk_index_must_be_in_range() {
    // vae's unknown-dtype tensor: 7 bytes in chunk 1 of 2.
    refused(
        &with(&[4, 1, 3, 0, 4, 0], u(2)),
        "location chunk 2 is out of range: the header has 2 chunks",
    );
    refused(&with(&[4, 1, 3, 0, 4, 0], u(u64::MAX)), "is out of range");
    ok(&with(&[4, 1, 3, 0, 4, 0], u(0)));
}

#[test]
fn a_located_offset_must_be_a_multiple_of_4096() {
    let err = refused(&with(&[4, 0, 3, 0, 4, 1], u(100)), "not a multiple of 4096");
    assert_eq!(
        err.to_string(),
        "spec §4: component \"unet\" tensor \"w\": location offset 100 is not a multiple of 4096"
    );
    refused(
        &with(&[4, 0, 3, 0, 4, 1], u(4095)),
        "offset 4095 is not a multiple",
    );
    refused(
        &with(&[4, 0, 3, 0, 4, 1], u(4097)),
        "offset 4097 is not a multiple",
    );
    ok(&with(&[4, 0, 3, 0, 4, 1], u(4096)));
}

#[test]
fn a_located_offset_must_lie_inside_its_chunk() {
    // Chunk 0 is 8192 bytes, chunk 1 4096: offset 8192 starts past chunk 0 even though the
    // bytes would fit in chunk 1.
    refused(
        &with(&[4, 0, 3, 0, 4, 1], u(8192)),
        "location offset 8192 is not inside chunk 0 of 8192 bytes",
    );
    let shrunk = edited(|v| *at(v, &[1, 0, 1]) = u(4096));
    refused(
        &shrunk,
        "part \"weight\": location offset 4096 is not inside chunk 0 of 4096 bytes",
    );
}

#[test]
fn a_location_may_continue_into_later_chunks_but_not_past_the_last() {
    // 12288 bytes of chunks; from offset 4096 of chunk 0 there are 8192.
    let exactly = edited(|v| {
        *at(v, &[4, 0, 3, 0, 2]) = a(vec![u(2048)]);
        *at(v, &[4, 0, 3, 0, 4]) = location(0, 4096, 8192);
    });
    let header = ok(&exactly);
    let pieces: Vec<_> = header
        .pieces(Location {
            chunk: 0,
            offset: 4096,
            length: 8192,
        })
        .collect();
    assert_eq!(pieces, vec![(0, 4096, 4096), (1, 0, 4096)]);
    let past = edited(|v| {
        *at(v, &[4, 0, 3, 0, 1]) = t("U8");
        *at(v, &[4, 0, 3, 0, 2]) = a(vec![u(8193)]);
        *at(v, &[4, 0, 3, 0, 4]) = location(0, 4096, 8193);
    });
    refused(
        &past,
        "location offset 4096 + length 8193 = 12289 runs past the 12288 bytes of chunks 0..",
    );
}

#[test]
fn location_sums_do_not_overflow() {
    let huge = edited(|v| {
        *at(v, &[1, 0, 1]) = u(u64::MAX);
        *at(v, &[4, 1, 3, 0, 4]) = location(0, u64::MAX - 4095, u64::MAX);
    });
    refused(&huge, "runs past the");
    let huge_chunks = edited(|v| {
        *at(v, &[1, 0, 1]) = u(u64::MAX);
        *at(v, &[1, 1, 1]) = u(u64::MAX);
        *at(v, &[4, 1, 3, 0, 4]) = location(0, u64::MAX - 4095, u64::MAX);
    });
    ok(&huge_chunks);
}

#[test]
fn zero_length_locations_are_not_checked_against_the_chunks() {
    let empty = edited(|v| {
        *at(v, &[4, 0, 3, 0, 2]) = a(vec![u(0), u(7)]);
        *at(v, &[4, 0, 3, 0, 4]) = location(99, 5, 0);
    });
    ok(&empty);
    ok(&with(&[4, 1, 3, 0, 4], location(u64::MAX, 1, 0)));
}

#[test]
fn a_known_dtypes_location_length_must_be_its_byte_size() {
    refused(&with(&[4, 0, 3, 0, 4, 2], u(15)), "spec §5: component \"unet\" tensor \"w\": location length 15 is not the 16 bytes of F32 [2, 2]");
    refused(
        &with(&[4, 0, 3, 0, 4, 2], u(17)),
        "location length 17 is not the 16 bytes",
    );
    refused(
        &with(&[4, 0, 3, 1, 4, 1, 3, 2], u(255)),
        "part \"scale\": location length 255 is not the 256 bytes of F32 [64]",
    );
    refused(
        &with(&[4, 0, 3, 1, 4, 1, 3, 2], u(257)),
        "location length 257",
    );
}

#[test]
fn a_dtype_size_that_overflows_or_is_not_whole_bytes_is_refused() {
    refused(&with(&[4, 0, 3, 0, 2], a(vec![u(u64::MAX), u(0)])), "spec §5: component \"unet\" tensor \"w\": F32 [18446744073709551615, 0]: the size overflows 64 bits");
    let f4 = edited(|v| {
        *at(v, &[4, 0, 3, 2, 4, 0, 1]) = t("F4");
        *at(v, &[4, 0, 3, 2, 4, 0, 2]) = a(vec![u(3)]);
    });
    refused(
        &f4,
        "part \"weight\": F4 [3]: 12 bits is not a whole number of bytes",
    );
    let f4_even = edited(|v| {
        *at(v, &[4, 0, 3, 2, 4, 0, 1]) = t("F4");
        *at(v, &[4, 0, 3, 2, 4, 0, 2]) = a(vec![u(8)]);
    });
    ok(&f4_even);
    // An encoded tensor's logical shape must also size, though no location holds it.
    refused(
        &with(&[4, 0, 3, 2, 2], a(vec![u(1 << 62), u(4)])),
        "tensor \"r\": logical shape: BF16",
    );
    ok(&with(&[4, 0, 3, 2, 2], a(vec![u(1 << 59)])));
    refused(&with(&[4, 0, 3, 2, 2], a(vec![u(1 << 60)])), "overflows");
}

#[test]
fn asset_keys_are_paths_and_never_the_config_file() {
    let asset = |key: &str| {
        edited(|v| {
            let Value::Map(entries) = at(v, &[4, 0, 4]) else {
                unreachable!()
            };
            entries.push((key.to_owned(), object(4, 1)));
            let sorted = Value::map(entries.drain(..));
            *at(v, &[4, 0, 4]) = sorted;
        })
    };
    for bad in ["", "a//b", "/abs", "a/../b", "./x"] {
        refused(&asset(bad), "is not a path");
    }
    refused(
        &asset("unet_config.json"),
        "asset key \"unet_config.json\" is the config's file name",
    );
    // Only the component's own config name is reserved.
    ok(&asset("config.json"));
    ok(&asset("sub/vocab.json"));
    let vae_config = edited(|v| *at(v, &[4, 1, 4]) = m(vec![("config.json", object(5, 2))]));
    refused(
        &vae_config,
        "component \"vae\": asset key \"config.json\" is the config's file name",
    );
}

#[test]
fn asset_keys_follow_the_canonical_map_rules() {
    let two = edited(|v| {
        *at(v, &[4, 0, 4]) = m(vec![
            ("vocab.json", object(4, 1)),
            ("merges.txt", object(5, 1)),
        ]);
    });
    let mut bytes = encode(&two).unwrap();
    // Equal lengths: swapping the two keys' bytes puts them out of order.
    let merges = bytes.windows(10).position(|w| w == b"merges.txt").unwrap();
    let vocab = bytes.windows(10).position(|w| w == b"vocab.json").unwrap();
    bytes[merges..merges + 10].copy_from_slice(b"vocab.json");
    bytes[vocab..vocab + 10].copy_from_slice(b"merges.txt");
    let err = Header::from_cbor(&bytes).unwrap_err();
    assert!(err.to_string().contains("out of canonical order"), "{err}");
    bytes[vocab..vocab + 10].copy_from_slice(b"vocab.json");
    let err = Header::from_cbor(&bytes).unwrap_err();
    assert!(
        err.to_string().contains("map key \"vocab.json\" repeated"),
        "{err}"
    );
    refused(
        &with(&[4, 0, 4], a(vec![])),
        "the assets is an array, not a map",
    );
}

#[test]
fn config_file_is_a_path_written_only_when_not_the_default() {
    refused(
        &with(&[4, 0, 5], t("a/../b.json")),
        "config_file \"a/../b.json\" is not a path",
    );
    refused(&with(&[4, 0, 5], t("")), "is not a path");
    refused(
        &with(&[4, 0, 5], u(1)),
        "config_file is an unsigned integer",
    );
    assert_eq!(
        ok(&with(&[4, 0, 5], t("sub/c.json"))).components[0].config_name(),
        "sub/c.json"
    );
    refused(
        &with(&[4, 0, 5], t("config.json")),
        "is the default, written only before later fields",
    );
    // Before later fields the default is spelled out; it decodes as the default.
    let explicit = edited(|v| {
        *at(v, &[4, 0, 5]) = t("config.json");
        items(v, UNET).push(u(0));
    });
    assert_eq!(ok(&explicit).components[0].config_file, None);
}

#[test]
fn metadata_is_a_map_of_document_values() {
    refused(
        &with(METADATA, a(vec![])),
        "the metadata is an array, not a map",
    );
    let header = ok(&base());
    assert_eq!(header.metadata["source"], t("hf://a/b@c"));
    refused(
        &with(&[5, 1], m(vec![("x", Value::Float(1.0))])),
        "a float outside a config",
    );
}

#[test]
fn structure_of_the_wrong_type_is_refused_naming_the_place() {
    refused(
        &with(CHUNKS, m(vec![])),
        "the header: chunks is a map, not an array",
    );
    refused(
        &with(ENCODINGS, u(0)),
        "encodings is an unsigned integer, not an array",
    );
    refused(&with(&[4], m(vec![])), "components is a map, not an array");
    refused(
        &with(&[4, 0, 3], m(vec![])),
        "component \"unet\": the tensors is a map",
    );
    refused(
        &with(&[4, 0, 3, 0, 3], Value::Nint(0)),
        "tensor \"w\": the encoding index is a negative integer",
    );
    refused(
        &with(&[4, 0, 3, 1, 4], u(1)),
        "tensor \"q\": the parts is an unsigned integer",
    );
    refused(
        &with(&[4, 0, 0], u(1)),
        "component 0's name is an unsigned integer",
    );
    refused(
        &with(&[4, 0, 3, 0, 0], u(1)),
        "tensor 0's key is an unsigned integer",
    );
}

#[test]
fn bytes_after_the_root_are_refused() {
    let mut bytes = encode(&base()).unwrap();
    bytes.push(0);
    assert!(Header::from_cbor(&bytes)
        .unwrap_err()
        .to_string()
        .contains("1 bytes after the root"));
}

#[test]
fn encoding_errors_name_the_place_and_the_byte() {
    let mut bytes = encode(&base()).unwrap();
    // Make the unet config's float 0.5 (f9 3800) a single 0.5 in place of the half.
    let at = bytes
        .windows(3)
        .position(|w| w == [0xf9, 0x38, 0x00])
        .unwrap();
    bytes.splice(at..at + 3, [0xfa, 0x3f, 0x00, 0x00, 0x00]);
    let err = Header::from_cbor(&bytes).unwrap_err();
    let FormatError::Encoding(message) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(
        message,
        &format!("spec §9: component \"unet\": the config: CBOR byte {at}: float 0.5 as single, not its shortest width (half)")
    );
}

#[test]
fn nesting_in_a_config_counts_from_the_root() {
    // The unet config map sits at depth 3, so a value in it may nest 60 arrays.
    let nested = |levels: usize| {
        let mut bytes = encode(&with(&[4, 0, 2, 0], t("PLACEHOLDER"))).unwrap();
        let at = bytes
            .windows(12)
            .position(|w| w == b"\x6bPLACEHOLDER")
            .unwrap();
        let mut arrays = vec![0x81; levels - 1];
        arrays.push(0x80);
        bytes.splice(at..at + 12, arrays);
        bytes
    };
    let deepest = nested(cbor::MAX_DEPTH - 4);
    let header = Header::from_cbor(&deepest).unwrap();
    assert_eq!(header.to_cbor().unwrap(), deepest);
    assert!(decode(&deepest).is_ok());
    let too_deep = nested(cbor::MAX_DEPTH - 3);
    let err = Header::from_cbor(&too_deep).unwrap_err();
    assert!(err.to_string().contains("nested deeper than 64"), "{err}");
    assert!(decode(&too_deep).is_err());
}

#[test]
fn hostile_counts_are_refused_without_reserving() {
    // A root claiming 2^32 − 1 components in a few bytes.
    let mut bytes = encode(&edited(|v| items(v, &[4]).clear())).unwrap();
    let at = bytes.len() - encode(&at(&mut base(), METADATA).clone()).unwrap().len() - 1;
    assert_eq!(bytes[at], 0x80);
    bytes.splice(at..at + 1, [0x9a, 0xff, 0xff, 0xff, 0xff]);
    assert!(Header::from_cbor(&bytes)
        .unwrap_err()
        .to_string()
        .contains("an array of 4294967295 items"));
}

#[test]
fn to_cbor_refuses_what_from_cbor_refuses() {
    let header = ok(&base());
    let mut float_metadata = header.clone();
    float_metadata
        .metadata
        .insert("x".into(), Value::Float(1.0));
    assert!(float_metadata
        .to_cbor()
        .unwrap_err()
        .to_string()
        .contains("the metadata: a float outside a config"));
    let mut default_file = header.clone();
    default_file.components[0].config_file = Some("config.json".into());
    assert!(default_file.to_cbor().is_err());
    let mut twice = header.clone();
    twice.components.push(twice.components[0].clone());
    assert!(twice
        .to_cbor()
        .unwrap_err()
        .to_string()
        .contains("is repeated"));
    let mut bytes_in_config = header.clone();
    bytes_in_config.components[0]
        .config
        .insert("b".into(), Value::Bytes(vec![]));
    assert!(bytes_in_config.to_cbor().is_err());
    let mut nan = header.clone();
    nan.components[0]
        .config
        .insert("n".into(), Value::Float(f64::NAN));
    assert!(nan.to_cbor().is_err());
    let mut other_format = header.clone();
    other_format.format = "cozytensors/2".into();
    assert!(matches!(
        other_format.to_cbor(),
        Err(FormatError::Format { .. })
    ));
    let mut empty_dtype = header;
    empty_dtype.components[0].tensors[0].dtype = Dtype::Other("".into());
    assert!(empty_dtype.to_cbor().is_err());
}

/// A random valid header: locations are placed first and chunks sized around them.
fn header() -> impl Strategy<Value = Header> {
    let dtype = prop_oneof![
        Just(Dtype::F32),
        Just(Dtype::BF16),
        Just(Dtype::U8),
        Just(Dtype::F4),
        Just(Dtype::I64),
        "[A-Z][A-Z0-9_]{0,5}".prop_map(|n| Dtype::parse(&n).unwrap()),
    ];
    let spec = (
        dtype,
        prop::collection::vec(0u64..40, 0..3),
        0u64..3,
        0u64..4,
        any::<bool>(),
    );
    let part = ("[a-z_]{1,8}", spec.clone());
    let tensor = (
        "[a-z.0-9]{1,12}",
        spec,
        prop::option::of((0usize..4, prop::collection::vec(part, 1..4))),
    );
    let config = || {
        prop::collection::btree_map(
            "[a-z_]{0,8}",
            crate::format::cbor::tests::value().prop_filter("no bytes", |v| !has_bytes(v)),
            0..4,
        )
    };
    let params =
        prop::collection::btree_map("[a-z_]{1,8}", (0u64..300).prop_map(Value::Uint), 0..3);
    let component = (
        "[a-z_]{1,10}",
        prop::collection::vec(tensor, 0..6),
        config(),
        prop::collection::btree_map(
            "[a-z]{1,6}(/[a-z.]{1,6})?",
            (any::<[u8; 32]>(), any::<u64>()),
            0..3,
        ),
        prop::option::of("[a-z_]{1,8}\\.json"),
        prop_oneof![
            Just(ClassRef::default()),
            ("[a-z]{1,8}", "[0-9.]{0,6}", "[A-Za-z]{0,10}").prop_map(|(library, version, name)| {
                ClassRef {
                    library,
                    version,
                    name,
                }
            }),
        ],
    );
    let encoding_pool = prop::collection::vec(("[a-z0-9]{1,6}\\.[a-z]{1,6}", params), 4);
    (
        prop::collection::vec(component, 0..4),
        encoding_pool,
        prop::option::of(config()),
        prop::collection::btree_map("[a-z]{1,6}", "[ -~]{0,8}".prop_map(Value::Text), 0..3),
        1u64..4,
        prop::collection::vec(0u64..5000, 3),
        prop::sample::select(vec!["cozytensors/1", "cozytensors/1.3"]),
    )
        .prop_map(
            |(components, pool, pipeline, metadata, chunk_count, slack, format)| {
                let mut chunk_needs = vec![1u64; chunk_count as usize];
                let mut place =
                    |(dtype, shape, chunk, block, empty): (Dtype, Vec<u64>, u64, u64, bool)| {
                        let length = match dtype.byte_len(&shape) {
                            Ok(Some(n)) => n,
                            _ => shape.iter().product::<u64>() + 3,
                        };
                        let shape = if dtype.byte_len(&shape).is_err() {
                            vec![2 * shape.len() as u64]
                        } else {
                            shape
                        };
                        let length = dtype.byte_len(&shape).unwrap().unwrap_or(length);
                        let chunk = chunk % chunk_count;
                        let location = if length == 0 {
                            Location {
                                chunk: if empty { 7 } else { 0 },
                                offset: 0,
                                length: 0,
                            }
                        } else {
                            let offset = block * ALIGN;
                            let need = &mut chunk_needs[chunk as usize];
                            *need = (*need).max(offset + length);
                            Location {
                                chunk,
                                offset,
                                length,
                            }
                        };
                        (dtype, shape, location)
                    };
                let mut names = HashSet::new();
                let mut encodings: Vec<Encoding> = Vec::new();
                let mut order: Vec<usize> = Vec::new();
                let mut built = Vec::new();
                for (name, tensors, config, assets, config_file, class) in components {
                    if !names.insert(name.clone()) {
                        continue;
                    }
                    let mut keys = HashSet::new();
                    let mut out = Vec::new();
                    for (key, spec, body) in tensors {
                        if !keys.insert(key.clone()) {
                            continue;
                        }
                        let (dtype, shape, location) = place(spec);
                        let body = match body {
                            None => Body::Plain(location),
                            Some((pick, parts)) => {
                                let index = match order.iter().position(|&p| p == pick) {
                                    Some(i) => i,
                                    None => {
                                        order.push(pick);
                                        encodings.push(Encoding {
                                            scheme: pool[pick].0.clone(),
                                            params: pool[pick].1.clone(),
                                        });
                                        order.len() - 1
                                    }
                                };
                                let mut roles = HashSet::new();
                                let parts = parts
                                    .into_iter()
                                    .filter(|(role, _)| roles.insert(role.clone()))
                                    .map(|(role, spec)| {
                                        let (dtype, shape, location) = place(spec);
                                        Part {
                                            role,
                                            dtype,
                                            shape,
                                            location,
                                        }
                                    })
                                    .collect();
                                Body::Encoded {
                                    encoding: index,
                                    parts,
                                }
                            }
                        };
                        out.push(Tensor {
                            key,
                            dtype,
                            shape,
                            body,
                        });
                    }
                    let config_name = config_file
                        .clone()
                        .unwrap_or_else(|| DEFAULT_CONFIG.to_owned());
                    let config_file = config_file.filter(|f| f != DEFAULT_CONFIG);
                    let assets = assets
                        .into_iter()
                        .filter(|(path, _)| *path != config_name && is_path(path))
                        .map(|(path, (digest, length))| {
                            (
                                path,
                                ObjectRef {
                                    sha256: Sha256(digest),
                                    length,
                                },
                            )
                        })
                        .collect();
                    built.push(Component {
                        name,
                        class,
                        config,
                        tensors: out,
                        assets,
                        config_file,
                    });
                }
                // Identical pool entries would be one encoding.
                let chunks = chunk_needs
                    .iter()
                    .enumerate()
                    .map(|(i, need)| ObjectRef {
                        sha256: Sha256([i as u8; 32]),
                        length: need + slack[i % 3],
                    })
                    .collect();
                Header {
                    format: format.to_owned(),
                    chunks,
                    encodings,
                    pipeline: pipeline.map(|config| Pipeline {
                        class: ClassRef {
                            library: "diffusers".into(),
                            version: "0.30.0".into(),
                            name: "P".into(),
                        },
                        config,
                    }),
                    components: built,
                    metadata,
                }
            },
        )
        .prop_filter("distinct encodings", |h| {
            h.encodings
                .iter()
                .enumerate()
                .all(|(i, e)| !h.encodings[..i].contains(e))
        })
}

fn has_bytes(v: &Value) -> bool {
    match v {
        Value::Bytes(_) => true,
        Value::Array(items) => items.iter().any(has_bytes),
        Value::Map(entries) => entries.iter().any(|(_, v)| has_bytes(v)),
        _ => false,
    }
}

proptest! {
    #[test]
    fn random_headers_round_trip_through_their_bytes(h in header()) {
        let bytes = h.to_cbor().unwrap();
        let back = Header::from_cbor(&bytes).unwrap();
        prop_assert_eq!(&back, &h);
        prop_assert_eq!(back.to_cbor().unwrap(), bytes.clone());
        prop_assert_eq!(encode(&decode(&bytes).unwrap()).unwrap(), bytes);
    }

    #[test]
    fn from_cbor_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(h) = Header::from_cbor(&bytes) {
            prop_assert_eq!(h.to_cbor().unwrap(), bytes);
        }
    }

    #[test]
    fn from_cbor_never_panics_on_mutated_headers(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4)
    ) {
        let mut bytes = encode(&base()).unwrap();
        for (at, byte) in flips {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        if let Ok(h) = Header::from_cbor(&bytes) {
            let again = h.to_cbor().unwrap();
            prop_assert_eq!(Header::from_cbor(&again).unwrap(), h);
        }
    }
}
