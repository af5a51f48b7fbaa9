//! The raw driver interface: the only module that declares foreign functions.
//!
//! `cuda-driver-sys` 0.3 was generated from CUDA 10.2 headers. Its functions return `CUresult` as a Rust
//! `enum`, and its structs hold enums too: a value a newer driver returns (error 34, handle type 0, ...)
//! would be undefined behaviour the moment it is read. So this module declares every driver function the
//! crate calls again, returning a plain `u32`, and mirrors every struct that has an enum field with
//! integer fields. The mirrors' size, alignment and field offsets are asserted equal to
//! `cuda-driver-sys`'s below. Only the `-lcuda` link and those layouts come from `cuda-driver-sys`;
//! none of its functions is called, and the handle types are the crate's own ([`crate::raw`],
//! asserted as large as `cuda-driver-sys`'s below).
//!
//! Declaring the same symbols with a different return type links to the same functions: the C ABI of an
//! `enum CUresult` (a 32-bit unsigned integer) and of `u32` are the same.

#![allow(non_snake_case, non_camel_case_types)]

use core::ffi::{c_char, c_int, c_uint, c_void};
use core::mem::{align_of, offset_of, size_of};

// The handle types are the crate's own (`crate::raw`), so that no bindings crate's type reaches the
// public API; they have the C types' representation (an `int`, an `unsigned long long`, or a pointer).
pub(crate) use crate::raw::{
    CUcontext, CUdevice, CUdeviceptr, CUevent, CUfunction, CUgraph, CUgraphExec, CUgraphNode,
    CUmemGenericAllocationHandle, CUmodule, CUstream,
};

/// A raw `CUresult`: an integer, so that codes no header knew about are representable.
pub(crate) type CUresult = u32;

