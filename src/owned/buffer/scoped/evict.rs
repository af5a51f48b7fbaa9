//! Eviction and restore ordered on a stream of a scope: [`ScopedBuffer::evict`] queues the copies
//! of a range's pages to pinned host memory and retires the pages behind them, with no host wait,
//! so that an engine puts a range to sleep inside its one long scope; [`ScopedBuffer::restore`]
//! maps new pages at the same addresses and queues the copies back. The bytes in flight belong to
//! an [`EvictedInFlight`], which gives the host nothing until the copies have completed.

use core::ffi::c_void;
use core::fmt;
use core::ops::{Range, RangeBounds};
use std::sync::PoisonError;

use super::super::evict::{Evicted, NotRestored};
use super::super::page::{Memory, Piece};
use super::super::retire::not_capturing;
use super::super::retiring::EachStream;
use super::super::{BUDGET, VirtualBuffer};
use super::ScopedBuffer;
use crate::error::Error;
use crate::stream::{Event, PinnedBuffer, ScopedStream, Stream};
use crate::view::range_bounds;
use crate::vmm::access::{AccessMode, ReadWrite};

/// The bytes of a range evicted inside a scope ([`ScopedBuffer::evict`]), while the copies that
/// write them may still run: pinned host memory that a DMA writes, and an event recorded after the
/// copies. It gives the host no access to the bytes (a Rust reference to them would be a data race
/// with the DMA); [`wait`](EvictedInFlight::wait) turns it into an [`Evicted`] once the copies have
/// completed, which [`ScopedBuffer::restore`] or, after the scope,
/// [`VirtualBuffer::restore`] maps back.
///
/// It has no lifetime: it leaves the scope's closure as its value, and after the scope (which has
/// waited for every stream) `wait` returns at once. Dropping it waits for the copies (the crate's
/// one wait) before the pinned memory is freed, and the range then stays evicted, its bytes lost;
/// forgetting it (`mem::forget`) leaks the pinned memory, which the DMA may go on writing, and is
/// otherwise harmless.
///
/// # Examples
/// ```no_run
/// use cuda_vmm::{Context, Device, ReadWrite, Stream, VirtualBuffer};
///
/// # fn main() -> cuda_vmm::Result<()> {
/// let device = Device::get(0)?;
/// let stream = Stream::new(&Context::new(device)?)?;
/// let mut cache = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
/// cache.grow(device, 2 << 20)?;
/// let asleep = cuda_vmm::scope(|s| {
///     let cache = cache.in_scope(s);
///     cache.evict(s.on(&stream), ..2 << 20) // queued: returns at once
/// })?;
/// let evicted = asleep.wait()?; // at once: the scope has waited for the copy
/// assert_eq!(evicted.len(), 2 << 20);
/// cache.restore(evicted)?;
/// # Ok(())
/// # }
/// ```
///
/// The bytes are not read before the copies have completed:
/// ```compile_fail,E0599
/// # use cuda_vmm::{Context, Device, ReadWrite, Stream, VirtualBuffer};
/// # fn main() -> cuda_vmm::Result<()> {
/// # let device = Device::get(0)?;
/// # let stream = Stream::new(&Context::new(device)?)?;
/// # let mut cache = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
/// # cache.grow(device, 2 << 20)?;
/// cuda_vmm::scope(|s| {
///     let asleep = cache.in_scope(s).evict(s.on(&stream), ..)?;
///     let first = asleep.host_bytes()[0]; // the DMA may still be writing it
///     Ok(())
/// })?;
/// # Ok(())
/// # }
/// ```
pub struct EvictedInFlight {
    /// `Some` until [`wait`](EvictedInFlight::wait) or the drop takes it. Its pinned bytes are
    /// written by the queued copies until `done` has completed: nothing reads them before.
    evicted: Option<Evicted>,
    /// Recorded on the copies' stream after the last of them.
    done: Event,
}

impl fmt::Debug for EvictedInFlight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EvictedInFlight")
            .field("evicted", &self.evicted)
            .field("done", &self.done)
            .finish()
    }
}

