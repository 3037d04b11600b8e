//! Tests of [`super`].

use proptest::prelude::*;

use super::*;

fn info(name: &str, ne: &[u64], ggml_type: u32, offset: u64) -> TensorInfo {
    TensorInfo {
        name: name.into(),
        ne: ne.to_vec(),
        ggml_type,
        offset,
    }
}

/// A header with a few keys and three tensors laid out as ggml lays them out.
fn sample() -> Gguf {
    Gguf {
        version: 3,
        kv: vec![
            (
                "general.architecture".into(),
                KvValue::String("llama".into()),
            ),
            ("general.file_type".into(), KvValue::U32(7)),
            ("x.f32".into(), KvValue::F32((-0.0f32).to_bits())),
            ("x.nan".into(), KvValue::F64(0x7ff8_0000_0000_0001)),
            ("x.flag".into(), KvValue::Bool(true)),
            (
                "tokenizer.ggml.tokens".into(),
                KvValue::Array(KvArray::String(vec!["<s>".into(), "é".into(), "".into()])),
            ),
            (
                "x.nested".into(),
                KvValue::Array(KvArray::Array(vec![
                    KvArray::I32(vec![-1, 2]),
                    KvArray::Bool(vec![]),
                ])),
            ),
        ],
        tensors: vec![
            info("a", &[3], 0, 0),             // 12 bytes
            info("b.weight", &[64, 2], 8, 32), // q8_0: 2 blocks per row, 136 bytes
            info("c", &[2, 2], 30, 32 + 160),  // bf16: 8 bytes
        ],
    }
}

/// A whole file: the header, then `data_len` bytes of data (zeros, `fill` at each tensor).
fn file(g: &Gguf, data_len: u64, fill: u8) -> Vec<u8> {
    let mut out = write(g).unwrap();
    let start = out.len();
    out.resize(start + data_len as usize, 0);
    for t in &g.tensors {
        // Tensors a test makes invalid are left unfilled.
        let Ok(n) = t.nbytes() else { continue };
        let at = (start as u64).saturating_add(t.offset);
        if at.saturating_add(n) <= out.len() as u64 {
            out[at as usize..(at + n) as usize].fill(fill);
        }
    }
    out
}

fn whole(bytes: &[u8]) -> Result<Parsed, GgufError> {
    parse(bytes, bytes.len() as u64)
}

fn refused(bytes: &[u8]) -> String {
    match whole(bytes) {
        Err(GgufError::Format(e)) => e.to_string(),
        other => panic!("should be refused, got {other:?}"),
    }
}

/// `g` written, with `edit` applied to the bytes, as a whole file with 256 bytes of data.
fn edited(g: &Gguf, edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut bytes = file(g, 256, 0);
    edit(&mut bytes);
    bytes
}

/// Where the first occurrence of `needle` is in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("present")
}

#[test]
fn a_written_header_reads_back_with_its_layout() {
    let g = sample();
    let bytes = file(&g, 200, 7);
    let parsed = whole(&bytes).unwrap();
    assert_eq!(parsed.gguf, g);
    let l = &parsed.layout;
    assert_eq!(l.alignment, 32);
    assert_eq!(l.header_len, header_len(&g));
    assert_eq!(l.header_len as usize, write_unpadded(&g).len());
    assert_eq!(l.data_start, l.header_len.next_multiple_of(32));
    assert_eq!(l.data_start as usize, write(&g).unwrap().len());
    assert_eq!(l.lengths, [12, 136, 8]);
    assert_eq!(l.order, [0, 1, 2]);
    assert_eq!(l.content_end, l.data_start + 200);
    // The header bytes are the file's, exactly.
    assert_eq!(write(&g).unwrap(), bytes[..l.data_start as usize]);
}

#[test]
fn the_ggml_table_has_every_type_of_the_brief_and_plain_types_have_dtypes() {
    let plain: Vec<(&str, Dtype)> = GGML_TYPES
        .iter()
        .filter_map(|t| t.dtype().map(|d| (t.name, d)))
        .collect();
    assert_eq!(plain.len(), 8);
    assert!(plain.contains(&("bf16", Dtype::BF16)));
    for t in GGML_TYPES {
        assert_eq!(t.dtype().is_some(), t.block == 1, "{}", t.name);
        assert_eq!(ggml_type(t.id), Some(t));
        if let Some(d) = t.dtype() {
            assert_eq!(d.bits(), Some(8 * t.size as u32), "{}", t.name);
        }
    }
    assert_eq!(GGML_TYPES.len(), 34);
    let q4_k = ggml_type(12).unwrap();
    assert_eq!((q4_k.name, q4_k.block, q4_k.size), ("q4_k", 256, 144));
    for gone in [4, 5, 31, 32, 33, 36, 37, 38, 42, u32::MAX] {
        assert_eq!(ggml_type(gone), None, "{gone}");
    }
}