// `CUmemLocationType` (`HOST` and `HOST_NUMA`: CUDA 12.2 and later; `cuMemCreate` accepts `HOST` from
// CUDA 13.0 on). `HOST_NUMA_CURRENT` (4) is not declared: `cuMemCreate` refuses it.
pub(crate) const CU_MEM_LOCATION_TYPE_DEVICE: u32 = 1;
pub(crate) const CU_MEM_LOCATION_TYPE_HOST: u32 = 2;
pub(crate) const CU_MEM_LOCATION_TYPE_HOST_NUMA: u32 = 3;
// `CUmemAllocationType`
pub(crate) const CU_MEM_ALLOCATION_TYPE_PINNED: u32 = 1;
// `CUmemAllocationHandleType`: `CU_MEM_HANDLE_TYPE_NONE` (CUDA 11.2 and later).
pub(crate) const CU_MEM_HANDLE_TYPE_NONE: u32 = 0;
pub(crate) const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: u32 = 1;
pub(crate) const CU_MEM_HANDLE_TYPE_FABRIC: u32 = 8;
// `CUmemRangeHandleType` (CUDA 11.7 and later): a dma-buf file descriptor.
#[cfg(unix)]
pub(crate) const CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: u32 = 1;
// `CUstreamCaptureStatus`: not capturing (the others are ACTIVE 1 and INVALIDATED 2).
pub(crate) const CU_STREAM_CAPTURE_STATUS_NONE: u32 = 0;
// `CUstreamCaptureMode`: RELAXED, the mode in which a thread's calls are refused by no other
// thread's capture (the others are GLOBAL 0, the default, and THREAD_LOCAL 1).
pub(crate) const CU_STREAM_CAPTURE_MODE_RELAXED: u32 = 2;
// THREAD_LOCAL: a capture that refuses the potentially unsafe calls of its own thread only, so that
// other threads' waits neither fail nor invalidate it.
pub(crate) const CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: u32 = 1;
pub(crate) const CU_STREAM_CAPTURE_STATUS_ACTIVE: u32 = 1;
/// `CUmemorytype`: where one side of a `CUDA_MEMCPY3D` is.
pub(crate) const CU_MEMORYTYPE_HOST: u32 = 1;
pub(crate) const CU_MEMORYTYPE_DEVICE: u32 = 2;
pub(crate) const CU_MEMORYTYPE_UNIFIED: u32 = 4;
// `CU_STREAM_PER_THREAD`: the calling thread's default stream, whichever thread that is.
pub(crate) const CU_STREAM_PER_THREAD: usize = 0x2;
// `CU_STREAM_LEGACY`: the legacy default stream of the current context, named explicitly (the null
// handle means it too, unless a program is built for per-thread default streams).
#[cfg(feature = "nccl")]
pub(crate) const CU_STREAM_LEGACY: usize = 0x1;
// `CUmemAccess_flags`
pub(crate) const CU_MEM_ACCESS_FLAGS_PROT_READ: u32 = 1;
pub(crate) const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: u32 = 3;
// `CUmemAllocationGranularity_flags`
pub(crate) const CU_MEM_ALLOC_GRANULARITY_MINIMUM: u32 = 0;
pub(crate) const CU_MEM_ALLOC_GRANULARITY_RECOMMENDED: u32 = 1;
// `CUdevice_attribute`
pub(crate) const CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: c_int = 102;
pub(crate) const CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: c_int = 41;
pub(crate) const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
pub(crate) const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;
pub(crate) const CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: c_int = 103;
// CUDA 11.0 and later (not in cuda-driver-sys's 10.2 headers): whether `cuMemCreate` memory can be
// made GPUDirect RDMA capable (`allocFlags.gpuDirectRDMACapable`). 110 in every `cuda.h` from 11.0 to
// 13.x; 116 is `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`, the device's GPUDirect RDMA support
// in general.
pub(crate) const CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: c_int = 110;
// CUDA 11.3 and later: GPUDirect RDMA in general (NIC access to device memory).
pub(crate) const CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: c_int = 116;
// CUDA 11.7 and later: `cuMemGetHandleForAddressRange` with `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
pub(crate) const CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: c_int = 124;
pub(crate) const CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED: c_int = 128;
pub(crate) const CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: c_int = 134;
pub(crate) const CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: c_int = 141;
// CUDA 12.4 and later: host-NUMA memory shared between the nodes of a multi-node system.
pub(crate) const CU_DEVICE_ATTRIBUTE_HOST_NUMA_MULTINODE_IPC_SUPPORTED: c_int = 143;
// CUDA 13.0 and later; older drivers answer `CUDA_ERROR_INVALID_VALUE` for it.
pub(crate) const CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: c_int = 145;

// `CUdevice_P2PAttribute`
pub(crate) const CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: c_int = 1;
pub(crate) const CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED: c_int = 2;
pub(crate) const CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED: c_int = 3;
pub(crate) const CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED: c_int = 4;
// Flags
pub(crate) const CU_MEM_ACCESS_FLAGS_PROT_NONE: u32 = 0;
pub(crate) const CU_STREAM_NON_BLOCKING: c_uint = 1;
pub(crate) const CU_EVENT_DEFAULT: c_uint = 0;
pub(crate) const CU_EVENT_DISABLE_TIMING: c_uint = 2;
pub(crate) const CU_MEMHOSTALLOC_PORTABLE: c_uint = 1;

/// Mirror of `CUmemLocation` with an integer `type`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct CUmemLocation {
    pub(crate) type_: u32,
    pub(crate) id: c_int,
}

/// Mirror of `CUmemAllocationProp`. CUDA 10.2's `reserved: u64` is today's 8-byte `allocFlags`
/// (compression type, RDMA capability, usage, reserved bytes); all zero asks for the defaults.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct CUmemAllocationProp {
    pub(crate) type_: u32,
    pub(crate) requestedHandleTypes: u32,
    pub(crate) location: CUmemLocation,
    pub(crate) win32HandleMetaData: *mut c_void,
    pub(crate) allocFlags: u64,
}

