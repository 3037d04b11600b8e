//! Group-quantized integer weights: `gptq.int2`, `gptq.int3`, `gptq.int4`, `gptq.int8`,
//! `awq.int4` and `ct.int1` … `ct.int8` (spec §6).
//!
//! Each is the affine block `round_L((q − z(i, j)) × s(i, j))` (or `q × s(i, j)`) over the
//! `[R, C]` view of a tensor of rank two or more, with a zero and a scale per row and group of
//! inputs (row blocks, [`Grid::RowBlocks`]), the codes packed in `I32` words ([`Packing`]):
//! - GPTQ: codes transposed (`[⌈C·b/32⌉, R]`) and packed `dense` along C; zeros `[W, R]` packed
//!   `dense` along R with `zero_offset` added modulo `2^b`; scales `transposed`; each column's
//!   group from `g_idx`, which must be `⌊j/g⌋` unless `act_order`.
//! - AWQ: codes transposed (`[C, ⌈R/8⌉]`) and packed `word` along R in the order
//!   `[0, 2, 4, 6, 1, 3, 5, 7]`; zeros packed the same way; scales `transposed`.
//! - compressed-tensors: codes `[lead…, words(C)]` packed `dense` or `word` along C, offset by
//!   `2^(b−1)`; scales `row_major`; zero points per matrix packed along its rows; an optional
//!   `weight_g_idx` whose groups must hold their `g` columns.
//!
//! `prepare` checks everything a decode depends on, including the values the spec makes
//! refusals (GPTQ's `g_idx` and symmetric zeros, compressed-tensors' `weight_shape` and group
//! sizes), and turns zeros and scales into row-major `[R, W]` tables of `i32` and `f32`. Rows
//! then decode in tiles of [`TILE_ROWS`]: the tile's codes are unpacked (the transposed layouts
//! read one contiguous stretch of each stored row per tile), then each row is one pass of
//! `(q − z) × s` and one of rounding. A zero is kept in the codes' stored (unsigned) space:
//! `q − z` is the same integer either way, and exact in f32.
//!
//! Non-goals: AutoAWQ's GEMV layouts and compressed-tensors' other formats are other schemes.

use super::grid::{Grid, Layout};
use super::pack::{word_at, Fill, Order, Packing};
use super::{DecodeError, DecodeResult, Decoder, Encoded, Logical, Params, Part, Parts, View};
use crate::format::Dtype;

