//! [`OwnedHostMapping`]: host memory mapped once into a reservation of its own, owning both, with its
//! device grant and its CPU grant kept, so that it lives in a struct field and moves between threads.

use crate::vmm::access::{retain_distinct, with_contexts};
use core::fmt;
use core::marker::PhantomData;

use bytemuck::Pod;

use super::{HostAccess, HostAllocation, set_cpu_access};
use crate::device::{Context, Device};
use crate::error::{DriverError, Error, Result, check, first_error};
use crate::sys;
use crate::view::{DeviceSlice, DeviceSliceMut, Reach};
use crate::vmm::access::{AccessMode, ReadWrite, elements, revoke, set_access};
use crate::vmm::mapped::{Backing, MappedRange};
use crate::vmm::physical::Location;
use crate::vmm::reservation::VirtualReservation;

/// A [`HostAllocation`] mapped once into an address range of its own, owning both, with its grants
/// kept: the devices of its access set in mode `M`, and the CPU read-write. The owned counterpart of
/// [`HostMapping`](super::HostMapping): no lifetime, so it lives in a struct field, is returned from a
/// constructor and moves to another thread (`Send`, `Sync`).
///
/// It keeps every rule of the borrowed host mapping, with borrows of itself:
/// - **No CPU slice while a device view exists.** Device views ([`slice`](OwnedHostMapping::slice),
///   [`slice_mut`](OwnedHostMapping::slice_mut)) borrow the mapping; the CPU's
///   [`host_access`](OwnedHostMapping::host_access), the only source of CPU slices, borrows it
///   mutably. So the CPU's `&[T]` and `&mut [T]` never coexist with a device view of the bytes, and
///   a writable device view is exclusive too. The device keeps the permission its grant gave it; only
///   `unsafe` code holding a raw address could use it while a CPU slice lives.
/// - **No alias.** The mapping owns its allocation and lends it to no one: no other mapping of the
///   same bytes can be made.
/// - **No view outlives it.** Views and CPU slices borrow it, so it is not freed or dropped under
///   them.
///
/// The grants are made once, when it is made: no view or CPU access needs a new `cuMemSetAccess`.
/// Dropping it unmaps the range, releases the memory and frees the range, in that order, then releases
/// the devices' contexts; [`free`](OwnedHostMapping::free) reports the driver's answer.
///
/// # Examples
/// ```no_run
/// use cuda_vmm::host::{HostAllocation, OwnedHostMapping};
/// use cuda_vmm::{Device, ReadOnly};
///
/// struct Staging {
///     host: OwnedHostMapping<ReadOnly>, // the mapping and its grants, in a field
/// }
///
/// fn staging(device: Device) -> cuda_vmm::Result<Staging> {
///     let memory = HostAllocation::near(device, 2 << 20)?;
///     Ok(Staging { host: OwnedHostMapping::new(memory, &[device], ReadOnly)? })
/// }
///
/// # fn main() -> cuda_vmm::Result<()> {
/// let mut staging = staging(Device::get(0)?)?;
/// staging.host.host_access().as_mut_slice::<u32>()?.fill(7); // the CPU writes a &mut [u32]
/// let on_device = staging.host.slice::<u32>()?.to_vec()?; // the device reads: no new grant
/// assert!(on_device.iter().all(|&x| x == 7));
/// # Ok(())
/// # }
/// ```
///
/// A CPU slice while a device view of the same mapping lives does not compile:
/// ```compile_fail,E0502
/// # use cuda_vmm::host::{HostAllocation, OwnedHostMapping};
/// # use cuda_vmm::{Device, ReadWrite};
/// # fn main() -> cuda_vmm::Result<()> {
/// # let device = Device::get(0)?;
/// let mut host = OwnedHostMapping::new(HostAllocation::near(device, 2 << 20)?, &[device], ReadWrite)?;
/// let view = host.slice::<u32>()?;
/// let mut cpu = host.host_access(); // a device view of the mapping lives
/// cpu.as_mut_slice::<u32>()?.fill(1);
/// view.to_vec()?;
/// # Ok(())
/// # }
/// ```
pub struct OwnedHostMapping<M: AccessMode = ReadWrite> {
    /// Unmapped first when dropped; then its backing's fields are dropped: the memory released, the
    /// range freed.
    range: MappedRange<OwnedHost>,
    location: Location,
    /// The devices granted in mode `M`, one retained context each, never empty; the first is the one
    /// views copy through. Declared after `range`: released after the range is unmapped and freed.
    access: Vec<Context>,
    /// The mode of the kept device grant, at the type level only. `M` is a zero-sized, `Copy`, `Send`,
    /// `Sync`, `'static` marker ([`AccessMode`]), so this changes neither variance nor auto traits.
    _mode: PhantomData<M>,
}

