//! Tests of the ConvRot schemes: the rotation against Appendix A.1's matrix, hand-computed
//! vectors, the requantization's rounding and refusals, the correction's column sums, and each
//! param and part refused at its limits from both sides.

use super::*;
use crate::decode::testing::{assert_refused, f32_bytes, int, text, Case};
use crate::decode::DecodeError;

/// `H₄` of spec Appendix A.1.
const H4: [[i32; 4]; 4] = [[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]];

/// `H_B` built as the Kronecker power the spec defines (most significant factor first).
fn h(block: usize) -> Vec<Vec<i32>> {
    let mut m = vec![vec![1]];
    while m.len() < block {
        let n = m.len();
        m = (0..4 * n)
            .map(|r| {
                (0..4 * n)
                    .map(|c| H4[r / n][c / n] * m[r % n][c % n])
                    .collect()
            })
            .collect();
    }
    m
}

#[test]
fn h4_matches_appendix_a1_by_its_digest() {
    use sha2::{Digest, Sha256};
    let bytes: Vec<u8> = H4.iter().flatten().map(|&v| v as i8 as u8).collect();
    assert_eq!(
        hex::encode(Sha256::digest(&bytes)),
        "8f2b2e629d1df5e0be97981cbf4b4d117c320dfec29a7cd72b2f497dcb680cea"
    );
}

#[test]
fn the_fast_rotation_is_the_row_vector_times_the_kronecker_power() {
    for block in [4, 16, 64, 256] {
        let m = h(block);
        let x: Vec<i32> = (0..block as i32).map(|k| (k * 37 % 255) - 127).collect();
        let want: Vec<i32> = (0..block)
            .map(|j| (0..block).map(|t| x[t] * m[t][j]).sum())
            .collect();
        let mut y = x.clone();
        kron_regular_h4(&mut y);
        assert_eq!(y, want, "B = {block}");
        // H_B · H_B = B · I: rotating twice scales by B.
        kron_regular_h4(&mut y);
        assert_eq!(y, x.iter().map(|v| v * block as i32).collect::<Vec<_>>());
    }
}

#[test]
fn column_prefixes_are_partial_column_sums_of_the_matrix() {
    for block in [4, 16, 64] {
        let m = h(block);
        for col in 0..block {
            let mut sum = 0;
            assert_eq!(column_prefix(0, col, block), 0);
            for (n, row) in m.iter().enumerate() {
                sum += row[col];
                assert_eq!(
                    column_prefix(n + 1, col, block),
                    sum,
                    "B {block} n {n} col {col}"
                );
            }
        }
    }
}

/// `scheme` over `shape`, rotated by `kron_regular_h4` in blocks of `block`.
fn rotating(scheme: &'static str, shape: &[u64], block: i64) -> Case {
    Case::new(scheme, shape)
        .param("rotation", text("kron_regular_h4"))
        .param("rotation_size", int(block))
}

// ---------------------------------------------------------------------------------- int8, int4

fn int8(shape: &[u64], block: i64, weight: &[i8], scales: &[f32]) -> Case {
    rotating("int8.convrot", shape, block)
        .part(
            "weight",
            Dtype::I8,
            shape,
            weight.iter().map(|&w| w as u8).collect(),
        )
        .part(
            "scale",
            Dtype::F32,
            &[scales.len() as u64],
            f32_bytes(scales),
        )
}

#[test]
fn int8_convrot_rotates_each_block_back_and_scales_by_two_to_the_minus_k() {
    // B = 4 (k = 1): [1, 0, 0, 0] · H₄ is H₄'s first row; × 3, × 1/2. The second block
    // [0, 0, 0, 2] gives twice the last row.
    let v = int8(&[1, 8], 4, &[1, 0, 0, 0, 0, 0, 0, 2], &[3.0]).f32s();
    assert_eq!(v, [1.5, 1.5, 1.5, -1.5, -3.0, 3.0, 3.0, 3.0]);
    // B = 16 (k = 2): a constant row of 1 sums each column, 2^k = 4, then × 1/4.
    let v = int8(&[1, 16], 16, &[1; 16], &[1.0]).f32s();
    assert!(v.iter().all(|&x| x == 1.0));
}

