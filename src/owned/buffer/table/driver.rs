//! The page table's transitions that call the driver: each `cuMemMap`, `cuMemSetAccess` and
//! `cuMemUnmap` of a buffer's pages is made here, once per transition, with the state change it
//! makes ([`map`](Table::map), [`restore`](Table::restore), [`unrestore`](Table::unrestore),
//! [`unmap`](Table::unmap), [`shrink`](Table::shrink), [`evict`](Table::evict),
//! [`reclaim`](Table::reclaim), [`regrant`](Table::regrant), [`teardown`](Table::teardown)),
//! and the `cuEventQuery` of a finished retire a map takes
//! ([`take_finished_retired`](Table::take_finished_retired); the reserve's worker queries its
//! retires without the lock, and hands the finished ones to
//! [`release_finished`](Table::release_finished)). Part of the table's module: the states and
//! the driver-free transitions are in `table.rs`.

use core::ops::Range;

use crate::device::{Context, Device};
use crate::error::{DriverError, DriverResult, Error, check, first_error, with_cleanup};
use crate::owned::pages::{RETIRED, Span, pages_inside};
use crate::sys;
use crate::vmm::access::{Contexts, set_access, with_contexts};

use super::super::page::{Backing, Memory, PageInfo, Piece};
use super::super::retiring::{Retires, Ticket};
use super::calls::{Calls, MapFailure, map_at, map_handle};
use super::{Page, Slot, Table, bump};

impl Table<Backing> {
    /// `cuMemMap` and `cuMemSetAccess` — map `memory` of `device` at `offset` and grant it to
    /// `access` in the mode `flags`, where [`check_vacant`](Table::check_vacant) says the range is
    /// free: checked here first, before any driver call (a caller that makes the memory checks it
    /// before, under the same lock, too), its error with `memory` dropped. On failure what was done
    /// is undone, and the memory released; where the unmap that undoes a refused grant fails too,
    /// the page stays, `Ungranted`, and the error is [`Error::CleanupFailed`].
    pub(in crate::owned::buffer) fn map(
        &mut self,
        offset: usize,
        memory: Memory,
        device: Device,
        access: &[Context],
        flags: u32,
    ) -> Result<(), Error> {
        let size = memory.size();
        let end = offset.saturating_add(size);
        let index = self.vacant(offset, end)?;
        let handle = memory.as_raw();
        // The page goes into the table, counted, before the driver calls, and comes out again
        // where they fail (under the same lock, so nothing sees it meanwhile): where they succeed,
        // nothing of the table is touched after them. Each call leaves the host's caches cold
        // (examples/README.md, the shared page's row). Nothing between panics (the calls are
        // FFI; a grant's list of devices is a `Vec`, whose failed allocation aborts), so the
        // lock is never poisoned with the page in the table but not mapped.
        let cursor = self.reserve.cursor;
        let page = Page::Live(Backing {
            memory,
            device,
            exported: false,
        });
        self.put_mapped(index, offset, size, page);
        self.count_calls(1, 1, 0);
        bump(&mut self.stats.pages_mapped);
        self.moved_cursor(end);
        let address = self.base.wrapping_add(offset as u64);
        // SAFETY: `[address, address + size)` lies inside the reservation, aligned to the memory's
        // granularity (the caller checked both), vacant (checked just above, under the lock that
        // every change of the pages holds, held until the outcome is in the table); `handle` is
        // the memory of the page put in the table above, which keeps it alive.
        match unsafe { map_handle(address, size, handle, access, flags) } {
            Ok(()) => Ok(()),
            Err(failure) => self.map_refused(index, cursor, failure),
        }
    }

