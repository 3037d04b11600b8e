//! Tests of the grouped schemes: hand-computed vectors, refusals at their limits, and the
//! hot-loop unpacking against the packing building block.

use super::*;
use crate::decode::prepare;
use crate::decode::testing::{f16_bytes, f32_bytes, int, params, text, words, Case, Stored};
use crate::format::{Config, Value};

/// `codes` packed low first into 32-bit words: one dense stream, or `⌊32/b⌋` to a word.
fn pack(codes: &[u32], bits: u32, fill: Fill) -> Vec<u32> {
    let p = Packing {
        bits,
        word_bits: 32,
        fill,
        order: Order::LowFirst,
    };
    let mut out = vec![0u32; p.words(codes.len() as u64) as usize];
    for (t, &c) in codes.iter().enumerate() {
        let bit = match fill {
            Fill::Dense => t * bits as usize,
            _ => (t / p.per_word() as usize) * 32 + (t % p.per_word() as usize) * bits as usize,
        };
        out[bit / 32] |= ((c as u64) << (bit % 32)) as u32;
        if bit % 32 + bits as usize > 32 {
            out[bit / 32 + 1] |= c >> (32 - bit % 32);
        }
    }
    out
}

/// Decodes to F32, or the refusal.
fn run(
    scheme: &'static str,
    p: &Config,
    shape: &[u64],
    parts: &[Stored],
) -> DecodeResult<Vec<f32>> {
    Case::of(scheme, p, shape, parts).try_f32s()
}

fn replace(parts: &[Stored], role: &str, bytes: Vec<u8>) -> Vec<Stored> {
    let mut parts = parts.to_vec();
    parts.iter_mut().find(|p| p.0 == role).unwrap().3 = bytes;
    parts
}

fn gptq_params(group: i64, symmetric: bool, act_order: bool, offset: i64) -> Config {
    params(&[
        ("group_size", int(group)),
        ("symmetric", Value::Bool(symmetric)),
        ("act_order", Value::Bool(act_order)),
        ("zero_offset", int(offset)),
    ])
}

/// `[2, 8]`, g = 4: row 0 codes 0..8, row 1 codes 15..8; v1 zeros stored (7, 15) and
/// (3, 0); scales `[[0.5, 2], [1, −1]]`.
fn gptq4() -> Vec<Stored> {
    vec![
        (
            "qweight",
            Dtype::I32,
            vec![1, 2],
            words(&[0x7654_3210, 0x89AB_CDEF]),
        ),
        ("qzeros", Dtype::I32, vec![2, 1], words(&[0xF7, 0x03])),
        (
            "scales",
            Dtype::F16,
            vec![2, 2],
            f16_bytes(&[0.5, 2.0, 1.0, -1.0]),
        ),
        (
            "g_idx",
            Dtype::I32,
            vec![8],
            words(&[0, 0, 0, 0, 1, 1, 1, 1]),
        ),
    ]
}

#[test]
fn gptq_int4_decodes_a_hand_computed_v1_tensor() {
    let got = run(
        "gptq.int4",
        &gptq_params(4, false, false, 1),
        &[2, 8],
        &gptq4(),
    );
    #[rustfmt::skip]
    let want = [-4.0, -3.5, -3.0, -2.5, 0.0, 1.0, 2.0, 3.0,
                30.0, 28.0, 26.0, 24.0, -10.0, -9.0, -8.0, -7.0];
    assert_eq!(got.unwrap(), want);
}

