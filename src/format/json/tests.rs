//! Tests of [`super`].

use super::*;

fn err(text: &str) -> String {
    match parse(text.as_bytes()) {
        Err(FormatError::Encoding(m)) => m,
        other => panic!("{text:?} should be refused, got {other:?}"),
    }
}

#[test]
fn parses_every_kind_of_value() {
    let json =
        parse(br#" {"a": [1, -2, 1.5, true, false, null, "x\u00e9\ud83d\ude00"], "b": {}} "#)
            .unwrap();
    assert_eq!(
        json,
        Json::Object(vec![
            (
                "a".into(),
                Json::Array(vec![
                    Json::Uint(1),
                    Json::Int(-2),
                    Json::Float(1.5),
                    Json::Bool(true),
                    Json::Bool(false),
                    Json::Null,
                    Json::Text("xé😀".into()),
                ])
            ),
            ("b".into(), Json::Object(vec![])),
        ])
    );
}

#[test]
fn integers_at_the_range_limits() {
    assert_eq!(
        parse(b"18446744073709551615").unwrap(),
        Json::Uint(u64::MAX)
    );
    assert!(err("18446744073709551616").contains("outside"));
    assert_eq!(parse(b"-9223372036854775808").unwrap(), Json::Int(i64::MIN));
    assert!(err("-9223372036854775809").contains("outside"));
    assert!(err("-99999999999999999999999").contains("outside"));
    // serde_json (safetensors, the reference) reads `-0` as a float.
    assert!(matches!(parse(b"-0").unwrap(), Json::Float(z) if z == 0.0 && z.is_sign_negative()));
    assert_eq!(parse(b"1e20").unwrap(), Json::Float(1e20));
    assert_eq!(parse(b"1E+2").unwrap(), Json::Float(100.0));
    assert_eq!(parse(b"-0.0").unwrap(), Json::Float(-0.0));
}

#[test]
fn a_config_reads_integers_past_the_range_as_floats() {
    let config = |text: &str| parse_config(text.as_bytes()).unwrap();
    // Transformers' "no limit" for a tokenizer's model_max_length: exactly 1e30 as a double.
    assert_eq!(config("1000000000000000019884624838656"), Json::Float(1e30));
    assert_eq!(
        config("18446744073709551616"),
        Json::Float(18446744073709551616.0)
    );
    assert_eq!(
        config("-9223372036854775809"),
        Json::Float(-9223372036854775808.0)
    );
    // Within the range, integers stay integers, as in every document.
    assert_eq!(config("18446744073709551615"), Json::Uint(u64::MAX));
    assert_eq!(config("-9223372036854775808"), Json::Int(i64::MIN));
    assert!(matches!(config("-0"), Json::Float(z) if z.is_sign_negative()));
    let huge = "9".repeat(400);
    match parse_config(huge.as_bytes()) {
        Err(FormatError::Encoding(m)) => assert!(m.contains("out of the float range"), "{m}"),
        other => panic!("{other:?}"),
    }
    // Documents still refuse them (spec §9).
    assert!(err("1000000000000000019884624838656").contains("outside"));
}

#[test]
fn floats_parse_exactly() {
    for text in [
        "0.1",
        "2.2250738585072014e-308",
        "1.7976931348623157e308",
        "5e-324",
        "0.30000000000000004",
        "9007199254740993.0",
    ] {
        let expected: f64 = text.parse().unwrap();
        assert_eq!(
            parse(text.as_bytes()).unwrap(),
            Json::Float(expected),
            "{text}"
        );
    }
    assert!(err("1e400").contains("float range"));
    assert_eq!(parse(b"1e-400").unwrap(), Json::Float(0.0));
}

#[test]
fn refuses_what_rfc_8259_refuses() {
    for bad in [
        "",
        " ",
        "NaN",
        "Infinity",
        "-Infinity",
        "nan",
        "01",
        "-01",
        "1.",
        ".5",
        "1e",
        "+1",
        "0x10",
        "[1,]",
        "{\"a\":1,}",
        "{'a':1}",
        "{\"a\" 1}",
        "[1 2]",
        "\"a",
        "\"\\x\"",
        "\"\t\"",
        "\"\\ud800\"",
        "\"\\udc00\"",
        "\"\\ud800\\u0041\"",
        "tru",
        "nul",
        "1 2",
        "\u{feff}1",
        "[",
        "{",
        "{\"a\":}",
        "\"\\u12\"",
        "\"\\u12g4\"",
    ] {
        err(bad);
    }
    assert!(parse(b"\"\xff\"").is_err());
    let m = parse(b"{\n  \"a\": \"\xc3\x28\"}").unwrap_err().to_string();
    assert!(m.contains("UTF-8") && m.contains("line 2, column 9"), "{m}");
}

#[test]
fn repeated_keys_are_refused_with_their_path() {
    let m = err(r#"{"a": {"b": [0, {"k": 1, "k": 2}]}}"#);
    assert!(m.contains("repeated key \"k\""), "{m}");
    assert!(m.contains("$.a.b[1]"), "{m}");
    // Past the scan threshold the hash set takes over.
    let many: Vec<String> = (0..20).map(|i| format!("\"k{i}\":{i}")).collect();
    let ok = format!("{{{}}}", many.join(","));
    assert!(parse(ok.as_bytes()).is_ok());
    let dup = format!("{{{},\"k3\":0}}", many.join(","));
    assert!(err(&dup).contains("repeated key \"k3\""));
    let dup_late = format!("{{{},\"k19\":0}}", many.join(","));
    assert!(err(&dup_late).contains("repeated key \"k19\""));
    // A key equal once escapes are read is the same key.
    assert!(err(r#"{"a":1,"\u0061":2}"#).contains("repeated"));
}

#[test]
fn errors_give_line_and_column() {
    let m = err("{\n  \"a\": 1,\n  \"b\": x\n}");
    assert!(m.contains("line 3, column 8"), "{m}");
    assert!(m.contains("$.b"), "{m}");
}

#[test]
fn nesting_is_bounded() {
    let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
    assert!(parse(ok.as_bytes()).is_ok());
    let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
    assert!(err(&deep).contains("nested deeper"));
    let hostile = "[".repeat(1_000_000);
    assert!(parse(hostile.as_bytes()).is_err());
}

#[test]
fn canonical_sorts_keys_by_bytes_and_escapes_as_the_spec_says() {
    let json = parse(
        "{\"b\":1,\"a\":[-3,true],\"é\":\"\\\"\\\\\\b\\t\\n\\f\\r\\u0001\\u001f\\u007f/é😀\",\"Z\":{}}"
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(
        canonical(&json).unwrap(),
        "{\"Z\":{},\"a\":[-3,true],\"b\":1,\"é\":\"\\\"\\\\\\b\\t\\n\\f\\r\\u0001\\u001f\u{7f}/é😀\"}"
    );
    assert!(canonical(&Json::Array(vec![Json::Null])).is_err());
    let m = canonical(&parse(br#"{"a":{"b":[1,2.5]}}"#).unwrap()).unwrap_err();
    assert!(m.to_string().contains("$.a.b[1]"), "{m}");
    let dup = Json::Object(vec![
        ("a".into(), Json::Uint(1)),
        ("a".into(), Json::Uint(2)),
    ]);
    assert!(canonical(&dup).is_err());
}

#[test]
fn canonical_strings_match_serde_json() {
    let mut text = String::new();
    for c in (0u32..0x250).filter_map(char::from_u32) {
        text.push(c);
    }
    text.push_str("\u{2028}\u{fffd}😀");
    let mut ours = String::new();
    write_string(&text, &mut ours);
    assert_eq!(ours, serde_json::to_string(&text).unwrap());
}

#[test]
fn value_conversions_round_trip() {
    let json = parse(
        br#"{"zz":1,"a":{"y":[-1,-9223372036854775808,18446744073709551615]},"f":0.5,"n":null,"t":"x","b":false}"#,
    )
    .unwrap();
    let value = to_value(&json);
    let Value::Map(entries) = &value else {
        panic!("a map")
    };
    let keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["a", "b", "f", "n", "t", "zz"]);
    assert_eq!(
        entries[0].1,
        Value::map([(
            "y".to_string(),
            Value::Array(vec![
                Value::Nint(0),
                Value::Nint(i64::MAX as u64),
                Value::Uint(u64::MAX)
            ])
        )])
    );
    let back = from_value(&value);
    assert_eq!(
        back.get("a").unwrap().get("y"),
        json.get("a").unwrap().get("y")
    );
    assert_eq!(back.get("f"), Some(&Json::Float(0.5)));
    assert_eq!(back.get("n"), Some(&Json::Null));
    assert_eq!(
        from_value(&Value::Bytes(vec![0x00, 0xab, 0xff])),
        Json::Text("00abff".into())
    );
    assert_eq!(to_value(&Json::Int(5)), Value::Uint(5));
}

#[test]
fn python_float_repr_switches_notation_where_python_does() {
    for (value, repr) in [
        (0.0, "0.0"),
        (-0.0, "-0.0"),
        (1.0, "1.0"),
        (0.1, "0.1"),
        (0.0001, "0.0001"),
        (0.00001, "1e-05"),
        (1.5e-7, "1.5e-07"),
        (100000.0, "100000.0"),
        (1e15, "1000000000000000.0"),
        (1e16, "1e+16"),
        (1.2345e16, "1.2345e+16"),
        (123456789012345.6, "123456789012345.6"),
        (1e100, "1e+100"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (-2.5e-5, "-2.5e-05"),
        (0.30000000000000004, "0.30000000000000004"),
    ] {
        assert_eq!(python_float_repr(value), repr, "{value:e}");
    }
}

#[test]
fn hf_config_text_indents_like_python() {
    let json = parse(
        r#"{"b":[1,{"y":null,"x":[]}],"a":{},"é":"\u0001\u007fé😀","f":1e-5,"t":true}"#.as_bytes(),
    )
    .unwrap();
    assert_eq!(
        hf_config_text(&json),
        "{\n  \"a\": {},\n  \"b\": [\n    1,\n    {\n      \"x\": [],\n      \"y\": null\n    }\n  ],\n  \"f\": 1e-05,\n  \"t\": true,\n  \"\\u00e9\": \"\\u0001\\u007f\\u00e9\\ud83d\\ude00\"\n}\n"
    );
    assert_eq!(hf_config_text(&Json::Object(vec![])), "{}\n");
}

/// Cases written by CPython's `json.dumps(indent=2, sort_keys=True)`; see
/// `tests/data/json/gen_hf_config.py`.
#[test]
fn hf_config_text_matches_python_on_golden_cases() {
    let cases = include_str!("../../../tests/data/json/hf_config_cases.jsonl");
    let mut count = 0;
    for (line_no, line) in cases.lines().enumerate() {
        let Json::Array(pair) = parse(line.as_bytes()).unwrap() else {
            panic!("line {}: not a pair", line_no + 1)
        };
        let [Json::Text(input), Json::Text(expected)] = &pair[..] else {
            panic!("line {}: not two strings", line_no + 1)
        };
        let config = parse(input.as_bytes()).unwrap();
        assert_eq!(hf_config_text(&config), *expected, "line {}", line_no + 1);
        count += 1;
    }
    assert!(count > 400);
}

#[test]
fn document_values_refuse_null_and_floats_anywhere() {
    assert!(check_document_values(&parse(br#"{"a":[1,"x",{"b":true}]}"#).unwrap()).is_ok());
    let m = check_document_values(&parse(br#"{"x":{"y":[0,null]}}"#).unwrap()).unwrap_err();
    assert!(m.to_string().contains("$.x.y[1] is null"), "{m}");
    assert!(check_document_values(&parse(br#"{"x":1.0}"#).unwrap()).is_err());
}
