//! Physical memory: `cuMemCreate` / `cuMemRelease`, and the granularity rules it obeys.

use core::fmt;
use core::mem::ManuallyDrop;
use core::ptr;
use core::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::device::Device;
use crate::error::{DriverResult, Error, Result, check};
use crate::sys;

// What an allocation can be exported as.
mod handles;
// The checks before `cuMemCreate` of what an allocation asks for.
mod support;

pub use handles::HandleKinds;
pub(crate) use support::check_fabric;

/// Which allocation granularity to ask for (`CUmemAllocationGranularity_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Granularity {
    /// The smallest granularity the driver accepts (`CU_MEM_ALLOC_GRANULARITY_MINIMUM`). Sizes and
    /// mapping offsets must be multiples of it.
    Minimum,
    /// The granularity the driver recommends for performance (`CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`).
    Recommended,
}

/// Where a physical allocation lives: device memory, or host memory (CUDA 12.2 and later; see
/// [`HostAllocation`](crate::host::HostAllocation) for memory the CPU reads and writes as Rust slices).
/// `#[non_exhaustive]`: the driver has more kinds of location than this crate offers.
///
/// `CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT` has no variant: `cuMemCreate` refuses it
/// (`CUDA_ERROR_INVALID_VALUE`, measured), so there is nothing to allocate there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Location {
    /// Memory of this device (`CU_MEM_LOCATION_TYPE_DEVICE`).
    Device(Device),
    /// Host memory on no particular NUMA node (`CU_MEM_LOCATION_TYPE_HOST`; `cuMemCreate` accepts it
    /// from CUDA 13.0 on). The driver never makes it shareable with another process.
    Host,
    /// Host memory on this NUMA node (`CU_MEM_LOCATION_TYPE_HOST_NUMA`); node 0 where the system has
    /// no NUMA. Linux numbers nodes below 1024, so a `u16` holds every node and always fits the
    /// driver's `int`.
    HostNuma(u16),
}

impl Location {
    fn raw(self) -> sys::CUmemLocation {
        match self {
            Location::Device(d) => sys::CUmemLocation {
                type_: sys::CU_MEM_LOCATION_TYPE_DEVICE,
                id: d.as_raw(),
            },
            // The driver ignores the id of a host location.
            Location::Host => sys::CUmemLocation {
                type_: sys::CU_MEM_LOCATION_TYPE_HOST,
                id: 0,
            },
            Location::HostNuma(node) => sys::CUmemLocation {
                type_: sys::CU_MEM_LOCATION_TYPE_HOST_NUMA,
                id: i32::from(node),
            },
        }
    }
}

/// How to allocate physical memory: the location, the kinds of shareable handle it can be exported
/// as ([`HandleKinds`]) and whether it is `GPUDirect` RDMA capable. `#[non_exhaustive]` leaves room for
/// more allocation flags.
///
/// The builder methods ([`with_handle_kinds`](AllocationOptions::with_handle_kinds),
/// [`with_rdma`](AllocationOptions::with_rdma)) only record what is asked; every option is checked
/// by [`PhysicalAllocation::with_options`] before `cuMemCreate`, against the location and the device
/// attribute that allows it:
///
/// | option | device memory | [`Location::HostNuma`] | [`Location::Host`] |
/// | --- | --- | --- | --- |
/// | [`HandleKinds::POSIX_FD`] | `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED` | passed to the driver (no attribute covers host memory) | refused: the driver refuses any handle type there |
/// | [`HandleKinds::FABRIC`] | `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED`, an IMEX channel on the machine ([`imex_channel`](crate::device::imex_channel), no allocation), and a probe: one allocation exported and imported as a fabric handle, once per device | refused | refused |
/// | [`with_rdma`](AllocationOptions::with_rdma) | `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED` | refused | refused |
///
/// A [`HostAllocation`](crate::host::HostAllocation), whose bytes the CPU borrows as slices, is
/// always made with no handle kind: no other process may write them meanwhile.
///
/// # Examples
/// ```no_run
/// use cuda_vmm::vmm::{AllocationOptions, HandleKinds};
/// use cuda_vmm::{Device, PhysicalAllocation};
///
/// # fn main() -> Result<(), cuda_vmm::Error> {
/// let device = Device::get(0)?;
/// let options = AllocationOptions::device(device)
///     .with_handle_kinds(HandleKinds::POSIX_FD)
///     .with_rdma(true);
/// let page = options.granularity(cuda_vmm::Granularity::Minimum)?;
/// let memory = PhysicalAllocation::with_options(page, options)?; // checked, then cuMemCreate
/// assert!(memory.options().handle_kinds().contains(HandleKinds::POSIX_FD));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct AllocationOptions {
    /// Where the memory lives.
    pub location: Location,
    /// The kinds of handle for `requestedHandleTypes`: none, unless asked for.
    handle_kinds: HandleKinds,
    /// `allocFlags.gpuDirectRDMACapable`.
    rdma: bool,
}

