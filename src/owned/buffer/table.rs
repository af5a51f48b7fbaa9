//! The page table of a [`VirtualBuffer`](super::VirtualBuffer): what each range of the address
//! budget holds, as one [`Page`] in one state, and every transition between states. This is the
//! only code that changes a page's state; the buffer's faces (its views, retires, evictions,
//! exports and the [`ScopedBuffer`](super::ScopedBuffer)) call the transitions below, and read the
//! table through its methods.
//!
//! | from | to | transition |
//! | --- | --- | --- |
//! | a hole | `Live` | [`map`](Table::map) (`Ungranted` where a refused grant cannot be undone) |
//! | `Live`, `Ungranted` | `Retired` (a ticket) | [`retire`](Table::retire); [`unretire`](Table::unretire) takes it back |
//! | `Retired` | a hole | [`reclaim`](Table::reclaim), once the ticket's events have completed |
//! | `Live` | `Evicted` | [`evict`](Table::evict), the bytes copied out first |
//! | `Live` | `Retired`, evicted | [`retire`](Table::retire) by an eviction in a scope; `reclaim` leaves `Evicted` |
//! | `Evicted` | `Live` | [`restore`](Table::restore); [`unrestore`](Table::unrestore) takes it back |
//! | `Live`, `Ungranted` | a hole | [`unmap`](Table::unmap), [`shrink`](Table::shrink) |
//! | any | nothing | [`teardown`](Table::teardown), after every retire's events |
//! | a hole | `Filling` | [`next_fill`](Table::next_fill): the reserve's worker marks the next vacant slot |
//! | `Filling` | `Ready`, a hole | [`filled`](Table::filled), the worker's page made (or its fault kept) |
//! | `Ready` | `Live` | [`take_ready`](Table::take_ready), a map of its offset, size and device: no driver call |
//! | `Ready` | a hole | [`take_reserve`](Table::take_reserve) (a trim, a map of another size or device) |
//! | `Retired` | `Releasing` | [`start_release`](Table::start_release), its ticket's events complete |
//! | `Retired` | `Ready` | [`start_release`](Table::start_release): recycled in place, where it fits the reserve and its bound: no driver call |
//! | `Retired` | `Live` | [`take_retired`](Table::take_retired): a map of its range, its retire finished, before the worker recycles it in place |
//! | `Releasing` | a hole, `Evicted`, `Retired` | [`released`](Table::released), by the worker's unmap |
//!
//! A grant that fails and cannot be undone leaves an `Ungranted` page, which nothing views and the
//! next unmap (or the drop) unmaps. The reserve's states (`Ready`, `Filling`) are no page of the
//! buffer: every check refuses them as it refuses a hole, naming them; `Releasing` is a retired
//! page to every check. A state added later (a page a
//! graph holds, a range read back after a write) is one more variant of [`Page`] and its
//! transitions, here: the checks every face makes ([`usable`](Table::usable), [`claim`](Table::claim),
//! [`check_vacant`](Table::check_vacant)) then see it at once.

use core::ops::Range;

use crate::device::{Context, Device};
use crate::error::Error;
use crate::owned::pages::{
    Claims, RETIRED, Span, check_covered, check_covered_at, check_not_evicted, insertion_point,
    pages_inside,
};
use crate::stream::{Event, PinnedBuffer};
use crate::vmm::physical::PhysicalAllocation;

use super::page::{Backing, BufferStats, Memory, PageInfo, Piece};
use super::retiring::{EachStream, Retires, Ticket};

mod calls;
mod driver;
mod lends;
mod reserve;
#[cfg(test)]
mod tests;

pub(super) use calls::{Calls, map_at, unmap_and_release, unmap_page};
pub(super) use reserve::Fill;