/// `allocFlags` of a [`CUmemAllocationProp`] with `gpuDirectRDMACapable` set. The C field is a struct
/// `{ unsigned char compressionType; unsigned char gpuDirectRDMACapable; unsigned short usage;
/// unsigned char reserved[4]; }` (CUDA 11.0 and later), which the mirror holds as its 8 bytes: the
/// flag is byte 1, whatever the byte order, so the value is built from the bytes in memory order.
pub(crate) const ALLOC_FLAGS_GPU_DIRECT_RDMA_CAPABLE: u64 =
    u64::from_ne_bytes([0, 1, 0, 0, 0, 0, 0, 0]);

/// `CUmemFabricHandle` (CUDA 12.3 and later, not in cuda-driver-sys): the 64 opaque bytes of a fabric
/// handle, which `cuMemExportToShareableHandle` writes and `cuMemImportFromShareableHandle` reads
/// through a pointer to it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct CUmemFabricHandle {
    pub(crate) data: [u8; 64],
}

/// Mirror of `CUmemAccessDesc` with integer `flags`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct CUmemAccessDesc {
    pub(crate) location: CUmemLocation,
    pub(crate) flags: u32,
}

mod layout {
    use super::{align_of, offset_of, size_of};
    use cuda_driver_sys as s;
    use static_assertions::{assert_eq_align, assert_eq_size, const_assert_eq};

    assert_eq_size!(super::CUmemLocation, s::CUmemLocation);
    assert_eq_align!(super::CUmemLocation, s::CUmemLocation);
    const_assert_eq!(
        offset_of!(super::CUmemLocation, type_),
        offset_of!(s::CUmemLocation, type_)
    );
    const_assert_eq!(
        offset_of!(super::CUmemLocation, id),
        offset_of!(s::CUmemLocation, id)
    );

    assert_eq_size!(super::CUmemAllocationProp, s::CUmemAllocationProp);
    assert_eq_align!(super::CUmemAllocationProp, s::CUmemAllocationProp);
    const_assert_eq!(size_of::<super::CUmemAllocationProp>(), 32);
    const_assert_eq!(
        offset_of!(super::CUmemAllocationProp, type_),
        offset_of!(s::CUmemAllocationProp, type_)
    );
    const_assert_eq!(
        offset_of!(super::CUmemAllocationProp, requestedHandleTypes),
        offset_of!(s::CUmemAllocationProp, requestedHandleTypes)
    );
    const_assert_eq!(
        offset_of!(super::CUmemAllocationProp, location),
        offset_of!(s::CUmemAllocationProp, location)
    );
    const_assert_eq!(
        offset_of!(super::CUmemAllocationProp, win32HandleMetaData),
        offset_of!(s::CUmemAllocationProp, win32HandleMetaData)
    );
    const_assert_eq!(
        offset_of!(super::CUmemAllocationProp, allocFlags),
        offset_of!(s::CUmemAllocationProp, reserved)
    );

    assert_eq_size!(super::CUDA_MEMCPY3D, s::CUDA_MEMCPY3D);
    assert_eq_align!(super::CUDA_MEMCPY3D, s::CUDA_MEMCPY3D);
    const_assert_eq!(size_of::<super::CUDA_MEMCPY3D>(), 200);
    const_assert_eq!(
        offset_of!(super::CUDA_MEMCPY3D, srcMemoryType),
        offset_of!(s::CUDA_MEMCPY3D, srcMemoryType)
    );
    const_assert_eq!(
        offset_of!(super::CUDA_MEMCPY3D, srcHost),
        offset_of!(s::CUDA_MEMCPY3D, srcHost)
    );
    const_assert_eq!(
        offset_of!(super::CUDA_MEMCPY3D, srcDevice),
        offset_of!(s::CUDA_MEMCPY3D, srcDevice)
    );
    const_assert_eq!(
        offset_of!(super::CUDA_MEMCPY3D, dstMemoryType),
        offset_of!(s::CUDA_MEMCPY3D, dstMemoryType)
    );
    const_assert_eq!(
        offset_of!(super::CUDA_MEMCPY3D, WidthInBytes),
        offset_of!(s::CUDA_MEMCPY3D, WidthInBytes)
    );
    const_assert_eq!(
        offset_of!(super::CUDA_MEMCPY3D, Depth),
        offset_of!(s::CUDA_MEMCPY3D, Depth)
    );