/// AWQ's slot order: slot `s` of a word holds code `AWQ_ORDER[s]` of its eight.
const AWQ_ORDER: [u8; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

/// The inverse of [`AWQ_ORDER`]: code `e` of a word sits in slot `AWQ_SLOT[e]`.
const AWQ_SLOT: [u8; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// Where the codes of the `[R, C]` view are and how they are packed.
enum Codes<'a> {
    /// `[⌈C·b/32⌉, R]` `I32`: each row's codes a `dense` lane down one stored column (GPTQ).
    DenseColumns {
        /// The part's bytes.
        bytes: &'a [u8],
        /// Bits per code.
        bits: u32,
        /// Rows of the view, `R`: the stored row length in words.
        rows: usize,
    },
    /// `[C, ⌈R/8⌉]` `I32`: 4-bit codes packed `word` along R in AWQ's order.
    AwqColumns {
        /// The part's bytes.
        bytes: &'a [u8],
        /// Words per stored row, `⌈R/8⌉`.
        words: usize,
    },
    /// `[R, words(C)]` `I32`: each row's codes one lane, low first (compressed-tensors).
    Rows {
        /// The part's bytes.
        bytes: &'a [u8],
        /// Bits per code.
        bits: u32,
        /// `Dense` or `Word`.
        fill: Fill,
        /// Words per row.
        words: usize,
    },
}

/// Rows decoded together: the transposed layouts are read a stored row at a time across a
/// tile, so each word of the part is loaded once per tile rather than once per row.
const TILE_ROWS: usize = 32;

impl Codes<'_> {
    /// The raw (unsigned, stored) codes of rows `first..first + n` into `out`, row `r` at
    /// `out[r·stride..][..C]`; `lanes` is scratch.
    fn tile(
        &self,
        first: usize,
        n: usize,
        cols: usize,
        stride: usize,
        out: &mut [u8],
        lanes: &mut Vec<u32>,
    ) {
        match *self {
            Codes::DenseColumns { bytes, bits, rows } => {
                // Gather each row's lane from the stored rows `[k, first..first + n]`, which
                // are contiguous, then unpack the lanes.
                let lane_words = dense_words(cols as u64, bits) as usize;
                // Lanes an odd multiple of 64 bytes apart, as the codes' rows.
                let lane_stride = lane_words.next_multiple_of(32) + 16;
                lanes.clear();
                lanes.resize(n * lane_stride, 0);
                for k in 0..lane_words {
                    let stored = &bytes[(k * rows + first) * 4..(k * rows + first + n) * 4];
                    for (r, w) in stored.chunks_exact(4).enumerate() {
                        lanes[r * lane_stride + k] = u32::from_le_bytes(w.try_into().expect("4"));
                    }
                }
                for (lane, row) in lanes.chunks(lane_stride).zip(out.chunks_mut(stride)) {
                    unpack_lane(Fill::Dense, bits, |k| lane[k], &mut row[..cols]);
                }
            }
            Codes::AwqColumns { bytes, words } => {
                // Stored row `j` holds column `j` of eight rows per word.
                let (first_word, end_word) = (first / 8, (first + n).div_ceil(8));
                for j in 0..cols {
                    let stored = &bytes[(j * words + first_word) * 4..(j * words + end_word) * 4];
                    for (t, w) in stored.chunks_exact(4).enumerate() {
                        let w = u32::from_le_bytes(w.try_into().expect("4"));
                        let base = (first_word + t) * 8;
                        if base >= first && base + 8 <= first + n {
                            let at = (base - first) * stride + j;
                            for (e, &slot) in AWQ_SLOT.iter().enumerate() {
                                out[at + e * stride] = ((w >> (4 * slot)) & 15) as u8;
                            }
                            continue;
                        }
                        for (e, &slot) in AWQ_SLOT.iter().enumerate() {
                            let i = base + e;
                            if (first..first + n).contains(&i) {
                                out[(i - first) * stride + j] = ((w >> (4 * slot)) & 15) as u8;
                            }
                        }
                    }
                }
            }
            Codes::Rows {
                bytes,
                bits,
                fill,
                words,
            } => {
                for (r, row) in out.chunks_mut(stride).take(n).enumerate() {
                    let i = first + r;
                    let lane = &bytes[i * words * 4..(i + 1) * words * 4];
                    unpack_lane(fill, bits, |k| word32(lane, k), &mut row[..cols]);
                }
            }
        }
    }
}

/// Little-endian 32-bit word `k` of `bytes`.
#[inline(always)]
fn word32(bytes: &[u8], k: usize) -> u32 {
    u32::from_le_bytes(bytes[4 * k..4 * k + 4].try_into().expect("four bytes"))
}

/// The codes of one low-first lane of 32-bit words (`word(k)` its `k`-th), `out.len()` of them,
/// `bits` each: the hot-loop form of [`Packing::raw`] for the `dense` and `word` fills.
#[inline(always)]
fn unpack_lane(fill: Fill, bits: u32, word: impl Fn(usize) -> u32, out: &mut [u8]) {
    let mask = (1u64 << bits) - 1;
    match fill {
        Fill::Dense => {
            // `have` valid stream bits sit at the bottom of `acc`; above them all bits are zero.
            let (mut acc, mut have, mut k) = (0u64, 0u32, 0usize);
            for o in out.iter_mut() {
                if have < bits {
                    acc |= (word(k) as u64) << have;
                    k += 1;
                    have += 32;
                }
                *o = (acc & mask) as u8;
                acc >>= bits;
                have -= bits;
            }
        }
        Fill::Word => {
            let per_word = (32 / bits) as usize;
            for (k, chunk) in out.chunks_mut(per_word).enumerate() {
                let mut w = word(k) as u64;
                for o in chunk {
                    *o = (w & mask) as u8;
                    w >>= bits;
                }
            }
        }
        Fill::Planar => unreachable!("no grouped scheme packs planar"),
    }
}