#[test]
fn a_prefix_asks_for_more_and_the_full_file_reads() {
    let g = sample();
    let bytes = file(&g, 200, 1);
    let n = bytes.len() as u64;
    // Any prefix short of the header asks for more, and never for more than the file.
    let mut len = 0usize;
    let mut asks = 0;
    loop {
        match parse(&bytes[..len], n) {
            Ok(p) => {
                assert_eq!(p.gguf, g);
                break;
            }
            Err(GgufError::Incomplete(need)) => {
                assert!(need as usize > len && need <= n, "{len} → {need}");
                len = need as usize;
                asks += 1;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(asks > 3);
    assert!(len <= write_unpadded(&g).len());
}

#[test]
fn every_truncation_is_refused_without_panicking() {
    let bytes = file(&sample(), 200, 1);
    let data_start = whole(&bytes).unwrap().layout.data_start as usize;
    for cut in 0..bytes.len() {
        let m = refused(&bytes[..cut]);
        if cut < data_start - 4 {
            let said = ["past the end", "fit", "can hold"];
            assert!(said.iter().any(|s| m.contains(s)), "{cut}: {m}");
        }
    }
}

#[test]
fn the_magic_and_version_are_checked() {
    let g = sample();
    let m = refused(&edited(&g, |b| b[..4].copy_from_slice(b"PK\x03\x04")));
    assert!(
        m.contains("not a GGUF file") && m.contains("50 4b 03 04"),
        "{m}"
    );
    let m = refused(&edited(&g, |b| {
        b[4..8].copy_from_slice(&1u32.to_le_bytes())
    }));
    assert!(m.contains("version 1"), "{m}");
    let m = refused(&edited(&g, |b| {
        b[4..8].copy_from_slice(&3u32.to_be_bytes())
    }));
    assert!(m.contains("big-endian"), "{m}");
    let m = refused(&edited(&g, |b| {
        b[4..8].copy_from_slice(&4u32.to_le_bytes())
    }));
    assert!(m.contains("version 4"), "{m}");
    let v2 = Gguf {
        version: 2,
        ..g.clone()
    };
    assert_eq!(whole(&file(&v2, 200, 0)).unwrap().gguf, v2);
    assert!(refused(b"GGU").contains("past the end"));
}

#[test]
fn huge_counts_and_lengths_are_refused_before_anything_is_reserved() {
    let g = sample();
    let m = refused(&edited(&g, |b| {
        b[8..16].copy_from_slice(&u64::MAX.to_le_bytes())
    }));
    assert!(m.contains("claims") && m.contains("tensors"), "{m}");
    let m = refused(&edited(&g, |b| {
        b[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes())
    }));
    assert!(m.contains("claims 1099511627776 keys"), "{m}");
    // A key's length past the file.
    let m = refused(&edited(&g, |b| {
        b[24..32].copy_from_slice(&(u64::MAX - 3).to_le_bytes())
    }));
    assert!(m.contains("key #0") && m.contains("past the end"), "{m}");
    // An array's count past the file: the tokens array's count follows its type (8, string).
    let m = refused(&edited(&g, |b| {
        let at = find(b, b"tokenizer.ggml.tokens") + 21 + 4 + 4;
        b[at..at + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
    }));
    assert!(
        m.contains("\"tokenizer.ggml.tokens\"") && m.contains("cannot fit"),
        "{m}"
    );
    // A hostile count in a big file is refused by the file's length, not by reading on.
    let mut big = file(&g, 256, 0);
    big[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    match parse(&big[..64], 1 << 40) {
        Err(GgufError::Incomplete(_)) | Err(GgufError::Format(_)) => {}
        Ok(p) => panic!("{p:?}"),
    }
}

#[test]
fn values_are_checked_naming_the_key() {
    let g = sample();
    let m = refused(&edited(&g, |b| {
        let at = find(b, b"general.file_type") + 17;
        b[at..at + 4].copy_from_slice(&13u32.to_le_bytes());
    }));
    assert!(
        m.contains("\"general.file_type\"") && m.contains("value type 13"),
        "{m}"
    );
    let m = refused(&edited(&g, |b| {
        let at = find(b, b"x.flag") + 6 + 4;
        b[at] = 2;
    }));
    assert!(m.contains("\"x.flag\"") && m.contains("byte 2"), "{m}");
    let m = refused(&edited(&g, |b| {
        let at = find(b, b"llama");
        b[at] = 0xff;
    }));
    assert!(
        m.contains("\"general.architecture\"") && m.contains("not UTF-8"),
        "{m}"
    );
    let m = refused(&edited(&g, |b| {
        let at = find(b, b"x.flag");
        b[at + 1] = 0xc3;
    }));
    assert!(m.contains("key #4") && m.contains("not UTF-8"), "{m}");
    let m = refused(&edited(&g, |b| {
        let at = find(b, "é".as_bytes());
        b[at + 1] = 0x41;
    }));
    assert!(
        m.contains("tokenizer.ggml.tokens") && m.contains("element 1"),
        "{m}"
    );
}

#[test]
fn repeated_keys_and_names_are_refused() {
    let mut g = sample();
    g.kv.push(("x.flag".into(), KvValue::Bool(false)));
    assert!(refused(&file(&g, 256, 0)).contains("key \"x.flag\" appears twice"));
    let mut g = sample();
    g.tensors[2].name = "a".into();
    assert!(refused(&file(&g, 256, 0)).contains("tensor \"a\": the name appears twice"));
    let mut g = sample();
    g.tensors[2].name = "a\nb".into();
    assert!(refused(&file(&g, 256, 0)).contains("control"));
    let mut g = sample();
    g.tensors[2].name = String::new();
    assert!(refused(&file(&g, 256, 0)).contains("empty name"));
}

#[test]
fn arrays_nest_to_a_limit() {
    let mut deep = KvArray::U8(vec![1]);
    for _ in 1..MAX_ARRAY_DEPTH {
        deep = KvArray::Array(vec![deep]);
    }
    let mut g = sample();
    g.kv.push(("deep".into(), KvValue::Array(deep.clone())));
    assert_eq!(whole(&file(&g, 200, 0)).unwrap().gguf, g);
    let mut g = sample();
    g.kv.push(("deep".into(), KvValue::Array(KvArray::Array(vec![deep]))));
    // The writer writes it; the reader refuses it while reading, and layout() too.
    let bytes = file(&g, 200, 0);
    let m = refused(&bytes);
    assert!(m.contains("\"deep\"") && m.contains("nested deeper"), "{m}");
    assert!(layout(&g, bytes.len() as u64).is_err());
}

#[test]
fn tensor_infos_are_checked_naming_the_tensor() {
    let g = sample();
    let mut t = g.clone();
    t.tensors[1].ggml_type = 4;
    let bytes = {
        let mut b = write(&t).unwrap();
        b.resize(b.len() + 256, 0);
        b
    };
    let m = refused(&bytes);
    assert!(
        m.contains("tensor \"b.weight\"") && m.contains("ggml type 4 is not one"),
        "{m}"
    );
    let mut t = g.clone();
    t.tensors[0].ne = vec![1; 9];
    let m = refused(&edited(&t, |_| {}));
    assert!(
        m.contains("tensor \"a\"") && m.contains("9 dimensions"),
        "{m}"
    );
    let mut t = g.clone();
    t.tensors[1].ne = vec![48, 2];
    let m = refused(&edited(&t, |_| {}));
    assert!(
        m.contains("\"b.weight\"") && m.contains("ne[0] = 48") && m.contains("block size 32"),
        "{m}"
    );
    let mut t = g.clone();
    t.tensors[0].ne = vec![1 << 32, 1 << 32];
    let m = refused(&edited(&t, |_| {}));
    assert!(m.contains("\"a\"") && m.contains("2^63"), "{m}");
    let mut t = g.clone();
    t.tensors[0].ne = vec![u64::MAX];
    assert!(refused(&edited(&t, |_| {})).contains("extent"));
}

#[test]
fn offsets_are_aligned_within_the_file_and_do_not_overlap() {
    let g = sample();
    let mut t = g.clone();
    t.tensors[2].offset = 200;
    let m = refused(&edited(&t, |_| {}));
    assert!(
        m.contains("\"c\"") && m.contains("offset 200 is not a multiple of the alignment 32"),
        "{m}"
    );
    let mut t = g.clone();
    t.tensors[2].offset = 160;
    let m = refused(&edited(&t, |_| {}));
    assert!(
        m.contains("\"c\"") && m.contains("overlaps tensor \"b.weight\""),
        "{m}"
    );
    // Past the end: the data holds 200 bytes, "c" needs 192 + 8.
    let bytes = file(&g, 200, 0);
    assert!(whole(&bytes).is_ok());
    let m = refused(&bytes[..bytes.len() - 1]);
    assert!(m.contains("\"c\"") && m.contains("past the end"), "{m}");
    let mut t = g.clone();
    t.tensors[2].offset = u64::MAX - 31;
    let m = refused(&edited(&t, |_| {}));
    assert!(m.contains("\"c\"") && m.contains("past the end"), "{m}");
    // Any order, gaps, and zero-length tensors anywhere are laid out by offset.
    let mut t = g.clone();
    t.tensors[0].offset = 320;
    t.tensors.push(info("z", &[0, 4], 12, 64));
    let parsed = whole(&file(&t, 400, 0)).unwrap();
    assert_eq!(parsed.layout.order, [1, 3, 2, 0]);
    assert_eq!(parsed.layout.lengths[3], 0);
}

#[test]
fn the_alignment_is_a_u32_power_of_two() {
    let mut g = sample();
    g.kv.push((ALIGNMENT_KEY.into(), KvValue::U32(64)));
    for t in &mut g.tensors {
        t.offset *= 2;
    }
    let bytes = file(&g, 400, 3);
    let parsed = whole(&bytes).unwrap();
    assert_eq!(parsed.layout.alignment, 64);
    assert_eq!(parsed.layout.data_start % 64, 0);
    for bad in [KvValue::U32(48), KvValue::U32(0), KvValue::U64(64)] {
        let mut t = sample();
        t.kv.push((ALIGNMENT_KEY.into(), bad));
        let mut bytes = write_unpadded(&t);
        bytes.resize(bytes.len() + 512, 0);
        let m = refused(&bytes);
        assert!(m.contains("general.alignment"), "{m}");
        assert!(write(&t).is_err());
    }
    let mut one = sample();
    one.kv.push((ALIGNMENT_KEY.into(), KvValue::U32(1)));
    one.tensors[2].offset = 32 + 136;
    assert_eq!(whole(&file(&one, 200, 0)).unwrap().gguf, one);
}

#[test]
fn a_file_without_tensors_may_end_at_its_header() {
    let g = Gguf {
        version: 3,
        kv: vec![("k".into(), KvValue::U8(1))],
        tensors: vec![],
    };
    let unpadded = write_unpadded(&g);
    let p = whole(&unpadded).unwrap();
    assert_eq!(p.layout.content_end, unpadded.len() as u64);
    assert!(p.layout.data_start > unpadded.len() as u64);
    assert_eq!(whole(&write(&g).unwrap()).unwrap().gguf, g);
}

// ---- Property: parse(write(x)) == x ------------------------------------------------------

fn key() -> impl Strategy<Value = String> {
    "[a-z.é_]{0,12}"
}

fn array(depth: u32) -> BoxedStrategy<KvArray> {
    let leaf = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..5).prop_map(KvArray::U8),
        prop::collection::vec(any::<i8>(), 0..5).prop_map(KvArray::I8),
        prop::collection::vec(any::<u16>(), 0..5).prop_map(KvArray::U16),
        prop::collection::vec(any::<i16>(), 0..5).prop_map(KvArray::I16),
        prop::collection::vec(any::<u32>(), 0..5).prop_map(KvArray::U32),
        prop::collection::vec(any::<i32>(), 0..5).prop_map(KvArray::I32),
        prop::collection::vec(any::<u32>(), 0..5).prop_map(KvArray::F32),
        prop::collection::vec(any::<bool>(), 0..5).prop_map(KvArray::Bool),
        prop::collection::vec(key(), 0..5).prop_map(KvArray::String),
        prop::collection::vec(any::<u64>(), 0..5).prop_map(KvArray::U64),
        prop::collection::vec(any::<i64>(), 0..5).prop_map(KvArray::I64),
        prop::collection::vec(any::<u64>(), 0..5).prop_map(KvArray::F64),
    ];
    if depth == 0 {
        leaf.boxed()
    } else {
        prop_oneof![
            4 => leaf,
            1 => prop::collection::vec(array(depth - 1), 0..3).prop_map(KvArray::Array),
        ]
        .boxed()
    }
}

fn value() -> impl Strategy<Value = KvValue> {
    prop_oneof![
        any::<u8>().prop_map(KvValue::U8),
        any::<i8>().prop_map(KvValue::I8),
        any::<u16>().prop_map(KvValue::U16),
        any::<i16>().prop_map(KvValue::I16),
        any::<u32>().prop_map(KvValue::U32),
        any::<i32>().prop_map(KvValue::I32),
        any::<u32>().prop_map(KvValue::F32),
        any::<bool>().prop_map(KvValue::Bool),
        key().prop_map(KvValue::String),
        array(2).prop_map(KvValue::Array),
        any::<u64>().prop_map(KvValue::U64),
        any::<i64>().prop_map(KvValue::I64),
        any::<u64>().prop_map(KvValue::F64),
    ]
}

/// A header with unique keys, an alignment, and tensors of any type laid out ggml's way (or in
/// reverse order), with the data length that holds them.
fn header() -> impl Strategy<Value = (Gguf, u64)> {
    let tensor = (
        0..GGML_TYPES.len(),
        prop::collection::vec(0u64..4, 0..4),
        1u64..3,
    );
    (
        prop::sample::select(vec![2u32, 3]),
        prop::collection::vec((key(), value()), 0..6),
        prop::option::of(prop::sample::select(vec![1u32, 8, 32, 64, 4096])),
        prop::collection::vec(tensor, 0..6),
        any::<bool>(),
    )
        .prop_map(|(version, kv, alignment, tensors, reverse)| {
            let mut seen = std::collections::HashSet::new();
            let mut kv: Vec<(String, KvValue)> = kv
                .into_iter()
                .filter(|(k, _)| k != ALIGNMENT_KEY && seen.insert(k.clone()))
                .collect();
            if let Some(a) = alignment {
                kv.push((ALIGNMENT_KEY.into(), KvValue::U32(a)));
            }
            let align = u64::from(alignment.unwrap_or(32));
            let mut infos: Vec<TensorInfo> = tensors
                .into_iter()
                .enumerate()
                .map(|(i, (t, rest, blocks))| {
                    let kind = GGML_TYPES[t];
                    let mut ne = vec![blocks * kind.block];
                    ne.extend(rest);
                    info(&format!("t{i}.weight"), &ne, kind.id, 0)
                })
                .collect();
            let order: Vec<usize> = if reverse {
                (0..infos.len()).rev().collect()
            } else {
                (0..infos.len()).collect()
            };
            let mut at = 0;
            for i in order {
                infos[i].offset = at;
                at = (at + infos[i].nbytes().unwrap()).next_multiple_of(align);
            }
            let g = Gguf {
                version,
                kv,
                tensors: infos,
            };
            (g, at)
        })
}

proptest! {
    #[test]
    fn parse_of_write_is_the_header((g, data_len) in header()) {
        let bytes = file(&g, data_len, 0xa5);
        let parsed = whole(&bytes).unwrap();
        prop_assert_eq!(&parsed.gguf, &g);
        prop_assert_eq!(write(&parsed.gguf).unwrap(), &bytes[..parsed.layout.data_start as usize]);
        prop_assert_eq!(parsed.layout.header_len, header_len(&g));
        prop_assert_eq!(layout(&g, bytes.len() as u64).unwrap(), parsed.layout);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = whole(&bytes);
        let mut framed = b"GGUF\x03\0\0\0".to_vec();
        framed.extend_from_slice(&bytes);
        let _ = whole(&framed);
    }

    #[test]
    fn a_flipped_byte_is_refused_or_reads_back_exactly(at in 0usize..400, bit in 0u8..8) {
        let g = sample();
        let mut bytes = file(&g, 200, 0);
        let at = at % bytes.len();
        bytes[at] ^= 1 << bit;
        if let Ok(p) = whole(&bytes) {
            let header = write(&p.gguf).unwrap();
            prop_assert_eq!(&header[..p.layout.header_len as usize],
                &bytes[..p.layout.header_len as usize]);
        }
    }
}