    assert_eq_size!(super::CUmemAccessDesc, s::CUmemAccessDesc);
    assert_eq_align!(super::CUmemAccessDesc, s::CUmemAccessDesc);
    const_assert_eq!(
        offset_of!(super::CUmemAccessDesc, location),
        offset_of!(s::CUmemAccessDesc, location)
    );
    const_assert_eq!(
        offset_of!(super::CUmemAccessDesc, flags),
        offset_of!(s::CUmemAccessDesc, flags)
    );

    // The crate's own handle types are the bindings' handle types' size.
    assert_eq_size!(super::CUcontext, s::CUcontext);
    assert_eq_size!(super::CUstream, s::CUstream);
    assert_eq_size!(super::CUevent, s::CUevent);
    assert_eq_size!(super::CUmodule, s::CUmodule);
    assert_eq_size!(super::CUfunction, s::CUfunction);
    assert_eq_size!(super::CUgraph, s::CUgraph);
    assert_eq_size!(super::CUdevice, s::CUdevice);
    assert_eq_size!(super::CUdeviceptr, s::CUdeviceptr);
    assert_eq_size!(
        super::CUmemGenericAllocationHandle,
        s::CUmemGenericAllocationHandle
    );

    // `CU_IPC_HANDLE_SIZE` bytes, no padding.
    const_assert_eq!(size_of::<super::CUmemFabricHandle>(), 64);

    // The integer stand-ins for C enums are as wide as the C enums.
    assert_eq_size!(super::CUresult, s::CUresult);
    const_assert_eq!(align_of::<super::CUresult>(), align_of::<s::CUresult>());
}

