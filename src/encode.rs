//! The writer side of four schemes (spec §6): round-to-nearest quantizers that turn a plain
//! F32, BF16 or F16 tensor into the parts of `int8.rowwise`, `fp8.rowwise`, `mxfp8` or
//! `nvfp4`, which [`crate::decode`] decodes back.
//!
//! - `int8.rowwise`: per row `scale = amax / 127`, `q = clamp(round(x / scale), ±127)`.
//! - `fp8.rowwise`: per row `scale = amax / 448`, `q = E4M3(x / scale)`.
//! - `mxfp8` (OCP MX, blocks of 32, `row_major`): per block the power of two
//!   `X = 2^(⌊log2 amax⌋ − 8)` as `F8_E8M0`, `q = E4M3(x / X)`.
//! - `nvfp4` (blocks of 16, `multiply`, `low_first`, `row_major`): `scale_2 = amax / (448 · 6)`
//!   over the tensor, per block `s = E4M3(amax_b / 6 / scale_2)`, `q = E2M1(x / (s · scale_2))`.
//!
//! Element conversions round to nearest, ties to even, and saturate at the format's largest
//! finite value. A row or block of zeros gets scale 1 (its codes are zeros either way).

use crate::decode::elem;
use crate::format::{Config, Dtype, Value};

/// Schemes this build writes.
pub const SCHEMES: [&str; 4] = ["int8.rowwise", "fp8.rowwise", "mxfp8", "nvfp4"];

/// One part of a quantized tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct OwnedPart {
    /// Its role.
    pub role: &'static str,
    /// Its dtype.
    pub dtype: Dtype,
    /// Its shape.
    pub shape: Vec<u64>,
    /// Its bytes (little-endian).
    pub bytes: Vec<u8>,
}

/// A tensor quantized: the encoding's params and the parts.
#[derive(Clone, Debug, PartialEq)]
pub struct Quantized {
    /// The params of the encoding.
    pub params: Config,
    /// The parts, in the order the scheme lists them.
    pub parts: Vec<OwnedPart>,
}

/// Why a tensor is left as it is.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EncodeError {
    /// The scheme is not one this build writes.
    #[error("scheme {0:?} is not one this build writes (int8.rowwise, fp8.rowwise, mxfp8, nvfp4)")]
    UnknownScheme(String),
    /// The tensor does not fit the scheme (dtype, rank, columns).
    #[error("{0}")]
    Unfit(String),
}

/// Whether `scheme` can encode a tensor of `dtype` and `shape` (float dtype, rank two or more,
/// columns that fill the scheme's blocks, no empty extent).
///
/// # Errors
/// Why not.
pub fn fits(scheme: &str, dtype: &Dtype, shape: &[u64]) -> Result<(), EncodeError> {
    if !SCHEMES.contains(&scheme) {
        return Err(EncodeError::UnknownScheme(scheme.to_owned()));
    }
    if !matches!(dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16) {
        return Err(EncodeError::Unfit(format!(
            "dtype {dtype} is not F32, BF16 or F16"
        )));
    }
    if shape.len() < 2 || shape.contains(&0) {
        return Err(EncodeError::Unfit(format!(
            "shape {shape:?} is not a non-empty matrix"
        )));
    }
    let cols = *shape.last().expect("rank two");
    // NVFP4's tensor is one matrix (spec §6; its decoder refuses a stack or a kernel).
    if scheme == "nvfp4" && shape.len() != 2 {
        return Err(EncodeError::Unfit(format!(
            "nvfp4 holds a matrix, not shape {shape:?}"
        )));
    }
    if scheme == "nvfp4" && !cols.is_multiple_of(16) {
        return Err(EncodeError::Unfit(format!(
            "nvfp4 needs columns in blocks of 16, not {cols}"
        )));
    }
    Ok(())
}

/// The values of a plain tensor's bytes as f32.
fn values(dtype: &Dtype, bytes: &[u8]) -> Vec<f32> {
    elem::floats(dtype, bytes).expect("fits checked the dtype")
}

/// Quantizes a plain tensor (`dtype`, `shape`, `bytes`) with `scheme`.
///
/// # Errors
/// [`EncodeError`] when the tensor does not [`fits`] or holds a value that is not finite.
pub fn quantize(
    scheme: &str,
    dtype: &Dtype,
    shape: &[u64],
    bytes: &[u8],
) -> Result<Quantized, EncodeError> {
    fits(scheme, dtype, shape)?;
    let x = values(dtype, bytes);
    if let Some(bad) = x.iter().find(|v| !v.is_finite()) {
        return Err(EncodeError::Unfit(format!(
            "it holds {bad}, which no scale can carry"
        )));
    }
    let cols = *shape.last().expect("rank two") as usize;
    let rows = x.len() / cols;
    Ok(match scheme {
        "int8.rowwise" | "fp8.rowwise" => rowwise(scheme, &x, shape, rows, cols),
        "mxfp8" => mxfp8(&x, shape, rows, cols),
        _ => nvfp4(&x, shape, rows, cols),
    })
}

