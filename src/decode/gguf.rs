//! ggml's block types, `gguf.<type>` (spec §6 `gguf.*`): `q4_0`, `q4_1`, `q5_0`, `q5_1`, `q8_0`,
//! `q2_k`, `q3_k`, `q4_k`, `q5_k`, `q6_k`, `mxfp4`, `nvfp4`, `q1_0`, `q2_0`.
//!
//! Parts: `blocks`, `U8`, the producer's structs of `S` bytes as llama.cpp writes them, shaped
//! `[lead…, C/n, S]` when the type's `n` divides the last extent `C`, else `[N/n, S]` for `N`
//! elements; `gguf.nvfp4` adds an optional `scale` and `input_scale` (`F32`, one element each).
//! The one param, `block_size`, must be the type's `n`.
//!
//! Data flow: these schemes flatten the tensor, struct `k` holding elements `k·n … k·n + n − 1`
//! in row-major order, so a range of rows of the `[R, C]` view is a range of elements that may
//! start and end inside a struct. The decoder walks that range one struct at a time: it decodes
//! the whole struct into a stack buffer of f32, in ggml's own order of f32 operations as the
//! spec's table writes them, then rounds the elements the range covers once to the logical
//! dtype. Nothing is allocated per element or per struct.
//!
//! Non-goals: the `iq*`, `tq*` and `q8_k`/`q8_1` types (not in the spec's table); ggml's plain
//! types (`f32`, `f16`, `bf16`, integers), which are plain tensors.

use super::{elem, DecodeResult, Decoder, Encoded, Logical, Params, Parts, View};
use crate::format::Dtype;

/// A ggml block type: its scheme, elements and bytes per struct, and how a struct decodes.
struct Kind {
    /// `gguf.<type>`.
    scheme: &'static str,
    /// Elements per struct, `n` (the `block_size` param).
    n: usize,
    /// Bytes per struct, `S`.
    size: usize,
    /// Fills `y` (exactly `n` values) from one struct `b` (exactly `S` bytes), unrounded.
    decode: fn(&[u8], &mut [f32]),
}

/// The largest `n` of any type: the size of the decode buffer.
const MAX_N: usize = 256;

/// ggml's `kvalues_fp4` (spec Appendix A.2): E2M1's values doubled, by code.
const K: [f32; 16] = [
    0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0,
];

/// The blocks of a tensor, decoded by rows of its `[R, C]` view.
struct Structs<'a> {
    kind: &'static Kind,
    /// The `blocks` part: whole structs, `N/n · S` bytes.
    bytes: &'a [u8],
    cols: u64,
    logical: Logical,
    /// `gguf.nvfp4`'s `scale`, applied after the struct's own arithmetic.
    scale: Option<f32>,
}

impl Decoder for Structs<'_> {
    fn rows(&self, first: u64, out: &mut [u8]) -> DecodeResult<()> {
        let size = self.logical.size();
        let row_bytes = self.cols as usize * size;
        if row_bytes == 0 {
            return Ok(());
        }
        let (n, struct_bytes) = (self.kind.n, self.kind.size);
        let count = out.len() / row_bytes * self.cols as usize;
        let start = (first * self.cols) as usize;
        let mut buf = [0f32; MAX_N];
        let values = &mut buf[..n];
        let mut done = 0;
        while done < count {
            let (k, offset) = ((start + done) / n, (start + done) % n);
            let take = (n - offset).min(count - done);
            (self.kind.decode)(
                &self.bytes[k * struct_bytes..(k + 1) * struct_bytes],
                values,
            );
            let covered = &mut values[offset..offset + take];
            if let Some(s) = self.scale {
                covered.iter_mut().for_each(|v| *v *= s);
            }
            store_run(
                self.logical,
                covered,
                &mut out[done * size..(done + take) * size],
            );
            done += take;
        }
        Ok(())
    }
}

/// Writes `values` rounded to `logical` ([`Logical::store`]) into `out`, choosing the dtype once
/// per run rather than once per element.
#[inline]
fn store_run(logical: Logical, values: &[f32], out: &mut [u8]) {
    match logical {
        Logical::F32 => store_as(Logical::F32, values, out),
        Logical::BF16 => store_as(Logical::BF16, values, out),
        Logical::F16 => store_as(Logical::F16, values, out),
    }
}

#[inline(always)]
fn store_as(logical: Logical, values: &[f32], out: &mut [u8]) {
    for (&v, o) in values.iter().zip(out.chunks_exact_mut(logical.size())) {
        logical.store(v, o);
    }
}

/// The stored shape of `blocks` for a logical `shape` of `count` elements (a multiple of `n`):
/// `[lead…, C/n, S]` when `n` divides the last extent `C`, else `[count/n, S]`.
fn blocks_shape(kind: &Kind, shape: &[u64], count: u64) -> Vec<u64> {
    let (n, size) = (kind.n as u64, kind.size as u64);
    match shape.split_last() {
        Some((&cols, lead)) if cols.is_multiple_of(n) => {
            let mut s = lead.to_vec();
            s.extend([cols / n, size]);
            s
        }
        _ => vec![count / n, size],
    }
}