#[test]
fn int8_convrot_takes_half_precision_scales_and_a_stack() {
    let case = int8(&[2, 1, 4], 4, &[1, 0, 0, 0, 1, 0, 0, 0], &[1.0, 1.0]).part(
        "scale",
        Dtype::BF16,
        &[2],
        vec![0x80, 0x3F, 0x00, 0x40],
    );
    assert_eq!(case.f32s(), [0.5, 0.5, 0.5, -0.5, 1.0, 1.0, 1.0, -1.0]);
    let f16 = case.part("scale", Dtype::F16, &[2, 1], vec![0x00, 0x3C, 0x00, 0x3C]);
    assert!(f16.accepted());
}

#[test]
fn int4_convrot_reads_signed_nibbles_low_first() {
    // Byte 0x7F: column 0 is 0xF = −1, column 1 is 7; byte 0x08: −8 then 0.
    let case = rotating("int4.convrot", &[1, 4], 4)
        .part("weight", Dtype::I8, &[1, 2], vec![0x7F, 0x08])
        .part("scale", Dtype::F32, &[1], f32_bytes(&[2.0]));
    let x = [-1, 7, -8, 0];
    let m = h(4);
    let want: Vec<f32> = (0..4)
        .map(|j| (0..4).map(|t| x[t] * m[t][j]).sum::<i32>() as f32)
        .collect();
    assert_eq!(case.f32s(), want, "y × 2 × 1/2");
}

#[test]
fn rotation_params_are_refused_outside_four_to_the_one_through_eight() {
    let ok = |b: i64| int8(&[1, b as u64], b, &vec![0; b as usize], &[1.0]);
    for block in [4, 16, 64, 256, 1024] {
        assert!(ok(block).accepted(), "B = {block}");
    }
    for block in [0, 1, 2, 8, 32, 128, 4i64.pow(9), -4] {
        let case = int8(&[1, 1024], 4, &[0; 1024], &[1.0]).param("rotation_size", int(block));
        assert_refused(&case, &["rotation_size"]);
    }
    let big = 4i64.pow(8);
    let case = int8(&[1, big as u64], big, &vec![0; big as usize], &[1.0]);
    assert!(case.accepted(), "B = 65536");
    let base = ok(4);
    for rotation in ["sylvester", "hadamard", "KRON_REGULAR_H4"] {
        assert_refused(
            &base.clone().param("rotation", text(rotation)),
            &["rotation"],
        );
    }
    assert_refused(&base.clone().no_param("rotation"), &["rotation", "missing"]);
    assert_refused(
        &base.clone().no_param("rotation_size"),
        &["rotation_size", "missing"],
    );
    assert_refused(
        &base.clone().param("group_size", int(4)),
        &["unknown param", "group_size"],
    );
}

