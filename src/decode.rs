//! Decoding encoded tensors (spec §6): parts and an encoding in, the logical tensor out.
//!
//! A scheme is a [`Scheme`] in [`SCHEMES`]: its `prepare` checks the params, parts, dtypes and
//! shapes against the scheme's rules (spec §6 "Reading and decoding": a missing or unknown
//! param or part, a value not listed, a dtype or shape that breaks the rule, or a logical dtype
//! other than F32, BF16 or F16 refuses the decode) and returns a [`Decoder`], which fills any
//! range of rows of the output. Nothing here does I/O: parts arrive as byte slices.
//!
//! Arithmetic follows spec §6 exactly: each operation is one f32 operation in the order the
//! formula writes it, and the result is rounded once to the logical dtype ([`Logical::store`]:
//! round to nearest even, subnormals kept, NaN canonical). Building blocks:
//! - [`elem`]: element formats (F8_E4M3, F8_E5M2, F8_E8M0, E2M1, UE4M3, F16, BF16) to f32.
//! - [`grid`]: where a scale, zero or bias of element `(i, j)` is (tensor, row, column, row
//!   blocks `row_major` / `transposed` / `cublas_128x4`, tiles).
//! - [`pack`]: codes packed in words (`word`, `planar`, `dense` fills; slot orders).
//!
//! Rows: a decoder works on the matrix view `[R, C]` of the logical shape (`C` its last extent,
//! `R` the product of the others; a scalar is `[1, 1]`), whatever the scheme's own grouping,
//! so callers decode a tensor in row ranges with bounded memory and in parallel.

pub mod elem;
pub mod grid;
pub mod pack;

mod bnb;
mod convrot;
mod gguf;
mod grouped;
mod microscaled;
mod scaled;

use std::fmt;

use rayon::prelude::*;

use crate::format::{Config, Dtype, Value};

/// A logical dtype a decode produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logical {
    /// IEEE binary32.
    F32,
    /// bfloat16.
    BF16,
    /// IEEE binary16.
    F16,
}

impl Logical {
    /// The logical dtype of `dtype`, if a decode may produce it.
    pub fn of(dtype: &Dtype) -> Option<Logical> {
        match dtype {
            Dtype::F32 => Some(Logical::F32),
            Dtype::BF16 => Some(Logical::BF16),
            Dtype::F16 => Some(Logical::F16),
            _ => None,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Logical::F32 => 4,
            Logical::BF16 | Logical::F16 => 2,
        }
    }

    /// Writes `v` rounded to this dtype (spec §6 `round_L`) as little-endian bytes at the start
    /// of `out`: F32 unchanged; BF16 and F16 rounded to nearest, ties to even, subnormals kept,
    /// F16 overflowing to ±infinity; any NaN as the canonical quiet NaN (`0x7FC00000`,
    /// `0x7FC0`, `0x7E00`).
    #[inline]
    pub fn store(self, v: f32, out: &mut [u8]) {
        match self {
            Logical::F32 => {
                let bits = if v.is_nan() { 0x7FC0_0000 } else { v.to_bits() };
                out[..4].copy_from_slice(&bits.to_le_bytes());
            }
            Logical::BF16 => {
                let bits = if v.is_nan() {
                    0x7FC0
                } else {
                    half::bf16::from_f32(v).to_bits()
                };
                out[..2].copy_from_slice(&bits.to_le_bytes());
            }
            Logical::F16 => {
                let bits = if v.is_nan() {
                    0x7E00
                } else {
                    half::f16::from_f32(v).to_bits()
                };
                out[..2].copy_from_slice(&bits.to_le_bytes());
            }
        }
    }
}