// The link itself (`-lcuda`) is emitted by cuda-driver-sys's build script, which is linked because the
// handle types above come from it.
unsafe extern "C" {
    pub(crate) fn cuInit(flags: c_uint) -> CUresult;
    pub(crate) fn cuDriverGetVersion(version: *mut c_int) -> CUresult;
    pub(crate) fn cuDeviceGetCount(count: *mut c_int) -> CUresult;
    pub(crate) fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult;
    pub(crate) fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult;
    pub(crate) fn cuDeviceGetAttribute(pi: *mut c_int, attrib: c_int, dev: CUdevice) -> CUresult;
    pub(crate) fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult;

    pub(crate) fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult;
    pub(crate) fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult;
    pub(crate) fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult;
    pub(crate) fn cuCtxGetCurrent(ctx: *mut CUcontext) -> CUresult;
    pub(crate) fn cuCtxSynchronize() -> CUresult;
    pub(crate) fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult;

    pub(crate) fn cuMemGetAllocationGranularity(
        granularity: *mut usize,
        prop: *const CUmemAllocationProp,
        option: u32,
    ) -> CUresult;
    pub(crate) fn cuMemCreate(
        handle: *mut CUmemGenericAllocationHandle,
        size: usize,
        prop: *const CUmemAllocationProp,
        flags: u64,
    ) -> CUresult;
    pub(crate) fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult;
    /// `shareable` points to storage for the handle: an `int` for a POSIX file descriptor, a
    /// `CUmemFabricHandle` for a fabric handle.
    pub(crate) fn cuMemExportToShareableHandle(
        shareable: *mut c_void,
        handle: CUmemGenericAllocationHandle,
        handle_type: u32,
        flags: u64,
    ) -> CUresult;
    /// `os_handle` is the handle itself for a POSIX file descriptor (the `int` cast to a pointer), not a
    /// pointer to it; for a fabric handle it points to the `CUmemFabricHandle`.
    pub(crate) fn cuMemImportFromShareableHandle(
        handle: *mut CUmemGenericAllocationHandle,
        os_handle: *mut c_void,
        handle_type: u32,
    ) -> CUresult;
    /// CUDA 11.7 and later. `handle` points to storage for the handle: an `int` for a dma-buf file
    /// descriptor (`handle_type` `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`); `handle_type` is a
    /// `CUmemRangeHandleType`, as an integer.
    #[cfg(unix)]
    pub(crate) fn cuMemGetHandleForAddressRange(
        handle: *mut c_void,
        dptr: CUdeviceptr,
        size: usize,
        handle_type: u32,
        flags: u64,
    ) -> CUresult;
    pub(crate) fn cuMemGetAllocationPropertiesFromHandle(
        prop: *mut CUmemAllocationProp,
        handle: CUmemGenericAllocationHandle,
    ) -> CUresult;
    pub(crate) fn cuMemAddressReserve(
        ptr: *mut CUdeviceptr,
        size: usize,
        alignment: usize,
        addr: CUdeviceptr,
        flags: u64,
    ) -> CUresult;
    pub(crate) fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult;
    pub(crate) fn cuMemMap(
        ptr: CUdeviceptr,
        size: usize,
        offset: usize,
        handle: CUmemGenericAllocationHandle,
        flags: u64,
    ) -> CUresult;
    pub(crate) fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult;
    pub(crate) fn cuMemSetAccess(
        ptr: CUdeviceptr,
        size: usize,
        desc: *const CUmemAccessDesc,
        count: usize,
    ) -> CUresult;

    pub(crate) fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult;
    pub(crate) fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult;

    pub(crate) fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, bytes: usize) -> CUresult;
    pub(crate) fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, bytes: usize) -> CUresult;
    pub(crate) fn cuMemsetD8_v2(dst: CUdeviceptr, value: u8, count: usize) -> CUresult;
    pub(crate) fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) -> CUresult;

    pub(crate) fn cuStreamSynchronize(stream: CUstream) -> CUresult;
    /// `status` is a `CUstreamCaptureStatus`, read as an integer.
    pub(crate) fn cuStreamIsCapturing(stream: CUstream, status: *mut c_uint) -> CUresult;
    /// `mode` is a `CUstreamCaptureMode`, exchanged as an integer: the calling thread's new mode in,
    /// its previous mode out.
    pub(crate) fn cuThreadExchangeStreamCaptureMode(mode: *mut c_uint) -> CUresult;
    pub(crate) fn cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph) -> CUresult;
    pub(crate) fn cuGraphDestroy(graph: CUgraph) -> CUresult;
    /// `mode` is a `CUstreamCaptureMode`, as an integer.
    pub(crate) fn cuStreamBeginCapture_v2(stream: CUstream, mode: c_uint) -> CUresult;
    /// CUDA 11.3 and later. `status` is a `CUstreamCaptureStatus`, as an integer; `dependencies`
    /// points at the driver's array, valid until the next call on the stream.
    pub(crate) fn cuStreamGetCaptureInfo_v2(
        stream: CUstream,
        status: *mut c_uint,
        id: *mut u64,
        graph: *mut CUgraph,
        dependencies: *mut *const CUgraphNode,
        count: *mut usize,
    ) -> CUresult;
    /// CUDA 11.4 and later.
    pub(crate) fn cuGraphInstantiateWithFlags(
        exec: *mut CUgraphExec,
        graph: CUgraph,
        flags: u64,
    ) -> CUresult;
    pub(crate) fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult;
    pub(crate) fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult;
    /// CUDA 12.0 and later: the `_v2` parameters, with `kern` and `ctx`.
    pub(crate) fn cuGraphExecKernelNodeSetParams_v2(
        exec: CUgraphExec,
        node: CUgraphNode,
        params: *const CUDA_KERNEL_NODE_PARAMS_v2,
    ) -> CUresult;
    pub(crate) fn cuGraphMemcpyNodeGetParams(
        node: CUgraphNode,
        params: *mut CUDA_MEMCPY3D,
    ) -> CUresult;
    pub(crate) fn cuGraphExecMemcpyNodeSetParams(
        exec: CUgraphExec,
        node: CUgraphNode,
        params: *const CUDA_MEMCPY3D,
        context: CUcontext,
    ) -> CUresult;
    pub(crate) fn cuStreamCreate(stream: *mut CUstream, flags: c_uint) -> CUresult;
    pub(crate) fn cuStreamDestroy_v2(stream: CUstream) -> CUresult;
    pub(crate) fn cuStreamWaitEvent(stream: CUstream, event: CUevent, flags: c_uint) -> CUresult;
    pub(crate) fn cuEventCreate(event: *mut CUevent, flags: c_uint) -> CUresult;
    pub(crate) fn cuEventDestroy_v2(event: CUevent) -> CUresult;
    pub(crate) fn cuEventRecord(event: CUevent, stream: CUstream) -> CUresult;
    pub(crate) fn cuEventSynchronize(event: CUevent) -> CUresult;
    pub(crate) fn cuEventQuery(event: CUevent) -> CUresult;
    #[cfg(feature = "nccl")]
    pub(crate) fn cuStreamQuery(stream: CUstream) -> CUresult;
    pub(crate) fn cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent) -> CUresult;

    pub(crate) fn cuMemHostAlloc(pp: *mut *mut c_void, bytes: usize, flags: c_uint) -> CUresult;
    pub(crate) fn cuMemFreeHost(p: *mut c_void) -> CUresult;
    pub(crate) fn cuMemcpyHtoDAsync_v2(
        dst: CUdeviceptr,
        src: *const c_void,
        bytes: usize,
        stream: CUstream,
    ) -> CUresult;
    pub(crate) fn cuMemcpyDtoHAsync_v2(
        dst: *mut c_void,
        src: CUdeviceptr,
        bytes: usize,
        stream: CUstream,
    ) -> CUresult;
    pub(crate) fn cuMemcpyDtoDAsync_v2(
        dst: CUdeviceptr,
        src: CUdeviceptr,
        bytes: usize,
        stream: CUstream,
    ) -> CUresult;
    pub(crate) fn cuMemsetD8Async(
        dst: CUdeviceptr,
        value: u8,
        count: usize,
        stream: CUstream,
    ) -> CUresult;

    pub(crate) fn cuDeviceCanAccessPeer(can: *mut c_int, dev: CUdevice, peer: CUdevice)
    -> CUresult;
    pub(crate) fn cuDeviceGetP2PAttribute(
        value: *mut c_int,
        attrib: c_int,
        src: CUdevice,
        dst: CUdevice,
    ) -> CUresult;
    pub(crate) fn cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint) -> CUresult;
    pub(crate) fn cuCtxDisablePeerAccess(peer: CUcontext) -> CUresult;

    pub(crate) fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult;
    pub(crate) fn cuModuleUnload(module: CUmodule) -> CUresult;
    pub(crate) fn cuModuleGetFunction(
        func: *mut CUfunction,
        module: CUmodule,
        name: *const c_char,
    ) -> CUresult;
    pub(crate) fn cuLaunchKernel(
        f: CUfunction,
        grid_x: c_uint,
        grid_y: c_uint,
        grid_z: c_uint,
        block_x: c_uint,
        block_y: c_uint,
        block_z: c_uint,
        shared_bytes: c_uint,
        stream: CUstream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> CUresult;

}

