//! Tests of the microscaled schemes: hand-computed vectors, each refusal tried at its limits
//! from both sides, and row ranges that decode as the whole does.

use super::*;
use crate::decode::testing::{assert_refused, bf16_bytes, f32_bytes, int, refusal, text, Case};

/// Codes packed two to a byte, even code low.
fn nibbles(codes: &[u8]) -> Vec<u8> {
    codes
        .chunks(2)
        .map(|c| c[0] | c.get(1).map_or(0, |h| h << 4))
        .collect()
}

// ---------------------------------------------------------------------------------- mxfp8

const E4M3_ONE: u8 = 0x38;
const E8M0_ONE: u8 = 127;

/// `mxfp8` over `shape`, every weight `w` and every scale `s`, row-major.
fn mxfp8(shape: &[u64], w: u8, s: u8) -> Case {
    let n: u64 = shape.iter().product();
    let mut scale_shape = shape.to_vec();
    *scale_shape.last_mut().unwrap() = shape.last().unwrap().div_ceil(32);
    let scales: u64 = scale_shape.iter().product();
    Case::new("mxfp8", shape)
        .param("block_size", int(32))
        .param("scale_layout", text("row_major"))
        .part("weight", Dtype::F8_E4M3, shape, vec![w; n as usize])
        .part(
            "scale",
            Dtype::F8_E8M0,
            &scale_shape,
            vec![s; scales as usize],
        )
}

#[test]
fn mxfp8_multiplies_each_element_by_its_blocks_power_of_two() {
    // Two rows of 40: blocks of 32 and a short one of 8.
    let mut case = mxfp8(&[2, 40], E4M3_ONE, E8M0_ONE);
    case = case.part("scale", Dtype::F8_E8M0, &[2, 2], vec![127, 129, 126, 255]);
    let v = case.f32s();
    assert!(v[..32].iter().all(|&x| x == 1.0));
    assert!(v[32..40].iter().all(|&x| x == 4.0));
    assert!(v[40..72].iter().all(|&x| x == 0.5));
    assert!(v[72..].iter().all(|x| x.is_nan()), "E8M0 255 is NaN");
    // 448 × 2^127 overflows every logical dtype but F32 to infinity.
    let big = mxfp8(&[1, 4], 0x7E, 254);
    assert_eq!(big.f32s()[0], 448.0 * 2f32.powi(127));
    assert_eq!(big.bytes(Dtype::BF16)[..2], 0x7F80u16.to_le_bytes());
    assert_eq!(big.bytes(Dtype::F16)[..2], 0x7C00u16.to_le_bytes());
}

#[test]
fn mxfp8_reads_e5m2_weights_and_keeps_subnormal_results() {
    // E5M2 0x01 is 2^-16; times 2^-10 it is 2^-26, below half of F16's least subnormal
    // (2^-24), so F16 rounds it to zero; 0x7C is infinity.
    let case = mxfp8(&[1, 2], 0x01, 117).part("weight", Dtype::F8_E5M2, &[1, 2], vec![0x01, 0x7C]);
    let v = case.f32s();
    assert_eq!(v, [2f32.powi(-26), f32::INFINITY]);
    assert_eq!(case.bytes(Dtype::F16)[..2], [0, 0]);
}