/// What one range of the budget holds: a page, in one of its states. `P` is what a mapped page
/// holds ([`Backing`]; the unit tests use a stand-in, so the states are tested without a driver).
pub(super) enum Page<P> {
    /// Mapped and granted to the buffer's access set: views and lends cover it.
    Live(P),
    /// Mapped, but neither granted nor unmapped: its grant failed, and so did the unmap that would
    /// have undone it. No view covers it; the next unmap of its range, or the drop, unmaps it.
    Ungranted(P),
    /// Retired by the retire `ticket`: no view, lend or new page reaches it, and it is unmapped and
    /// released once every event of that retire has completed. A page an eviction retired
    /// (`evicted`) leaves its range evicted behind; `granted` is false for a page retired
    /// `Ungranted`.
    Retired {
        page: P,
        ticket: Ticket,
        evicted: bool,
        granted: bool,
    },
    /// No page: the bytes were evicted to host memory (an [`Evicted`](super::Evicted) handle), and
    /// no view, lend or new page reaches the range until a restore maps it again.
    Evicted,
    /// A page of the buffer's reserve, made ahead of need (or a retired page recycled in place,
    /// its retire's work finished): mapped and granted to the access set, but not the buffer's
    /// page yet, so no view, lend, export or registration reaches it. A map of its offset, size
    /// and device takes it (`Live`) with no driver call.
    Ready(P),
    /// A range the reserve's worker has marked and fills without the lock (`cuMemCreate`,
    /// `cuMemMap`, `cuMemSetAccess`): no page in the table yet, and nothing else maps there until
    /// the worker turns it `Ready`, or back into a hole.
    Filling,
    /// A retired page whose events have completed, which the reserve's worker unmaps and releases
    /// without the lock: still mapped until it is done, and a retired page to every check. The
    /// worker hands the page back `Retired` (with `ticket` and `granted`) where the driver refuses
    /// the unmap; `evicted` leaves the range evicted once it is released.
    Releasing {
        ticket: Ticket,
        evicted: bool,
        granted: bool,
    },
}

impl<P> Page<P> {
    /// A mapped page, `Live` where it is granted, else `Ungranted`.
    fn with_grant(page: P, granted: bool) -> Page<P> {
        if granted {
            Page::Live(page)
        } else {
            Page::Ungranted(page)
        }
    }
}

/// What the reserve of a table is asked to hold, and where it stands (its transitions are in
/// `table/reserve.rs`).
#[derive(Default)]
struct Reserve {
    /// The most pages held at once (`Ready` and `Filling`); 0 where there is no reserve.
    bound: usize,
    /// The size of each page of the reserve (a multiple of its device's granularity).
    size: usize,
    /// The buffer's budget: slots lie inside `[0, budget)`.
    budget: usize,
    /// The end of the last page mapped: the worker fills the vacant slots after it.
    cursor: usize,
    /// The refusal of the last fill, kept until a map that would have used the reserve returns it.
    /// The worker makes no page meanwhile.
    fault: Option<Error>,
    /// Set to stop the worker: it makes no more driver calls, and returns.
    stopping: bool,
    /// How many times slots left the table since the reserve started: the only change that can
    /// open a vacant slot (a slot is never made smaller).
    removals: u64,
    /// `removals` when a search found no vacant slot of the reserve's size: until a slot leaves
    /// the table, none is looked for again. A map that takes a page of the reserve asks whether
    /// the worker has a slot to fill ([`fill_pending`](Table::fill_pending)); with every slot
    /// holding a page, the answer then costs no walk over the table (a walk that, after the
    /// driver's launches, found the table out of the processor's caches: about 1.8 µs a map
    /// on one H100).
    full_at: Option<u64>,
}

/// One range of the table: `[offset, offset + size)` and what it holds.
pub(super) struct Slot<P> {
    offset: usize,
    size: usize,
    /// The table's count of pages mapped when this page was mapped: a lend made at an earlier
    /// count never covers it.
    epoch: u64,
    page: Page<P>,
}

impl<P> Span for Slot<P> {
    fn start(&self) -> usize {
        self.offset
    }

    /// `offset + size` was checked against the budget when the page was mapped, so it does not
    /// overflow.
    fn end(&self) -> usize {
        self.offset.saturating_add(self.size)
    }

    fn granted(&self) -> bool {
        matches!(
            self.page,
            Page::Live(_) | Page::Retired { granted: true, .. }
        )
    }

    fn retired(&self) -> bool {
        matches!(self.page, Page::Retired { .. } | Page::Releasing { .. })
    }

    fn evicted(&self) -> bool {
        matches!(
            self.page,
            Page::Evicted
                | Page::Retired { evicted: true, .. }
                | Page::Releasing { evicted: true, .. }
        )
    }

    fn mapped(&self) -> bool {
        !matches!(self.page, Page::Evicted | Page::Ready(_) | Page::Filling)
    }

    fn reserved(&self) -> bool {
        matches!(self.page, Page::Ready(_) | Page::Filling)
    }

    fn epoch(&self) -> u64 {
        self.epoch
    }
}

