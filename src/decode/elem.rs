//! Element formats (spec §5) to f32, exactly. The 8-bit formats are table lookups.

use std::sync::LazyLock;

use crate::format::Dtype;

/// `F8_E4M3` (OCP "fn"): sign bit 7, exponent bits 3–6 (bias 7), mantissa bits 0–2;
/// `e = 0`: `m × 2^−9`; else `(1 + m/8) × 2^(e−7)`; `S.1111.111` is NaN; no infinities.
pub fn e4m3(b: u8) -> f32 {
    E4M3[b as usize]
}

/// The [`e4m3`] values of all 256 bytes, for loops that look up many.
pub fn e4m3_table() -> &'static [f32; 256] {
    &E4M3
}

/// The [`e5m2`] values of all 256 bytes.
pub fn e5m2_table() -> &'static [f32; 256] {
    &E5M2
}

/// The [`e8m0`] values of all 256 bytes.
pub fn e8m0_table() -> &'static [f32; 256] {
    &E8M0
}

/// `F8_E5M2`: sign bit 7, exponent bits 2–6 (bias 15), mantissa bits 0–1; `e = 0`:
/// `m × 2^−16`; `e = 31`: infinity if `m = 0`, else NaN; else `(1 + m/4) × 2^(e−15)`.
pub fn e5m2(b: u8) -> f32 {
    E5M2[b as usize]
}

/// `F8_E8M0`: `2^(b−127)` for `b < 255`; 255 is NaN.
pub fn e8m0(b: u8) -> f32 {
    E8M0[b as usize]
}

/// UE4M3 (ggml's unsigned E4M3 inside structs): bit 7 ignored, exponent bits 3–6 (bias 7),
/// mantissa bits 0–2, no NaN; the byte `0x7F` (and only that byte: `0xFF` is 480) is zero, as
/// ggml's `ggml_ue4m3_to_fp32`, gguf-py and the reference read it.
pub fn ue4m3(b: u8) -> f32 {
    UE4M3[b as usize]
}

/// The 16 E2M1 (`F4`) values by code: sign bit 3, bits 0–2 index
/// `0, 0.5, 1, 1.5, 2, 3, 4, 6`.
pub const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// An IEEE binary16 to f32 (exact).
#[inline]
pub fn f16(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// A bfloat16 to f32 (exact).
#[inline]
pub fn bf16(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// The table of the 8-bit float format `dtype` names ([`e4m3_table`], [`e5m2_table`],
/// [`e8m0_table`]), for a decoder that reads the part's dtype; `None` for any other dtype.
pub fn table(dtype: &Dtype) -> Option<&'static [f32; 256]> {
    match dtype {
        Dtype::F8_E4M3 => Some(e4m3_table()),
        Dtype::F8_E5M2 => Some(e5m2_table()),
        Dtype::F8_E8M0 => Some(e8m0_table()),
        _ => None,
    }
}

/// A part's elements as f32, exactly: `F32`, `BF16`, `F16` (little-endian) or an 8-bit float
/// format of [`table`]; `None` for any other dtype.
pub fn floats(dtype: &Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    let halves = |f: fn(u16) -> f32| {
        bytes
            .chunks_exact(2)
            .map(|c| f(u16::from_le_bytes([c[0], c[1]])))
            .collect()
    };
    Some(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::BF16 => halves(bf16),
        Dtype::F16 => halves(f16),
        other => {
            let t = table(other)?;
            bytes.iter().map(|&b| t[b as usize]).collect()
        }
    })
}

/// `(1 + m/2^mbits) × 2^(e−bias)` or the subnormal `m × 2^(1−bias−mbits)`, exactly.
fn minifloat(e: u32, m: u32, bias: i32, mbits: u32) -> f32 {
    let scale = |p: i32| (p as f64).exp2();
    let v = if e == 0 {
        m as f64 * scale(1 - bias - mbits as i32)
    } else {
        (1.0 + m as f64 / (1u32 << mbits) as f64) * scale(e as i32 - bias)
    };
    v as f32
}

fn build(f: impl Fn(u8) -> f32) -> [f32; 256] {
    std::array::from_fn(|b| f(b as u8))
}

