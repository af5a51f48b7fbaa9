//! The driver calls of one page, made for the page table by its transitions (`driver.rs`) and by
//! the reserve's worker without the lock: [`map_at`] (`cuMemMap`, `cuMemSetAccess`, undone on
//! failure; built on [`map_handle`], which `Table::map` calls with its page already in the
//! table), [`unmap_page`] and [`unmap_and_release`] (`cuMemUnmap`, `cuMemRelease`), and the
//! counts of the calls each made.

use crate::device::Context;
use crate::error::{DriverError, DriverResult, Error, check, with_cleanup};
use crate::sys;
use crate::vmm::access::Grant;

use super::super::page::Backing;
use super::bump;

/// The driver calls [`map_at`] and [`unmap_and_release`] made, for the table's counts.
#[derive(Debug, Default, Clone, Copy)]
pub(in crate::owned::buffer) struct Calls {
    pub(in crate::owned::buffer) maps: u64,
    pub(in crate::owned::buffer) grants: u64,
    pub(in crate::owned::buffer) unmaps: u64,
}

/// `cuMemMap` and `cuMemSetAccess` — map `backing` at byte `offset` of the buffer at `base` and
/// grant it to `access` in `flags`, undone on failure (the memory released): the page, or the
/// error with the page where the unmap that undoes a refused grant failed too (still mapped,
/// perhaps partly granted: the caller keeps it `Ungranted`). Counts its calls in `calls`.
///
/// # Safety
/// `[base + offset, base + offset + size)` lies inside the buffer's reservation, both ends
/// multiples of the memory's granularity, and the caller holds the range: no mapping overlaps
/// it, and nothing else maps there until the caller has put the outcome in the table (checked
/// vacant under the table's lock and held until then, or marked `Filling` under it, which only
/// the worker that marked it fills).
pub(in crate::owned::buffer) unsafe fn map_at(
    base: u64,
    offset: usize,
    backing: Backing,
    access: &[Context],
    flags: u32,
    calls: &mut Calls,
) -> Result<Backing, (Error, Option<Backing>)> {
    let address = base.wrapping_add(offset as u64);
    let size = backing.memory.size();
    bump(&mut calls.maps);
    // SAFETY: the range lies inside the buffer's reservation, aligned, and overlaps no mapping,
    // nor will anything else map there meanwhile (this function's contract); the memory is
    // `backing`'s, alive until it is released below or returned.
    match unsafe { map_handle(address, size, backing.memory.as_raw(), access, flags) } {
        Ok(()) => {
            bump(&mut calls.grants);
            Ok(backing)
        }
        Err(failure) => {
            if let MapFailure::Grant { .. } = failure {
                bump(&mut calls.grants);
                bump(&mut calls.unmaps);
            }
            Err(failure.settle(backing))
        }
    }
}

/// A refused map of [`map_handle`]: `cuMemMap`'s error, or `cuMemSetAccess`'s with the answer of
/// the `cuMemUnmap` that undid the mapping.
pub(super) enum MapFailure {
    Map(DriverError),
    Grant {
        error: DriverError,
        unmapped: DriverResult<()>,
    },
}

impl MapFailure {
    /// The error, and what becomes of `backing`, the refused map's memory: released (`None`), or
    /// kept where the unmap that undid a refused grant failed too (still mapped, perhaps partly
    /// granted: the caller keeps it `Ungranted`), the error then [`Error::CleanupFailed`].
    pub(super) fn settle(self, backing: Backing) -> (Error, Option<Backing>) {
        match self {
            MapFailure::Map(error)
            | MapFailure::Grant {
                error,
                unmapped: Ok(()),
            } => {
                let cleanup = backing.memory.release_code();
                (with_cleanup(error, cleanup, "page mapping"), None)
            }
            MapFailure::Grant {
                error,
                unmapped: Err(cleanup),
            } => {
                let error = Error::CleanupFailed {
                    error,
                    cleanup,
                    what: "page mapping",
                };
                (error, Some(backing))
            }
        }
    }