impl EvictedInFlight {
    /// The byte ranges of the evicted pages (counted from the buffer's base), in address order, as
    /// [`Evicted::ranges`].
    #[must_use]
    pub fn ranges(&self) -> impl ExactSizeIterator<Item = Range<usize>> + '_ {
        self.evicted
            .as_ref()
            .map_or(&[][..], |e| &e.pieces[..])
            .iter()
            .map(|p| p.offset..p.end())
    }

    /// The bytes evicted (the sum of the pages' sizes).
    #[must_use]
    pub fn len(&self) -> usize {
        self.evicted.as_ref().map_or(0, Evicted::len)
    }

    /// Whether no byte was evicted (never: an eviction takes at least one page).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `cuEventQuery` — whether the copies have completed, without waiting: then
    /// [`wait`](EvictedInFlight::wait) returns at once.
    ///
    /// # Errors
    /// The driver's error other than `CUDA_ERROR_NOT_READY` (which is `Ok(false)`).
    ///
    /// # Examples
    /// ```no_run
    /// # use cuda_vmm::{Context, Device, ReadWrite, Stream, VirtualBuffer};
    /// # fn main() -> cuda_vmm::Result<()> {
    /// # let device = Device::get(0)?;
    /// # let stream = Stream::new(&Context::new(device)?)?;
    /// # let mut cache = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// # cache.grow(device, 2 << 20)?;
    /// cuda_vmm::scope(|s| {
    ///     let asleep = cache.in_scope(s).evict(s.on(&stream), ..)?;
    ///     while !asleep.is_complete()? {
    ///         // ... queue the next step's work ...
    ///     }
    ///     let evicted = asleep.wait()?; // no wait left
    ///     # drop(evicted);
    ///     Ok(())
    /// })?;
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuEventQuery")]
    pub fn is_complete(&self) -> Result<bool, Error> {
        self.done.is_complete()
    }

    /// `cuEventSynchronize` — wait until the copies have completed (the crate's one wait, which
    /// holds under stream capture) and give the bytes as an [`Evicted`].
    ///
    /// # Errors
    /// A sticky error of earlier asynchronous work (the copies may not have run): the bytes are
    /// dropped then, the work having stopped.
    ///
    /// # Examples
    /// ```no_run
    /// # use cuda_vmm::{Context, Device, ReadWrite, Stream, VirtualBuffer};
    /// # fn main() -> cuda_vmm::Result<()> {
    /// # let device = Device::get(0)?;
    /// # let stream = Stream::new(&Context::new(device)?)?;
    /// # let mut cache = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// # cache.grow(device, 2 << 20)?;
    /// # cache.slice_bytes_mut::<u8>(..)?.copy_from_host(&vec![3; 2 << 20])?;
    /// cuda_vmm::scope(|s| {
    ///     let asleep = cache.in_scope(s).evict(s.on(&stream), ..)?;
    ///     let evicted = asleep.wait()?; // waits for the copy only
    ///     assert!(evicted.host_bytes().iter().all(|&b| b == 3));
    ///     Ok(())
    /// })?;
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuEventSynchronize")]
    pub fn wait(mut self) -> Result<Evicted, Error> {
        self.done.synchronize()?;
        self.evicted.take().ok_or(Error::InvalidArgument {
            what: "an eviction in flight whose bytes were taken already",
        })
    }
}

impl Drop for EvictedInFlight {
    fn drop(&mut self) {
        if let Some(evicted) = self.evicted.take() {
            // The copies may still write the pinned bytes: they are freed only once the copies have
            // completed. The one wait returns only then, or once the context is proven to run no
            // more work (a sticky error), or aborts the process; its error is ignored, since `drop`
            // cannot return it and the memory is safe to free either way.
            let _ = self.done.synchronize();
            drop(evicted);
        }
    }
}

