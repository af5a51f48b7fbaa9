//! [`SharedReservation`] and [`OwnedMapping`]: mappings that own their memory (or share a
//! [`SharedPage`]) and share their reservation, with the mapped ranges kept at run time so that two
//! never overlap.

use core::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::device::Context;
use crate::error::{Error, check};
use crate::sys;
use crate::vmm::access::{Access, AccessMode, RevocableAccess};
use crate::vmm::mapped::{Backing, MappedRange};
use crate::vmm::physical::PhysicalAllocation;
use crate::vmm::reservation::VirtualReservation;

use super::pages::{Span, check_new_range, insertion_point};
use super::shared::{SharedPage, Unmapped};

/// A reserved address range shared by the [`OwnedMapping`]s made in it: `cuMemAddressReserve` once,
/// `cuMemAddressFree` when the last handle and the last mapping are gone.
///
/// Cloning the handle shares the range (an [`Arc`]); every mapping holds a share too, so the range
/// outlives its mappings without a borrow, and a mapping can live in a `Vec` or a struct field. The
/// reservation records which byte ranges are mapped, and [`map`](SharedReservation::map) refuses a
/// range that overlaps one (checked at run time, where the borrowed layer's regions prove it at
/// compile time).
#[derive(Clone)]
pub struct SharedReservation {
    shared: Arc<Shared>,
}

/// What the handles and mappings share.
struct Shared {
    /// Freed when the last share is dropped; no mapping is alive then (each holds a share), unless one
    /// was leaked with `mem::forget`, which leaks its share too, so this is never dropped.
    reservation: VirtualReservation,
    /// The mapped ranges, `[start, end)` from the base: sorted, disjoint. A range is recorded before
    /// `cuMemMap` and removed after a successful `cuMemUnmap`.
    mapped: Mutex<Vec<Mapped>>,
}

/// One recorded range.
#[derive(Clone, Copy)]
struct Mapped {
    start: usize,
    end: usize,
}

impl Span for Mapped {
    fn start(&self) -> usize {
        self.start
    }
    fn end(&self) -> usize {
        self.end
    }
    fn granted(&self) -> bool {
        true
    }
}

impl fmt::Debug for SharedReservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedReservation")
            .field("base", &format_args!("{:#x}", self.base()))
            .field("size", &self.size())
            .field("mappings", &self.lock().len())
            .finish()
    }
}