    /// The error, where no memory is at hand to settle (a table that lost the page meanwhile,
    /// which the lock rules out).
    pub(super) fn into_error(self) -> Error {
        match self {
            MapFailure::Map(error) | MapFailure::Grant { error, .. } => Error::Driver(error),
        }
    }
}

/// `cuMemMap` and `cuMemSetAccess` — map the memory `handle` of `size` bytes at `address` and grant
/// it to `access` in `flags`; a refused grant is undone (`cuMemUnmap`). The memory is the caller's
/// either way.
///
/// # Safety
/// `[address, address + size)` lies inside a reservation, both ends multiples of the memory's
/// granularity, overlaps no mapping, and the caller holds the range until it has put the outcome
/// in its table; `handle` is a live allocation of `size` bytes, kept alive while mapped.
pub(super) unsafe fn map_handle(
    address: u64,
    size: usize,
    handle: sys::CUmemGenericAllocationHandle,
    access: &[Context],
    flags: u32,
) -> Result<(), MapFailure> {
    // Before the map: the misses its loads may take overlap the caller's, not the calls'.
    let grant = Grant::new(access, flags);
    // SAFETY: the range lies inside a reservation, aligned, and overlaps no mapping, nor will
    // anything else map there meanwhile; the memory is a live allocation of `size` bytes, kept
    // alive while mapped; offset 0 and flags 0 as the driver requires (this function's contract).
    check(unsafe { sys::cuMemMap(address, size, 0, handle, 0) }).map_err(MapFailure::Map)?;
    if let Err(error) = grant.set(address, size) {
        // SAFETY: `[address, address + size)` was mapped just above, by this call, and is
        // unmapped once here; nothing has seen its address (the caller holds the range).
        let unmapped = check(unsafe { sys::cuMemUnmap(address, size) });
        return Err(MapFailure::Grant { error, unmapped });
    }
    Ok(())
}

/// `cuMemUnmap`, `cuMemRelease` — unmap the page `backing` mapped whole at byte `offset` of the
/// buffer at `base`, then release its memory: `Err` with the page where the driver refuses the
/// unmap (it stays mapped), else the release's answer (ignored by callers, as in `drop`: the page
/// is unmapped and gone either way). Counts its call in `calls`.
///
/// # Safety
/// `[base + offset, base + offset + size)` is the page's whole mapping, made by [`map_at`], and
/// nothing can use it: no view, lend or export reaches it (a page of the reserve, or a retired
/// page whose events have completed), no queued work uses it, and the caller holds the range
/// (taken out of the table, or marked `Releasing`, under the lock) so that nothing else unmaps or
/// maps there until it has put the outcome in the table.
pub(in crate::owned::buffer) unsafe fn unmap_and_release(
    base: u64,
    offset: usize,
    size: usize,
    backing: Backing,
    calls: &mut Calls,
) -> Result<DriverResult<()>, Backing> {
    // SAFETY: this function's contract is `unmap_page`'s.
    match unsafe { unmap_page(base, offset, size, calls) } {
        Ok(()) => Ok(backing.memory.release_code()),
        Err(_) => Err(backing),
    }
}

/// `cuMemUnmap` — unmap the page mapped whole at byte `offset` of the buffer at `base`; its memory
/// stays the caller's (to release, or to map again). Counts its call in `calls`.
///
/// # Safety
/// As [`unmap_and_release`].
pub(in crate::owned::buffer) unsafe fn unmap_page(
    base: u64,
    offset: usize,
    size: usize,
    calls: &mut Calls,
) -> DriverResult<()> {
    bump(&mut calls.unmaps);
    // SAFETY: the page's whole mapping, which nothing uses or reaches, unmapped once by the holder
    // of its range (this function's contract).
    check(unsafe { sys::cuMemUnmap(base.wrapping_add(offset as u64), size) })
}
