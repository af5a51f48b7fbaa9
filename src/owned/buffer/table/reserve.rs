//! The page table's reserve: pages made ahead of need by a worker thread at the next vacant slots
//! after the last page mapped, and retired pages the worker releases. The transitions here make no
//! driver call: the worker marks a range (`Filling`, `Releasing`) under the lock, makes its driver
//! calls without it, and hands the outcome back ([`filled`](Table::filled),
//! [`released`](Table::released)). Part of the table's module: the states are in `table.rs`.

use crate::error::Error;
use crate::owned::pages::{Span, insertion_point};

use super::super::retiring::Ticket;
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
        };
    }

    /// Asks the worker to stop: [`next_fill`](Table::next_fill) gives it nothing more, and
    /// [`stopping`](Table::stopping) tells it to return.
    pub(in crate::owned::buffer) fn stop_reserve(&mut self) {
        self.reserve.stopping = true;
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

    /// Marks the next slot the worker is to fill (`Filling`): the first vacant slot of the
    /// reserve's page size, aligned to it, at or after the cursor, wrapping round the budget once.
    /// `None` where the reserve is stopped, holds its bound, keeps a fault, or finds no slot.
    pub(in crate::owned::buffer) fn next_fill(&mut self) -> Option<(usize, usize)> {
        let Reserve {
            bound,
            size,
            budget,
            cursor,
            ..
        } = self.reserve;
        if !self.reserving() || self.reserve.fault.is_some() || size == 0 {
            return None;
        }
        let held = self.held_ahead();
        if held >= bound {
            return None;
        }
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
                    self.slots.insert(
                        index,
                        Slot {
                            offset: at,
                            size,
                            epoch: 0,
                            page: Page::Filling,
                        },
                    );
                    let now = held.saturating_add(1) as u64;
                    self.stats.reserve_peak_pages = self.stats.reserve_peak_pages.max(now);
                    return Some((at, size));
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
            if let Page::Ready(page) = slot.page {
                bump(&mut self.stats.reserve_released);
                taken.push((slot.offset, slot.size, page));
            }
        }
        taken
    }

    /// Marks the pages of the finished retires `tickets` `Releasing`, for the worker to unmap and
    /// release without the lock: `(offset, size, page)` each.
    pub(in crate::owned::buffer) fn start_release(
        &mut self,
        tickets: &[Ticket],
    ) -> Vec<(usize, usize, P)> {
        let mut taken = Vec::new();
        for slot in &mut self.slots {
            let Some(ticket) = tickets
                .iter()
                .copied()
                .find(|&t| slot.retired_by(t).is_some())
            else {
                continue;
            };
            if let Page::Retired {
                page,
                evicted,
                granted,
                ..
            } = core::mem::replace(&mut slot.page, Page::Filling)
            {
                slot.page = Page::Releasing {
                    ticket,
                    evicted,
                    granted,
                };
                taken.push((slot.offset, slot.size, page));
            }
        }
        taken
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
            let epoch = self.count_mapped();
            self.slots.insert(
                index,
                Slot {
                    offset,
                    size,
                    epoch,
                    page: Page::Ungranted(page),
                },
            );
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