#[test]
fn mxfp8_reads_cublas_tiles_for_each_matrix_of_a_stack() {
    // [2, 130, 40]: W = 2 padded to 4, rows padded to 256 per matrix.
    let shape = [2u64, 130, 40];
    let mut scales = vec![0u8; 2 * 256 * 4];
    let index = |m: usize, r: usize, b: usize| {
        m * 256 * 4 + 512 * ((r / 128) + b / 4) + 16 * (r % 32) + 4 * ((r % 128) / 32) + b % 4
    };
    let exponent = |m: usize, r: usize, b: usize| ((m + r + 2 * b) % 5) as u8;
    for m in 0..2 {
        for r in 0..130 {
            for b in 0..2 {
                scales[index(m, r, b)] = E8M0_ONE + exponent(m, r, b);
            }
        }
    }
    let case = mxfp8(&shape, E4M3_ONE, 0)
        .param("scale_layout", text("cublas_128x4"))
        .part("scale", Dtype::F8_E8M0, &[2, 256, 4], scales);
    let v = case.f32s();
    for m in 0..2 {
        for r in 0..130 {
            for j in [0, 31, 32, 39] {
                let want = 2f32.powi(exponent(m, r, j / 32) as i32);
                assert_eq!(
                    v[(m * 130 + r) * 40 + j],
                    want,
                    "matrix {m} row {r} column {j}"
                );
            }
        }
    }
}

#[test]
fn mxfp8_refuses_a_block_size_other_than_32() {
    let case = mxfp8(&[2, 64], E4M3_ONE, E8M0_ONE);
    assert!(case.accepted());
    for n in [16, 31, 33, 64] {
        assert_refused(&case.clone().param("block_size", int(n)), &["block_size"]);
    }
    assert_refused(
        &case.clone().param("block_size", text("32")),
        &["block_size"],
    );
    assert_refused(
        &case.clone().no_param("block_size"),
        &["block_size", "missing"],
    );
}

#[test]
fn mxfp8_refuses_a_scale_layout_not_listed() {
    let case = mxfp8(&[2, 64], E4M3_ONE, E8M0_ONE);
    for layout in ["transposed", "cublas", "ROW_MAJOR"] {
        assert_refused(
            &case.clone().param("scale_layout", text(layout)),
            &["scale_layout"],
        );
    }
    assert_refused(
        &case.clone().no_param("scale_layout"),
        &["scale_layout", "missing"],
    );
    assert_refused(
        &case.clone().param("axis", int(1)),
        &["unknown param", "axis"],
    );
}

#[test]
fn mxfp8_refuses_missing_extra_and_mistyped_parts() {
    let case = mxfp8(&[2, 64], E4M3_ONE, E8M0_ONE);
    assert_refused(&case.clone().no_part("scale"), &["scale", "missing"]);
    assert_refused(&case.clone().no_part("weight"), &["weight", "missing"]);
    let extra = case
        .clone()
        .part("input_scale", Dtype::F32, &[1], f32_bytes(&[1.0]));
    assert_refused(&extra, &["input_scale", "not one of"]);
    let i8_weight = case
        .clone()
        .part("weight", Dtype::I8, &[2, 64], vec![0; 128]);
    assert_refused(&i8_weight, &["weight", "dtype I8"]);
    let u8_scale = case.clone().part("scale", Dtype::U8, &[2, 2], vec![127; 4]);
    assert_refused(&u8_scale, &["scale", "dtype U8"]);
}

#[test]
fn mxfp8_refuses_a_scale_shape_one_off_either_way() {
    let case = mxfp8(&[2, 64], E4M3_ONE, E8M0_ONE);
    for shape in [[2u64, 1], [2, 3], [1, 2], [3, 2]] {
        let n = (shape[0] * shape[1]) as usize;
        let bad = case
            .clone()
            .part("scale", Dtype::F8_E8M0, &shape, vec![127; n]);
        assert_refused(&bad, &["scale", "shape"]);
    }
    // Row-major keeps the leading extents: [4] holds four scales but is not [2, 2].
    let flat = case
        .clone()
        .part("scale", Dtype::F8_E8M0, &[4], vec![127; 4]);
    assert_refused(&flat, &["scale", "shape"]);
    // cuBLAS pads to [128, 4]; the unpadded [2, 2] is refused.
    let cublas = case.clone().param("scale_layout", text("cublas_128x4"));
    assert_refused(&cublas, &["scale", "[128, 4]"]);
    let padded = cublas.part("scale", Dtype::F8_E8M0, &[128, 4], vec![127; 512]);
    assert!(padded.accepted());
}

