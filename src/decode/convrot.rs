//! ConvRot integer formats (spec §6): `int8.convrot`, `int4.convrot`, and comfy-kitchen's
//! requantized split-plane formats `comfy.asym_w4a8_int8`, `comfy.w6a8_int8` and their profile
//! `w4a8.convrot`.
//!
//! Every scheme here holds integer codes in the rotated basis. A row is decoded in three steps:
//! its codes become exact integers (`int8`/`int4`: the codes; `comfy.*`: each level requantized
//! by its group's scale, `clamp(round(v × group_scale), −127, 127)`); each block of `B = 4^k`
//! columns is multiplied by `H_B` (`kron_regular_h4`, Appendix A.1) in exact integer arithmetic;
//! then `((y × scale[i]) + z) × 2^−k` in f32, `+ z` only with a `correction`, rounded once to the
//! logical dtype.
//!
//! A NaN product in the requantization refuses the decode (spec §6 `comfy.*` step 2). `prepare`
//! finds it before any row is written, scanning only the groups and codes that can produce one
//! (a NaN or infinite group scale, a NaN or infinite codebook level), so decoding a row range
//! never fails halfway.

use super::{
    pack, DecodeError, DecodeResult, Decoder, Encoded, Logical, Params, Part, Parts, View,
};
use crate::format::Dtype;

/// `x · H_B` in place for `B = x.len() = 4^k`, `H_B = H₄ ⊗ … ⊗ H₄` (spec Appendix A.1).
///
/// Along each base-4 digit of the index, a quad `(a, b, c, d)` becomes `(s − 2d, s − 2c,
/// s − 2b, s − 2a)` with `s = a + b + c + d`: column `j` of `H₄` is all ones but a `−1` in row
/// `3 − j`. The digits commute, so their order does not matter. Exact for `|x| · B < 2^31`.
pub(crate) fn kron_regular_h4(x: &mut [i32]) {
    let mut stride = 1;
    while stride < x.len() {
        for quad in x.chunks_exact_mut(4 * stride) {
            let (x0, rest) = quad.split_at_mut(stride);
            let (x1, rest) = rest.split_at_mut(stride);
            let (x2, x3) = rest.split_at_mut(stride);
            for t in 0..stride {
                let (a, b, c, d) = (x0[t], x1[t], x2[t], x3[t]);
                let s = a + b + c + d;
                x0[t] = s - 2 * d;
                x1[t] = s - 2 * c;
                x2[t] = s - 2 * b;
                x3[t] = s - 2 * a;
            }
        }
        stride *= 4;
    }
}

/// `Σ_{t < n} H_B[t, col]`, the sum of column `col` of `H_B` over its first `n` rows
/// (`n ≤ B`, `col < B`), exactly, in `O(k)`.
///
/// Splitting off the leading digit, `H_B = H₄ ⊗ H_{B/4}`: with `n = A·B/4 + n'` and
/// `col = b·B/4 + col'`, the whole row bands `a < A` give `(A − 2·[3 − b < A]) · 2^(k−1)` (each
/// column of `H_{B/4}` sums to `2^(k−1)`), and band `A` gives `H₄[A, b]` times the same sum one
/// level down.
fn column_prefix(n: usize, col: usize, block: usize) -> i32 {
    let mut total = 1i32 << (block.trailing_zeros() / 2);
    if n >= block {
        return total;
    }
    let (mut n, mut col, mut size) = (n, col, block);
    let (mut sign, mut sum) = (1i32, 0i32);
    while size > 1 {
        size /= 4;
        total /= 2;
        let (a, b) = ((n / size) as i32, (col / size) as i32);
        sum += sign * (a - 2 * i32::from(3 - b < a)) * total;
        if a + b == 3 {
            sign = -sign;
        }
        n %= size;
        col %= size;
    }
    sum
}