    /// Takes back what [`map`](Table::map) put in the table before its driver calls, which
    /// `failure` says were refused: the page at `index` leaves the table and its memory is
    /// released, or stays `Ungranted` where the unmap that undid its grant failed too; the counts
    /// and the reserve's cursor are as if the map had not been tried, but for the calls made.
    #[cold]
    fn map_refused(
        &mut self,
        index: usize,
        cursor: usize,
        failure: MapFailure,
    ) -> Result<(), Error> {
        let stats = &mut self.stats;
        stats.pages_mapped = stats.pages_mapped.saturating_sub(1);
        match failure {
            MapFailure::Map(_) => {
                stats.set_access_calls = stats.set_access_calls.saturating_sub(1);
            }
            MapFailure::Grant { .. } => bump(&mut stats.unmap_calls),
        }
        self.moved_cursor(cursor);
        // The page `map` put at `index`, which nothing has changed since (the lock is held).
        let Some(slot) = self.slots.get_mut(index) else {
            return Err(failure.into_error());
        };
        let backing = match core::mem::replace(&mut slot.page, Page::Evicted) {
            Page::Live(backing) => backing,
            other => {
                slot.page = other;
                return Err(failure.into_error());
            }
        };
        match failure.settle(backing) {
            (error, Some(backing)) => {
                slot.page = Page::Ungranted(backing);
                Err(error)
            }
            (error, None) => {
                self.slots.remove(index);
                self.epoch = self.epoch.saturating_sub(1);
                Err(error)
            }
        }
    }

    /// `cuMemMap`, `cuMemSetAccess` — map `memory` (the size and device of `piece`, made with the
    /// buffer's options for that device, as the evicted page was) at the evicted range `piece`,
    /// granted to `access` in `flags`: the range is `Live` again. Refused before any driver call
    /// where the range is not evicted or its page is still there, retired
    /// ([`check_restorable`](Table::check_restorable)'s errors). Undone on failure, as
    /// [`map`](Table::map) undoes; the range then stays evicted (or holds the `Ungranted` page).
    pub(in crate::owned::buffer) fn restore(
        &mut self,
        piece: &Piece,
        memory: Memory,
        access: &[Context],
        flags: u32,
    ) -> Result<(), Error> {
        self.check_restorable(core::iter::once(piece.offset..piece.end()))?;
        let index = self
            .slot_at(piece.offset)
            .filter(|&i| self.slots.get(i).is_some_and(Span::evicted))
            .ok_or(Error::PageRange {
                start: piece.offset,
                end: piece.end(),
                problem: "are not evicted (the handle was restored already?)",
            })?;
        let backing = Backing {
            memory,
            device: piece.device,
            exported: false,
        };
        let mut calls = Calls::default();
        // SAFETY: `[piece.offset, piece.end())` is an evicted range whose page is gone (checked
        // above), inside the reservation; `memory` has the piece's size and was made with the
        // options of the piece's device (this function's contract), as the evicted page was, so
        // the range is aligned to its granularity. Under the lock (`&mut self`) that every change
        // of the pages holds, held until the page is in the table: nothing else maps there
        // meanwhile.
        let outcome =
            unsafe { map_at(self.base, piece.offset, backing, access, flags, &mut calls) };
        self.count_calls(calls.maps, calls.grants, calls.unmaps);
        let (page, result) = match outcome {
            Ok(backing) => {
                bump(&mut self.stats.pages_mapped);
                (Page::Live(backing), Ok(()))
            }
            Err((error, Some(backing))) => (Page::Ungranted(backing), Err(error)),
            Err((error, None)) => return Err(error),
        };
        let epoch = self.count_mapped();
        if let Some(slot) = self.slots.get_mut(index) {
            slot.page = page;
            slot.epoch = epoch;
        }
        result
    }

