//! Tests of [`super`].

use super::*;
use proptest::prelude::*;

fn hex(text: &str) -> Vec<u8> {
    hex::decode(text.replace(' ', "")).unwrap()
}

fn refused(text: &str, rule: &str) {
    match decode(&hex(text)) {
        Err(FormatError::Encoding(message)) => {
            assert!(message.contains(rule), "{text}: {message:?} lacks {rule:?}")
        }
        other => panic!("{text}: expected a refusal naming {rule:?}, got {other:?}"),
    }
}

fn accepted(text: &str) -> Value {
    let bytes = hex(text);
    let value = decode(&bytes).unwrap_or_else(|e| panic!("{text}: {e}"));
    assert_eq!(
        encode(&value).unwrap(),
        bytes,
        "{text} re-encodes differently"
    );
    value
}

fn nested_arrays(levels: usize) -> Vec<u8> {
    let mut bytes = vec![0x81; levels - 1];
    bytes.push(0x80);
    bytes
}

#[test]
fn every_kind_of_value_decodes_and_reencodes_identically() {
    assert_eq!(accepted("00"), Value::Uint(0));
    assert_eq!(accepted("17"), Value::Uint(23));
    assert_eq!(accepted("1818"), Value::Uint(24));
    assert_eq!(accepted("1bffffffffffffffff"), Value::Uint(u64::MAX));
    assert_eq!(accepted("20"), Value::Nint(0));
    assert_eq!(accepted("3903e7"), Value::Nint(999));
    assert_eq!(accepted("4401020304"), Value::Bytes(vec![1, 2, 3, 4]));
    assert_eq!(accepted("62c3bc"), Value::Text("ü".into()));
    assert_eq!(accepted("60"), Value::Text(String::new()));
    assert_eq!(
        accepted("83 01 82 02 03 80"),
        Value::Array(vec![
            Value::Uint(1),
            Value::Array(vec![Value::Uint(2), Value::Uint(3)]),
            Value::Array(vec![])
        ])
    );
    assert_eq!(
        accepted("a2 61 62 f5 62 61 61 f6"),
        Value::Map(vec![
            ("b".into(), Value::Bool(true)),
            ("aa".into(), Value::Null)
        ])
    );
    assert_eq!(accepted("f4"), Value::Bool(false));
    assert_eq!(accepted("f93e00"), Value::Float(1.5));
}

#[test]
fn tags_are_refused() {
    refused("c0 60", "a tag");
    refused("d8 20 60", "a tag");
}

#[test]
fn undefined_and_simple_values_other_than_true_false_null_are_refused() {
    refused("f7", "undefined");
    refused("e0", "simple value");
    refused("f3", "simple value");
    refused("f8 20", "simple value");
    refused("fc", "reserved");
    accepted("f4");
    accepted("f5");
    accepted("f6");
}

#[test]
fn non_finite_floats_are_refused_in_every_width() {
    refused("f9 7c00", "not finite");
    refused("f9 fc00", "not finite");
    refused("f9 7e00", "not finite");
    refused("fa 7f800000", "not finite");
    refused("fa 7fc00000", "not finite");
    refused("fb 7ff0000000000000", "not finite");
    refused("fb 7ff8000000000000", "not finite");
}

#[test]
fn floats_wider_than_their_shortest_exact_width_are_refused() {
    refused("fa 3fc00000", "shortest width (half)");
    refused("fb 3ff8000000000000", "shortest width (half)");
    refused("fa 80000000", "shortest width (half)");
    refused("fb 40f86a0000000000", "shortest width (single)");
    assert_eq!(accepted("fa 47c35000"), Value::Float(100000.0));
    assert_eq!(accepted("fb 3fb999999999999a"), Value::Float(0.1));
    assert_eq!(accepted("f9 7bff"), Value::Float(65504.0));
    assert_eq!(accepted("f9 0001"), Value::Float(5.960464477539063e-08));
    assert_eq!(accepted("fa 00000001"), Value::Float(1.401298464324817e-45));
    assert_eq!(accepted("fb 0000000000000001"), Value::Float(5e-324));
    let negative_zero = accepted("f9 8000");
    assert!(matches!(negative_zero, Value::Float(z) if z == 0.0 && z.is_sign_negative()));
}

