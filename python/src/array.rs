//! [`Array`]: owned bytes (host memory, or with the `cuda` feature device memory) with a
//! safetensors dtype and a shape, shared with DLPack consumers (`torch.from_dlpack`,
//! `numpy.from_dlpack`) without a copy.
//!
//! The DLPack structs and codes are those of `dlpack.h` 1.1 (github.com/dmlc/dlpack): a
//! `dltensor` capsule (legacy) or, when the consumer passes `max_version >= (1, 0)`, a
//! `dltensor_versioned` one. The consumer renames the capsule once it owns the tensor and calls
//! its deleter when done; a capsule never consumed calls it from its own destructor.

use std::alloc::{self, Layout};
use std::ffi::{c_void, CStr};
use std::ptr::NonNull;
use std::sync::Arc;

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use tensorfs::format::Dtype;

/// Alignment of an array's bytes: a cache line, more than any dtype needs.
const ALIGN: usize = 64;

/// Zero-initialised bytes aligned to [`ALIGN`], written once and then shared.
pub struct Bytes {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `Bytes` owns its allocation; shared access is read-only from Rust.
unsafe impl Send for Bytes {}
// SAFETY: as above.
unsafe impl Sync for Bytes {}

impl Bytes {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Bytes {
        if len == 0 {
            return Bytes {
                ptr: NonNull::new(ALIGN as *mut u8).expect("non-zero"),
                len,
            };
        }
        let layout = Layout::from_size_align(len, ALIGN).expect("a valid layout");
        // SAFETY: the layout's size is non-zero.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        Bytes {
            ptr: NonNull::new(ptr).unwrap_or_else(|| alloc::handle_alloc_error(layout)),
            len,
        }
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` holds `len` initialised bytes (or is dangling with `len == 0`).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, to fill them before they are shared.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`, and `&mut self` is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Bytes {
    fn drop(&mut self) {
        if self.len > 0 {
            let layout = Layout::from_size_align(self.len, ALIGN).expect("a valid layout");
            // SAFETY: allocated in `zeroed` with this layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

/// Where an [`Array`]'s bytes are.
pub enum Storage {
    /// Host memory.
    Host(Bytes),
    /// Memory of a CUDA device.
    #[cfg(feature = "cuda")]
    Device(crate::device::DeviceBytes),
}

impl Storage {
    fn len(&self) -> usize {
        match self {
            Storage::Host(bytes) => bytes.as_slice().len(),
            #[cfg(feature = "cuda")]
            Storage::Device(bytes) => bytes.len(),
        }
    }

    /// The address DLPack shares (a device address for device memory).
    fn data(&self) -> *mut c_void {
        match self {
            Storage::Host(bytes) => bytes.ptr.as_ptr().cast(),
            #[cfg(feature = "cuda")]
            Storage::Device(bytes) => bytes.address() as *mut c_void,
        }
    }

    fn device(&self) -> DLDevice {
        match self {
            Storage::Host(_) => CPU,
            #[cfg(feature = "cuda")]
            Storage::Device(bytes) => DLDevice {
                device_type: 2, // kDLCUDA
                device_id: bytes.ordinal() as i32,
            },
        }
    }
}

/// A tensor's bytes: `dtype` (a safetensors dtype name), `shape` (outermost first), `nbytes`,
/// `device` (`cpu` or `cuda:N`), `tobytes()`, and the DLPack protocol (`__dlpack__`,
/// `__dlpack_device__`), through which consumers share the bytes (writable, as NumPy's and
/// torch's own arrays are).
#[pyclass(module = "cozytensors._native", frozen)]
pub struct Array {
    dtype: Dtype,
    shape: Vec<u64>,
    bytes: Arc<Storage>,
}

impl Array {
    /// An array of host `bytes` as `dtype` × `shape` (row-major, little-endian, as stored).
    pub fn new(dtype: Dtype, shape: Vec<u64>, bytes: Bytes) -> Array {
        Array::of(dtype, shape, Storage::Host(bytes))
    }

    /// An array of `storage` as `dtype` × `shape`.
    pub fn of(dtype: Dtype, shape: Vec<u64>, storage: Storage) -> Array {
        Array {
            dtype,
            shape,
            bytes: Arc::new(storage),
        }
    }
}

/// DLPack's `DLDataType` `(code, bits)` of a safetensors dtype, one lane; `None` for those
/// DLPack has no code for.
fn dl_dtype(dtype: &Dtype) -> Option<(u8, u8)> {
    // dlpack.h 1.1 DLDataTypeCode: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLComplex 5,
    // kDLBool 6, kDLFloat8_e4m3fn 10, kDLFloat8_e4m3fnuz 11, kDLFloat8_e5m2 12,
    // kDLFloat8_e5m2fnuz 13, kDLFloat8_e8m0fnu 14.
    Some(match dtype {
        Dtype::BOOL => (6, 8),
        Dtype::U8 => (1, 8),
        Dtype::I8 => (0, 8),
        Dtype::U16 => (1, 16),
        Dtype::I16 => (0, 16),
        Dtype::U32 => (1, 32),
        Dtype::I32 => (0, 32),
        Dtype::U64 => (1, 64),
        Dtype::I64 => (0, 64),
        Dtype::F16 => (2, 16),
        Dtype::F32 => (2, 32),
        Dtype::F64 => (2, 64),
        Dtype::BF16 => (4, 16),
        Dtype::C64 => (5, 64),
        // safetensors' F8_E4M3 is the finite, no-infinity e4m3 (torch float8_e4m3fn).
        Dtype::F8_E4M3 => (10, 8),
        Dtype::F8_E4M3FNUZ => (11, 8),
        Dtype::F8_E5M2 => (12, 8),
        Dtype::F8_E5M2FNUZ => (13, 8),
        Dtype::F8_E8M0 => (14, 8),
        _ => return None,
    })
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// What an exported tensor keeps alive: the bytes and the shape array DLPack points at. No
/// Python object, so a deleter may run on any thread without the GIL.
struct Context {
    _bytes: Arc<Storage>,
    _shape: Box<[i64]>,
}

const CPU: DLDevice = DLDevice {
    device_type: 1, // kDLCPU
    device_id: 0,
};
const LEGACY: &CStr = c"dltensor";
const VERSIONED: &CStr = c"dltensor_versioned";

unsafe extern "C" fn delete_legacy(tensor: *mut DLManagedTensor) {
    if tensor.is_null() {
        return;
    }
    // SAFETY: made by `Box::into_raw` in `__dlpack__`, with its context likewise.
    let tensor = unsafe { Box::from_raw(tensor) };
    drop(unsafe { Box::from_raw(tensor.manager_ctx.cast::<Context>()) });
}

unsafe extern "C" fn delete_versioned(tensor: *mut DLManagedTensorVersioned) {
    if tensor.is_null() {
        return;
    }
    // SAFETY: as `delete_legacy`.
    let tensor = unsafe { Box::from_raw(tensor) };
    drop(unsafe { Box::from_raw(tensor.manager_ctx.cast::<Context>()) });
}

/// A capsule's destructor: deletes the tensor unless a consumer took it (and renamed it).
unsafe extern "C" fn capsule_destructor(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: called by Python with the capsule, the GIL held.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, LEGACY.as_ptr()) == 1 {
            let p = pyo3::ffi::PyCapsule_GetPointer(capsule, LEGACY.as_ptr());
            delete_legacy(p.cast());
        } else if pyo3::ffi::PyCapsule_IsValid(capsule, VERSIONED.as_ptr()) == 1 {
            let p = pyo3::ffi::PyCapsule_GetPointer(capsule, VERSIONED.as_ptr());
            delete_versioned(p.cast());
        }
    }
}

#[pymethods]
impl Array {
    /// The safetensors dtype name (`F32`, `BF16`, `F8_E4M3`…).
    #[getter]
    fn dtype(&self) -> &str {
        self.dtype.name()
    }

    /// The shape, outermost first; `()` is a scalar.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    /// The byte count.
    #[getter]
    fn nbytes(&self) -> usize {
        self.bytes.len()
    }

    /// Where the bytes are: `cpu`, or `cuda:N`.
    #[getter]
    fn device(&self) -> String {
        match self.bytes.device() {
            d if d.device_type == CPU.device_type => "cpu".into(),
            d => format!("cuda:{}", d.device_id),
        }
    }

    /// A copy of the bytes (row-major, little-endian), copied from the device first when the
    /// array is on one.
    ///
    /// # Errors
    /// `RuntimeError` when the copy from the device fails.
    fn tobytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        match &*self.bytes {
            Storage::Host(bytes) => Ok(PyBytes::new(py, bytes.as_slice())),
            #[cfg(feature = "cuda")]
            Storage::Device(bytes) => Ok(PyBytes::new(py, &bytes.to_host()?)),
        }
    }

    /// `(kDLCPU, 0)`, or `(kDLCUDA, N)` for device `N`.
    fn __dlpack_device__(&self) -> (i32, i32) {
        let d = self.bytes.device();
        (d.device_type, d.device_id)
    }

    /// A DLPack capsule sharing the bytes; versioned when `max_version >= (1, 0)`. Device
    /// bytes are complete before an array exists (its load waited for its copies), so
    /// `stream` needs no ordering.
    ///
    /// # Errors
    /// `BufferError` (the DLPack protocol's refusal to export): a dtype DLPack has no code for
    /// (F4, F6), a device other than the array's, or `copy=True` asked of a producer that
    /// shares.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Py<PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let _ = stream; // the bytes are complete: nothing to order against
        let Some((code, bits)) = dl_dtype(&self.dtype) else {
            return Err(PyBufferError::new_err(format!(
                "DLPack has no dtype for {}",
                self.dtype.name()
            )));
        };
        let device = self.bytes.device();
        if let Some((kind, id)) = dl_device {
            if (kind, id) != (device.device_type, device.device_id) {
                return Err(PyBufferError::new_err(format!(
                    "the array is on {}, not DLPack device ({kind}, {id})",
                    self.device()
                )));
            }
        }
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "the array shares its bytes; copy the consumer's array instead",
            ));
        }
        let mut shape: Box<[i64]> = self.shape.iter().map(|&d| d as i64).collect();
        let dl_tensor = DLTensor {
            data: self.bytes.data(),
            device,
            ndim: shape.len() as i32,
            dtype: DLDataType {
                code,
                bits,
                lanes: 1,
            },
            shape: shape.as_mut_ptr(),
            strides: std::ptr::null_mut(), // row-major
            byte_offset: 0,
        };
        let context = Box::into_raw(Box::new(Context {
            _bytes: self.bytes.clone(),
            _shape: shape,
        }))
        .cast::<c_void>();
        let (pointer, name): (*mut c_void, &CStr) = if max_version.is_some_and(|v| v.0 >= 1) {
            let tensor = Box::new(DLManagedTensorVersioned {
                version: DLPackVersion { major: 1, minor: 1 },
                manager_ctx: context,
                deleter: Some(delete_versioned),
                flags: 0,
                dl_tensor,
            });
            (Box::into_raw(tensor).cast(), VERSIONED)
        } else {
            let tensor = Box::new(DLManagedTensor {
                dl_tensor,
                manager_ctx: context,
                deleter: Some(delete_legacy),
            });
            (Box::into_raw(tensor).cast(), LEGACY)
        };
        // SAFETY: `pointer` is a live tensor of the kind `name` says; the destructor frees it
        // unless a consumer renames the capsule.
        unsafe {
            let capsule =
                pyo3::ffi::PyCapsule_New(pointer, name.as_ptr(), Some(capsule_destructor));
            if capsule.is_null() {
                if name == VERSIONED {
                    delete_versioned(pointer.cast());
                } else {
                    delete_legacy(pointer.cast());
                }
                return Err(PyErr::fetch(py));
            }
            Ok(Py::from_owned_ptr(py, capsule))
        }
    }

    fn __repr__(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(u64::to_string).collect();
        let comma = if dims.len() == 1 { "," } else { "" };
        format!(
            "Array(dtype={}, shape=({}{comma}), nbytes={}{})",
            self.dtype.name(),
            dims.join(", "),
            self.bytes.len(),
            match self.device().as_str() {
                "cpu" => String::new(),
                device => format!(", device={device}"),
            }
        )
    }
}