/// Which group column `j` takes.
enum Groups {
    /// Runs of `g` columns: `⌊j/g⌋`.
    Runs(usize),
    /// `index[j]`, each below `W` (a `g_idx`).
    Index(Vec<u32>),
}

/// A prepared affine decode: codes, and per row and group a zero and a scale.
struct Affine<'a> {
    codes: Codes<'a>,
    /// `z(i, b)` at `i·W + b`, in the codes' stored space.
    zeros: Vec<i32>,
    /// `s(i, b)` at `i·W + b`.
    scales: Vec<f32>,
    /// Groups per row, `W`.
    width: usize,
    groups: Groups,
    cols: usize,
    logical: Logical,
}

impl Affine<'_> {
    /// `values[j] = (q[j] − z(i, b)) × s(i, b)` for row `i` with codes `codes`.
    #[inline]
    fn affine(&self, i: usize, codes: &[u8], values: &mut [f32]) {
        let w = self.width;
        let zeros = &self.zeros[i * w..(i + 1) * w];
        let scales = &self.scales[i * w..(i + 1) * w];
        match &self.groups {
            Groups::Runs(g) => {
                let runs = codes.chunks(*g).zip(values.chunks_mut(*g));
                for ((qs, vs), (&z, &s)) in runs.zip(zeros.iter().zip(scales)) {
                    for (v, &q) in vs.iter_mut().zip(qs) {
                        *v = (q as i32 - z) as f32 * s;
                    }
                }
            }
            Groups::Index(index) => {
                for ((v, &q), &b) in values.iter_mut().zip(codes).zip(index) {
                    let b = b as usize;
                    *v = (q as i32 - zeros[b]) as f32 * scales[b];
                }
            }
        }
    }
}

impl Decoder for Affine<'_> {
    fn rows(&self, first: u64, out: &mut [u8]) -> DecodeResult<()> {
        let cols = self.cols;
        if cols == 0 {
            return Ok(());
        }
        let row_bytes = cols * self.logical.size();
        let tile = (out.len() / row_bytes).min(TILE_ROWS);
        if tile == 0 {
            return Ok(());
        }
        // Rows of codes an odd multiple of 64 bytes apart, never a multiple of 4 KiB, so a
        // tile's rows do not all compete for one cache set.
        let stride = cols.next_multiple_of(128) + 64;
        let mut codes = vec![0u8; tile * stride];
        let mut lanes = Vec::new();
        let mut values = vec![0f32; cols];
        for (t, tile_out) in out.chunks_mut(tile * row_bytes).enumerate() {
            let first = first as usize + t * tile;
            let n = tile_out.len() / row_bytes;
            let codes = &mut codes[..n * stride];
            self.codes.tile(first, n, cols, stride, codes, &mut lanes);
            let rows = tile_out
                .chunks_exact_mut(row_bytes)
                .zip(codes.chunks(stride));
            for (r, (row_out, codes)) in rows.enumerate() {
                self.affine(first + r, &codes[..cols], &mut values);
                self.logical.store_all(&values, row_out);
            }
        }
        Ok(())
    }
}

/// Words a `dense` lane of `n` codes of `bits` takes in 32-bit words, `⌈n·b/32⌉`, without
/// overflow.
fn dense_words(n: u64, bits: u32) -> u64 {
    (n as u128 * bits as u128).div_ceil(32) as u64
}

