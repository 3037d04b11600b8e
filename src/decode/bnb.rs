//! bitsandbytes weights: `bnb.nf4`, `bnb.fp4` and `bnb.int8` (spec §6).
//!
//! - `bnb.nf4`, `bnb.fp4`: the tensor flattened row-major, a 4-bit code per element (two to a
//!   byte, the first in the high nibble) indexing a fixed table `T` (Appendix A.3, A.4), in
//!   blocks of `block_size` elements each scaled by its absmax: `round_L(T[q] × s_b)`. With
//!   `double_quant` the absmax are 8-bit codes themselves:
//!   `s_b = (nested_quant_map[absmax[b]] × nested_absmax[⌊b/256⌋]) + nested_offset`.
//!   The stored `quant_map` must equal `T` as numbers; the decode reads `T` (FP4's code 8 is −0
//!   there, +0 in the map bnb stores).
//! - `bnb.int8`: LLM.int8() rows, `round_L((weight[i, j] × SCB[i]) × r)` with `r` the f32
//!   nearest 1/127 (bnb multiplies by it, so this is not `int8.rowwise`).
//!
//! `prepare` computes every block's scale `s_b` once; a row then decodes with a 16-entry table
//! `T[q] × s_b` per block, which is the same f32 product the formula takes element by element.

use super::{DecodeError, DecodeResult, Decoder, Encoded, Logical, Params, Parts, View};
use crate::format::Dtype;

/// Appendix A.3: the NF4 table, by code.
pub(crate) const NF4: [f32; 16] = [
    -1.0,
    -0.696_192_8,
    -0.525_073_05,
    -0.394_917_5,
    -0.284_441_38,
    -0.184_773_43,
    -0.091_050_036,
    0.0,
    0.079_580_3,
    0.160_930_2,
    0.246_112_3,
    0.337_915_24,
    0.440_709_83,
    0.562_617,
    0.722_956_84,
    1.0,
];

/// Appendix A.4: the FP4 table, by code, as bnb's kernels decode it: bit 3 is the sign, so
/// code 8 is −0.
pub(crate) const FP4: [f32; 16] = [
    0.0,
    0.005_208_333_5,
    0.666_666_7,
    1.0,
    0.333_333_34,
    0.5,
    0.166_666_67,
    0.25,
    -0.0,
    -0.005_208_333_5,
    -0.666_666_7,
    -1.0,
    -0.333_333_34,
    -0.5,
    -0.166_666_67,
    -0.25,
];

/// The block sizes `block_size` may take.
const BLOCK_SIZES: [i128; 8] = [32, 64, 128, 256, 512, 1024, 2048, 4096];

/// Absmax blocks per nested block with `double_quant` (bnb's `nested_blocksize`).
const NESTED_BLOCK: u64 = 256;

/// The f32 nearest 1/127 (bits `0x3C010204`), which `bnb.int8` multiplies by.
const R127: f32 = f32::from_bits(0x3C01_0204);

/// The parts only `double_quant` has.
const NESTED: [&str; 3] = ["nested_absmax", "nested_quant_map", "nested_offset"];

/// A prepared 4-bit decode.
struct FourBit<'a> {
    /// `⌈n/2⌉` bytes, element `2k` in the high nibble of byte `k`.
    codes: &'a [u8],
    table: &'static [f32; 16],
    /// `s_b` per block.
    scales: Vec<f32>,
    block: usize,
    cols: usize,
    logical: Logical,
}

impl Decoder for FourBit<'_> {
    fn rows(&self, first: u64, out: &mut [u8]) -> DecodeResult<()> {
        let cols = self.cols;
        if cols == 0 || out.is_empty() {
            return Ok(());
        }
        let mut values = vec![0f32; cols];
        let mut lut = [0f32; 16];
        for (r, row_out) in out.chunks_exact_mut(cols * self.logical.size()).enumerate() {
            // `t`: the flat index of the next element; the row is cut at block edges.
            let mut t = (first as usize + r) * cols;
            let mut done = 0;
            while done < cols {
                let b = t / self.block;
                let run = (cols - done).min((b + 1) * self.block - t);
                let s = self.scales[b];
                for (l, &v) in lut.iter_mut().zip(self.table) {
                    *l = v * s;
                }
                for (k, v) in values[done..done + run].iter_mut().enumerate() {
                    let e = t + k;
                    let byte = self.codes[e / 2];
                    let q = (byte >> (4 * (1 - (e & 1)))) & 15;
                    *v = lut[q as usize];
                }
                t += run;
                done += run;
            }
            self.logical.store_all(&values, row_out);
        }
        Ok(())
    }
}

