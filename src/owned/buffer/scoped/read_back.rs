//! [`ScopedBuffer::read_back`]: bytes that queued work wrote in a scope, read by later queued work
//! as one view over any range (a sequence's whole history), ordered after every write to them; and
//! [`ScopedBuffer::reuse`]: a block freed by a caching allocator, lent again for writing in the same
//! scope, ordered after every earlier use of it.

use core::ops::RangeBounds;
use std::sync::PoisonError;

use bytemuck::Pod;

use super::super::retire::not_capturing;
use super::super::retiring::EachStream;
use super::ScopedBuffer;
use crate::error::Error;
use crate::stream::{DeviceInFlight, Event, Rewritable, ScopedStream, Stream, StreamId};
use crate::vmm::access::{AccessMode, ReadWrite};

impl<'scope, M: AccessMode> ScopedBuffer<'scope, M> {
    /// `cuEventRecord`, `cuStreamWaitEvent` — the bytes `bytes` (counted from the base) as `T`s,
    /// lent for reading to work queued on `on` after every write queued so far to any of them: the
    /// bytes written in this scope are read back as one view, without a host wait.
    ///
    /// Every range lent by [`write`](ScopedBuffer::write) that shares a byte with `bytes` ends its
    /// write claim here: its [`Rewritable`](crate::stream::Rewritable) is refused at its next write
    /// ([`Error::PageRange`]), and its bytes stay lent for reading until a retire or a
    /// [`reuse`](ScopedBuffer::reuse), so a write and a read of one byte are never unordered (a
    /// write after a read back is refused, not ordered; a reuse orders it after every stream).
    /// The read is ordered after the last write lend of each such range (every write lend in
    /// progress queues its work first): on `on` itself nothing is needed; for another stream, an
    /// event is recorded on it and `on` waits for it. A range read back earlier is ordered after
    /// its writes again. Bytes never written are simply lent for reading.
    ///
    /// The [`DeviceInFlight`] is lent to work on `on` only (another stream is refused,
    /// [`Error::StreamRefused`]: read back again for it), and, like every lend of the buffer, is
    /// refused once its pages are retired. Its copies run in the context of `on`'s device.
    ///
    /// # Errors
    /// Before any claim changes: [`Error::StreamRefused`] where `on` is not a stream of the buffer's
    /// scope; as [`read`](ScopedBuffer::read) for the range (bounds, alignment, pages);
    /// [`Error::DeviceMismatch`] where `on`'s device is not in the access set;
    /// [`Error::StreamCapturing`] where `on` is capturing a graph; [`Error::PageRange`] naming a
    /// range lent for writing that reaches past either end of `bytes` (read a write back whole).
    /// After the claims are read back: [`Error::StreamCapturing`] where a writer's stream is
    /// capturing (its event would be a node of the graph), or a driver error of an event; no view
    /// is returned then, and a new `read_back` of the range orders again.
    ///
    /// # Examples
    /// A sequence's history, written a token at a time on one stream and read back whole on another:
    /// ```no_run
    /// use cuda_vmm::{Context, Device, PinnedBuffer, ReadWrite, Stream, VirtualBuffer};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let context = Context::new(device)?;
    /// let page = 2 << 20;
    /// let mut cache = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// let (append, attend) = (Stream::new(&context)?, Stream::new(&context)?);
    /// let token = PinnedBuffer::from_slice(&context, &[1u32; 256])?;
    /// let mut out = PinnedBuffer::<u32>::zeroed(&context, 4 * 256)?;
    /// cuda_vmm::scope(|s| {
    ///     let (append, attend) = (s.on(&append), s.on(&attend));
    ///     let cache = cache.in_scope(s);
    ///     let at = cache.grow(device, page)?;
    ///     for t in 0..4 {
    ///         let slot = at + t * 1024;
    ///         let mut kv = cache.write::<u32>(slot..slot + 1024)?;
    ///         append.copy_from_host(&mut kv, &token)?;
    ///     }
    ///     // `attend` waits for the four copies on `append`, then reads the history as one view.
    ///     let history = cache.read_back::<u32>(at..at + 4 * 1024, attend)?;
    ///     attend.copy_to_host(&mut out, history)?;
    ///     Ok(())
    /// })?;
    /// assert!(out.iter().all(|&v| v == 1));
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuEventRecord")]
    #[doc(alias = "cuStreamWaitEvent")]
    pub fn read_back<T: Pod>(
        &self,
        bytes: impl RangeBounds<usize>,
        on: ScopedStream<'scope>,
    ) -> Result<DeviceInFlight<'scope, T>, Error> {
        let buffer = self.buffer;
        if !self.streams.registered(on.id()) {
            return Err(Error::StreamRefused {
                why: "a scoped buffer's bytes are read back only for a stream of its scope \
                      (`Scope::on`), which its retires record their events on",
            });
        }
        let (start, end, len) = buffer.element_range::<T>(bytes)?;
        let context = buffer.context_of(on.device())?;
        if on.is_capturing()? {
            return Err(Error::StreamCapturing {
                what: "a read back is not ordered onto a capturing stream: its wait would be a node \
                       of the graph, not a mark of the stream",
            });
        }
        let read_back = {
            // A read back turns the lend generation as a retire does: one at a time.
            let _one_at_a_time = buffer
                .one_retire
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let read_back = buffer.lock().read_back(start, end)?;
            if let Some(old) = read_back.lends {
                // Every write lend admitted before the claims were settled has queued its work now.
                buffer.wait_for_lends(old)?;
            }
            read_back
        };
        self.order_after(&read_back.streams, on)?;
        let (view, origin) = self.lent_view(start, len, context, read_back.epoch);
        Ok(DeviceInFlight::on_stream(view, Some(origin), on.id()))
    }

    /// Orders `on` after the work queued so far on each of `writers` (streams of the scope): an
    /// event recorded on each other stream, which `on` waits for.
    fn order_after(&self, writers: &[StreamId], on: ScopedStream<'scope>) -> Result<(), Error> {
        let mut ordered = 0usize;
        let others = writers.iter().filter(|&&w| w != on.id()).count();
        self.streams.each(&mut |stream| {
            if stream.id() == on.id() || !writers.contains(&stream.id()) {
                return Ok(());
            }
            if stream.is_capturing()? {
                return Err(Error::StreamCapturing {
                    what: "a read back is not ordered after a capturing stream: its event would be \
                           a node of the graph, not a mark of the stream",
                });
            }
            let event = Event::new(stream.context())?;
            stream.record(&event)?;
            on.wait(&event)?;
            ordered = ordered.saturating_add(1);
            // The event may be destroyed now: the driver keeps what the queued wait needs.
            Ok(())
        })?;
        if ordered == others {
            Ok(())
        } else {
            Err(Error::StreamRefused {
                why: "a range was written on a stream the scope no longer names: its read back \
                      cannot be ordered after it",
            })
        }
    }
}