impl Logical {
    /// Writes every value of `values` rounded as [`Logical::store`] does, in order, into
    /// `out` (exactly `values.len() × size` bytes). Written as straight loops over slices so
    /// the compiler vectorizes them; F16 goes through `half`'s slice conversion (F16C where the
    /// CPU has it), then NaNs are made canonical.
    pub fn store_all(self, values: &[f32], out: &mut [u8]) {
        debug_assert_eq!(out.len(), values.len() * self.size());
        match self {
            Logical::F32 => {
                for (v, o) in values.iter().zip(out.chunks_exact_mut(4)) {
                    let bits = if v.is_nan() { 0x7FC0_0000 } else { v.to_bits() };
                    o.copy_from_slice(&bits.to_le_bytes());
                }
            }
            Logical::BF16 => {
                for (v, o) in values.iter().zip(out.chunks_exact_mut(2)) {
                    let b = v.to_bits();
                    // Round to nearest, ties to even, on the bits; NaN made canonical.
                    let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
                    let bits = if v.is_nan() { 0x7FC0 } else { rounded };
                    o.copy_from_slice(&bits.to_le_bytes());
                }
            }
            Logical::F16 => {
                use half::slice::HalfFloatSliceExt;
                let mut halves = [half::f16::ZERO; 256];
                for (vs, os) in values.chunks(256).zip(out.chunks_mut(512)) {
                    let halves = &mut halves[..vs.len()];
                    halves.convert_from_f32_slice(vs);
                    for (h, o) in halves.iter().zip(os.chunks_exact_mut(2)) {
                        let bits = if h.is_nan() { 0x7E00 } else { h.to_bits() };
                        o.copy_from_slice(&bits.to_le_bytes());
                    }
                }
            }
        }
    }
}

/// Why a tensor cannot be decoded. The caller adds the tensor's name and file.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum DecodeError {
    /// The scheme is not one this build knows; the tensor still reads as raw parts.
    #[error("scheme {0:?} is not one this build decodes (its parts still read as stored)")]
    UnknownScheme(String),
    /// A param the scheme does not define.
    #[error(
        "{scheme}: unknown param {param:?} (params drive the decode, so an unknown one refuses it)"
    )]
    UnknownParam {
        /// The scheme.
        scheme: String,
        /// The param.
        param: String,
    },
    /// A param the scheme needs is missing.
    #[error("{scheme}: param {param:?} is missing")]
    MissingParam {
        /// The scheme.
        scheme: String,
        /// The param.
        param: &'static str,
    },
    /// A param's value is not one the scheme lists.
    #[error("{scheme}: param {param:?} is {value}, not {allowed}")]
    BadParam {
        /// The scheme.
        scheme: String,
        /// The param.
        param: &'static str,
        /// The value found.
        value: String,
        /// What the scheme allows.
        allowed: String,
    },
    /// A part the scheme needs is missing.
    #[error("{scheme}: part {role:?} is missing")]
    MissingPart {
        /// The scheme.
        scheme: String,
        /// The role.
        role: &'static str,
    },
    /// A part the scheme does not list.
    #[error("{scheme}: part {role:?} is not one of this scheme's")]
    ExtraPart {
        /// The scheme.
        scheme: String,
        /// The role.
        role: String,
    },
    /// A part's dtype, shape or bytes break the scheme's rule.
    #[error("{scheme}: part {role:?}: {why}")]
    BadPart {
        /// The scheme.
        scheme: String,
        /// The role.
        role: String,
        /// What is wrong.
        why: String,
    },
    /// The logical dtype or shape cannot be decoded to.
    #[error("{scheme}: {why}")]
    BadTensor {
        /// The scheme.
        scheme: String,
        /// What is wrong.
        why: String,
    },
    /// The values themselves refuse the decode (a NaN the scheme forbids, a code outside a
    /// table, a zero that breaks `symmetric`).
    #[error("{scheme}: {why}")]
    Refused {
        /// The scheme.
        scheme: String,
        /// What was found.
        why: String,
    },
}

/// Result of decoding.
pub type DecodeResult<T> = Result<T, DecodeError>;

/// One stored part of an encoded tensor, with its bytes.
#[derive(Clone, Copy, Debug)]
pub struct Part<'a> {
    /// The role (`weight`, `scale`).
    pub role: &'a str,
    /// The stored dtype.
    pub dtype: &'a Dtype,
    /// The stored shape.
    pub shape: &'a [u64],
    /// Exactly the part's bytes (dtype × shape).
    pub bytes: &'a [u8],
}

