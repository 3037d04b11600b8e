//! A mounted `.safetensors` file opened for the loader (`cozytensors/_loader.py`): its header
//! and the daemon's whole-file answer, each read and parsed here into the few Python objects
//! the loader looks tensors up in. A model has thousands of tensors: JSON parsed by Python
//! would make a dict per tensor and part, and set off the garbage collector while it does.

use std::collections::HashMap;
use std::fs::File;
use std::mem::ManuallyDrop;
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFrozenSet, PyString, PyTuple};
use serde::Deserialize;
use tensorfs::extents::ioctl;
use tensorfs::format::safetensors::{header_len, parse_header};

use crate::os_error;

/// Whether the file open as descriptor `fd` is on a FUSE filesystem (`statfs`'s type
/// `FUSE_SUPER_MAGIC`): a file elsewhere is not asked anything more, and is safetensors' own.
#[pyfunction]
pub fn is_fuse(fd: i32) -> bool {
    const FUSE_SUPER_MAGIC: libc::c_long = 0x6573_5546;
    let mut stat = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `stat` is written by the call before it is read; a bad `fd` is an error return.
    unsafe {
        libc::fstatfs(fd, stat.as_mut_ptr()) == 0 && stat.assume_init().f_type == FUSE_SUPER_MAGIC
    }
}

/// The safetensors header of the file open as descriptor `fd` (named `path` in errors): a
/// dict of tensor name → `(dtype, shape tuple, begin, end)`, where `begin..end` are absolute
/// byte offsets in the file (`8 + N` plus the entry's `data_offsets`), and the
/// `__metadata__` dict (`None` when absent). `None` when the header is malformed by
/// safetensors' rules (`tensorfs::format::safetensors`): safetensors itself then says what is
/// wrong.
///
/// # Errors
/// `OSError` when the file cannot be read (on a mount, a damaged blob under the header fails
/// the read with `EIO`), its message naming the file.
#[pyfunction]
pub fn header<'py>(py: Python<'py>, fd: i32, path: &str) -> PyResult<Option<Bound<'py, PyTuple>>> {
    // SAFETY: borrowed for the call; the caller owns and closes `fd`.
    let file = ManuallyDrop::new(unsafe { File::from_raw_fd(fd) });
    let read = py.detach(|| -> std::io::Result<Option<(Vec<u8>, u64)>> {
        let file_len = file.metadata()?.len();
        let mut first8 = [0u8; 8];
        if file_len < 8 {
            return Ok(None);
        }
        file.read_exact_at(&mut first8, 0)?;
        let Ok(n) = header_len(&first8, file_len) else {
            return Ok(None);
        };
        let mut json = vec![0u8; n as usize];
        file.read_exact_at(&mut json, 8)?;
        Ok(Some((json, file_len)))
    });
    let (json, file_len) = match read {
        Ok(Some(read)) => read,
        Ok(None) => return Ok(None),
        Err(e) => {
            let errno = e.raw_os_error().unwrap_or(libc::EIO);
            let why = std::io::Error::from_raw_os_error(errno);
            let hint = match errno {
                libc::EIO => {
                    " (the mount could not read the file's first chunk: the mount's log names \
                     it, and `tensorfs verify` says what to repair)"
                }
                _ => "",
            };
            return Err(os_error(
                errno,
                format!("{path}: reading its safetensors header: {why}{hint}"),
            ));
        }
    };
    let Ok(parsed) = parse_header(&json, file_len) else {
        return Ok(None);
    };
    let start = parsed.data_start();
    let entries = PyDict::new(py);
    for t in &parsed.tensors {
        let shape = PyTuple::new(py, &t.shape)?;
        let entry = (t.dtype.name(), shape, start + t.begin, start + t.end);
        entries.set_item(&t.name, entry)?;
    }
    let metadata = match &parsed.metadata {
        None => None,
        Some(pairs) => {
            let dict = PyDict::new(py);
            for (key, value) in pairs {
                dict.set_item(key, value)?;
            }
            Some(dict)
        }
    };
    Ok(Some(PyTuple::new(
        py,
        [entries.into_any(), metadata.into_pyobject(py)?.into_any()],
    )?))
}

/// The daemon's whole-file answer (`docs/extents.md`, ABI 2), as the loader reads it.
#[derive(Deserialize)]
struct Answer {
    store: String,
    /// `[sha256 hex, length, stamp or null]`.
    blobs: Vec<(String, u64, Option<[i64; 5]>)>,
    tensors: Vec<AnswerTensor>,
}

#[derive(Deserialize)]
struct AnswerTensor {
    key: Option<String>,
    #[serde(default)]
    encoding: Option<serde_json::Value>,
    #[serde(default)]
    decoded: bool,
    begin: Option<u64>,
    end: Option<u64>,
    #[serde(default)]
    parts: Vec<AnswerPart>,
}

