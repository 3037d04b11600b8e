//! A `.gguf` file as one component, named after the file's stem.
//!
//! - A plain ggml type (`f32`, `f16`, `bf16`, `i8`…`i64`, `f64`) is a plain tensor of that dtype.
//!   A block type is an encoded tensor of scheme `gguf.<type>` (spec §6), params
//!   `{"block_size": n}`, logical dtype `F32` (what ggml decodes to) and one part, `blocks`
//!   (`U8`, `[lead…, C/n, S]`, or `[N/n, S]` when `n` does not divide the last extent `C`),
//!   holding the file's bytes as they are. Types the decoder does not know (`iq*`, `tq*`,
//!   `q8_1`, `q8_k`) import the same way: stored and shown, only decoding refuses them.
//! - The logical shape is `ne` reversed, or ComfyUI-GGUF's `comfy.gguf.orig_shape.<name>` (an
//!   array of integers) when the file has one; it must hold the tensor's element count.
//! - `gguf.nvfp4`'s per-tensor scales, ggml's `<base>.scale` and `<base>.input_scale` beside
//!   `<base>.weight` (one `F32` element each), become its `scale` and `input_scale` parts.
//! - The KV stays in the recipe only: the component's config is empty, so the decoded view and
//!   loaders see a bare safetensors component, and no GGUF key is read as a Transformers or
//!   Diffusers setting.
//!
//! The lane folder shows the file byte for byte: the recipe ([`SourceFile::Gguf`]) holds the
//! parsed header, which is written again and compared with the file's, and every byte that is
//! neither header nor tensor must be zero. A file that would not come back exactly is refused.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::convention::{EncodedModel, Item, PartModel, PartSource};
use super::lane::{ComponentModel, LaneModel};
use super::scan::SourceTensor;
use super::ImportError;
use crate::decode;
use crate::format::gguf::{self, Gguf, GgufError, KvValue, Layout, TensorInfo};
use crate::format::{ClassRef, Config, Dtype, Value};
use crate::layout::recipe::{ArraySource, SourceFile};

/// The KV key prefix under which ComfyUI-GGUF records a tensor's original shape.
const ORIG_SHAPE: &str = "comfy.gguf.orig_shape.";

/// The first read of a header, in bytes; it grows until the header is read.
const FIRST_READ: u64 = 1 << 20;

/// Reads `path` (lane path `rel`) as component `name`, and records its recipe in `model`.
///
/// # Errors
/// The file is malformed, cannot be re-created byte for byte, or cannot be read; the message
/// names the file and the key or tensor.
pub(crate) fn component(
    model: &mut LaneModel,
    name: &str,
    rel: &str,
    path: &Path,
) -> Result<ComponentModel, ImportError> {
    let bad = |why: String| ImportError::source(path, why);
    let file = File::open(path).map_err(|e| bad(format!("cannot open: {e}")))?;
    let stamp = super::chunks::stamp(&file, path)?;
    let file_len = stamp.0;
    let (parsed, prefix) = read_header(&file, file_len).map_err(bad)?;
    let (g, layout) = (parsed.gguf, parsed.layout);
    check_exact(&file, &g, &layout, &prefix, file_len).map_err(bad)?;

    let mut tensors = Vec::with_capacity(g.tensors.len());
    for (info, &length) in g.tensors.iter().zip(&layout.lengths) {
        let kind = info.kind().map_err(|e| bad(e.to_string()))?;
        let shape = logical_shape(&g, info).map_err(bad)?;
        let (dtype, shape) = match kind.dtype() {
            Some(dtype) => (dtype, shape),
            None => (Dtype::U8, blocks_shape(&shape, kind.block, kind.size)),
        };
        tensors.push(SourceTensor {
            key: info.name.clone(),
            dtype,
            shape,
            file: 0,
            offset: layout.data_start + info.offset,
            length,
        });
    }
    let scales = nvfp4_scales(&g).map_err(bad)?;
    let consumed: HashMap<usize, (usize, &str)> = scales
        .iter()
        .flat_map(|(&w, roles)| roles.iter().map(move |(role, s)| (*s, (w, *role))))
        .collect();

    let mut items = Vec::with_capacity(g.tensors.len());
    let mut arrays = BTreeMap::new();
    for (i, info) in g.tensors.iter().enumerate() {
        if consumed.contains_key(&i) {
            continue;
        }
        let kind = info.kind().map_err(|e| bad(e.to_string()))?;
        if kind.dtype().is_some() {
            items.push(Item::Plain(i));
            continue;
        }
        let mut parts = vec![PartModel {
            role: "blocks".into(),
            dtype: Dtype::U8,
            shape: tensors[i].shape.clone(),
            source: PartSource::Array(i),
        }];
        for &(role, s) in scales.get(&i).map_or(&[][..], Vec::as_slice) {
            parts.push(PartModel {
                role: role.into(),
                dtype: Dtype::F32,
                shape: tensors[s].shape.clone(),
                source: PartSource::Array(s),
            });
            arrays.insert(
                g.tensors[s].name.clone(),
                ArraySource::Part {
                    tensor: info.name.clone(),
                    role: role.into(),
                },
            );
        }
        let encoded = EncodedModel {
            key: info.name.clone(),
            dtype: Dtype::F32,
            shape: logical_shape(&g, info).map_err(bad)?,
            scheme: format!("gguf.{}", kind.name),
            params: Config::from([("block_size".to_owned(), Value::Uint(kind.block))]),
            parts,
            convention: "gguf".into(),
        };
        check(&file, &encoded, &tensors).map_err(|why| bad(format!("{}: {why}", info.name)))?;
        items.push(Item::Encoded(encoded));
    }

    model.recipe.0.insert(
        rel.to_owned(),
        SourceFile::Gguf {
            component: name.to_owned(),
            gguf: Box::new(g),
            size: file_len,
            arrays,
        },
    );
    Ok(ComponentModel {
        name: name.to_owned(),
        class: ClassRef::default(),
        config: Config::new(),
        config_file: None,
        assets: BTreeMap::new(),
        tensors,
        weights: vec![path.to_path_buf()],
        stamps: vec![stamp],
        lane_paths: vec![rel.to_owned()],
        items,
        borrowed: None,
    })
}

