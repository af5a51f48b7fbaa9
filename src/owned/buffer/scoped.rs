//! [`ScopedBuffer`]: a [`VirtualBuffer`] lent to a scope, which grows, lends views of its pages to
//! queued work and retires pages while the work runs, never waiting on the host.

use core::fmt;
use core::ops::RangeBounds;

use bytemuck::Pod;

use super::retiring::EachStream;
use super::{BUDGET, BufferStats, PageInfo, VirtualBuffer};
use crate::device::{Context, Device};
use crate::error::Error;
use crate::owned::shared::SharedPage;
use crate::stream::Rewritable;
use crate::stream::lend::{Origin, Registry};
use crate::stream::{DeviceInFlight, Scope, Stream};
use crate::view::{DeviceSlice, Reach, range_bounds};
use crate::vmm::access::{AccessMode, ReadWrite};

mod evict;
mod graph;
mod read_back;

pub use evict::EvictedInFlight;

/// A [`VirtualBuffer`] lent to one [`scope`](crate::scope) for all of it, so that its pages change
/// while the scope's work runs: it grows, lends views of its pages to queued work, and retires pages
/// after the work queued so far, with no host wait and no end of the scope. An engine's whole loop
/// runs in one scope: pages come and go between its steps.
///
/// Made by [`VirtualBuffer::in_scope`]; a `Copy` handle, shared with threads that queue work too.
///
/// - **Views are lendables, not slices.** [`read`](ScopedBuffer::read) gives a [`DeviceInFlight`],
///   [`write`](ScopedBuffer::write) a [`Rewritable`]: values that only queued work on the scope's
///   streams takes (as arguments of [`ScopedStream`](crate::stream::ScopedStream)'s copies and
///   launches), checked again at every lend: a view of a retired page is refused then
///   ([`Error::PageRange`]), also through the [`DeviceInFlight`](crate::stream::DeviceInFlight) of
///   a write to it. They give the host nothing.
/// - **Exclusive writes, at run time.** A range lent by `write` shares no byte with another range
///   lent by `write` or `read` in the same scope, and `read` refuses bytes lent by `write`: checked
///   before any driver call, with the shared bytes named. Any number of reads share bytes. A range
///   written once is written again through the same [`Rewritable`], ordered after its last write.
/// - **Reads after writes** ([`read_back`](ScopedBuffer::read_back)): bytes written in the scope are
///   read by later work as one view over any range, ordered after every write to them (the crate
///   records an event on each writer's stream and the reading stream waits for it); the writes'
///   claims end there, and a write after a read back is refused. A block freed in the scope is
///   lent again for writing by [`reuse`](ScopedBuffer::reuse), behind every earlier use of it.
/// - **Growth** ([`grow`](ScopedBuffer::grow), [`map_page`](ScopedBuffer::map_page)) maps pages into
///   unmapped ranges, which disturbs no lent view.
/// - **Retire** ([`retire`](ScopedBuffer::retire)) records an event on every stream of the scope,
///   after all the work queued so far (and after every lend in progress has queued its work); the
///   pages are released once every event has completed: by [`reclaim`](ScopedBuffer::reclaim), a
///   later grow, map or retire, or the buffer's drop, which waits. Free memory rises only then.
///   [`retire_at_scope_end`](ScopedBuffer::retire_at_scope_end) records no event: its pages are
///   released (or recycled by a reserve) once the scope has ended.
/// - **Eviction** ([`evict`](ScopedBuffer::evict)) queues copies of a range's pages to pinned host
///   memory on one stream of the scope and retires the pages behind them: the range is evicted at
///   once (no view, lend or page reaches it), the bytes come in an
///   [`EvictedInFlight`](super::EvictedInFlight) once the copies have completed, and
///   [`restore`](ScopedBuffer::restore) maps new pages at the same addresses and queues the copies
///   back, all with no host wait: an engine sleeps and wakes a range inside its one long scope.
///
/// Only work on a stream of the scope ([`Scope::on`]) takes its views: a retire orders its release
/// after those streams, so a view lent elsewhere (to a cudarc scope, say) is refused
/// ([`Error::StreamRefused`]).
///
/// # Lifetimes
/// `'scope` is the scope's: the buffer is borrowed exclusively for all of it, so no
/// [`VirtualBuffer::slice_bytes`] view (which no retire could reach) lives meanwhile.
///
/// # Examples
/// Grow, write, read and retire while the work runs, in one scope:
/// ```no_run
/// use cuda_vmm::{Context, Device, PinnedBuffer, ReadWrite, Stream, VirtualBuffer};
///
/// # fn main() -> cuda_vmm::Result<()> {
/// let device = Device::get(0)?;
/// let context = Context::new(device)?;
/// let page = 2 << 20;
/// let mut cache = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
/// let stream = Stream::new(&context)?;
/// let input = PinnedBuffer::from_slice(&context, &vec![7u8; page])?;
/// let mut output = PinnedBuffer::<u8>::zeroed(&context, page)?;
/// cuda_vmm::scope(|s| {
///     let work = s.on(&stream);
///     let cache = cache.in_scope(s);
///     let at = cache.grow(device, page)?; // while nothing waits
///     let mut slot = cache.write::<u8>(at..at + page)?;
///     let written = work.copy_from_host(&mut slot, &input)?;
///     work.copy_to_host(&mut output, written)?;
///     cache.retire(at..at + page)?; // returns at once: released after the copies
///     assert!(work.copy_from_host(&mut slot, &input).is_err()); // retired: refused
///     Ok(())
/// })?;
/// assert!(output.iter().all(|&b| b == 7));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy)]
pub struct ScopedBuffer<'scope, M: AccessMode = ReadWrite> {
    pub(super) buffer: &'scope VirtualBuffer<M>,
    pub(super) streams: &'scope (dyn Registry + 'scope),
}