fn amax(values: &[f32]) -> f32 {
    values.iter().fold(0f32, |m, v| m.max(v.abs()))
}

/// `amax / limit`, or 1 for a block of zeros.
fn scale_for(amax: f32, limit: f32) -> f32 {
    match amax / limit {
        s if s > 0.0 && s.is_finite() => s,
        _ => 1.0,
    }
}

/// A row is the last dimension: a `[64, 64, 3, 3]` kernel has 12 288 rows of 3. The weight part
/// keeps the tensor's shape (spec §6: the decoder reads it so), the scales are one per row.
fn rowwise(scheme: &str, x: &[f32], shape: &[u64], rows: usize, cols: usize) -> Quantized {
    let int8 = scheme == "int8.rowwise";
    let mut weight = Vec::with_capacity(x.len());
    let mut scales = Vec::with_capacity(rows * 4);
    for row in x.chunks(cols) {
        let s = scale_for(amax(row), if int8 { 127.0 } else { 448.0 });
        for &v in row {
            weight.push(match int8 {
                true => (v / s).round_ties_even().clamp(-127.0, 127.0) as i8 as u8,
                false => e4m3(v / s),
            });
        }
        scales.extend_from_slice(&s.to_le_bytes());
    }
    Quantized {
        params: Config::new(),
        parts: vec![
            OwnedPart {
                role: "weight",
                dtype: if int8 { Dtype::I8 } else { Dtype::F8_E4M3 },
                shape: shape.to_vec(),
                bytes: weight,
            },
            OwnedPart {
                role: "scale",
                dtype: Dtype::F32,
                shape: vec![rows as u64],
                bytes: scales,
            },
        ],
    }
}

fn mxfp8(x: &[f32], shape: &[u64], rows: usize, cols: usize) -> Quantized {
    let width = cols.div_ceil(32);
    let mut weight = Vec::with_capacity(x.len());
    let mut scales = Vec::with_capacity(rows * width);
    for row in x.chunks(cols) {
        for block in row.chunks(32) {
            let a = amax(block);
            // OCP MX: the shared exponent is ⌊log2 amax⌋ minus E4M3's largest exponent (8).
            let exponent = match a > 0.0 {
                true => (a.log2().floor() as i32 - 8).clamp(-127, 127),
                false => 0,
            };
            let scale = (exponent as f64).exp2() as f32;
            scales.push((exponent + 127) as u8);
            weight.extend(block.iter().map(|&v| e4m3(v / scale)));
        }
    }
    let mut scale_shape = shape.to_vec();
    *scale_shape.last_mut().expect("rank two") = width as u64;
    Quantized {
        params: Config::from([
            ("block_size".to_owned(), Value::Uint(32)),
            ("scale_layout".to_owned(), Value::Text("row_major".into())),
        ]),
        parts: vec![
            OwnedPart {
                role: "weight",
                dtype: Dtype::F8_E4M3,
                shape: shape.to_vec(),
                bytes: weight,
            },
            OwnedPart {
                role: "scale",
                dtype: Dtype::F8_E8M0,
                shape: scale_shape,
                bytes: scales,
            },
        ],
    }
}

fn nvfp4(x: &[f32], shape: &[u64], rows: usize, cols: usize) -> Quantized {
    let global = scale_for(amax(x), 448.0 * 6.0);
    let mut weight = vec![0u8; x.len() / 2];
    let mut scales = Vec::with_capacity(rows * cols / 16);
    for (b, block) in x.chunks(16).enumerate() {
        let code = e4m3(amax(block) / 6.0 / global);
        scales.push(code);
        let s = elem::e4m3(code) * global;
        for (k, &v) in block.iter().enumerate() {
            let q = if s > 0.0 { e2m1(v / s) } else { 0 };
            let t = b * 16 + k;
            weight[t / 2] |= q << (4 * (t % 2));
        }
    }
    let mut scale_shape = shape.to_vec();
    *scale_shape.last_mut().expect("rank two") = (cols / 16) as u64;
    Quantized {
        params: Config::from([
            ("block_size".to_owned(), Value::Uint(16)),
            ("global_scale".to_owned(), Value::Text("multiply".into())),
            ("nibble_order".to_owned(), Value::Text("low_first".into())),
            ("scale_layout".to_owned(), Value::Text("row_major".into())),
        ]),
        parts: vec![
            OwnedPart {
                role: "weight",
                dtype: Dtype::F4,
                shape: shape.to_vec(),
                bytes: weight,
            },
            OwnedPart {
                role: "scale",
                dtype: Dtype::F8_E4M3,
                shape: scale_shape,
                bytes: scales,
            },
            OwnedPart {
                role: "scale_2",
                dtype: Dtype::F32,
                shape: vec![],
                bytes: global.to_le_bytes().to_vec(),
            },
        ],
    }
}

