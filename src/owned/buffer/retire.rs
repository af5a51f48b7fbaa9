//! Stream-ordered release: a retired page gives no view and takes no new page, and is unmapped and
//! released once an event recorded after the work queued before the retire has completed.

use core::sync::atomic::Ordering;
use std::sync::PoisonError;

use crate::error::{Error, first_error};
use crate::stream::lend::Tracker;
use crate::stream::{Event, Stream};
use crate::sys;
use crate::view::range_bounds;
use crate::vmm::access::AccessMode;

use super::evict::check_not_evicted;
use super::{BUDGET, Page, Retiring, Table, VirtualBuffer, bump};
use crate::error::check;
use crate::owned::pages::{RETIRED, Span, check_covered_at, pages_inside};

/// Calls its argument with each stream a retire orders its release after; the first error, every
/// stream tried.
pub(super) type EachStream<'a> =
    &'a dyn Fn(&mut dyn FnMut(&Stream) -> Result<(), Error>) -> Result<(), Error>;

/// Events kept for later retires, at most.
const SPARE_EVENTS: usize = 64;

impl<M: AccessMode> VirtualBuffer<M> {
    /// `cuEventRecord` — retire the pages inside the byte range `bytes` after the work queued on
    /// `stream` so far, without waiting: from now on they give no view and take no new page, and
    /// they are unmapped and released once that work has finished, by a later call that reclaims
    /// ([`reclaim`](VirtualBuffer::reclaim), a grow, a map, an unmap, another retire) or by the drop,
    /// which waits. Returns how many pages were retired. The stream comes first, as in every
    /// stream-ordered call of a buffer ([`ScopedBuffer::evict`](crate::owned::ScopedBuffer::evict),
    /// [`ScopedBuffer::restore`](crate::owned::ScopedBuffer::restore)).
    ///
    /// Through `&mut self`, no view of the buffer lives and the work of every scope that lent one has
    /// finished, so this is for work queued on `stream` through raw addresses
    /// ([`DeviceSlice::as_raw_ptr`](crate::DeviceSlice::as_raw_ptr)); inside a scope,
    /// [`ScopedBuffer::retire`](crate::owned::ScopedBuffer::retire) orders the release after the
    /// work of every stream of the scope.
    ///
    /// # Errors
    /// Before any driver call: [`Error::OutOfBounds`], and [`Error::PageRange`] where a page
    /// straddles either end of the range or is retired already. [`Error::StreamCapturing`] where
    /// `stream` is capturing a graph (a recorded event would then be a node of the graph, not a mark
    /// of the stream); nothing is retired then. A driver error of the record: the pages are retired,
    /// and released once the stream has been waited for, which this call did before returning.
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::{Context, Device, ReadWrite, Stream, VirtualBuffer};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let stream = Stream::new(&Context::new(device)?)?;
    /// let mut buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// buffer.grow(device, 2 << 20)?;
    /// // ... kernels queued on `stream` through the page's raw address ...
    /// buffer.retire_after(&stream, ..2 << 20)?; // returns at once
    /// assert_eq!(buffer.retired_bytes(), 2 << 20);
    /// stream.synchronize()?;
    /// assert_eq!(buffer.reclaim()?, 1); // the page is released now
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuEventRecord")]
    pub fn retire_after(
        &mut self,
        stream: &Stream,
        bytes: impl core::ops::RangeBounds<usize>,
    ) -> Result<usize, Error> {
        let (start, end) = range_bounds(bytes, self.budget, BUDGET)?;
        self.retire_range(start, end, &|f| f(stream))
    }

    /// `cuEventQuery`, `cuMemUnmap`, `cuMemRelease` — release the retired pages whose work has
    /// finished, without waiting; returns how many were released. Retires whose work is still
    /// running stay.
    ///
    /// # Errors
    /// The first driver error of an unmap or release (every finished page is tried; a page the
    /// driver refuses to unmap stays retired, and is tried again at the drop). An event whose query
    /// fails keeps its retire until the drop, which waits for it.
    #[doc(alias = "cuEventQuery")]
    pub fn reclaim(&mut self) -> Result<usize, Error> {
        let mut table = self.lock();
        self.reclaim_pages(&mut table)
    }