    /// Takes back the restore of `pieces` (its copies refused, or none queued, or another piece's
    /// map refused): each page just mapped at a piece is unmapped and released, and its range is
    /// evicted again. A retired page of an earlier mapping at the same offset is left to its
    /// release. Errors are ignored: a page the driver refuses to unmap stays (the next unmap or the
    /// drop tries it again).
    pub(in crate::owned::buffer) fn unrestore(&mut self, pieces: &[Piece]) {
        for piece in pieces {
            let Some(index) = self.slot_at(piece.offset) else {
                continue;
            };
            let Some(slot) = self.slots.get_mut(index) else {
                continue;
            };
            let backing = match core::mem::replace(&mut slot.page, Page::Evicted) {
                Page::Live(backing) | Page::Ungranted(backing) => backing,
                other => {
                    slot.page = other;
                    continue;
                }
            };
            bump(&mut self.stats.unmap_calls);
            let address = self.base.wrapping_add(slot.offset as u64);
            // SAFETY: the page's whole mapping, made by the restore that is undone here (its
            // copies have finished, or none was queued), unmapped once: its range becomes evicted
            // again below. No view or lend reached it: the restore holds the lock, or `&mut` of
            // the buffer, until it is undone.
            match check(unsafe { sys::cuMemUnmap(address, slot.size) }) {
                Ok(()) => {
                    bump(&mut self.stats.pages_released);
                    let _ = backing.memory.release_code();
                }
                // Still mapped, its bytes half restored: `Ungranted`, so that no view covers it
                // (as the evicted mark did), and the next unmap of its range or the drop tries
                // again.
                Err(_) => slot.page = Page::Ungranted(backing),
            }
        }
    }

    /// `cuMemUnmap`, `cuMemRelease` — unmap and release every page inside `[start, end)`: how many
    /// were. Before any driver call, a page the range cuts or a retired page is refused. Every page
    /// is tried; one the driver refuses to unmap stays. Evicted ranges inside stay evicted.
    #[inline]
    pub(in crate::owned::buffer) fn unmap(
        &mut self,
        start: usize,
        end: usize,
    ) -> Result<usize, Error> {
        let span = pages_inside(&self.slots, start, end)?;
        self.unmap_span(span)
    }

    /// `cuMemUnmap`, `cuMemRelease` — unmap the last page: what it was, or `None` where there is
    /// none. A retired page is refused.
    pub(in crate::owned::buffer) fn shrink(&mut self) -> Result<Option<PageInfo>, Error> {
        let Some(index) = self.slots.iter().rposition(Span::mapped) else {
            return Ok(None);
        };
        let info = self.slots.get(index).and_then(Slot::info);
        self.unmap_span(index..index.saturating_add(1))?;
        Ok(info)
    }

    /// Unmaps and releases the pages of `self.slots[span]`, every one tried; the pages the driver
    /// refuses to unmap stay, and so do evicted ranges. A retired page in the span is refused
    /// before any driver call.
    fn unmap_span(&mut self, span: Range<usize>) -> Result<usize, Error> {
        let Some(slots) = self.slots.get(span.clone()) else {
            return Ok(0);
        };
        if let Some(page) = slots.iter().find(|s| s.retired()) {
            return Err(Error::PageRange {
                start: page.offset,
                end: Span::end(page),
                problem: RETIRED,
            });
        }
        let mut first: DriverResult<()> = Ok(());
        let mut unmapped = 0usize;
        let Range {
            start: mut at,
            mut end,
        } = span;
        while at < end {
            let Some(slot) = self.slots.get_mut(at) else {
                break;
            };
            let (backing, live) = match core::mem::replace(&mut slot.page, Page::Evicted) {
                Page::Live(backing) => (backing, true),
                Page::Ungranted(backing) => (backing, false),
                other => {
                    // An evicted range, or a page of the reserve, holds no page of the user's
                    // to unmap: it stays as it is.
                    slot.page = other;
                    at = at.saturating_add(1);
                    continue;
                }
            };
            // The page leaves the table, counted, before its `cuMemUnmap`, and comes back where
            // the driver refuses it (as `map` puts a page in first): where the unmap succeeds,
            // only the memory's release follows it.
            let mut slot = self.slots.remove(at);
            end = end.saturating_sub(1);
            self.slots_removed();
            bump(&mut self.stats.unmap_calls);
            bump(&mut self.stats.pages_released);
            let address = self.base.wrapping_add(slot.offset as u64);
            // SAFETY: `[address, address + size)` is the page's whole mapping, made by `map` or
            // `restore` and unmapped once: the page left the table above, and comes back below
            // only where the driver refuses. It is not retired (checked), so no work of a retire
            // can use it; no view lives (the caller holds `&mut` of the buffer), and every copy
            // through one finished before it returned.
            let result = match check(unsafe { sys::cuMemUnmap(address, slot.size) }) {
                Ok(()) => {
                    unmapped = unmapped.saturating_add(1);
                    backing.memory.release_code()
                }
                Err(error) => {
                    let stats = &mut self.stats;
                    stats.pages_released = stats.pages_released.saturating_sub(1);
                    slot.page = Page::with_grant(backing, live);
                    self.slots.insert(at, slot);
                    (at, end) = (at.saturating_add(1), end.saturating_add(1));
                    Err(error)
                }
            };
            if first.is_ok() {
                first = result;
            }
        }
        first?;
        Ok(unmapped)
    }

