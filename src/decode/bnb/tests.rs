//! Tests of the bitsandbytes schemes: hand-computed vectors, the tables against Appendix A,
//! and refusals at their limits.

use super::*;
use crate::decode::testing::{f32_bytes, le_u32s, Case, Stored};
use crate::format::{Config, Sha256, Value};

fn params(block: u64, double_quant: bool) -> Config {
    [
        ("block_size".to_string(), Value::Uint(block)),
        ("double_quant".to_string(), Value::Bool(double_quant)),
    ]
    .into_iter()
    .collect()
}

/// Decodes to F32 bits, or the refusal.
fn run(
    scheme: &'static str,
    p: &Config,
    shape: &[u64],
    parts: &[Stored],
) -> DecodeResult<Vec<u32>> {
    let bytes = Case::of(scheme, p, shape, parts).try_bytes(Dtype::F32)?;
    Ok(le_u32s(&bytes))
}

fn bits(vs: &[f32]) -> Vec<u32> {
    vs.iter().map(|v| v.to_bits()).collect()
}

/// Codes packed two to a byte, the first high: `U8 [⌈n/2⌉, 1]`.
fn nibbles(codes: &[u8]) -> Stored {
    let bytes: Vec<u8> = codes
        .chunks(2)
        .map(|p| p[0] << 4 | p.get(1).copied().unwrap_or(0))
        .collect();
    ("weight", Dtype::U8, vec![bytes.len() as u64, 1], bytes)
}

/// The map bnb stores: FP4's code 8 as +0.
fn stored_map(table: &[f32; 16]) -> Stored {
    let map: Vec<f32> = table
        .iter()
        .map(|&v| if v == 0.0 { 0.0 } else { v })
        .collect();
    ("quant_map", Dtype::F32, vec![16], f32_bytes(&map))
}

fn plain(codes: &[u8], absmax: &[f32], table: &[f32; 16]) -> Vec<Stored> {
    vec![
        nibbles(codes),
        stored_map(table),
        (
            "absmax",
            Dtype::F32,
            vec![absmax.len() as u64],
            f32_bytes(absmax),
        ),
    ]
}

#[test]
fn the_tables_are_appendix_a_by_their_sha256() {
    let hex = |t: &[f32; 16]| Sha256::of(&f32_bytes(t)).to_string();
    assert_eq!(
        hex(&NF4),
        "8501941daa1b8a90ad1bbfeb632e5101b5dddbc4bb52d6e55abcfd777e60c06a"
    );
    assert_eq!(
        hex(&FP4),
        "39af60562e49a4f14fa01b864d62e6cbf0693a3ecf51e7861fc54259abb16237"
    );
}

#[test]
fn nf4_decodes_a_hand_computed_tensor() {
    let codes = [0, 15, 7, 8, 1, 14];
    let got = run(
        "bnb.nf4",
        &params(32, false),
        &[2, 3],
        &plain(&codes, &[2.0], &NF4),
    );
    let want: Vec<f32> = codes.iter().map(|&q| NF4[q as usize] * 2.0).collect();
    assert_eq!(got.unwrap(), bits(&want));
}

#[test]
fn fp4_code_8_decodes_to_minus_zero_though_the_stored_map_holds_plus_zero() {
    let got = run(
        "bnb.fp4",
        &params(32, false),
        &[3],
        &plain(&[8, 0, 11], &[3.0], &FP4),
    );
    assert_eq!(got.unwrap(), [0x8000_0000, 0, (-3.0f32).to_bits()]);
}

#[test]
fn the_flattened_codes_cross_rows_and_blocks() {
    // [5, 13]: 65 elements in blocks of 32 (three), an odd count leaving the last low nibble.
    let codes: Vec<u8> = (0..65).map(|t| (t % 16) as u8).collect();
    let absmax = [1.0, 2.0, 4.0];
    let parts = plain(&codes, &absmax, &NF4);
    assert_eq!(parts[0].2, [33, 1]);
    let got = run("bnb.nf4", &params(32, false), &[5, 13], &parts).unwrap();
    let want: Vec<f32> = (0..65).map(|t| NF4[t % 16] * absmax[t / 32]).collect();
    assert_eq!(got, bits(&want));
}