/// A refusal of `tensor` for what its values hold.
fn refused(tensor: &Encoded<'_>, why: String) -> DecodeError {
    DecodeError::Refused {
        scheme: tensor.scheme.to_owned(),
        why,
    }
}

/// The part of `role`, with one of `dtypes` and exactly `shape` (and as many bytes).
fn part<'a>(
    parts: &Parts<'_, 'a>,
    role: &'static str,
    dtypes: &[Dtype],
    shape: &[u64],
) -> DecodeResult<Part<'a>> {
    let p = parts.required(role)?;
    parts.dtype(&p, dtypes)?;
    parts.shape(&p, shape)?;
    parts.sized(&p)?;
    Ok(p)
}

/// Little-endian `I32` elements.
fn ints(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Refuses a logical shape of rank below two.
fn matrix(parts: &Parts<'_, '_>, shape: &[u64]) -> DecodeResult<()> {
    if shape.len() < 2 {
        return Err(parts.bad_tensor(format!(
            "shape {shape:?} is not a matrix (rank two or more)"
        )));
    }
    Ok(())
}

/// A `[W, R]`-or-`[R, W]` part's values on `grid` as a row-major `[R, W]` table.
fn table<T: Copy>(grid: &Grid, rows: u64, width: u64, stored: &[T]) -> Vec<T> {
    let mut out = Vec::with_capacity((rows * width) as usize);
    for i in 0..rows {
        out.extend((0..width).map(|b| stored[grid.block_index(i, b) as usize]));
    }
    out
}

/// The group size a `group_size` param of `-1` or `g` names over `cols` columns (`-1`: the
/// whole row; at least 1 so an empty row has no group).
fn group_of(group_size: i128, cols: u64) -> u64 {
    if group_size == -1 {
        cols.max(1)
    } else {
        group_size as u64
    }
}

/// Is a `group_size` value a positive integer or `-1`?
fn positive_or_row(n: i128) -> bool {
    n == -1 || (1..=u64::MAX as i128).contains(&n)
}

const HALF: [Dtype; 2] = [Dtype::F16, Dtype::BF16];
const FLOAT: [Dtype; 3] = [Dtype::F32, Dtype::BF16, Dtype::F16];

/// `gptq.int{bits}` (spec §6 `gptq.*`).
fn prepare_gptq<'a>(
    tensor: &Encoded<'a>,
    logical: Logical,
    view: View,
    bits: u32,
) -> DecodeResult<Box<dyn Decoder + 'a>> {
    let params = Params::new(
        tensor,
        &["group_size", "symmetric", "act_order", "zero_offset"],
    )?;
    let group_size = params.int("group_size", "a positive integer or -1", positive_or_row)?;
    let symmetric = params.bool("symmetric")?;
    let act_order = params.bool("act_order")?;
    let zero_offset = params.int("zero_offset", "0 or 1", |n| n == 0 || n == 1)? as u32;
    let parts = Parts::new(tensor, &["qweight", "qzeros", "scales", "g_idx"])?;
    matrix(&parts, tensor.shape)?;
    let (n, k) = (view.rows, view.cols);
    let g = group_of(group_size, k);
    let grid = Grid::row_blocks(view, tensor.shape, g, Layout::Transposed);
    let width = k.div_ceil(g);
    let qweight = part(&parts, "qweight", &[Dtype::I32], &[dense_words(k, bits), n])?;
    let qzeros = part(
        &parts,
        "qzeros",
        &[Dtype::I32],
        &[width, dense_words(n, bits)],
    )?;
    let scales_shape = grid.stored_shape(view, tensor.shape).expect("row blocks");
    let scales = part(&parts, "scales", &HALF, &scales_shape)?;
    let g_idx = part(&parts, "g_idx", &[Dtype::I32], &[k])?;

    // z = (r + zero_offset) mod 2^b, slot by slot: a v1 zero of 0 stored as 2^b − 1 reads 0,
    // and a slot a v1 export's borrow left one low reads one low (spec: `v1-zero-borrow`).
    let packing = Packing {
        bits,
        word_bits: 32,
        fill: Fill::Dense,
        order: Order::LowFirst,
    };
    let mask = (1u32 << bits) - 1;
    let lane_words = dense_words(n, bits);
    let mut stored_zeros = Vec::with_capacity((width * n) as usize);
    for b in 0..width {
        let word = |w: u64| word_at(qzeros.bytes, 32, b * lane_words + w);
        stored_zeros
            .extend((0..n).map(|i| ((packing.raw(n, i, word) + zero_offset) & mask) as i32));
    }
    let half = 1i32 << (bits - 1);
    if symmetric {
        if let Some(at) = stored_zeros.iter().position(|&z| z != half) {
            return Err(refused(
                tensor,
                format!(
                    "symmetric is true, but the zero of group {} row {} is {}, not {half}",
                    at as u64 / n.max(1),
                    at as u64 % n.max(1),
                    stored_zeros[at]
                ),
            ));
        }
    }
    let index = ints(g_idx.bytes);
    let groups = if act_order {
        if let Some(j) = index.iter().position(|&v| v < 0 || v as u64 >= width) {
            return Err(refused(
                tensor,
                format!("g_idx[{j}] is {}, not a group below W = {width}", index[j]),
            ));
        }
        Groups::Index(index.into_iter().map(|v| v as u32).collect())
    } else {
        let stray = (0..k as usize).find(|&j| index[j] as i128 != (j as u64 / g) as i128);
        if let Some(j) = stray {
            return Err(refused(
                tensor,
                format!(
                    "act_order is false, but g_idx[{j}] is {}, not ⌊j/g⌋ = {}",
                    index[j],
                    j as u64 / g
                ),
            ));
        }
        Groups::Runs(g as usize)
    };
    Ok(Box::new(Affine {
        codes: Codes::DenseColumns {
            bytes: qweight.bytes,
            bits,
            rows: n as usize,
        },
        zeros: table(&grid, n, width, &stored_zeros),
        scales: table(&grid, n, width, &scales.floats()),
        width: width as usize,
        groups,
        cols: k as usize,
        logical,
    }))
}

