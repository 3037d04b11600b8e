//! Microscaled and block-scaled float formats (spec §6): `mxfp8`, `nvfp4`, `svdq.nvfp4`,
//! `fp8.blockwise` and `mxfp4`.
//!
//! Each `prepare` checks params, parts, dtypes and shapes, converts every scale to f32 once and
//! returns a decoder over rows of the `[R, C]` view. A row is computed into an f32 buffer,
//! block by block with the block's scale (and, for the E2M1 formats, a 16-entry table of that
//! block's products), then rounded once to the logical dtype. The arithmetic is the spec's, in
//! its order: `mxfp8`, `fp8.blockwise` `w × s`; `mxfp4` `T[q] × s`; `nvfp4`
//! `((T[q] × s) × g) × p` or `(T[q] × (s ÷ g)) × p`; `svdq.nvfp4` adds `× c`, `× p` and the
//! low-rank terms in order of rank.
//!
//! Not here: `input_scale` is checked but never read (it never enters a decode).

use super::grid::{Grid, Layout};
use super::{
    elem, DecodeError, DecodeResult, Decoder, Encoded, Logical, Params, Part, Parts, View,
};
use crate::format::{Dtype, Value};

/// The dtypes of a float factor part (`pre_quant_scale`, low-rank factors, block scales).
const FLOATS: [Dtype; 3] = [Dtype::F32, Dtype::BF16, Dtype::F16];

/// What a part's stored shape must be.
enum Want<'s> {
    /// Exactly this shape.
    Shape(&'s [u64]),
    /// Any shape holding one of these element counts.
    Elements(&'s [u64]),
}

/// Checks `part`'s dtype against `dtypes`, its shape against `want`, and its byte length.
fn check(parts: &Parts<'_, '_>, part: &Part<'_>, dtypes: &[Dtype], want: Want) -> DecodeResult<()> {
    parts.dtype(part, dtypes)?;
    match want {
        Want::Shape(shape) => parts.shape(part, shape)?,
        Want::Elements(counts) => {
            let n = part.shape.iter().try_fold(1u64, |a, &e| a.checked_mul(e));
            if !counts.iter().any(|&c| n == Some(c)) {
                let mut counts = counts.to_vec();
                counts.dedup();
                let counts: Vec<String> = counts.iter().map(u64::to_string).collect();
                return Err(parts.bad(
                    part,
                    format!(
                        "shape {:?} does not hold {} elements",
                        part.shape,
                        counts.join(" or ")
                    ),
                ));
            }
        }
    }
    parts.sized(part)
}

/// Refuses a logical shape of rank below two (spec §6 "Shapes": a matrix view).
fn matrix(parts: &Parts<'_, '_>, shape: &[u64]) -> DecodeResult<()> {
    if shape.len() < 2 {
        return Err(parts.bad_tensor(format!(
            "logical shape {shape:?} is not a matrix (rank two or more)"
        )));
    }
    Ok(())
}

/// The `scale_layout` param.
fn scale_layout(params: &Params<'_>) -> DecodeResult<Layout> {
    Ok(match params.choice("scale_layout", &Layout::NAMES)? {
        0 => Layout::RowMajor,
        _ => Layout::Cublas128x4,
    })
}

/// FP8 elements times a scale per block of columns: `mxfp8` (row blocks) and `fp8.blockwise`
/// (tiles). `width` columns share a scale along a row.
struct Elements<'a> {
    weight: &'a [u8],
    table: &'static [f32; 256],
    scales: Vec<f32>,
    grid: Grid,
    width: usize,
    cols: usize,
    logical: Logical,
}

impl Decoder for Elements<'_> {
    fn rows(&self, first: u64, out: &mut [u8]) -> DecodeResult<()> {
        if out.is_empty() {
            // No rows (a view of zero columns has none to write either).
            return Ok(());
        }
        let cols = self.cols;
        let mut buf = vec![0f32; cols];
        for (r, row_out) in out.chunks_mut(cols * self.logical.size()).enumerate() {
            let i = first + r as u64;
            let row = &self.weight[i as usize * cols..][..cols];
            let blocks = row.chunks(self.width).zip(buf.chunks_mut(self.width));
            for (b, (codes, values)) in blocks.enumerate() {
                let s = self.scales[self.grid.index(i, (b * self.width) as u64) as usize];
                for (v, &c) in values.iter_mut().zip(codes) {
                    *v = self.table[c as usize] * s;
                }
            }
            self.logical.store_all(&buf, row_out);
        }
        Ok(())
    }
}

