//! Arbitrary bytes as a whole GGUF file, and as a prefix of a longer one: the reader refuses or
//! accepts without panicking, and what it accepts its writer writes back byte for byte.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensorfs::format::gguf::{layout, parse, write, write_unpadded, GgufError};

fuzz_target!(|file: &[u8]| {
    let file_len = file.len() as u64;
    // As a prefix of a file twice as long: it reads, asks for more within the file, or refuses.
    match parse(file, 2 * file_len) {
        Err(GgufError::Incomplete(needed)) => {
            assert!(needed > file_len && needed <= 2 * file_len)
        }
        Ok(_) | Err(GgufError::Format(_)) => {}
    }
    let parsed = match parse(file, file_len) {
        Ok(p) => p,
        Err(GgufError::Incomplete(n)) => panic!("the whole file asked for {n} bytes"),
        Err(GgufError::Format(_)) => return,
    };
    let l = &parsed.layout;
    assert!(l.header_len <= l.content_end && l.content_end <= file_len);
    let header = write_unpadded(&parsed.gguf);
    assert_eq!(header.as_slice(), &file[..l.header_len as usize]);
    if l.alignment <= 1 << 20 {
        let padded = write(&parsed.gguf).expect("an accepted header has a valid alignment");
        assert_eq!(padded.len() as u64, l.data_start);
    }
    assert_eq!(
        layout(&parsed.gguf, file_len).expect("an accepted header lays out"),
        *l
    );
});