impl AllocationOptions {
    /// Pinned memory of `device`, not exportable.
    #[must_use]
    pub fn device(device: Device) -> AllocationOptions {
        AllocationOptions::at(Location::Device(device))
    }

    /// Host memory on no particular NUMA node ([`Location::Host`]), not exportable.
    #[must_use]
    pub fn host() -> AllocationOptions {
        AllocationOptions::at(Location::Host)
    }

    /// Host memory on NUMA node `node` ([`Location::HostNuma`]), not exportable.
    #[must_use]
    pub fn host_numa(node: u16) -> AllocationOptions {
        AllocationOptions::at(Location::HostNuma(node))
    }

    fn at(location: Location) -> AllocationOptions {
        AllocationOptions {
            location,
            handle_kinds: HandleKinds::NONE,
            rdma: false,
        }
    }

    /// The same options, exportable as every kind of `kinds` (`requestedHandleTypes`); replaces the
    /// kinds asked for before. Checked by [`PhysicalAllocation::with_options`] (see the table above).
    #[must_use]
    pub fn with_handle_kinds(self, kinds: HandleKinds) -> AllocationOptions {
        AllocationOptions {
            handle_kinds: kinds,
            ..self
        }
    }

    /// The same options, `GPUDirect` RDMA capable or not (`allocFlags.gpuDirectRDMACapable`): memory a
    /// network adapter may read and write directly once registered with it. Checked by
    /// [`PhysicalAllocation::with_options`] against
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`.
    #[must_use]
    pub fn with_rdma(self, rdma: bool) -> AllocationOptions {
        AllocationOptions { rdma, ..self }
    }

    /// The kinds of shareable handle the memory can be exported as.
    #[must_use]
    pub fn handle_kinds(&self) -> HandleKinds {
        self.handle_kinds
    }

    /// Whether the memory is asked `GPUDirect` RDMA capable.
    #[must_use]
    pub fn rdma(&self) -> bool {
        self.rdma
    }

    /// The same options, exportable as the handle types of `raw` (`CUmemAllocationHandleType` bits,
    /// from the constants of `sys`).
    pub(crate) fn with_handle_types(self, raw: u32) -> AllocationOptions {
        self.with_handle_kinds(HandleKinds::from_raw(raw))
    }

    /// The driver's property struct, built field by field: never from `Default`/`zeroed` of
    /// `cuda-driver-sys`'s type, whose zeroed handle-type enum is undefined behaviour.
    fn raw(&self) -> sys::CUmemAllocationProp {
        sys::CUmemAllocationProp {
            type_: sys::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: self.handle_kinds.bits(),
            location: self.location.raw(),
            win32HandleMetaData: ptr::null_mut(),
            allocFlags: if self.rdma {
                sys::ALLOC_FLAGS_GPU_DIRECT_RDMA_CAPABLE
            } else {
                0
            },
        }
    }

    /// `cuMemGetAllocationGranularity` for these options.
    ///
    /// # Errors
    /// The driver's error, if any.
    #[doc(alias = "cuMemGetAllocationGranularity")]
    pub fn granularity(&self, kind: Granularity) -> Result<usize> {
        let prop = self.raw();
        let option = match kind {
            Granularity::Minimum => sys::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            Granularity::Recommended => sys::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
        };
        let mut granularity = 0usize;
        // SAFETY: `granularity` is writable and `prop` a fully initialised mirror of
        // `CUmemAllocationProp` (layout asserted in `sys`), both alive for the call.
        check(unsafe {
            sys::cuMemGetAllocationGranularity(&raw mut granularity, &raw const prop, option)
        })?;
        Ok(granularity)
    }

    /// The minimum granularity, asked of the driver once per set of options and then remembered: it is
    /// a fixed property of the device and the options, and `cuMemCreate`'s size check needs it every time.
    ///
    /// A device's plain options (`AllocationOptions::device`, what every page of a buffer made
    /// with no other option uses, and every map of a shared page asks) are read with no lock, one
    /// atomic load, for the first [`KNOWN_DEVICES`] ordinals; other options through a locked list.
    pub(crate) fn minimum_granularity_cached(self) -> Result<usize> {
        static PLAIN: [AtomicUsize; KNOWN_DEVICES] = [const { AtomicUsize::new(0) }; KNOWN_DEVICES];
        static KNOWN: Mutex<Vec<(AllocationOptions, usize)>> = Mutex::new(Vec::new());
        let plain = match self.location {
            Location::Device(device) if self == AllocationOptions::device(device) => {
                usize::try_from(device.as_raw())
                    .ok()
                    .and_then(|ordinal| PLAIN.get(ordinal))
            }
            _ => None,
        };
        // Plain options are never in the locked list: asked once, and remembered in their slot.
        if let Some(plain) = plain {
            // Zero: not asked yet (the driver never reports a zero granularity; were it to, it
            // would be asked again each time).
            let g = plain.load(Ordering::Relaxed);
            if g != 0 {
                return Ok(g);
            }
            let g = self.granularity(Granularity::Minimum)?;
            plain.store(g, Ordering::Relaxed);
            return Ok(g);
        }
        let known = |table: &Vec<(AllocationOptions, usize)>| {
            table.iter().find(|e| e.0 == self).map(|e| e.1)
        };
        if let Some(g) = known(&KNOWN.lock().unwrap_or_else(PoisonError::into_inner)) {
            return Ok(g);
        }
        let g = self.granularity(Granularity::Minimum)?;
        let mut table = KNOWN.lock().unwrap_or_else(PoisonError::into_inner);
        if known(&table).is_none() {
            table.push((self, g));
        }
        Ok(g)
    }
}

/// The device ordinals whose plain options' granularity is remembered without a lock.
const KNOWN_DEVICES: usize = 64;

/// `cuMemGetAllocationGranularity` — the granularity of pinned memory on `device`.
///
/// Sizes of [`PhysicalAllocation`]s and the offsets they are mapped at must be multiples of the
/// [`Granularity::Minimum`] value; do not assume a page size (it is 2 MiB on an H200).
///
/// # Errors
/// The driver's error, if any.
#[doc(alias = "cuMemGetAllocationGranularity")]
pub fn allocation_granularity(device: Device, kind: Granularity) -> Result<usize> {
    AllocationOptions::device(device).granularity(kind)
}

/// Rounds `size` up to the next multiple of `granularity`, with checked arithmetic.
///
/// `align_size(0, g)` is `Ok(0)`. `granularity` need not be a power of two.
///
/// # Errors
/// [`Error::ZeroSize`] for a zero `granularity` (no multiple of zero is at least a non-zero size, and
/// the driver never reports zero); [`Error::Overflow`] where the rounded size would exceed `usize::MAX`.
pub fn align_size(size: usize, granularity: usize) -> Result<usize, Error> {
    if granularity == 0 {
        return Err(Error::ZeroSize {
            what: "granularity",
        });
    }
    size.div_ceil(granularity)
        .checked_mul(granularity)
        .ok_or(Error::Overflow {
            what: "aligned size",
        })
}

/// Checks that `value` is a multiple of `granularity` (zero is one; callers that need a non-zero
/// value check that first).
pub(crate) fn check_multiple(
    what: &'static str,
    value: usize,
    granularity: usize,
) -> Result<(), Error> {
    if granularity == 0 || !value.is_multiple_of(granularity) {
        return Err(Error::NotAligned {
            what,
            value,
            granularity,
        });
    }
    Ok(())
}

/// Physical memory: a `CUmemGenericAllocationHandle` from `cuMemCreate` (or imported from another
/// process: [`ExportedAllocation::import`](crate::ipc::ExportedAllocation::import)), released on drop.
///
/// Physical memory has no address. To use it, map it into a [`VirtualReservation`](crate::VirtualReservation)
/// with [`Region::map`](crate::vmm::Region::map) and grant access with [`Mapping::grant`](crate::Mapping::grant).
/// Every [`Mapping`](crate::Mapping) borrows the allocation it maps, so the allocation cannot be dropped,
/// released or moved while it is mapped. The same allocation may be mapped at several addresses.
pub struct PhysicalAllocation {
    handle: sys::CUmemGenericAllocationHandle,
    size: usize,
    granularity: usize,
    options: AllocationOptions,
}

impl fmt::Debug for PhysicalAllocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PhysicalAllocation")
            .field("handle", &format_args!("{:#x}", self.handle))
            .field("size", &self.size)
            .field("granularity", &self.granularity)
            .field("location", &self.options.location)
            .finish()
    }
}

impl PhysicalAllocation {
    /// `cuMemCreate` — allocate `size` bytes of pinned memory on `device`.
    ///
    /// `size` is checked against the device's minimum granularity before the driver is called: round it
    /// up with [`align_size`] first.
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for a zero size; [`Error::NotAligned`] for one that is not a multiple of the granularity;
    /// [`Error::Driver`] with [`DriverError::OUT_OF_MEMORY`](crate::DriverError::OUT_OF_MEMORY) when the
    /// device has too little free memory, or another driver error.
    #[doc(alias = "cuMemCreate")]
    pub fn new(device: Device, size: usize) -> Result<PhysicalAllocation, Error> {
        PhysicalAllocation::with_options(size, AllocationOptions::device(device))
    }

    /// `cuMemCreate` — allocate `size` bytes as `options` say.
    ///
    /// Each option is checked before the driver is called, against the location and the device
    /// attribute that allows it (the table on [`AllocationOptions`]); options with no handle kind and
    /// no RDMA flag cost no check.
    ///
    /// # Errors
    /// Before `cuMemCreate`: [`Error::NotForLocation`] for an option the location does not take
    /// (a handle kind for [`Location::Host`], a fabric handle or the RDMA flag for host memory);
    /// [`Error::Unsupported`] where the device attribute of a handle kind or of RDMA is 0;
    /// [`Error::NoImexChannel`] for a fabric handle where the machine has no IMEX channel;
    /// [`Error::Refused`] where the fabric probe failed (with `CUDA_ERROR_NOT_PERMITTED` where the
    /// process cannot use the IMEX channel). Otherwise as [`PhysicalAllocation::new`].
    #[doc(alias = "cuMemCreate")]
    pub fn with_options(
        size: usize,
        options: AllocationOptions,
    ) -> Result<PhysicalAllocation, Error> {
        if size == 0 {
            return Err(Error::ZeroSize {
                what: "allocation size",
            });
        }
        options.check_supported()?;
        let granularity = options.minimum_granularity_cached()?;
        check_multiple("allocation size", size, granularity)?;
        let prop = options.raw();
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `handle` is writable and `prop` a fully initialised property mirror, both alive for
        // the call; flags must be 0.
        check(unsafe { sys::cuMemCreate(&raw mut handle, size, &raw const prop, 0) })?;
        Ok(PhysicalAllocation {
            handle,
            size,
            granularity,
            options,
        })
    }

    /// Takes ownership of `handle`, an allocation handle of `size` bytes that `cuMemImportFromShareableHandle`
    /// has just returned (the caller has checked `size` against `granularity`): released on drop, as
    /// one from `cuMemCreate` is.
    pub(crate) fn from_imported(
        handle: sys::CUmemGenericAllocationHandle,
        size: usize,
        granularity: usize,
        options: AllocationOptions,
    ) -> PhysicalAllocation {
        PhysicalAllocation {
            handle,
            size,
            granularity,
            options,
        }
    }

    /// The allocation's size in bytes.
    #[must_use]
    pub fn size(&self) -> usize {
        self.size
    }

    /// The minimum granularity of the memory's location: mapping offsets must be multiples of it.
    #[must_use]
    pub fn granularity(&self) -> usize {
        self.granularity
    }

    /// Where the memory lives.
    #[must_use]
    pub fn location(&self) -> Location {
        self.options.location
    }

    /// The options the memory was created (or imported) with.
    #[must_use]
    pub fn options(&self) -> AllocationOptions {
        self.options
    }

    /// The raw allocation handle, for driver calls this crate does not wrap. It stays valid while `self`
    /// lives; do not release it.
    #[must_use]
    pub fn as_raw(&self) -> sys::CUmemGenericAllocationHandle {
        self.handle
    }

    /// `cuMemRelease` — release the allocation and report the driver's answer, which `drop` ignores.
    ///
    /// # Errors
    /// The driver's error, if any.
    #[doc(alias = "cuMemRelease")]
    pub fn release(self) -> Result<()> {
        Ok(self.release_code()?)
    }

    /// [`release`](PhysicalAllocation::release) with the driver's own code, for the clean-up paths
    /// that report it in an [`Error::CleanupFailed`].
    pub(crate) fn release_code(self) -> DriverResult<()> {
        let this = ManuallyDrop::new(self);
        // SAFETY: the handle came from `cuMemCreate` (or `cuMemImportFromShareableHandle`) and is
        // released once: `drop` will not run.
        check(unsafe { sys::cuMemRelease(this.handle) })
    }
}

impl Drop for PhysicalAllocation {
    fn drop(&mut self) {
        // SAFETY: the handle came from `cuMemCreate` (or `cuMemImportFromShareableHandle`) and is
        // released only here (or in `release`, which skips this).
        let code = unsafe { sys::cuMemRelease(self.handle) };
        // The error is ignored: `drop` cannot return it, and a handle the driver refuses to release
        // cannot be released later either. Call `release` to see it.
        let _ = code;
    }
}

#[cfg(test)]
mod tests {
    use super::{align_size, check_multiple};
    use crate::error::Error;
    use proptest::prelude::*;

    proptest! {
        /// The result is the least multiple of `g` at or above `size`, or a clear error; never a wrap.
        #[test]
        fn align_size_is_the_least_multiple_or_overflow(size in any::<usize>(), g in 1usize..=(1 << 40)) {
            match align_size(size, g) {
                Ok(aligned) => {
                    prop_assert!(aligned >= size);
                    prop_assert_eq!(aligned % g, 0);
                    prop_assert!(aligned - size < g);
                }
                Err(e) => {
                    prop_assert_eq!(e, Error::Overflow { what: "aligned size" });
                    prop_assert!(size.div_ceil(g).checked_mul(g).is_none());
                }
            }
        }

        #[test]
        fn align_size_near_the_top(back in 0usize..4096, g_log in 0u32..63) {
            let g = 1usize << g_log;
            let size = usize::MAX - back;
            let r = align_size(size, g);
            // Only sizes within `g - 1` below a multiple of `g` that fits can round up.
            let fits = (usize::MAX / g).checked_mul(g).is_some_and(|top| top >= size);
            prop_assert_eq!(r.is_ok(), fits);
        }

        #[test]
        fn check_multiple_agrees_with_remainder(value in any::<usize>(), g in any::<usize>()) {
            let ok = g != 0 && value % g == 0;
            prop_assert_eq!(check_multiple("x", value, g).is_ok(), ok);
        }
    }

    #[test]
    fn align_size_edges() {
        assert_eq!(align_size(0, 2 << 20), Ok(0));
        assert_eq!(align_size(1, 3), Ok(3));
        assert_eq!(align_size(7, 3), Ok(9));
        assert_eq!(align_size(usize::MAX, 1), Ok(usize::MAX));
        assert_eq!(
            align_size(usize::MAX, 2),
            Err(Error::Overflow {
                what: "aligned size"
            })
        );
        assert_eq!(
            align_size(5, 0),
            Err(Error::ZeroSize {
                what: "granularity"
            })
        );
        assert!(check_multiple("x", 0, 0).is_err());
    }
}