/// The code of the finite value nearest `v` among `magnitudes` (ascending, code = index),
/// ties to the even code, saturating; the sign in bit `sign_bit`.
fn nearest(v: f32, magnitudes: &[f32], sign_bit: u8) -> u8 {
    let a = v.abs();
    let i = magnitudes.partition_point(|&m| m < a);
    let code = if i == 0 {
        0
    } else if i == magnitudes.len() {
        i - 1
    } else {
        let (lo, hi) = (magnitudes[i - 1], magnitudes[i]);
        match (a - lo).partial_cmp(&(hi - a)) {
            Some(std::cmp::Ordering::Less) => i - 1,
            Some(std::cmp::Ordering::Greater) => i,
            _ => {
                if (i - 1) % 2 == 0 {
                    i - 1
                } else {
                    i
                }
            }
        }
    };
    (code as u8)
        | if v.is_sign_negative() && code != 0 {
            1 << sign_bit
        } else {
            0
        }
}

/// `v` as F8_E4M3 (round to nearest even, saturating at ±448).
pub fn e4m3(v: f32) -> u8 {
    static MAGNITUDES: std::sync::LazyLock<Vec<f32>> =
        std::sync::LazyLock::new(|| (0u8..0x7F).map(elem::e4m3).collect());
    nearest(v, &MAGNITUDES, 7)
}

/// `v` as E2M1, a 4-bit code (round to nearest even, saturating at ±6).
pub fn e2m1(v: f32) -> u8 {
    nearest(v, &elem::E2M1[..8], 3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{decode, Encoded, Part};

    #[test]
    fn element_conversions_round_to_nearest_even_and_saturate() {
        assert_eq!(e4m3(1.0), 0x38);
        assert_eq!(e4m3(-1.0), 0xB8);
        assert_eq!(e4m3(448.0), 0x7E);
        assert_eq!(e4m3(1e9), 0x7E, "saturates");
        assert_eq!(e4m3(1.0625), 0x38, "a tie goes to the even mantissa");
        assert_eq!(e4m3(1.1875), 0x3A, "a tie goes to the even mantissa");
        assert_eq!(e4m3(0.0), 0);
        assert_eq!(
            e2m1(2.5),
            0x4,
            "a tie between 2 and 3 goes to 2 (even code)"
        );
        assert_eq!(
            e2m1(-5.0),
            0xE,
            "a tie between 4 and 6 goes to 4 (even code)"
        );
        assert_eq!(e2m1(100.0), 0x7);
        assert_eq!(e2m1(-0.1), 0, "rounds to zero without a sign");
        for code in 0u8..0x7F {
            assert_eq!(
                e4m3(elem::e4m3(code)),
                code,
                "every value encodes to its code"
            );
        }
    }

    fn roundtrip(scheme: &str, shape: &[u64]) -> (Vec<f32>, Vec<f32>) {
        let n: u64 = shape.iter().product();
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 97.0)
            .collect();
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let q = quantize(scheme, &Dtype::F32, shape, &bytes).unwrap();
        let tensor = Encoded {
            scheme,
            params: &q.params,
            dtype: &Dtype::F32,
            shape,
            parts: q
                .parts
                .iter()
                .map(|p| Part {
                    role: p.role,
                    dtype: &p.dtype,
                    shape: &p.shape,
                    bytes: &p.bytes,
                })
                .collect(),
        };
        let mut out = vec![0u8; bytes.len()];
        decode(&tensor, &mut out).unwrap();
        (
            x,
            out.chunks(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        )
    }

    #[test]
    fn every_written_scheme_decodes_back_close_to_its_input() {
        for (scheme, bound) in [
            ("int8.rowwise", 0.01),
            ("fp8.rowwise", 0.07),
            ("mxfp8", 0.07),
            ("nvfp4", 0.2),
        ] {
            let (x, y) = roundtrip(scheme, &[6, 64]);
            assert_close(scheme, &x, &y, bound);
        }
        // A convolution's kernel: its rows are the last dimension.
        for (scheme, bound) in [
            ("int8.rowwise", 0.01),
            ("fp8.rowwise", 0.07),
            ("mxfp8", 0.07),
        ] {
            let (x, y) = roundtrip(scheme, &[8, 4, 3, 32]);
            assert_close(scheme, &x, &y, bound);
        }
        assert!(fits("nvfp4", &Dtype::F32, &[8, 4, 3, 32]).is_err());
    }

    fn assert_close(scheme: &str, x: &[f32], y: &[f32], bound: f32) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = x
            .iter()
            .zip(y)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= bound * amax,
            "{scheme}: worst error {worst} of amax {amax}"
        );
    }

    #[test]
    fn tensors_a_scheme_cannot_hold_are_left_plain() {
        assert!(fits("int8.rowwise", &Dtype::F32, &[4]).is_err());
        assert!(fits("int8.rowwise", &Dtype::I64, &[4, 4]).is_err());
        assert!(fits("nvfp4", &Dtype::BF16, &[4, 24]).is_err());
        assert!(fits("nvfp4", &Dtype::BF16, &[4, 32]).is_ok());
        assert!(fits("gptq.int4", &Dtype::BF16, &[4, 32]).is_err());
        let nan: Vec<u8> = [1.0f32, f32::NAN]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert!(quantize("int8.rowwise", &Dtype::F32, &[1, 2], &nan).is_err());
    }
}