/// `awq.int4` (spec §6 `awq.int4`).
fn prepare_awq<'a>(
    tensor: &Encoded<'a>,
    logical: Logical,
    view: View,
) -> DecodeResult<Box<dyn Decoder + 'a>> {
    let params = Params::new(tensor, &["group_size"])?;
    let group_size = params.int("group_size", "a positive integer or -1", positive_or_row)?;
    let parts = Parts::new(tensor, &["qweight", "qzeros", "scales"])?;
    matrix(&parts, tensor.shape)?;
    let (n, k) = (view.rows, view.cols);
    let g = group_of(group_size, k);
    let grid = Grid::row_blocks(view, tensor.shape, g, Layout::Transposed);
    let width = k.div_ceil(g);
    let packing = Packing {
        bits: 4,
        word_bits: 32,
        fill: Fill::Word,
        order: Order::Slots(&AWQ_ORDER),
    };
    let lane_words = packing.words(n);
    let qweight = part(&parts, "qweight", &[Dtype::I32], &[k, lane_words])?;
    let qzeros = part(&parts, "qzeros", &[Dtype::I32], &[width, lane_words])?;
    let scales_shape = grid.stored_shape(view, tensor.shape).expect("row blocks");
    let scales = part(&parts, "scales", &HALF, &scales_shape)?;
    let mut stored_zeros = Vec::with_capacity((width * n) as usize);
    for b in 0..width {
        let word = |w: u64| word_at(qzeros.bytes, 32, b * lane_words + w);
        stored_zeros.extend((0..n).map(|i| packing.raw(n, i, word) as i32));
    }
    Ok(Box::new(Affine {
        codes: Codes::AwqColumns {
            bytes: qweight.bytes,
            words: lane_words as usize,
        },
        zeros: table(&grid, n, width, &stored_zeros),
        scales: table(&grid, n, width, &scales.floats()),
        width: width as usize,
        groups: Groups::Runs(g as usize),
        cols: k as usize,
        logical,
    }))
}