#[test]
fn int_convrot_refuses_columns_off_the_block_and_parts_off_their_rules() {
    assert_refused(&int8(&[1, 8], 16, &[0; 8], &[1.0]), &["8 columns", "16"]);
    assert_refused(&int8(&[1, 24], 16, &[0; 24], &[1.0]), &["24 columns", "16"]);
    assert!(int8(&[1, 32], 16, &[0; 32], &[1.0]).accepted());
    assert_refused(&int8(&[16], 16, &[0; 16], &[1.0]), &["not a matrix"]);
    let case = int8(&[2, 4], 4, &[0; 8], &[1.0, 1.0]);
    assert_refused(
        &case
            .clone()
            .part("scale", Dtype::F8_E4M3, &[2], vec![0x38; 2]),
        &["scale", "dtype"],
    );
    for n in [1u64, 3] {
        let scale = case
            .clone()
            .part("scale", Dtype::F32, &[n], f32_bytes(&vec![1.0; n as usize]));
        assert_refused(&scale, &["scale", "2 elements"]);
    }
    assert_refused(
        &case.clone().part("weight", Dtype::U8, &[2, 4], vec![0; 8]),
        &["weight", "dtype U8"],
    );
    assert_refused(&case.clone().no_part("weight"), &["weight", "missing"]);
    assert_refused(
        &case.clone().part("zero", Dtype::I8, &[1], vec![0]),
        &["zero"],
    );

    let int4 = rotating("int4.convrot", &[2, 4], 4)
        .part("weight", Dtype::I8, &[2, 2], vec![0; 4])
        .part("scale", Dtype::F32, &[2], f32_bytes(&[1.0, 1.0]));
    assert!(int4.accepted());
    for shape in [[2u64, 4], [2, 1], [2, 3], [4, 1]] {
        let n = (shape[0] * shape[1]) as usize;
        assert_refused(
            &int4.clone().part("weight", Dtype::I8, &shape, vec![0; n]),
            &["weight", "shape"],
        );
    }
    let bf16 = int4.clone().part("scale", Dtype::BF16, &[2], vec![0; 4]);
    assert_refused(&bf16, &["scale", "dtype BF16"]);
}

// ---------------------------------------------------------------------------------- comfy.*

/// A requantized scheme over `[R, C]` with `group` and `block`: codes `codes` (6 bits for
/// `comfy.w6a8_int8`, else 4, stored in kitchen's planes), F32 group scales `gs` row-major, row scales `scales`.
fn kitchen(
    scheme: &'static str,
    shape: &[u64],
    group: i64,
    block: i64,
    codes: &[u8],
    gs: &[f32],
    scales: &[f32],
) -> Case {
    let bits = if scheme == "comfy.w6a8_int8" { 6 } else { 4 };
    let (rows, cols) = (shape[0] as usize, shape[1] as usize);
    let width = if bits == 4 {
        cols / 2
    } else {
        cols / 2 + cols / 4
    };
    let mut weight = vec![0u8; rows * width];
    for i in 0..rows {
        for j in 0..cols {
            let q = codes[i * cols + j];
            weight[i * width + j / 2] |= (q & 15) << (4 * (j % 2));
            if bits == 6 {
                weight[i * width + cols / 2 + j / 4] |= (q >> 4) << (2 * (j % 4));
            }
        }
    }
    let groups = (cols / group as usize) as u64;
    rotating(scheme, shape, block)
        .param("group_size", int(group))
        .part("weight", Dtype::I8, &[shape[0], width as u64], weight)
        .part(
            "group_scale",
            Dtype::F32,
            &[shape[0], groups],
            f32_bytes(gs),
        )
        .part("scale", Dtype::F32, &[shape[0]], f32_bytes(scales))
}

/// The decode of the spec's four steps, written out with the explicit matrix.
fn reference(q8: &[i32], block: usize, scale: f32, z: &[f32]) -> Vec<f32> {
    let m = h(block);
    let unit = 1.0 / (1u32 << (block.trailing_zeros() / 2)) as f32;
    q8.chunks(block)
        .enumerate()
        .flat_map(|(g, x)| {
            let m = &m;
            (0..block).map(move |j| {
                let y = (0..block).map(|t| x[t] * m[t][j]).sum::<i32>() as f32;
                match z.is_empty() {
                    true => (y * scale) * unit,
                    false => ((y * scale) + z[g * block + j]) * unit,
                }
            })
        })
        .collect()
}