/// Checks `tensor` against `kind`'s rules (param, parts, element count, `blocks` shape) and
/// prepares its decoder.
fn prepare<'a>(
    tensor: &Encoded<'a>,
    logical: Logical,
    view: View,
    kind: &'static Kind,
) -> DecodeResult<Box<dyn Decoder + 'a>> {
    let params = Params::new(tensor, &["block_size"])?;
    let n = kind.n as u64;
    params.int("block_size", &n.to_string(), |v| v == n as i128)?;
    let nvfp4 = kind.scheme == "gguf.nvfp4";
    let roles: &[&str] = if nvfp4 {
        &["blocks", "scale", "input_scale"]
    } else {
        &["blocks"]
    };
    let parts = Parts::new(tensor, roles)?;
    let count = view.len();
    if !count.is_multiple_of(n) {
        return Err(parts.bad_tensor(format!(
            "shape {:?} holds {count} elements, not a multiple of the block size {n}",
            tensor.shape
        )));
    }
    let blocks = parts.required("blocks")?;
    parts.dtype(&blocks, &[Dtype::U8])?;
    parts.shape(&blocks, &blocks_shape(kind, tensor.shape, count))?;
    let want_bytes = count / n * kind.size as u64;
    if blocks.bytes.len() as u64 != want_bytes {
        return Err(parts.bad(
            &blocks,
            format!("holds {} bytes, not {want_bytes}", blocks.bytes.len()),
        ));
    }
    let mut scale = None;
    if nvfp4 {
        for role in ["scale", "input_scale"] {
            if let Some(part) = parts.optional(role) {
                parts.dtype(&part, &[Dtype::F32])?;
                parts.elements(&part, 1)?;
                if part.bytes.len() != 4 {
                    return Err(
                        parts.bad(&part, format!("holds {} bytes, not 4", part.bytes.len()))
                    );
                }
                if role == "scale" {
                    scale = Some(f32::from_le_bytes(
                        part.bytes[..4].try_into().expect("4 bytes"),
                    ));
                }
            }
        }
    }
    Ok(Box::new(Structs {
        kind,
        bytes: blocks.bytes,
        cols: view.cols,
        logical,
        scale,
    }))
}

// ---- Fields and element formats inside structs -------------------------------------------

/// A struct and its output as arrays, so the decoders index without bounds checks.
#[inline(always)]
fn fixed<'b, 'y, const S: usize, const N: usize>(
    b: &'b [u8],
    y: &'y mut [f32],
) -> (&'b [u8; S], &'y mut [f32; N]) {
    (
        b.try_into().expect("a whole struct"),
        y.try_into().expect("a struct's elements"),
    )
}

/// The little-endian `F16` field at byte `at`, exactly.
#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    elem::f16(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// `2^(e − 128)` exactly (ggml's `ggml_e8m0_to_fp32_half`): subnormal for `e < 2`, never NaN.
#[inline(always)]
fn e8m0_half(e: u8) -> f32 {
    match e {
        0 => f32::from_bits(1 << 21),
        1 => f32::from_bits(1 << 22),
        e => f32::from_bits(((e - 1) as u32) << 23),
    }
}

#[inline(always)]
fn lo(x: u8) -> u8 {
    x & 15
}

#[inline(always)]
fn hi(x: u8) -> u8 {
    x >> 4
}

// ---- The 32-element types -----------------------------------------------------------------

/// `q4_0`: `d`@0, `qs[16]`@2; `(q − 8) × d`, element `t < 16` the low nibble of `qs[t]`, `t ≥ 16`
/// the high nibble of `qs[t − 16]`.
fn q4_0(b: &[u8], y: &mut [f32]) {
    let (b, y) = fixed::<18, 32>(b, y);
    let d = f16_at(b, 0);
    for j in 0..16 {
        let q = b[2 + j];
        y[j] = (lo(q) as i32 - 8) as f32 * d;
        y[j + 16] = (hi(q) as i32 - 8) as f32 * d;
    }
}

/// `q4_1`: `d`@0, `m`@2, `qs[16]`@4; `q × d + m`, `q` as `q4_0`.
fn q4_1(b: &[u8], y: &mut [f32]) {
    let (b, y) = fixed::<20, 32>(b, y);
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for j in 0..16 {
        let q = b[4 + j];
        y[j] = lo(q) as f32 * d + m;
        y[j + 16] = hi(q) as f32 * d + m;
    }
}

/// `q5_0`'s and `q5_1`'s 5-bit codes: `q4_0`'s nibble plus `16 · bit(qh, t)`; `v` gives each
/// code's value.
#[inline(always)]
fn five_bit(qh: u32, qs: &[u8; 16], y: &mut [f32; 32], v: impl Fn(u32) -> f32) {
    for (j, &q) in qs.iter().enumerate() {
        y[j] = v(lo(q) as u32 | ((qh >> j) & 1) << 4);
        y[j + 16] = v(hi(q) as u32 | ((qh >> (j + 16)) & 1) << 4);
    }
}

/// `q5_0`: `d`@0, `qh` U32@2, `qs[16]`@6; `(q − 16) × d`.
fn q5_0(b: &[u8], y: &mut [f32]) {
    let (b, y) = fixed::<22, 32>(b, y);
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = b[6..22].try_into().expect("16 bytes");
    five_bit(qh, qs, y, |q| (q as i32 - 16) as f32 * d);
}

/// `q5_1`: `d`@0, `m`@2, `qh` U32@4, `qs[16]`@8; `q × d + m`.
fn q5_1(b: &[u8], y: &mut [f32]) {
    let (b, y) = fixed::<24, 32>(b, y);
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = b[8..24].try_into().expect("16 bytes");
    five_bit(qh, qs, y, |q| q as f32 * d + m);
}