impl Part<'_> {
    /// The part's elements as f32, exactly (F32, BF16, F16 or an 8-bit float format).
    ///
    /// # Panics
    /// On another dtype: callers check the part's dtype first ([`Parts::dtype`]).
    pub fn floats(&self) -> Vec<f32> {
        elem::floats(self.dtype, self.bytes).expect("a checked float dtype")
    }
}

/// An encoded tensor to decode: its encoding, logical dtype and shape, and parts.
#[derive(Clone, Debug)]
pub struct Encoded<'a> {
    /// The scheme name.
    pub scheme: &'a str,
    /// The params.
    pub params: &'a Config,
    /// The logical dtype (F32, BF16 or F16).
    pub dtype: &'a Dtype,
    /// The logical shape.
    pub shape: &'a [u64],
    /// The parts, in any order.
    pub parts: Vec<Part<'a>>,
}

/// A prepared decode: every check done, output by rows of the matrix view.
pub trait Decoder: Sync {
    /// Fills `out` with rows `first..first + n` of the `[R, C]` view in the logical dtype,
    /// where `n = out.len() / (C × size)`.
    ///
    /// # Errors
    /// A value refuses the decode ([`DecodeError::Refused`]).
    fn rows(&self, first: u64, out: &mut [u8]) -> DecodeResult<()>;
}

/// A scheme: its name and how to prepare a decoder.
pub struct Scheme {
    /// `family.variant`.
    pub name: &'static str,
    /// Checks a tensor against the scheme and prepares its decoder.
    pub prepare: for<'a> fn(&Encoded<'a>, Logical, View) -> DecodeResult<Box<dyn Decoder + 'a>>,
}

impl fmt::Debug for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// Every scheme this build decodes, by family.
pub static SCHEMES: &[&[Scheme]] = &[
    &scaled::SCHEMES,
    &microscaled::SCHEMES,
    &convrot::SCHEMES,
    &gguf::SCHEMES,
    &grouped::SCHEMES,
    &bnb::SCHEMES,
];

/// The scheme called `name`.
pub fn scheme(name: &str) -> Option<&'static Scheme> {
    SCHEMES
        .iter()
        .flat_map(|family| family.iter())
        .find(|s| s.name == name)
}

/// The matrix view `[R, C]` of a logical shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct View {
    /// Rows: the product of every extent but the last (1 for rank 0 and 1).
    pub rows: u64,
    /// Columns: the last extent (1 for a scalar).
    pub cols: u64,
}

impl View {
    /// The view of `shape`.
    ///
    /// # Errors
    /// The element count overflows.
    pub fn of(shape: &[u64]) -> Option<View> {
        let cols = shape.last().copied().unwrap_or(1);
        let mut rows: u64 = 1;
        for &extent in shape.iter().rev().skip(1) {
            rows = rows.checked_mul(extent)?;
        }
        rows.checked_mul(cols)?;
        Some(View { rows, cols })
    }

    /// Elements in all.
    pub fn len(self) -> u64 {
        self.rows * self.cols
    }

    /// Whether it holds no element.
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }
}

/// Prepares `tensor`'s decoder.
///
/// # Errors
/// An unknown scheme, or any rule of the scheme the tensor breaks.
pub fn prepare<'a>(tensor: &Encoded<'a>) -> DecodeResult<Box<dyn Decoder + 'a>> {
    let scheme = scheme(tensor.scheme)
        .ok_or_else(|| DecodeError::UnknownScheme(tensor.scheme.to_owned()))?;
    let logical = Logical::of(tensor.dtype).ok_or_else(|| DecodeError::BadTensor {
        scheme: tensor.scheme.to_owned(),
        why: format!(
            "the logical dtype is {}, not F32, BF16 or F16",
            tensor.dtype
        ),
    })?;
    let view = View::of(tensor.shape).ok_or_else(|| DecodeError::BadTensor {
        scheme: tensor.scheme.to_owned(),
        why: format!("shape {:?} overflows", tensor.shape),
    })?;
    (scheme.prepare)(tensor, logical, view)
}