fn prepare_mxfp8<'a>(
    tensor: &Encoded<'a>,
    logical: Logical,
    view: View,
) -> DecodeResult<Box<dyn Decoder + 'a>> {
    let params = Params::new(tensor, &["block_size", "scale_layout"])?;
    let parts = Parts::new(tensor, &["weight", "scale"])?;
    params.int("block_size", "32", |n| n == 32)?;
    let layout = scale_layout(&params)?;
    matrix(&parts, tensor.shape)?;
    let weight = parts.required("weight")?;
    check(
        &parts,
        &weight,
        &[Dtype::F8_E4M3, Dtype::F8_E5M2],
        Want::Shape(tensor.shape),
    )?;
    let grid = Grid::row_blocks(view, tensor.shape, 32, layout);
    let scale = parts.required("scale")?;
    let stored = grid
        .stored_shape(view, tensor.shape)
        .expect("row blocks fix a shape");
    check(&parts, &scale, &[Dtype::F8_E8M0], Want::Shape(&stored))?;
    Ok(Box::new(Elements {
        weight: weight.bytes,
        table: elem::table(weight.dtype).expect("an 8-bit float"),
        scales: scale.floats(),
        grid,
        width: 32,
        cols: view.cols as usize,
        logical,
    }))
}

/// `block_size: [Bᵣ, B_c]`, two positive integers.
fn tile_size(tensor: &Encoded<'_>, params: &Params<'_>) -> DecodeResult<(u64, u64)> {
    let value = params
        .raw("block_size")
        .ok_or_else(|| DecodeError::MissingParam {
            scheme: tensor.scheme.to_owned(),
            param: "block_size",
        })?;
    let positive = |v: &Value| v.as_int().filter(|&n| n > 0 && n <= u64::MAX as i128);
    match value {
        Value::Array(items) if items.len() == 2 => {
            if let (Some(br), Some(bc)) = (positive(&items[0]), positive(&items[1])) {
                return Ok((br as u64, bc as u64));
            }
        }
        _ => {}
    }
    Err(DecodeError::BadParam {
        scheme: tensor.scheme.to_owned(),
        param: "block_size",
        value: format!("{value:?}"),
        allowed: "[rows, cols], two positive integers".into(),
    })
}

fn prepare_blockwise<'a>(
    tensor: &Encoded<'a>,
    logical: Logical,
    view: View,
) -> DecodeResult<Box<dyn Decoder + 'a>> {
    let params = Params::new(tensor, &["block_size"])?;
    let parts = Parts::new(tensor, &["weight", "scale"])?;
    let (br, bc) = tile_size(tensor, &params)?;
    matrix(&parts, tensor.shape)?;
    let weight = parts.required("weight")?;
    check(
        &parts,
        &weight,
        &[Dtype::F8_E4M3],
        Want::Shape(tensor.shape),
    )?;
    let grid = Grid::tiles(view, tensor.shape, br, bc);
    let scale = parts.required("scale")?;
    let stored = grid
        .stored_shape(view, tensor.shape)
        .expect("tiles fix a shape");
    check(
        &parts,
        &scale,
        &[Dtype::F32, Dtype::BF16, Dtype::F16, Dtype::F8_E8M0],
        Want::Shape(&stored),
    )?;
    // A tile wider than the row still holds it whole: one scale for all of it.
    let width = bc.min(view.cols.max(1)) as usize;
    Ok(Box::new(Elements {
        weight: weight.bytes,
        table: elem::table(weight.dtype).expect("an 8-bit float"),
        scales: scale.floats(),
        grid,
        width,
        cols: view.cols as usize,
        logical,
    }))
}

