//! Virtual address ranges: `cuMemAddressReserve` / `cuMemAddressFree`, and disjoint regions of them.

use core::fmt;
use core::marker::PhantomData;
use core::mem::ManuallyDrop;

use crate::error::{DriverResult, Error, Result, check};
use crate::sys;

/// A reserved range of the process's unified virtual address space, freed on drop.
///
/// A reservation holds no memory. Carve it into [`Region`]s with [`VirtualReservation::region`] and map
/// physical memory into them. While any region or mapping of the reservation lives, the reservation is
/// mutably borrowed: it cannot be dropped, freed or moved, which is the driver's rule that a range must
/// be unmapped before it is freed (`cuMemAddressFree` of a mapped range fails and leaks the range).
pub struct VirtualReservation {
    base: sys::CUdeviceptr,
    size: usize,
}

impl fmt::Debug for VirtualReservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VirtualReservation")
            .field("base", &format_args!("{:#x}", self.base))
            .field("size", &self.size)
            .finish()
    }
}

impl VirtualReservation {
    /// `cuMemAddressReserve` — reserve `size` bytes of virtual address space at an address the driver
    /// picks, aligned to `alignment` (0 asks for the driver's default, the allocation granularity).
    ///
    /// `size` must be a multiple of the allocation granularity (the driver refuses others with
    /// `CUDA_ERROR_INVALID_VALUE`): only whole allocations can be mapped.
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for a zero `size`; the driver's error otherwise, e.g.
    /// [`DriverError::INVALID_VALUE`](crate::DriverError::INVALID_VALUE) for a size or alignment it refuses.
    #[doc(alias = "cuMemAddressReserve")]
    pub fn new(size: usize, alignment: usize) -> Result<VirtualReservation, Error> {
        VirtualReservation::with_address_hint(size, alignment, 0)
    }

    /// `cuMemAddressReserve` with a requested start address.
    ///
    /// The address is a hint: where it is taken or unusable the driver reserves elsewhere, so read
    /// [`base`](VirtualReservation::base) rather than assuming the hint was honoured. `0` means no hint.
    ///
    /// # Errors
    /// As [`VirtualReservation::new`].
    #[doc(alias = "cuMemAddressReserve")]
    pub fn with_address_hint(
        size: usize,
        alignment: usize,
        hint: u64,
    ) -> Result<VirtualReservation, Error> {
        if size == 0 {
            return Err(Error::ZeroSize {
                what: "reservation size",
            });
        }
        // The one entry point that needs no `Device` first, which would have initialised the driver.
        crate::device::init()?;
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: `base` is writable for the call; the other arguments are plain integers (flags must be 0).
        check(unsafe { sys::cuMemAddressReserve(&raw mut base, size, alignment, hint, 0) })?;
        Ok(VirtualReservation { base, size })
    }

    /// The first address of the range. While a region of the reservation lives, the reservation is
    /// borrowed mutably and this cannot be called: read the base first, or from the whole region
    /// ([`Region::start`] of [`region`](VirtualReservation::region)'s result, before it is carved).
    #[must_use]
    pub fn base(&self) -> u64 {
        self.base
    }

    /// The size of the range in bytes.
    #[must_use]
    pub fn size(&self) -> usize {
        self.size
    }

    /// The whole range as one [`Region`], to map memory into.
    ///
    /// Borrows the reservation mutably for as long as the region, or anything carved or mapped from it,
    /// lives: two regions of one reservation never exist at once unless split from one another, and
    /// split regions are disjoint, so two mappings can never overlap.
    pub fn region(&mut self) -> Region<'_> {
        Region {
            start: self.base,
            len: self.size,
            _reservation: PhantomData,
        }
    }

    /// `cuMemAddressFree` — free the range and report the driver's answer, which `drop` ignores.
    ///
    /// # Errors
    /// The driver's error, if any.
    #[doc(alias = "cuMemAddressFree")]
    pub fn free(self) -> Result<()> {
        Ok(self.free_code()?)
    }

    /// [`free`](VirtualReservation::free) with the driver's own code, for the owned layer's
    /// teardown, which keeps the first driver error of several steps.
    pub(crate) fn free_code(self) -> DriverResult<()> {
        let this = ManuallyDrop::new(self);
        // SAFETY: the range came from `cuMemAddressReserve` and is freed once: `drop` will not run. No
        // live mapping covers it (every mapping borrows the reservation); a forgotten one may, and then
        // the driver refuses the free (`CUDA_ERROR_INVALID_VALUE`): a leak.
        check(unsafe { sys::cuMemAddressFree(this.base, this.size) })
    }
}

