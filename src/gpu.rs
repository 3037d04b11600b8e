//! GPU-direct loading (feature `cuda`): a located tensor's stored bytes, read from its chunk
//! blobs with io_uring into page-locked host buffers and copied to device memory on a CUDA
//! stream, the copy of one buffer overlapping the reads of the next. See `docs/gpu.md`.
//!
//! ```text
//! Located (extents::locate, or the mount's ioctl)
//!  └─ GpuLoader::load
//!      ├─ device memory for each part (its stored bytes; no decoding on the GPU)
//!      └─ extents::stage::Stager: io_uring ReadFixed into N host buffers (page-locked once
//!          with cuMemHostRegister), each filled buffer → DeviceSink:
//!            cuMemcpyHtoDAsync per segment, then an event on the buffer;
//!            the buffer is refilled after that event (double buffering, N ≥ 2)
//! ```
//!
//! cudarc loads `libcuda.so.1` when first used and panics when it is missing, so
//! [`open_device`] first checks that the library loads, then `cuInit`, then the device count,
//! and answers [`GpuError::CudaNotAvailable`] with the reason instead. Builds need no CUDA.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::{
    result, sys, CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtrMut, DriverError,
};

use crate::extents::stage::{
    Segment, SinkError, StageConfig, StageError, StageSink, StageStats, Stager,
};
use crate::extents::{Encoding, Located};
use crate::format::Dtype;

/// The driver library cudarc loads (one of the names it tries; the one Linux drivers install).
pub const DRIVER_LIBRARY: &str = "libcuda.so.1";

/// Why a tensor could not be loaded to the GPU.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No usable CUDA here: the driver library does not load, `cuInit` fails (no driver, a
    /// stub library), or there is no such device.
    #[error("CUDA not available: {why}")]
    CudaNotAvailable {
        /// The reason, for a person.
        why: String,
    },
    /// A CUDA call failed.
    #[error("CUDA: {what}: {}", describe(source))]
    Cuda {
        /// What was being done (names the tensor and part where there is one).
        what: String,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// Reading the extents failed (the error names the tensor and the blob), or a copy of
    /// a filled buffer to the device did.
    #[error(transparent)]
    Stage(#[from] StageError),
}

/// `CUDA_ERROR_… (the driver's text)`.
fn describe(e: &DriverError) -> String {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    match e.error_string() {
        Ok(text) => format!("{name} ({})", text.to_string_lossy()),
        Err(_) => name,
    }
}

fn not_available(why: impl Into<String>) -> GpuError {
    GpuError::CudaNotAvailable { why: why.into() }
}

/// A context on CUDA device `ordinal`, after checking that CUDA can be used at all.
///
/// # Errors
/// [`GpuError::CudaNotAvailable`]: the driver library does not load, `cuInit` fails, no device
/// or no device `ordinal`; [`GpuError::Cuda`] when creating the context fails.
pub fn open_device(ordinal: usize) -> Result<Arc<CudaContext>, GpuError> {
    // SAFETY: this only dlopens the driver library by its usual names (running its
    // initializers, as any use of CUDA does) and closes it again.
    if !unsafe { sys::is_culib_present() } {
        return Err(not_available(format!(
            "the CUDA driver library ({DRIVER_LIBRARY}) could not be loaded: no NVIDIA driver is \
             installed, or it is not on the library path (LD_LIBRARY_PATH)"
        )));
    }
    // cudarc panics on a missing symbol (a driver older than the API it binds); report that
    // as CUDA being unusable rather than unwinding through the caller.
    let opened = catch_unwind(AssertUnwindSafe(|| {
        result::init().map_err(|e| not_available(format!("cuInit failed: {}", describe(&e))))?;
        let count = result::device::get_count()
            .map_err(|e| not_available(format!("counting devices: {}", describe(&e))))?;
        let count = usize::try_from(count).unwrap_or(0);
        if count == 0 {
            return Err(not_available("the driver found no CUDA device"));
        }
        if ordinal >= count {
            return Err(not_available(format!(
                "no CUDA device {ordinal} (the driver found {count})"
            )));
        }
        CudaContext::new(ordinal).map_err(|source| GpuError::Cuda {
            what: format!("creating a context on device {ordinal}"),
            source,
        })
    }));
    opened.unwrap_or_else(|panic| {
        let why = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "the driver library failed".into());
        Err(not_available(why))
    })
}

/// One stored part of a tensor in device memory.
#[derive(Debug)]
pub struct DevicePart {
    /// Its role (`weight` for a plain tensor's only part).
    pub role: String,
    /// The stored dtype.
    pub dtype: Dtype,
    /// The stored shape, outermost first.
    pub shape: Vec<u64>,
    /// Its stored bytes (little-endian elements, as in the safetensors file).
    pub data: CudaSlice<u8>,
}