    /// `cuMemUnmap`, `cuMemRelease` — evict `pieces` (checked by [`evictable`](Table::evictable),
    /// their bytes copied out): each page is unmapped and released, in order, and its range
    /// evicted. Stops at the first refused unmap: the pieces evicted, and that refusal. A refused
    /// `cuMemRelease` is ignored, as in `drop` (the page is unmapped and evicted either way).
    pub(in crate::owned::buffer) fn evict(
        &mut self,
        pieces: &[Piece],
    ) -> (Vec<Piece>, Option<DriverError>) {
        let mut evicted = Vec::with_capacity(pieces.len());
        for piece in pieces {
            let Some(slot) = self
                .slot_at(piece.offset)
                .and_then(|i| self.slots.get_mut(i))
            else {
                continue;
            };
            let backing = match core::mem::replace(&mut slot.page, Page::Evicted) {
                Page::Live(backing) => backing,
                other => {
                    slot.page = other;
                    continue;
                }
            };
            bump(&mut self.stats.unmap_calls);
            let address = self.base.wrapping_add(piece.offset as u64);
            // SAFETY: the page's whole mapping, made by `map` or `restore`, unmapped once: its
            // range is evicted below. It is live, neither retired nor shared (checked), no view
            // lives (the caller holds `&mut` of the buffer), every copy through one finished
            // before it returned (the copy of its bytes out too), and every scope that lent one has
            // waited for its work.
            if let Err(error) = check(unsafe { sys::cuMemUnmap(address, piece.size) }) {
                slot.page = Page::Live(backing);
                return (evicted, Some(error));
            }
            bump(&mut self.stats.pages_released);
            bump(&mut self.stats.pages_evicted);
            // Ignored, as in `drop`: the page is unmapped and gone either way.
            let _ = backing.memory.release_code();
            evicted.push(*piece);
        }
        (evicted, None)
    }

    /// The retire `ticket` (made by [`retire`](Table::retire) just now) finishes at the end of
    /// the scope whose handle made it, with no event: see
    /// [`scope_ended`](Table::scope_ended).
    pub(in crate::owned::buffer) fn retire_at_scope_end(&mut self, ticket: Ticket) {
        self.retires.defer(ticket);
    }

    /// The buffer is borrowed exclusively again, so the scope that lent it has ended and its wait
    /// has returned: every retire at the scope's end is finished from now on (released, or
    /// recycled by a reserve's worker, as a retire whose events completed). Whether there were
    /// any.
    #[inline]
    pub(in crate::owned::buffer) fn scope_ended(&mut self) -> bool {
        self.retires.scope_ended()
    }

    /// `cuEventQuery` — a map of exactly `[offset, end)` takes the retired page there where the
    /// reserve's worker has not recycled it in place yet but could (its retire finished, the page
    /// of the reserve's kind and `fits` the map): see [`take_retired`](Table::take_retired).
    /// Queries the events of that one retire only, and only where the page qualifies otherwise.
    pub(in crate::owned::buffer) fn take_finished_retired(
        &mut self,
        offset: usize,
        end: usize,
        fits: impl Fn(&Backing) -> bool,
    ) -> bool {
        self.take_retired(offset, end, fits, Retires::is_finished)
    }