/// `mxfp4`: E2M1 codes in §5's `F4` packing over the whole stored tensor `S`, times an E8M0
/// scale per 32 elements of a stored row; `transposed` swaps the last two axes back.
struct Mxfp4<'a> {
    weight: &'a [u8],
    scales: Vec<f32>,
    /// Columns of the stored view (the logical second-last extent when transposed).
    stored_cols: usize,
    /// Blocks per stored row.
    width: usize,
    /// `Some(A)` when transposed: the logical matrix's rows, the stored rows' length.
    transposed: Option<usize>,
    cols: usize,
    logical: Logical,
}

/// `T[q] × s` for codes `start .. start + out.len()` of §5's `F4` packing (code `2k` in the low
/// nibble of byte `k`): the 16 products once, then two codes a byte.
#[inline]
fn e2m1_run(bytes: &[u8], start: usize, s: f32, out: &mut [f32]) {
    let t: [f32; 16] = elem::E2M1.map(|x| x * s);
    let code = |e: usize| ((bytes[e / 2] >> (4 * (e % 2))) & 15) as usize;
    let (head, body) = out.split_at_mut((start % 2).min(out.len()));
    for (k, v) in head.iter_mut().enumerate() {
        *v = t[code(start + k)];
    }
    let even = start + head.len();
    let tail_start = even + body.len() / 2 * 2;
    let mut pairs = body.chunks_exact_mut(2);
    for (pair, &b) in (&mut pairs).zip(&bytes[even / 2..]) {
        pair[0] = t[(b & 15) as usize];
        pair[1] = t[(b >> 4) as usize];
    }
    for (k, v) in pairs.into_remainder().iter_mut().enumerate() {
        *v = t[code(tail_start + k)];
    }
}

impl Decoder for Mxfp4<'_> {
    fn rows(&self, first: u64, out: &mut [u8]) -> DecodeResult<()> {
        if out.is_empty() {
            // No rows (a view of zero columns has none to write either).
            return Ok(());
        }
        let cols = self.cols;
        let row_bytes = cols * self.logical.size();
        let rows = out.len() / row_bytes;
        let first = first as usize;
        match self.transposed {
            None => {
                let mut buf = vec![0f32; cols];
                for (r, row_out) in out.chunks_mut(row_bytes).enumerate() {
                    let i = first + r;
                    for (b, values) in buf.chunks_mut(32).enumerate() {
                        let s = self.scales[i * self.width + b];
                        e2m1_run(self.weight, i * cols + b * 32, s, values);
                    }
                    self.logical.store_all(&buf, row_out);
                }
            }
            Some(a_rows) => {
                // Logical row (m, a) is stored column a of the stored rows (m, 0..C). Rows are
                // decoded in tiles of the logical rows that share one scale block of 32 `a`s:
                // each stored row gives a short contiguous run, written down a tile column.
                let mut tile = vec![0f32; 32 * cols];
                let mut run = [0f32; 32];
                let mut r = 0;
                while r < rows {
                    let i = first + r;
                    let (m, a) = (i / a_rows, i % a_rows);
                    let block = a / 32;
                    let span = ((block + 1) * 32).min(a_rows).min(a + rows - r) - a;
                    for b in 0..cols {
                        let stored_row = m * cols + b;
                        let s = self.scales[stored_row * self.width + block];
                        let run = &mut run[..span];
                        e2m1_run(self.weight, stored_row * self.stored_cols + a, s, run);
                        for (k, &v) in run.iter().enumerate() {
                            tile[k * cols + b] = v;
                        }
                    }
                    let outs = out[r * row_bytes..(r + span) * row_bytes].chunks_mut(row_bytes);
                    for (values, row_out) in tile.chunks_exact(cols).zip(outs) {
                        self.logical.store_all(values, row_out);
                    }
                    r += span;
                }
            }
        }
        Ok(())
    }
}