#[test]
fn mxfp8_refuses_a_vector_and_a_logical_dtype_that_is_not_a_float() {
    assert_refused(&mxfp8(&[64], E4M3_ONE, E8M0_ONE), &["not a matrix"]);
    assert!(mxfp8(&[1, 64], E4M3_ONE, E8M0_ONE).accepted());
    let case = mxfp8(&[2, 64], E4M3_ONE, E8M0_ONE);
    let err = case.with(Dtype::I8, refusal);
    assert!(err.to_string().contains("F32, BF16 or F16"), "{err}");
}

#[test]
fn mxfp8_refuses_bytes_that_do_not_match_the_declared_shape() {
    let case = mxfp8(&[2, 64], E4M3_ONE, E8M0_ONE);
    let short = case.part("weight", Dtype::F8_E4M3, &[2, 64], vec![0; 127]);
    assert_refused(&short, &["weight", "127 bytes"]);
}

// ---------------------------------------------------------------------------------- nvfp4

/// `nvfp4` over `[R, C]`, codes `codes`, E4M3 block scales `scales` row-major, `scale_2`.
fn nvfp4(shape: &[u64], codes: &[u8], scales: &[u8], scale_2: &[f32]) -> Case {
    let mut scale_shape = shape.to_vec();
    *scale_shape.last_mut().unwrap() /= 16;
    Case::new("nvfp4", shape)
        .param("block_size", int(16))
        .param("global_scale", text("multiply"))
        .param("nibble_order", text("low_first"))
        .param("scale_layout", text("row_major"))
        .part("weight", Dtype::F4, shape, nibbles(codes))
        .part("scale", Dtype::F8_E4M3, &scale_shape, scales.to_vec())
        .part(
            "scale_2",
            Dtype::F32,
            &[scale_2.len() as u64],
            f32_bytes(scale_2),
        )
}

/// Codes 0..16 in order: E2M1 values 0, 0.5, 1, 1.5, 2, 3, 4, 6, then negated.
fn every_code() -> Vec<u8> {
    (0..16).collect()
}

#[test]
fn nvfp4_multiply_scales_by_the_block_then_the_global_scale() {
    // E4M3 0x40 is 2.0; scale_2 0.1 (not a power of two, so the order shows).
    let case = nvfp4(&[1, 16], &every_code(), &[0x40], &[0.1]);
    let want: Vec<f32> = elem::E2M1.iter().map(|&t| (t * 2.0) * 0.1f32).collect();
    assert_eq!(case.f32s(), want);
}

#[test]
fn nvfp4_divide_divides_the_block_scale_by_the_global_scale_first() {
    // E4M3 0x44 is 3; 3 ÷ 0.7 rounds, so 6 × (3 ÷ 0.7) differs from (6 × 3) ÷ 0.7.
    let case =
        nvfp4(&[1, 16], &every_code(), &[0x44], &[0.7]).param("global_scale", text("divide"));
    let sg = 3.0f32 / 0.7;
    let want: Vec<f32> = elem::E2M1.iter().map(|&t| t * sg).collect();
    assert_eq!(case.f32s(), want);
    assert_ne!(want[7], (6.0f32 * 3.0) / 0.7);
}

#[test]
fn nvfp4_high_first_reads_the_even_code_from_the_high_nibble() {
    let low = nvfp4(&[1, 16], &every_code(), &[0x38], &[1.0]);
    let high = low.clone().param("nibble_order", text("high_first"));
    let swapped: Vec<f32> = low.f32s().chunks(2).flat_map(|p| [p[1], p[0]]).collect();
    assert_eq!(high.f32s(), swapped);
}