    /// `cuEventQuery`, `cuMemUnmap`, `cuMemRelease` — release the pages of every retire whose
    /// events have all completed: how many. An eviction's page leaves its range evicted. Every
    /// finished page is tried; one the driver refuses to unmap stays retired (the drop tries it
    /// again), and the first error is returned. An event whose query fails is not known complete:
    /// its retire waits for the drop.
    pub(in crate::owned::buffer) fn reclaim(&mut self) -> Result<usize, Error> {
        let mut released = 0usize;
        let mut first: Result<(), Error> = Ok(());
        for ticket in self.retires.take_finished() {
            let mut at = 0usize;
            while let Some(slot) = self.slots.get(at) {
                if slot.retired_by(ticket).is_none() {
                    at = at.saturating_add(1);
                    continue;
                }
                let offset = slot.offset;
                match self.release_retired(at) {
                    Ok(()) => released = released.saturating_add(1),
                    Err(error) => {
                        if first.is_ok() {
                            first = Err(error);
                        }
                    }
                }
                // Past the slot where it is still there (kept retired, or evicted now).
                if self.slots.get(at).is_some_and(|s| s.offset == offset) {
                    at = at.saturating_add(1);
                }
            }
        }
        first.map(|()| released)
    }

    /// [`reclaim`](Table::reclaim), ignoring errors (each page is tried again at the drop), where
    /// a retire is under way: what every call that maps or retires does first.
    #[inline]
    pub(in crate::owned::buffer) fn reclaim_finished(&mut self) {
        if !self.retires.is_empty() {
            let _ = self.reclaim();
        }
    }

    /// What a map or retire through `&self` does first: where no reserve runs, the retires that
    /// have finished are released here ([`reclaim_finished`](Table::reclaim_finished)); where one
    /// runs, its worker releases them (it looks at their events while any wait, and each retire
    /// wakes it), and the caller's thread makes no call.
    #[inline]
    pub(in crate::owned::buffer) fn reclaim_here(&mut self) {
        if !self.reserving() {
            self.reclaim_finished();
        }
    }

    /// `cuMemUnmap` and `cuMemRelease` of the retired page of `self.slots[index]`, whose work has
    /// finished: it leaves the table, or leaves its range evicted.
    fn release_retired(&mut self, index: usize) -> Result<(), Error> {
        let Some(slot) = self.slots.get_mut(index) else {
            return Ok(());
        };
        let Page::Retired { evicted, .. } = slot.page else {
            return Ok(());
        };
        bump(&mut self.stats.unmap_calls);
        let address = self.base.wrapping_add(slot.offset as u64);
        // SAFETY: the page's whole mapping, made by `map` or `restore`, unmapped once: it leaves
        // the table below. It is retired, so no view of it has been made or lent since the retire,
        // and every event of its retire has completed, each recorded after all the work queued on
        // its stream before the retire (with no lend left in progress): no queued work uses it.
        check(unsafe { sys::cuMemUnmap(address, slot.size) })?;
        let page = if evicted {
            core::mem::replace(&mut slot.page, Page::Evicted)
        } else {
            let removed = self.slots.remove(index).page;
            self.slots_removed();
            removed
        };
        bump(&mut self.stats.pages_released);
        match page {
            Page::Retired { page, .. } => Ok(page.memory.release_code()?),
            _ => Ok(()),
        }
    }

