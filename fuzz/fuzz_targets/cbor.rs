//! Deterministic CBOR: decoding never panics, and whatever decodes re-encodes to the same
//! bytes (one value, one encoding).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensorfs::format::cbor;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(value) = cbor::decode(bytes) {
        let again = cbor::encode(&value).expect("a decoded value encodes");
        assert_eq!(again, bytes, "decode then encode changed the bytes");
    }
});