#[test]
fn gptq_v1_borrow_decodes_the_slot_after_a_zero_of_zero_one_low() {
    // True zeros (0, 5) pack as 0x50; a v1 export subtracts 0x11 in one 32-bit subtraction,
    // giving 0x3F: slot 0 reads 15 + 1 = 0 (mod 16), slot 1 reads 3 + 1 = 4, one low.
    let parts = vec![
        (
            "qweight",
            Dtype::I32,
            vec![1, 2],
            words(&[0x7654_3210, 0x89AB_CDEF]),
        ),
        ("qzeros", Dtype::I32, vec![1, 1], words(&[0x3F])),
        ("scales", Dtype::F16, vec![1, 2], f16_bytes(&[1.0, 1.0])),
        ("g_idx", Dtype::I32, vec![8], words(&[0; 8])),
    ];
    let got = run(
        "gptq.int4",
        &gptq_params(-1, false, false, 1),
        &[2, 8],
        &parts,
    )
    .unwrap();
    assert_eq!(got[0], 0.0, "row 0: code 0, zero 0");
    assert_eq!(
        got[8],
        15.0 - 4.0,
        "row 1: code 15, its zero 5 read one low"
    );
}

#[test]
fn gptq_int3_codes_cross_words() {
    // K = 32 three-bit codes take three words; code 10 is bits 30–32.
    let codes: Vec<u32> = (0..32).map(|j| (j * 5 + 1) % 8).collect();
    let parts = vec![
        (
            "qweight",
            Dtype::I32,
            vec![3, 1],
            words(&pack(&codes, 3, Fill::Dense)),
        ),
        ("qzeros", Dtype::I32, vec![1, 1], words(&[2])),
        (
            "scales",
            Dtype::BF16,
            vec![1, 1],
            0x4000u16.to_le_bytes().to_vec(),
        ),
        ("g_idx", Dtype::I32, vec![32], words(&[0; 32])),
    ];
    let got = run(
        "gptq.int3",
        &gptq_params(-1, false, false, 0),
        &[1, 32],
        &parts,
    );
    let want: Vec<f32> = codes.iter().map(|&q| (q as f32 - 2.0) * 2.0).collect();
    assert_eq!(got.unwrap(), want);
}

#[test]
fn gptq_act_order_takes_each_columns_group_from_g_idx() {
    let parts = replace(&gptq4(), "g_idx", words(&[1, 0, 1, 0, 1, 0, 1, 0]));
    let got = run(
        "gptq.int4",
        &gptq_params(4, false, true, 1),
        &[2, 8],
        &parts,
    )
    .unwrap();
    // Row 0: even columns use group 1 (zero 4, scale 1), odd ones group 0 (8, 0.5).
    assert_eq!(&got[..4], &[-4.0, -3.5, -2.0, -2.5]);
}

#[test]
fn gptq_act_order_false_refuses_a_g_idx_other_than_j_over_g() {
    let p = gptq_params(4, false, false, 1);
    assert!(run("gptq.int4", &p, &[2, 8], &gptq4()).is_ok());
    let shifted = replace(&gptq4(), "g_idx", words(&[0, 0, 0, 1, 1, 1, 1, 1]));
    let err = run("gptq.int4", &p, &[2, 8], &shifted).unwrap_err();
    assert!(matches!(err, DecodeError::Refused { .. }), "{err}");
    assert!(err.to_string().contains("g_idx[3]"), "{err}");
}

#[test]
fn gptq_act_order_true_accepts_groups_below_w_only() {
    let p = gptq_params(4, false, true, 1);
    let last = replace(&gptq4(), "g_idx", words(&[1; 8]));
    assert!(run("gptq.int4", &p, &[2, 8], &last).is_ok());
    for bad in [2u32, u32::MAX] {
        let parts = replace(&gptq4(), "g_idx", words(&[0, 0, 0, 0, 0, 0, 0, bad]));
        let err = run("gptq.int4", &p, &[2, 8], &parts).unwrap_err();
        assert!(matches!(err, DecodeError::Refused { .. }), "{err}");
    }
}