/// `ct.int{bits}` (spec §6 `ct.*`).
fn prepare_ct<'a>(
    tensor: &Encoded<'a>,
    logical: Logical,
    view: View,
    bits: u32,
) -> DecodeResult<Box<dyn Decoder + 'a>> {
    let params = Params::new(tensor, &["group_size", "strategy", "symmetric", "packing"])?;
    let g = params.int("group_size", "a positive integer", |n| {
        (1..=u64::MAX as i128).contains(&n)
    })? as u64;
    let channel = params.choice("strategy", &["group", "channel"])? == 1;
    let symmetric = params.bool("symmetric")?;
    let fill = [Fill::Dense, Fill::Word][params.choice("packing", &["dense", "word"])?];
    let parts = Parts::new(
        tensor,
        &[
            "weight_packed",
            "weight_scale",
            "weight_zero_point",
            "weight_shape",
            "weight_g_idx",
        ],
    )?;
    matrix(&parts, tensor.shape)?;
    let (r, c) = (view.rows, view.cols);
    if channel && g != c {
        return Err(DecodeError::BadParam {
            scheme: tensor.scheme.to_owned(),
            param: "group_size",
            value: g.to_string(),
            allowed: format!("C = {c} (strategy channel)"),
        });
    }
    let packing = Packing {
        bits,
        word_bits: 32,
        fill,
        order: Order::LowFirst,
    };
    let words = |n: u64| match fill {
        Fill::Dense => dense_words(n, bits),
        _ => packing.words(n),
    };
    let rank = tensor.shape.len();
    let grid = Grid::row_blocks(view, tensor.shape, g, Layout::RowMajor);
    let width = c.div_ceil(g);

    let mut packed_shape = tensor.shape.to_vec();
    packed_shape[rank - 1] = words(c);
    let packed = part(&parts, "weight_packed", &[Dtype::I32], &packed_shape)?;
    let scale_shape = grid.stored_shape(view, tensor.shape).expect("row blocks");
    let scale = part(&parts, "weight_scale", &FLOAT, &scale_shape)?;
    let shape_part = parts.required("weight_shape")?;
    parts.dtype(&shape_part, &[Dtype::I32, Dtype::I64])?;
    parts.shape(&shape_part, &[rank as u64])?;
    parts.sized(&shape_part)?;
    let stated: Vec<i128> = match shape_part.dtype {
        Dtype::I32 => ints(shape_part.bytes).into_iter().map(i128::from).collect(),
        _ => (shape_part.bytes.chunks_exact(8))
            .map(|c| i64::from_le_bytes(c.try_into().expect("eight bytes")) as i128)
            .collect(),
    };
    if !stated
        .iter()
        .zip(tensor.shape)
        .all(|(&a, &b)| a == b as i128)
    {
        return Err(parts.bad(
            &shape_part,
            format!(
                "it holds {stated:?}, not the logical shape {:?}",
                tensor.shape
            ),
        ));
    }

    // Zero points: each matrix's `[N, W]`, packed along N; kept in the stored space.
    let height = tensor.shape[rank - 2];
    let zeros = match (symmetric, parts.optional("weight_zero_point")) {
        (true, None) => vec![1i32 << (bits - 1); (r * width) as usize],
        (true, Some(zp)) => {
            return Err(parts.bad(&zp, "present, but symmetric is true"));
        }
        (false, None) => {
            return Err(DecodeError::MissingPart {
                scheme: tensor.scheme.to_owned(),
                role: "weight_zero_point",
            })
        }
        (false, Some(_)) => {
            let mut zp_shape = tensor.shape[..rank - 2].to_vec();
            zp_shape.extend([words(height), width]);
            let zp = part(&parts, "weight_zero_point", &[Dtype::I32], &zp_shape)?;
            let lane_words = words(height);
            let mut zeros = vec![0i32; (r * width) as usize];
            let matrices = r.checked_div(height).unwrap_or(0);
            for m in 0..matrices {
                for b in 0..width {
                    let word = |k: u64| word_at(zp.bytes, 32, (m * lane_words + k) * width + b);
                    for row in 0..height {
                        let i = m * height + row;
                        zeros[(i * width + b) as usize] = packing.raw(height, row, word) as i32;
                    }
                }
            }
            zeros
        }
    };

    let groups = match parts.optional("weight_g_idx") {
        None => Groups::Runs(g as usize),
        Some(_) => {
            let g_idx = part(&parts, "weight_g_idx", &[Dtype::I32], &[c])?;
            act_order_groups(tensor, &ints(g_idx.bytes), g, width)?
        }
    };
    let row_words = words(c) as usize;
    Ok(Box::new(Affine {
        codes: Codes::Rows {
            bytes: packed.bytes,
            bits,
            fill,
            words: row_words,
        },
        zeros,
        scales: scale.floats(),
        width: width as usize,
        groups,
        cols: c as usize,
        logical,
    }))
}

