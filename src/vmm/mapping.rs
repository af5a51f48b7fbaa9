//! Mappings of physical memory into reserved address ranges: `cuMemMap` / `cuMemUnmap`.

use core::fmt;

use crate::device::Context;
use crate::error::{DriverError, DriverResult, Error, Result, check};
use crate::sys;
use crate::vmm::access::{Access, AccessMode, RevocableAccess};
use crate::vmm::mapped::{Borrowed, MappedRange};
use crate::vmm::physical::{PhysicalAllocation, check_multiple};
use crate::vmm::reservation::{Region, VirtualReservation};

/// One or more whole physical allocations mapped back to back into a [`Region`] of a
/// [`VirtualReservation`], unmapped on drop.
///
/// A mapping is not usable on its own: the driver faults on any access until `cuMemSetAccess` grants a
/// device. Hence a `Mapping` hands out neither its address nor any view (its `Debug` text shows the
/// range, for diagnostics); [`Mapping::grant`] returns an [`Access`], and only an `Access` hands out
/// views and the raw address. The numbers themselves are no secret: the reservation's
/// [`base`](VirtualReservation::base) says where the range lies. An address is an inert integer that
/// only `unsafe` code can use; the safe way in is a view, and a view needs a grant.
///
/// # Lifetimes
/// - `'va`: the mutable borrow of the reservation (through the [`Region`] the mapping was made in). The
///   reservation cannot be freed, dropped or moved while the mapping lives.
/// - `'mem`: the shared borrow of the physical allocation(s). They cannot be released, dropped or moved
///   while the mapping lives; they can be mapped again elsewhere (aliases).
///
/// # Zero cost
/// A `Mapping` is exactly the address and size the driver calls need (16 bytes on 64-bit targets); the
/// borrows are compile-time only.
pub struct Mapping<'va, 'mem> {
    range: MappedRange<Borrows<'va, 'mem>>,
}

/// What a [`Mapping`] borrows, at the type level only: the reservation's range (covariant in `'va`;
/// `Send`/`Sync` because `VirtualReservation` is both) and the mapped memory (covariant in `'mem`;
/// `Send`/`Sync` because `PhysicalAllocation` is both).
type Borrows<'va, 'mem> = Borrowed<(&'va VirtualReservation, &'mem PhysicalAllocation)>;

impl fmt::Debug for Mapping<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mapping")
            .field("ptr", &format_args!("{:#x}", self.range.ptr()))
            .field("size", &self.range.size())
            .finish()
    }
}

impl<'va, 'mem> Mapping<'va, 'mem> {
    /// Wraps a range that [`Region::map_all`] has just mapped.
    pub(crate) fn from_mapped(ptr: sys::CUdeviceptr, size: usize) -> Mapping<'va, 'mem> {
        Mapping {
            range: MappedRange::borrowed(ptr, size),
        }
    }

    /// The mapped range, for the types that wrap a mapping.
    pub(crate) fn range(&self) -> &MappedRange<Borrows<'va, 'mem>> {
        &self.range
    }

    /// The mapped size in bytes: the sum of the mapped allocations' sizes.
    #[must_use]
    pub fn size(&self) -> usize {
        self.range.size()
    }