/// The `rotation` and `rotation_size` params: `kron_regular_h4` with `B = 4^k`, `1 ≤ k ≤ 8`.
#[derive(Clone, Copy, Debug)]
struct Rotation {
    /// `B`.
    block: usize,
    /// `2^−k`, exact.
    unit: f32,
}

impl Rotation {
    fn read(params: &Params<'_>) -> DecodeResult<Rotation> {
        params.choice("rotation", &["kron_regular_h4"])?;
        let block = params.int(
            "rotation_size",
            "4^k with 1 ≤ k ≤ 8 (4, 16, 64, …, 65536)",
            |n| (1..=8).any(|k| n == 4i128.pow(k)),
        )? as usize;
        let k = block.trailing_zeros() / 2;
        Ok(Rotation {
            block,
            unit: 1.0 / (1u32 << k) as f32,
        })
    }
}

/// Checks `part`'s dtype, exact shape and byte length.
fn check(
    parts: &Parts<'_, '_>,
    part: &Part<'_>,
    dtypes: &[Dtype],
    shape: &[u64],
) -> DecodeResult<()> {
    parts.dtype(part, dtypes)?;
    parts.shape(part, shape)?;
    parts.sized(part)
}

/// Checks `part`'s dtype, element count (any shape) and byte length.
fn check_count(
    parts: &Parts<'_, '_>,
    part: &Part<'_>,
    dtypes: &[Dtype],
    n: u64,
) -> DecodeResult<()> {
    parts.dtype(part, dtypes)?;
    parts.elements(part, n)?;
    parts.sized(part)
}

/// Refuses a logical shape of rank below two and columns that are not whole blocks of each of
/// `blocks`.
fn geometry(
    parts: &Parts<'_, '_>,
    shape: &[u64],
    view: View,
    blocks: &[usize],
) -> DecodeResult<()> {
    if shape.len() < 2 {
        return Err(parts.bad_tensor(format!(
            "logical shape {shape:?} is not a matrix (rank two or more)"
        )));
    }
    if let Some(b) = blocks
        .iter()
        .find(|&&b| !view.cols.is_multiple_of(b as u64))
    {
        return Err(parts.bad_tensor(format!("{} columns are not whole blocks of {b}", view.cols)));
    }
    Ok(())
}

