//! Loading straight into CUDA device memory (feature `cuda`): the stored bytes of a tensor, read
//! from the store's chunk blobs by `tensorfs::gpu::GpuLoader` (io_uring into page-locked
//! buffers, each buffer's copy to the device overlapping the reads of the next; `docs/gpu.md`).
//! One loader per device serves the whole process.
//!
//! Two kinds of destination: memory a framework allocated ([`to_device`]: a torch tensor's
//! storage, for `safe_open(device="cuda")`), and memory of our own ([`DeviceBytes`], behind an
//! `Array` of the format's API, shared through DLPack).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use pyo3::exceptions::{PyOSError, PyRuntimeError};
use pyo3::prelude::*;
use tensorfs::extents::stage::StageError;
use tensorfs::extents::Located;
use tensorfs::format::ObjectRef;
use tensorfs::gpu::{DeviceRange, GpuError, GpuLoader};

/// The loader of each device ordinal, made when first used.
static LOADERS: Mutex<Option<HashMap<usize, GpuLoader>>> = Mutex::new(None);

/// Runs `f` with the loader of device `ordinal` (one at a time per process: a loader's host
/// buffers serve one load at a time).
///
/// # Errors
/// [`GpuError::CudaNotAvailable`] (no driver, no such device) or what setting up the loader
/// or `f` fails with.
pub fn with_loader<R>(
    ordinal: usize,
    f: impl FnOnce(&mut GpuLoader) -> Result<R, GpuError>,
) -> Result<R, GpuError> {
    let mut loaders = LOADERS.lock().unwrap_or_else(|p| p.into_inner());
    let loaders = loaders.get_or_insert_with(HashMap::new);
    let loader = match loaders.entry(ordinal) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => e.insert(GpuLoader::new(ordinal)?),
    };
    f(loader)
}

/// A load's error as Python's: the blob's errno as `OSError` (a blob that cannot be opened or
/// read, one that ends early: `EIO`), CUDA's failures as `RuntimeError` (as torch raises them).
pub fn gpu_error(e: GpuError) -> PyErr {
    let errno = match &e {
        GpuError::Stage(StageError::Open { source, .. } | StageError::Read { source, .. }) => {
            Some(source.raw_os_error().unwrap_or(libc::EIO))
        }
        GpuError::Stage(StageError::Eof { .. } | StageError::Invalid { .. }) => Some(libc::EIO),
        _ => None,
    };
    match errno {
        Some(errno) => PyOSError::new_err((errno, e.to_string())),
        None => PyRuntimeError::new_err(e.to_string()),
    }
}

/// Device memory of our own holding an array's bytes.
pub struct DeviceBytes {
    slice: cudarc::driver::CudaSlice<u8>,
}

impl DeviceBytes {
    /// Takes `slice` (complete: its copies are done).
    pub fn new(slice: cudarc::driver::CudaSlice<u8>) -> DeviceBytes {
        DeviceBytes { slice }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.slice.len()
    }

    /// Its device address.
    pub fn address(&self) -> u64 {
        let stream = self.slice.stream();
        let (ptr, _recorded) = cudarc::driver::DevicePtr::device_ptr(&self.slice, stream);
        ptr
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.slice.stream().context().ordinal()
    }

    /// A copy in host memory.
    ///
    /// # Errors
    /// `RuntimeError` when the copy fails.
    pub fn to_host(&self) -> PyResult<Vec<u8>> {
        if self.slice.is_empty() {
            return Ok(Vec::new());
        }
        self.slice
            .stream()
            .clone_dtoh(&self.slice)
            .map_err(|e| PyRuntimeError::new_err(format!("copying an array to the host: {e:?}")))
    }
}

impl Drop for DeviceBytes {
    fn drop(&mut self) {
        // A DLPack consumer may have queued work that reads these bytes on streams of its own,
        // which we cannot name: let the device finish before the memory goes back.
        let ctx = self.slice.stream().context();
        if ctx.bind_to_thread().is_ok() {
            if let Err(e) = ctx.synchronize() {
                tracing::debug!("synchronizing before freeing an array: {e:?}");
            }
        }
    }
}

/// One extent as the Python side gives it: `(blob sha256 hex, blob length, offset in it,
/// length, the daemon's stamp of the blob or None)`.
type BlobExtent = (String, u64, u64, u64, Option<[i64; 5]>);

/// Reads the bytes of one tensor of a mounted file into device memory the caller owns:
/// `extents` (each `(blob sha256 hex, blob length, offset in it, length, stamp or None)`, in
/// order) of the store at `store`, into `length` bytes at device address `address` of device
/// `ordinal`, after the work queued on `stream` (a `CUstream`, 0 for the legacy default
/// stream). Each blob is proven first, as `map_extents` proves it. `file` and `tensor` name it
/// in errors. Returns once the bytes are on the device.
///
/// The caller (cozytensors' `safe_open`) passes a torch tensor's storage, allocated on the
/// current stream of that device, which it holds until this returns.
///
/// # Errors
/// `OSError` as `map_extents` (a blob unreadable or damaged), or with the blob's errno when a
/// read fails; `RuntimeError` for CUDA's failures (CUDA not available, a copy failing);
/// `OSError` `EINVAL` when the extents do not add up to `length`.
#[pyfunction]
#[allow(clippy::too_many_arguments)] // the arguments of one ioctl answer's part, as given
pub fn to_device(
    py: Python<'_>,
    store: PathBuf,
    extents: Vec<BlobExtent>,
    address: u64,
    length: usize,
    ordinal: usize,
    stream: usize,
    file: &str,
    tensor: &str,
) -> PyResult<()> {
    let what = format!("{file}: tensor {tensor:?}");
    let mut pieces: Vec<(ObjectRef, u64, u64)> = Vec::with_capacity(extents.len());
    for (sha, blob_length, offset, len, stamp) in &extents {
        let object = crate::object(sha, *blob_length)?;
        if !pieces.iter().any(|p| p.0 == object) {
            crate::proven_blob(py, &store, &object, &what, *stamp)?;
        }
        pieces.push((object, *offset, *len));
    }
    let located = Located::bytes(file, tensor, &store, &pieces);
    if located.shape != [length as u64] {
        return Err(PyOSError::new_err((
            libc::EINVAL,
            format!("{what}: extents of {} bytes for {length}", located.shape[0]),
        )));
    }
    let range = DeviceRange {
        ptr: address,
        len: length,
    };
    crate::detached(py, || {
        let after = stream as cudarc::driver::sys::CUstream;
        with_loader(ordinal, |loader| {
            // SAFETY: the caller owns `length` bytes at `address` on device `ordinal`, allocated
            // on `stream`, and holds them until this returns (the function's contract).
            unsafe { loader.load_into(&located, &[range], Some(after)) }
        })
    })
    .map_err(gpu_error)?;
    Ok(())
}