fn prepare_mxfp4<'a>(
    tensor: &Encoded<'a>,
    logical: Logical,
    view: View,
) -> DecodeResult<Box<dyn Decoder + 'a>> {
    let params = Params::new(tensor, &["block_size", "transposed"])?;
    let parts = Parts::new(tensor, &["weight", "scale"])?;
    params.int("block_size", "32", |n| n == 32)?;
    let transposed = params.bool("transposed")?;
    matrix(&parts, tensor.shape)?;
    // Transposed storage (spec §6): the parts hold S, the logical tensor with its last two
    // axes swapped, and the view, shapes and formula apply to S.
    let mut stored = tensor.shape.to_vec();
    if transposed {
        let n = stored.len();
        stored.swap(n - 2, n - 1);
    }
    let stored_view = View::of(&stored).expect("the logical shape's view exists");
    let weight = parts.required("weight")?;
    check(&parts, &weight, &[Dtype::F4], Want::Shape(&stored))?;
    let grid = Grid::row_blocks(stored_view, &stored, 32, Layout::RowMajor);
    let scale = parts.required("scale")?;
    let scale_shape = grid
        .stored_shape(stored_view, &stored)
        .expect("row blocks fix a shape");
    check(&parts, &scale, &[Dtype::F8_E8M0], Want::Shape(&scale_shape))?;
    Ok(Box::new(Mxfp4 {
        weight: weight.bytes,
        scales: scale.floats(),
        stored_cols: stored_view.cols as usize,
        width: stored_view.cols.div_ceil(32) as usize,
        transposed: transposed.then_some(tensor.shape[tensor.shape.len() - 2] as usize),
        cols: view.cols as usize,
        logical,
    }))
}

/// The `nvfp4` core: `v = (T[q] × s) × g` (`multiply`) or `T[q] × (s ÷ g)` (`divide`), without
/// any factor after it.
struct Nvfp4Core<'a> {
    weight: &'a [u8],
    high_first: bool,
    scales: Vec<f32>,
    grid: Grid,
    /// `scale_2`: one element, or one per matrix.
    global: Vec<f32>,
    divide: bool,
    /// Rows of one matrix, `N`.
    n: u64,
    cols: usize,
}

impl Nvfp4Core<'_> {
    /// Row `i`'s values `v` into `out` (`C` of them).
    #[inline]
    fn row(&self, i: u64, out: &mut [f32]) {
        let g = match self.global.len() {
            1 => self.global[0],
            _ => self.global[(i / self.n) as usize],
        };
        let row = &self.weight[i as usize * self.cols / 2..][..self.cols / 2];
        for (b, (codes, values)) in row
            .chunks_exact(8)
            .zip(out.chunks_exact_mut(16))
            .enumerate()
        {
            let s = self.scales[self.grid.block_index(i, b as u64) as usize];
            let t: [f32; 16] = if self.divide {
                let sg = s / g;
                elem::E2M1.map(|x| x * sg)
            } else {
                elem::E2M1.map(|x| (x * s) * g)
            };
            let (even, odd) = if self.high_first { (4, 0) } else { (0, 4) };
            for (pair, &byte) in values.chunks_exact_mut(2).zip(codes) {
                pair[0] = t[((byte >> even) & 15) as usize];
                pair[1] = t[((byte >> odd) & 15) as usize];
            }
        }
    }
}

/// `nvfp4`: the core, then `× p[j]` where there is a `pre_quant_scale`.
struct Nvfp4<'a> {
    core: Nvfp4Core<'a>,
    pre: Option<Vec<f32>>,
    logical: Logical,
}

impl Decoder for Nvfp4<'_> {
    fn rows(&self, first: u64, out: &mut [u8]) -> DecodeResult<()> {
        if out.is_empty() {
            // No rows (a view of zero columns has none to write either).
            return Ok(());
        }
        let cols = self.core.cols;
        let mut buf = vec![0f32; cols];
        for (r, row_out) in out.chunks_mut(cols * self.logical.size()).enumerate() {
            self.core.row(first + r as u64, &mut buf);
            if let Some(p) = &self.pre {
                buf.iter_mut().zip(p).for_each(|(v, &p)| *v *= p);
            }
            self.logical.store_all(&buf, row_out);
        }
        Ok(())
    }
}

/// The params every NVFP4 scheme takes.
const NVFP4_PARAMS: [&str; 4] = ["block_size", "global_scale", "nibble_order", "scale_layout"];

/// The NVFP4 params' values.
struct Nvfp4Params {
    divide: bool,
    high_first: bool,
    layout: Layout,
}