/// What an [`OwnedHostMapping`]'s range holds: dropped after the range is unmapped.
struct OwnedHost {
    /// Declared before `reservation`: released (dropped) before the range is freed.
    memory: HostAllocation,
    reservation: VirtualReservation,
}

impl Backing for OwnedHost {
    fn size(&self) -> usize {
        self.memory.size()
    }
}

impl<M: AccessMode> fmt::Debug for OwnedHostMapping<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedHostMapping")
            .field("ptr", &format_args!("{:#x}", self.range.ptr()))
            .field("size", &self.size())
            .field("location", &self.location)
            .field("devices", &self.devices())
            .field("mode", &M::NAME)
            .finish_non_exhaustive()
    }
}

impl<M: AccessMode> OwnedHostMapping<M> {
    /// `cuMemAddressReserve`, `cuMemMap`, `cuMemSetAccess` — reserve an address range of
    /// `memory`'s size, map the whole of `memory` there, grant the CPU read-write access and every
    /// device of `devices` access in `mode` (one call for the devices), and keep both grants.
    ///
    /// The devices' primary contexts are retained for as long as the mapping lives; device views
    /// copy through the first. A device named twice counts once.
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for an empty device list (before any driver call); the driver's error
    /// where a context cannot be retained, or the reservation, the mapping or a grant is refused
    /// (after a refused device grant every device is set back to no access first;
    /// [`Error::CleanupFailed`] where that fails too). On every error nothing is left mapped or
    /// reserved, and `memory` is released (it is dropped): allocate again to retry.
    #[doc(alias = "cuMemMap")]
    #[doc(alias = "cuMemSetAccess")]
    #[doc(alias = "cuMemAddressReserve")]
    pub fn new(
        memory: HostAllocation,
        devices: &[Device],
        mode: M,
    ) -> Result<OwnedHostMapping<M>, Error> {
        let _ = mode;
        let access = retain_distinct(devices)?;
        let size = memory.size();
        let reservation = VirtualReservation::new(size, 0)?;
        let ptr = reservation.base();
        // SAFETY: `[ptr, ptr + size)` is the whole of a range just reserved, of the memory's size (a
        // multiple of its granularity: `cuMemCreate` was given that size), which nothing else
        // maps. `memory` is a live allocation handle of `size` bytes; offset 0 and flags 0, as the
        // driver requires.
        check(unsafe { sys::cuMemMap(ptr, size, 0, memory.as_raw(), 0) })?;
        let location = memory.location();
        // From here on every error drops `range`: unmapped, released, freed.
        let range = MappedRange::from_mapped(
            ptr,
            OwnedHost {
                memory,
                reservation,
            },
        );
        // `[ptr, ptr + size)` is the whole range, mapped while `range` lives.
        set_cpu_access(ptr, size, location, ReadWrite::FLAGS)?;
        let granted = with_contexts(&access, |contexts| {
            set_access(ptr, size, contexts, M::FLAGS)
        });
        if let Err(error) = granted {
            // Part of the set may have been granted: every device is set back to no access.
            let cleanup = with_contexts(&access, |contexts| revoke(ptr, size, contexts));
            return Err(match cleanup {
                Ok(()) => Error::Driver(error),
                Err(cleanup) => Error::CleanupFailed {
                    error,
                    cleanup,
                    what: "grant",
                },
            });
        }
        Ok(OwnedHostMapping {
            range,
            location,
            access,
            _mode: PhantomData,
        })
    }