/// `cuCtxSetCurrent(context)`, skipped where `context` is current on this thread already
/// (`cuCtxGetCurrent`, a read of the thread's state at about half the cost): what every "make the
/// context current" of this crate calls, since most find it current. The result is the same either
/// way: `context` is current when this returns `CUDA_SUCCESS`.
///
/// # Safety
/// `context` is a live context (retained by the caller for the call).
pub(crate) unsafe fn make_current(context: CUcontext) -> CUresult {
    let mut current: CUcontext = core::ptr::null_mut();
    // SAFETY: `current` is writable for the call; the call only reads the thread's state.
    if unsafe { cuCtxGetCurrent(&raw mut current) } == 0 && current == context {
        return 0;
    }
    // SAFETY: a live context: the caller's guarantee.
    unsafe { cuCtxSetCurrent(context) }
}

/// `CUDA_KERNEL_NODE_PARAMS_v2` (CUDA 12.0 and later; not in cuda-driver-sys's 10.2 headers): a kernel
/// node's launch, as `cuGraphExecKernelNodeSetParams_v2` takes it. `kern` null and `ctx` null: the
/// node launches `func`, in the current context.
#[repr(C)]
pub(crate) struct CUDA_KERNEL_NODE_PARAMS_v2 {
    pub(crate) func: CUfunction,
    pub(crate) gridDimX: c_uint,
    pub(crate) gridDimY: c_uint,
    pub(crate) gridDimZ: c_uint,
    pub(crate) blockDimX: c_uint,
    pub(crate) blockDimY: c_uint,
    pub(crate) blockDimZ: c_uint,
    pub(crate) sharedMemBytes: c_uint,
    pub(crate) kernelParams: *mut *mut c_void,
    pub(crate) extra: *mut *mut c_void,
    pub(crate) kern: *mut c_void,
    pub(crate) ctx: CUcontext,
}