    /// `cuMemSetAccess` — grant the device of `context` access to the whole mapping, in `mode`
    /// ([`ReadWrite`](crate::ReadWrite) or [`ReadOnly`](crate::ReadOnly)).
    ///
    /// The returned [`Access`] borrows the mapping mutably, so only one grant is in use at a time and a
    /// read-only grant cannot be widened behind its views' back. Copies made through its views run in
    /// `context`. Dropping the `Access` ends the borrow; the driver keeps the permission until the
    /// mapping is unmapped or its device's access is set again: by a later grant, by a refused later
    /// grant (which sets its devices back to no access), or by the end of a
    /// [`grant_revocable`](Mapping::grant_revocable) that names the device.
    ///
    /// # Errors
    /// The driver's error ([`Error::Driver`]). Then no `Access` exists, so nothing can use the mapping,
    /// and every listed device is set back to no access, so nothing is left half granted. Where setting
    /// a device back is refused too, the error is [`Error::CleanupFailed`] (`what`: `"grant"`): that
    /// device may keep whatever access the refused call gave it, until a later grant sets its access
    /// or the mapping is unmapped; still no `Access` exists, so safe code cannot use that access.
    /// Where access cannot be set up, unmap the mapping and take another path (for a copy between
    /// devices: [`Route::Staged`](crate::peer::Route::Staged)).
    #[doc(alias = "cuMemSetAccess")]
    pub fn grant<'map, M: AccessMode>(
        &'map mut self,
        context: &'map Context,
        mode: M,
    ) -> Result<Access<'map, M>, Error> {
        self.range.grant(context, mode)
    }

    /// `cuMemSetAccess` — grant every device of `contexts` access to the whole mapping, in `mode`, in one
    /// driver call. Views use the first context for copies; [`Access::slice_on`] picks another.
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for an empty list; otherwise as for [`Mapping::grant`] ([`Error::Driver`],
    /// or [`Error::CleanupFailed`] where a device could not be set back to no access).
    #[doc(alias = "cuMemSetAccess")]
    pub fn grant_all<'map, M: AccessMode>(
        &'map mut self,
        contexts: &'map [&'map Context],
        mode: M,
    ) -> Result<Access<'map, M>, Error> {
        self.range.grant_all(contexts, mode)
    }

    /// `cuMemSetAccess` — as [`grant_all`](Mapping::grant_all), revoked again when the returned
    /// [`RevocableAccess`] ends: each granted context is synchronised, then every granted device is
    /// set back to no access (`CU_MEM_ACCESS_FLAGS_PROT_NONE`).
    ///
    /// This is how a peer device is opened to a VMM mapping for a while: context peer access
    /// ([`PeerAccess`](crate::PeerAccess)) does not open VMM mappings; grants do.
    ///
    /// # Errors
    /// As [`grant_all`](Mapping::grant_all).
    #[doc(alias = "cuMemSetAccess")]
    pub fn grant_revocable<'map, M: AccessMode>(
        &'map mut self,
        contexts: &'map [&'map Context],
        mode: M,
    ) -> Result<RevocableAccess<'map, M>, Error> {
        self.range.grant_revocable(contexts, mode)
    }

    /// `cuMemUnmap` — unmap, report the driver's answer (which `drop` ignores), and give the region back
    /// so that it can be mapped again.
    ///
    /// Consuming `self` makes a double unmap impossible to write; the driver would not catch one (it
    /// returns success for a range that is already unmapped).
    ///
    /// # Errors
    /// The driver's error. The range then stays mapped and is leaked until the process ends (the
    /// reservation's `cuMemAddressFree` will fail too); no driver failure of a whole-mapping unmap is
    /// known.
    #[doc(alias = "cuMemUnmap")]
    pub fn unmap(self) -> Result<Region<'va>> {
        let (ptr, size) = (self.range.ptr(), self.range.size());
        let (_, unmapped) = self.range.unmap();
        unmapped?;
        Ok(Region::from_unmapped(ptr, size))
    }
}