/// `q8_0`: `d`@0, `qs` I8[32]@2; `qs[t] × d`.
fn q8_0(b: &[u8], y: &mut [f32]) {
    let (b, y) = fixed::<34, 32>(b, y);
    let d = f16_at(b, 0);
    for (v, &q) in y.iter_mut().zip(&b[2..34]) {
        *v = q as i8 as f32 * d;
    }
}

/// `mxfp4`: `e`@0, `qs[16]`@1; `K[q] × 2^(e − 128)`, `q` as `q4_0`.
fn mxfp4(b: &[u8], y: &mut [f32]) {
    let (b, y) = fixed::<17, 32>(b, y);
    let d = e8m0_half(b[0]);
    for j in 0..16 {
        let q = b[1 + j];
        y[j] = K[lo(q) as usize] * d;
        y[j + 16] = K[hi(q) as usize] * d;
    }
}

/// `nvfp4`: `d[4]` UE4M3@0, `qs[32]`@4; `K[q] × (UE4M3(d[s]) × 0.5)` for sub-block
/// `s = ⌊t/16⌋`, `q` the low (`t mod 16 < 8`) or high nibble of `qs[8s + t mod 8]`.
fn nvfp4(b: &[u8], y: &mut [f32]) {
    let (b, y) = fixed::<36, 64>(b, y);
    for s in 0..4 {
        let d = elem::ue4m3(b[s]) * 0.5;
        for j in 0..8 {
            let q = b[4 + 8 * s + j];
            y[16 * s + j] = K[lo(q) as usize] * d;
            y[16 * s + 8 + j] = K[hi(q) as usize] * d;
        }
    }
}

/// `q1_0`: `d`@0, `qs[16]`@2; `d` where `bit(qs[⌊t/8⌋], t mod 8)`, else `−d`.
fn q1_0(b: &[u8], y: &mut [f32]) {
    let (b, y) = fixed::<18, 128>(b, y);
    let d = f16_at(b, 0);
    for (t, v) in y.iter_mut().enumerate() {
        *v = if (b[2 + t / 8] >> (t % 8)) & 1 == 1 {
            d
        } else {
            -d
        };
    }
}

/// `q2_0`: `d`@0, `qs[16]`@2; `(q − 1) × d`, `q = (qs[⌊t/4⌋] >> 2·(t mod 4)) & 3`.
fn q2_0(b: &[u8], y: &mut [f32]) {
    let (b, y) = fixed::<18, 64>(b, y);
    let d = f16_at(b, 0);
    for (t, v) in y.iter_mut().enumerate() {
        let q = (b[2 + t / 4] >> (2 * (t % 4))) & 3;
        *v = (q as i32 - 1) as f32 * d;
    }
}

// ---- The k-types (256 elements) ------------------------------------------------------------

/// `q2_k`: `scales[16]`@0, `qs[64]`@16, `d`@80, `dmin`@82. Sub-block `b = ⌊t/16⌋` has
/// `c = scales[b]`; `(d × lo(c)) × q − dmin × hi(c)`, `q = (qs[32h + 16·(b mod 2) + l] >> 2j) & 3`
/// with `h = ⌊t/128⌋`, `j = ⌊(t mod 128)/32⌋`, `l = t mod 16`.
fn q2_k(b: &[u8], y: &mut [f32]) {
    let (b, y) = fixed::<84, 256>(b, y);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for h in 0..2 {
        for j in 0..4 {
            for s in 0..2 {
                let c = b[8 * h + 2 * j + s];
                let (dl, ml) = (d * lo(c) as f32, dmin * hi(c) as f32);
                let qs = &b[16 + 32 * h + 16 * s..16 + 32 * h + 16 * s + 16];
                let out = &mut y[128 * h + 32 * j + 16 * s..128 * h + 32 * j + 16 * s + 16];
                for (v, &q) in out.iter_mut().zip(qs) {
                    *v = dl * ((q >> (2 * j)) & 3) as f32 - ml;
                }
            }
        }
    }
}

/// `q3_k`'s 6-bit scale `c − 32` of sub-block `sub` (0..16), from `scales[12]`.
#[inline(always)]
fn q3_scale(scales: &[u8], sub: usize) -> i32 {
    let low = if sub < 8 {
        lo(scales[sub])
    } else {
        hi(scales[sub - 8])
    };
    let high = (scales[8 + sub % 4] >> (2 * (sub / 4))) & 3;
    (low | high << 4) as i32 - 32
}

/// `q3_k`: `hmask[32]`@0, `qs[64]`@32, `scales[12]`@96, `d`@108;
/// `(d × (c − 32)) × (q − 4 + 4·bit(hmask[16·(b mod 2) + l], ⌊t/32⌋))`, `q` as `q2_k`.
fn q3_k(b: &[u8], y: &mut [f32]) {
    let (b, y) = fixed::<110, 256>(b, y);
    let d = f16_at(b, 108);
    let scales = &b[96..108];
    for h in 0..2 {
        for j in 0..4 {
            let high_bit = 4 * h + j;
            for s in 0..2 {
                let dl = d * q3_scale(scales, 8 * h + 2 * j + s) as f32;
                let base = 16 * s;
                let qs = &b[32 + 32 * h + base..32 + 32 * h + base + 16];
                let hmask = &b[base..base + 16];
                let out = &mut y[128 * h + 32 * j + base..128 * h + 32 * j + base + 16];
                for ((v, &q), &m) in out.iter_mut().zip(qs).zip(hmask) {
                    let low = ((q >> (2 * j)) & 3) as i32;
                    let high = ((m >> high_bit) & 1) as i32;
                    *v = dl * (low - 4 + 4 * high) as f32;
                }
            }
        }
    }
}