// The layout of CUDA 12's `cuda.h` on 64-bit targets: seven 32-bit fields after the function, padded
// to the pointers.
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<CUDA_KERNEL_NODE_PARAMS_v2>() == 72);
    assert!(offset_of!(CUDA_KERNEL_NODE_PARAMS_v2, sharedMemBytes) == 32);
    assert!(offset_of!(CUDA_KERNEL_NODE_PARAMS_v2, kernelParams) == 40);
    assert!(offset_of!(CUDA_KERNEL_NODE_PARAMS_v2, kern) == 56);
    assert!(offset_of!(CUDA_KERNEL_NODE_PARAMS_v2, ctx) == 64);
};

/// `CUDA_MEMCPY3D`: one copy node's operands, as `cuGraphMemcpyNodeGetParams` writes them and
/// `cuGraphExecMemcpyNodeSetParams` takes them. The two `CUmemorytype` fields are integers here
/// (cuda-driver-sys has them as Rust enums, which a value the driver adds later would make undefined
/// behaviour); the layout is asserted equal to the bindings' in `layout`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct CUDA_MEMCPY3D {
    pub(crate) srcXInBytes: usize,
    pub(crate) srcY: usize,
    pub(crate) srcZ: usize,
    pub(crate) srcLOD: usize,
    pub(crate) srcMemoryType: u32,
    pub(crate) srcHost: *const c_void,
    pub(crate) srcDevice: CUdeviceptr,
    pub(crate) srcArray: *mut c_void,
    pub(crate) reserved0: *mut c_void,
    pub(crate) srcPitch: usize,
    pub(crate) srcHeight: usize,
    pub(crate) dstXInBytes: usize,
    pub(crate) dstY: usize,
    pub(crate) dstZ: usize,
    pub(crate) dstLOD: usize,
    pub(crate) dstMemoryType: u32,
    pub(crate) dstHost: *mut c_void,
    pub(crate) dstDevice: CUdeviceptr,
    pub(crate) dstArray: *mut c_void,
    pub(crate) reserved1: *mut c_void,
    pub(crate) dstPitch: usize,
    pub(crate) dstHeight: usize,
    pub(crate) WidthInBytes: usize,
    pub(crate) Height: usize,
    pub(crate) Depth: usize,
}

impl CUDA_MEMCPY3D {
    /// All zero (null pointers, zero sizes): what `cuGraphMemcpyNodeGetParams` overwrites.
    pub(crate) fn zeroed() -> CUDA_MEMCPY3D {
        CUDA_MEMCPY3D {
            srcXInBytes: 0,
            srcY: 0,
            srcZ: 0,
            srcLOD: 0,
            srcMemoryType: 0,
            srcHost: core::ptr::null(),
            srcDevice: 0,
            srcArray: core::ptr::null_mut(),
            reserved0: core::ptr::null_mut(),
            srcPitch: 0,
            srcHeight: 0,
            dstXInBytes: 0,
            dstY: 0,
            dstZ: 0,
            dstLOD: 0,
            dstMemoryType: 0,
            dstHost: core::ptr::null_mut(),
            dstDevice: 0,
            dstArray: core::ptr::null_mut(),
            reserved1: core::ptr::null_mut(),
            dstPitch: 0,
            dstHeight: 0,
            WidthInBytes: 0,
            Height: 0,
            Depth: 0,
        }
    }
}