impl Nvfp4Params {
    fn read(params: &Params<'_>) -> DecodeResult<Nvfp4Params> {
        params.int("block_size", "16", |n| n == 16)?;
        Ok(Nvfp4Params {
            divide: params.choice("global_scale", &["multiply", "divide"])? == 1,
            high_first: params.choice("nibble_order", &["low_first", "high_first"])? == 1,
            layout: scale_layout(params)?,
        })
    }
}

/// Checks the `weight`, `scale` and `scale_2` parts of a matrix (`scale_2` holding one of
/// `globals` elements) and builds the core.
fn nvfp4_core<'a>(
    tensor: &Encoded<'a>,
    nv: &Nvfp4Params,
    parts: &Parts<'_, 'a>,
    view: View,
    globals: &[u64],
) -> DecodeResult<Nvfp4Core<'a>> {
    if !view.cols.is_multiple_of(16) {
        return Err(parts.bad_tensor(format!("{} columns are not whole blocks of 16", view.cols)));
    }
    let weight = parts.required("weight")?;
    check(parts, &weight, &[Dtype::F4], Want::Shape(tensor.shape))?;
    let grid = Grid::row_blocks(view, tensor.shape, 16, nv.layout);
    let scale = parts.required("scale")?;
    let stored = grid
        .stored_shape(view, tensor.shape)
        .expect("row blocks fix a shape");
    check(parts, &scale, &[Dtype::F8_E4M3], Want::Shape(&stored))?;
    let scale_2 = parts.required("scale_2")?;
    check(parts, &scale_2, &[Dtype::F32], Want::Elements(globals))?;
    Ok(Nvfp4Core {
        weight: weight.bytes,
        high_first: nv.high_first,
        scales: scale.floats(),
        grid,
        global: scale_2.floats(),
        divide: nv.divide,
        n: tensor.shape[tensor.shape.len() - 2],
        cols: view.cols as usize,
    })
}

fn prepare_nvfp4<'a>(
    tensor: &Encoded<'a>,
    logical: Logical,
    view: View,
) -> DecodeResult<Box<dyn Decoder + 'a>> {
    let params = Params::new(tensor, &NVFP4_PARAMS)?;
    let roles = [
        "weight",
        "scale",
        "scale_2",
        "input_scale",
        "pre_quant_scale",
    ];
    let parts = Parts::new(tensor, &roles)?;
    let nv = Nvfp4Params::read(&params)?;
    matrix(&parts, tensor.shape)?;
    // One global scale, or one per matrix of `[…stack, N, C]`.
    let stack: u64 = tensor.shape[..tensor.shape.len() - 2].iter().product();
    let core = nvfp4_core(tensor, &nv, &parts, view, &[1, stack])?;
    if let Some(input) = parts.optional("input_scale") {
        check(&parts, &input, &[Dtype::F32], Want::Elements(&[1, stack]))?;
    }
    let pre = match parts.optional("pre_quant_scale") {
        Some(p) => {
            check(&parts, &p, &FLOATS, Want::Elements(&[view.cols]))?;
            Some(p.floats())
        }
        None => None,
    };
    Ok(Box::new(Nvfp4 { core, pre, logical }))
}

/// `svdq.nvfp4`: `(((v × c) × p) + up[i, 0] × down[0, j]) + …`, in order of rank.
struct Svdq<'a> {
    core: Nvfp4Core<'a>,
    channel: Option<Vec<f32>>,
    pre: Vec<f32>,
    /// `[rank, C]`.
    down: Vec<f32>,
    /// `[R, rank]`.
    up: Vec<f32>,
    rank: usize,
    logical: Logical,
}

/// Rows `svdq.nvfp4` decodes together, so each low-rank row `down[r, ·]` is read once for all.
const SVDQ_TILE: usize = 8;

