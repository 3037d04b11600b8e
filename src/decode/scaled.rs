//! Scaled FP8 and INT8 weights: `fp8.tensorwise`, `fp8.rowwise`, `fp8.columnwise`,
//! `int8.tensorwise`, `int8.rowwise`, `int8.columnwise` (spec §6).
//!
//! `round_L(weight[i, j] × s(i, j))`, the scale on the tensor, row or column grid. The
//! tensorwise schemes take any shape and an optional `input_scale`; the others the matrix view
//! of a tensor of rank two or more.

use super::grid::Grid;
use super::{elem, DecodeResult, Decoder, Encoded, Logical, Params, Parts, View};
use crate::format::Dtype;

/// Which scale grid a scheme uses.
#[derive(Clone, Copy)]
enum Granularity {
    Tensor,
    Row,
    Column,
}

/// How weight bytes become f32.
#[derive(Clone, Copy)]
enum Weight {
    I8,
    E4M3,
    E5M2,
}

struct Scaled<'a> {
    weight: &'a [u8],
    kind: Weight,
    scales: Vec<f32>,
    grid: Grid,
    view: View,
    logical: Logical,
}

impl Decoder for Scaled<'_> {
    fn rows(&self, first: u64, out: &mut [u8]) -> DecodeResult<()> {
        let cols = self.view.cols as usize;
        let mut values = vec![0f32; cols];
        for (r, row_out) in out.chunks_mut(cols * self.logical.size()).enumerate() {
            let i = first + r as u64;
            let row = &self.weight[i as usize * cols..(i as usize + 1) * cols];
            match self.grid {
                Grid::Column => weigh(self.kind, row, &mut values, |j| self.scales[j]),
                _ => {
                    let s = self.scales[self.grid.index(i, 0) as usize];
                    weigh(self.kind, row, &mut values, |_| s)
                }
            }
            self.logical.store_all(&values, row_out);
        }
        Ok(())
    }
}

/// `values[j] = weight[j] × scale(j)`, one loop per weight kind so each vectorizes.
#[inline]
fn weigh(kind: Weight, row: &[u8], values: &mut [f32], scale: impl Fn(usize) -> f32) {
    match kind {
        Weight::I8 => {
            for (j, (v, &b)) in values.iter_mut().zip(row).enumerate() {
                *v = b as i8 as f32 * scale(j);
            }
        }
        Weight::E4M3 | Weight::E5M2 => {
            let table = match kind {
                Weight::E4M3 => elem::e4m3_table(),
                _ => elem::e5m2_table(),
            };
            for (j, (v, &b)) in values.iter_mut().zip(row).enumerate() {
                *v = table[b as usize] * scale(j);
            }
        }
    }
}

fn prepare<'a>(
    tensor: &Encoded<'a>,
    logical: Logical,
    view: View,
    weights: &[Dtype],
    granularity: Granularity,
) -> DecodeResult<Box<dyn Decoder + 'a>> {
    Params::new(tensor, &[])?;
    let tensorwise = matches!(granularity, Granularity::Tensor);
    let roles: &[&str] = if tensorwise {
        &["weight", "scale", "input_scale"]
    } else {
        &["weight", "scale"]
    };
    let parts = Parts::new(tensor, roles)?;
    if !tensorwise && tensor.shape.len() < 2 {
        return Err(parts.bad_tensor(format!(
            "shape {:?} is not a matrix (rank two or more)",
            tensor.shape
        )));
    }
    let weight = parts.required("weight")?;
    parts.dtype(&weight, weights)?;
    parts.shape(&weight, tensor.shape)?;
    let scale = parts.required("scale")?;
    parts.dtype(&scale, &[Dtype::F32, Dtype::BF16, Dtype::F16])?;
    let grid = match granularity {
        Granularity::Tensor => Grid::Tensor,
        Granularity::Row => Grid::Row,
        Granularity::Column => Grid::Column,
    };
    parts.elements(&scale, grid.elements(view, tensor.shape))?;
    if let Some(input) = parts.optional("input_scale") {
        parts.dtype(&input, &[Dtype::F32])?;
        parts.elements(&input, 1)?;
    }
    let kind = match weight.dtype {
        Dtype::I8 => Weight::I8,
        Dtype::F8_E4M3 => Weight::E4M3,
        _ => Weight::E5M2,
    };
    Ok(Box::new(Scaled {
        weight: weight.bytes,
        kind,
        scales: scale.floats(),
        grid,
        view,
        logical,
    }))
}

const FP8: [Dtype; 2] = [Dtype::F8_E4M3, Dtype::F8_E5M2];

macro_rules! scheme {
    ($name:literal, $weights:expr, $granularity:expr) => {
        super::Scheme {
            name: $name,
            prepare: |t, l, v| prepare(t, l, v, &$weights, $granularity),
        }
    };
}

/// The schemes of this module.
pub(super) const SCHEMES: [super::Scheme; 6] = [
    scheme!("fp8.tensorwise", FP8, Granularity::Tensor),
    scheme!("fp8.rowwise", FP8, Granularity::Row),
    scheme!("fp8.columnwise", FP8, Granularity::Column),
    scheme!("int8.tensorwise", [Dtype::I8], Granularity::Tensor),
    scheme!("int8.rowwise", [Dtype::I8], Granularity::Row),
    scheme!("int8.columnwise", [Dtype::I8], Granularity::Column),
];
