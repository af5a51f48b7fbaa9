//! The checks that `cuMemCreate` is only asked for what the device and the location allow: every
//! handle kind and the `GPUDirect` RDMA flag of an [`AllocationOptions`] against its location and
//! the device's attributes, and fabric handles against the machine's IMEX channel and a probe.

use core::ffi::c_void;
use std::sync::{Mutex, PoisonError};

use super::{AllocationOptions, HandleKinds, Location};
use crate::device::{Device, imex_channel};
use crate::error::{DriverError, DriverResult, Error, Result, check};
use crate::sys;

impl AllocationOptions {
    /// Checks the options against the location and the device attributes, as
    /// [`PhysicalAllocation::with_options`](super::PhysicalAllocation::with_options) does before
    /// `cuMemCreate`, for owners that check once what all their allocations will ask for.
    pub(crate) fn check_supported(&self) -> Result<()> {
        check_supported(self)
    }
}

/// What a fabric refusal of `NOT_PERMITTED` means.
const NO_IMEX_CHANNEL: &str = "the process has no IMEX channel (the driver's \
     nvidia-caps-imex-channels device and a channel file the user can open)";

const FABRIC_WHAT: &str = "fabric-shareable memory";

/// Checks `options` before `cuMemCreate`: every handle kind and the RDMA flag against the location
/// (host memory is never fabric-shareable or RDMA-flagged here, and memory with no NUMA node never
/// shareable) and, for device memory, against the device attribute that allows it; fabric handles
/// also against the machine's IMEX channel (no allocation), then a probe, made once per device.
///
/// # Errors
/// [`Error::NotForLocation`] for an option the location does not take; [`Error::Unsupported`] where
/// a device attribute is 0; [`Error::NoImexChannel`] for fabric handles where the machine has no
/// IMEX channel; [`Error::Refused`] where the fabric probe failed; the driver's error where an
/// attribute or the probe could not be read.
pub(super) fn check_supported(options: &AllocationOptions) -> Result<()> {
    let kinds = options.handle_kinds();
    if kinds.is_empty() && !options.rdma() {
        return Ok(());
    }
    match options.location {
        Location::Device(device) => check_device(device, kinds, options.rdma()),
        Location::Host => {
            if !kinds.is_empty() {
                return Err(Error::NotForLocation {
                    what: "a shareable handle kind",
                    location: "on the host with no NUMA node (Location::Host)",
                    why: "the driver makes such memory unshareable and refuses any handle type \
                          (CUDA_ERROR_INVALID_VALUE)",
                });
            }
            Err(not_rdma_on_host())
        }
        Location::HostNuma(_) => {
            if kinds.contains(HandleKinds::FABRIC) {
                return Err(Error::NotForLocation {
                    what: "a fabric handle",
                    location: "on a host NUMA node (Location::HostNuma)",
                    why: "the device attribute and the probe that say whether fabric handles work \
                          are a device's, and host memory has none",
                });
            }
            if options.rdma() {
                return Err(not_rdma_on_host());
            }
            // A POSIX file descriptor: the driver decides (no device attribute covers host memory).
            Ok(())
        }
    }
}

fn not_rdma_on_host() -> Error {
    Error::NotForLocation {
        what: "the GPUDirect RDMA flag",
        location: "on the host",
        why: "it is a property of device memory (its attribute is a device's); host memory is \
              reached by other devices without it",
    }
}

fn check_device(device: Device, kinds: HandleKinds, rdma: bool) -> Result<()> {
    if kinds.contains(HandleKinds::POSIX_FD) && !device.supports_posix_fd_handles()? {
        return Err(Error::Unsupported {
            what: "memory shareable as a POSIX file descriptor",
            device: device.as_raw(),
            attribute: sys::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
        });
    }
    if kinds.contains(HandleKinds::FABRIC) {
        check_fabric(device)?;
        fabric_probe_cached(device)?;
    }
    if rdma && !device.supports_gpu_direct_rdma_with_vmm()? {
        return Err(Error::Unsupported {
            what: "GPUDirect RDMA capable VMM memory",
            device: device.as_raw(),
            attribute: sys::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
        });
    }
    Ok(())
}