/// Rows decoded per task when a tensor is decoded on every core (about 1 MiB of output).
const PARALLEL_BYTES: usize = 1 << 20;

/// Decodes the whole of `tensor` into `out` (exactly its logical byte size), on every core
/// for large tensors.
///
/// # Errors
/// As [`prepare`] and [`Decoder::rows`]; `out` of the wrong size.
pub fn decode(tensor: &Encoded<'_>, out: &mut [u8]) -> DecodeResult<()> {
    let decoder = prepare(tensor)?;
    let logical = Logical::of(tensor.dtype).expect("prepare checked");
    let view = View::of(tensor.shape).expect("prepare checked");
    let row_bytes = view.cols as usize * logical.size();
    if out.len() as u64 != view.len() * logical.size() as u64 {
        return Err(DecodeError::BadTensor {
            scheme: tensor.scheme.to_owned(),
            why: format!(
                "the output holds {} bytes, not {}",
                out.len(),
                view.len() * logical.size() as u64
            ),
        });
    }
    if row_bytes == 0 {
        return Ok(());
    }
    let rows_per_task = (PARALLEL_BYTES / row_bytes).max(1);
    let task = |(i, chunk): (usize, &mut [u8])| decoder.rows((i * rows_per_task) as u64, chunk);
    if !crate::sync::pool_usable() {
        return out
            .chunks_mut(rows_per_task * row_bytes)
            .enumerate()
            .try_for_each(task);
    }
    out.par_chunks_mut(rows_per_task * row_bytes)
        .enumerate()
        .try_for_each(task)
}

/// Reads params, refusing unknown ones.
pub struct Params<'a> {
    scheme: &'a str,
    params: &'a Config,
}

impl<'a> Params<'a> {
    /// The params of `tensor`, which may hold only `known`.
    ///
    /// # Errors
    /// A param not in `known`.
    pub fn new(tensor: &Encoded<'a>, known: &[&str]) -> DecodeResult<Params<'a>> {
        if let Some(unknown) = tensor.params.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(DecodeError::UnknownParam {
                scheme: tensor.scheme.to_owned(),
                param: unknown.clone(),
            });
        }
        Ok(Params {
            scheme: tensor.scheme,
            params: tensor.params,
        })
    }

    fn get(&self, name: &'static str) -> DecodeResult<&'a Value> {
        self.params
            .get(name)
            .ok_or_else(|| DecodeError::MissingParam {
                scheme: self.scheme.to_owned(),
                param: name,
            })
    }

    fn bad(&self, name: &'static str, value: &Value, allowed: impl Into<String>) -> DecodeError {
        DecodeError::BadParam {
            scheme: self.scheme.to_owned(),
            param: name,
            value: format!("{value:?}"),
            allowed: allowed.into(),
        }
    }

    /// An integer param accepted by `ok` (described by `allowed` in errors).
    ///
    /// # Errors
    /// Missing, not an integer, or refused by `ok`.
    pub fn int(
        &self,
        name: &'static str,
        allowed: &str,
        ok: impl Fn(i128) -> bool,
    ) -> DecodeResult<i128> {
        let value = self.get(name)?;
        match value.as_int() {
            Some(n) if ok(n) => Ok(n),
            _ => Err(self.bad(name, value, allowed)),
        }
    }

    /// A boolean param.
    ///
    /// # Errors
    /// Missing or not a boolean.
    pub fn bool(&self, name: &'static str) -> DecodeResult<bool> {
        match self.get(name)? {
            Value::Bool(b) => Ok(*b),
            other => Err(self.bad(name, other, "true or false")),
        }
    }

    /// A text param, one of `choices`; returns its index there.
    ///
    /// # Errors
    /// Missing, not text, or not one of `choices`.
    pub fn choice(&self, name: &'static str, choices: &[&str]) -> DecodeResult<usize> {
        let value = self.get(name)?;
        value
            .as_text()
            .and_then(|t| choices.iter().position(|c| *c == t))
            .ok_or_else(|| self.bad(name, value, choices.join(" or ")))
    }

    /// The raw value of an optional param.
    pub fn raw(&self, name: &str) -> Option<&'a Value> {
        self.params.get(name)
    }
}