/// Reads the header, a growing prefix at a time; returns it and the bytes read.
fn read_header(file: &File, file_len: u64) -> Result<(gguf::Parsed, Vec<u8>), String> {
    let mut prefix = Vec::new();
    let mut want = FIRST_READ.min(file_len);
    loop {
        let have = prefix.len() as u64;
        prefix.resize(want as usize, 0);
        file.read_exact_at(&mut prefix[have as usize..], have)
            .map_err(|e| format!("cannot read the header: {e}"))?;
        match gguf::parse(&prefix, file_len) {
            Ok(parsed) => return Ok((parsed, prefix)),
            Err(GgufError::Incomplete(needed)) => {
                // At most what the file and a header may hold: `needed` is within both.
                want = needed
                    .max(2 * want)
                    .min(file_len)
                    .min(gguf::MAX_HEADER_BYTES);
            }
            Err(GgufError::Format(e)) => return Err(e.to_string()),
        }
    }
}

/// Checks that the file is what the recipe makes: its header written again, and zeros
/// everywhere outside the header and the tensors' bytes (the padding).
fn check_exact(
    file: &File,
    g: &Gguf,
    layout: &Layout,
    prefix: &[u8],
    file_len: u64,
) -> Result<(), String> {
    let written = gguf::write_unpadded(g);
    let original = &prefix[..layout.header_len as usize];
    if written != original {
        let at = written
            .iter()
            .zip(original)
            .position(|(a, b)| a != b)
            .unwrap_or(written.len().min(original.len()));
        return Err(format!(
            "its header does not come out the same when written again (from byte {at}), so \
             the file cannot be re-created exactly"
        ));
    }
    let mut at = layout.header_len;
    let mut before = "the header".to_owned();
    let mut gaps = Vec::with_capacity(g.tensors.len() + 1);
    for &i in &layout.order {
        if layout.lengths[i] == 0 {
            continue;
        }
        let start = layout.data_start + g.tensors[i].offset;
        gaps.push((at, start, before));
        at = start + layout.lengths[i];
        before = format!("tensor {:?}", g.tensors[i].name);
    }
    gaps.push((at, file_len, before));
    let mut buf = vec![0u8; 1 << 16];
    for (start, end, after) in gaps {
        let mut pos = start;
        while pos < end {
            let n = (end - pos).min(buf.len() as u64) as usize;
            let chunk = match prefix.get(pos as usize..pos as usize + n) {
                Some(held) => held,
                None => {
                    file.read_exact_at(&mut buf[..n], pos)
                        .map_err(|e| format!("cannot read the padding at byte {pos}: {e}"))?;
                    &buf[..n]
                }
            };
            if let Some(k) = chunk.iter().position(|b| *b != 0) {
                return Err(format!(
                    "byte {} (padding after {after}) is {:#04x}, not zero, so the file cannot \
                     be re-created exactly",
                    pos + k as u64,
                    chunk[k]
                ));
            }
            pos += n as u64;
        }
    }
    Ok(())
}