#[test]
fn requantization_rounds_ties_to_even_and_saturates() {
    // 4-bit levels q − 8 times 0.5: −4, −3.5 → −4, …, 2.5 → 2, 3.5 → 4; times 100 saturates.
    let codes: Vec<u8> = (0..16).chain(0..16).collect();
    let case = kitchen(
        "comfy.asym_w4a8_int8",
        &[1, 32],
        16,
        16,
        &codes,
        &[0.5, 100.0],
        &[1.0],
    );
    let q8: Vec<i32> = (0..16)
        .map(|q| (((q - 8) as f32) * 0.5).round_ties_even() as i32)
        .chain((0..16).map(|q| ((q - 8) * 100).clamp(-127, 127)))
        .collect();
    assert_eq!(q8[..4], [-4, -4, -3, -2]);
    assert_eq!(case.f32s(), reference(&q8, 16, 1.0, &[]));
}

#[test]
fn requantize_agrees_with_round_ties_even_then_clamp() {
    let levels = [
        -32.0f32, -8.0, -7.0, -1.0, -0.0, 0.0, 1.0, 5.0, 31.0, 0.3, -2.7,
    ];
    let scales = [
        0.5,
        0.25,
        1.5,
        0.1,
        3.0,
        4.0 + 1.0 / 1024.0,
        1e-30,
        1e30,
        f32::INFINITY,
        -0.5,
        127.5 / 31.0,
    ];
    for &l in &levels {
        for &s in &scales {
            let x = l * s;
            if x.is_nan() {
                continue;
            }
            let want = x.round_ties_even().clamp(-127.0, 127.0) as i32;
            assert_eq!(requantize(l, s), want, "{l} × {s}");
        }
    }
}

#[test]
fn six_bit_codes_take_their_high_bits_from_the_second_plane() {
    // Levels q − 32 for q in 0..64, group scale 1, B = 4.
    let codes: Vec<u8> = (0..64).collect();
    let case = kitchen(
        "comfy.w6a8_int8",
        &[1, 64],
        16,
        4,
        &codes,
        &[1.0; 4],
        &[0.25],
    );
    let q8: Vec<i32> = (0..64).map(|q| q - 32).collect();
    assert_eq!(case.f32s(), reference(&q8, 4, 0.25, &[]));
}

#[test]
fn a_codebook_gives_each_code_its_level() {
    let book: Vec<f32> = (0..16).map(|q| (q as f32 - 7.5) * 1.25).collect();
    let codes: Vec<u8> = (0..16).rev().collect();
    let case = kitchen("w4a8.convrot", &[1, 16], 16, 16, &codes, &[2.0], &[1.0])
        .part("group_scale", Dtype::F8_E4M3, &[1, 1], vec![0x40])
        .part("codebook", Dtype::F32, &[4, 4], f32_bytes(&book));
    let q8: Vec<i32> = codes
        .iter()
        .map(|&q| (book[q as usize] * 2.0).round_ties_even() as i32)
        .collect();
    assert_eq!(case.f32s(), reference(&q8, 16, 1.0, &[]));
}

/// `z(i, c)` for one row as the spec writes it: the groups meeting `c`'s block in ascending
/// order, each `corr × M` with `M` summed from the explicit matrix.
fn z_reference(
    corr: &[f32],
    rows: usize,
    i: usize,
    cols: usize,
    group: usize,
    block: usize,
) -> Vec<f32> {
    let m = h(block);
    (0..cols)
        .map(|c| {
            let begin = c / block * block;
            let mut z: Option<f32> = None;
            for g in 0..cols / group {
                let (lo, hi) = ((g * group).max(begin), ((g + 1) * group).min(begin + block));
                if lo >= hi {
                    continue;
                }
                let sum: i32 = (lo..hi).map(|t| m[t - begin][c % block]).sum();
                let term = corr[g * rows + i] * sum as f32;
                z = Some(z.map_or(term, |z| z + term));
            }
            z.unwrap()
        })
        .collect()
}