/// compressed-tensors' `weight_g_idx` as each column's group: a `−1` anywhere is its unset
/// index (the column order); otherwise every value is a group below `W` and group `b` holds its
/// `g` columns (the last `C − (W − 1)·g`), since compressed-tensors groups the columns sorted
/// by the index in runs of `g`.
fn act_order_groups(
    tensor: &Encoded<'_>,
    index: &[i32],
    g: u64,
    width: u64,
) -> DecodeResult<Groups> {
    if index.contains(&-1) {
        return Ok(Groups::Runs(g as usize));
    }
    let mut count = vec![0u64; width as usize];
    for (j, &v) in index.iter().enumerate() {
        match usize::try_from(v).ok().and_then(|v| count.get_mut(v)) {
            Some(n) => *n += 1,
            None => {
                return Err(refused(
                    tensor,
                    format!("weight_g_idx[{j}] is {v}, not a group below W = {width}"),
                ))
            }
        }
    }
    let cols = index.len() as u64;
    let full = |b: u64| {
        if b + 1 < width {
            g
        } else {
            cols - (width - 1) * g
        }
    };
    if let Some(b) = (0..width).find(|&b| count[b as usize] != full(b)) {
        return Err(refused(
            tensor,
            format!(
                "weight_g_idx puts {} columns in group {b}, not its {}",
                count[b as usize],
                full(b)
            ),
        ));
    }
    Ok(Groups::Index(index.iter().map(|&v| v as u32).collect()))
}

macro_rules! gptq {
    ($name:literal, $bits:literal) => {
        super::Scheme {
            name: $name,
            prepare: |t, l, v| prepare_gptq(t, l, v, $bits),
        }
    };
}

macro_rules! ct {
    ($name:literal, $bits:literal) => {
        super::Scheme {
            name: $name,
            prepare: |t, l, v| prepare_ct(t, l, v, $bits),
        }
    };
}

/// The schemes of this module.
pub(super) const SCHEMES: [super::Scheme; 13] = [
    gptq!("gptq.int2", 2),
    gptq!("gptq.int3", 3),
    gptq!("gptq.int4", 4),
    gptq!("gptq.int8", 8),
    super::Scheme {
        name: "awq.int4",
        prepare: prepare_awq,
    },
    ct!("ct.int1", 1),
    ct!("ct.int2", 2),
    ct!("ct.int3", 3),
    ct!("ct.int4", 4),
    ct!("ct.int5", 5),
    ct!("ct.int6", 6),
    ct!("ct.int7", 7),
    ct!("ct.int8", 8),
];

#[cfg(test)]
mod tests;