/// How a row's codes are stored.
enum Codes<'a> {
    /// `I8`, one code per column (`int8.convrot`).
    Int8(&'a [u8]),
    /// Signed 4-bit codes, column `j` in bits `4·(j mod 2)` of byte `⌊j/2⌋` (`int4.convrot`).
    Int4(&'a [u8]),
    /// Unsigned `bits`-bit codes in kitchen's split planes, requantized by group.
    Requant(Requant<'a>),
}

/// `comfy.*` steps 1 and 2: `q8 = clamp(round(level[q] × group_scale), −127, 127)`.
struct Requant<'a> {
    bytes: &'a [u8],
    /// 4 or 6.
    bits: u32,
    /// The level of each code: the codebook, or `q − 2^(bits−1)`.
    levels: Vec<f32>,
    /// `g`.
    group: usize,
    /// Row-major `[R, C/g]`.
    group_scales: Vec<f32>,
}

impl Requant<'_> {
    /// Bytes of one stored row of `cols` codes.
    fn row_bytes(bits: u32, cols: usize) -> usize {
        match bits {
            4 => cols / 2,
            _ => cols / 2 + cols / 4,
        }
    }

    /// Code `j` of a stored row: the low nibble plane, then at 6 bits the plane of high pairs.
    #[inline]
    fn code(&self, row: &[u8], cols: usize, j: usize) -> usize {
        let low = pack::nibble(row, j, false) as usize;
        match self.bits {
            4 => low,
            _ => low | ((((row[cols / 2 + j / 4] >> (2 * (j % 4))) & 3) as usize) << 4),
        }
    }

    /// The first element `(i, j)` whose `level × group scale` is NaN, looking only where one can
    /// be: a NaN group scale, a NaN level in use, an infinite level on a zero scale, or a zero
    /// level on an infinite scale.
    fn first_nan(&self, rows: usize, cols: usize) -> Option<(usize, usize)> {
        let per_row = cols / self.group;
        let width = Requant::row_bytes(self.bits, cols);
        let nan_level = self.levels.iter().any(|l| l.is_nan());
        let inf_level = self.levels.iter().any(|l| l.is_infinite());
        let zero_level = self.levels.contains(&0.0);
        for i in 0..rows {
            let row = &self.bytes[i * width..][..width];
            for h in 0..per_row {
                let s = self.group_scales[i * per_row + h];
                let suspect = s.is_nan()
                    || nan_level
                    || (inf_level && s == 0.0)
                    || (zero_level && s.is_infinite());
                if !suspect {
                    continue;
                }
                let found = (h * self.group..(h + 1) * self.group)
                    .find(|&j| (self.levels[self.code(row, cols, j)] * s).is_nan());
                if let Some(j) = found {
                    return Some((i, j));
                }
            }
        }
        None
    }

    /// Row `i`'s codes, one per column, into `codes`.
    #[inline]
    fn unpack(&self, i: usize, codes: &mut [u8]) {
        let cols = codes.len();
        let width = Requant::row_bytes(self.bits, cols);
        let row = &self.bytes[i * width..][..width];
        let (low, high) = row.split_at(cols / 2);
        for (pair, &b) in codes.chunks_exact_mut(2).zip(low) {
            pair[0] = b & 15;
            pair[1] = b >> 4;
        }
        if self.bits == 6 {
            for (quad, &b) in codes.chunks_exact_mut(4).zip(high) {
                for (k, q) in quad.iter_mut().enumerate() {
                    *q |= ((b >> (2 * k)) & 3) << 4;
                }
            }
        }
    }

    /// Row `i`'s requantized codes into `out`, with `codes` as scratch (both `C` long).
    #[inline]
    fn row(&self, i: usize, codes: &mut [u8], out: &mut [i32]) {
        self.unpack(i, codes);
        let per_row = out.len() / self.group;
        let scales = &self.group_scales[i * per_row..][..per_row];
        let groups = out
            .chunks_exact_mut(self.group)
            .zip(codes.chunks_exact(self.group));
        let mut table = [0i32; 64];
        for ((q8, codes), &s) in groups.zip(scales) {
            if self.group >= self.levels.len() {
                // A group at least as long as the table: requantize each level once.
                for (t, &level) in table.iter_mut().zip(&self.levels) {
                    *t = requantize(level, s);
                }
                q8.iter_mut()
                    .zip(codes)
                    .for_each(|(q, &c)| *q = table[c as usize]);
            } else {
                for (q, &c) in q8.iter_mut().zip(codes) {
                    *q = requantize(self.levels[c as usize], s);
                }
            }
        }
    }
}

/// `clamp(round(level × s), −127, 127)`, the product one f32 multiply, rounded to nearest
/// even. Clamping first changes nothing (±127 are integers and rounding is monotonic) and puts
/// the value where adding `1.5 × 2^23` rounds it to an integer exactly (f32 ulp 1 there).
/// NaN was refused in `prepare`; ±∞ clamps.
#[inline]
fn requantize(level: f32, s: f32) -> i32 {
    const MAGIC: f32 = 12_582_912.0;
    let x = (level * s).clamp(-127.0, 127.0);
    ((x + MAGIC) - MAGIC) as i32
}

/// `comfy.*` `correction`: `z(i, c) = Σ_h corr(i, h) × M_h(c)` over the groups meeting `c`'s
/// block, in ascending order, from the first term.
struct Correction {
    /// `[C/g, R]`.
    values: Vec<f32>,
    rows: usize,
    group: usize,
    block: usize,
    /// `M_h(c)` for each block pattern, each group meeting it and each column of the block,
    /// when that table is small; otherwise computed as needed.
    table: Option<Vec<Vec<f32>>>,
    /// Blocks until the pattern of groups over a block repeats: `g / gcd(g, B)`.
    period: usize,
}