impl<'scope> ScopedBuffer<'scope, ReadWrite> {
    /// `cuEventRecord`, `cuStreamWaitEvent` — lend the bytes `bytes` (counted from the base) again
    /// for writing in this scope, as `T`s, to work on `on`: a block that a caching allocator freed
    /// (written, read back, read) is handed to a new owner without a retire and without a host wait.
    ///
    /// Every claim on the range ends and every handle of its bytes made before — a
    /// [`Rewritable`], a [`DeviceInFlight`] of a write or of a read back, a
    /// [`read`](ScopedBuffer::read) — is refused from now on at its next lend
    /// ([`Error::PageRange`], naming the bytes). `on` is ordered after all the work queued so far on
    /// every stream of the scope (after the lends in progress have queued theirs): an event is
    /// recorded on each other stream and `on` waits for it, so the new writes never overtake an
    /// earlier read or write of the bytes. The [`Rewritable`] is bound to `on`: a write on another
    /// stream needs [`Rewritable::hand_over`] first.
    ///
    /// # Errors
    /// Before any claim changes: as [`read_back`](ScopedBuffer::read_back) for `on` and the range;
    /// [`Error::StreamCapturing`] where a stream of the scope is capturing; [`Error::PageRange`]
    /// naming a range lent for writing that reaches past either end of `bytes` (reuse a block
    /// whole). After: a driver error of an event; the range is lent anew even so, and the
    /// [`Rewritable`] is not returned (a new `reuse` orders again).
    ///
    /// # Examples
    /// A block written, read by a long kernel on another stream, then freed and reused at once:
    /// ```no_run
    /// use cuda_vmm::{Context, Device, PinnedBuffer, ReadWrite, Stream, VirtualBuffer};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let context = Context::new(device)?;
    /// let mut cache = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// let (a, b) = (Stream::new(&context)?, Stream::new(&context)?);
    /// let (first, second) = (
    ///     PinnedBuffer::from_slice(&context, &[1u32; 1024])?,
    ///     PinnedBuffer::from_slice(&context, &[2u32; 1024])?,
    /// );
    /// let mut out = PinnedBuffer::<u32>::zeroed(&context, 1024)?;
    /// cuda_vmm::scope(|s| {
    ///     let (a, b) = (s.on(&a), s.on(&b));
    ///     let cache = cache.in_scope(s);
    ///     let at = cache.grow(device, 2 << 20)?;
    ///     let mut block = cache.write::<u32>(at..at + 4096)?;
    ///     a.copy_from_host(&mut block, &first)?;
    ///     let seen = cache.read_back::<u32>(at..at + 4096, b)?;
    ///     b.copy_to_host(&mut out, seen)?; // reads the 1s
    ///     // Freed: lent again on `a`, which waits for the download on `b` first.
    ///     let mut block = cache.reuse::<u32>(at..at + 4096, a)?;
    ///     a.copy_from_host(&mut block, &second)?;
    ///     Ok(())
    /// })?;
    /// assert!(out.iter().all(|&v| v == 1));
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuEventRecord")]
    #[doc(alias = "cuStreamWaitEvent")]
    pub fn reuse<T: Pod>(
        &self,
        bytes: impl RangeBounds<usize>,
        on: ScopedStream<'scope>,
    ) -> Result<Rewritable<'scope, T>, Error> {
        let buffer = self.buffer;
        if !self.streams.registered(on.id()) {
            return Err(Error::StreamRefused {
                why: "a scoped buffer's bytes are lent again only to a stream of its scope \
                      (`Scope::on`), which its retires record their events on",
            });
        }
        let (start, end, len) = buffer.element_range::<T>(bytes)?;
        let context = buffer.context_of(on.device())?;
        let streams = self.streams;
        let each: EachStream<'_> =
            &|f: &mut dyn FnMut(&Stream) -> Result<(), Error>| streams.each(f);
        not_capturing(each)?;
        let epoch = {
            // A reuse turns the lend generation as a retire does: one at a time.
            let _one_at_a_time = buffer
                .one_retire
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let (epoch, old) = buffer.lock().reuse(start, end, on.id())?;
            // Every lend admitted before the handles were fenced off has queued its work now.
            buffer.wait_for_lends(old)?;
            epoch
        };
        self.streams.each(&mut |stream| {
            if stream.id() == on.id() {
                return Ok(());
            }
            let event = Event::new(stream.context())?;
            stream.record(&event)?;
            on.wait(&event)
        })?;
        // The grants are `ReadWrite`; the new claim makes the bytes exclusive.
        let (view, origin) = self.lent_view(start, len, context, epoch);
        Ok(Rewritable {
            view,
            origin: Some(origin),
            stream: Some(on.id()),
        })
    }
}