#[test]
fn a_correction_adds_the_column_sums_of_the_groups_meeting_each_block() {
    // Groups smaller than, equal to, larger than and straddling the block.
    for (group, block, cols) in [
        (4, 16, 32),
        (8, 4, 16),
        (16, 16, 32),
        (48, 16, 96),
        (48, 64, 192),
        (64, 16, 128),
    ] {
        let rows = 2;
        let codes: Vec<u8> = (0..rows * cols).map(|k| (k * 5 % 16) as u8).collect();
        let groups = cols / group;
        let gs: Vec<f32> = (0..rows * groups).map(|k| 0.5 + k as f32 / 4.0).collect();
        let corr: Vec<f32> = (0..rows * groups).map(|k| (k as f32 - 1.5) / 3.0).collect();
        let case = kitchen(
            "comfy.asym_w4a8_int8",
            &[rows as u64, cols as u64],
            group as i64,
            block as i64,
            &codes,
            &gs,
            &[0.5, 2.0],
        )
        .part(
            "correction",
            Dtype::F32,
            &[groups as u64, rows as u64],
            f32_bytes(&corr),
        );
        let v = case.f32s();
        for i in 0..rows {
            let q8: Vec<i32> = (0..cols)
                .map(|j| requantize(codes[i * cols + j] as f32 - 8.0, gs[i * groups + j / group]))
                .collect();
            let z = z_reference(&corr, rows, i, cols, group, block);
            let want = reference(&q8, block, [0.5, 2.0][i], &z);
            assert_eq!(
                v[i * cols..(i + 1) * cols],
                want,
                "g {group} B {block} row {i}"
            );
        }
    }
}

#[test]
fn the_correction_table_and_sums_computed_per_element_agree() {
    for (group, block, cols) in [(4, 64, 128), (48, 64, 384), (16, 256, 256), (128, 16, 256)] {
        let rows = 3;
        let values: Vec<f32> = (0..rows * cols / group)
            .map(|k| 1.0 / (k as f32 + 0.75))
            .collect();
        let table = Correction::new(values.clone(), rows, cols, group, block);
        let direct = Correction::with_limit(values, rows, cols, group, block, 0);
        assert!(table.table.is_some() && direct.table.is_none());
        let (mut a, mut b) = (vec![0f32; block], vec![0f32; block]);
        for i in 0..rows {
            for blk in 0..cols / block {
                table.block(i, blk, &mut a);
                direct.block(i, blk, &mut b);
                assert_eq!(a, b, "g {group} B {block} row {i} block {blk}");
            }
        }
    }
}

#[test]
fn a_nan_product_is_refused_before_any_row_but_only_where_a_code_makes_one() {
    // One row of 32 in groups and blocks of 16, row scale 1.
    let asym = |codes: &[u8], gs: &[f32]| {
        kitchen("comfy.asym_w4a8_int8", &[1, 32], 16, 16, codes, gs, &[1.0])
    };
    let codes: Vec<u8> = vec![1; 32];
    let base = asym(&codes, &[1.0, 1.0]);
    let nan_gs = base.clone().part(
        "group_scale",
        Dtype::F32,
        &[1, 2],
        f32_bytes(&[1.0, f32::NAN]),
    );
    assert!(matches!(nan_gs.refusal(), DecodeError::Refused { .. }));
    assert_refused(&nan_gs, &["(0, 16)", "NaN"]);
    // An infinite group scale is NaN only on a zero level (code 8 without a codebook).
    let inf_gs = base.clone().part(
        "group_scale",
        Dtype::F32,
        &[1, 2],
        f32_bytes(&[f32::INFINITY, 1.0]),
    );
    let v = inf_gs.f32s();
    assert!(v.iter().all(|x| x.is_finite()), "±∞ saturates to ±127");
    let mut zero = codes.clone();
    zero[5] = 8;
    let zero_level = asym(&zero, &[f32::INFINITY, 1.0]);
    assert_refused(&zero_level, &["(0, 5)", "NaN"]);
    // A NaN level counts only where a code uses it.
    let mut book = [0.5f32; 16];
    book[3] = f32::NAN;
    let unused = base
        .clone()
        .part("codebook", Dtype::F32, &[16], f32_bytes(&book));
    assert!(unused.accepted());
    let mut used = codes.clone();
    used[31] = 3;
    let used = asym(&used, &[1.0, 1.0]).part("codebook", Dtype::F32, &[16], f32_bytes(&book));
    assert_refused(&used, &["(0, 31)"]);
    // An infinite level is NaN only on a zero scale.
    book[3] = f32::INFINITY;
    let mut first = codes.clone();
    first[0] = 3;
    let inf_level = asym(&first, &[0.0, 1.0]).part("codebook", Dtype::F32, &[16], f32_bytes(&book));
    assert_refused(&inf_level, &["(0, 0)"]);
}

