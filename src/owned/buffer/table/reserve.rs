//! The page table's reserve: pages made ahead of need by a worker thread at the next vacant slots
//! after the last page mapped, retired pages recycled in place into it, and retired pages the
//! worker releases. The transitions here make no driver call: the worker marks a range
//! (`Filling`, `Releasing`) under the lock, makes its driver calls without it, and hands the
//! outcome back ([`filled`](Table::filled), [`released`](Table::released)); a retired page
//! recycled in place ([`start_release`](Table::start_release)) needs none at all. Part of the
//! table's module: the states are in `table.rs`.

use crate::error::Error;
use crate::owned::pages::{Span, insertion_point};

use super::super::retiring::{Query, Retires, Ticket};
use super::{Page, Reserve, Slot, Table, bump};

/// What the worker's fill of a slot left: the page (`Ready`), a page mapped whose grant failed and
/// whose unmap failed too (`Ungranted`, as a map leaves it), or nothing, with the refusal.
pub(in crate::owned::buffer) enum Fill<P> {
    Ready(P),
    Ungranted(P, Error),
    Refused(Error),
}

impl<P> Table<P> {
    /// Starts a reserve of at most `bound` pages of `size` bytes inside `[0, budget)`, filled after
    /// the end of the last page. Forgets an earlier fault.
    pub(in crate::owned::buffer) fn start_reserve(
        &mut self,
        bound: usize,
        size: usize,
        budget: usize,
    ) {
        self.reserve = Reserve {
            bound,
            size,
            budget,
            cursor: self.end(),
            fault: None,
            stopping: false,
            removals: 0,
            full_at: None,
        };
    }

    /// Asks the worker to stop: [`next_fill`](Table::next_fill) gives it nothing more, and
    /// [`stopping`](Table::stopping) tells it to return.
    pub(in crate::owned::buffer) fn stop_reserve(&mut self) {
        self.reserve.stopping = true;
    }

    /// The access set is about to change: the pages retired so far keep the grants they have now
    /// (the work they wait for may still use them), whatever the outcome of the change, so none of
    /// them is recycled in place into a reserve, whose pages must carry the set in place after it.
    pub(in crate::owned::buffer) fn access_changing(&mut self) {
        self.stale_grants = Some(self.retires.last());
    }

    /// Whether the worker is asked to stop.
    pub(in crate::owned::buffer) fn stopping(&self) -> bool {
        self.reserve.stopping
    }

    /// Forgets the reserve (its worker has returned): a map makes its own pages again.
    pub(in crate::owned::buffer) fn end_reserve(&mut self) {
        self.reserve = Reserve::default();
    }

    /// Whether a reserve is running: its worker makes pages ahead and releases retired ones.
    pub(in crate::owned::buffer) fn reserving(&self) -> bool {
        self.reserve.bound > 0 && !self.reserve.stopping
    }

    /// Whether the worker holds a range without the lock (`Filling` or `Releasing`): a change
    /// through `&mut` of the buffer waits until it holds none.
    pub(in crate::owned::buffer) fn worker_busy(&self) -> bool {
        self.slots
            .iter()
            .any(|s| matches!(s.page, Page::Filling | Page::Releasing { .. }))
    }

    /// Whether a range the worker is filling shares a byte with `[offset, end)`.
    pub(in crate::owned::buffer) fn filling_in(&self, offset: usize, end: usize) -> bool {
        let first = self.slots.partition_point(|s| Span::end(s) <= offset);
        self.slots
            .get(first..)
            .unwrap_or_default()
            .iter()
            .take_while(|s| s.offset < end)
            .any(|s| matches!(s.page, Page::Filling))
    }

    /// The pages the reserve holds (`Ready` and `Filling`).
    fn held_ahead(&self) -> usize {
        self.slots.iter().filter(|s| s.reserved()).count()
    }

    /// A slot (or several) left the table: a vacant slot may be there again.
    pub(in crate::owned::buffer) fn slots_removed(&mut self) {
        self.reserve.removals = self.reserve.removals.wrapping_add(1);
    }