#[test]
fn gptq_symmetric_requires_every_zero_to_be_half_the_range() {
    let p = gptq_params(4, true, false, 1);
    // v1 stores 8 − 1 = 7 in every slot; 6 or 8 is refused.
    let good = replace(&gptq4(), "qzeros", words(&[0x77, 0x77]));
    assert!(run("gptq.int4", &p, &[2, 8], &good).is_ok());
    for word in [0x76, 0x87] {
        let parts = replace(&gptq4(), "qzeros", words(&[0x77, word]));
        let err = run("gptq.int4", &p, &[2, 8], &parts).unwrap_err();
        assert!(err.to_string().contains("symmetric"), "{err}");
    }
    let v2 = gptq_params(4, true, false, 0);
    let good = replace(&gptq4(), "qzeros", words(&[0x88, 0x88]));
    assert!(run("gptq.int4", &v2, &[2, 8], &good).is_ok());
}

#[test]
fn gptq_params_are_checked_at_their_limits() {
    let ok = |p: Config| run("gptq.int4", &p, &[2, 8], &gptq4()).is_ok();
    assert!(!ok(gptq_params(0, false, false, 1)));
    assert!(!ok(gptq_params(-2, false, false, 1)));
    assert!(!ok(gptq_params(4, false, false, 2)));
    assert!(!ok(gptq_params(4, false, false, -1)));
    assert!(ok(gptq_params(4, false, false, 0)));
    let mut extra = gptq_params(4, false, false, 1);
    extra.insert("bits".into(), int(4));
    assert!(!ok(extra));
    let mut missing = gptq_params(4, false, false, 1);
    missing.remove("act_order");
    assert!(!ok(missing));
}

#[test]
fn gptq_group_size_minus_one_is_one_group_per_row() {
    let mut parts = gptq4();
    parts[1] = ("qzeros", Dtype::I32, vec![1, 1], words(&[0x88]));
    parts[2] = ("scales", Dtype::F16, vec![1, 2], f16_bytes(&[1.0, 1.0]));
    parts[3] = ("g_idx", Dtype::I32, vec![8], words(&[0; 8]));
    let got = run(
        "gptq.int4",
        &gptq_params(-1, false, false, 0),
        &[2, 8],
        &parts,
    );
    assert_eq!(got.unwrap()[..3], [-8.0, -7.0, -6.0]);
    let got = run(
        "gptq.int4",
        &gptq_params(8, false, false, 0),
        &[2, 8],
        &parts,
    );
    assert!(got.is_ok(), "g = K is the same grid");
}

#[test]
fn gptq_parts_need_their_exact_dtypes_and_shapes() {
    let p = gptq_params(4, false, false, 1);
    let mut parts = gptq4();
    parts[0].2 = vec![2, 1];
    assert!(matches!(
        run("gptq.int4", &p, &[2, 8], &parts),
        Err(DecodeError::BadPart { .. })
    ));
    let mut parts = gptq4();
    parts[2].1 = Dtype::F32;
    assert!(run("gptq.int4", &p, &[2, 8], &parts).is_err());
    let err = run("gptq.int4", &p, &[16], &gptq4()).unwrap_err();
    assert!(matches!(err, DecodeError::BadTensor { .. }), "{err}");
    // Rank three: R = 1 × 2 rows, the same parts.
    assert!(run("gptq.int4", &p, &[1, 2, 8], &gptq4()).is_ok());
}

#[test]
fn awq_reads_codes_in_its_slot_order() {
    // N = 8 rows, K = 2: qweight [2, 1]; row n's code at column k is n + 8k.
    let word = |k: u32| (0..8).fold(0u32, |w, s| w | ((AWQ_ORDER[s] as u32 + 8 * k) << (4 * s)));
    let parts = vec![
        (
            "qweight",
            Dtype::I32,
            vec![2, 1],
            words(&[word(0), word(1) & 0x7777_7777]),
        ),
        ("qzeros", Dtype::I32, vec![1, 1], words(&[0x1111_1111])),
        ("scales", Dtype::F16, vec![1, 8], f16_bytes(&[1.0; 8])),
    ];
    let got = run(
        "awq.int4",
        &params(&[("group_size", int(-1))]),
        &[8, 2],
        &parts,
    );
    let want: Vec<f32> = (0..8)
        .flat_map(|n| [n as f32 - 1.0, ((n + 8) & 7) as f32 - 1.0])
        .collect();
    assert_eq!(got.unwrap(), want);
    let got = run(
        "awq.int4",
        &params(&[("group_size", int(0))]),
        &[8, 2],
        &parts,
    );
    assert!(matches!(got, Err(DecodeError::BadParam { .. })));
}