impl SharedReservation {
    /// `cuMemAddressReserve` — reserve `size` bytes of address space, as
    /// [`VirtualReservation::new`].
    ///
    /// # Errors
    /// As [`VirtualReservation::new`].
    #[doc(alias = "cuMemAddressReserve")]
    pub fn new(size: usize, alignment: usize) -> Result<SharedReservation, Error> {
        Ok(SharedReservation {
            shared: Arc::new(Shared {
                reservation: VirtualReservation::new(size, alignment)?,
                mapped: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The first address of the range.
    #[must_use]
    pub fn base(&self) -> u64 {
        self.shared.reservation.base()
    }

    /// The size of the range in bytes.
    #[must_use]
    pub fn size(&self) -> usize {
        self.shared.reservation.size()
    }

    /// The mapped byte ranges, from the base, in address order: a snapshot (other handles may map and
    /// unmap meanwhile).
    #[must_use]
    pub fn mapped(&self) -> Vec<core::ops::Range<usize>> {
        self.lock().iter().map(|m| m.start..m.end).collect()
    }

    /// The bookkeeping, also after a panic elsewhere while it was held (none of its critical sections
    /// can panic, so it is never left half updated).
    fn lock(&self) -> MutexGuard<'_, Vec<Mapped>> {
        self.shared
            .mapped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// `cuMemMap` — map the whole of `memory` at byte `offset` of the range. The mapping owns the
    /// memory and a share of the range; it is not accessible until [granted](OwnedMapping::grant).
    ///
    /// `offset` must be a multiple of the memory's granularity, and `[offset, offset + size)` must lie
    /// inside the range and overlap no live mapping of it. Safe to call from several threads with
    /// clones of one handle: the range is recorded before the driver is called, so two calls can never
    /// both map it.
    ///
    /// # Errors
    /// Before any driver call: [`Error::NotAligned`], [`Error::Overflow`], [`Error::OutOfBounds`]
    /// (past the end of the range), [`Error::PageRange`] (over a live mapping, which the error
    /// names). Then the driver's error. On any error nothing is mapped, and `memory` is released (it
    /// is dropped); allocate again to retry.
    #[doc(alias = "cuMemMap")]
    pub fn map(&self, offset: usize, memory: PhysicalAllocation) -> Result<OwnedMapping, Error> {
        self.map_memory(offset, Memory::Own(memory))
    }

    /// `cuMemMap` — map the whole of `page` at byte `offset` of the range, once more: the same
    /// physical memory at another address. The mapping holds a share of the page (it keeps the
    /// memory from being released) and a share of the range; it is not accessible until
    /// [granted](OwnedMapping::grant), and its grant is its own: one mapping of a page can be
    /// granted read-only and another read-write, here or in another reservation.
    ///
    /// The range rules are [`map`](SharedReservation::map)'s: the page mapped twice into one
    /// reservation must lie at two offsets whose ranges do not overlap.
    ///
    /// # Errors
    /// As [`map`](SharedReservation::map): before any driver call, [`Error::NotAligned`],
    /// [`Error::Overflow`], [`Error::OutOfBounds`], [`Error::PageRange`] (over a live mapping, of
    /// this page or another, which the error names); then the driver's error. On any error nothing
    /// is mapped and no share is kept: the page is released only if no other handle or mapping
    /// shares it.
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::owned::{SharedPage, SharedReservation};
    /// use cuda_vmm::{Device, Error, ReadOnly, ReadWrite};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let page = 2 << 20;
    /// let prefix = SharedPage::new(device, page)?;
    /// let reservation = SharedReservation::new(4 * page, 0)?;
    /// let mut writer = reservation.map_shared(0, &prefix)?.keep_grant(&[device], ReadWrite)?;
    /// let reader = reservation.map_shared(page, &prefix)?.keep_grant(&[device], ReadOnly)?;
    /// writer.slice_mut::<u32>()?.copy_from_host(&vec![9; page / 4])?;
    /// assert_eq!(reader.slice::<u32>()?.to_vec()?, vec![9; page / 4]);
    /// assert!(matches!(
    ///     reservation.map_shared(page, &prefix), // over `reader`: refused, nothing mapped
    ///     Err(Error::PageRange { .. })
    /// ));
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuMemMap")]
    pub fn map_shared(&self, offset: usize, page: &SharedPage) -> Result<OwnedMapping, Error> {
        self.map_memory(offset, Memory::Shared(page.clone()))
    }

    /// The one `cuMemMap` of an owned mapping: checks, records, maps; on any error `memory` is
    /// dropped (released, or its share given up).
    fn map_memory(&self, offset: usize, memory: Memory) -> Result<OwnedMapping, Error> {
        let allocation = memory.allocation();
        let size = allocation.size();
        let range = (self.base(), self.size(), "reservation");
        let end = check_new_range(range, offset, size, allocation.granularity())?;
        {
            let mut mapped = self.lock();
            let index = insertion_point(&mapped, offset, end)?;
            mapped.insert(index, Mapped { start: offset, end });
        }
        let ptr = self.base().wrapping_add(offset as u64);
        // SAFETY: `[ptr, ptr + size)` lies inside this reservation (checked) and was just recorded
        // as mapped, so no other mapping of it overlaps (every `OwnedMapping` recorded its range, and
        // only a successful unmap removes one); both ends are multiples of the memory's granularity
        // (checked). `allocation` is a live allocation handle of `size` bytes (owned by `memory`, or
        // shared by it, which keeps it from being released); offset 0 and flags 0 as the driver
        // requires. Mapping one handle at several addresses is what the driver allows.
        if let Err(error) = check(unsafe { sys::cuMemMap(ptr, size, 0, allocation.as_raw(), 0) }) {
            self.forget_range(offset);
            return Err(error.into());
        }
        Ok(OwnedMapping {
            range: MappedRange::from_mapped(
                ptr,
                Owned {
                    offset,
                    memory,
                    reservation: self.clone(),
                },
            ),
        })
    }

    /// Whether `self` and `other` are handles of one range.
    pub(super) fn same_as(&self, other: &SharedReservation) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Removes the recorded range that starts at `offset`.
    fn forget_range(&self, offset: usize) {
        let mut mapped = self.lock();
        mapped.retain(|m| m.start != offset);
    }

    /// `cuMemAddressFree` — drop this handle, and free the range if it was the last share of it:
    /// `Ok(true)` where it was freed, `Ok(false)` where other handles or mappings still hold it (it is
    /// freed when the last of them is dropped). `drop` ignores the driver's answer; this reports it.
    ///
    /// # Errors
    /// The driver's error, if any.
    #[doc(alias = "cuMemAddressFree")]
    pub fn free(self) -> Result<bool, Error> {
        match Arc::try_unwrap(self.shared) {
            Ok(shared) => {
                shared.reservation.free()?;
                Ok(true)
            }
            Err(_) => Ok(false),
        }
    }
}

/// A whole physical allocation mapped into a [`SharedReservation`], owning both its memory (or a
/// share of a [`SharedPage`], from [`map_shared`](SharedReservation::map_shared)) and a share of the
/// reservation: no lifetime, so it lives in a `Vec` or a struct field. Unmapped on drop, then its
/// memory is released (or its share of the page dropped: the last share releases it), then its
/// share of the reservation is dropped (the last share frees the range).
///
/// It keeps every rule of the borrowed [`Mapping`](crate::Mapping): no address or view before
/// [`grant`](OwnedMapping::grant), whose [`Access`] borrows the mapping mutably (one grant in use at a
/// time, no unmap while views live), and [`unmap`](OwnedMapping::unmap) consumes it (no double
/// unmap). The reservation's bookkeeping keeps its range from overlapping any other live mapping.
///
/// # Examples
/// ```no_run
/// use cuda_vmm::{Context, Device, owned::OwnedMapping, PhysicalAllocation, ReadWrite, owned::SharedReservation};
///
/// # fn main() -> Result<(), cuda_vmm::Error> {
/// let device = Device::get(0)?;
/// let context = Context::new(device)?;
/// let page = cuda_vmm::allocation_granularity(device, cuda_vmm::Granularity::Minimum)?;
/// let reservation = SharedReservation::new(8 * page, 0)?;
/// let mut mappings: Vec<OwnedMapping> = Vec::new();
/// for i in 0..4 {
///     mappings.push(reservation.map(i * page, PhysicalAllocation::new(device, page)?)?);
/// }
/// drop(reservation); // the mappings keep the range reserved
/// let mut access = mappings[2].grant(&context, ReadWrite)?;
/// access.slice_mut::<u8>()?.copy_from_host(&vec![1; page])?;
/// # Ok(())
/// # }
/// ```
///
/// No lifetime, but its views borrow it, so it cannot be unmapped under them:
/// ```compile_fail,E0505
/// # use cuda_vmm::{Context, Device, PhysicalAllocation, ReadWrite, owned::SharedReservation};
/// # fn main() -> Result<(), cuda_vmm::Error> {
/// # let device = Device::get(0)?;
/// # let context = Context::new(device)?;
/// # let page = 2 << 20;
/// let reservation = SharedReservation::new(page, 0)?;
/// let mut mapping = reservation.map(0, PhysicalAllocation::new(device, page)?)?;
/// let access = mapping.grant(&context, ReadWrite)?;
/// let view = access.slice::<u8>()?;
/// mapping.unmap()?; // cuMemUnmap under a live view
/// view.to_vec()?;
/// # Ok(())
/// # }
/// ```
pub struct OwnedMapping {
    range: MappedRange<Owned>,
}

/// What an [`OwnedMapping`]'s range holds: dropped after the range is unmapped.
struct Owned {
    offset: usize,
    /// Declared before `reservation`: released (dropped) before the share of the range is.
    memory: Memory,
    reservation: SharedReservation,
}

/// The memory of an owned mapping: its own, or a share of a [`SharedPage`].
enum Memory {
    /// Released when the mapping is dropped (after its unmap).
    Own(PhysicalAllocation),
    /// This share is dropped when the mapping is dropped (after its unmap); the memory is released
    /// with the last share.
    Shared(SharedPage),
}

impl Memory {
    fn allocation(&self) -> &PhysicalAllocation {
        match self {
            Memory::Own(memory) => memory,
            Memory::Shared(page) => page.allocation(),
        }
    }
}

impl Backing for Owned {
    fn size(&self) -> usize {
        self.memory.allocation().size()
    }

    /// The range leaves the reservation's record.
    fn unmapped(&self) {
        self.reservation.forget_range(self.offset);
    }
}

impl fmt::Debug for OwnedMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedMapping")
            .field("ptr", &format_args!("{:#x}", self.range.ptr()))
            .field("offset", &self.offset())
            .field("size", &self.size())
            .field("location", &self.memory().location())
            .field("shared", &self.shared_page().is_some())
            .field("reservation", self.reservation())
            .finish()
    }
}

impl OwnedMapping {
    /// The mapped size in bytes: the size of the memory.
    #[must_use]
    pub fn size(&self) -> usize {
        self.range.size()
    }

    /// Where the mapping starts, in bytes from the reservation's base.
    #[must_use]
    pub fn offset(&self) -> usize {
        self.range.backing().offset
    }

    /// The memory the mapping maps: its own, or the allocation of the [`SharedPage`] it shares.
    #[must_use]
    pub fn memory(&self) -> &PhysicalAllocation {
        self.range.backing().memory.allocation()
    }

    /// The page the mapping shares, where it was made by
    /// [`map_shared`](SharedReservation::map_shared); `None` for a mapping that owns its memory.
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::owned::{SharedPage, SharedReservation};
    /// use cuda_vmm::{Device, PhysicalAllocation};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let page = SharedPage::new(device, 2 << 20)?;
    /// let reservation = SharedReservation::new(4 << 20, 0)?;
    /// let shared = reservation.map_shared(0, &page)?;
    /// let own = reservation.map(2 << 20, PhysicalAllocation::new(device, 2 << 20)?)?;
    /// assert_eq!(shared.shared_page().map(SharedPage::share_count), Some(2));
    /// assert!(own.shared_page().is_none());
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn shared_page(&self) -> Option<&SharedPage> {
        match &self.range.backing().memory {
            Memory::Own(_) => None,
            Memory::Shared(page) => Some(page),
        }
    }

    /// The first mapped address, for the grant a [`GrantedMapping`](super::GrantedMapping) keeps.
    pub(super) fn ptr(&self) -> u64 {
        self.range.ptr()
    }

    /// A handle to the reservation the mapping lies in.
    #[must_use]
    pub fn reservation(&self) -> &SharedReservation {
        &self.range.backing().reservation
    }

    /// `cuMemSetAccess` — grant the device of `context` access to the whole mapping, in `mode`; as
    /// [`Mapping::grant`](crate::Mapping::grant).
    ///
    /// # Errors
    /// As [`Mapping::grant`](crate::Mapping::grant).
    #[doc(alias = "cuMemSetAccess")]
    pub fn grant<'map, M: AccessMode>(
        &'map mut self,
        context: &'map Context,
        mode: M,
    ) -> Result<Access<'map, M>, Error> {
        self.range.grant(context, mode)
    }

    /// `cuMemSetAccess` — grant every device of `contexts` access to the whole mapping, in `mode`, in
    /// one driver call; as [`Mapping::grant_all`](crate::Mapping::grant_all).
    ///
    /// # Errors
    /// As [`Mapping::grant_all`](crate::Mapping::grant_all).
    #[doc(alias = "cuMemSetAccess")]
    pub fn grant_all<'map, M: AccessMode>(
        &'map mut self,
        contexts: &'map [&'map Context],
        mode: M,
    ) -> Result<Access<'map, M>, Error> {
        self.range.grant_all(contexts, mode)
    }

    /// `cuMemSetAccess` — grant every device of `contexts` access until the returned grant ends; as
    /// [`Mapping::grant_revocable`](crate::Mapping::grant_revocable): when the [`RevocableAccess`]
    /// ends, each granted context is synchronised, then every granted device is set back to no
    /// access.
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::{Context, Device, PhysicalAllocation, ReadWrite, owned::SharedReservation};
    ///
    /// # fn main() -> Result<(), cuda_vmm::Error> {
    /// let device = Device::get(0)?;
    /// let context = Context::new(device)?;
    /// let page = cuda_vmm::allocation_granularity(device, cuda_vmm::Granularity::Minimum)?;
    /// let reservation = SharedReservation::new(page, 0)?;
    /// let mut mapping = reservation.map(0, PhysicalAllocation::new(device, page)?)?;
    /// let contexts = [&context];
    /// let mut grant = mapping.grant_revocable(&contexts, ReadWrite)?;
    /// grant.slice_mut::<u8>()?.copy_from_host(&vec![1; page])?;
    /// grant.revoke()?; // the device has no access again; the mapping can be granted anew
    /// let access = mapping.grant(&context, ReadWrite)?;
    /// assert_eq!(access.slice::<u8>()?.to_vec()?, vec![1; page]);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`Mapping::grant_revocable`](crate::Mapping::grant_revocable).
    #[doc(alias = "cuMemSetAccess")]
    pub fn grant_revocable<'map, M: AccessMode>(
        &'map mut self,
        contexts: &'map [&'map Context],
        mode: M,
    ) -> Result<RevocableAccess<'map, M>, Error> {
        self.range.grant_revocable(contexts, mode)
    }

    /// `cuMemUnmap` — unmap, report the driver's answer (which `drop` ignores), and give the memory
    /// back, so that it can be mapped again: [`Unmapped::Owned`] with the allocation of a mapping
    /// made by [`map`](SharedReservation::map), [`Unmapped::Shared`] with the share of a mapping
    /// made by [`map_shared`](SharedReservation::map_shared) (the page's other mappings stay). The
    /// range becomes free for other mappings.
    ///
    /// # Errors
    /// The driver's error. The range then stays mapped and recorded (no other mapping can take it),
    /// the memory (or the share) is dropped: the driver keeps the memory until the range is
    /// unmapped, a leak until the process ends. No driver failure of a whole-mapping unmap is known.
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::owned::{SharedPage, SharedReservation, Unmapped};
    /// use cuda_vmm::Device;
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let page = SharedPage::new(Device::get(0)?, 2 << 20)?;
    /// let reservation = SharedReservation::new(2 << 20, 0)?;
    /// let mapping = reservation.map_shared(0, &page)?;
    /// let Unmapped::Shared(share) = mapping.unmap()? else { unreachable!() };
    /// assert_eq!(page.share_count(), 2); // `page` and `share`
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuMemUnmap")]
    pub fn unmap(self) -> Result<Unmapped, Error> {
        let (owned, unmapped) = self.range.unmap();
        drop(owned.reservation);
        unmapped?;
        Ok(match owned.memory {
            Memory::Own(memory) => Unmapped::Owned(memory),
            Memory::Shared(page) => Unmapped::Shared(page),
        })
    }
}