#[test]
fn group_sizes_are_refused_outside_each_schemes_list() {
    let case = |scheme: &'static str, g: i64| {
        kitchen(
            scheme,
            &[1, 96],
            g.max(1),
            16,
            &[0; 96],
            &vec![1.0; 96 / g.max(1) as usize],
            &[1.0],
        )
        .param("group_size", int(g))
    };
    let asym = "comfy.asym_w4a8_int8";
    // 96 columns are whole groups of each size tried, and whole blocks of 16.
    for g in [4, 8, 16, 32, 48, 96] {
        assert!(case(asym, g).accepted(), "asym g = {g}");
    }
    for g in [-16, 0, 1, 2, 3, 6, 12, 24] {
        assert_refused(
            &case(asym, g.max(1)).param("group_size", int(g)),
            &["group_size"],
        );
    }
    for g in [16, 32, 48, 96] {
        assert!(case("comfy.w6a8_int8", g).accepted(), "w6 g = {g}");
    }
    for g in [0, 4, 8, 24] {
        assert_refused(
            &case("comfy.w6a8_int8", g.max(1)).param("group_size", int(g)),
            &["group_size"],
        );
    }
    let w4a8 = |g: i64| {
        case("w4a8.convrot", g).part(
            "group_scale",
            Dtype::F8_E4M3,
            &[1, 96 / g as u64],
            vec![0x38; 96 / g as usize],
        )
    };
    assert!(w4a8(16).accepted());
    for g in [8, 32, 48] {
        assert_refused(&w4a8(g), &["group_size", "16"]);
    }
    assert_refused(
        &case(asym, 16).no_param("group_size"),
        &["group_size", "missing"],
    );
    assert_refused(
        &case(asym, 16).param("bits", int(4)),
        &["unknown param", "bits"],
    );
}

#[test]
fn kitchen_schemes_refuse_columns_off_the_group_or_the_block() {
    // 48 columns: whole groups of 48, but not whole blocks of 64; 64 columns: not groups of 48.
    let g48 = kitchen(
        "comfy.asym_w4a8_int8",
        &[1, 48],
        48,
        64,
        &[0; 48],
        &[1.0],
        &[1.0],
    );
    assert_refused(&g48, &["48 columns", "64"]);
    let b64 = kitchen(
        "comfy.asym_w4a8_int8",
        &[1, 64],
        32,
        64,
        &[0; 64],
        &[1.0; 2],
        &[1.0],
    )
    .param("group_size", int(48));
    assert_refused(&b64, &["64 columns", "48"]);
    let both = kitchen(
        "comfy.asym_w4a8_int8",
        &[1, 192],
        48,
        64,
        &[0; 192],
        &[1.0; 4],
        &[1.0],
    );
    assert!(both.accepted());
}