/// `bnb.nf4` or `bnb.fp4` with its `table` (spec §6 `bnb.nf4, bnb.fp4`).
fn prepare_four_bit<'a>(
    tensor: &Encoded<'a>,
    logical: Logical,
    view: View,
    table: &'static [f32; 16],
) -> DecodeResult<Box<dyn Decoder + 'a>> {
    let params = Params::new(tensor, &["block_size", "double_quant"])?;
    let block = params.int(
        "block_size",
        "32, 64, 128, 256, 512, 1024, 2048 or 4096",
        |n| BLOCK_SIZES.contains(&n),
    )? as u64;
    let double_quant = params.bool("double_quant")?;
    let parts = Parts::new(
        tensor,
        &[
            "weight",
            "quant_map",
            "absmax",
            "nested_absmax",
            "nested_quant_map",
            "nested_offset",
        ],
    )?;
    let n = view.len();
    let blocks = n.div_ceil(block);

    let weight = parts.required("weight")?;
    parts.dtype(&weight, &[Dtype::U8])?;
    parts.shape(&weight, &[n.div_ceil(2), 1])?;
    parts.sized(&weight)?;

    let quant_map = parts.required("quant_map")?;
    parts.dtype(&quant_map, &[Dtype::F32])?;
    parts.shape(&quant_map, &[16])?;
    parts.sized(&quant_map)?;
    let stored = quant_map.floats();
    // As numbers: bnb stores FP4's code 8 as +0, which equals −0.
    if let Some(q) = (0..16).find(|&q| stored[q] != table[q]) {
        return Err(DecodeError::Refused {
            scheme: tensor.scheme.to_owned(),
            why: format!(
                "quant_map[{q}] is {:?}, not the scheme's table value {:?} (Appendix A)",
                stored[q], table[q]
            ),
        });
    }

    let absmax = parts.required("absmax")?;
    let absmax_dtype = if double_quant { Dtype::U8 } else { Dtype::F32 };
    if absmax.dtype != &absmax_dtype {
        return Err(parts.bad(
            &absmax,
            format!(
                "dtype {} is not {absmax_dtype} (double_quant is {double_quant})",
                absmax.dtype
            ),
        ));
    }
    parts.shape(&absmax, &[blocks])?;
    parts.sized(&absmax)?;

    let scales = if double_quant {
        let nested_absmax = parts.required("nested_absmax")?;
        parts.dtype(&nested_absmax, &[Dtype::F32])?;
        parts.shape(&nested_absmax, &[blocks.div_ceil(NESTED_BLOCK)])?;
        parts.sized(&nested_absmax)?;
        let nested_map = parts.required("nested_quant_map")?;
        parts.dtype(&nested_map, &[Dtype::F32])?;
        parts.shape(&nested_map, &[256])?;
        parts.sized(&nested_map)?;
        let offset = parts.required("nested_offset")?;
        parts.dtype(&offset, &[Dtype::F32])?;
        parts.elements(&offset, 1)?;
        parts.sized(&offset)?;
        let nested_absmax = nested_absmax.floats();
        let nested_map = nested_map.floats();
        let offset = offset.floats()[0];
        (absmax.bytes.iter().enumerate())
            .map(|(b, &code)| {
                (nested_map[code as usize] * nested_absmax[b / NESTED_BLOCK as usize]) + offset
            })
            .collect()
    } else {
        if let Some(extra) = NESTED.iter().find_map(|r| parts.optional(r)) {
            return Err(parts.bad(&extra, "present, but double_quant is false"));
        }
        absmax.floats()
    };
    Ok(Box::new(FourBit {
        codes: weight.bytes,
        table,
        scales,
        block: block as usize,
        cols: view.cols as usize,
        logical,
    }))
}

/// A prepared LLM.int8() decode.
struct Int8<'a> {
    weight: &'a [u8],
    scb: Vec<f32>,
    cols: usize,
    logical: Logical,
}

impl Decoder for Int8<'_> {
    fn rows(&self, first: u64, out: &mut [u8]) -> DecodeResult<()> {
        let cols = self.cols;
        if cols == 0 || out.is_empty() {
            return Ok(());
        }
        let mut values = vec![0f32; cols];
        for (r, row_out) in out.chunks_exact_mut(cols * self.logical.size()).enumerate() {
            let i = first as usize + r;
            let s = self.scb[i];
            let row = &self.weight[i * cols..(i + 1) * cols];
            for (v, &w) in values.iter_mut().zip(row) {
                *v = (w as i8 as f32 * s) * R127;
            }
            self.logical.store_all(&values, row_out);
        }
        Ok(())
    }
}

/// `bnb.int8` (spec §6 `bnb.int8`).
fn prepare_int8<'a>(
    tensor: &Encoded<'a>,
    logical: Logical,
    view: View,
) -> DecodeResult<Box<dyn Decoder + 'a>> {
    Params::new(tensor, &[])?;
    let parts = Parts::new(tensor, &["weight", "SCB", "weight_format"])?;
    if tensor.shape.len() != 2 {
        return Err(parts.bad_tensor(format!("shape {:?} is not [N, K] (rank two)", tensor.shape)));
    }
    let weight = parts.required("weight")?;
    parts.dtype(&weight, &[Dtype::I8])?;
    parts.shape(&weight, tensor.shape)?;
    parts.sized(&weight)?;
    let scb = parts.required("SCB")?;
    parts.dtype(&scb, &[Dtype::F32])?;
    parts.elements(&scb, view.rows)?;
    parts.sized(&scb)?;
    if let Some(format) = parts.optional("weight_format") {
        parts.dtype(&format, &[Dtype::U8])?;
        parts.elements(&format, 1)?;
        parts.sized(&format)?;
        if format.bytes[0] != 0 {
            return Err(DecodeError::Refused {
                scheme: tensor.scheme.to_owned(),
                why: format!(
                    "weight_format is {}, not 0 (bnb's row-major layout)",
                    format.bytes[0]
                ),
            });
        }
    }
    Ok(Box::new(Int8 {
        weight: weight.bytes,
        scb: scb.floats(),
        cols: view.cols as usize,
        logical,
    }))
}

/// The schemes of this module.
pub(super) const SCHEMES: [super::Scheme; 3] = [
    super::Scheme {
        name: "bnb.nf4",
        prepare: |t, l, v| prepare_four_bit(t, l, v, &NF4),
    },
    super::Scheme {
        name: "bnb.fp4",
        prepare: |t, l, v| prepare_four_bit(t, l, v, &FP4),
    },
    super::Scheme {
        name: "bnb.int8",
        prepare: prepare_int8,
    },
];

#[cfg(test)]
mod tests;