impl<P> Slot<P> {
    /// The buffer's mapped page's memory: `None` for an evicted range, a page of the reserve and a
    /// page the reserve's worker is releasing.
    fn held(&self) -> Option<&P> {
        match &self.page {
            Page::Live(page) | Page::Ungranted(page) | Page::Retired { page, .. } => Some(page),
            Page::Evicted | Page::Ready(_) | Page::Filling | Page::Releasing { .. } => None,
        }
    }

    /// The retire `ticket`'s page, `Some(evicted)` for it.
    fn retired_by(&self, ticket: Ticket) -> Option<bool> {
        match self.page {
            Page::Retired {
                ticket: t, evicted, ..
            } if t == ticket => Some(evicted),
            _ => None,
        }
    }
}

impl Slot<Backing> {
    /// The page's first byte, counted from the buffer's base.
    pub(super) fn offset(&self) -> usize {
        self.offset
    }

    /// The byte after the page.
    pub(super) fn end(&self) -> usize {
        Span::end(self)
    }

    /// The device whose memory backs the page (`None` for an evicted range).
    pub(super) fn device(&self) -> Option<Device> {
        self.held().map(|b| b.device)
    }

    /// The page's physical allocation (`None` for an evicted range).
    pub(super) fn allocation(&self) -> Option<&PhysicalAllocation> {
        self.held().map(|b| b.memory.allocation())
    }

    fn info(&self) -> Option<PageInfo> {
        let backing = self.held()?;
        Some(PageInfo {
            offset: self.offset,
            size: self.size,
            device: backing.device,
            granted: Span::granted(self),
            retired: Span::retired(self),
        })
    }
}

/// A retire just marked: its ticket, how many pages it took, and the slot of the lend generation
/// before it (which the retire waits on before it records its events).
#[derive(Debug, Clone, Copy)]
pub(super) struct Retire {
    pub(super) ticket: Ticket,
    pub(super) pages: usize,
    pub(super) lends: usize,
}

/// The page table: the pages of one buffer and everything that changes with them, behind the
/// buffer's lock.
pub(super) struct Table<P = Backing> {
    /// The buffer's base address: page `offset` is mapped at `base + offset`.
    base: u64,
    /// Sorted by offset, disjoint, inside `[0, budget)`: every page mapped, retired or evicted.
    slots: Vec<Slot<P>>,
    stats: BufferStats,
    /// The count of pages mapped (and of ranges reused) so far: each page records it, and so does
    /// each lend of a scoped buffer, which then never covers a page mapped, nor a range reused,
    /// after it.
    epoch: u64,
    /// The retires whose pages wait for the GPU.
    retires: Retires,
    /// The ranges a scoped buffer lent, cleared when the next one is made.
    claims: Claims,
    /// Turned by each retire; its parity is the slot of the buffer's lend counts that admissions
    /// count in.
    generation: usize,
    /// The ranges `[start, end)` held by a [`ClaimedRange`](super::ClaimedRange) each, disjoint:
    /// no view of the buffer covers their bytes but the claim's own. Emptied through `&mut` of
    /// the buffer, which proves that no claim lives (a forgotten one left its range here).
    held: Vec<(usize, usize)>,
    /// The reserve: its bound, page size, cursor and fault (`table/reserve.rs`).
    reserve: Reserve,
    /// The last retire's ticket when the access set last changed ([`regrant`](Table::regrant)):
    /// a page retired by it or an earlier one keeps the grants of an older set, and is never
    /// recycled in place into the reserve (whose pages must carry the current set's grants).
    stale_grants: Option<Ticket>,
}

impl<P> Table<P> {
    /// The table of a buffer at `base`, with no page.
    pub(super) fn new(base: u64) -> Table<P> {
        Table {
            base,
            slots: Vec::new(),
            stats: BufferStats::default(),
            epoch: 0,
            retires: Retires::default(),
            claims: Claims::default(),
            generation: 0,
            held: Vec::new(),
            reserve: Reserve::default(),
            stale_grants: None,
        }
    }

    /// The end of the last page or evicted range (0 where there is none): pages of the reserve
    /// are not the buffer's, and do not count.
    pub(super) fn end(&self) -> usize {
        self.slots
            .iter()
            .rev()
            .find(|s| !s.reserved())
            .map_or(0, Span::end)
    }