fn signed(b: u8, magnitude: f32) -> f32 {
    if b & 0x80 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

static E4M3: LazyLock<[f32; 256]> = LazyLock::new(|| {
    build(|b| {
        let (e, m) = ((b >> 3) as u32 & 15, b as u32 & 7);
        if e == 15 && m == 7 {
            return f32::NAN;
        }
        signed(b, minifloat(e, m, 7, 3))
    })
});

static E5M2: LazyLock<[f32; 256]> = LazyLock::new(|| {
    build(|b| {
        let (e, m) = ((b >> 2) as u32 & 31, b as u32 & 3);
        match (e, m) {
            (31, 0) => signed(b, f32::INFINITY),
            (31, _) => f32::NAN,
            _ => signed(b, minifloat(e, m, 15, 2)),
        }
    })
});

static E8M0: LazyLock<[f32; 256]> = LazyLock::new(|| {
    build(|b| match b {
        255 => f32::NAN,
        b => ((b as i32 - 127) as f64).exp2() as f32,
    })
});

static UE4M3: LazyLock<[f32; 256]> = LazyLock::new(|| {
    build(|b| match b {
        0x7F => 0.0,
        b => minifloat(((b & 0x7F) >> 3) as u32, b as u32 & 7, 7, 3),
    })
});

/// A row-major `rows × cols` matrix of `width`-byte elements, transposed: the `cols × rows`
/// matrix whose element `(c, r)` is `bytes`' `(r, c)`. Byte order within an element is kept.
///
/// # Panics
/// `bytes` is not `rows * cols * width` long.
pub fn transpose(bytes: &[u8], rows: usize, cols: usize, width: usize) -> Vec<u8> {
    assert_eq!(bytes.len(), rows * cols * width, "a {rows}×{cols} matrix");
    let mut out = vec![0u8; bytes.len()];
    for r in 0..rows {
        for c in 0..cols {
            let from = (r * cols + c) * width;
            let to = (c * rows + r) * width;
            out[to..to + width].copy_from_slice(&bytes[from..from + width]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_matches_the_spec_at_its_edges() {
        assert_eq!(e4m3(0x00), 0.0);
        assert_eq!(e4m3(0x80).to_bits(), (-0.0f32).to_bits());
        assert_eq!(e4m3(0x01), 2f32.powi(-9));
        assert_eq!(e4m3(0x08), 2f32.powi(-6));
        assert_eq!(e4m3(0x7E), 448.0);
        assert!(e4m3(0x7F).is_nan() && e4m3(0xFF).is_nan());
        assert_eq!(e4m3(0x38), 1.0);
    }

    #[test]
    fn e5m2_has_infinities_and_nans() {
        assert_eq!(e5m2(0x7C), f32::INFINITY);
        assert_eq!(e5m2(0xFC), f32::NEG_INFINITY);
        assert!(e5m2(0x7D).is_nan());
        assert_eq!(e5m2(0x7B), 57344.0);
        assert_eq!(e5m2(0x01), 2f32.powi(-16));
        assert_eq!(e5m2(0x3C), 1.0);
    }

    #[test]
    fn e8m0_spans_two_to_the_minus_127_to_127() {
        assert_eq!(e8m0(127), 1.0);
        assert_eq!(e8m0(0), 2f32.powi(-127));
        assert_eq!(e8m0(254), 2f32.powi(127));
        assert!(e8m0(255).is_nan());
    }

    #[test]
    fn ue4m3_ignores_the_sign_and_reads_only_the_byte_0x7f_as_zero() {
        assert_eq!(ue4m3(0x38), 1.0);
        assert_eq!(ue4m3(0xB8), 1.0);
        assert_eq!(ue4m3(0x7F), 0.0);
        assert_eq!(ue4m3(0xFF), 480.0);
        assert_eq!(ue4m3(0x7E), 448.0);
    }

    #[test]
    fn floats_reads_every_scale_dtype_and_refuses_others() {
        assert_eq!(floats(&Dtype::F32, &1.5f32.to_le_bytes()), Some(vec![1.5]));
        assert_eq!(floats(&Dtype::BF16, &[0x80, 0x3F]), Some(vec![1.0]));
        assert_eq!(floats(&Dtype::F16, &[0x00, 0x3C]), Some(vec![1.0]));
        assert_eq!(floats(&Dtype::F8_E8M0, &[128]), Some(vec![2.0]));
        assert_eq!(floats(&Dtype::F8_E4M3, &[0x7E]), Some(vec![448.0]));
        assert_eq!(floats(&Dtype::I8, &[1]), None);
        assert_eq!(table(&Dtype::F8_E5M2).unwrap()[0x3C], 1.0);
    }

    #[test]
    fn half_formats_convert_exactly() {
        assert_eq!(f16(0x3C00), 1.0);
        assert_eq!(f16(0x0001), 2f32.powi(-24));
        assert_eq!(bf16(0x3F80), 1.0);
        assert_eq!(bf16(0x0001), f32::from_bits(0x0001_0000));
    }

    #[test]
    fn transpose_moves_whole_elements() {
        // [[1, 2, 3], [4, 5, 6]] of 2-byte elements.
        let m: Vec<u8> = [1u16, 2, 3, 4, 5, 6]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let t: Vec<u16> = super::transpose(&m, 2, 3, 2)
            .chunks(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        assert_eq!(t, [1, 4, 2, 5, 3, 6]);
        assert_eq!(super::transpose(&super::transpose(&m, 2, 3, 2), 3, 2, 2), m);
    }
}