impl Drop for VirtualReservation {
    fn drop(&mut self) {
        // SAFETY: the range came from `cuMemAddressReserve` and is freed only here (or in `free`).
        let code = unsafe { sys::cuMemAddressFree(self.base, self.size) };
        // The error is ignored: `drop` cannot return it. Every mapping borrows the reservation, so none
        // is live here unless one was leaked with `mem::forget`, and then the range stays reserved (a
        // leak, not undefined behaviour). Call `free` to see the error.
        let _ = code;
    }
}

/// A part of a [`VirtualReservation`] that no mapping uses and no other region covers.
///
/// Regions are the unit of exclusivity: splitting consumes a region and returns two disjoint ones, and
/// mapping takes memory from the front of a region. Because of that, two mappings can never overlap.
///
/// # Lifetimes
/// `'va` is the mutable borrow of the reservation the region was carved from. Every [`Mapping`](crate::Mapping) made
/// from the region carries the same `'va`, so the reservation outlives all of them.
pub struct Region<'va> {
    start: sys::CUdeviceptr,
    len: usize,
    /// The exclusive borrow of the reservation: covariant in `'va`; `Send`/`Sync` as `&mut
    /// VirtualReservation` (both, since a reservation is two integers).
    _reservation: PhantomData<&'va mut VirtualReservation>,
}

impl fmt::Debug for Region<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("start", &format_args!("{:#x}", self.start))
            .field("len", &self.len)
            .finish()
    }
}