#[test]
fn nvfp4_scale_2_per_matrix_scales_its_own_matrix_and_pre_quant_scale_comes_last() {
    // [2, 1, 16]: matrix 0 × 2, matrix 1 × 8; column j × (j + 1) in BF16.
    let codes: Vec<u8> = vec![2; 32]; // 1.0 everywhere
    let pre: Vec<f32> = (1..=16).map(|j| j as f32).collect();
    let case = nvfp4(&[2, 1, 16], &codes, &[0x38, 0x38], &[2.0, 8.0])
        .part("pre_quant_scale", Dtype::BF16, &[16], bf16_bytes(&pre))
        .part("input_scale", Dtype::F32, &[2], f32_bytes(&[1.0, 1.0]));
    let v = case.f32s();
    for j in 0..16 {
        assert_eq!(v[j], 2.0 * pre[j]);
        assert_eq!(v[16 + j], 8.0 * pre[j]);
    }
}

#[test]
fn nvfp4_refuses_params_not_listed() {
    let case = nvfp4(&[1, 16], &every_code(), &[0x38], &[1.0]);
    assert!(case.accepted());
    for n in [8, 15, 17, 32] {
        assert_refused(&case.clone().param("block_size", int(n)), &["block_size"]);
    }
    for (param, value) in [
        ("global_scale", "mul"),
        ("nibble_order", "low"),
        ("nibble_order", "planar"),
        ("scale_layout", "transposed"),
    ] {
        assert_refused(&case.clone().param(param, text(value)), &[param]);
    }
    for param in ["block_size", "global_scale", "nibble_order", "scale_layout"] {
        assert_refused(&case.clone().no_param(param), &[param, "missing"]);
    }
}

#[test]
fn nvfp4_refuses_columns_that_are_not_whole_blocks_of_16() {
    for cols in [8u64, 24, 40] {
        let codes = vec![0u8; cols as usize];
        let case = nvfp4(&[1, cols], &codes, &[0x38], &[1.0]).part(
            "scale",
            Dtype::F8_E4M3,
            &[1, cols.div_ceil(16)],
            vec![0x38; cols.div_ceil(16) as usize],
        );
        assert_refused(&case, &["columns", "16"]);
    }
    for cols in [16u64, 32, 48] {
        let codes = vec![0u8; cols as usize];
        let scales = vec![0x38; cols as usize / 16];
        assert!(nvfp4(&[1, cols], &codes, &scales, &[1.0]).accepted());
    }
}

#[test]
fn nvfp4_refuses_a_scale_2_that_is_neither_one_nor_one_per_matrix() {
    let codes = vec![0u8; 3 * 2 * 16];
    let scales = vec![0x38; 6];
    let case = |g: &[f32]| nvfp4(&[3, 2, 16], &codes, &scales, g);
    assert!(case(&[1.0]).accepted());
    assert!(case(&[1.0; 3]).accepted());
    for n in [0, 2, 4, 6] {
        assert_refused(&case(&vec![1.0; n]), &["scale_2", "1 or 3"]);
    }
    let bf16 = case(&[1.0]).part("scale_2", Dtype::BF16, &[1], bf16_bytes(&[1.0]));
    assert_refused(&bf16, &["scale_2", "dtype BF16"]);
    assert_refused(&case(&[1.0]).no_part("scale_2"), &["scale_2", "missing"]);
    let input = |n: usize| {
        case(&[1.0]).part(
            "input_scale",
            Dtype::F32,
            &[n as u64],
            f32_bytes(&vec![1.0; n]),
        )
    };
    assert!(input(1).accepted() && input(3).accepted());
    assert_refused(&input(2), &["input_scale"]);
    assert_refused(&input(4), &["input_scale"]);
}