/// Most `M` entries precomputed (4 MiB of f32); past it, sums are computed per element.
const CORRECTION_TABLE_MAX: usize = 1 << 20;

impl Correction {
    fn new(values: Vec<f32>, rows: usize, cols: usize, group: usize, block: usize) -> Correction {
        Correction::with_limit(values, rows, cols, group, block, CORRECTION_TABLE_MAX)
    }

    fn with_limit(
        values: Vec<f32>,
        rows: usize,
        cols: usize,
        group: usize,
        block: usize,
        limit: usize,
    ) -> Correction {
        let period = group / gcd(group, block);
        let patterns = period.min(cols / block);
        let mut c = Correction {
            values,
            rows,
            group,
            block,
            table: None,
            period,
        };
        let entries: usize = (0..patterns).map(|p| c.ranges(p).len() * block).sum();
        if entries <= limit {
            let table = (0..patterns)
                .map(|p| {
                    let mut sums = Vec::with_capacity(c.ranges(p).len() * block);
                    for (lo, hi) in c.ranges(p) {
                        sums.extend((0..block).map(|col| Correction::sum(lo, hi, col, block)));
                    }
                    sums
                })
                .collect();
            c.table = Some(table);
        }
        c
    }

    /// `M` for block-relative rows `lo..hi` at column `col` of the block, as f32 (exact:
    /// `|M| ≤ B ≤ 2^16`).
    fn sum(lo: usize, hi: usize, col: usize, block: usize) -> f32 {
        (column_prefix(hi, col, block) - column_prefix(lo, col, block)) as f32
    }

    /// The block-relative row ranges that the groups meeting block `b` cover, first group first.
    fn ranges(&self, b: usize) -> Vec<(usize, usize)> {
        let (begin, end) = (b * self.block, (b + 1) * self.block);
        (begin / self.group..end.div_ceil(self.group))
            .map(|h| {
                let lo = (h * self.group).max(begin) - begin;
                let hi = ((h + 1) * self.group).min(end) - begin;
                (lo, hi)
            })
            .collect()
    }

    /// `z(i, ·)` over block `b` into `out` (`B` values).
    fn block(&self, i: usize, b: usize, out: &mut [f32]) {
        let first_group = b * self.block / self.group;
        let corr = |k: usize| self.values[(first_group + k) * self.rows + i];
        match &self.table {
            Some(table) => {
                let sums = &table[b % self.period];
                for (k, m) in sums.chunks_exact(self.block).enumerate() {
                    let c = corr(k);
                    if k == 0 {
                        out.iter_mut().zip(m).for_each(|(z, &m)| *z = c * m);
                    } else {
                        out.iter_mut().zip(m).for_each(|(z, &m)| *z += c * m);
                    }
                }
            }
            None => {
                for (k, (lo, hi)) in self.ranges(b).into_iter().enumerate() {
                    let c = corr(k);
                    for (col, z) in out.iter_mut().enumerate() {
                        let term = c * Correction::sum(lo, hi, col, self.block);
                        *z = if k == 0 { term } else { *z + term };
                    }
                }
            }
        }
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Every scheme of this module: codes, rotation, `× scale[i]`, `+ z`, `× 2^−k`.
struct ConvRot<'a> {
    codes: Codes<'a>,
    scales: Vec<f32>,
    correction: Option<Correction>,
    rotation: Rotation,
    cols: usize,
    logical: Logical,
}

impl Decoder for ConvRot<'_> {
    fn rows(&self, first: u64, out: &mut [u8]) -> DecodeResult<()> {
        if out.is_empty() {
            // No rows (a view of zero columns has none to write either).
            return Ok(());
        }
        let (cols, block) = (self.cols, self.rotation.block);
        let mut q = vec![0i32; cols];
        let mut codes = vec![
            0u8;
            if matches!(self.codes, Codes::Requant(_)) {
                cols
            } else {
                0
            }
        ];
        let mut values = vec![0f32; cols];
        let mut z = vec![0f32; if self.correction.is_some() { block } else { 0 }];
        for (r, row_out) in out.chunks_mut(cols * self.logical.size()).enumerate() {
            let i = first as usize + r;
            match &self.codes {
                Codes::Int8(bytes) => {
                    let row = &bytes[i * cols..][..cols];
                    q.iter_mut()
                        .zip(row)
                        .for_each(|(q, &b)| *q = b as i8 as i32);
                }
                Codes::Int4(bytes) => {
                    let row = &bytes[i * cols / 2..][..cols / 2];
                    for (pair, &b) in q.chunks_exact_mut(2).zip(row) {
                        pair[0] = pack::signed(b as u32 & 15, 4);
                        pair[1] = pack::signed(b as u32 >> 4, 4);
                    }
                }
                Codes::Requant(requant) => requant.row(i, &mut codes, &mut q),
            }
            let s = self.scales[i];
            let unit = self.rotation.unit;
            for (b, (y, v)) in q
                .chunks_exact_mut(block)
                .zip(values.chunks_exact_mut(block))
                .enumerate()
            {
                kron_regular_h4(y);
                match &self.correction {
                    None => {
                        v.iter_mut()
                            .zip(y.iter())
                            .for_each(|(v, &y)| *v = (y as f32 * s) * unit);
                    }
                    Some(correction) => {
                        correction.block(i, b, &mut z);
                        for ((v, &y), &z) in v.iter_mut().zip(y.iter()).zip(&z) {
                            *v = ((y as f32 * s) + z) * unit;
                        }
                    }
                }
            }
            self.logical.store_all(&values, row_out);
        }
        Ok(())
    }
}