/// The tensor's logical shape: ComfyUI-GGUF's recorded original shape, else `ne` reversed.
fn logical_shape(g: &Gguf, t: &TensorInfo) -> Result<Vec<u64>, String> {
    let key = format!("{ORIG_SHAPE}{}", t.name);
    let Some(value) = g.get(&key) else {
        return Ok(t.shape());
    };
    let elements = t.elements().map_err(|e| e.to_string())?;
    let dims = match value {
        KvValue::Array(a) => a.integers().and_then(|v| {
            v.into_iter()
                .map(|d| u64::try_from(d).ok())
                .collect::<Option<Vec<u64>>>()
        }),
        _ => None,
    };
    let Some(dims) = dims else {
        return Err(format!(
            "key {key:?} is not an array of non-negative integers (a shape)"
        ));
    };
    let product = dims.iter().try_fold(1u64, |p, d| p.checked_mul(*d));
    if product != Some(elements) {
        return Err(format!(
            "key {key:?} gives tensor {:?} the shape {dims:?}, which does not hold its \
             {elements} elements (ne {:?})",
            t.name, t.ne
        ));
    }
    Ok(dims)
}

/// The `blocks` part's shape for a logical `shape` (spec §6 `gguf.*`).
fn blocks_shape(shape: &[u64], n: u64, size: u64) -> Vec<u64> {
    match shape.split_last() {
        Some((&cols, lead)) if cols.is_multiple_of(n) => {
            let mut s = lead.to_vec();
            s.extend([cols / n, size]);
            s
        }
        _ => vec![shape.iter().product::<u64>() / n, size],
    }
}

/// Each `nvfp4` tensor's scale tensors: tensor index → [(role, scale tensor index)].
type Scales = HashMap<usize, Vec<(&'static str, usize)>>;

/// The [`Scales`] of `g`'s `nvfp4` tensors.
fn nvfp4_scales(g: &Gguf) -> Result<Scales, String> {
    let by_name: HashMap<&str, usize> = g
        .tensors
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i))
        .collect();
    let mut out = Scales::new();
    let mut claimed: HashMap<usize, usize> = HashMap::new();
    for (i, t) in g.tensors.iter().enumerate() {
        if t.kind().map(|k| k.name) != Ok("nvfp4") {
            continue;
        }
        let base = t.name.strip_suffix(".weight").unwrap_or(&t.name);
        for role in ["scale", "input_scale"] {
            let name = format!("{base}.{role}");
            let Some(&s) = by_name.get(name.as_str()) else {
                continue;
            };
            let scale = &g.tensors[s];
            if scale.ggml_type != 0 || scale.elements() != Ok(1) {
                return Err(format!(
                    "tensor {name:?}, the {role} of nvfp4 tensor {:?}, is ggml {} {:?}, not one \
                     f32 element",
                    t.name,
                    scale.kind().map_or("(unknown)", |k| k.name),
                    scale.ne
                ));
            }
            if let Some(other) = claimed.insert(s, i) {
                return Err(format!(
                    "tensor {name:?} would be the {role} of both {:?} and {:?}",
                    g.tensors[other].name, t.name
                ));
            }
            out.entry(i).or_default().push((role, s));
        }
    }
    Ok(out)
}

/// Runs the decoder's checks on an encoded tensor whose scheme it knows, as it will be stored:
/// `blocks` by length only (never read), the scales with their bytes.
fn check(file: &File, e: &EncodedModel, tensors: &[SourceTensor]) -> Result<(), String> {
    if decode::scheme(&e.scheme).is_none() {
        return Ok(());
    }
    let mut held: Vec<Option<memmap2::MmapMut>> = Vec::new();
    let mut owned: Vec<Vec<u8>> = Vec::new();
    for p in &e.parts {
        let PartSource::Array(i) = p.source else {
            unreachable!("GGUF parts are arrays");
        };
        let t = &tensors[i];
        if p.role == "blocks" {
            let map = match t.length {
                0 => None,
                n => Some(
                    memmap2::MmapMut::map_anon(n as usize)
                        .map_err(|e| format!("cannot map {n} bytes: {e}"))?,
                ),
            };
            held.push(map);
            owned.push(Vec::new());
        } else {
            let mut bytes = vec![0u8; t.length as usize];
            file.read_exact_at(&mut bytes, t.offset)
                .map_err(|e| format!("cannot read {}: {e}", t.key))?;
            held.push(None);
            owned.push(bytes);
        }
    }
    let parts = e
        .parts
        .iter()
        .enumerate()
        .map(|(k, p)| decode::Part {
            role: &p.role,
            dtype: &p.dtype,
            shape: &p.shape,
            bytes: match &held[k] {
                Some(map) => map,
                None => &owned[k],
            },
        })
        .collect();
    let tensor = decode::Encoded {
        scheme: &e.scheme,
        params: &e.params,
        dtype: &e.dtype,
        shape: &e.shape,
        parts,
    };
    decode::prepare(&tensor)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_keep_leading_extents_when_the_last_is_whole_blocks() {
        assert_eq!(blocks_shape(&[4, 64], 32, 34), [4, 2, 34]);
        assert_eq!(blocks_shape(&[4, 40], 32, 34), [5, 34]);
        assert_eq!(blocks_shape(&[2, 3, 256], 256, 144), [2, 3, 1, 144]);
        assert_eq!(blocks_shape(&[3, 0], 32, 34), [3, 0, 34]);
    }
}