#[derive(Deserialize)]
struct AnswerPart {
    dtype: Option<String>,
    shape: Option<Vec<u64>>,
    begin: u64,
    end: u64,
    /// `[blob index, offset in the blob, length, offset in the file]`.
    extents: Vec<(usize, u64, u64, u64)>,
}

/// The daemon's answer in `text`, checked so that reading by it gives the file's bytes or an
/// error, never other bytes: every decoded tensor has its range; each part's extents name
/// blobs of the answer, lie inside them, and cover the part's range of the file in order,
/// without gap or overlap.
///
/// # Errors
/// What breaks the ABI, for an `EPROTO` error.
fn parse(text: &[u8]) -> Result<Answer, String> {
    let answer: Answer = serde_json::from_slice(text).map_err(|e| e.to_string())?;
    for tensor in &answer.tensors {
        if tensor.decoded {
            if !matches!((tensor.begin, tensor.end), (Some(b), Some(e)) if b <= e) {
                return Err("a decoded tensor without its range".into());
            }
            continue;
        }
        for part in &tensor.parts {
            let mut at = part.begin;
            for &(blob, offset, length, file_offset) in &part.extents {
                let Some((sha, blob_length, _)) = answer.blobs.get(blob) else {
                    return Err(format!("an extent of blob {blob}, which it does not list"));
                };
                if offset
                    .checked_add(length)
                    .is_none_or(|end| end > *blob_length)
                {
                    return Err(format!(
                        "an extent past the end of blob {sha} ({offset} + {length} > {blob_length})"
                    ));
                }
                if file_offset != at {
                    return Err(format!(
                        "part {}..{}: an extent at {file_offset}, where {at} was next",
                        part.begin, part.end
                    ));
                }
                at += length;
            }
            if at != part.end {
                return Err(format!(
                    "part {}..{}: its extents end at {at}",
                    part.begin, part.end
                ));
            }
        }
    }
    Ok(answer)
}

/// Every tensor of the mounted file open as descriptor `fd` (named `path` in errors) and where
/// its bytes lie, in one query (the extents ioctl's ABI 2), which also keeps the file's blobs
/// present while `fd` stays open. Returns `(store, parts, decoded)`: the store's root; a dict
/// of `(begin, end)` (absolute offsets of a part's bytes in the file: a plain tensor's, or
/// one part of an encoded one) → a tuple of its extents, each `(blob sha256 hex, blob length,
/// offset in the blob, length, offset in the file, stamp)`, where the stamp is the daemon's
/// proof of the blob (a list, or `None`); and the frozenset of `(begin, end)` of the tensors
/// made when read (no blob holds their bytes). `None` when the file is not a TensorFS file or
/// its daemon speaks only ABI 1 (`ENOTTY`).
///
/// # Errors
/// `OSError` with the ioctl's errno, naming the file; `EPROTO` for an answer that breaks the
/// ABI.
#[pyfunction]
pub fn index<'py>(
    py: Python<'py>,
    fd: i32,
    path: &str,
    header: &Bound<'py, PyDict>,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    // SAFETY: borrowed for the call; the caller owns and closes `fd`.
    let file = ManuallyDrop::new(unsafe { File::from_raw_fd(fd) });
    let text = match py.detach(|| ioctl::query_file(&file, path)) {
        Ok(text) => text,
        Err(e) => match e.errno() {
            Some(libc::ENOTTY) => return Ok(None),
            Some(errno) => return Err(os_error(errno, e.to_string())),
            None => return Err(os_error(libc::EPROTO, e.to_string())),
        },
    };
    let malformed = |why: String| {
        os_error(
            libc::EPROTO,
            format!("{path}: the daemon's description of the file: {why}"),
        )
    };
    let answer = parse(&text).map_err(malformed)?;
    agree(&answer, header, path)?;
    // One string and one stamp object per blob, shared by its extents.
    let blobs = answer
        .blobs
        .iter()
        .map(|(sha, length, stamp)| {
            Ok((
                PyString::new(py, sha),
                *length,
                stamp.into_pyobject(py)?.into_any(),
            ))
        })
        .collect::<PyResult<Vec<_>>>()?;
    let parts = PyDict::new(py);
    let mut decoded = Vec::new();
    for tensor in &answer.tensors {
        if let (true, Some(begin), Some(end)) = (tensor.decoded, tensor.begin, tensor.end) {
            decoded.push((begin, end));
            continue;
        }
        for part in &tensor.parts {
            let extents = part
                .extents
                .iter()
                .map(|&(blob, offset, length, file_offset)| {
                    let (sha, blob_length, stamp) = &blobs[blob];
                    (sha, blob_length, offset, length, file_offset, stamp)
                });
            parts.set_item((part.begin, part.end), PyTuple::new(py, extents)?)?;
        }
    }
    let decoded = PyFrozenSet::new(py, decoded)?;
    Ok(Some(PyTuple::new(
        py,
        [
            answer.store.into_pyobject(py)?.into_any(),
            parts.into_any(),
            decoded.into_any(),
        ],
    )?))
}