    /// The counts of the driver calls made on the pages, and what the reserve holds now.
    pub(super) fn stats(&self) -> BufferStats {
        let mut stats = self.stats;
        for slot in self
            .slots
            .iter()
            .filter(|s| matches!(s.page, Page::Ready(_)))
        {
            bump(&mut stats.reserve_pages);
            stats.reserve_bytes = stats.reserve_bytes.saturating_add(slot.size as u64);
        }
        stats
    }

    /// The number of pages mapped (retired ones included).
    pub(super) fn page_count(&self) -> usize {
        self.slots.iter().filter(|s| s.mapped()).count()
    }

    /// The bytes of mapped pages, retired ones included.
    pub(super) fn mapped_bytes(&self) -> usize {
        self.bytes(Span::mapped)
    }

    /// The bytes of retired pages not released yet.
    pub(super) fn retired_bytes(&self) -> usize {
        self.bytes(Span::retired)
    }

    /// The bytes of evicted ranges not restored yet (an eviction's pages, retired, included).
    pub(super) fn evicted_bytes(&self) -> usize {
        self.bytes(Span::evicted)
    }

    fn bytes(&self, counted: impl Fn(&Slot<P>) -> bool) -> usize {
        self.slots
            .iter()
            .filter(|s| counted(s))
            .fold(0usize, |sum, s| sum.saturating_add(s.size))
    }

    /// `Ok` where every byte of `[start, end)` is on a live page (mapped, granted, neither retired
    /// nor evicted): what a view, an export, a registration or a rebind needs. Otherwise the
    /// first evicted range, or else the first hole, retired or ungranted page, named.
    pub(super) fn usable(&self, start: usize, end: usize) -> Result<(), Error> {
        if self.live_run(start, end, u64::MAX) {
            return Ok(());
        }
        check_not_evicted(&self.slots, start, end)?;
        check_covered(&self.slots, start, end)
    }

    /// As [`usable`](Table::usable), for a lend made when the count of mapped pages was `epoch`: a
    /// page mapped later is refused too.
    fn usable_since(&self, start: usize, end: usize, epoch: u64) -> Result<(), Error> {
        if !self.live_run(start, end, epoch) {
            check_not_evicted(&self.slots, start, end)?;
            check_covered_at(&self.slots, start, end, epoch)?;
        }
        // The pages answer above; a reuse's fence is the claims' to answer.
        self.claims.check_fresh(start, end, epoch)
    }

    /// Whether `[start, end)` lies on one run of adjacent `Live` pages mapped at `epoch` or before
    /// (an empty range does): the pages' answer of [`usable_since`](Table::usable_since) in one
    /// pass over the pages it covers, one comparison of the state each, for every lend, view and
    /// registration. Where it is false, the two checks it stands for find the first problem and
    /// name it (every check of the range stays written once, in `owned::pages`). The unit tests
    /// hold the two to the same answer.
    fn live_run(&self, start: usize, end: usize, epoch: u64) -> bool {
        if start >= end {
            return true;
        }
        let first = self.slots.partition_point(|s| Span::end(s) <= start);
        let mut at = start;
        for slot in self.slots.get(first..).unwrap_or_default() {
            if slot.offset > at || slot.epoch > epoch || !matches!(slot.page, Page::Live(_)) {
                return false;
            }
            at = Span::end(slot);
            if at >= end {
                return true;
            }
        }
        false
    }

    /// `Ok` where a new page can take `[offset, end)`: no evicted range, no page (retired or not)
    /// shares a byte with it, else the first named.
    pub(super) fn check_vacant(&self, offset: usize, end: usize) -> Result<(), Error> {
        self.vacant(offset, end).map(drop)
    }

    /// Where a new page `[offset, end)` goes, as [`check_vacant`](Table::check_vacant) checks it.
    fn vacant(&self, offset: usize, end: usize) -> Result<usize, Error> {
        check_not_evicted(&self.slots, offset, end)?;
        insertion_point(&self.slots, offset, end)
    }

    /// Counts a page mapped: the new count, which the page records.
    fn count_mapped(&mut self) -> u64 {
        self.epoch = self.epoch.saturating_add(1);
        self.epoch
    }

    /// Puts the mapped `page` of `[offset, offset + size)` at `index` (where
    /// [`vacant`](Table::vacant) or [`insertion_point`] put it), counted by
    /// [`count_mapped`](Table::count_mapped).
    fn put_mapped(&mut self, index: usize, offset: usize, size: usize, page: Page<P>) {
        let epoch = self.count_mapped();
        self.slots.insert(
            index,
            Slot {
                offset,
                size,
                epoch,
                page,
            },
        );
    }