impl Decoder for Svdq<'_> {
    fn rows(&self, first: u64, out: &mut [u8]) -> DecodeResult<()> {
        if out.is_empty() {
            // No rows (a view of zero columns has none to write either).
            return Ok(());
        }
        let cols = self.core.cols;
        let row_bytes = cols * self.logical.size();
        let mut buf = vec![0f32; SVDQ_TILE * cols];
        for (t, tile_out) in out.chunks_mut(SVDQ_TILE * row_bytes).enumerate() {
            let i0 = first as usize + t * SVDQ_TILE;
            let n = tile_out.len() / row_bytes;
            for (k, row) in buf.chunks_exact_mut(cols).take(n).enumerate() {
                let i = i0 + k;
                self.core.row(i as u64, row);
                if let Some(c) = &self.channel {
                    let c = c[i];
                    row.iter_mut().for_each(|v| *v *= c);
                }
                row.iter_mut().zip(&self.pre).for_each(|(v, &p)| *v *= p);
            }
            // The branch's terms in order of r, for every element.
            for (r, down) in self.down.chunks_exact(cols).enumerate() {
                for (k, row) in buf.chunks_exact_mut(cols).take(n).enumerate() {
                    let u = self.up[(i0 + k) * self.rank + r];
                    row.iter_mut().zip(down).for_each(|(v, &d)| *v += u * d);
                }
            }
            let rows = buf.chunks_exact(cols).zip(tile_out.chunks_mut(row_bytes));
            for (values, row_out) in rows {
                self.logical.store_all(values, row_out);
            }
        }
        Ok(())
    }
}

fn prepare_svdq<'a>(
    tensor: &Encoded<'a>,
    logical: Logical,
    view: View,
) -> DecodeResult<Box<dyn Decoder + 'a>> {
    let params = Params::new(tensor, &NVFP4_PARAMS)?;
    let roles = [
        "weight",
        "scale",
        "scale_2",
        "input_scale",
        "pre_quant_scale",
        "channel_scale",
        "lowrank_down",
        "lowrank_up",
    ];
    let parts = Parts::new(tensor, &roles)?;
    let nv = Nvfp4Params::read(&params)?;
    if tensor.shape.len() != 2 {
        return Err(parts.bad_tensor(format!(
            "logical shape {:?} is not [N, K] (rank two; a stack is refused)",
            tensor.shape
        )));
    }
    let core = nvfp4_core(tensor, &nv, &parts, view, &[1])?;
    if let Some(input) = parts.optional("input_scale") {
        check(&parts, &input, &[Dtype::F32], Want::Elements(&[1]))?;
    }
    let pre = parts.required("pre_quant_scale")?;
    check(&parts, &pre, &FLOATS, Want::Elements(&[view.cols]))?;
    let channel = match parts.optional("channel_scale") {
        Some(c) => {
            check(
                &parts,
                &c,
                &[Dtype::F32, Dtype::F8_E4M3],
                Want::Elements(&[view.rows]),
            )?;
            Some(c.floats())
        }
        None => None,
    };
    let down = parts.required("lowrank_down")?;
    parts.dtype(&down, &FLOATS)?;
    let rank = match down.shape {
        [r, k] if *r >= 1 && *k == view.cols => *r,
        other => {
            return Err(parts.bad(
                &down,
                format!("shape {other:?} is not [R, {}] with R ≥ 1", view.cols),
            ))
        }
    };
    parts.sized(&down)?;
    let up = parts.required("lowrank_up")?;
    check(&parts, &up, &FLOATS, Want::Shape(&[view.rows, rank]))?;
    Ok(Box::new(Svdq {
        core,
        channel,
        pre: pre.floats(),
        down: down.floats(),
        up: up.floats(),
        rank: rank as usize,
        logical,
    }))
}

/// The schemes of this module.
pub(super) const SCHEMES: [super::Scheme; 5] = [
    super::Scheme {
        name: "mxfp8",
        prepare: prepare_mxfp8,
    },
    super::Scheme {
        name: "nvfp4",
        prepare: prepare_nvfp4,
    },
    super::Scheme {
        name: "svdq.nvfp4",
        prepare: prepare_svdq,
    },
    super::Scheme {
        name: "fp8.blockwise",
        prepare: prepare_blockwise,
    },
    super::Scheme {
        name: "mxfp4",
        prepare: prepare_mxfp4,
    },
];

#[cfg(test)]
mod tests;
