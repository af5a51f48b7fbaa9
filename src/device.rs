//! Driver entry: initialisation, devices and their primary contexts, and what each device can do
//! ([`Capabilities`]).

use core::ffi::{c_char, c_int};
use core::fmt;
use core::ptr;
use core::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::{DriverError, Error, Result, check};
use crate::sys;

// What a device can do beyond one process, in one report; the machine's IMEX channel.
mod capabilities;

pub use capabilities::{Capabilities, IMEX_CHANNEL_DIRECTORY, imex_channel};

/// `cuInit` — initialise the driver API for this process.
///
/// Idempotent: once it has succeeded, later calls return at once without calling the driver. Every
/// function of this crate that needs an initialised driver calls it, so calling it yourself is only
/// needed to learn early whether a driver is usable.
///
/// # Errors
/// [`Error::Driver`] with [`DriverError::NO_DEVICE`] where the driver library is installed but no GPU
/// (or no kernel driver) is present, or with [`DriverError::STUB_LIBRARY`] where a toolkit stub was
/// loaded instead of a driver: [`Error::is_no_gpu`] is true for both.
#[doc(alias = "cuInit")]
pub fn init() -> Result<()> {
    // Success is final for the process (the driver cannot be uninitialised), so it is remembered; a
    // failure is not, and the next call asks again.
    static INITIALISED: AtomicBool = AtomicBool::new(false);
    if INITIALISED.load(Ordering::Acquire) {
        return Ok(());
    }
    // SAFETY: `cuInit` takes only a flags word (which must be 0) and has no pointer arguments.
    check(unsafe { sys::cuInit(0) })?;
    INITIALISED.store(true, Ordering::Release);
    Ok(())
}

/// `cuDriverGetVersion` — the CUDA version the installed driver supports, as `1000 * major + 10 * minor`
/// (13000 for CUDA 13.0). Works without [`init`] and without a GPU.
///
/// # Errors
/// The driver's error, if any.
#[doc(alias = "cuDriverGetVersion")]
pub fn driver_version() -> Result<i32> {
    let mut version: c_int = 0;
    // SAFETY: `version` is a valid, writable `c_int` for the duration of the call.
    check(unsafe { sys::cuDriverGetVersion(&raw mut version) })?;
    Ok(version)
}

/// A CUDA device, named by its ordinal.
///
/// Only [`Device::get`] and [`Device::all`] create one, after the driver confirmed that the ordinal exists,
/// so every `Device` names a device that the driver knows.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Device {
    ordinal: sys::CUdevice,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({})", self.ordinal)
    }
}

impl Device {
    /// `cuDeviceGetCount` — the number of CUDA devices (after [`init`]).
    ///
    /// # Errors
    /// [`DriverError::NO_DEVICE`] where the driver found no GPU, or any error of [`init`].
    #[doc(alias = "cuDeviceGetCount")]
    pub fn count() -> Result<usize> {
        init()?;
        let mut count: c_int = 0;
        // SAFETY: `count` is a valid, writable `c_int` for the duration of the call.
        check(unsafe { sys::cuDeviceGetCount(&raw mut count) })?;
        Ok(usize::try_from(count).unwrap_or(0))
    }