#[test]
fn kitchen_schemes_refuse_parts_off_their_rules() {
    // [2, 32] in groups and blocks of 16, every code 0 and every scale 1.
    let zeros =
        |scheme: &'static str| kitchen(scheme, &[2, 32], 16, 16, &[0; 64], &[1.0; 4], &[1.0; 2]);
    let asym = zeros("comfy.asym_w4a8_int8");
    assert!(asym.accepted());
    for shape in [[2u64, 15], [2, 17], [2, 24], [1, 32]] {
        let n = (shape[0] * shape[1]) as usize;
        assert_refused(
            &asym.clone().part("weight", Dtype::I8, &shape, vec![0; n]),
            &["weight", "shape"],
        );
    }
    assert_refused(
        &asym
            .clone()
            .part("weight", Dtype::U8, &[2, 16], vec![0; 32]),
        &["weight", "dtype U8"],
    );
    for shape in [[2u64, 1], [2, 3], [4, 1], [1, 2]] {
        let n = (shape[0] * shape[1]) as usize;
        let gs = asym
            .clone()
            .part("group_scale", Dtype::F32, &shape, f32_bytes(&vec![1.0; n]));
        assert_refused(&gs, &["group_scale", "shape"]);
    }
    let bf16 = asym
        .clone()
        .part("group_scale", Dtype::BF16, &[2, 2], vec![0; 8]);
    assert_refused(&bf16, &["group_scale", "dtype BF16"]);
    let e4m3 = asym
        .clone()
        .part("group_scale", Dtype::F8_E4M3, &[2, 2], vec![0x38; 4]);
    assert!(e4m3.accepted());
    assert_refused(
        &asym.clone().part("scale", Dtype::BF16, &[2], vec![0; 4]),
        &["scale", "dtype BF16"],
    );
    assert_refused(
        &asym.clone().part("scale", Dtype::F32, &[3], vec![0; 12]),
        &["scale", "2 elements"],
    );
    assert_refused(
        &asym.clone().no_part("group_scale"),
        &["group_scale", "missing"],
    );
    assert_refused(&asym.clone().no_part("scale"), &["scale", "missing"]);
    for n in [15u64, 17] {
        let book = asym
            .clone()
            .part("codebook", Dtype::F32, &[n], vec![0; 4 * n as usize]);
        assert_refused(&book, &["codebook", "16 elements"]);
    }
    let f16_book = asym
        .clone()
        .part("codebook", Dtype::F16, &[16], vec![0; 32]);
    assert_refused(&f16_book, &["codebook", "dtype F16"]);
    // The correction is on transposed row blocks, [C/g, R]: [R, C/g] is refused.
    let corr = |shape: &[u64]| {
        asym.clone()
            .part("correction", Dtype::BF16, shape, vec![0; 8])
    };
    assert!(corr(&[2, 2]).accepted());
    let square = kitchen(
        "comfy.asym_w4a8_int8",
        &[2, 48],
        16,
        16,
        &[0; 96],
        &[1.0; 6],
        &[1.0; 2],
    );
    let transposed = square
        .clone()
        .part("correction", Dtype::F32, &[3, 2], vec![0; 24]);
    assert!(transposed.accepted());
    assert_refused(
        &square.part("correction", Dtype::F32, &[2, 3], vec![0; 24]),
        &["correction", "[3, 2]"],
    );
    assert_refused(&corr(&[4]), &["correction", "shape"]);

    let w6 = zeros("comfy.w6a8_int8");
    assert!(w6.accepted());
    assert_refused(
        &w6.clone().part("weight", Dtype::I8, &[2, 16], vec![0; 32]),
        &["weight", "[2, 24]"],
    );
    for role in ["codebook", "correction"] {
        let extra = w6.clone().part(role, Dtype::F32, &[16], vec![0; 64]);
        assert_refused(&extra, &[role, "not one of"]);
    }
    let w4a8 = zeros("w4a8.convrot");
    assert_refused(&w4a8, &["group_scale", "dtype F32"]);
    let w4a8 = w4a8.part("group_scale", Dtype::F8_E4M3, &[2, 2], vec![0x38; 4]);
    assert!(w4a8.accepted());
    let corr = w4a8.part("correction", Dtype::F32, &[2, 2], vec![0; 16]);
    assert_refused(&corr, &["correction", "not one of"]);
}