impl DevicePart {
    /// Copies the part back to host memory (for checks).
    ///
    /// # Errors
    /// [`GpuError::Cuda`].
    pub fn to_host(&self) -> Result<Vec<u8>, GpuError> {
        self.data
            .stream()
            .clone_dtoh(&self.data)
            .map_err(|source| GpuError::Cuda {
                what: format!("copying part {} back to the host", self.role),
                source,
            })
    }
}

/// A tensor loaded to the device: its stored parts, with the logical dtype and shape they
/// stand for (a plain tensor's one part is the tensor itself).
#[derive(Debug)]
pub struct DeviceTensor {
    /// The lane file it was located in.
    pub file: String,
    /// The tensor's key.
    pub key: String,
    /// The logical dtype.
    pub dtype: Dtype,
    /// The logical shape.
    pub shape: Vec<u64>,
    /// `None` for a plain tensor; an encoded tensor's parts are not decoded.
    pub encoding: Option<Encoding>,
    /// The stored parts, in [`Located::parts`] order.
    pub parts: Vec<DevicePart>,
    /// What the staging did (bytes, buffer fills, reads).
    pub stats: StageStats,
}

/// Host buffers page-locked with `cuMemHostRegister`; unregistered on drop.
struct Pinned {
    ctx: Arc<CudaContext>,
    /// Addresses registered.
    spans: Vec<usize>,
}

impl Pinned {
    fn register(ctx: &Arc<CudaContext>, stager: &Stager) -> Result<Pinned, GpuError> {
        let mut pinned = Pinned {
            ctx: ctx.clone(),
            spans: Vec::new(),
        };
        ctx.bind_to_thread().map_err(|source| GpuError::Cuda {
            what: "binding the context".into(),
            source,
        })?;
        for slot in 0..stager.config().buffers {
            let buffer = stager.buffer(slot);
            // SAFETY: the span is one of the stager's mappings, which stays mapped at this
            // address until after `Pinned` is dropped (field order of `GpuLoader`); the driver
            // only page-locks it and maps it for DMA.
            unsafe { sys::cuMemHostRegister_v2(buffer.as_ptr() as *mut c_void, buffer.len(), 0) }
                .result()
                .map_err(|source| GpuError::Cuda {
                    what: format!(
                        "page-locking host buffer {slot} ({} bytes) with cuMemHostRegister",
                        buffer.len()
                    ),
                    source,
                })?;
            pinned.spans.push(buffer.as_ptr() as usize);
        }
        Ok(pinned)
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        for &span in &self.spans {
            // SAFETY: `span` was registered by `register` and is still mapped.
            let r = unsafe { sys::cuMemHostUnregister(span as *mut c_void) };
            if let Err(e) = r.result() {
                tracing::debug!("cuMemHostUnregister: {}", describe(&e));
            }
        }
    }
}

/// Loads located tensors to one CUDA device (see the module docs).
pub struct GpuLoader {
    // Drop order matters: events and the page-locking go before the stager unmaps its buffers.
    events: Vec<CudaEvent>,
    /// Recorded on a caller's stream for [`GpuLoader::load_into`] to wait on.
    ready: CudaEvent,
    pinned: Pinned,
    stager: Stager,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
}

impl std::fmt::Debug for GpuLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuLoader")
            .field("ordinal", &self.ctx.ordinal())
            .field("stager", &self.stager)
            .field("pinned", &self.pinned.spans.len())
            .finish()
    }
}

impl GpuLoader {
    /// A loader for device `ordinal` with the default buffers ([`StageConfig::default`]: four of
    /// 8 MiB, reads of 1 MiB), as `$TENSORFS_STAGE` changes them ([`StageConfig::from_env`]).
    ///
    /// # Errors
    /// As [`GpuLoader::with_config`]; [`StageError::Config`] for a malformed `$TENSORFS_STAGE`.
    pub fn new(ordinal: usize) -> Result<GpuLoader, GpuError> {
        GpuLoader::with_config(ordinal, StageConfig::from_env()?)
    }