    /// Retires the pages inside `[start, end)`: `None` where the range holds none. Before any
    /// change, a page cut by the range or retired already is refused, and then `admit` is asked
    /// (whether the streams the retire's events go on take them), whose error retires nothing.
    /// The pages are marked with a new ticket, `evicted` where an eviction retires them; the
    /// claims on the range are forgotten (for a retire; an eviction forgets them once its copies
    /// are queued); the lend generation turns.
    pub(super) fn retire(
        &mut self,
        start: usize,
        end: usize,
        evicted: bool,
        admit: impl FnOnce() -> Result<(), Error>,
    ) -> Result<Option<Retire>, Error> {
        let span = pages_inside(&self.slots, start, end)?;
        let pages = self.slots.get(span.clone()).unwrap_or_default();
        if !pages.iter().any(Span::mapped) {
            return Ok(None);
        }
        if let Some(page) = pages.iter().find(|p| p.retired()) {
            return Err(Error::PageRange {
                start: page.start(),
                end: Span::end(page),
                problem: RETIRED,
            });
        }
        admit()?;
        let ticket = self.retires.ticket();
        let mut count = 0usize;
        for slot in self.slots.get_mut(span).into_iter().flatten() {
            let (page, granted) = match core::mem::replace(&mut slot.page, Page::Evicted) {
                Page::Live(page) => (page, true),
                Page::Ungranted(page) => (page, false),
                other => {
                    slot.page = other;
                    continue;
                }
            };
            slot.page = Page::Retired {
                page,
                ticket,
                evicted,
                granted,
            };
            count = count.saturating_add(1);
            bump(&mut self.stats.pages_retired);
        }
        if !evicted {
            self.claims.forget(start, end);
        }
        let lends = self.generation % 2;
        self.generation = self.generation.wrapping_add(1);
        Ok(Some(Retire {
            ticket,
            pages: count,
            lends,
        }))
    }

    /// Takes the retire `ticket` back (an eviction whose copies were refused): its pages are as they
    /// were before it, neither retired nor evicted. No view reached them meanwhile, and their
    /// claims were kept.
    pub(super) fn unretire(&mut self, ticket: Ticket) {
        for slot in &mut self.slots {
            if slot.retired_by(ticket).is_none() {
                continue;
            }
            if let Page::Retired { page, granted, .. } =
                core::mem::replace(&mut slot.page, Page::Evicted)
            {
                slot.page = Page::with_grant(page, granted);
                self.stats.pages_retired = self.stats.pages_retired.saturating_sub(1);
            }
        }
    }

    /// `Ok` where each of `pieces` (byte ranges) is still an evicted range of the table, whole (a
    /// handle restored already is not restored again).
    pub(super) fn check_still_evicted(
        &self,
        pieces: impl IntoIterator<Item = Range<usize>>,
    ) -> Result<(), Error> {
        for piece in pieces {
            let evicted = self
                .slots
                .iter()
                .any(|s| s.evicted() && s.offset == piece.start && Span::end(s) == piece.end);
            if !evicted {
                return Err(Error::PageRange {
                    start: piece.start,
                    end: piece.end,
                    problem: "are not evicted (the handle was restored already?)",
                });
            }
        }
        Ok(())
    }

    /// `Ok` where every one of `pieces` (evicted ranges) can be mapped again now: no page is there
    /// any more (an eviction's retired page must have been released first).
    pub(super) fn check_restorable(
        &self,
        pieces: impl IntoIterator<Item = Range<usize>>,
    ) -> Result<(), Error> {
        for piece in pieces {
            let first = self.slots.partition_point(|s| Span::end(s) <= piece.start);
            let overlapping = self.slots.get(first..).unwrap_or_default();
            if let Some(page) = overlapping
                .iter()
                .take_while(|s| s.offset < piece.end)
                .find(|s| s.mapped())
            {
                return Err(Error::PageRange {
                    start: page.offset,
                    end: Span::end(page),
                    problem: if page.retired() {
                        RETIRED
                    } else {
                        "are mapped already"
                    },
                });
            }
        }
        Ok(())
    }

    /// The index of the slot that starts at `offset`.
    fn slot_at(&self, offset: usize) -> Option<usize> {
        let index = self.slots.partition_point(|s| s.offset < offset);
        self.slots
            .get(index)
            .filter(|s| s.offset == offset)
            .map(|_| index)
    }
}

