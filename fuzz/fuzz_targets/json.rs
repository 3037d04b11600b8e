//! Arbitrary bytes as strict JSON and as a config: parsing must refuse or accept without
//! panicking, an accepted document's canonical form must parse back to the same value, and a
//! config reads as the document does wherever the document is accepted.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensorfs::format::json::{canonical, hf_config_text, parse, parse_config};

fuzz_target!(|bytes: &[u8]| {
    let config = parse_config(bytes);
    let Ok(json) = parse(bytes) else {
        return;
    };
    assert_eq!(config.as_ref().ok(), Some(&json));
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