    /// A loader for device `ordinal`: checks CUDA ([`open_device`]), creates a stream, allocates
    /// and page-locks the host buffers and registers them with io_uring.
    ///
    /// # Errors
    /// [`GpuError::CudaNotAvailable`] without a usable CUDA device; [`GpuError::Cuda`];
    /// [`GpuError::Stage`] when the buffers or the ring cannot be set up.
    pub fn with_config(ordinal: usize, config: StageConfig) -> Result<GpuLoader, GpuError> {
        let ctx = open_device(ordinal)?;
        let cuda = |what: &str| {
            let what = what.to_owned();
            move |source| GpuError::Cuda { what, source }
        };
        let stream = ctx.new_stream().map_err(cuda("creating a stream"))?;
        let stager = Stager::new(config)?;
        let pinned = Pinned::register(&ctx, &stager)?;
        let events = (0..stager.config().buffers)
            .map(|_| ctx.new_event(None))
            .collect::<Result<Vec<_>, _>>()
            .map_err(cuda("creating events"))?;
        let ready = ctx.new_event(None).map_err(cuda("creating events"))?;
        Ok(GpuLoader {
            events,
            ready,
            pinned,
            stager,
            stream,
            ctx,
        })
    }

    /// The device's context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream the copies run on (the loaded tensors' memory is ordered on it).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Whether io_uring reads into registered (fixed) buffers.
    pub fn fixed_buffers(&self) -> bool {
        self.stager.fixed()
    }

    /// Loads every part of `located` to new device memory: its stored bytes (an encoded
    /// tensor's parts are not decoded). Returns once the bytes are on the device.
    ///
    /// # Errors
    /// [`GpuError::Cuda`] naming the tensor and part when device memory cannot be had;
    /// [`GpuError::Stage`] when a blob cannot be read (naming the tensor and the blob) or a
    /// copy fails.
    pub fn load(&mut self, located: &Located) -> Result<DeviceTensor, GpuError> {
        let mut data = Vec::with_capacity(located.parts.len());
        for (i, p) in located.parts.iter().enumerate() {
            let len = p.file_range.end.saturating_sub(p.file_range.start);
            let what = || {
                format!(
                    "{}: tensor {:?}: allocating {len} bytes of device memory for part {i} ({})",
                    located.file, located.key, p.role
                )
            };
            let len = len as usize; // 64-bit targets only (cudarc's)
            let slice = match len {
                0 => self.stream.null::<u8>(),
                // SAFETY: the memory is uninitialized until `load_into` below writes every
                // byte of it (the stager checks that the extents tile each part); on any error
                // the slices are dropped unread.
                _ => unsafe { self.stream.alloc::<u8>(len) },
            };
            data.push(slice.map_err(|source| GpuError::Cuda {
                what: what(),
                source,
            })?);
        }
        let ranges: Vec<DeviceRange> = data.iter_mut().map(DeviceRange::of).collect();
        // SAFETY: the ranges are the slices just allocated on the loader's own stream (so
        // ordered before its copies), owned here until the copies are done.
        let stats = unsafe { self.load_into(located, &ranges, None) }?;
        let parts = located
            .parts
            .iter()
            .zip(data)
            .map(|(p, data)| DevicePart {
                role: p.role.clone(),
                dtype: p.dtype.clone(),
                shape: p.shape.clone(),
                data,
            })
            .collect();
        Ok(DeviceTensor {
            file: located.file.clone(),
            key: located.key.clone(),
            dtype: located.dtype.clone(),
            shape: located.shape.clone(),
            encoding: located.encoding.clone(),
            parts,
            stats,
        })
    }

