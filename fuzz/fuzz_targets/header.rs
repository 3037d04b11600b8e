//! Headers: `Header::from_cbor` never panics; an accepted header without later fields
//! re-encodes to the same bytes, and one with them re-encodes to a header that decodes to the
//! same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensorfs::format::{cbor, Header, Value};

fuzz_target!(|bytes: &[u8]| {
    let Ok(header) = Header::from_cbor(bytes) else {
        return;
    };
    // Everything a header accepts is deterministic CBOR too.
    let value = cbor::decode(bytes).expect("an accepted header is valid CBOR");
    let again = header.to_cbor().expect("an accepted header encodes");
    if !has_later_fields(&value) {
        assert_eq!(again, bytes, "a header without later fields changed its bytes");
    }
    let reread = Header::from_cbor(&again).expect("a re-encoded header decodes");
    assert_eq!(reread, header);
});

/// Whether any record of an accepted header carries elements past those this build knows.
fn has_later_fields(root: &Value) -> bool {
    let Value::Array(fields) = root else {
        return true;
    };
    let array = |v: &Value| match v {
        Value::Array(items) => items.clone(),
        _ => Vec::new(),
    };
    let longer = |v: &Value, known: usize| matches!(v, Value::Array(items) if items.len() > known);
    let object_longer = |v: &Value| longer(v, 2);
    if fields.len() > 6 {
        return true;
    }
    if array(&fields[1]).iter().any(object_longer) {
        return true;
    }
    if array(&fields[2]).iter().any(|e| longer(e, 2)) || longer(&fields[3], 2) {
        return true;
    }
    for component in array(&fields[4]) {
        // A config_file is a known field; anything after it is later.
        if longer(&component, 6) {
            return true;
        }
        let parts = array(&component);
        if let Some(Value::Map(assets)) = parts.get(4) {
            if assets.iter().any(|(_, object)| object_longer(object)) {
                return true;
            }
        }
        for tensor in array(&parts[3]) {
            let t = array(&tensor);
            if t.len() > 5 {
                return true;
            }
            match t[3] {
                Value::Uint(0) => {
                    if longer(&t[4], 3) {
                        return true;
                    }
                }
                _ => {
                    for part in array(&t[4]) {
                        let p = array(&part);
                        if p.len() > 4 || longer(&p[3], 3) {
                            return true;
                        }
                    }
                }
            }
        }
    }
    false
}