#[test]
fn nvfp4_refuses_a_pre_quant_scale_off_the_column_grid_and_parts_not_listed() {
    let case = nvfp4(&[1, 32], &[0; 32], &[0x38, 0x38], &[1.0]);
    for n in [31u64, 33, 16] {
        let bad = case.clone().part(
            "pre_quant_scale",
            Dtype::F32,
            &[n],
            f32_bytes(&vec![1.0; n as usize]),
        );
        assert_refused(&bad, &["pre_quant_scale", "32 elements"]);
    }
    let any_shape = case
        .clone()
        .part("pre_quant_scale", Dtype::F16, &[2, 16], vec![0; 64]);
    assert!(any_shape.accepted());
    let int = case
        .clone()
        .part("pre_quant_scale", Dtype::I8, &[32], vec![1; 32]);
    assert_refused(&int, &["pre_quant_scale", "dtype I8"]);
    let channel = case
        .clone()
        .part("channel_scale", Dtype::F32, &[1], f32_bytes(&[1.0]));
    assert_refused(&channel, &["channel_scale", "not one of"]);
    let u8_weight = case
        .clone()
        .part("weight", Dtype::U8, &[1, 16], vec![0; 16]);
    assert_refused(&u8_weight, &["weight", "dtype U8"]);
    let e8m0 = case
        .clone()
        .part("scale", Dtype::F8_E8M0, &[1, 2], vec![127; 2]);
    assert_refused(&e8m0, &["scale", "dtype F8_E8M0"]);
    assert_refused(&nvfp4(&[16], &[0; 16], &[0x38], &[1.0]), &["not a matrix"]);
}

// ---------------------------------------------------------------------------------- svdq.nvfp4

/// `svdq.nvfp4` over `[2, 16]` with rank `rank`: codes all 1.0, scale 1.0, scale_2 1.0.
fn svdq(rank: u64) -> Case {
    let down: Vec<f32> = (0..rank * 16)
        .map(|k| 0.25 * (k % 7) as f32 - 0.5)
        .collect();
    let up: Vec<f32> = (0..2 * rank).map(|k| 1.0 + k as f32).collect();
    let mut case = nvfp4(&[2, 16], &[2; 32], &[0x38, 0x38], &[1.0]);
    case.scheme = "svdq.nvfp4";
    case.part("pre_quant_scale", Dtype::F32, &[16], f32_bytes(&[0.5; 16]))
        .part("lowrank_down", Dtype::F32, &[rank, 16], f32_bytes(&down))
        .part("lowrank_up", Dtype::BF16, &[2, rank], bf16_bytes(&up))
}

#[test]
fn svdq_adds_the_low_rank_terms_in_order_after_the_factors() {
    let case = svdq(3).part("channel_scale", Dtype::F8_E4M3, &[2], vec![0x40, 0x30]);
    let v = case.f32s();
    let c = [2.0f32, 0.5];
    for i in 0..2 {
        for j in 0..16 {
            let mut want = (1.0 * c[i]) * 0.5;
            for r in 0..3 {
                let up = 1.0 + (i * 3 + r) as f32;
                let down = 0.25 * ((r * 16 + j) % 7) as f32 - 0.5;
                want += up * down;
            }
            assert_eq!(v[i * 16 + j], want, "({i}, {j})");
        }
    }
}

#[test]
fn svdq_decodes_any_row_range_as_the_whole() {
    // More rows than a tile, so tiles and ranges cross.
    let rows = 2 * SVDQ_TILE as u64 + 3;
    let down: Vec<f32> = (0..32).map(|k| k as f32 / 8.0).collect();
    let up: Vec<f32> = (0..rows * 2).map(|k| (k % 5) as f32).collect();
    let codes: Vec<u8> = (0..rows * 16).map(|k| (k % 16) as u8).collect();
    let mut case = nvfp4(&[rows, 16], &codes, &vec![0x38; rows as usize], &[1.5]);
    case.scheme = "svdq.nvfp4";
    let case = case
        .part("pre_quant_scale", Dtype::F32, &[16], f32_bytes(&[0.75; 16]))
        .part("lowrank_down", Dtype::F32, &[2, 16], f32_bytes(&down))
        .part("lowrank_up", Dtype::F32, &[rows, 2], f32_bytes(&up));
    case.assert_ranges_agree(Dtype::BF16);
}

