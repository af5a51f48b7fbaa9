//! Stream-ordered release: a retired page gives no view and takes no new page, and is unmapped and
//! released once an event recorded after the work queued before the retire has completed.

use core::sync::atomic::Ordering;
use std::sync::PoisonError;

use crate::error::Error;
use crate::stream::lend::Tracker;
use crate::stream::{Stream, StreamId};
use crate::view::range_bounds;
use crate::vmm::access::AccessMode;

use super::retiring::EachStream;
use super::{BUDGET, VirtualBuffer};

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
        self.retire_range(start, end, Some(&|f| f(stream)))
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
        self.table_mut().reclaim()
    }

    /// Retires the pages inside `[start, end)` after the work queued so far on each stream `each`
    /// names (`Some`), or until the end of the scope whose handle calls it (`None`: no event and
    /// no capture check, since no event is recorded and the scope's wait, which the release waits
    /// for, holds under capture). Locks the table itself (for the checks and the marking, and for
    /// the events where there are any).
    pub(super) fn retire_range(
        &self,
        start: usize,
        end: usize,
        each: Option<EachStream<'_>>,
    ) -> Result<usize, Error> {
        let _one_at_a_time = self
            .one_retire
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let retire = {
            let mut table = self.lock();
            table.reclaim_here();
            let admit = || each.map_or(Ok(()), not_capturing);
            let Some(retire) = table.retire(start, end, false, admit)? else {
                return Ok(0);
            };
            if each.is_none() {
                // Finished only once the scope has ended, after every lend of it.
                table.retire_at_scope_end(retire.ticket);
            }
            retire
        };
        // With no event, the retires that follow still need the two lend generations kept apart
        // (each waits for the slot the one before turned from).
        self.wait_for_lends(retire.lends)?;
        let Some(each) = each else {
            return Ok(retire.pages);
        };
        let mut table = self.lock();
        let recorded = table.record(retire.ticket, each);
        // The reserve's worker, if any, releases the pages once the events have completed.
        self.shared.wake_worker(&table);
        recorded.map(|()| retire.pages)
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

// The page table of a buffer lent to a scope admits each lend of one of its views.
impl<M: AccessMode> Tracker for VirtualBuffer<M> {
    fn admit(&self, ptr: u64, bytes: usize, epoch: u64) -> Result<usize, Error> {
        let (start, end) = self.offsets(ptr, bytes)?;
        let table = self.lock();
        let slot = table.admit(start, end, epoch)?;
        // Counted under the lock: a retire turns the generation under it too.
        self.count_lend(slot);
        Ok(slot)
    }

    fn admit_write(
        &self,
        ptr: u64,
        bytes: usize,
        epoch: u64,
        stream: StreamId,
    ) -> Result<usize, Error> {
        let (start, end) = self.offsets(ptr, bytes)?;
        let mut table = self.lock();
        let slot = table.admit_write(start, end, epoch, stream)?;
        // Counted under the lock, as `admit`'s.
        self.count_lend(slot);
        drop(table);
        Ok(slot)
    }

    fn done(&self, slot: usize) {
        if let Some(count) = self.lending.get(slot) {
            count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl<M: AccessMode> VirtualBuffer<M> {
    /// The offsets `[start, end)` of the view of `bytes` at `ptr`.
    pub(super) fn offsets(&self, ptr: u64, bytes: usize) -> Result<(usize, usize), Error> {
        let start = ptr
            .checked_sub(self.base)
            .and_then(|offset| usize::try_from(offset).ok())
            .ok_or(Error::Overflow {
                what: "view address",
            })?;
        let end = start.checked_add(bytes).ok_or(Error::Overflow {
            what: "view address + size",
        })?;
        Ok((start, end))
    }

    /// Counts a lend admitted in `slot`; the caller holds the table's lock, under which a retire or
    /// a read back turns the generation and then waits for the old slot.
    fn count_lend(&self, slot: usize) {
        if let Some(count) = self.lending.get(slot) {
            count.fetch_add(1, Ordering::AcqRel);
        }
    }
}