impl<'scope> ScopedBuffer<'scope, ReadWrite> {
    /// `cuMemcpyDtoHAsync`, `cuEventRecord` — evict the pages inside the byte range `bytes` while
    /// the scope's work runs, with no host wait: copies of their bytes to pinned host memory are
    /// queued on `on`, after the work queued there so far, and the pages are retired behind them.
    /// Returns an [`EvictedInFlight`], which holds the bytes once the copies have completed.
    ///
    /// At once, the range is evicted (as by [`VirtualBuffer::evict`]): no view, no lend of a view
    /// made before (a [`DeviceInFlight`](crate::stream::DeviceInFlight) or
    /// [`Rewritable`](crate::stream::Rewritable)) and no new page reaches it
    /// ([`Error::PageRange`] naming the evicted bytes), and the claims of the scope on it are
    /// forgotten. The pages are retired as by [`retire`](ScopedBuffer::retire): an event on every
    /// stream of the scope, recorded after the copies and after the work queued so far (and after
    /// every lend in progress has queued its work), and the pages are unmapped and released once
    /// every event has completed, by [`reclaim`](ScopedBuffer::reclaim), a later grow, map, retire,
    /// eviction or restore, or the buffer's drop. Free device memory rises only then, by the pages'
    /// size; until then they count in [`mapped_bytes`](ScopedBuffer::mapped_bytes) and
    /// [`retired_bytes`](ScopedBuffer::retired_bytes).
    ///
    /// The copies read the bytes as work on `on` sees them: writes queued on `on` before, by any
    /// thread, are in them; work on another stream that writes the range is ordered before the
    /// eviction by the caller (an [`Event`] recorded there that `on` waits for), as for any read of
    /// a [`DeviceInFlight`](crate::stream::DeviceInFlight) on another stream. Unordered, the
    /// evicted bytes are unspecified; no memory is used after its release either way.
    ///
    /// # Errors
    /// Before any driver call: [`Error::OutOfBounds`]; [`Error::PageRange`] as for
    /// [`VirtualBuffer::evict`] (a page cut by the range, no page in it, a page retired, not
    /// granted, or shared), which includes a range whose eviction is still in flight (its pages are
    /// retired); [`Error::StreamRefused`] for a stream of another scope; [`Error::NoPeerAccess`]
    /// where `on`'s device is not in the access set. [`Error::StreamCapturing`] where a stream of
    /// the scope is capturing a graph. Then the driver's error of the pinning (nothing is changed),
    /// or of a copy or its event: `on` is waited for (the crate's one wait) so that no copy writes
    /// the freed pinned memory, and the range is as it was, its pages neither evicted nor retired.
    /// A refused record of the retire's events is made up for as in
    /// [`retire`](ScopedBuffer::retire): every stream of the scope is waited for, and the handle
    /// holds the bytes.
    ///
    /// # Examples
    /// Put a range to sleep behind the kernel that reads it, in the middle of a scope:
    /// ```no_run
    /// use cuda_vmm::{Context, Device, Error, ReadWrite, Stream, VirtualBuffer};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let stream = Stream::new(&Context::new(device)?)?;
    /// let page = 2 << 20;
    /// let mut cache = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// cache.grow(device, 2 * page)?;
    /// cuda_vmm::scope(|s| {
    ///     let work = s.on(&stream);
    ///     let cache = cache.in_scope(s);
    ///     // ... kernels queued on `work` over the first page ...
    ///     let asleep = cache.evict(work, ..2 * page)?; // returns at once
    ///     assert!(matches!(cache.read::<u8>(..page), Err(Error::PageRange { .. })));
    ///     let evicted = asleep.wait()?;
    ///     cache.reclaim()?; // the pages are released once the scope's streams have passed
    ///     Ok(())
    /// })?;
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuMemcpyDtoHAsync")]
    #[doc(alias = "cuEventRecord")]
    pub fn evict(
        &self,
        on: ScopedStream<'scope>,
        bytes: impl RangeBounds<usize>,
    ) -> Result<EvictedInFlight, Error> {
        let buffer: &VirtualBuffer<ReadWrite> = self.buffer;
        let (start, end) = range_bounds(bytes, buffer.budget, BUDGET)?;
        let streams = self.streams;
        let each: EachStream<'_> =
            &|f: &mut dyn FnMut(&Stream) -> Result<(), Error>| streams.each(f);
        self.check_stream(on)?;
        // One retire, eviction or restore at a time: the pages checked here stay as they are until
        // they are marked below (nothing else removes or retires a page through `&self`).
        let _one_at_a_time = buffer
            .one_retire
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Checked, pinned, then checked again and marked: a page mapped into a hole of the range
        // meanwhile is evicted too (pinning again; holes are finitely many).
        let (pieces, mut host, done, retire) = loop {
            let pieces = {
                let mut table = buffer.lock();
                table.reclaim_finished();
                let pieces = table.evictable(start, end)?;
                check_reach(buffer, on, &pieces)?;
                pieces
            };
            let total = pieces.iter().try_fold(0usize, |sum, p| {
                sum.checked_add(p.size).ok_or(Error::Overflow {
                    what: "evicted bytes",
                })
            })?;
            // SAFETY: the queued copies write all `total` bytes (the pieces one after another)
            // before the handle gives them to the host (only once `done`, recorded after the
            // copies, has completed without error); otherwise `host` is dropped unread.
            let host = unsafe { PinnedBuffer::<u8>::unfilled(on.context(), total)? };
            let done = Event::new(on.context())?;
            let mut table = buffer.lock();
            if table.evictable(start, end)? != pieces {
                continue;
            }
            // `evictable` found pages there, under this lock, so the retire takes them.
            let retire = table
                .retire(start, end, true, || not_capturing(each))?
                .ok_or(Error::PageRange {
                    start,
                    end,
                    problem: "hold no page to evict",
                })?;
            break (pieces, host, done, retire);
        };
        // Every lend admitted before the marking has queued its work once this returns: the copies
        // below come after every write queued on `on` so far.
        let drained = buffer.wait_for_lends(retire.lends);
        let host_ptr = host.as_mut_ptr();
        let queued = drained
            .and_then(|()| queue_downloads(buffer, on, &pieces, host_ptr, &done))
            .and_then(|()| {
                // A capture begun meanwhile may have taken the copies as nodes of its graph.
                if on.is_capturing()? {
                    Err(Error::StreamCapturing {
                        what: "a capture began on the eviction's stream while its copies were \
                               queued",
                    })
                } else {
                    Ok(())
                }
            });
        if let Err(error) = queued {
            // The copies queued so far write `host`: it is freed only after them. The one wait
            // returns only once they have finished, or their capture is ended (or aborts); its
            // error adds nothing.
            let _ = on.synchronize();
            buffer.lock().unretire(retire.ticket);
            return Err(error);
        }
        // From here the queued copies write `host`: it is owned by the handle, whose drop waits for
        // them, before anything else can fail.
        let in_flight = EvictedInFlight {
            evicted: Some(Evicted {
                buffer: buffer.id,
                pieces,
                bytes: host,
            }),
            done,
        };
        buffer.lock().evicting(start, end, in_flight.ranges().len());
        // A refused record has waited for every stream: the copies have completed, and the pages
        // are released at the next reclaim. The bytes are kept (see `# Errors`).
        let _ = buffer.lock().record(retire.ticket, each);
        Ok(in_flight)
    }