impl<M: AccessMode> fmt::Debug for ScopedBuffer<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ScopedBuffer").field(self.buffer).finish()
    }
}

impl<M: AccessMode> VirtualBuffer<M> {
    /// Lends the buffer to the scope `scope` for all of it, as a [`ScopedBuffer`]: pages grow, are
    /// lent to queued work and retire while the work runs. No driver call. The claims of an earlier
    /// scope's handle are forgotten, and its retires at the scope's end
    /// ([`retire_at_scope_end`](ScopedBuffer::retire_at_scope_end)) finished (that scope has waited
    /// for its work).
    pub fn in_scope<'scope>(
        &'scope mut self,
        scope: &'scope Scope<'scope, '_>,
    ) -> ScopedBuffer<'scope, M> {
        let mut table = self.lock();
        table.clear_claims();
        // That scope's retires at its end are finished: the worker of a reserve takes them.
        if table.scope_ended() {
            self.shared.wake_worker(&table);
        }
        drop(table);
        ScopedBuffer {
            buffer: self,
            streams: scope.registry(),
        }
    }
}

impl<'scope, M: AccessMode> ScopedBuffer<'scope, M> {
    /// As [`VirtualBuffer::base`].
    #[must_use]
    pub fn base(&self) -> u64 {
        self.buffer.base()
    }

    /// As [`VirtualBuffer::budget`].
    #[must_use]
    pub fn budget(&self) -> usize {
        self.buffer.budget()
    }

    /// As [`VirtualBuffer::end`].
    #[must_use]
    pub fn end(&self) -> usize {
        self.buffer.end()
    }

    /// As [`VirtualBuffer::mapped_bytes`]: retired pages count until they are released.
    #[must_use]
    pub fn mapped_bytes(&self) -> usize {
        self.buffer.mapped_bytes()
    }

    /// As [`VirtualBuffer::retired_bytes`].
    #[must_use]
    pub fn retired_bytes(&self) -> usize {
        self.buffer.retired_bytes()
    }

    /// As [`VirtualBuffer::evicted_bytes`]: an eviction in the scope counts at once, its pages also
    /// in [`retired_bytes`](ScopedBuffer::retired_bytes) until they are released.
    #[must_use]
    pub fn evicted_bytes(&self) -> usize {
        self.buffer.evicted_bytes()
    }

    /// As [`VirtualBuffer::pages`].
    #[must_use]
    pub fn pages(&self) -> impl ExactSizeIterator<Item = PageInfo> + use<M> {
        self.buffer.pages()
    }

    /// As [`VirtualBuffer::stats`].
    #[must_use]
    pub fn stats(&self) -> BufferStats {
        self.buffer.stats()
    }

