//! GPU-direct loading (`--features cuda`): without a CUDA driver `GpuLoader::new` answers
//! "CUDA not available" (no panic); with one, a tensor spanning two chunks loads through many
//! reused buffers and its device bytes equal the lane file's, and a load into a caller's
//! memory follows the caller's stream and refuses ranges that are not the parts'.
#![cfg(feature = "cuda")]

mod fuse_support;
mod skip;

use tensorfs::extents::stage::{StageConfig, StageError};
use tensorfs::extents::{self};
use tensorfs::gpu::{DeviceRange, GpuError, GpuLoader, DRIVER_LIBRARY};
use tensorfs::layout::LaneView;
use tensorfs::store::Store;

/// Whether the driver library loads here (what `GpuLoader::new` checks first).
fn driver_present() -> bool {
    // SAFETY: dlopens the driver library by its usual names and closes it again.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

#[test]
fn without_a_driver_the_loader_says_cuda_is_not_available() {
    for _ in 0..2 {
        match GpuLoader::new(0) {
            Err(GpuError::CudaNotAvailable { why }) => {
                let message = GpuError::CudaNotAvailable { why: why.clone() }.to_string();
                assert!(message.starts_with("CUDA not available: "), "{message}");
                if !driver_present() {
                    assert_eq!(
                        message,
                        format!(
                            "CUDA not available: the CUDA driver library ({DRIVER_LIBRARY}) could \
                             not be loaded: no NVIDIA driver is installed, or it is not on the \
                             library path (LD_LIBRARY_PATH)"
                        )
                    );
                }
            }
            Err(other) => panic!("not the CUDA-not-available error: {other}"),
            Ok(loader) => assert!(driver_present(), "a loader without a driver: {loader:?}"),
        }
    }
    let err = GpuLoader::new(usize::MAX).unwrap_err();
    assert!(matches!(err, GpuError::CudaNotAvailable { .. }), "{err}");
}

#[test]
fn on_a_device_a_tensor_across_two_chunks_loads_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let c = fuse_support::commit(&store, Some("f32"), 31);
    let commit = store.commit(&c.id).unwrap();
    let view = LaneView::build(&commit.id, &commit.tree, &commit.header).unwrap();
    let config = StageConfig {
        buffers: 2,
        buffer_bytes: 64 << 10,
        read_bytes: 16 << 10,
        ..StageConfig::default()
    };
    let mut loader = match GpuLoader::with_config(0, config) {
        Ok(loader) => loader,
        Err(GpuError::CudaNotAvailable { why }) => {
            // No device here: the test above checks this answer.
            skip::no_hardware(&format!(
                "no CUDA device ({why}): loading to the device was not exercised"
            ));
            return;
        }
        Err(e) => panic!("{e}"),
    };
    assert!(loader.fixed_buffers());
    for (i, name) in ["a.weight", "b.weight", "c.bias"].into_iter().enumerate() {
        let located = extents::locate(&store, &view, "model.safetensors", name).unwrap();
        let tensor = loader.load(&located).unwrap();
        assert_eq!((&tensor.key, &tensor.shape), (&located.key, &located.shape));
        assert_eq!(tensor.parts.len(), 1);
        assert!(
            tensor.parts[0].to_host().unwrap() == c.tensors[i].bytes,
            "{name}: the device bytes are the tensor's"
        );
        assert_eq!(tensor.stats.bytes, c.tensors[i].bytes.len() as u64);
    }
}

#[test]
fn on_a_device_a_load_into_callers_memory_waits_for_its_stream_and_checks_the_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let c = fuse_support::commit(&store, Some("f32"), 31);
    let commit = store.commit(&c.id).unwrap();
    let view = LaneView::build(&commit.id, &commit.tree, &commit.header).unwrap();
    let mut loader = match GpuLoader::new(0) {
        Ok(loader) => loader,
        Err(GpuError::CudaNotAvailable { why }) => {
            skip::no_hardware(&format!(
                "no CUDA device ({why}): loading into a caller's memory was not exercised"
            ));
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let located = extents::locate(&store, &view, "model.safetensors", "a.weight").unwrap();
    // The caller's memory: allocated on a stream of its own, which the copies must follow.
    let theirs = loader.context().new_stream().unwrap();
    let mut memory = theirs.alloc_zeros::<u8>(c.tensors[0].bytes.len()).unwrap();
    let range = DeviceRange::of(&mut memory);
    // SAFETY: `memory` is ours, of the loader's device, and untouched until the load returns.
    let stats = unsafe { loader.load_into(&located, &[range], Some(theirs.cu_stream())) }.unwrap();
    assert_eq!(stats.bytes, c.tensors[0].bytes.len() as u64);
    assert!(theirs.clone_dtoh(&memory).unwrap() == c.tensors[0].bytes);
    // A range that is not the part's length, or a count that is not the parts': refused
    // before anything is read.
    let short = DeviceRange {
        len: range.len - 1,
        ..range
    };
    for ranges in [&[short][..], &[], &[range, range]] {
        // SAFETY: as above; nothing is written when the ranges are refused.
        let err = unsafe { loader.load_into(&located, ranges, None) }.unwrap_err();
        assert!(
            matches!(err, GpuError::Stage(StageError::Invalid { .. })),
            "{err}"
        );
    }
    // Host bytes: `upload`.
    let uploaded = loader.upload(&c.tensors[1].bytes, "b.weight").unwrap();
    assert!(theirs.clone_dtoh(&uploaded).unwrap() == c.tensors[1].bytes);
}