#[test]
fn floats_encode_in_the_shortest_width_that_holds_them_exactly() {
    let cases: [(f64, &str); 10] = [
        (0.0, "f90000"),
        (-0.0, "f98000"),
        (1.5, "f93e00"),
        (65504.0, "f97bff"),
        (65520.0, "fa477ff000"),
        (5.960464477539063e-08, "f90001"),
        (2.9802322387695312e-08, "fa33000000"),
        (100000.0, "fa47c35000"),
        (0.1, "fb3fb999999999999a"),
        (1.0 + f64::EPSILON, "fb3ff0000000000001"),
    ];
    for (value, expected) in cases {
        assert_eq!(
            hex::encode(encode(&Value::Float(value)).unwrap()),
            expected,
            "{value:e}"
        );
    }
}

#[test]
fn every_finite_half_converts_to_double_and_back_exactly() {
    for bits in 0..=u16::MAX {
        match half_to_f64(bits) {
            Some(value) => assert_eq!(f64_to_half(value), Some(bits), "{bits:#06x}"),
            None => assert_eq!(bits & 0x7c00, 0x7c00),
        }
    }
    // Just off the half grid: one bit more precision, or just outside its range.
    assert_eq!(f64_to_half(1.0 + f64::powi(2.0, -11)), None);
    assert_eq!(f64_to_half(f64::powi(2.0, -25)), None);
    assert_eq!(f64_to_half(3.0 * f64::powi(2.0, -25)), None);
    assert_eq!(f64_to_half(65536.0), None);
    assert_eq!(f64_to_half(f64::MIN_POSITIVE / 2.0), None);
}

#[test]
fn heads_not_in_their_shortest_form_are_refused() {
    refused("18 17", "shortest form");
    accepted("18 18");
    refused("19 00ff", "shortest form");
    accepted("19 0100");
    refused("1a 0000ffff", "shortest form");
    accepted("1a 00010000");
    refused("1b 00000000ffffffff", "shortest form");
    accepted("1b 0000000100000000");
    refused("78 01 61", "shortest form");
    refused("98 00", "shortest form");
    refused("b8 00", "shortest form");
    refused("38 00", "shortest form");
}

#[test]
fn indefinite_lengths_breaks_and_reserved_heads_are_refused() {
    refused("9f ff", "indefinite");
    refused("5f 41 00 ff", "indefinite");
    refused("7f 61 61 ff", "indefinite");
    refused("bf ff", "indefinite");
    refused("ff", "break");
    refused("1c", "reserved");
    refused("1f", "indefinite");
}

#[test]
fn map_keys_must_be_text() {
    refused("a1 01 02", "not a text string");
    refused("a1 41 61 02", "not a text string");
}

#[test]
fn map_keys_must_be_in_bytewise_order_of_their_encodings_and_unique() {
    accepted("a2 61 61 00 61 62 00");
    refused("a2 61 62 00 61 61 00", "out of canonical order");
    refused("a2 61 61 00 61 61 00", "repeated");
    // Shorter keys first, whatever their bytes.
    accepted("a2 61 7a 00 62 61 61 00");
    refused("a2 62 61 61 00 61 7a 00", "out of canonical order");
}

#[test]
fn invalid_utf8_is_refused_with_its_offset() {
    refused("62 c3 28", "byte 1: invalid UTF-8");
    refused("82 60 63 61 ed a0", "invalid UTF-8");
    accepted("63 e2 82 ac");
}

#[test]
fn integers_must_lie_in_minus_two_to_the_63_up_to_two_to_the_64() {
    assert_eq!(
        accepted("3b 7fffffffffffffff").as_int(),
        Some(i64::MIN as i128)
    );
    refused("3b 8000000000000000", "below -2^63");
    assert_eq!(
        accepted("1b ffffffffffffffff").as_int(),
        Some(u64::MAX as i128)
    );
    assert!(encode(&Value::Nint(1 << 63)).is_err());
}

#[test]
fn bytes_after_the_root_are_refused() {
    refused("00 00", "1 bytes after the root");
    refused("80 ff", "after the root");
}

#[test]
fn truncated_input_is_refused() {
    refused("", "input ends");
    refused("18", "left");
    refused("82 00", "2 items, but 1 bytes are left");
    refused("82 82 00 00", "input ends");
    refused("63 61 62", "left");
    refused("f9 00", "left");
}