/// ggml's `get_scale_min_k4`: sub-block `a`'s 6-bit scale `c` and min `e` from `scales[12]`.
#[inline(always)]
fn scale_min(scales: &[u8], a: usize) -> (f32, f32) {
    let (c, e) = if a < 4 {
        (scales[a] & 63, scales[a + 4] & 63)
    } else {
        (
            lo(scales[a + 4]) | (scales[a - 4] >> 6) << 4,
            hi(scales[a + 4]) | (scales[a] >> 6) << 4,
        )
    };
    (c as f32, e as f32)
}

/// `q4_k` and `q5_k`: 8 sub-blocks `a = ⌊t/32⌋` of `(d × c) × q − dmin × e`, `q` the low
/// (`a` even) or high nibble of `qs[32·⌊a/2⌋ + t mod 32]`, plus `16·bit(qh[t mod 32], a)` when
/// `qh` is given (`q5_k`).
#[inline(always)]
fn k_quant(b: &[u8], qs: &[u8], qh: Option<&[u8; 32]>, y: &mut [f32; 256]) {
    let (d, dmin, scales) = (f16_at(b, 0), f16_at(b, 2), &b[4..16]);
    for a in 0..8 {
        let (c, e) = scale_min(scales, a);
        let (dl, ml) = (d * c, dmin * e);
        let qs: &[u8; 32] = qs[32 * (a / 2)..32 * (a / 2) + 32]
            .try_into()
            .expect("32 bytes");
        let out = &mut y[32 * a..32 * a + 32];
        let shift = 4 * (a % 2);
        match qh {
            None => {
                for (v, &q) in out.iter_mut().zip(qs) {
                    *v = dl * ((q >> shift) & 15) as f32 - ml;
                }
            }
            Some(qh) => {
                for ((v, &q), &h) in out.iter_mut().zip(qs).zip(qh) {
                    let q = ((q >> shift) & 15) | ((h >> a) & 1) << 4;
                    *v = dl * q as f32 - ml;
                }
            }
        }
    }
}

/// `q4_k`: `d`@0, `dmin`@2, `scales[12]`@4, `qs[128]`@16.
fn q4_k(b: &[u8], y: &mut [f32]) {
    let (b, y) = fixed::<144, 256>(b, y);
    k_quant(b, &b[16..144], None, y);
}

/// `q5_k`: `d`@0, `dmin`@2, `scales[12]`@4, `qh[32]`@16, `qs[128]`@48.
fn q5_k(b: &[u8], y: &mut [f32]) {
    let (b, y) = fixed::<176, 256>(b, y);
    let qh: &[u8; 32] = b[16..48].try_into().expect("32 bytes");
    k_quant(b, &b[48..176], Some(qh), y);
}

/// `q6_k`: `ql[128]`@0, `qh[64]`@128, `scales` I8[16]@192, `d`@208;
/// `(d × scales[8h + ⌊l/16⌋ + 2j]) × (q − 32)` with `h = ⌊t/128⌋`, `j = ⌊(t mod 128)/32⌋`,
/// `l = t mod 32`; `q` is the low (`j < 2`) or high nibble of `ql[64h + 32·(j mod 2) + l]`, plus
/// `16·((qh[32h + l] >> 2j) & 3)`.
fn q6_k(b: &[u8], y: &mut [f32]) {
    let (b, y) = fixed::<210, 256>(b, y);
    let d = f16_at(b, 208);
    for h in 0..2 {
        for j in 0..4 {
            let ql = &b[64 * h + 32 * (j % 2)..64 * h + 32 * (j % 2) + 32];
            let qh = &b[128 + 32 * h..128 + 32 * h + 32];
            let shift = if j < 2 { 0 } else { 4 };
            let out = &mut y[128 * h + 32 * j..128 * h + 32 * j + 32];
            for half in 0..2 {
                let dl = d * b[192 + 8 * h + half + 2 * j] as i8 as f32;
                let span = 16 * half..16 * half + 16;
                for ((v, &l), &hb) in out[span.clone()]
                    .iter_mut()
                    .zip(&ql[span.clone()])
                    .zip(&qh[span])
                {
                    let q = ((l >> shift) & 15) | ((hb >> (2 * j)) & 3) << 4;
                    *v = dl * (q as i32 - 32) as f32;
                }
            }
        }
    }
}

// ---- The table ---------------------------------------------------------------------------

/// `gguf.<type>`: `n` elements in structs of `size` bytes, decoded by `decode`.
macro_rules! gguf {
    ($name:literal, $n:literal, $size:literal, $decode:ident) => {
        super::Scheme {
            name: concat!("gguf.", $name),
            prepare: |t, l, v| {
                static KIND: Kind = Kind {
                    scheme: concat!("gguf.", $name),
                    n: $n,
                    size: $size,
                    decode: $decode,
                };
                prepare(t, l, v, &KIND)
            },
        }
    };
}