/// `int8.convrot` (`bits` 8) and `int4.convrot` (`bits` 4).
fn prepare_plain<'a>(
    tensor: &Encoded<'a>,
    logical: Logical,
    view: View,
    bits: u32,
) -> DecodeResult<Box<dyn Decoder + 'a>> {
    let params = Params::new(tensor, &["rotation", "rotation_size"])?;
    let parts = Parts::new(tensor, &["weight", "scale"])?;
    let rotation = Rotation::read(&params)?;
    geometry(&parts, tensor.shape, view, &[rotation.block])?;
    let weight = parts.required("weight")?;
    let scale = parts.required("scale")?;
    let (codes, scale_dtypes): (_, &[Dtype]) = if bits == 8 {
        check(&parts, &weight, &[Dtype::I8], tensor.shape)?;
        (
            Codes::Int8(weight.bytes),
            &[Dtype::F32, Dtype::BF16, Dtype::F16],
        )
    } else {
        let mut packed = tensor.shape.to_vec();
        *packed.last_mut().expect("a matrix") = view.cols / 2;
        check(&parts, &weight, &[Dtype::I8], &packed)?;
        (Codes::Int4(weight.bytes), &[Dtype::F32])
    };
    check_count(&parts, &scale, scale_dtypes, view.rows)?;
    Ok(Box::new(ConvRot {
        codes,
        scales: scale.floats(),
        correction: None,
        rotation,
        cols: view.cols as usize,
        logical,
    }))
}

/// Which of the requantized schemes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kitchen {
    /// `comfy.asym_w4a8_int8`.
    Asym4,
    /// `comfy.w6a8_int8`.
    W6,
    /// `w4a8.convrot`.
    W4a8,
}