    /// As [`VirtualBuffer::grow`]: maps a page after the last one, while the work runs.
    ///
    /// # Errors
    /// As [`VirtualBuffer::grow`].
    #[doc(alias = "cuMemCreate")]
    #[doc(alias = "cuMemMap")]
    #[doc(alias = "cuMemSetAccess")]
    pub fn grow(&self, device: Device, size: usize) -> Result<usize, Error> {
        self.buffer.grow(device, size)
    }

    /// As [`VirtualBuffer::map_page`]: maps a page at `offset`, while the work runs.
    ///
    /// # Errors
    /// As [`VirtualBuffer::map_page`].
    #[doc(alias = "cuMemCreate")]
    #[doc(alias = "cuMemMap")]
    #[doc(alias = "cuMemSetAccess")]
    pub fn map_page(&self, offset: usize, device: Device, size: usize) -> Result<(), Error> {
        self.buffer.map_page(offset, device, size)
    }

    /// As [`VirtualBuffer::map_shared`]: maps one more mapping of a shared page at `offset`, while
    /// the work runs.
    ///
    /// # Errors
    /// As [`VirtualBuffer::map_shared`].
    #[doc(alias = "cuMemMap")]
    #[doc(alias = "cuMemSetAccess")]
    pub fn map_shared(&self, offset: usize, page: &SharedPage) -> Result<(), Error> {
        self.buffer.map_shared(offset, page)
    }