    /// The mapped size in bytes: the size of the memory.
    #[must_use]
    pub fn size(&self) -> usize {
        self.range.size()
    }

    /// Where the memory lives ([`Location::Host`] or [`Location::HostNuma`]).
    #[must_use]
    pub fn location(&self) -> Location {
        self.location
    }

    /// The devices granted, the first being the one views copy through.
    #[must_use]
    pub fn devices(&self) -> Vec<Device> {
        self.access.iter().map(Context::device).collect()
    }

    /// A read-only device view of the whole mapping as `T`s, copied through the first device's
    /// context; no driver call. It borrows the mapping, so no CPU slice of it exists meanwhile.
    ///
    /// # Errors
    /// [`Error::NotWholeElements`] where the mapping is not a whole number of `T`s, or `T` is
    /// zero-sized.
    pub fn slice<T: Pod>(&self) -> Result<DeviceSlice<'_, T>, Error> {
        let (ptr, len, context) = self.parts::<T>()?;
        // The whole mapping is granted to every device of `access` (by `new`), and stays mapped and
        // granted while `self` is borrowed: freeing and dropping need `self`.
        Ok(DeviceSlice::from_granted(
            ptr,
            len,
            context,
            Reach::Owned(&self.access),
        ))
    }

    /// The CPU's access to the whole mapping, read-write, granted when the mapping was made: no
    /// driver call. It borrows the mapping mutably, so no device view of it exists while it (or a
    /// slice of it) lives; see [`HostAccess`] for why its slices are sound.
    #[must_use]
    pub fn host_access(&mut self) -> HostAccess<'_, ReadWrite> {
        // The CPU was granted read-write access to the whole range by `new`, kept until it is
        // unmapped; the result borrows `self` mutably, so the range stays mapped, no device view of
        // it exists, and the allocation (owned by `self`, lent to no one) has no other mapping.
        HostAccess::new(self.range.ptr(), self.range.size())
    }

    /// `cuMemUnmap`, `cuMemRelease`, `cuMemAddressFree` — unmap, release the memory, free the range
    /// and release the contexts, reporting the driver's first error, which `drop` ignores. Every step
    /// is made even after an error.
    ///
    /// # Errors
    /// The driver's first error. Where the unmap is refused the range stays mapped and reserved (the
    /// free is refused too): a leak until the process ends. No driver failure of a whole-mapping unmap
    /// is known.
    #[doc(alias = "cuMemUnmap")]
    #[doc(alias = "cuMemRelease")]
    #[doc(alias = "cuMemAddressFree")]
    pub fn free(self) -> Result<()> {
        let OwnedHostMapping { range, access, .. } = self;
        let (owned, unmapped) = range.unmap();
        let OwnedHost {
            memory,
            reservation,
        } = owned;
        let released = memory.memory.release_code();
        let freed = reservation.free_code();
        drop(access);
        Ok(first_error::<DriverError>([unmapped, released, freed])?)
    }

    fn parts<T>(&self) -> Result<(sys::CUdeviceptr, usize, &Context), Error> {
        let len = elements::<T>(self.size())?;
        let context = self
            .access
            .first()
            .ok_or(Error::ZeroSize { what: "access set" })?;
        Ok((self.range.ptr(), len, context))
    }
}

impl OwnedHostMapping<ReadWrite> {
    /// A writable device view of the whole mapping as `T`s, copied through the first device's
    /// context; no driver call. Only a [`ReadWrite`] grant has one; it borrows the mapping
    /// exclusively, so no CPU slice and no other device view of it exists meanwhile.
    ///
    /// # Errors
    /// As [`slice`](OwnedHostMapping::slice).
    pub fn slice_mut<T: Pod>(&mut self) -> Result<DeviceSliceMut<'_, T>, Error> {
        let (ptr, len, context) = self.parts::<T>()?;
        // As for `slice`; the grant is read-write, and the view is exclusive while `self` is
        // borrowed mutably.
        Ok(DeviceSliceMut::from_granted(
            ptr,
            len,
            context,
            Reach::Owned(&self.access),
        ))
    }
}