fn nested(codes: &[u8], absmax: &[u8], nested_absmax: &[f32], offset: f32) -> Vec<Stored> {
    let map: Vec<f32> = (0..256).map(|i| i as f32 / 256.0).collect();
    vec![
        nibbles(codes),
        stored_map(&NF4),
        (
            "absmax",
            Dtype::U8,
            vec![absmax.len() as u64],
            absmax.to_vec(),
        ),
        (
            "nested_absmax",
            Dtype::F32,
            vec![nested_absmax.len() as u64],
            f32_bytes(nested_absmax),
        ),
        ("nested_quant_map", Dtype::F32, vec![256], f32_bytes(&map)),
        ("nested_offset", Dtype::F32, vec![1], f32_bytes(&[offset])),
    ]
}

#[test]
fn double_quant_scales_are_nested_codes_times_their_absmax_plus_the_offset() {
    // 257 blocks of 32: block 256 takes nested_absmax[1].
    let n = 257 * 32;
    let codes = vec![15u8; n];
    let absmax: Vec<u8> = (0..257).map(|b| (b % 256) as u8).collect();
    let parts = nested(&codes, &absmax, &[2.0, 8.0], 0.5);
    let got = run("bnb.nf4", &params(32, true), &[n as u64], &parts).unwrap();
    let s = |b: usize| ((absmax[b] as f32 / 256.0) * [2.0, 8.0][b / 256]) + 0.5;
    for b in [0, 3, 255, 256] {
        assert_eq!(got[b * 32], s(b).to_bits(), "block {b}");
    }
    assert_eq!(s(256), 0.5, "code 0 of nested block 1");
}

#[test]
fn quant_map_must_equal_the_table_as_numbers() {
    let p = params(32, false);
    let run_map = |table: &[f32; 16], map: &[f32]| {
        let mut parts = plain(&[1, 2], &[1.0], table);
        parts[1].3 = f32_bytes(map);
        run(
            if table == &NF4 { "bnb.nf4" } else { "bnb.fp4" },
            &p,
            &[2],
            &parts,
        )
    };
    assert!(
        run_map(&FP4, &FP4).is_ok(),
        "−0 at code 8 is +0 as a number"
    );
    let mut signed = NF4;
    signed[7] = -0.0;
    assert!(run_map(&NF4, &signed).is_ok());
    let mut ulp = NF4;
    ulp[15] = f32::from_bits(1.0f32.to_bits() - 1);
    let err = run_map(&NF4, &ulp).unwrap_err();
    assert!(matches!(err, DecodeError::Refused { .. }), "{err}");
    assert!(err.to_string().contains("quant_map[15]"), "{err}");
    let mut nan = FP4;
    nan[0] = f32::NAN;
    assert!(run_map(&FP4, &nan).is_err());
    assert!(run_map(&FP4, &NF4).is_err(), "the other scheme's table");
}

#[test]
fn block_size_is_one_of_the_listed_powers_of_two() {
    let parts = plain(&[1, 2], &[1.0], &NF4);
    for (block, ok) in [
        (16, false),
        (32, true),
        (33, false),
        (4096, true),
        (8192, false),
    ] {
        let got = run("bnb.nf4", &params(block, false), &[2], &parts);
        assert_eq!(got.is_ok(), ok, "block_size {block}: {got:?}");
    }
}

#[test]
fn absmax_is_u8_codes_exactly_when_double_quant() {
    let codes = [1u8, 2];
    let dq = nested(&codes, &[7], &[1.0], 0.0);
    assert!(run("bnb.nf4", &params(32, true), &[2], &dq).is_ok());
    let mut f32_absmax = dq.clone();
    f32_absmax[2] = ("absmax", Dtype::F32, vec![1], f32_bytes(&[1.0]));
    let err = run("bnb.nf4", &params(32, true), &[2], &f32_absmax).unwrap_err();
    assert!(err.to_string().contains("absmax"), "{err}");
    let mut u8_absmax = plain(&codes, &[1.0], &NF4);
    u8_absmax[2] = ("absmax", Dtype::U8, vec![1], vec![7]);
    assert!(run("bnb.nf4", &params(32, false), &[2], &u8_absmax).is_err());
}