    /// The bytes `bytes` (counted from the base) as `T`s, lent for reading to queued work on the
    /// scope's streams, copied through the first context of the access set: a [`DeviceInFlight`].
    /// No driver call.
    ///
    /// # Errors
    /// As [`VirtualBuffer::slice_bytes`] ([`Error::PageRange`] also for a retired page), and
    /// [`Error::PageRange`] naming the bytes a [`write`](ScopedBuffer::write) of this scope lent
    /// (read them back with [`read_back`](ScopedBuffer::read_back)).
    pub fn read<T: Pod>(
        &self,
        bytes: impl RangeBounds<usize>,
    ) -> Result<DeviceInFlight<'scope, T>, Error> {
        let context = self.buffer.first_context()?;
        self.read_through(bytes, context)
    }

    /// As [`read`](ScopedBuffer::read), with copies made through the context of `device`, which must
    /// be in the access set.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] where `device` is not in the access set; as
    /// [`read`](ScopedBuffer::read) otherwise.
    pub fn read_on<T: Pod>(
        &self,
        device: Device,
        bytes: impl RangeBounds<usize>,
    ) -> Result<DeviceInFlight<'scope, T>, Error> {
        let context = self.buffer.context_of(device)?;
        self.read_through(bytes, context)
    }

    fn read_through<T: Pod>(
        &self,
        bytes: impl RangeBounds<usize>,
        context: &'scope Context,
    ) -> Result<DeviceInFlight<'scope, T>, Error> {
        let (view, origin) = self.lend_range(bytes, context, false)?;
        Ok(DeviceInFlight::new(view, Some(origin)))
    }

    /// Checks `bytes` as a view of `T`s and claims them, for writing or reading: the view and where
    /// it came from.
    fn lend_range<T: Pod>(
        &self,
        bytes: impl RangeBounds<usize>,
        context: &'scope Context,
        write: bool,
    ) -> Result<(DeviceSlice<'scope, T>, Origin<'scope>), Error> {
        let (start, end, len) = self.buffer.element_range::<T>(bytes)?;
        let epoch = self.buffer.lock().claim(start, end, write)?;
        Ok(self.lent_view(start, len, context, epoch))
    }

    /// The view of `len` `T`s from byte `start`, copied through `context`, and where it came from,
    /// for bytes the table has just lent at `epoch` (a claim, a read back or a reuse).
    fn lent_view<T: Pod>(
        &self,
        start: usize,
        len: usize,
        context: &'scope Context,
        epoch: u64,
    ) -> (DeviceSlice<'scope, T>, Origin<'scope>) {
        let buffer: &'scope VirtualBuffer<M> = self.buffer;
        // Every byte is on a page mapped and granted to every device of the access set (checked by
        // the table's lend), `context`'s among them. It stays mapped while `'scope` lasts unless a
        // retire of this handle takes it, and every lend of the view is admitted again by the
        // table first, which refuses it then (`Origin`).
        let view = DeviceSlice::from_granted(
            buffer.base.wrapping_add(start as u64),
            len,
            context,
            Reach::Owned(&buffer.access),
        );
        let origin = Origin {
            pages: buffer,
            streams: self.streams,
            epoch,
        };
        (view, origin)
    }

    /// `cuEventRecord` — retire the pages inside the byte range `bytes` after all the work queued so
    /// far on every stream of the scope, without waiting; returns how many pages were retired. From
    /// now on no view of them is lent (a [`DeviceInFlight`] or [`Rewritable`] of them is refused at
    /// its next lend) and no page is mapped over them; they are unmapped and released once every
    /// event has completed, by [`reclaim`](ScopedBuffer::reclaim), a later grow, map or retire, or
    /// the buffer's drop. The claims on the range are forgotten, so a page mapped there later is
    /// lent anew.
    ///
    /// # Errors
    /// Before any driver call: [`Error::OutOfBounds`], and [`Error::PageRange`] where a page
    /// straddles either end of the range or is retired already. [`Error::StreamCapturing`] where a
    /// stream of the scope is capturing a graph; nothing is retired then. A driver error of a
    /// record: the pages are retired, and released once the scope's streams have been waited for,
    /// which this call did before returning.
    #[doc(alias = "cuEventRecord")]
    pub fn retire(&self, bytes: impl RangeBounds<usize>) -> Result<usize, Error> {
        let buffer = self.buffer;
        let (start, end) = range_bounds(bytes, buffer.budget, BUDGET)?;
        let streams = self.streams;
        let each: EachStream<'_> =
            &|f: &mut dyn FnMut(&Stream) -> Result<(), Error>| streams.each(f);
        buffer.retire_range(start, end, Some(each))
    }

    /// Retire the pages inside the byte range `bytes` until the scope's end: from now on, as after
    /// [`retire`](ScopedBuffer::retire), no view of them is lent, no page is mapped over them and
    /// their claims are forgotten; but no event is recorded, no stream is asked whether it
    /// captures, and the pages are not released while the scope lasts. They are finished once the
    /// scope has ended (its wait has returned, which the buffer's next exclusive borrow proves):
    /// at the next [`in_scope`](VirtualBuffer::in_scope) a reserve's worker recycles them in place
    /// or releases them (and a map of exactly a page's range takes it), and
    /// [`VirtualBuffer::reclaim`], any other call through `&mut` that reclaims, or the drop
    /// releases them. Returns how many pages were retired. No driver call.
    ///
    /// For a loop that runs one scope per batch of steps and retires pages in it: each retire then
    /// costs a table update, where [`retire`](ScopedBuffer::retire) records an event on every
    /// stream of the scope. The memory comes back a scope later; a scope that lasts the engine's
    /// whole life should [`retire`](ScopedBuffer::retire), whose pages are released while it runs.
    ///
    /// # Errors
    /// Before any change: [`Error::OutOfBounds`], and [`Error::PageRange`] where a page straddles
    /// either end of the range or is retired already.
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::{Device, ReadWrite, Stream, VirtualBuffer};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let page = 2 << 20;
    /// let mut kv = VirtualBuffer::new(4 * page, &[device], ReadWrite)?;
    /// let stream = Stream::new(&kv.contexts()[0])?;
    /// cuda_vmm::scope(|s| {
    ///     let (work, cache) = (s.on(&stream), kv.in_scope(s));
    ///     cache.map_page(0, device, page)?;
    ///     let mut slot = cache.write::<u32>(..4096)?;
    ///     work.memset(&mut slot, 0)?;
    ///     assert_eq!(cache.retire_at_scope_end(..page)?, 1); // no event: kept until the end
    ///     assert!(cache.write::<u32>(..4096).is_err()); // retired: refused
    ///     Ok(())
    /// })?;
    /// assert_eq!(kv.reclaim()?, 1); // the scope has ended: released
    /// # Ok(())
    /// # }
    /// ```
    pub fn retire_at_scope_end(&self, bytes: impl RangeBounds<usize>) -> Result<usize, Error> {
        let (start, end) = range_bounds(bytes, self.buffer.budget, BUDGET)?;
        self.buffer.retire_range(start, end, None)
    }

    /// `cuEventQuery`, `cuMemUnmap`, `cuMemRelease` — release the retired pages whose work has
    /// finished, without waiting; as [`VirtualBuffer::reclaim`].
    ///
    /// # Errors
    /// As [`VirtualBuffer::reclaim`].
    #[doc(alias = "cuEventQuery")]
    pub fn reclaim(&self) -> Result<usize, Error> {
        self.buffer.lock().reclaim()
    }
}