/// Mapping into a region: the region shrinks by what it maps (here, so that reservation.rs, below
/// this module, never names a `Mapping`).
impl<'va> Region<'va> {
    /// `cuMemMap` — map the whole of `memory` at the start of the region, and shrink the region by its
    /// size.
    ///
    /// The driver maps only whole allocations (a partial mapping is `CUDA_ERROR_NOT_SUPPORTED`), so no
    /// offset or size is asked for: choose the address by [splitting](Region::split_at) or
    /// [skipping](Region::skip). The mapping is not accessible until [granted](Mapping::grant).
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] where the region is smaller than `memory`; [`Error::NotAligned`] where the
    /// region's start is not a multiple of the memory's granularity; the driver's error otherwise. On any
    /// error the region is unchanged and nothing is mapped.
    #[doc(alias = "cuMemMap")]
    pub fn map<'mem>(
        &mut self,
        memory: &'mem PhysicalAllocation,
    ) -> Result<Mapping<'va, 'mem>, Error> {
        self.map_all(&[memory])
    }

    /// `cuMemMap` each allocation in turn, back to back from the start of the region, as one
    /// [`Mapping`]: access to all of them is granted (and they are unmapped) together, as the driver
    /// allows for adjacent whole mappings.
    ///
    /// # Errors
    /// As [`Region::map`]; [`Error::ZeroSize`] for an empty list. On any error, the allocations already
    /// mapped by this call are unmapped again, the region is unchanged and nothing is mapped; except
    /// for [`Error::CleanupFailed`] (`what`: `"mapping"`), where the driver refused a `cuMemMap` and
    /// then the `cuMemUnmap` that undoes the allocations mapped before it. Those may then stay
    /// mapped, so the front of the region they were mapped into is taken out of the region, never to be
    /// mapped again: it is leaked, as the range of a forgotten mapping is (the reservation's
    /// `cuMemAddressFree` will be refused), and the rest of the region is unchanged. No such refusal
    /// of a whole-mapping unmap is known.
    #[doc(alias = "cuMemMap")]
    pub fn map_all<'mem>(
        &mut self,
        memory: &[&'mem PhysicalAllocation],
    ) -> Result<Mapping<'va, 'mem>, Error> {
        if memory.is_empty() {
            return Err(Error::ZeroSize {
                what: "list of allocations to map",
            });
        }
        let mut total = 0usize;
        for m in memory {
            let at = usize::try_from(self.start())
                .ok()
                .and_then(|s| s.checked_add(total));
            check_multiple(
                "mapping address",
                at.ok_or(Error::Overflow {
                    what: "mapping address",
                })?,
                m.granularity(),
            )?;
            total = total.checked_add(m.size()).ok_or(Error::Overflow {
                what: "mapping size",
            })?;
        }
        if total > self.len() {
            return Err(Error::OutOfBounds {
                what: "mapping",
                start: 0,
                end: total,
                len: self.len(),
            });
        }
        let mut mapped = 0usize;
        for m in memory {
            let at = self.start() + mapped as u64;
            // SAFETY: `[at, at + size)` lies inside this region (checked above), which no other live
            // region or mapping covers (a forgotten mapping may: the driver refuses `cuMemMap` over any
            // mapped byte, measured in `tests/driver_facts.rs`); `m.as_raw()` is a live allocation
            // handle (borrowed for `'mem`); offset 0 and flags 0 as the driver requires.
            let code = unsafe { sys::cuMemMap(at, m.size(), 0, m.as_raw(), 0) };
            if let Err(error) = check(code) {
                let undo = if mapped > 0 {
                    // SAFETY: `[start, start + mapped)` was mapped by this call just above, as whole
                    // allocations back to back, and is unmapped once.
                    check(unsafe { sys::cuMemUnmap(self.start(), mapped) })
                } else {
                    Ok(())
                };
                return Err(self.map_refused(error, mapped, undo));
            }
            mapped += m.size();
        }
        let mapping = Mapping::from_mapped(self.start(), total);
        self.take_front(total);
        Ok(mapping)
    }

    /// The error of a [`map_all`](Region::map_all) whose `cuMemMap` was refused with `error` after
    /// `mapped` bytes at the front of the region had been mapped, given `undo`, the answer of unmapping
    /// them again. Where the undo was refused, the front may still be mapped: it is taken out of the
    /// region, so that it is never mapped again (a leak).
    fn map_refused(&mut self, error: DriverError, mapped: usize, undo: DriverResult<()>) -> Error {
        match undo {
            Ok(()) => Error::Driver(error),
            Err(cleanup) => {
                self.take_front(mapped);
                Error::CleanupFailed {
                    error,
                    cleanup,
                    what: "mapping",
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::error::{DriverError, Error};
    use crate::vmm::reservation::Region;

    #[test]
    fn a_front_that_could_not_be_unmapped_leaves_the_region() {
        let (start, len, mapped) = (1u64 << 40, 8usize << 20, 2usize << 20);

        // The undo worked: the driver's refusal, and the region unchanged.
        let mut region = Region::from_unmapped(start, len);
        let e = region.map_refused(DriverError::OUT_OF_MEMORY, mapped, Ok(()));
        assert_eq!(e, Error::Driver(DriverError::OUT_OF_MEMORY));
        assert_eq!((region.start(), region.len()), (start, len));

        // The undo was refused: both errors, and the possibly still mapped front is gone.
        let e = region.map_refused(
            DriverError::OUT_OF_MEMORY,
            mapped,
            Err(DriverError::INVALID_VALUE),
        );
        assert_eq!(
            e,
            Error::CleanupFailed {
                error: DriverError::OUT_OF_MEMORY,
                cleanup: DriverError::INVALID_VALUE,
                what: "mapping",
            }
        );
        assert_eq!(
            (region.start(), region.len()),
            (start + mapped as u64, len - mapped)
        );
    }
}