    /// Reclaims what has finished, ignoring errors (each page is tried again at the drop).
    pub(super) fn reclaim_finished(&self, table: &mut Table) {
        if !table.retiring.is_empty() {
            let _ = self.reclaim_pages(table);
        }
    }

    /// As `reclaim_finished`, through `&mut self`.
    pub(super) fn reclaim_all_finished(&mut self) {
        let mut table = self.lock();
        self.reclaim_finished(&mut table);
    }

    /// Releases the pages of every retire whose events have all completed.
    pub(super) fn reclaim_pages(&self, table: &mut Table) -> Result<usize, Error> {
        let mut released = 0usize;
        let mut first: Result<(), Error> = Ok(());
        let mut index = 0usize;
        while let Some(retire) = table.retiring.get(index) {
            // An event whose query fails is not known complete: its retire waits for the drop.
            let finished = retire
                .events
                .iter()
                .all(|event| event.is_complete().unwrap_or(false));
            if !finished {
                index = index.saturating_add(1);
                continue;
            }
            let retire = table.retiring.remove(index);
            for offset in retire.offsets {
                match self.release_retired(table, offset) {
                    Ok(()) => released = released.saturating_add(1),
                    Err(error) => {
                        if first.is_ok() {
                            first = Err(error);
                        }
                    }
                }
            }
            // Host memory that the finished work read (a restore's source) is freed now.
            drop(retire.host);
            let room = SPARE_EVENTS.saturating_sub(table.spare_events.len());
            table
                .spare_events
                .extend(retire.events.into_iter().take(room));
        }
        first.map(|()| released)
    }

    /// `cuMemUnmap` and `cuMemRelease` of the retired page at `offset`, whose work has finished.
    fn release_retired(&self, table: &mut Table, offset: usize) -> Result<(), Error> {
        let Some(index) = table
            .pages
            .iter()
            .position(|p| p.offset == offset && p.retired)
        else {
            return Ok(());
        };
        let Some(page) = table.pages.get(index) else {
            return Ok(());
        };
        bump(&mut table.stats.unmap_calls);
        let address = self.base.wrapping_add(page.offset as u64);
        // SAFETY: the page's whole mapping, made by `map_at`, unmapped once: it leaves the table
        // below. It is retired, so no view of it has been made or lent since the retire, and every
        // event of its retire has completed, each recorded after all the work queued on its stream
        // before the retire (with no lend left in progress): no queued work uses it any more.
        check(unsafe { sys::cuMemUnmap(address, page.memory.size()) })?;
        let page: Page = table.pages.remove(index);
        bump(&mut table.stats.pages_released);
        Ok(page.memory.release_code()?)
    }

    /// Waits for the work of every retire (each event: the one wait, which returns only once it has
    /// completed, or aborts). Every event is tried; the first error.
    pub(super) fn wait_retires(&mut self) -> Result<(), Error> {
        let table = self.table_mut();
        let retiring = core::mem::take(&mut table.retiring);
        first_error(
            retiring
                .iter()
                .flat_map(|retire| retire.events.iter())
                .map(Event::synchronize),
        )
    }

    /// Retires the pages inside `[start, end)` after the work queued so far on each stream `each`
    /// names. Locks the table itself (twice: for the checks and the marking, and for the events).
    pub(super) fn retire_range(
        &self,
        start: usize,
        end: usize,
        each: EachStream<'_>,
    ) -> Result<usize, Error> {
        let _one_at_a_time = self.retires.lock().unwrap_or_else(PoisonError::into_inner);
        let (offsets, old) = {
            let mut guard = self.lock();
            let table = &mut *guard;
            self.reclaim_finished(table);
            let span = pages_inside(&table.pages, start, end)?;
            let Some(pages) = table.pages.get(span.clone()) else {
                return Ok(0);
            };
            if pages.is_empty() {
                return Ok(0);
            }
            if let Some(page) = pages.iter().find(|p| p.retired) {
                return Err(Error::PageRange {
                    start: page.start(),
                    end: page.end(),
                    problem: RETIRED,
                });
            }
            not_capturing(each)?;
            let marked = mark_retired(table, span);
            table.claims.forget(start, end);
            marked
        };
        self.wait_for_lends(old)?;
        let count = offsets.len();
        self.record_retire(offsets, each).map(|()| count)
    }