    /// Waits for every retire, then unmaps every page (the reserve's too), then releases every
    /// page's memory: every page is tried. The first error. The reserve's worker has returned.
    pub(in crate::owned::buffer) fn teardown(&mut self) -> Result<(), Error> {
        let waited = self.retires.wait_all();
        let base = self.base;
        self.slots_removed();
        let stats = &mut self.stats;
        let pages: Vec<(usize, usize, Backing, bool)> = core::mem::take(&mut self.slots)
            .into_iter()
            .filter_map(|slot| match slot.page {
                Page::Live(page) | Page::Ungranted(page) | Page::Retired { page, .. } => {
                    Some((slot.offset, slot.size, page, false))
                }
                Page::Ready(page) => Some((slot.offset, slot.size, page, true)),
                // The worker has returned before a teardown, so no range is still `Filling` or
                // `Releasing`; were one left, the worker made (or unmade) its mapping, and the
                // table holds no page of it to unmap.
                Page::Evicted | Page::Filling | Page::Releasing { .. } => None,
            })
            .collect();
        let unmapped = first_error(pages.iter().map(|&(offset, size, _, _)| {
            bump(&mut stats.unmap_calls);
            // SAFETY: each page's whole mapping, made by `map` or `restore`, unmapped once: the
            // pages have left the table. No view lives (`&mut` of the buffer, or its drop), and
            // every retire's work has finished (waited for just above: the wait returns only then,
            // or aborts).
            check(unsafe { sys::cuMemUnmap(base.wrapping_add(offset as u64), size) })
        }));
        // Released after every unmap was tried: where an unmap failed, the driver keeps the memory
        // until that range is unmapped, which then never happens (a leak, not a dangling mapping).
        let released = first_error(pages.into_iter().map(|(_, _, page, reserve)| {
            bump(if reserve {
                &mut stats.reserve_released
            } else {
                &mut stats.pages_released
            });
            page.memory.release_code()
        }));
        waited
            .and(unmapped.map_err(Error::from))
            .and(released.map_err(Error::from))
    }

    /// `cuMemSetAccess` — make `new` the access set of every live page, in the mode `flags`, where
    /// it was `old`: first each page is granted the new set, then the devices that left it are
    /// revoked from each page. Retired pages keep the old set (the work they wait for may still
    /// read them) until they are released, and are marked so that none is recycled in place into
    /// the reserve (see [`start_release`](Table::start_release)).
    ///
    /// `Err` for a refused grant: the set stays `old` (the devices that were to join are revoked
    /// again from the pages granted so far; [`Error::CleanupFailed`] where that fails too).
    /// Otherwise the new set is in place on every live page, and the `Ok` holds the first error of
    /// the revokes, every page tried.
    pub(in crate::owned::buffer) fn regrant(
        &mut self,
        old: &[Context],
        new: &[Context],
        flags: u32,
    ) -> Result<Result<(), Error>, Error> {
        let joining: Vec<&Context> = new
            .iter()
            .filter(|c| !old.iter().any(|o| o.device() == c.device()))
            .collect();
        let leaving: Vec<&Context> = old
            .iter()
            .filter(|o| !new.iter().any(|c| c.device() == o.device()))
            .collect();
        self.access_changing();
        let base = self.base;
        let stats = &mut self.stats;
        let slots = &self.slots;
        let live = || slots.iter().filter(|s| matches!(s.page, Page::Live(_)));
        let mut done = 0usize;
        for slot in live() {
            bump(&mut stats.set_access_calls);
            let address = base.wrapping_add(slot.offset as u64);
            if let Err(error) = with_contexts(new, |c| set_access(address, slot.size, c, flags)) {
                // Also the refused page: the driver may have applied part of the call.
                let cleanup = if joining.is_empty() {
                    Ok(())
                } else {
                    first_error(live().take(done.saturating_add(1)).map(|s| {
                        bump(&mut stats.set_access_calls);
                        revoke(base, s, &joining)
                    }))
                };
                return Err(with_cleanup(error, cleanup, "access change"));
            }
            done = done.saturating_add(1);
        }
        let revoked = if leaving.is_empty() {
            Ok(())
        } else {
            first_error(live().map(|s| {
                bump(&mut stats.set_access_calls);
                revoke(base, s, &leaving)
            }))
        };
        Ok(revoked.map_err(Error::from))
    }
}

/// `cuMemSetAccess` with no access, for `contexts`' devices, on the whole page of `slot`.
fn revoke<P>(base: u64, slot: &Slot<P>, contexts: &[&Context]) -> DriverResult<()> {
    // An empty list revokes nothing (callers pass the non-empty joining or leaving devices).
    Contexts::many(contexts).map_or(Ok(()), |contexts| {
        set_access(
            base.wrapping_add(slot.offset as u64),
            slot.size,
            contexts,
            sys::CU_MEM_ACCESS_FLAGS_PROT_NONE,
        )
    })
}