#[test]
fn svdq_refuses_a_stack_a_missing_pre_quant_scale_and_a_rank_of_zero() {
    let case = svdq(2);
    assert!(case.accepted());
    let mut stack = svdq(2);
    stack.shape = vec![1, 2, 16];
    stack = stack.part("weight", Dtype::F4, &[1, 2, 16], vec![0; 16]);
    assert_refused(&stack, &["[N, K]"]);
    assert_refused(
        &case.clone().no_part("pre_quant_scale"),
        &["pre_quant_scale", "missing"],
    );
    let rank0 = case
        .clone()
        .part("lowrank_down", Dtype::F32, &[0, 16], vec![])
        .part("lowrank_up", Dtype::BF16, &[2, 0], vec![]);
    assert_refused(&rank0, &["lowrank_down", "R ≥ 1"]);
    assert!(svdq(1).accepted());
}

#[test]
fn svdq_refuses_factors_of_the_wrong_shape_or_dtype() {
    let case = svdq(2);
    let up = |r: u64, n: u64| {
        case.clone().part(
            "lowrank_up",
            Dtype::BF16,
            &[n, r],
            vec![0; (2 * r * n) as usize],
        )
    };
    assert_refused(&up(1, 2), &["lowrank_up", "[2, 2]"]);
    assert_refused(&up(3, 2), &["lowrank_up", "[2, 2]"]);
    assert_refused(&up(2, 3), &["lowrank_up", "[2, 2]"]);
    let down = case
        .clone()
        .part("lowrank_down", Dtype::F32, &[2, 15], vec![0; 120]);
    assert_refused(&down, &["lowrank_down", "[R, 16]"]);
    let down_i8 = case
        .clone()
        .part("lowrank_down", Dtype::I8, &[2, 16], vec![0; 32]);
    assert_refused(&down_i8, &["lowrank_down", "dtype I8"]);
    let two = case
        .clone()
        .part("scale_2", Dtype::F32, &[2], f32_bytes(&[1.0, 1.0]));
    assert_refused(&two, &["scale_2"]);
    let input = case
        .clone()
        .part("input_scale", Dtype::F32, &[2], f32_bytes(&[1.0, 1.0]));
    assert_refused(&input, &["input_scale"]);
    let channel = |d: Dtype, n: u64, size: u64| {
        case.clone()
            .part("channel_scale", d, &[n], vec![0; (n * size) as usize])
    };
    assert!(channel(Dtype::F32, 2, 4).accepted() && channel(Dtype::F8_E4M3, 2, 1).accepted());
    assert_refused(
        &channel(Dtype::BF16, 2, 2),
        &["channel_scale", "dtype BF16"],
    );
    assert_refused(&channel(Dtype::F32, 1, 4), &["channel_scale", "2 elements"]);
    assert_refused(&channel(Dtype::F32, 3, 4), &["channel_scale", "2 elements"]);
}

// ---------------------------------------------------------------------------------- fp8.blockwise

fn blockwise(shape: &[u64], br: u64, bc: u64, scales: &[f32]) -> Case {
    let n: u64 = shape.iter().product();
    let k = shape.len();
    let mut scale_shape = shape[..k - 2].to_vec();
    scale_shape.extend([shape[k - 2].div_ceil(br), shape[k - 1].div_ceil(bc)]);
    Case::new("fp8.blockwise", shape)
        .param(
            "block_size",
            Value::Array(vec![int(br as i64), int(bc as i64)]),
        )
        .part("weight", Dtype::F8_E4M3, shape, vec![E4M3_ONE; n as usize])
        .part("scale", Dtype::F32, &scale_shape, f32_bytes(scales))
}

#[test]
fn fp8_blockwise_gives_each_tile_of_each_matrix_its_scale() {
    // [2, 3, 4] in tiles of 2 × 3: per matrix 2 × 2 tiles, the last ones short.
    let scales: Vec<f32> = (1..=8).map(|k| k as f32).collect();
    let v = blockwise(&[2, 3, 4], 2, 3, &scales).f32s();
    #[rustfmt::skip]
    let want = [
        1.0, 1.0, 1.0, 2.0,
        1.0, 1.0, 1.0, 2.0,
        3.0, 3.0, 3.0, 4.0,
        5.0, 5.0, 5.0, 6.0,
        5.0, 5.0, 5.0, 6.0,
        7.0, 7.0, 7.0, 8.0,
    ];
    assert_eq!(v, want);
}