    /// Loads every part of `located` into device memory the caller owns (`parts[i]` for
    /// `located.parts[i]`, exactly the part's length): a framework's allocation, such as a
    /// torch tensor's storage. When `after` is a stream, the copies wait for the work queued on
    /// it first (the stream the memory was allocated on, whose earlier users may still read
    /// it); `None`: the memory is free to write now. Returns once the bytes are on the device.
    ///
    /// # Safety
    /// Each range is device memory of this loader's device, valid for its `len` bytes, that
    /// nothing else reads or writes, or frees, until this returns; `after` is a live stream of
    /// the same context, or `None`.
    ///
    /// # Errors
    /// [`GpuError::Stage`]: the ranges do not match the parts ([`StageError::Invalid`]), a blob
    /// cannot be read, or a copy fails; [`GpuError::Cuda`] when ordering after `after` or
    /// finishing the copies fails.
    pub unsafe fn load_into(
        &mut self,
        located: &Located,
        parts: &[DeviceRange],
        after: Option<sys::CUstream>,
    ) -> Result<StageStats, GpuError> {
        let invalid = |why: String| StageError::Invalid {
            file: located.file.clone(),
            tensor: located.key.clone(),
            why,
        };
        if parts.len() != located.parts.len() {
            return Err(invalid(format!(
                "{} device ranges for {} parts",
                parts.len(),
                located.parts.len()
            ))
            .into());
        }
        for (i, (p, range)) in located.parts.iter().zip(parts).enumerate() {
            let want = p.file_range.end.saturating_sub(p.file_range.start);
            if range.len as u64 != want {
                return Err(invalid(format!(
                    "a device range of {} bytes for part {i} ({}) of {want}",
                    range.len, p.role
                ))
                .into());
            }
        }
        let cuda = |what: &str| {
            let what = format!("{}: tensor {:?}: {what}", located.file, located.key);
            move |source| GpuError::Cuda { what, source }
        };
        // The calling thread may be any (a Python thread): the raw calls below need the
        // context current on it.
        self.ctx
            .bind_to_thread()
            .map_err(cuda("binding the context"))?;
        if let Some(after) = after {
            let ready = self.ready.cu_event();
            // SAFETY: `after` is a live stream of this context (the caller's promise), and the
            // event and the loader's stream are this loader's.
            unsafe {
                sys::cuEventRecord(ready, after)
                    .result()
                    .map_err(cuda("recording the memory's stream"))?;
                sys::cuStreamWaitEvent(self.stream.cu_stream(), ready, 0)
                    .result()
                    .map_err(cuda("ordering the copies after the memory's stream"))?;
            }
        }
        let mut sink = DeviceSink {
            stream: &self.stream,
            events: &self.events,
            parts,
        };
        let staged = self.stager.stage(located, &mut sink);
        let synced = self.stream.synchronize();
        let stats = staged?;
        synced.map_err(cuda("finishing the copies"))?;
        Ok(stats)
    }

    /// Host bytes (a tensor decoded on the host, say) in new device memory. Returns once they
    /// are on the device.
    ///
    /// # Errors
    /// [`GpuError::Cuda`], with `what` (the tensor) in its message.
    pub fn upload(&mut self, bytes: &[u8], what: &str) -> Result<CudaSlice<u8>, GpuError> {
        let cuda = |step: &str| {
            let what = format!("{what}: {step}");
            move |source| GpuError::Cuda { what, source }
        };
        let slice = match bytes.len() {
            0 => self.stream.null::<u8>(),
            _ => self.stream.clone_htod(bytes),
        }
        .map_err(cuda("copying to the device"))?;
        self.stream
            .synchronize()
            .map_err(cuda("finishing the copy"))?;
        Ok(slice)
    }
}

/// Device memory for one stored part: `len` bytes at device address `ptr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceRange {
    /// The device address (`CUdeviceptr`).
    pub ptr: sys::CUdeviceptr,
    /// Its length in bytes.
    pub len: usize,
}

impl DeviceRange {
    /// The whole of `slice`, to be written.
    pub fn of(slice: &mut CudaSlice<u8>) -> DeviceRange {
        let stream = slice.stream().clone();
        let len = slice.len();
        let (ptr, _recorded) = slice.device_ptr_mut(&stream);
        DeviceRange { ptr, len }
    }
}

/// Copies each filled buffer's segments to the parts' device memory, then records the
/// buffer's event; reclaiming a buffer waits for that event.
struct DeviceSink<'a> {
    stream: &'a Arc<CudaStream>,
    events: &'a [CudaEvent],
    parts: &'a [DeviceRange],
}

impl StageSink for DeviceSink<'_> {
    fn consume(
        &mut self,
        slot: usize,
        buffer: &[u8],
        segments: &[Segment],
    ) -> Result<(), SinkError> {
        for s in segments {
            let src = &buffer[s.buffer_offset..s.buffer_offset + s.length];
            let part = self
                .parts
                .get(s.part)
                .ok_or_else(|| format!("no part {}", s.part))?;
            let at = s.part_offset;
            if at.saturating_add(s.length as u64) > part.len as u64 {
                return Err(
                    format!("bytes {at}..{} past part {}", at + s.length as u64, s.part).into(),
                );
            }
            // SAFETY: the destination lies inside the part's range (checked above), which the
            // loader's caller keeps valid and unshared until the stream is synchronized. The
            // source is page-locked and not written again until `reclaim(slot)` has waited for
            // the event recorded below.
            unsafe { result::memcpy_htod_async(part.ptr + at, src, self.stream.cu_stream()) }
                .map_err(|e| format!("copying part {} to the device: {}", s.part, describe(&e)))?;
        }
        self.events[slot]
            .record(self.stream)
            .map_err(|e| format!("recording a copy's event: {}", describe(&e)).into())
    }

    fn reclaim(&mut self, slot: usize) -> Result<(), SinkError> {
        self.events[slot]
            .synchronize()
            .map_err(|e| format!("waiting for a copy: {}", describe(&e)).into())
    }
}