fn prepare_kitchen<'a>(
    tensor: &Encoded<'a>,
    logical: Logical,
    view: View,
    kind: Kitchen,
) -> DecodeResult<Box<dyn Decoder + 'a>> {
    let params = Params::new(tensor, &["group_size", "rotation", "rotation_size"])?;
    let roles: &[&str] = match kind {
        Kitchen::Asym4 => &["weight", "group_scale", "scale", "codebook", "correction"],
        Kitchen::W6 => &["weight", "group_scale", "scale"],
        Kitchen::W4a8 => &["weight", "group_scale", "scale", "codebook"],
    };
    let parts = Parts::new(tensor, roles)?;
    let group = match kind {
        Kitchen::Asym4 => params.int("group_size", "4, 8 or a positive multiple of 16", |g| {
            g == 4 || g == 8 || (g > 0 && g % 16 == 0)
        })?,
        Kitchen::W6 => params.int("group_size", "a positive multiple of 16", |g| {
            g > 0 && g % 16 == 0
        })?,
        Kitchen::W4a8 => params.int("group_size", "16", |g| g == 16)?,
    } as usize;
    let rotation = Rotation::read(&params)?;
    geometry(&parts, tensor.shape, view, &[rotation.block, group])?;
    let (rows, cols) = (view.rows as usize, view.cols as usize);
    let bits = if kind == Kitchen::W6 { 6 } else { 4 };

    let weight = parts.required("weight")?;
    let mut packed = tensor.shape.to_vec();
    *packed.last_mut().expect("a matrix") = Requant::row_bytes(bits, cols) as u64;
    check(&parts, &weight, &[Dtype::I8], &packed)?;
    let group_scale = parts.required("group_scale")?;
    let gs_dtypes: &[Dtype] = match kind {
        Kitchen::W4a8 => &[Dtype::F8_E4M3],
        _ => &[Dtype::F8_E4M3, Dtype::F32],
    };
    let mut grouped = tensor.shape.to_vec();
    *grouped.last_mut().expect("a matrix") = (cols / group) as u64;
    check(&parts, &group_scale, gs_dtypes, &grouped)?;
    let scale = parts.required("scale")?;
    check_count(&parts, &scale, &[Dtype::F32], view.rows)?;
    let levels = match parts.optional("codebook") {
        Some(codebook) => {
            check_count(&parts, &codebook, &[Dtype::F32], 16)?;
            codebook.floats()
        }
        None => {
            let offset = 1i32 << (bits - 1);
            (0..1i32 << bits).map(|q| (q - offset) as f32).collect()
        }
    };
    let correction = match parts.optional("correction") {
        Some(part) => {
            let shape = [(cols / group) as u64, view.rows];
            check(
                &parts,
                &part,
                &[Dtype::F32, Dtype::BF16, Dtype::F16],
                &shape,
            )?;
            Some(Correction::new(
                part.floats(),
                rows,
                cols,
                group,
                rotation.block,
            ))
        }
        None => None,
    };
    let requant = Requant {
        bytes: weight.bytes,
        bits,
        levels,
        group,
        group_scales: group_scale.floats(),
    };
    if let Some((i, j)) = requant.first_nan(rows, cols) {
        return Err(DecodeError::Refused {
            scheme: tensor.scheme.to_owned(),
            why: format!("element ({i}, {j}): its level times its group scale is NaN"),
        });
    }
    Ok(Box::new(ConvRot {
        codes: Codes::Requant(requant),
        scales: scale.floats(),
        correction,
        rotation,
        cols,
        logical,
    }))
}

/// The schemes of this module.
pub(super) const SCHEMES: [super::Scheme; 5] = [
    super::Scheme {
        name: "int8.convrot",
        prepare: |t, l, v| prepare_plain(t, l, v, 8),
    },
    super::Scheme {
        name: "int4.convrot",
        prepare: |t, l, v| prepare_plain(t, l, v, 4),
    },
    super::Scheme {
        name: "comfy.asym_w4a8_int8",
        prepare: |t, l, v| prepare_kitchen(t, l, v, Kitchen::Asym4),
    },
    super::Scheme {
        name: "comfy.w6a8_int8",
        prepare: |t, l, v| prepare_kitchen(t, l, v, Kitchen::W6),
    },
    super::Scheme {
        name: "w4a8.convrot",
        prepare: |t, l, v| prepare_kitchen(t, l, v, Kitchen::W4a8),
    },
];

#[cfg(test)]
mod tests;