    /// `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`, `cuMemcpyHtoDAsync` — restore the pages of
    /// `evicted` while the scope's work runs, with no host wait: new memory of the same sizes and
    /// devices is created, mapped at the same addresses and granted (host-side calls, as
    /// [`grow`](ScopedBuffer::grow) makes), and the copies of the bytes back are queued on `on`.
    /// The pinned bytes are kept by the buffer until an event recorded on `on` after the copies has
    /// completed (freed by a later reclaim, or the buffer's drop, which waits).
    ///
    /// The handle comes from [`evict`](ScopedBuffer::evict) (through
    /// [`EvictedInFlight::wait`]) or [`VirtualBuffer::evict`] of this buffer. The pages an eviction
    /// retired must have been released first: the new pages take their addresses.
    ///
    /// The restored bytes are written by work queued on `on`: [`read`](ScopedBuffer::read) and
    /// [`write`](ScopedBuffer::write) give views of the range again, and work queued later on `on`
    /// sees the bytes; work on another stream sees them once ordered after the copies (an
    /// [`Event`] recorded on `on` that the stream waits for), as for any queued write. Views made
    /// before the eviction are never lent again (their pages were released; the new ones are
    /// mapped after them).
    ///
    /// # Errors
    /// A [`NotRestored`] holding the error and the handle back, unchanged; the buffer is then as it
    /// was (the range still evicted). Before any driver call: [`Error::InvalidArgument`] for a
    /// handle of another buffer; [`Error::StreamRefused`] for a stream of another scope;
    /// [`Error::NoPeerAccess`] where `on`'s device is not in the access set;
    /// [`Error::PageRange`] where the range is not evicted (the handle was restored already) or its
    /// retired pages are not released yet (their work has not finished: try again later).
    /// [`Error::StreamCapturing`] where `on` is capturing a graph. Then the driver's error, e.g.
    /// [`DriverError::OUT_OF_MEMORY`](crate::DriverError::OUT_OF_MEMORY) from `cuMemCreate`. A
    /// refused map, grant, copy or record undoes the pages mapped so far, after waiting for `on`
    /// where copies were queued (the crate's one wait).
    ///
    /// # Examples
    /// Sleep and wake a range inside one scope:
    /// ```no_run
    /// use cuda_vmm::{Context, Device, ReadWrite, Stream, VirtualBuffer};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let stream = Stream::new(&Context::new(device)?)?;
    /// let mut cache = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// cache.grow(device, 2 << 20)?;
    /// cuda_vmm::scope(|s| {
    ///     let work = s.on(&stream);
    ///     let cache = cache.in_scope(s);
    ///     let evicted = cache.evict(work, ..)?.wait()?;
    ///     cache.reclaim()?; // the old page is released: its work has finished
    ///     cache.restore(work, evicted)?; // returns at once; the copy is queued on `work`
    ///     let slot = cache.write::<u8>(..)?; // lent again, after the copy on `work`
    ///     # drop(slot);
    ///     Ok(())
    /// })?;
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuMemCreate")]
    #[doc(alias = "cuMemMap")]
    #[doc(alias = "cuMemSetAccess")]
    #[doc(alias = "cuMemcpyHtoDAsync")]
    pub fn restore(&self, on: ScopedStream<'scope>, evicted: Evicted) -> Result<(), NotRestored> {
        match self.restore_on(on, &evicted) {
            Ok(done) => {
                // The copies read `evicted.bytes` until `done` has completed: the buffer keeps them
                // until then, as a retire of no page.
                self.buffer.lock().keep_until(done, evicted.bytes);
                Ok(())
            }
            Err(error) => Err(NotRestored { error, evicted }),
        }
    }