#[test]
fn fp8_blockwise_takes_a_tile_larger_than_the_matrix_whole_and_e8m0_scales() {
    let v = blockwise(&[3, 5], 128, 128, &[0.25]).f32s();
    assert!(v.iter().all(|&x| x == 0.25));
    let e8m0 = blockwise(&[2, 2], 1, 1, &[]).part(
        "scale",
        Dtype::F8_E8M0,
        &[2, 2],
        vec![0, 127, 254, 255],
    );
    let v = e8m0.f32s();
    assert_eq!(v[..3], [2f32.powi(-127), 1.0, 2f32.powi(127)]);
    assert!(v[3].is_nan());
}

#[test]
fn fp8_blockwise_refuses_a_block_size_that_is_not_two_positive_integers() {
    let case = blockwise(&[4, 4], 2, 2, &[1.0; 4]);
    assert!(case.accepted());
    let bad = [
        Value::Array(vec![int(2)]),
        Value::Array(vec![int(2), int(2), int(2)]),
        Value::Array(vec![int(0), int(2)]),
        Value::Array(vec![int(2), int(-1)]),
        Value::Array(vec![int(2), text("2")]),
        int(2),
        text("[2, 2]"),
    ];
    for value in bad {
        assert_refused(&case.clone().param("block_size", value), &["block_size"]);
    }
    assert_refused(
        &case.clone().no_param("block_size"),
        &["block_size", "missing"],
    );
    let one = blockwise(&[4, 4], 1, 1, &[1.0; 16]);
    assert!(one.accepted());
}

#[test]
fn fp8_blockwise_refuses_other_weights_scales_and_tile_counts() {
    let case = blockwise(&[4, 4], 2, 2, &[1.0; 4]);
    let e5m2 = case
        .clone()
        .part("weight", Dtype::F8_E5M2, &[4, 4], vec![0; 16]);
    assert_refused(&e5m2, &["weight", "dtype F8_E5M2"]);
    let i8 = case.clone().part("scale", Dtype::I8, &[2, 2], vec![1; 4]);
    assert_refused(&i8, &["scale", "dtype I8"]);
    for shape in [[2u64, 1], [2, 3], [1, 2], [3, 2]] {
        let n = (shape[0] * shape[1]) as usize;
        let bad = case
            .clone()
            .part("scale", Dtype::F32, &shape, f32_bytes(&vec![1.0; n]));
        assert_refused(&bad, &["scale", "shape"]);
    }
    assert_refused(
        &case
            .clone()
            .part("bias", Dtype::F32, &[1], f32_bytes(&[0.0])),
        &["bias"],
    );
}

// ---------------------------------------------------------------------------------- mxfp4

fn mxfp4(shape: &[u64], transposed: bool, codes: &[u8], scales: &[u8]) -> Case {
    let mut stored = shape.to_vec();
    let k = stored.len();
    if transposed {
        stored.swap(k - 2, k - 1);
    }
    let mut scale_shape = stored.clone();
    scale_shape[k - 1] = stored[k - 1].div_ceil(32);
    Case::new("mxfp4", shape)
        .param("block_size", int(32))
        .param("transposed", Value::Bool(transposed))
        .part("weight", Dtype::F4, &stored, nibbles(codes))
        .part("scale", Dtype::F8_E8M0, &scale_shape, scales.to_vec())
}

#[test]
fn mxfp4_reads_f4_codes_low_nibble_first_across_rows() {
    // [2, 3]: row 1 starts in the high nibble of byte 1.
    let case = mxfp4(&[2, 3], false, &[1, 2, 3, 9, 10, 11], &[127, 128]);
    assert_eq!(case.f32s(), [0.5, 1.0, 1.5, -1.0, -2.0, -3.0]);
}