/// What the daemon's answer says lies at a range of the file: the tensor's name (a plain or
/// decoded tensor's; the parts of an encoded one have none of their own), its dtype and shape
/// (a part's; a decoded tensor's are the file's alone).
type Described<'a> = (Option<&'a str>, Option<&'a str>, Option<&'a [u64]>);

/// Checks that each tensor of the file's header (`header`: name → `(dtype, shape, begin,
/// end)`, absolute offsets, as [`header`] gives it) is what the daemon's answer describes at
/// its range: the same name, dtype and shape. The header was read through the mount, the
/// bytes will come from the blobs: a file served from elsewhere (a view, the local copy a
/// root mount keeps of a file, damaged on disk) would otherwise give the blobs' bytes under
/// another dtype or name. Empty tensors, and ranges the answer does not describe (an error
/// when read), are left alone.
///
/// # Errors
/// `EIO` naming the file and the first tensor that differs.
fn agree(answer: &Answer, header: &Bound<'_, PyDict>, path: &str) -> PyResult<()> {
    let mut described: HashMap<(u64, u64), Described<'_>> = HashMap::new();
    for tensor in &answer.tensors {
        let key = tensor.key.as_deref();
        if let (true, Some(begin), Some(end)) = (tensor.decoded, tensor.begin, tensor.end) {
            described.insert((begin, end), (key, None, None));
            continue;
        }
        let plain = tensor.encoding.as_ref().is_none_or(|e| e.is_null()) && tensor.parts.len() == 1;
        for part in &tensor.parts {
            let name = if plain { key } else { None };
            let shape = part.shape.as_deref();
            described.insert((part.begin, part.end), (name, part.dtype.as_deref(), shape));
        }
    }
    for (name, entry) in header.iter() {
        let name: String = name.extract()?;
        let (dtype, shape, begin, end): (String, Vec<u64>, u64, u64) = entry.extract()?;
        let Some(&(their_name, their_dtype, their_shape)) = described.get(&(begin, end)) else {
            continue;
        };
        if begin == end {
            continue;
        }
        let differs = their_name.is_some_and(|n| n != name)
            || their_dtype.is_some_and(|d| d != dtype)
            || their_shape.is_some_and(|s| s != shape.as_slice());
        if differs {
            let theirs = format!(
                "{} {} {:?}",
                their_name.map_or("(a part)".to_string(), |n| format!("'{n}'")),
                their_dtype.unwrap_or("?"),
                their_shape.unwrap_or(&[])
            );
            return Err(os_error(
                libc::EIO,
                format!(
                    "{path}: tensor '{name}': the file's header says {dtype} {shape:?} at bytes \
                     {begin}..{end}, where the store describes {theirs}: the file the mount \
                     serves is not the store's"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse;

    /// An answer of one 16-byte blob and one tensor at `[100, 116)` whose extents are `extents`.
    fn answer(extents: &str) -> String {
        format!(
            r#"{{"store": "/s", "blobs": [["{sha}", 16, null]],
               "tensors": [{{"begin": 100, "end": 116, "parts": [{{"begin": 100, "end": 116,
               "extents": {extents}}}]}}]}}"#,
            sha = "ab".repeat(32)
        )
    }

    #[test]
    fn extents_that_cover_their_part_within_their_blobs_are_taken() {
        assert!(parse(answer("[[0, 0, 16, 100]]").as_bytes()).is_ok());
        assert!(parse(answer("[[0, 8, 8, 100], [0, 0, 8, 108]]").as_bytes()).is_ok());
    }

    #[test]
    fn an_answer_that_would_give_other_bytes_is_refused() {
        for (extents, why) in [
            ("[[1, 0, 16, 100]]", "does not list"),
            ("[[0, 8, 16, 100]]", "past the end of blob"),
            (
                "[[0, 18446744073709551615, 2, 100]]",
                "past the end of blob",
            ),
            ("[[0, 0, 8, 100]]", "end at 108"),
            (
                "[[0, 0, 8, 100], [0, 0, 8, 104]]",
                "at 104, where 108 was next",
            ),
            (
                "[[0, 0, 8, 108], [0, 0, 8, 100]]",
                "at 108, where 100 was next",
            ),
        ] {
            let err = parse(answer(extents).as_bytes()).err().unwrap();
            assert!(err.contains(why), "{extents}: {err}");
        }
        let err = parse(br#"{"store": "/s", "blobs": [], "tensors": [{"decoded": true}]}"#);
        assert!(err.err().unwrap().contains("without its range"));
        assert!(parse(b"{not json").is_err());
        assert!(
            parse(br#"{"store": "/s"}"#).is_err(),
            "no blobs, no tensors"
        );
    }
}