    /// Marks the next slot the worker is to fill (`Filling`): the first vacant slot of the
    /// reserve's page size, aligned to it, at or after the cursor, wrapping round the budget once.
    /// `None` where the reserve is stopped, holds its bound, keeps a fault, or finds no slot.
    pub(in crate::owned::buffer) fn next_fill(&mut self) -> Option<(usize, usize)> {
        let (at, size, index, held) = self.vacant_fill()?;
        self.slots.insert(
            index,
            Slot {
                offset: at,
                size,
                epoch: 0,
                page: Page::Filling,
            },
        );
        // The pages held before, and the one marked just now.
        let now = held.saturating_add(1) as u64;
        self.stats.reserve_peak_pages = self.stats.reserve_peak_pages.max(now);
        Some((at, size))
    }

    /// Whether the worker has a slot to fill now ([`next_fill`](Table::next_fill) would mark
    /// one): a map that took a page of the reserve wakes it only then.
    pub(in crate::owned::buffer) fn fill_pending(&mut self) -> bool {
        self.vacant_fill().is_some()
    }

    /// The slot [`next_fill`](Table::next_fill) marks: its offset, size and index in the table,
    /// and the pages the reserve holds before it is marked. Where none is vacant, no search is
    /// made again until a slot leaves the table.
    fn vacant_fill(&mut self) -> Option<(usize, usize, usize, usize)> {
        let Reserve {
            bound,
            size,
            removals,
            full_at,
            ..
        } = self.reserve;
        if full_at == Some(removals) {
            return None;
        }
        if !self.reserving() || self.reserve.fault.is_some() || size == 0 {
            return None;
        }
        let held = self.held_ahead();
        if held >= bound {
            return None;
        }
        let vacant = self.vacant_slot();
        if vacant.is_none() {
            self.reserve.full_at = Some(removals);
        }
        vacant.map(|(at, size, index)| (at, size, index, held))
    }

    /// The first vacant slot of the reserve's size at or after the cursor, wrapping round the
    /// budget once: its offset, size and index in the table.
    fn vacant_slot(&self) -> Option<(usize, usize, usize)> {
        let Reserve {
            size,
            budget,
            cursor,
            ..
        } = self.reserve;
        let start = cursor.div_ceil(size).saturating_mul(size);
        let mut at = start;
        let mut wrapped = false;
        loop {
            let end = at.saturating_add(size);
            if end > budget || at == usize::MAX {
                if wrapped || start == 0 {
                    return None;
                }
                wrapped = true;
                at = 0;
                continue;
            }
            if wrapped && at >= start {
                return None;
            }
            let first = self.slots.partition_point(|s| Span::end(s) <= at);
            match self.slots.get(first) {
                Some(next) if next.offset < end => {
                    at = Span::end(next).div_ceil(size).saturating_mul(size);
                }
                _ => {
                    let index = insertion_point(&self.slots, at, end).ok()?;
                    return Some((at, size, index));
                }
            }
        }
    }

    /// The worker's fill of the slot at `offset` is done: `Ready` with its page, `Ungranted`, or a
    /// hole again, its fault kept for the next map that would have used the reserve.
    pub(in crate::owned::buffer) fn filled(&mut self, offset: usize, fill: Fill<P>) {
        let Some(index) = self.filling_at(offset) else {
            return;
        };
        let fault = match fill {
            Fill::Ready(page) => {
                bump(&mut self.stats.reserve_created);
                self.set_page(index, Page::Ready(page));
                return;
            }
            Fill::Ungranted(page, error) => {
                let epoch = self.count_mapped();
                if let Some(slot) = self.slots.get_mut(index) {
                    slot.page = Page::Ungranted(page);
                    slot.epoch = epoch;
                }
                error
            }
            Fill::Refused(error) => {
                self.slots.remove(index);
                self.slots_removed();
                error
            }
        };
        bump(&mut self.stats.reserve_faults);
        self.reserve.fault = Some(fault);
    }

    /// The index of the `Filling` slot at `offset`.
    fn filling_at(&self, offset: usize) -> Option<usize> {
        self.slot_at(offset)
            .filter(|&i| matches!(self.slots.get(i).map(|s| &s.page), Some(Page::Filling)))
    }

    fn set_page(&mut self, index: usize, page: Page<P>) {
        if let Some(slot) = self.slots.get_mut(index) {
            slot.page = page;
        }
    }