impl Table<Backing> {
    /// The pages, in address order (evicted ranges left out).
    pub(super) fn infos(&self) -> Vec<PageInfo> {
        self.slots.iter().filter_map(Slot::info).collect()
    }

    /// The pages that are not retired: those an export hands out.
    pub(super) fn unretired_pages(&self) -> impl Iterator<Item = &Slot<Backing>> {
        self.slots.iter().filter(|s| s.mapped() && !s.retired())
    }

    /// The pages inside `[start, end)`, a page the range would cut refused.
    /// Marks the live pages inside `[start, end)` as pages a dma-buf was exported of: their memory
    /// is released at the end, never made a page again ([`Backing::exported`]).
    pub(super) fn mark_exported(&mut self, start: usize, end: usize) {
        let Ok(span) = pages_inside(&self.slots, start, end) else {
            return;
        };
        for slot in self.slots.get_mut(span).into_iter().flatten() {
            if let Page::Live(backing) = &mut slot.page {
                backing.exported = true;
            }
        }
    }

    pub(super) fn pages_in(
        &self,
        start: usize,
        end: usize,
    ) -> Result<impl Iterator<Item = &Slot<Backing>>, Error> {
        let span = pages_inside(&self.slots, start, end)?;
        let slots = self.slots.get(span).unwrap_or_default();
        Ok(slots.iter().filter(|s| s.mapped()))
    }

    /// The pages inside `[start, end)`, checked for an eviction before any driver call: at least
    /// one, none retired, every one granted and owned by the buffer (not a share).
    pub(super) fn evictable(&self, start: usize, end: usize) -> Result<Vec<Piece>, Error> {
        let pages: Vec<&Slot<Backing>> = self.pages_in(start, end)?.collect();
        if pages.is_empty() {
            return Err(Error::PageRange {
                start,
                end,
                problem: "hold no page to evict",
            });
        }
        let mut pieces = Vec::with_capacity(pages.len());
        for slot in pages {
            let (backing, problem) = match &slot.page {
                Page::Retired { page, .. } => (page, Some(RETIRED)),
                Page::Ungranted(page) => (
                    page,
                    Some(
                        "are mapped but not granted (undoing a failed grant failed): not readable",
                    ),
                ),
                Page::Live(page) if matches!(page.memory, Memory::Shared(_)) => (
                    page,
                    Some(
                        "are a shared page, whose memory its other shares keep: evicting it frees \
                         nothing",
                    ),
                ),
                Page::Live(page) => (page, None),
                Page::Releasing { .. } => {
                    return Err(Error::PageRange {
                        start: slot.offset,
                        end: Span::end(slot),
                        problem: RETIRED,
                    });
                }
                Page::Evicted | Page::Ready(_) | Page::Filling => continue,
            };
            if let Some(problem) = problem {
                return Err(Error::PageRange {
                    start: slot.offset,
                    end: Span::end(slot),
                    problem,
                });
            }
            pieces.push(Piece {
                offset: slot.offset,
                size: slot.size,
                device: backing.device,
            });
        }
        Ok(pieces)
    }

    /// A restore of `pieces` has its bytes back (copied, or their copies queued, `recorded` an
    /// event after them): count them.
    pub(super) fn restored(&mut self, pieces: &[Piece], recorded: bool) {
        for _ in pieces {
            bump(&mut self.stats.pages_restored);
        }
        if recorded {
            bump(&mut self.stats.events_recorded);
        }
    }

    /// `cuEventRecord` on each stream `each` names, after the work queued so far: the pages of
    /// `ticket` are released once every event has completed (see [`Retires::record`]).
    pub(super) fn record(&mut self, ticket: Ticket, each: EachStream<'_>) -> Result<(), Error> {
        self.retires
            .record(ticket, each, &mut self.stats.events_recorded)
    }

    /// Keeps `host` until `done` has completed: the source of a stream-ordered restore's copies,
    /// `done` recorded after them.
    pub(super) fn keep_until(&mut self, done: Event, host: PinnedBuffer<u8>) {
        self.retires.keep_until(done, host);
    }

    /// Whether a retire waits for its events.
    pub(super) fn has_retires(&self) -> bool {
        !self.retires.is_empty()
    }

    /// A spare event of `context`'s device, or a new one.
    pub(super) fn spare_event(&mut self, context: &Context) -> Result<Event, Error> {
        self.retires.spare_event(context)
    }
}

fn bump(count: &mut u64) {
    *count = count.saturating_add(1);
}