/// Finds parts by role, refusing roles the scheme does not list.
pub struct Parts<'t, 'a> {
    tensor: &'t Encoded<'a>,
}

impl<'t, 'a> Parts<'t, 'a> {
    /// The parts of `tensor`, whose roles must all be in `known`.
    ///
    /// # Errors
    /// A part of another role, or a role given twice.
    pub fn new(tensor: &'t Encoded<'a>, known: &[&str]) -> DecodeResult<Parts<'t, 'a>> {
        for (i, part) in tensor.parts.iter().enumerate() {
            if !known.contains(&part.role) || tensor.parts[..i].iter().any(|p| p.role == part.role)
            {
                return Err(DecodeError::ExtraPart {
                    scheme: tensor.scheme.to_owned(),
                    role: part.role.to_owned(),
                });
            }
        }
        Ok(Parts { tensor })
    }

    /// The part of `role`, which must exist.
    ///
    /// # Errors
    /// Missing.
    pub fn required(&self, role: &'static str) -> DecodeResult<Part<'a>> {
        self.optional(role).ok_or_else(|| DecodeError::MissingPart {
            scheme: self.tensor.scheme.to_owned(),
            role,
        })
    }

    /// The part of `role`, if any.
    pub fn optional(&self, role: &str) -> Option<Part<'a>> {
        self.tensor.parts.iter().find(|p| p.role == role).copied()
    }

    /// A [`DecodeError::BadPart`] for `part`.
    pub fn bad(&self, part: &Part<'_>, why: impl Into<String>) -> DecodeError {
        DecodeError::BadPart {
            scheme: self.tensor.scheme.to_owned(),
            role: part.role.to_owned(),
            why: why.into(),
        }
    }

    /// Checks that `part`'s dtype is one of `dtypes`.
    ///
    /// # Errors
    /// Another dtype.
    pub fn dtype(&self, part: &Part<'_>, dtypes: &[Dtype]) -> DecodeResult<()> {
        if dtypes.contains(part.dtype) {
            return Ok(());
        }
        let names: Vec<&str> = dtypes.iter().map(Dtype::name).collect();
        Err(self.bad(
            part,
            format!("dtype {} is not {}", part.dtype, names.join(" or ")),
        ))
    }

    /// Checks that `part`'s shape is exactly `shape`.
    ///
    /// # Errors
    /// Another shape.
    pub fn shape(&self, part: &Part<'_>, shape: &[u64]) -> DecodeResult<()> {
        if part.shape == shape {
            return Ok(());
        }
        Err(self.bad(part, format!("shape {:?} is not {shape:?}", part.shape)))
    }

    /// Checks that `part` holds exactly `n` elements, in any shape.
    ///
    /// # Errors
    /// Another count.
    pub fn elements(&self, part: &Part<'_>, n: u64) -> DecodeResult<()> {
        let count = part
            .shape
            .iter()
            .try_fold(1u64, |acc, &e| acc.checked_mul(e));
        if count == Some(n) {
            return Ok(());
        }
        Err(self.bad(
            part,
            format!("shape {:?} does not hold {n} elements", part.shape),
        ))
    }

    /// Checks that `part` holds exactly the bytes its dtype and shape declare (spec §5), so a
    /// decoder may index them without bounds surprises.
    ///
    /// # Errors
    /// Another length, or a dtype of unknown width.
    pub fn sized(&self, part: &Part<'_>) -> DecodeResult<()> {
        match part.dtype.byte_len(part.shape) {
            Ok(Some(n)) if n == part.bytes.len() as u64 => Ok(()),
            _ => Err(self.bad(
                part,
                format!(
                    "{} bytes are not those of {} {:?}",
                    part.bytes.len(),
                    part.dtype,
                    part.shape
                ),
            )),
        }
    }

    /// A refusal of `tensor`'s logical shape or dtype.
    pub fn bad_tensor(&self, why: impl Into<String>) -> DecodeError {
        DecodeError::BadTensor {
            scheme: self.tensor.scheme.to_owned(),
            why: why.into(),
        }
    }
}

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