#[test]
fn nesting_is_accepted_up_to_max_depth_and_refused_beyond() {
    let deepest = decode(&nested_arrays(MAX_DEPTH)).unwrap();
    assert_eq!(encode(&deepest).unwrap(), nested_arrays(MAX_DEPTH));
    let err = decode(&nested_arrays(MAX_DEPTH + 1)).unwrap_err();
    assert!(err.to_string().contains("nested deeper"), "{err}");
    let mut too_deep = Value::Array(vec![]);
    for _ in 0..MAX_DEPTH {
        too_deep = Value::Array(vec![too_deep]);
    }
    assert!(encode(&too_deep).is_err());
    let mut maps = [0xa1, 0x60].repeat(MAX_DEPTH);
    maps.push(0x00);
    assert!(decode(&maps).is_ok());
    let mut maps = [0xa1, 0x60].repeat(MAX_DEPTH + 1);
    maps.push(0x00);
    assert!(decode(&maps).is_err());
}

#[test]
fn hostile_lengths_are_refused_before_anything_is_reserved() {
    refused(
        "9b ffffffffffffffff",
        "an array of 18446744073709551615 items",
    );
    refused("bb ffffffffffffffff", "a map of");
    refused("5b ffffffffffffffff", "a byte string of");
    refused("7a ffffffff", "a text string of 4294967295 bytes");
    refused(
        "9a 0fffffff 00 00",
        "an array of 268435455 items, but 2 bytes are left",
    );
    // A map needs two bytes an entry.
    refused("a2 60 00", "a map of 2 entries");
}

#[test]
fn encode_refuses_non_finite_floats_and_repeated_keys() {
    assert!(encode(&Value::Float(f64::NAN)).is_err());
    assert!(encode(&Value::Float(f64::INFINITY)).is_err());
    let repeated = Value::Map(vec![("a".into(), Value::Null), ("a".into(), Value::Null)]);
    assert!(encode(&repeated).is_err());
}

#[test]
fn encode_writes_map_entries_in_canonical_order_whatever_their_order() {
    let unordered = Value::Map(vec![
        ("bb".into(), Value::Uint(1)),
        ("c".into(), Value::Uint(2)),
        ("a".into(), Value::Uint(3)),
    ]);
    let bytes = encode(&unordered).unwrap();
    assert_eq!(hex::encode(&bytes), "a361610361630262626201");
    assert_eq!(
        decode(&bytes).unwrap(),
        Value::map(match unordered {
            Value::Map(entries) => entries,
            _ => unreachable!(),
        })
    );
}

fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>().prop_filter("finite", |f| f.is_finite()),
        any::<f32>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(f64::from),
        any::<u16>().prop_filter_map("finite", half_to_f64),
        Just(-0.0),
        Just(0.0),
    ]
}

pub(crate) fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        any::<u64>().prop_map(Value::Uint),
        (0..=i64::MAX as u64).prop_map(Value::Nint),
        prop::collection::vec(any::<u8>(), 0..40).prop_map(Value::Bytes),
        ".{0,12}".prop_map(Value::Text),
        any::<bool>().prop_map(Value::Bool),
        Just(Value::Null),
        float().prop_map(Value::Float),
    ];
    leaf.prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(".{0,6}", inner, 0..6).prop_map(Value::map),
        ]
    })
}

proptest! {
    #[test]
    fn random_values_round_trip_and_encode_stably(v in value()) {
        let bytes = encode(&v).unwrap();
        let back = decode(&bytes).unwrap();
        prop_assert_eq!(&back, &v);
        prop_assert_eq!(encode(&back).unwrap(), bytes);
    }

    #[test]
    fn decode_never_panics_and_accepted_bytes_reencode_identically(
        bytes in prop::collection::vec(any::<u8>(), 0..64)
    ) {
        if let Ok(v) = decode(&bytes) {
            prop_assert_eq!(encode(&v).unwrap(), bytes);
        }
    }

    #[test]
    fn decode_never_panics_on_mutated_encodings(
        v in value(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4)
    ) {
        let mut bytes = encode(&v).unwrap();
        for (at, byte) in flips {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        if let Ok(v) = decode(&bytes) {
            prop_assert_eq!(encode(&v).unwrap(), bytes);
        }
    }
}
