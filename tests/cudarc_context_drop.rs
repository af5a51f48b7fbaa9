//! Either library may release its retain of a device's primary context first (feature `cudarc`).
//!
//! Alone in its own test binary, so its own process: a test of another binary that used cuBLAS
//! (through the CUDA runtime, which keeps the primary context retained until the process exits)
//! would leave the context active, and the first assertion, that no one else holds it, would fail
//! for that reason alone.

#![cfg(feature = "cudarc")]

mod common;

use common::{devices_or_skip, pattern, primary_active};
use cuda_vmm::{
    Context, DeviceBuffer, Granularity, ReadWrite, VirtualBuffer, allocation_granularity,
};
use cudarc::driver::CudaContext;

/// Either library may release its retain first: the primary context lives, and works, until the last
/// retain of either side ends, and is then reset.
#[test]
fn either_side_may_drop_its_context_first() {
    let test = "either_side_may_drop_its_context_first";
    let Some(devices) = devices_or_skip(test, 1) else {
        return;
    };
    let device = devices[0];
    drop(Context::new(device).unwrap());
    assert!(!primary_active(device), "no one else holds the context");

    // Ours first: cudarc's context still allocates, copies and frees.
    let ours = Context::new(device).unwrap();
    let theirs = CudaContext::new(device.ordinal()).unwrap();
    drop(ours);
    assert!(primary_active(device));
    let stream = theirs.default_stream();
    let slice = stream.clone_htod(&pattern(1024, 1)).unwrap();
    assert_eq!(stream.clone_dtoh(&slice).unwrap(), pattern(1024, 1));
    drop((slice, stream, theirs));
    assert!(
        !primary_active(device),
        "the last retain, cudarc's, reset it"
    );

    // cudarc's first: this crate's context and buffers still work.
    let theirs = CudaContext::new(device.ordinal()).unwrap();
    let ours = Context::new(device).unwrap();
    drop(theirs);
    assert!(primary_active(device));
    let buffer = DeviceBuffer::from_host(&ours, &pattern(1024, 2)).unwrap();
    assert_eq!(buffer.as_slice().to_vec().unwrap(), pattern(1024, 2));
    drop(buffer);
    drop(ours);
    assert!(!primary_active(device), "the last retain, ours, reset it");

    // A buffer keeps its own retain: dropping every context of either side leaves it working.
    let page = allocation_granularity(device, Granularity::Minimum).unwrap();
    let mut buffer = VirtualBuffer::new(page, &[device], ReadWrite).unwrap();
    buffer.grow(device, page).unwrap();
    drop(CudaContext::new(device.ordinal()).unwrap());
    assert!(
        primary_active(device),
        "the buffer retains its access set's contexts"
    );
    let input = pattern(page / 4, 3);
    buffer
        .slice_bytes_mut::<u32>(..)
        .unwrap()
        .copy_from_host(&input)
        .unwrap();
    assert_eq!(
        buffer.slice_bytes::<u32>(..).unwrap().to_vec().unwrap(),
        input
    );
}