impl<'va> Region<'va> {
    /// Rebuilds the region of an unmapped range (used by [`Mapping::unmap`](crate::Mapping::unmap)).
    pub(crate) fn from_unmapped(start: sys::CUdeviceptr, len: usize) -> Region<'va> {
        Region {
            start,
            len,
            _reservation: PhantomData,
        }
    }

    /// The first address of the region.
    #[must_use]
    pub fn start(&self) -> u64 {
        self.start
    }

    /// The region's size in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region has no bytes left.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Splits the region in two at byte `offset`: `[0, offset)` and `[offset, len)`.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] where `offset > len`; the region is dropped (it can be carved again from
    /// the reservation once every part of it is gone). To keep it on error, use
    /// [`split_off`](Region::split_off).
    pub fn split_at(self, offset: usize) -> Result<(Region<'va>, Region<'va>), Error> {
        if offset > self.len {
            return Err(Error::OutOfBounds {
                what: "region split",
                start: offset,
                end: offset,
                len: self.len,
            });
        }
        let tail = Region::from_unmapped(self.start + offset as u64, self.len - offset);
        Ok((
            Region {
                len: offset,
                ..self
            },
            tail,
        ))
    }

    /// Splits off `[offset, len)` as a new region and keeps `[0, offset)`, as `Vec::split_off` does.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] where `offset > len`; the region is unchanged.
    pub fn split_off(&mut self, offset: usize) -> Result<Region<'va>, Error> {
        if offset > self.len {
            return Err(Error::OutOfBounds {
                what: "region split",
                start: offset,
                end: offset,
                len: self.len,
            });
        }
        let tail = Region::from_unmapped(self.start + offset as u64, self.len - offset);
        self.len = offset;
        Ok(tail)
    }

    /// Joins `other` to this region where the two are adjacent (`other` starts where this one ends, or
    /// ends where this one starts): the free space left by unmapped neighbours becomes one region again,
    /// large enough for a larger mapping. Gives `other` back, and changes nothing, where they are not.
    ///
    /// Both carry the borrow `'va`, so both are free parts of reservations that outlive the result.
    /// Two regions of two reservations that happen to be adjacent join too; the driver decides whether
    /// a mapping may then cross from one reservation into the other.
    ///
    /// # Errors
    /// `other`, unchanged, where the regions are not adjacent.
    pub fn merge(&mut self, other: Region<'va>) -> core::result::Result<(), Region<'va>> {
        let end = |r: &Region<'va>| r.start.checked_add(r.len as u64);
        let joined = self.len.checked_add(other.len);
        match joined {
            Some(len) if end(self) == Some(other.start) => {
                self.len = len;
                Ok(())
            }
            Some(len) if end(&other) == Some(self.start) => {
                self.start = other.start;
                self.len = len;
                Ok(())
            }
            _ => Err(other),
        }
    }

    /// Removes `bytes` from the front of the region, leaving a hole no mapping can use.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] where `bytes > len`; the region is unchanged.
    pub fn skip(&mut self, bytes: usize) -> Result<(), Error> {
        if bytes > self.len {
            return Err(Error::OutOfBounds {
                what: "region skip",
                start: 0,
                end: bytes,
                len: self.len,
            });
        }
        self.take_front(bytes);
        Ok(())
    }

    /// Removes `bytes` (at most `len`) from the front: mapped, or taken out of use.
    pub(crate) fn take_front(&mut self, bytes: usize) {
        self.start += bytes as u64;
        self.len -= bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::Region;
    use crate::error::Error;
    use proptest::prelude::*;

    proptest! {
        /// Merging the two halves of a split, in either order, gives the region back; regions that are
        /// not adjacent are not merged and come back unchanged.
        #[test]
        fn merge_undoes_split(start in 0u64..(1 << 47), len in 0usize..(1 << 40), cut in any::<usize>(), gap in 1u64..4096) {
            let cut = cut % (len + 1);
            let (mut head, tail) = Region::from_unmapped(start, len).split_at(cut).unwrap();
            prop_assert!(head.merge(tail).is_ok());
            prop_assert_eq!((head.start(), head.len()), (start, len));
            let (head, mut tail) = Region::from_unmapped(start, len).split_at(cut).unwrap();
            prop_assert!(tail.merge(head).is_ok());
            prop_assert_eq!((tail.start(), tail.len()), (start, len));
            let mut one = Region::from_unmapped(start, len);
            let apart = Region::from_unmapped(start + len as u64 + gap, 7);
            let back = one.merge(apart).unwrap_err();
            prop_assert_eq!((back.start(), back.len()), (start + len as u64 + gap, 7));
            prop_assert_eq!((one.start(), one.len()), (start, len));
        }

        /// Splitting and skipping keep regions disjoint and covering: the parts of a region are exactly
        /// the region, in order, whatever the cut points.
        #[test]
        fn splits_and_skips_partition_the_region(
            start in 0u64..(1 << 47),
            len in 0usize..(1 << 40),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let mut rest = Region::from_unmapped(start, len);
            let mut covered = start;
            for cut in cuts {
                let cut = cut % (len + 2);
                if cut % 3 == 0 {
                    let before = (rest.start(), rest.len());
                    match rest.skip(cut) {
                        Ok(()) => {
                            prop_assert_eq!(rest.start(), before.0 + cut as u64);
                            covered = rest.start();
                        }
                        Err(e) => {
                            prop_assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
                            prop_assert_eq!((rest.start(), rest.len()), before, "a failed skip changes nothing");
                        }
                    }
                    continue;
                }
                let total = rest.len();
                if cut % 3 == 1 {
                    let before = (rest.start(), rest.len());
                    match rest.split_off(cut) {
                        Ok(tail) => {
                            prop_assert_eq!(rest.start(), covered);
                            prop_assert_eq!((rest.len(), tail.start()), (cut, covered + cut as u64));
                            prop_assert_eq!(rest.len() + tail.len(), total);
                            covered = tail.start();
                            rest = tail;
                        }
                        Err(e) => {
                            prop_assert!(cut > total);
                            prop_assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
                            prop_assert_eq!((rest.start(), rest.len()), before, "a failed split_off changes nothing");
                        }
                    }
                    continue;
                }
                match rest.split_at(cut) {
                    Ok((head, tail)) => {
                        prop_assert_eq!(head.start(), covered);
                        prop_assert_eq!(head.start() + head.len() as u64, tail.start());
                        prop_assert_eq!(head.len() + tail.len(), total);
                        covered = tail.start();
                        rest = tail;
                    }
                    Err(e) => {
                        prop_assert!(cut > total);
                        prop_assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
                        break;
                    }
                }
            }
        }
    }
}