    /// The fault of the reserve's last fill, taken: the worker fills again.
    pub(in crate::owned::buffer) fn take_fault(&mut self) -> Option<Error> {
        self.reserve.fault.take()
    }

    /// Takes the reserve's page at `[offset, end)` for the buffer, where one is there, of exactly
    /// that range, and `fits` (its device): it turns `Live`, with no driver call, and counts as a
    /// page mapped. Whether it did.
    pub(in crate::owned::buffer) fn take_ready(
        &mut self,
        offset: usize,
        end: usize,
        fits: impl Fn(&P) -> bool,
    ) -> bool {
        let Some(index) = self.slot_at(offset) else {
            return false;
        };
        let ready = self.slots.get(index).is_some_and(|s| {
            Span::end(s) == end && matches!(&s.page, Page::Ready(page) if fits(page))
        });
        if !ready {
            return false;
        }
        let epoch = self.count_mapped();
        if let Some(slot) = self.slots.get_mut(index) {
            if let Page::Ready(page) = core::mem::replace(&mut slot.page, Page::Evicted) {
                slot.page = Page::Live(page);
            }
            slot.epoch = epoch;
        }
        bump(&mut self.stats.pages_mapped);
        bump(&mut self.stats.reserve_taken);
        self.moved_cursor(end);
        true
    }

    /// A page of the buffer ends at `end` now: the reserve fills after it.
    pub(in crate::owned::buffer) fn moved_cursor(&mut self, end: usize) {
        self.reserve.cursor = end;
    }

    /// Takes every page of the reserve that shares a byte with `[start, end)` out of the table (a
    /// trim, or a map of another size or device there): `(offset, size, page)` each, for the
    /// caller to unmap and release, under the same lock. Each counts as a reserve page released.
    pub(in crate::owned::buffer) fn take_reserve(
        &mut self,
        start: usize,
        end: usize,
    ) -> Vec<(usize, usize, P)> {
        let mut taken = Vec::new();
        let mut at = self.slots.partition_point(|s| Span::end(s) <= start);
        while let Some(slot) = self.slots.get(at) {
            if slot.offset >= end {
                break;
            }
            if !matches!(slot.page, Page::Ready(_)) {
                at = at.saturating_add(1);
                continue;
            }
            let slot = self.slots.remove(at);
            self.slots_removed();
            if let Page::Ready(page) = slot.page {
                bump(&mut self.stats.reserve_released);
                taken.push((slot.offset, slot.size, page));
            }
        }
        taken
    }

    /// The events of the retires that wait, cloned, for the reserve's worker to query without
    /// the lock ([`retiring::finished`](super::super::retiring::finished)); no driver call.
    pub(in crate::owned::buffer) fn retire_queries(&self) -> Vec<Query> {
        self.retires.queries()
    }

    /// Takes the pages of the retires `done`, which the worker's queries found finished (those
    /// still waiting: a map or a `reclaim` may have taken some meanwhile): those that can be are
    /// recycled in place into the reserve (`Ready`; `fits` says which pages are of the reserve's
    /// kind), the others marked `Releasing`, for the worker to unmap without the lock:
    /// `(offset, size, page)` each of those. See [`start_release`](Table::start_release).
    pub(in crate::owned::buffer) fn release_finished(
        &mut self,
        done: &[Ticket],
        fits: impl Fn(&P) -> bool,
    ) -> Vec<(usize, usize, P)> {
        let tickets = self.retires.take(done);
        self.start_release(&tickets, fits)
    }