/// The schemes of this module: every type of the spec's `gguf.*` table, in its order.
pub(super) const SCHEMES: [super::Scheme; 14] = [
    gguf!("q4_0", 32, 18, q4_0),
    gguf!("q4_1", 32, 20, q4_1),
    gguf!("q5_0", 32, 22, q5_0),
    gguf!("q5_1", 32, 24, q5_1),
    gguf!("q8_0", 32, 34, q8_0),
    gguf!("q2_k", 256, 84, q2_k),
    gguf!("q3_k", 256, 110, q3_k),
    gguf!("q4_k", 256, 144, q4_k),
    gguf!("q5_k", 256, 176, q5_k),
    gguf!("q6_k", 256, 210, q6_k),
    gguf!("mxfp4", 32, 17, mxfp4),
    gguf!("nvfp4", 64, 36, nvfp4),
    gguf!("q1_0", 128, 18, q1_0),
    gguf!("q2_0", 64, 18, q2_0),
];

#[cfg(test)]
mod tests {
    use super::super::testing::{decoded, floats, le_f32s, params, refusal};
    use super::super::{prepare, DecodeError, Encoded, Part};
    use crate::format::{Config, Dtype, Value};

    /// Every type of the spec's table: name, `n`, `S`.
    const TYPES: [(&str, u64, u64); 14] = [
        ("q4_0", 32, 18),
        ("q4_1", 32, 20),
        ("q5_0", 32, 22),
        ("q5_1", 32, 24),
        ("q8_0", 32, 34),
        ("q2_k", 256, 84),
        ("q3_k", 256, 110),
        ("q4_k", 256, 144),
        ("q5_k", 256, 176),
        ("q6_k", 256, 210),
        ("mxfp4", 32, 17),
        ("nvfp4", 64, 36),
        ("q1_0", 128, 18),
        ("q2_0", 64, 18),
    ];

    fn block_size(n: u64) -> Config {
        params(&[("block_size", Value::Uint(n))])
    }

    fn blocks<'a>(shape: &'a [u64], bytes: &'a [u8]) -> Part<'a> {
        Part {
            role: "blocks",
            dtype: &Dtype::U8,
            shape,
            bytes,
        }
    }