    /// Waits until every lend admitted in the generation whose slot is `old` (turned by the caller
    /// while it marked pages, under the lock) has queued its work. The lock is not held here: a
    /// lend in progress may need it for a second view of the same buffer (a copy between two of its
    /// ranges, a launch with several).
    pub(super) fn wait_for_lends(&self, old: usize) -> Result<(), Error> {
        // Every lend admitted before the pages were marked counts in slot `old`, and queues its work
        // before it is uncounted; lends admitted since count in the other slot, and none of them
        // reaches the marked pages.
        let slot = self.lending.get(old).ok_or(Error::Overflow {
            what: "lend generation",
        })?;
        while slot.load(Ordering::Acquire) != 0 {
            std::thread::yield_now();
        }
        Ok(())
    }

    /// `cuEventRecord` on each stream `each` names, after the work queued so far: the pages at
    /// `offsets` (marked retired) are released once every event has completed. A refused record, or
    /// a capture begun meanwhile, waits for every stream here instead (the one wait), and returns
    /// the record's error.
    pub(super) fn record_retire(
        &self,
        offsets: Vec<usize>,
        each: EachStream<'_>,
    ) -> Result<(), Error> {
        let mut guard = self.lock();
        let table = &mut *guard;
        let mut events = Vec::new();
        let spare = &mut table.spare_events;
        let stats = &mut table.stats;
        let recorded = each(&mut |stream| {
            let event = match spare.iter().position(|e| e.device() == stream.device()) {
                Some(index) => spare.swap_remove(index),
                None => Event::new(stream.context())?,
            };
            bump(&mut stats.events_recorded);
            stream.record(&event)?;
            events.push(event);
            Ok(())
        });
        // A record refused, or a capture begun meanwhile (which may have taken the record as a
        // node): the events prove nothing, so every stream is waited for here, by the one wait,
        // which returns only once the work has finished (or aborts).
        let mut captured = false;
        let _ = each(&mut |stream| {
            captured |= stream.is_capturing().unwrap_or(true);
            Ok(())
        });
        if recorded.is_err() || captured {
            let _ = each(&mut |stream| stream.synchronize());
            events.clear();
        }
        table.retiring.push(Retiring {
            offsets,
            events,
            host: None,
        });
        recorded
    }
}

/// `Ok` where no stream `each` names is capturing a graph: a retire's event recorded there would be
/// a node of the graph, not a mark of the stream.
pub(super) fn not_capturing(each: EachStream<'_>) -> Result<(), Error> {
    each(&mut |stream| {
        if stream.is_capturing()? {
            Err(Error::StreamCapturing {
                what: "a retire is not ordered after a capturing stream: its event would be a node \
                       of the graph, not a mark of the stream",
            })
        } else {
            Ok(())
        }
    })
}

/// Marks the pages `table.pages[span]` retired and turns the lend generation: the pages' offsets,
/// and the slot of the generation before (which [`VirtualBuffer::wait_for_lends`] waits on).
pub(super) fn mark_retired(
    table: &mut Table,
    span: core::ops::Range<usize>,
) -> (Vec<usize>, usize) {
    let mut offsets = Vec::with_capacity(span.len());
    for page in table.pages.get_mut(span).into_iter().flatten() {
        page.retired = true;
        offsets.push(page.offset);
        bump(&mut table.stats.pages_retired);
    }
    let old = table.generation % 2;
    table.generation = table.generation.wrapping_add(1);
    (offsets, old)
}

// The page table of a buffer lent to a scope admits each lend of one of its views.
impl<M: AccessMode> Tracker for VirtualBuffer<M> {
    fn admit(&self, ptr: u64, bytes: usize, epoch: u64) -> Result<usize, Error> {
        let start = ptr
            .checked_sub(self.base)
            .and_then(|offset| usize::try_from(offset).ok())
            .ok_or(Error::Overflow {
                what: "view address",
            })?;
        let end = start.checked_add(bytes).ok_or(Error::Overflow {
            what: "view address + size",
        })?;
        let table = self.lock();
        check_not_evicted(&table.evicted, start, end)?;
        check_covered_at(&table.pages, start, end, epoch)?;
        let slot = table.generation % 2;
        if let Some(count) = self.lending.get(slot) {
            count.fetch_add(1, Ordering::AcqRel);
        }
        Ok(slot)
    }

    fn done(&self, slot: usize) {
        if let Some(count) = self.lending.get(slot) {
            count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}