    /// Takes the pages of the finished retires `tickets` (every event of theirs completed) out of
    /// their retire: each is recycled in place where it can be, else marked `Releasing`, for the
    /// worker to unmap without the lock and then release, or map again into the reserve: `(offset,
    /// size, page)` each of those.
    ///
    /// **Recycled in place** (`Retired` to `Ready`, no driver call): a page stays mapped at its own
    /// offset and becomes a page of the reserve, which a map of exactly its range and device then
    /// takes, where
    /// - the reserve runs and holds fewer pages than its bound (`Ready` and `Filling` counted, the
    ///   pages recycled here included): it never holds more. A refused fill's fault, which stops
    ///   the fills until a map returns it, does not stop this: no page is made;
    /// - the page is the reserve's kind: of its page size, and `fits` (the worker's answer: owned
    ///   by the buffer, not a share of a shared page, of the reserve's device and allocation
    ///   options, not exportable to another process, never exported as a dma-buf);
    /// - it is granted the current access set: retired `Live` (not `Ungranted`), not by an
    ///   eviction (whose range is evicted once the page is gone), and after the last change of
    ///   the access set ([`access_changing`](Table::access_changing));
    /// - it lies where the worker fills next: inside the bound's worth of pages after the cursor,
    ///   wrapping round the budget as the fills do ([`ahead_of_cursor`](Table::ahead_of_cursor)).
    ///   A page behind the cursor would hold room that the slots the next maps use need: its
    ///   memory is better unmapped and mapped again there.
    ///
    /// Sound because every event of its retire has completed, each recorded after all the work
    /// queued before the retire on its stream (with no lend left in progress), so no queued work
    /// uses the page; no view, lend or export made before the retire reaches it (the retire ended
    /// them), and a page of the reserve is refused by every check, as a hole is; a map that takes
    /// it counts as a new page mapped (a new epoch), so no lend made before reaches it either. Its
    /// bytes are what the buffer's work last wrote there: data of this process, never of another.
    pub(in crate::owned::buffer) fn start_release(
        &mut self,
        tickets: &[Ticket],
        fits: impl Fn(&P) -> bool,
    ) -> Vec<(usize, usize, P)> {
        let mut held = self.held_ahead();
        let mut taken = Vec::new();
        for index in 0..self.slots.len() {
            let Some(slot) = self.slots.get(index) else {
                break;
            };
            let Some(ticket) = tickets
                .iter()
                .copied()
                .find(|&t| slot.retired_by(t).is_some())
            else {
                continue;
            };
            let in_place =
                held < self.reserve.bound && self.recyclable_in_place(slot, ticket, &fits);
            let Some(slot) = self.slots.get_mut(index) else {
                break;
            };
            match core::mem::replace(&mut slot.page, Page::Filling) {
                Page::Retired { page, .. } if in_place => {
                    slot.page = Page::Ready(page);
                    held = held.saturating_add(1);
                    bump(&mut self.stats.reserve_recycled_in_place);
                    self.stats.reserve_peak_pages = self.stats.reserve_peak_pages.max(held as u64);
                }
                Page::Retired {
                    page,
                    evicted,
                    granted,
                    ..
                } => {
                    slot.page = Page::Releasing {
                        ticket,
                        evicted,
                        granted,
                    };
                    taken.push((slot.offset, slot.size, page));
                }
                other => slot.page = other,
            }
        }
        taken
    }

    /// Whether the page of `slot`, retired by `ticket` whose events have all completed, can be
    /// recycled in place (room under the bound aside): see [`start_release`](Table::start_release).
    fn recyclable_in_place(
        &self,
        slot: &Slot<P>,
        ticket: Ticket,
        fits: impl Fn(&P) -> bool,
    ) -> bool {
        self.reserves_kind(slot, ticket, fits) && self.ahead_of_cursor(slot.offset)
    }

    /// Whether the page of `slot`, retired by `ticket`, is a page the running reserve could hold:
    /// of its page size, `fits`, retired granted and not by an eviction, after the last access
    /// change. Where it lies aside.
    fn reserves_kind(&self, slot: &Slot<P>, ticket: Ticket, fits: impl Fn(&P) -> bool) -> bool {
        let granted_now = self.stale_grants.is_none_or(|stale| ticket > stale);
        self.reserving()
            && granted_now
            && slot.size == self.reserve.size
            && matches!(
                &slot.page,
                Page::Retired { page, evicted: false, granted: true, .. } if fits(page)
            )
    }