    /// `cuDeviceGet` — the device with this ordinal (after [`init`]).
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`] for an ordinal at or above [`Device::count`], checked before
    /// `cuDeviceGet`; any error of [`Device::count`] or of the driver.
    #[doc(alias = "cuDeviceGet")]
    pub fn get(ordinal: usize) -> Result<Device> {
        Device::below(ordinal, Device::count()?)
    }

    /// `cuDeviceGet` of `ordinal`, checked first against `count`, the driver's device count.
    fn below(ordinal: usize, count: usize) -> Result<Device> {
        let no_such = Error::NoSuchDevice { ordinal, count };
        if ordinal >= count {
            return Err(no_such);
        }
        // Below a count the driver gave as a `c_int`, so this conversion does not fail.
        let Ok(ordinal) = c_int::try_from(ordinal) else {
            return Err(no_such);
        };
        let mut device: sys::CUdevice = 0;
        // SAFETY: `device` is a valid, writable `CUdevice` for the duration of the call.
        check(unsafe { sys::cuDeviceGet(&raw mut device, ordinal) })?;
        Ok(Device { ordinal: device })
    }

    /// Every device, in ordinal order. Empty where the driver reports no device.
    ///
    /// # Errors
    /// Any error of [`init`] other than [`DriverError::NO_DEVICE`].
    pub fn all() -> Result<Vec<Device>> {
        match Device::count() {
            Ok(n) => (0..n).map(|ordinal| Device::below(ordinal, n)).collect(),
            Err(Error::Driver(DriverError::NO_DEVICE)) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// The device's ordinal.
    #[must_use]
    pub fn ordinal(self) -> usize {
        // A `Device` is only built from an ordinal the driver accepted, which is never negative.
        usize::try_from(self.ordinal).unwrap_or(0)
    }

    /// The raw `CUdevice`: an ordinal, which owns nothing.
    #[must_use]
    pub fn as_raw(self) -> sys::CUdevice {
        self.ordinal
    }

    /// `cuDeviceGetName` — the device's name, e.g. `NVIDIA H200`.
    ///
    /// # Errors
    /// The driver's error, if any.
    #[doc(alias = "cuDeviceGetName")]
    pub fn name(self) -> Result<String> {
        const LEN: c_int = 256;
        // Bytes, whichever sign `c_char` has on the target.
        let mut buf = [0u8; LEN as usize];
        // SAFETY: `buf` is writable for `LEN` bytes (`c_char` and `u8` have one size and alignment);
        // the driver writes a NUL-terminated string of at most that many bytes.
        check(unsafe {
            sys::cuDeviceGetName(buf.as_mut_ptr().cast::<c_char>(), LEN, self.ordinal)
        })?;
        let name = buf.split(|&b| b == 0).next().unwrap_or_default();
        Ok(String::from_utf8_lossy(name).into_owned())
    }

    /// `cuDeviceGetAttribute` — any device attribute, by its raw `CUdevice_attribute` number.
    ///
    /// An integer rather than an enum, so that attributes newer than this crate can be read too.
    ///
    /// # Errors
    /// [`DriverError::INVALID_VALUE`] for an attribute the driver does not know.
    #[doc(alias = "cuDeviceGetAttribute")]
    pub fn attribute(self, attribute: i32) -> Result<i32> {
        let mut value: c_int = 0;
        // SAFETY: `value` is a valid, writable `c_int` for the duration of the call.
        check(unsafe { sys::cuDeviceGetAttribute(&raw mut value, attribute, self.ordinal) })?;
        Ok(value)
    }

    /// Whether the device supports the virtual memory management API
    /// (`CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`).
    ///
    /// # Errors
    /// The driver's error, if any.
    pub fn supports_vmm(self) -> Result<bool> {
        Ok(self.attribute(sys::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)? != 0)
    }

    /// Whether the device shares the process's unified virtual address space
    /// (`CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING`).
    ///
    /// # Errors
    /// The driver's error, if any.
    pub fn unified_addressing(self) -> Result<bool> {
        Ok(self.attribute(sys::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)? != 0)
    }

    /// The compute capability, as `(major, minor)`: `(9, 0)` for an H200.
    ///
    /// # Errors
    /// The driver's error, if any.
    pub fn compute_capability(self) -> Result<(i32, i32)> {
        Ok((
            self.attribute(sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            self.attribute(sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ))
    }

    /// Whether `attribute` is non-zero; `false` also where the driver does not know the attribute
    /// (`CUDA_ERROR_INVALID_VALUE` from a driver older than the attribute).
    fn has(self, attribute: i32) -> Result<bool> {
        match self.attribute(attribute) {
            Ok(value) => Ok(value != 0),
            Err(Error::Driver(DriverError::INVALID_VALUE)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Whether the device can map and access VMM memory located on the host with no particular NUMA
    /// node (`CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`, CUDA 13.0 and later;
    /// `false` where the driver is older).
    ///
    /// # Errors
    /// The driver's error, if any.
    pub fn supports_host_memory(self) -> Result<bool> {
        self.has(sys::CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
    }

    /// Whether the device can map and access VMM memory located on a host NUMA node
    /// (`CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`, CUDA 12.2 and later).
    ///
    /// # Errors
    /// The driver's error, if any.
    pub fn supports_host_numa_memory(self) -> Result<bool> {
        self.has(sys::CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
    }

    /// The host NUMA node closest to the device (`CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID`); `None` where the
    /// system has no NUMA (the driver answers -1) or the driver does not know the attribute.
    ///
    /// # Errors
    /// The driver's error, if any.
    pub fn host_numa_node(self) -> Result<Option<u16>> {
        match self.attribute(sys::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID) {
            Ok(node) => Ok(u16::try_from(node).ok()),
            Err(Error::Driver(DriverError::INVALID_VALUE)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether the device's memory can be exported as a POSIX file descriptor
    /// (`CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`).
    ///
    /// # Errors
    /// The driver's error, if any.
    pub fn supports_posix_fd_handles(self) -> Result<bool> {
        self.has(sys::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)
    }

    /// Whether the device supports fabric handles (`CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED`).
    /// A device may say yes and the driver still refuse fabric-shareable memory to a process without
    /// an IMEX channel.
    ///
    /// # Errors
    /// The driver's error, if any.
    pub fn supports_fabric_handles(self) -> Result<bool> {
        self.has(sys::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED)
    }

    /// Whether VMM memory of the device can be made `GPUDirect` RDMA capable
    /// (`CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`, CUDA 11.0 and later), as
    /// [`AllocationOptions::with_rdma`](crate::vmm::AllocationOptions::with_rdma) asks.
    ///
    /// # Errors
    /// The driver's error, if any.
    pub fn supports_gpu_direct_rdma_with_vmm(self) -> Result<bool> {
        self.has(sys::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED)
    }

    /// `cuDeviceTotalMem` — the device's memory in bytes.
    ///
    /// # Errors
    /// The driver's error, if any.
    #[doc(alias = "cuDeviceTotalMem")]
    pub fn total_memory(self) -> Result<usize> {
        let mut bytes = 0usize;
        // SAFETY: `bytes` is a valid, writable `usize` (`size_t`) for the duration of the call.
        check(unsafe { sys::cuDeviceTotalMem_v2(&raw mut bytes, self.ordinal) })?;
        Ok(bytes)
    }
}

/// A device's primary context, retained for as long as this value, or a clone of it, lives.
///
/// `cuDevicePrimaryCtxRetain` in [`Context::new`], `cuDevicePrimaryCtxRelease` when the last clone is
/// dropped. The primary context is the one the CUDA runtime uses too, so memory and modules are shared
/// with runtime-based libraries.
///
/// # Clones share one retain
/// A value from [`Context::new`] is one retain in the driver. Its clones share that retain rather
/// than retaining again: the retained handle lives in an [`Arc`], a clone is a clone of the `Arc`, and
/// the driver's release is made once, by the drop of the last clone. So cloning makes no driver call
/// and cannot fail (a retain can), and a value that must keep the context alive (a
/// [`DeviceBuffer`](crate::DeviceBuffer), a [`Module`](crate::Module)) keeps a clone of the context it
/// was given. Calling [`Context::new`] again makes a second retain of its own in the driver. Either
/// way, the primary context stays retained, and so is not reset, while any clone of any `Context` of
/// its device lives.
///
/// Driver calls that need a current context (copies, synchronisation, memory queries) are made by this
/// crate after `cuCtxSetCurrent` on the context they belong to. That leaves the context current on the
/// calling thread afterwards, as the CUDA runtime does.
#[derive(Clone)]
pub struct Context {
    retained: Arc<Retained>,
}

/// One retain of a device's primary context: made by [`Context::new`], released by this value's drop.
/// Shared by every clone of the `Context` (see [Clones share one retain](Context#clones-share-one-retain)).
struct Retained {
    raw: sys::CUcontext,
    device: Device,
}

// SAFETY: a `CUcontext` is a handle to a process-wide driver object, not to thread-local state. The
// driver API is thread-safe: a context may be made current on, and used from, any thread, also several
// at once, and released from any thread. `Retained` has no interior state of its own, and its one
// release is made by whichever thread drops the last `Context` sharing it.
unsafe impl Send for Retained {}
// SAFETY: as for `Send`; a `&Retained` gives only the handle and the device, which are passed to
// thread-safe driver calls. (`Context`, an `Arc<Retained>`, is `Send` and `Sync` through these.)
unsafe impl Sync for Retained {}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.retained.device)
            .field("raw", &self.retained.raw)
            .finish()
    }
}

impl Context {
    /// `cuDevicePrimaryCtxRetain` — retain `device`'s primary context, once; the value's clones share
    /// this retain (see [Clones share one retain](Context#clones-share-one-retain)).
    ///
    /// # Errors
    /// The driver's error, e.g. [`DriverError::OUT_OF_MEMORY`] when the context cannot be created.
    #[doc(alias = "cuDevicePrimaryCtxRetain")]
    pub fn new(device: Device) -> Result<Context> {
        let mut raw: sys::CUcontext = ptr::null_mut();
        // SAFETY: `raw` is a valid, writable handle slot; `device` names a device the driver knows.
        check(unsafe { sys::cuDevicePrimaryCtxRetain(&raw mut raw, device.ordinal) })?;
        Ok(Context {
            retained: Arc::new(Retained { raw, device }),
        })
    }

    /// The device whose primary context this is.
    #[must_use]
    pub fn device(&self) -> Device {
        self.retained.device
    }

    /// The raw `CUcontext`. It stays valid while `self` (or a clone of it) lives; do not release it.
    #[must_use]
    pub fn as_raw(&self) -> sys::CUcontext {
        self.retained.raw
    }

    /// `cuCtxSetCurrent` — make this context current on the calling thread.
    ///
    /// # Errors
    /// The driver's error, if any.
    #[doc(alias = "cuCtxSetCurrent")]
    pub fn bind_to_thread(&self) -> Result<()> {
        // SAFETY: `self.as_raw()` is a retained primary context, alive while `self` is.
        check(unsafe { sys::make_current(self.as_raw()) })?;
        Ok(())
    }

    /// `cuCtxSynchronize` — wait until all work queued in this context has finished.
    ///
    /// The wait holds under stream capture: other threads' captures do not refuse it, and it
    /// returns only once the work has finished or the context is proven dead (see
    /// [When a wait fails](crate::stream#when-a-wait-fails)).
    ///
    /// # Errors
    /// A sticky error left by earlier asynchronous work.
    #[doc(alias = "cuCtxSynchronize")]
    pub fn synchronize(&self) -> Result<()> {
        crate::wait::context(self.as_raw())
    }

    /// `cuMemGetInfo` — `(free, total)` device memory in bytes, as seen from this context.
    ///
    /// Physical allocations made through this crate are accounted to the byte, so a difference in
    /// `free` is an exact leak measure.
    ///
    /// # Errors
    /// The driver's error, if any.
    #[doc(alias = "cuMemGetInfo")]
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.bind_to_thread()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both pointers are valid and writable; a context is current (bound just above).
        check(unsafe { sys::cuMemGetInfo_v2(&raw mut free, &raw mut total) })?;
        Ok((free, total))
    }
}

impl Drop for Retained {
    fn drop(&mut self) {
        // SAFETY: `Context::new` retained the primary context once for this value, which the clones of
        // that `Context` share (an `Arc`); it is dropped once, with the last of them, and releases once.
        let code = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.device.ordinal) };
        // Errors are ignored: `drop` cannot return them, and the only failures (driver deinitialised at
        // process exit, invalid device) leave nothing that could be released later.
        let _ = code;
    }
}