impl<'scope> ScopedBuffer<'scope, ReadWrite> {
    /// The bytes `bytes` (counted from the base) as `T`s, lent for writing to queued work on the
    /// scope's streams, exclusively, copied through the first context of the access set: a
    /// [`Rewritable`], which queued work writes again and again. No driver call.
    ///
    /// # Errors
    /// As [`read`](ScopedBuffer::read), and [`Error::PageRange`] naming the bytes another `write` or
    /// `read` of this scope lent.
    pub fn write<T: Pod>(
        &self,
        bytes: impl RangeBounds<usize>,
    ) -> Result<Rewritable<'scope, T>, Error> {
        let context = self.buffer.first_context()?;
        self.write_through(bytes, context)
    }

    /// As [`write`](ScopedBuffer::write), with copies made through the context of `device`, which
    /// must be in the access set.
    ///
    /// # Errors
    /// As [`read_on`](ScopedBuffer::read_on) and [`write`](ScopedBuffer::write).
    pub fn write_on<T: Pod>(
        &self,
        device: Device,
        bytes: impl RangeBounds<usize>,
    ) -> Result<Rewritable<'scope, T>, Error> {
        let context = self.buffer.context_of(device)?;
        self.write_through(bytes, context)
    }

    /// As [`write`](ScopedBuffer::write), for the bytes `bytes` cut into lends of `chunk` `T`s each
    /// (the last shorter where `chunk` does not divide them, as [`slice::chunks`]): one
    /// [`Rewritable`] per chunk, in address order, each claimed, lent, read back and retired on
    /// its own, as if each came from its own `write`. All or none, under one lock and one check of
    /// the pages and claims for all the chunks (a `write` per chunk takes one each): what an
    /// engine lends for the token slots of a page it has just mapped. No driver call.
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for a `chunk` of zero, before anything is claimed; as
    /// [`write`](ScopedBuffer::write) for the whole range otherwise (nothing is claimed then).
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::{Device, ReadWrite, Stream, VirtualBuffer};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let page = 2 << 20;
    /// let mut kv = VirtualBuffer::new(16 * page, &[device], ReadWrite)?;
    /// let stream = Stream::new(&kv.contexts()[0])?;
    /// cuda_vmm::scope(|s| {
    ///     let (work, cache) = (s.on(&stream), kv.in_scope(s));
    ///     cache.map_page(0, device, page)?;
    ///     // The page's 512 token slots of 4 KiB, lent in one call.
    ///     let mut slots = cache.write_chunks::<u32>(..page, 1024)?;
    ///     assert_eq!(slots.len(), 512);
    ///     work.memset(&mut slots[0], 0)?;
    ///     Ok(())
    /// })?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn write_chunks<T: Pod>(
        &self,
        bytes: impl RangeBounds<usize>,
        chunk: usize,
    ) -> Result<Vec<Rewritable<'scope, T>>, Error> {
        let context = self.buffer.first_context()?;
        let (start, end, len) = self.buffer.element_range::<T>(bytes)?;
        let size = size_of::<T>();
        let step = chunk
            .checked_mul(size)
            .filter(|&step| step > 0)
            .ok_or(Error::ZeroSize {
                what: "chunk of a write_chunks",
            })?;
        let epoch = self.buffer.lock().claim_chunks(start, end, step)?;
        let mut lends = Vec::with_capacity(len.div_ceil(chunk));
        for from in (start..end).step_by(step) {
            let count = chunk.min((end - from) / size);
            let (view, origin) = self.lent_view(from, count, context, epoch);
            lends.push(Rewritable {
                view,
                origin: Some(origin),
                stream: None,
            });
        }
        Ok(lends)
    }

    fn write_through<T: Pod>(
        &self,
        bytes: impl RangeBounds<usize>,
        context: &'scope Context,
    ) -> Result<Rewritable<'scope, T>, Error> {
        // The grants are `ReadWrite`, so the memory is writable; the claim makes it exclusive.
        let (view, origin) = self.lend_range(bytes, context, true)?;
        Ok(Rewritable {
            view,
            origin: Some(origin),
            stream: None,
        })
    }
}