    /// The restore, up to the copies queued: the event recorded after them.
    fn restore_on(&self, on: ScopedStream<'scope>, evicted: &Evicted) -> Result<Event, Error> {
        let buffer: &VirtualBuffer<ReadWrite> = self.buffer;
        if evicted.buffer != buffer.id {
            return Err(Error::InvalidArgument {
                what: "an Evicted handle of another buffer: it is restored only into the buffer \
                       it was evicted from",
            });
        }
        self.check_stream(on)?;
        let pieces = &evicted.pieces;
        let _one_at_a_time = buffer
            .one_retire
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        {
            // Once the reserve's worker has finished a release under way: an evicted range whose
            // page it is releasing is restorable, as without a reserve.
            let mut table = buffer.shared.settled();
            table.reclaim_finished();
            table.check_still_evicted(pieces.iter().map(|p| p.offset..p.end()))?;
            check_reach(buffer, on, pieces)?;
            table.check_restorable(pieces.iter().map(|p| p.offset..p.end()))?;
        }
        let memories = buffer.memories_for(pieces)?;
        let mut table = buffer.lock();
        if on.is_capturing()? {
            return Err(Error::StreamCapturing {
                what: "a restore's copies are not queued on a capturing stream: the graph could \
                       run them after the scope",
            });
        }
        // Mapped under the lock, which is held until the copies are queued: no view or lend
        // reaches the new pages before.
        for (index, (piece, memory)) in pieces.iter().zip(memories).enumerate() {
            let mapped =
                table.restore(piece, Memory::Own(memory), &buffer.access, ReadWrite::FLAGS);
            if let Err(error) = mapped {
                // The refused piece too: where undoing its grant failed, its page stayed.
                table.unrestore(pieces.get(..=index).unwrap_or(pieces));
                return Err(error);
            }
        }
        let done = match table.spare_event(on.context()) {
            Ok(event) => event,
            Err(error) => {
                table.unrestore(pieces);
                return Err(error);
            }
        };
        let queued = queue_uploads(buffer, on, evicted, &done).and_then(|()| {
            if on.is_capturing()? {
                Err(Error::StreamCapturing {
                    what: "a capture began on the restore's stream while its copies were queued",
                })
            } else {
                Ok(())
            }
        });
        if let Err(error) = queued {
            // The copies queued so far read the pinned bytes and write the new pages: both stay
            // until they have finished (the one wait; its error adds nothing).
            let _ = on.synchronize();
            table.unrestore(pieces);
            return Err(error);
        }
        table.restored(pieces, true);
        Ok(done)
    }

