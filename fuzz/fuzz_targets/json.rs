//! Arbitrary bytes as strict JSON: parsing must refuse or accept without panicking, and an
//! accepted document's canonical form must parse back to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensorfs::format::json::{canonical, hf_config_text, parse};

fuzz_target!(|bytes: &[u8]| {
    let Ok(json) = parse(bytes) else {
        return;
    };
    // Configs may hold floats and null, which Python's writer spells in JSON it reads back.
    let config = hf_config_text(&json);
    let reread = parse(config.as_bytes()).expect("the config text is JSON");
    assert_eq!(hf_config_text(&reread), config);
    // Documents may not; when the value is one, its canonical form is a fixed point.
    if let Ok(text) = canonical(&json) {
        let again = parse(text.as_bytes()).expect("canonical JSON parses");
        assert_eq!(canonical(&again).unwrap(), text);
    }
});