    fn f32_part<'a>(role: &'a str, shape: &'a [u64], bytes: &'a [u8]) -> Part<'a> {
        Part {
            role,
            dtype: &Dtype::F32,
            shape,
            bytes,
        }
    }

    fn tensor<'a>(
        scheme: &'a str,
        params: &'a Config,
        shape: &'a [u64],
        parts: Vec<Part<'a>>,
    ) -> Encoded<'a> {
        Encoded {
            scheme,
            params,
            dtype: &Dtype::F32,
            shape,
            parts,
        }
    }

    fn accepted(t: &Encoded<'_>) {
        if let Err(e) = prepare(t) {
            panic!("refused: {e}");
        }
    }

    /// Decodes one struct of `scheme` into F32.
    fn one_struct(scheme: &str, n: u64, bytes: &[u8]) -> Vec<f32> {
        let p = block_size(n);
        let shape = [n];
        let bshape = [1, bytes.len() as u64];
        floats(&tensor(scheme, &p, &shape, vec![blocks(&bshape, bytes)]))
    }

    #[test]
    fn every_type_of_the_table_is_a_scheme_that_takes_exactly_its_block_size() {
        for (name, n, s) in TYPES {
            let scheme = format!("gguf.{name}");
            let bytes = vec![0u8; s as usize];
            let bshape = [1, s];
            let shape = [n];
            let right = block_size(n);
            accepted(&tensor(
                &scheme,
                &right,
                &shape,
                vec![blocks(&bshape, &bytes)],
            ));
            for wrong in [n - 1, n + 1, 2 * n] {
                let p = block_size(wrong);
                let t = tensor(&scheme, &p, &shape, vec![blocks(&bshape, &bytes)]);
                assert!(
                    matches!(
                        refusal(&t),
                        DecodeError::BadParam {
                            param: "block_size",
                            ..
                        }
                    ),
                    "{scheme} took block_size {wrong}"
                );
            }
        }
    }

    #[test]
    fn a_block_size_that_is_missing_or_not_an_integer_is_refused() {
        let bytes = [0u8; 18];
        let (shape, bshape) = ([32], [1, 18]);
        let none = Config::new();
        let t = tensor("gguf.q4_0", &none, &shape, vec![blocks(&bshape, &bytes)]);
        assert!(matches!(refusal(&t), DecodeError::MissingParam { .. }));
        let text = params(&[("block_size", Value::Text("32".into()))]);
        let t = tensor("gguf.q4_0", &text, &shape, vec![blocks(&bshape, &bytes)]);
        assert!(matches!(refusal(&t), DecodeError::BadParam { .. }));
    }

    #[test]
    fn an_unknown_param_is_refused() {
        let bytes = [0u8; 18];
        let (shape, bshape) = ([32], [1, 18]);
        let p = params(&[
            ("block_size", Value::Uint(32)),
            ("group_size", Value::Uint(32)),
        ]);
        let t = tensor("gguf.q4_0", &p, &shape, vec![blocks(&bshape, &bytes)]);
        assert_eq!(
            refusal(&t),
            DecodeError::UnknownParam {
                scheme: "gguf.q4_0".into(),
                param: "group_size".into()
            }
        );
    }

    #[test]
    fn a_part_the_scheme_does_not_list_is_refused_and_only_nvfp4_takes_scales() {
        let bytes = [0u8; 36];
        let one = 2f32.to_le_bytes();
        let (shape, bshape, scalar) = ([64], [1, 36], [1]);
        let p = block_size(64);
        let with = |scheme: &'static str, role: &'static str| {
            tensor(
                scheme,
                &p,
                &shape,
                vec![blocks(&bshape, &bytes), f32_part(role, &scalar, &one)],
            )
        };
        accepted(&with("gguf.nvfp4", "scale"));
        accepted(&with("gguf.nvfp4", "input_scale"));
        assert!(matches!(
            refusal(&with("gguf.nvfp4", "bias")),
            DecodeError::ExtraPart { .. }
        ));
        assert!(matches!(
            refusal(&with("gguf.q2_0", "scale")),
            DecodeError::ExtraPart { .. }
        ));
        let t = tensor("gguf.nvfp4", &p, &shape, vec![]);
        assert!(matches!(
            refusal(&t),
            DecodeError::MissingPart { role: "blocks", .. }
        ));
    }

    #[test]
    fn nvfp4_scales_must_be_one_f32_element() {
        let bytes = [0u8; 36];
        let (shape, bshape) = ([64], [1, 36]);
        let p = block_size(64);
        let four = [0u8; 4];
        let eight = [0u8; 8];
        for role in ["scale", "input_scale"] {
            let ok = [&[][..], &[1][..], &[1, 1][..]];
            for s in ok {
                let t = tensor(
                    "gguf.nvfp4",
                    &p,
                    &shape,
                    vec![blocks(&bshape, &bytes), f32_part(role, s, &four)],
                );
                accepted(&t);
            }
            let two = [2];
            let t = tensor(
                "gguf.nvfp4",
                &p,
                &shape,
                vec![blocks(&bshape, &bytes), f32_part(role, &two, &eight)],
            );
            assert!(matches!(refusal(&t), DecodeError::BadPart { .. }), "{role}");
            let half = Part {
                role,
                dtype: &Dtype::F16,
                shape: &[1],
                bytes: &four[..2],
            };
            let t = tensor(
                "gguf.nvfp4",
                &p,
                &shape,
                vec![blocks(&bshape, &bytes), half],
            );
            assert!(matches!(refusal(&t), DecodeError::BadPart { .. }), "{role}");
        }
    }

    #[test]
    fn an_element_count_that_is_not_whole_blocks_is_refused() {
        let p = block_size(32);
        let bytes = [0u8; 3 * 18];
        let (shape, bshape) = ([96], [3, 18]);
        accepted(&tensor(
            "gguf.q4_0",
            &p,
            &shape,
            vec![blocks(&bshape, &bytes)],
        ));
        for bad in [[95], [97], [100]] {
            let t = tensor("gguf.q4_0", &p, &bad, vec![blocks(&bshape, &bytes)]);
            assert!(
                matches!(refusal(&t), DecodeError::BadTensor { .. }),
                "{bad:?}"
            );
        }
        let scalar: [u64; 0] = [];
        let t = tensor("gguf.q4_0", &p, &scalar, vec![blocks(&bshape, &bytes)]);
        assert!(matches!(refusal(&t), DecodeError::BadTensor { .. }));
        let p = block_size(256);
        let k = [0u8; 144];
        let t = tensor("gguf.q4_k", &p, &[128], vec![blocks(&[1, 144], &k)]);
        assert!(matches!(refusal(&t), DecodeError::BadTensor { .. }));
        accepted(&tensor(
            "gguf.q4_k",
            &p,
            &[256],
            vec![blocks(&[1, 144], &k)],
        ));
        accepted(&tensor(
            "gguf.q4_k",
            &p,
            &[2, 128],
            vec![blocks(&[1, 144], &k)],
        ));
    }

    #[test]
    fn blocks_keep_the_leading_extents_when_the_last_is_whole_blocks_and_flatten_otherwise() {
        let p = block_size(32);
        let bytes = [0u8; 4 * 18];
        let case = |shape: &[u64], bshape: &[u64]| -> Result<(), DecodeError> {
            let t = tensor("gguf.q4_0", &p, shape, vec![blocks(bshape, &bytes)]);
            prepare(&t).map(|_| ())
        };
        assert_eq!(case(&[2, 64], &[2, 2, 18]), Ok(()));
        assert_eq!(case(&[1, 2, 64], &[1, 2, 2, 18]), Ok(()));
        assert_eq!(case(&[128], &[4, 18]), Ok(()));
        assert_eq!(case(&[4, 32], &[4, 1, 18]), Ok(()));
        assert_eq!(case(&[8, 16], &[4, 18]), Ok(()));
        assert_eq!(case(&[2, 2, 32], &[2, 2, 1, 18]), Ok(()));
        for (shape, bshape) in [
            (&[2, 64][..], &[4, 18][..]),
            (&[2, 64], &[2, 4, 18]),
            (&[2, 64], &[2, 2, 19]),
            (&[8, 16], &[8, 1, 18]),
            (&[4, 32], &[4, 18]),
            (&[128], &[1, 4, 18]),
        ] {
            assert!(
                matches!(case(shape, bshape), Err(DecodeError::BadPart { .. })),
                "{shape:?} took blocks {bshape:?}"
            );
        }
        let t = tensor(
            "gguf.q4_0",
            &p,
            &[128],
            vec![Part {
                role: "blocks",
                dtype: &Dtype::I8,
                shape: &[4, 18],
                bytes: &bytes,
            }],
        );
        assert!(matches!(refusal(&t), DecodeError::BadPart { .. }));
    }

    #[test]
    fn an_empty_tensor_decodes_to_nothing() {
        let p = block_size(32);
        let t = tensor("gguf.q8_0", &p, &[0, 32], vec![blocks(&[0, 1, 34], &[])]);
        assert!(floats(&t).is_empty());
        let t = tensor("gguf.q8_0", &p, &[3, 0], vec![blocks(&[3, 0, 34], &[])]);
        assert!(floats(&t).is_empty());
    }

    #[test]
    fn q4_0_is_the_nibble_minus_8_times_d_low_nibbles_first() {
        // d = 0.5; qs[j] holds j in its low nibble and 15 − j in its high one.
        let mut b = vec![0x00, 0x38];
        b.extend((0..16u8).map(|j| j | (15 - j) << 4));
        let want: Vec<f32> = [
            -4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5,
            3.5, 3.0, 2.5, 2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -1.5, -2.0, -2.5, -3.0, -3.5, -4.0,
        ]
        .to_vec();
        assert_eq!(one_struct("gguf.q4_0", 32, &b), want);
    }

    #[test]
    fn q8_0_is_the_signed_byte_times_d() {
        // d = 0.25.
        let mut b = vec![0x00, 0x34];
        let qs: [i8; 32] = [
            0, 1, -1, 127, -128, 2, -2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,
            19, 20, 21, 22, 23, 24, 25, 26, -100,
        ];
        b.extend(qs.iter().map(|&q| q as u8));
        let got = one_struct("gguf.q8_0", 32, &b);
        assert_eq!(
            &got[..8],
            &[0.0, 0.25, -0.25, 31.75, -32.0, 0.5, -0.5, 0.75]
        );
        assert_eq!(got[31], -25.0);
    }

    #[test]
    fn q4_k_takes_six_bit_scales_and_mins_per_sub_block() {
        let mut b = vec![0u8; 144];
        b[0..2].copy_from_slice(&[0x00, 0x3C]); // d = 1
        b[2..4].copy_from_slice(&[0x00, 0x38]); // dmin = 0.5
                                                // c0..c3 = 1, 2, 3, 4 (scales[0]'s top bits 01 feed c4); e0..e3 = 5, 6, 7, 8
                                                // (scales[4]'s top bits 10 feed e4); c4..c7 = 2 + 16, 0, 1, 4; e4..e7 = 3 + 32, 0, 1, 15.
        b[4..16].copy_from_slice(&[0x41, 2, 3, 4, 0x85, 6, 7, 8, 0x32, 0x00, 0x11, 0xF4]);
        b[16] = 0xA9; // qs[0]: t = 0 gets 9, t = 32 gets 10
        b[16 + 32] = 0x0F; // qs[32]: t = 64 gets 15, t = 96 gets 0
        b[16 + 127] = 0x70; // qs[127]: t = 223 (a = 6) gets 0, t = 255 (a = 7) gets 7
        let got = one_struct("gguf.q4_k", 256, &b);
        let at = |t: usize| got[t];
        assert_eq!(at(0), 1.0 * 9.0 - 0.5 * 5.0);
        assert_eq!(at(1), -2.5);
        assert_eq!(at(32), 2.0 * 10.0 - 0.5 * 6.0);
        assert_eq!(at(64), 3.0 * 15.0 - 0.5 * 7.0);
        assert_eq!(at(96), -4.0);
        assert_eq!(at(128), -0.5 * 35.0);
        assert_eq!(at(160), 0.0);
        assert_eq!(at(192), -0.5);
        assert_eq!(at(223), 1.0 * 0.0 - 0.5 * 1.0);
        assert_eq!(at(224), 4.0 * 0.0 - 0.5 * 15.0);
        assert_eq!(at(255), 4.0 * 7.0 - 0.5 * 15.0);
    }

    #[test]
    fn q6_k_takes_low_nibbles_for_the_first_two_quarters_of_each_half() {
        // d = 1, every scale 1, qh = 0: element t = 32 is lo(ql[32]) − 32, t = 96 hi(ql[32]) − 32.
        let mut b = vec![0u8; 210];
        b[192..208].fill(1);
        b[208..210].copy_from_slice(&[0x00, 0x3C]);
        b[32] = 0x21;
        b[64 + 5] = 0x43; // h = 1, j = 0, l = 5: t = 133 (lo); j = 2: t = 197 (hi)
        b[128 + 32 + 5] = 0b1110_0100; // qh for h = 1, l = 5: j = 0..3 add 0, 16, 32, 48
        let got = one_struct("gguf.q6_k", 256, &b);
        assert_eq!(got[32], 1.0 - 32.0);
        assert_eq!(got[96], 2.0 - 32.0);
        assert_eq!(got[133], 3.0 - 32.0);
        assert_eq!(got[165], 16.0 - 32.0);
        assert_eq!(got[197], 4.0 + 32.0 - 32.0);
        assert_eq!(got[229], 48.0 - 32.0);
    }

    #[test]
    fn mxfp4_scales_by_two_to_the_e_minus_128_down_to_subnormals() {
        let mut b = vec![0u8; 17];
        b[1] = 0x97; // element 0: K[7] = 12, element 16: K[9] = −1
        for (e, d) in [
            (128u8, 1.0f32),
            (129, 2.0),
            (1, f32::from_bits(1 << 22)),
            (0, f32::from_bits(1 << 21)),
        ] {
            b[0] = e;
            let got = one_struct("gguf.mxfp4", 32, &b);
            assert_eq!(got[0], 12.0 * d, "e = {e}");
            assert_eq!(got[16], -d, "e = {e}");
        }
        b[0] = 255;
        assert_eq!(one_struct("gguf.mxfp4", 32, &b)[0], f32::INFINITY);
    }

    #[test]
    fn nvfp4_reads_0xff_as_480_as_ggml_does_and_applies_its_scale_last() {
        let mut b = vec![0u8; 36];
        b[..4].copy_from_slice(&[0x38, 0xFF, 0x7F, 0x08]); // 1, 480, 0, 2^−6
        for s in 0..4 {
            b[4 + 8 * s] = 0x72; // element 16s: K[2] = 2; element 16s + 8: K[7] = 12
        }
        let got = one_struct("gguf.nvfp4", 64, &b);
        assert_eq!(
            [got[0], got[8], got[16], got[24], got[32], got[40], got[48], got[56]],
            [
                1.0,
                6.0,
                480.0,
                2880.0,
                0.0,
                0.0,
                2f32.powi(-6),
                6.0 * 2f32.powi(-6)
            ]
        );
        let p = block_size(64);
        let scale = 0.1f32.to_le_bytes();
        let input = 1000f32.to_le_bytes();
        let t = tensor(
            "gguf.nvfp4",
            &p,
            &[64],
            vec![
                blocks(&[1, 36], &b),
                f32_part("input_scale", &[1], &input),
                f32_part("scale", &[1], &scale),
            ],
        );
        let scaled = floats(&t);
        for (g, s) in got.iter().zip(&scaled) {
            assert_eq!(
                *s,
                g * 0.1,
                "scale multiplies once; input_scale never enters"
            );
        }
    }

    #[test]
    fn q1_0_and_q2_0_read_bits_low_first() {
        let mut b = vec![0x00, 0x40]; // d = 2
        b.extend([0b0000_0101u8; 16]);
        let got = one_struct("gguf.q1_0", 128, &b);
        assert_eq!(&got[..4], &[2.0, -2.0, 2.0, -2.0]);
        let mut b = vec![0x00, 0x40];
        b.extend([0b1110_0100u8; 16]); // codes 0, 1, 2, 3
        let got = one_struct("gguf.q2_0", 64, &b);
        assert_eq!(&got[..4], &[-2.0, 0.0, 2.0, 4.0]);
    }

    #[test]
    fn rows_that_start_inside_a_struct_decode_as_the_whole_tensor_does() {
        // 5 structs of q4_1 as a [4, 40] tensor: rows start at elements 0, 40, 80, 120.
        let p = block_size(32);
        let bytes: Vec<u8> = (0..5 * 20u32).map(|i| (i * 37 + 11) as u8).collect();
        let mut bytes = bytes;
        for s in 0..5 {
            bytes[20 * s + 1] = 0x3C; // d near 1
            bytes[20 * s + 3] = 0xBC; // m near −1
        }
        let (shape, bshape) = ([4, 40], [5, 20]);
        let t = tensor("gguf.q4_1", &p, &shape, vec![blocks(&bshape, &bytes)]);
        let whole = floats(&t);
        let decoder = prepare(&t).unwrap();
        for (first, count) in [(0, 1), (1, 1), (1, 2), (2, 2), (3, 1), (0, 4)] {
            let mut out = vec![0u8; count * 40 * 4];
            decoder.rows(first as u64, &mut out).unwrap();
            let got = le_f32s(&out);
            assert_eq!(
                got,
                whole[first * 40..(first + count) * 40],
                "rows {first}+{count}"
            );
        }
    }

    #[test]
    fn outputs_round_once_to_the_logical_dtype_with_canonical_nans() {
        // q8_0: struct 0 has d = NaN (0x7E01); struct 1 has d = 1365/4096 (0x3555) and codes 1
        // then 3, so exactly 1365/4096 and 4095/4096 in f32.
        let mut b = vec![0x01, 0x7E];
        b.extend([1u8; 32]);
        b.extend([0x55, 0x35]);
        b.extend([1u8; 16]);
        b.extend([3u8; 16]);
        let p = block_size(32);
        // BF16: 1365/4096 rounds up to 0x3EAB; 4095/4096 rounds to 1.0. F16: 1365/4096 is
        // exact; 4095/4096 is a tie between 0x3BFF and 0x3C00, and goes to the even 0x3C00.
        for (dtype, nan, one, three) in [
            (Dtype::BF16, 0x7FC0, 0x3EAB, 0x3F80),
            (Dtype::F16, 0x7E00, 0x3555, 0x3C00),
        ] {
            let t = Encoded {
                scheme: "gguf.q8_0",
                params: &p,
                dtype: &dtype,
                shape: &[64],
                parts: vec![blocks(&[2, 34], &b)],
            };
            let out = decoded(&t).unwrap();
            assert_eq!(out.len(), 128);
            let at = |i: usize| u16::from_le_bytes([out[2 * i], out[2 * i + 1]]);
            assert_eq!([at(0), at(31)], [nan, nan], "{dtype}");
            assert_eq!([at(32), at(48)], [one, three], "{dtype}");
        }
    }
}