#[test]
fn mxfp4_scales_each_block_of_32_and_the_short_last_one() {
    let codes = vec![2u8; 2 * 40]; // 1.0
    let case = mxfp4(&[2, 40], false, &codes, &[127, 130, 126, 255]);
    let v = case.f32s();
    assert!(v[..32].iter().all(|&x| x == 1.0) && v[32..40].iter().all(|&x| x == 8.0));
    assert!(v[40..72].iter().all(|&x| x == 0.5) && v[72..].iter().all(|x| x.is_nan()));
}

#[test]
fn transposed_mxfp4_swaps_the_last_two_axes_back() {
    // Logical [2, 3, 2]: each matrix stored as S = [2, 3] (rows b, columns a).
    let codes = [1, 2, 3, 4, 5, 6, 9, 10, 11, 12, 13, 14];
    let case = mxfp4(&[2, 3, 2], true, &codes, &[127, 127, 128, 128]);
    // value[m, a, b] = S[m, b, a] × s(m, b).
    let t = elem::E2M1;
    #[rustfmt::skip]
    let want = [
        t[1], t[4], t[2], t[5], t[3], t[6],
        t[9] * 2.0, t[12] * 2.0, t[10] * 2.0, t[13] * 2.0, t[11] * 2.0, t[14] * 2.0,
    ];
    assert_eq!(case.f32s(), want);
}

#[test]
fn transposed_mxfp4_decodes_any_row_range_as_the_whole() {
    // Logical [2, 37, 3]: stored rows of 37 codes (odd starts, two scale blocks), and row
    // ranges that start and end inside a block of 32 logical rows.
    let codes: Vec<u8> = (0..2 * 37 * 3).map(|k| (k * 7 % 16) as u8).collect();
    let scales: Vec<u8> = (0..2 * 3 * 2).map(|k| 120 + k as u8).collect();
    mxfp4(&[2, 37, 3], true, &codes, &scales).assert_ranges_agree(Dtype::F32);
    let codes: Vec<u8> = (0..4 * 37).map(|k| (k * 5 % 16) as u8).collect();
    let scales: Vec<u8> = (0..8).map(|k| 124 + k).collect();
    mxfp4(&[4, 37], false, &codes, &scales).assert_ranges_agree(Dtype::F16);
}

#[test]
fn mxfp4_refuses_a_transposed_that_is_not_a_boolean_and_a_block_size_not_32() {
    let case = mxfp4(&[2, 64], false, &[0; 128], &[127; 4]);
    assert!(case.accepted());
    assert_refused(
        &case.clone().param("transposed", text("false")),
        &["transposed"],
    );
    assert_refused(&case.clone().param("transposed", int(0)), &["transposed"]);
    assert_refused(
        &case.clone().no_param("transposed"),
        &["transposed", "missing"],
    );
    for n in [16, 31, 33] {
        assert_refused(&case.clone().param("block_size", int(n)), &["block_size"]);
    }
}

#[test]
fn mxfp4_refuses_parts_shaped_for_the_other_transposition() {
    let case = mxfp4(&[2, 64], false, &[0; 128], &[127; 4]);
    let transposed = case.clone().param("transposed", Value::Bool(true));
    assert_refused(&transposed, &["weight", "[64, 2]"]);
    let stored = mxfp4(&[2, 64], true, &[0; 128], &[127; 64]);
    assert!(stored.accepted());
    let f32_scale = case.clone().part("scale", Dtype::F32, &[2, 2], vec![0; 16]);
    assert_refused(&f32_scale, &["scale", "dtype F32"]);
    // F4 must fill whole bytes (spec §5): 3 codes are refused.
    let odd = mxfp4(&[1, 3], false, &[1, 2, 3], &[127]);
    assert_refused(&odd, &["weight"]);
}