#[test]
fn nested_parts_come_exactly_with_double_quant() {
    let dq = nested(&[1, 2], &[7], &[1.0], 0.0);
    for role in NESTED {
        let without: Vec<Stored> = dq.iter().filter(|p| p.0 != role).cloned().collect();
        let err = run("bnb.nf4", &params(32, true), &[2], &without).unwrap_err();
        assert!(matches!(err, DecodeError::MissingPart { .. }), "{err}");
        let mut extra = plain(&[1, 2], &[1.0], &NF4);
        extra.push(dq.iter().find(|p| p.0 == role).unwrap().clone());
        let err = run("bnb.nf4", &params(32, false), &[2], &extra).unwrap_err();
        assert!(err.to_string().contains(role), "{err}");
    }
    let mut scalar_offset = dq.clone();
    scalar_offset[5].2 = vec![];
    assert!(run("bnb.nf4", &params(32, true), &[2], &scalar_offset).is_ok());
}

#[test]
fn the_weight_is_half_a_byte_per_element_in_one_column() {
    let mut parts = plain(&[1, 2, 3], &[1.0], &NF4);
    assert!(run("bnb.nf4", &params(32, false), &[3], &parts).is_ok());
    parts[0].2 = vec![2];
    assert!(run("bnb.nf4", &params(32, false), &[3], &parts).is_err());
    parts[0].2 = vec![1, 2];
    assert!(run("bnb.nf4", &params(32, false), &[3], &parts).is_err());
}

fn int8(weight: &[i8], shape: &[u64], scb: &[f32]) -> Vec<Stored> {
    vec![
        (
            "weight",
            Dtype::I8,
            shape.to_vec(),
            weight.iter().map(|&w| w as u8).collect(),
        ),
        ("SCB", Dtype::F32, vec![scb.len() as u64], f32_bytes(scb)),
    ]
}

#[test]
fn int8_multiplies_by_the_f32_nearest_one_over_127() {
    assert_eq!(R127.to_bits(), 0x3C01_0204);
    let got = run(
        "bnb.int8",
        &Config::new(),
        &[2, 2],
        &int8(&[9, 127, -1, 0], &[2, 2], &[1.0, 127.0]),
    );
    // (9 × 1) × r is 0x3D912244, where 9 / 127 would be 0x3D912245.
    assert_eq!(
        got.unwrap(),
        [
            0x3D91_2244,
            (127.0 * R127).to_bits(),
            (-127.0 * R127).to_bits(),
            0
        ]
    );
}

#[test]
fn int8_weight_format_must_be_zero() {
    let mut parts = int8(&[1, 2], &[1, 2], &[1.0]);
    parts.push(("weight_format", Dtype::U8, vec![1], vec![0]));
    assert!(run("bnb.int8", &Config::new(), &[1, 2], &parts).is_ok());
    for format in [1, 255] {
        parts[2].3 = vec![format];
        let err = run("bnb.int8", &Config::new(), &[1, 2], &parts).unwrap_err();
        assert!(matches!(err, DecodeError::Refused { .. }), "{err}");
    }
}

#[test]
fn int8_is_rank_two_only() {
    let p = Config::new();
    assert!(run(
        "bnb.int8",
        &p,
        &[1, 1, 2],
        &int8(&[1, 2], &[1, 1, 2], &[1.0])
    )
    .is_err());
    assert!(run("bnb.int8", &p, &[2], &int8(&[1, 2], &[2], &[1.0])).is_err());
    let mut column = int8(&[1, 2], &[2, 1], &[1.0, 2.0]);
    column[1].2 = vec![2, 1];
    assert!(
        run("bnb.int8", &p, &[2, 1], &column).is_ok(),
        "SCB: R elements, any shape"
    );
}