    /// `Err` unless `on` is a stream of this buffer's scope, which the retires record their events
    /// on and the scope waits for.
    fn check_stream(&self, on: ScopedStream<'scope>) -> Result<(), Error> {
        if self.streams.registered(on.id()) {
            Ok(())
        } else {
            Err(Error::StreamRefused {
                why: "a scoped buffer evicts and restores only on a stream of its scope (`Scope::on`), \
                      which its retires record their events on",
            })
        }
    }
}

/// `Err(NoPeerAccess)` unless `on`'s device is in `buffer`'s access set: every page is granted to
/// it then, and the stream copies its bytes directly.
fn check_reach(
    buffer: &VirtualBuffer<ReadWrite>,
    on: ScopedStream<'_>,
    pieces: &[Piece],
) -> Result<(), Error> {
    let device = on.device();
    if buffer.access.iter().any(|c| c.device() == device) {
        return Ok(());
    }
    Err(Error::NoPeerAccess {
        device: device.as_raw(),
        owner: pieces.first().map_or(-1, |p| p.device.as_raw()),
    })
}

/// `cuMemcpyDtoHAsync` of each piece into `host` (the pieces one after another), on `on`, then
/// `cuEventRecord` of `done` after them.
fn queue_downloads(
    buffer: &VirtualBuffer<ReadWrite>,
    on: ScopedStream<'_>,
    pieces: &[Piece],
    host: *mut u8,
    done: &Event,
) -> Result<(), Error> {
    if on.is_capturing()? {
        return Err(Error::StreamCapturing {
            what: "an eviction's copies are not queued on a capturing stream: the graph could \
                   write the host memory after its release",
        });
    }
    let mut at = 0usize;
    for piece in pieces {
        // SAFETY: the piece is a whole page of the buffer, mapped and granted to `on`'s device
        // (checked), retired: it is released only after an event recorded on every stream of the
        // scope after this copy (`on` among them, checked) has completed. `host` is the start of
        // the eviction's pinned memory, as many bytes as the pieces, one after another: the copy
        // writes `[at, at + size)` of it, which no Rust reference reaches (the `EvictedInFlight`
        // that owns it gives the host nothing until `done` has completed, and its drop waits for
        // `done` before freeing it; a failed eviction waits for `on` before freeing it).
        unsafe {
            on.copy_to_host_raw(
                host.wrapping_add(at).cast::<c_void>(),
                buffer.base.wrapping_add(piece.offset as u64),
                piece.size,
            )?;
        }
        at = at.saturating_add(piece.size);
    }
    on.record(done)
}

/// `cuMemcpyHtoDAsync` of each piece's bytes of `evicted` into its new page, on `on`, then
/// `cuEventRecord` of `done` after them.
fn queue_uploads(
    buffer: &VirtualBuffer<ReadWrite>,
    on: ScopedStream<'_>,
    evicted: &Evicted,
    done: &Event,
) -> Result<(), Error> {
    let mut at = 0usize;
    for piece in &evicted.pieces {
        let to = at.saturating_add(piece.size);
        let host = evicted.bytes.get(at..to).ok_or(Error::Overflow {
            what: "evicted bytes",
        })?;
        // SAFETY: the piece's new page was just mapped and granted to `on`'s device (checked), and
        // its range is still marked evicted, so no view or lend reaches it; it is released only by
        // a later retire, eviction or unmap, each ordered after this copy. `host` is `piece.size`
        // bytes of the handle's pinned memory, which nothing writes (`Evicted` gives `&[u8]`
        // only) and which the buffer keeps until an event recorded after this copy (`done`) has
        // completed, or frees only after waiting for `on` where this restore fails.
        unsafe {
            on.copy_from_host_raw(
                buffer.base.wrapping_add(piece.offset as u64),
                host.as_ptr().cast::<c_void>(),
                piece.size,
            )?;
        }
        at = to;
    }
    on.record(done)
}
