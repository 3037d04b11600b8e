//! Arbitrary bytes as a whole safetensors file: framing and header parsing must refuse or
//! accept without panicking, and what they accept must be consistent.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensorfs::format::safetensors::{canonical_header, header_len, parse_header, Entry};

fuzz_target!(|file: &[u8]| {
    let file_len = file.len() as u64;
    let Ok(n) = header_len(file, file_len) else {
        return;
    };
    let json = &file[8..8 + n as usize];
    let Ok(header) = parse_header(json, file_len) else {
        return;
    };
    assert_eq!(header.data_start() + header.data_len(), file_len);
    // Rewriting what was accepted gives a header that reads back to the same tensors.
    let entries: Vec<Entry<'_>> = header
        .tensors
        .iter()
        .map(|t| Entry {
            name: &t.name,
            dtype: &t.dtype,
            shape: &t.shape,
            length: t.end - t.begin,
        })
        .collect();
    let (prefix, order) = canonical_header(&entries, header.metadata.as_deref());
    let reread = parse_header(&prefix[8..], prefix.len() as u64 + header.data_len())
        .expect("the canonical header of an accepted file is accepted");
    assert_eq!(reread.metadata, header.metadata);
    for (tensor, &i) in reread.tensors.iter().zip(&order) {
        let original = &header.tensors[i];
        assert_eq!(
            (
                &tensor.name,
                &tensor.dtype,
                &tensor.shape,
                tensor.end - tensor.begin
            ),
            (
                &original.name,
                &original.dtype,
                &original.shape,
                original.end - original.begin
            )
        );
    }
});