    /// A map of exactly `[offset, end)` where a retired page lies whose retire has finished
    /// (`finished` asks the retires, last, and only where the page is of the reserve's kind and
    /// `fits` the map) but which the worker has not taken yet: the map takes it where it is,
    /// `Live` again with no VMM call, as though the worker had recycled it in place and the map
    /// then taken it (it counts as both, and as a page mapped, at a new epoch). Whether it did.
    /// Sound for the reasons of [`start_release`](Table::start_release); the retire stays with
    /// the worker, which finds this page no longer retired and takes its other pages.
    pub(in crate::owned::buffer) fn take_retired(
        &mut self,
        offset: usize,
        end: usize,
        fits: impl Fn(&P) -> bool,
        finished: impl FnOnce(&Retires, Ticket) -> bool,
    ) -> bool {
        let Some(index) = self.slot_at(offset) else {
            return false;
        };
        let ticket = self.slots.get(index).and_then(|slot| match slot.page {
            Page::Retired { ticket, .. }
                if Span::end(slot) == end && self.reserves_kind(slot, ticket, &fits) =>
            {
                Some(ticket)
            }
            _ => None,
        });
        if !ticket.is_some_and(|ticket| finished(&self.retires, ticket)) {
            return false;
        }
        let epoch = self.count_mapped();
        if let Some(slot) = self.slots.get_mut(index) {
            if let Page::Retired { page, .. } = core::mem::replace(&mut slot.page, Page::Evicted) {
                slot.page = Page::Live(page);
            }
            slot.epoch = epoch;
        }
        bump(&mut self.stats.reserve_recycled_in_place);
        bump(&mut self.stats.reserve_taken);
        bump(&mut self.stats.pages_mapped);
        self.moved_cursor(end);
        true
    }

    /// Whether a page of the reserve at `offset` lies where the worker fills next: less than the
    /// bound's worth of pages after the fills' start (the cursor, rounded up to the page size; 0
    /// where no page fits after it), counted round the budget as the fills wrap.
    fn ahead_of_cursor(&self, offset: usize) -> bool {
        let Reserve {
            bound,
            size,
            budget,
            cursor,
            ..
        } = self.reserve;
        if size == 0 || offset >= budget {
            return false;
        }
        let mut start = cursor.div_ceil(size).saturating_mul(size);
        if start.saturating_add(size) > budget {
            start = 0;
        }
        let distance = if offset >= start {
            offset.saturating_sub(start)
        } else {
            offset.saturating_add(budget.saturating_sub(start))
        };
        distance < bound.saturating_mul(size)
    }

    /// The worker's release of the page at `offset` is done: the range is a hole (or evicted)
    /// again, its memory released or, `Ok(true)`, kept to be mapped again into the reserve (recycled); or,
    /// where the driver refused the unmap (`Err` with the page), retired again, for the drop to
    /// try.
    pub(in crate::owned::buffer) fn released(&mut self, offset: usize, outcome: Result<bool, P>) {
        let Some(index) = self.slot_at(offset) else {
            return;
        };
        let Some(Page::Releasing {
            ticket,
            evicted,
            granted,
        }) = self.slots.get(index).map(|s| &s.page)
        else {
            return;
        };
        let (ticket, evicted, granted) = (*ticket, *evicted, *granted);
        match outcome {
            Ok(recycled) => {
                if recycled {
                    bump(&mut self.stats.reserve_recycled);
                } else {
                    bump(&mut self.stats.pages_released);
                    bump(&mut self.stats.released_in_background);
                }
                if evicted {
                    self.set_page(index, Page::Evicted);
                } else {
                    self.slots.remove(index);
                    self.slots_removed();
                }
            }
            Err(page) => self.set_page(
                index,
                Page::Retired {
                    page,
                    ticket,
                    evicted,
                    granted,
                },
            ),
        }
    }

    /// Puts back a page of the reserve whose unmap the driver refused, as an `Ungranted` page of
    /// the buffer: still mapped, so no other page goes there, no view reaches it, and the next
    /// unmap of its range or the drop unmaps it.
    pub(in crate::owned::buffer) fn keep_unreleased(
        &mut self,
        offset: usize,
        size: usize,
        page: P,
    ) {
        let end = offset.saturating_add(size);
        if let Ok(index) = insertion_point(&self.slots, offset, end) {
            self.put_mapped(index, offset, size, Page::Ungranted(page));
        }
    }

    /// Counts the worker's driver calls, made without the lock.
    pub(in crate::owned::buffer) fn count_calls(&mut self, maps: u64, grants: u64, unmaps: u64) {
        let stats = &mut self.stats;
        stats.map_calls = stats.map_calls.saturating_add(maps);
        stats.set_access_calls = stats.set_access_calls.saturating_add(grants);
        stats.unmap_calls = stats.unmap_calls.saturating_add(unmaps);
    }
}