/// Checks that `device` can have fabric-shareable memory with no allocation and no driver call
/// other than an attribute query: its fabric attribute, then the machine's IMEX channel (without
/// one the driver refuses with `CUDA_ERROR_NOT_PERMITTED`). What a fabric export or import checks
/// first; an allocation then asks the probe too.
///
/// # Errors
/// [`Error::Unsupported`] where the attribute is 0; [`Error::NoImexChannel`] where the machine has
/// no IMEX channel; the driver's error where the attribute could not be read.
pub(crate) fn check_fabric(device: Device) -> Result<()> {
    if !device.supports_fabric_handles()? {
        return Err(Error::Unsupported {
            what: FABRIC_WHAT,
            device: device.as_raw(),
            attribute: sys::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED,
        });
    }
    if imex_channel().is_none() {
        return Err(Error::NoImexChannel {
            device: device.as_raw(),
        });
    }
    Ok(())
}

/// The fabric probe's answer for `device`: asked of the driver once per device and then remembered
/// (an IMEX channel does not come or go while a process runs), except an out-of-memory answer,
/// which says nothing about fabric handles and is asked again next time.
///
/// # Errors
/// [`Error::Refused`] with the driver's refusal of a probe step.
fn fabric_probe_cached(device: Device) -> Result<()> {
    static KNOWN: Mutex<Vec<(i32, DriverResult<()>)>> = Mutex::new(Vec::new());
    let known = |table: &Vec<(i32, DriverResult<()>)>| {
        table.iter().find(|e| e.0 == device.as_raw()).map(|e| e.1)
    };
    // The lock is not held across the probe; two first callers may both probe, and one answer is kept.
    let cached = known(&KNOWN.lock().unwrap_or_else(PoisonError::into_inner));
    let answer = if let Some(answer) = cached {
        answer
    } else {
        let answer = fabric_probe(device)?;
        if answer != Err(DriverError::OUT_OF_MEMORY) {
            let mut table = KNOWN.lock().unwrap_or_else(PoisonError::into_inner);
            if known(&table).is_none() {
                table.push((device.as_raw(), answer));
            }
        }
        answer
    };
    answer.map_err(|error| Error::Refused {
        what: FABRIC_WHAT,
        why: if error == DriverError::NOT_PERMITTED {
            NO_IMEX_CHANNEL
        } else {
            "a probe allocation could not be created, exported as a fabric handle and imported again"
        },
        error,
    })
}

/// The probe: one allocation of `device`'s fabric granularity with the fabric handle type
/// (`cuMemCreate`), exported (`cuMemExportToShareableHandle`) and imported again
/// (`cuMemImportFromShareableHandle`); everything it made is released before it returns. The outer
/// `Result` is the granularity query's error; the inner one the first refusal of a probe step.
fn fabric_probe(device: Device) -> Result<DriverResult<()>> {
    let options = AllocationOptions::device(device).with_handle_kinds(HandleKinds::FABRIC);
    let size = options.minimum_granularity_cached()?;
    let prop = options.raw();
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: `handle` is writable and `prop` a fully initialised property mirror, both alive for the
    // call; `size` is the granularity of these options; flags must be 0.
    let created = check(unsafe { sys::cuMemCreate(&raw mut handle, size, &raw const prop, 0) });
    if let Err(error) = created {
        return Ok(Err(error));
    }
    let mut shared = sys::CUmemFabricHandle { data: [0; 64] };
    // SAFETY: for a fabric handle the driver writes one `CUmemFabricHandle` through the pointer:
    // `shared` is a live, writable one. `handle` was just created with the fabric handle type; flags
    // must be 0.
    let exported = check(unsafe {
        sys::cuMemExportToShareableHandle(
            (&raw mut shared).cast::<c_void>(),
            handle,
            sys::CU_MEM_HANDLE_TYPE_FABRIC,
            0,
        )
    });
    let imported = exported.and_then(|()| {
        let mut imported: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `imported` is writable; for a fabric handle the driver reads the
        // `CUmemFabricHandle` the pointer points to, which the export has just written and which
        // lives for the call.
        check(unsafe {
            sys::cuMemImportFromShareableHandle(
                &raw mut imported,
                (&raw mut shared).cast::<c_void>(),
                sys::CU_MEM_HANDLE_TYPE_FABRIC,
            )
        })?;
        // SAFETY: the import has just returned this handle, a reference of its own: released once.
        check(unsafe { sys::cuMemRelease(imported) })
    });
    // SAFETY: `handle` came from `cuMemCreate` above and is released once, here; nothing maps it.
    let released = check(unsafe { sys::cuMemRelease(handle) });
    Ok(imported.and(released))
}