fn ct_params(group: i64, strategy: &str, symmetric: bool, packing: &str) -> Config {
    params(&[
        ("group_size", int(group)),
        ("strategy", text(strategy)),
        ("symmetric", Value::Bool(symmetric)),
        ("packing", text(packing)),
    ])
}

/// `ct.int3` `[2, 12]`, g = 6, `word` packing (ten codes to a word); q stored `q + 4`.
fn ct3(symmetric: bool) -> Vec<Stored> {
    let row = |i: u32| -> Vec<u32> { (0..12).map(|j| (j + i) % 8).collect() };
    let packed: Vec<u32> = [row(0), row(3)]
        .iter()
        .flat_map(|r| pack(r, 3, Fill::Word))
        .collect();
    let mut parts = vec![
        ("weight_packed", Dtype::I32, vec![2, 2], words(&packed)),
        (
            "weight_scale",
            Dtype::F32,
            vec![2, 2],
            f32_bytes(&[1.0, 2.0, 0.5, -1.0]),
        ),
        (
            "weight_shape",
            Dtype::I64,
            vec![2],
            [2i64, 12].iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
    ];
    if !symmetric {
        // Zero points [N = 2, W = 2] packed along N: group 0 (5, 3), group 1 (4, 7).
        let zp = [
            pack(&[5, 3], 3, Fill::Word)[0],
            pack(&[4, 7], 3, Fill::Word)[0],
        ];
        parts.push(("weight_zero_point", Dtype::I32, vec![1, 2], words(&zp)));
    }
    parts
}

#[test]
fn ct_decodes_offset_codes_with_and_without_zero_points() {
    let sym = run(
        "ct.int3",
        &ct_params(6, "group", true, "word"),
        &[2, 12],
        &ct3(true),
    );
    let sym = sym.unwrap();
    assert_eq!(&sym[..7], &[-4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 4.0]);
    assert_eq!(sym[12], (3.0 - 4.0) * 0.5);
    let asym = run(
        "ct.int3",
        &ct_params(6, "group", false, "word"),
        &[2, 12],
        &ct3(false),
    );
    let asym = asym.unwrap();
    assert_eq!(asym[0], (0.0 - 5.0) * 1.0);
    assert_eq!(asym[6], (6.0 - 4.0) * 2.0);
    assert_eq!(asym[12], (3.0 - 3.0) * 0.5);
    assert_eq!(asym[23], 1.0, "row 1, column 11: (6 − 7) × −1");
}

#[test]
fn ct_zero_points_are_present_exactly_when_asymmetric() {
    let p = ct_params(6, "group", true, "word");
    let err = run("ct.int3", &p, &[2, 12], &ct3(false)).unwrap_err();
    assert!(err.to_string().contains("weight_zero_point"), "{err}");
    let p = ct_params(6, "group", false, "word");
    let err = run("ct.int3", &p, &[2, 12], &ct3(true)).unwrap_err();
    assert!(matches!(
        err,
        DecodeError::MissingPart {
            role: "weight_zero_point",
            ..
        }
    ));
}

#[test]
fn ct_channel_strategy_needs_the_whole_row_as_its_group() {
    let mut parts = ct3(true);
    parts[1] = (
        "weight_scale",
        Dtype::F32,
        vec![2, 1],
        f32_bytes(&[1.0, 1.0]),
    );
    assert!(run(
        "ct.int3",
        &ct_params(12, "channel", true, "word"),
        &[2, 12],
        &parts
    )
    .is_ok());
    assert!(run(
        "ct.int3",
        &ct_params(12, "group", true, "word"),
        &[2, 12],
        &parts
    )
    .is_ok());
    let err = run(
        "ct.int3",
        &ct_params(11, "channel", true, "word"),
        &[2, 12],
        &parts,
    );
    assert!(matches!(
        err,
        Err(DecodeError::BadParam {
            param: "group_size",
            ..
        })
    ));
}

#[test]
fn ct_weight_shape_must_state_the_logical_shape() {
    let p = ct_params(6, "group", true, "word");
    let mut i32s = ct3(true);
    i32s[2] = ("weight_shape", Dtype::I32, vec![2], words(&[2, 12]));
    assert!(run("ct.int3", &p, &[2, 12], &i32s).is_ok());
    for stated in [[2i64, 13], [3, 12], [2, -12]] {
        let bytes = stated.iter().flat_map(|v| v.to_le_bytes()).collect();
        let err = run(
            "ct.int3",
            &p,
            &[2, 12],
            &replace(&ct3(true), "weight_shape", bytes),
        );
        assert!(err.unwrap_err().to_string().contains("weight_shape"));
    }
}

#[test]
fn ct_g_idx_groups_must_hold_their_columns() {
    let p = ct_params(6, "group", true, "word");
    let with = |idx: &[i32]| {
        let mut parts = ct3(true);
        let bytes = idx.iter().flat_map(|v| v.to_le_bytes()).collect();
        parts.push(("weight_g_idx", Dtype::I32, vec![12], bytes));
        run("ct.int3", &p, &[2, 12], &parts)
    };
    let plain = run("ct.int3", &p, &[2, 12], &ct3(true)).unwrap();
    let swapped = with(&[1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0]).unwrap();
    assert_eq!(swapped[0], -4.0 * 2.0, "column 0 takes group 1's scale");
    assert_eq!(with(&[0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1]).unwrap(), plain);
    assert_eq!(
        with(&[-1, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7]).unwrap(),
        plain,
        "−1: column order"
    );
    let seven = with(&[0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1]).unwrap_err();
    assert!(matches!(seven, DecodeError::Refused { .. }), "{seven}");
    assert!(
        with(&[0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2]).is_err(),
        "group 2 ≥ W"
    );
}

#[test]
fn ct_zero_points_pack_along_each_matrixs_rows() {
    // [2, 3, 2], int8 dense, g = 2 (W = 1): zero points [2, ⌈3·8/32⌉ = 1, 1].
    let packed: Vec<u32> = (0..6u32).map(|i| (i + 130) | ((i + 131) << 8)).collect();
    let zp = [
        pack(&[128, 129, 130], 8, Fill::Dense)[0],
        pack(&[131, 132, 133], 8, Fill::Dense)[0],
    ];
    let shape: Vec<u8> = [2i32, 3, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
    let parts = vec![
        ("weight_packed", Dtype::I32, vec![2, 3, 1], words(&packed)),
        (
            "weight_scale",
            Dtype::BF16,
            vec![2, 3, 1],
            [0x3F80u16; 6]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        ("weight_zero_point", Dtype::I32, vec![2, 1, 1], words(&zp)),
        ("weight_shape", Dtype::I32, vec![3], shape),
    ];
    let got = run(
        "ct.int8",
        &ct_params(2, "group", false, "dense"),
        &[2, 3, 2],
        &parts,
    );
    // Row i has codes (130 + i, 131 + i) and zero point 128 + i.
    assert_eq!(got.unwrap(), [2.0, 3.0].repeat(6));
}

#[test]
fn lane_unpacking_matches_the_packing_building_block() {
    for bits in 1..=8 {
        for fill in [Fill::Dense, Fill::Word] {
            let p = Packing {
                bits,
                word_bits: 32,
                fill,
                order: Order::LowFirst,
            };
            let n = 77u64;
            let ws: Vec<u32> = (0..p.words(n) as u32)
                .map(|k| k.wrapping_mul(0x9E37_79B9) ^ 0x5A5A_1234)
                .collect();
            let mut got = vec![0u8; n as usize];
            unpack_lane(fill, bits, |k| ws[k], &mut got);
            for t in 0..n {
                let want = p.raw(n, t, |k| ws[k as usize]);
                assert_eq!(
                    got[t as usize] as u32, want,
                    "bits {bits} {fill:?} code {t}"
                );
            }
        }
    }
}

#[test]
fn any_row_range_decodes_as_the_whole_does() {
    let p = gptq_params(4, false, true, 1);
    let parts = replace(&gptq4(), "g_idx", words(&[1, 0, 1, 0, 1, 0, 1, 0]));
    let case = Case::of("gptq.int4", &p, &[2, 8], &parts);
    let whole = case.f32s();
    case.with(Dtype::F32, |tensor| {
        let decoder = prepare(tensor).unwrap();
        let mut row = vec![0u8; 32];
        decoder.rows(1, &mut row).unwrap();
        assert_eq!(row, f32_bytes(&whole[8..]));
    });
}

/// Pseudo-random bytes.
fn noise(n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

#[test]
fn every_row_range_of_every_layout_decodes_as_the_whole_does() {
    // 45 rows: tiles of 32 and a ragged one; AWQ's ranges start inside a word of eight rows.
    let (n, k) = (45u64, 40u64);
    let gptq = vec![
        ("qweight", Dtype::I32, vec![4, n], noise(4 * 45 * 4, 1)),
        ("qzeros", Dtype::I32, vec![5, 5], noise(5 * 5 * 4, 2)),
        ("scales", Dtype::F16, vec![5, n], f16_bytes(&[0.25; 5 * 45])),
        (
            "g_idx",
            Dtype::I32,
            vec![k],
            words(&(0..40).map(|j| (j * 7) % 5).collect::<Vec<_>>()),
        ),
    ];
    let awq = vec![
        ("qweight", Dtype::I32, vec![k, 6], noise(40 * 6 * 4, 3)),
        ("qzeros", Dtype::I32, vec![3, 6], noise(3 * 6 * 4, 4)),
        (
            "scales",
            Dtype::BF16,
            vec![3, n],
            noise(3 * 45 * 2, 5).iter().map(|b| b & 0x3F).collect(),
        ),
    ];
    let ct_shape: Vec<u8> = [45i64, 40].iter().flat_map(|v| v.to_le_bytes()).collect();
    let ct = vec![
        (
            "weight_packed",
            Dtype::I32,
            vec![n, 8],
            noise(45 * 8 * 4, 6),
        ),
        (
            "weight_scale",
            Dtype::F32,
            vec![n, 4],
            f32_bytes(&[1.5; 45 * 4]),
        ),
        (
            "weight_zero_point",
            Dtype::I32,
            vec![9, 4],
            noise(9 * 4 * 4, 7),
        ),
        ("weight_shape", Dtype::I64, vec![2], ct_shape),
    ];
    let cases = [
        ("gptq.int3", gptq_params(8, false, true, 1), gptq),
        ("awq.int4", params(&[("group_size", int(16))]), awq),
        ("ct.int6", ct_params(10, "group", false, "word"), ct),
    ];
    for (scheme, p, parts) in cases {
        let case = Case::of(scheme, &p, &[n, k], &parts);
        let whole = case.bytes(Dtype::F32);
        case.with(Dtype::F32, |tensor| {
            let decoder = prepare(tensor).unwrap();
            let row = k as usize * 4;
            for first in [0usize, 1, 3, 7, 8, 13, 31, 33, 44] {
                for count in [1usize, 2, 9, 32, 33, 45 - first] {
                    let count = count.min(45 - first);
                    let mut out = vec![0u8; count * row];
                    decoder.rows(first as u64, &mut out).unwrap();
                    assert_eq!(
                        out,
                        whole[first * row..(first + count) * row],
                        "{scheme} rows {first}..{}",
                        first + count
                    );
                }
            }
        });
    }
}
