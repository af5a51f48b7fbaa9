//! Stream-ordered work: [`Stream`], [`Event`], page-locked host memory ([`PinnedBuffer`]), and
//! [`scope`], under which queued copies, memsets and kernel launches borrow what they use until the
//! work has finished. The model, and why it is sound, are documented on [`scope`]. A [`Rewritable`]
//! is memory that queued work writes again and again inside one scope; a [`Graph`] is work captured
//! once ([`Graph::capture`]) that borrows what it uses for as long as it lives, replayed in scopes
//! ([`ScopedStream::launch_graph`]), and parked ([`ParkedGraph`]) while its memory is evicted.

use core::ffi::c_void;
use core::fmt;
use core::ptr;

use crate::device::{Context, Device};
use crate::error::{Error, Result, check};
#[cfg(doc)]
use crate::module::Function;
use crate::sys;
use crate::wait;

// The primitives: events and page-locked host memory (the stream itself is this file).
mod event;
mod pinned;
// What may be lent to queued work: the sealed traits, and what a queued write hands back.
pub(crate) mod lend;
// The scope and its registry of streams.
mod scope;
// Memory a scope's work writes again and again.
mod rewritable;
// What is queued: the operations of a scoped stream, and the kernels' arguments.
mod launch;
mod queue;
// Work captured once and replayed.
mod graph;

pub use event::Event;
pub(crate) use graph::Covers;
pub use graph::{Capture, Graph, KernelNode, NotRebound, ParkedGraph, Rebind};
pub use launch::{KernelArg, KernelArgs};
pub use lend::{DeviceInFlight, HostInFlight, HostSource, HostTarget, ScopedRead, ScopedWrite};
pub use pinned::{PinnedBuffer, PinnedChunks, PinnedSliceMut};
pub use rewritable::Rewritable;
pub use scope::{Scope, ScopedStream, scope};

/// A stream of one device's primary context: the work queued on it runs in order, and alongside the
/// work of other streams. Destroyed on drop (`cuStreamDestroy`).
///
/// Work that touches memory is queued inside [`scope`] (through [`Scope::on`]); recording and
/// waiting for [`Event`]s, which touch no memory, can be queued anywhere.
///
/// A stream keeps its primary context retained, and makes it current before each driver call on the
/// stream, also when dropped (on whichever thread that happens).
pub struct Stream {
    raw: sys::CUstream,
    /// `false` for the legacy default stream, which belongs to the context and is never destroyed.
    owned: bool,
    context: Context,
}

// SAFETY: a `CUstream` is a handle to a driver object, not to thread-local state. The driver API is
// thread-safe and takes a stream on any thread where its context is current, which every method makes
// it first.
unsafe impl Send for Stream {}
// SAFETY: as for `Send`: every method takes `&self` and only passes the handle to thread-safe driver
// calls.
unsafe impl Sync for Stream {}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream")
            .field("raw", &self.raw)
            .field("legacy_default", &!self.owned)
            .field("device", &self.context.device())
            .finish()
    }
}

impl Stream {
    /// `cuStreamCreate` — a new stream of `context`'s device, non-blocking
    /// (`CU_STREAM_NON_BLOCKING`): its work does not wait for the legacy default stream, which the
    /// synchronous copies of this crate use, nor the other way round.
    ///
    /// # Errors
    /// The driver's error, if any.
    #[doc(alias = "cuStreamCreate")]
    pub fn new(context: &Context) -> Result<Stream, Error> {
        let context = Context::new(context.device())?;
        context.bind_to_thread()?;
        let mut raw: sys::CUstream = ptr::null_mut();
        // SAFETY: `raw` is writable for the call; `context` is current (bound just above).
        check(unsafe { sys::cuStreamCreate(&raw mut raw, sys::CU_STREAM_NON_BLOCKING) })?;
        Ok(Stream {
            raw,
            owned: true,
            context,
        })
    }

    /// The legacy default stream of `context` (the NULL stream), as a `Stream`: work queued on it
    /// waits for the work of the context's blocking streams before it, and they for it. The
    /// synchronous copies and [`Function::launch`] of this crate run on it. Dropping the value
    /// leaves the stream, which belongs to the context, as it is.
    ///
    /// # Errors
    /// The driver's error where the primary context cannot be retained.
    pub fn legacy_default(context: &Context) -> Result<Stream, Error> {
        Ok(Stream {
            raw: ptr::null_mut(),
            owned: false,
            context: Context::new(context.device())?,
        })
    }

    /// The device whose primary context the stream belongs to.
    #[must_use]
    pub fn device(&self) -> Device {
        self.context.device()
    }

    /// The retained context the stream belongs to.
    pub(crate) fn context(&self) -> &Context {
        &self.context
    }

    /// The stream's identity: its context and its handle (the null handle of every context's
    /// legacy default stream names a different stream in each).
    pub(crate) fn id(&self) -> StreamId {
        StreamId::new(self.context.as_raw(), self.raw)
    }

    /// The raw `CUstream` (null for the legacy default stream): an escape hatch that owns nothing.
    /// It stays valid while `self` lives; do not destroy it, nor begin a stream capture on it: work
    /// captured into a graph runs when the graph is launched, after any scope has waited for the
    /// stream.
    #[must_use]
    pub fn as_raw(&self) -> sys::CUstream {
        self.raw
    }

    /// `cuStreamSynchronize` — wait until every operation queued on the stream has finished.
    ///
    /// The wait holds under stream capture: it returns, with `Ok` or an error, only once the work
    /// has finished (or the context is proven dead), also while other threads capture graphs, and
    /// it ends a capture of this stream itself (see [When a wait fails](scope#when-a-wait-fails)).
    ///
    /// # Errors
    /// A sticky error left by earlier asynchronous work in the context;
    /// [`Error::StreamCapturing`] where the stream was capturing a graph, which the wait ended.
    #[doc(alias = "cuStreamSynchronize")]
    pub fn synchronize(&self) -> Result<(), Error> {
        wait::stream(self.context.as_raw(), self.raw)
    }

    /// `cuStreamIsCapturing` — whether the stream is capturing a graph (valid or invalidated), its
    /// context bound first and left current.
    pub(crate) fn is_capturing(&self) -> Result<bool, Error> {
        self.context.bind_to_thread()?;
        Ok(wait::is_capturing(self.raw)?)
    }

    /// `cuStreamIsCapturing` — `Ok` where the stream is not capturing a graph: the check before any
    /// work that borrows memory is queued on it (a graph could run that work after the scope). Leaves
    /// the stream's context current, for the enqueue that follows.
    fn admit_work(&self) -> Result<(), Error> {
        if self.is_capturing()? {
            return Err(Error::StreamCapturing {
                what: "work that borrows memory is not queued on a capturing stream: the graph \
                       could run it after the scope",
            });
        }
        Ok(())
    }

    /// `cuEventRecord` — mark the current end of the stream in `event`, which must belong to the
    /// stream's device: the event completes once everything queued on the stream before now has.
    /// Recording again moves the mark; a [`wait`](Stream::wait) already queued keeps the mark it saw.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] for an event of another device (before any driver call); the
    /// driver's error otherwise.
    #[doc(alias = "cuEventRecord")]
    pub fn record(&self, event: &Event) -> Result<(), Error> {
        if event.device() != self.device() {
            return Err(Error::DeviceMismatch {
                expected: self.device().as_raw(),
                found: event.device().as_raw(),
            });
        }
        self.context.bind_to_thread()?;
        // SAFETY: a live event and a live stream (or the legacy default stream) of the current
        // context (same device, and every context of this crate is its device's primary context).
        Ok(check(unsafe { sys::cuEventRecord(event.raw, self.raw) })?)
    }

    /// `cuStreamWaitEvent` — make the work queued on this stream after now wait until `event`
    /// completes (the mark of its latest [`record`](Stream::record)). The event may belong to
    /// another device: this is how work on one GPU waits for work on another. Waiting for an event
    /// that was never recorded waits for nothing. The host does not wait.
    ///
    /// # Errors
    /// The driver's error, if any.
    #[doc(alias = "cuStreamWaitEvent")]
    pub fn wait(&self, event: &Event) -> Result<()> {
        self.context.bind_to_thread()?;
        // SAFETY: a live stream of the current context (bound just above) and a live event, which
        // the driver allows to belong to another context or device. Flags 0.
        check(unsafe { sys::cuStreamWaitEvent(self.raw, event.raw, 0) })?;
        Ok(())
    }

    /// `cuMemcpyHtoDAsync` of `bytes` from `src` to `dst`, queued on this stream.
    ///
    /// # Safety
    /// `dst` must be `bytes` of device memory reachable from the stream's device that nothing else
    /// uses, and `src` `bytes` of readable host memory that nothing writes, both until the copy has
    /// finished (the caller waits for the stream before either can go away).
    pub(crate) unsafe fn copy_from_host_raw(
        &self,
        dst: sys::CUdeviceptr,
        src: *const c_void,
        bytes: usize,
    ) -> Result<()> {
        self.context.bind_to_thread()?;
        // SAFETY: the caller's guarantee for both ranges; the stream belongs to the current context.
        check(unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src, bytes, self.raw) })?;
        Ok(())
    }

    /// `cuMemcpyDtoHAsync` of `bytes` from `src` to `dst`, queued on this stream.
    ///
    /// # Safety
    /// `src` must be `bytes` of device memory reachable from the stream's device that nothing writes,
    /// and `dst` `bytes` of writable host memory that nothing else reads or writes, both until the
    /// copy has finished (the caller waits for the stream before either can be used or go away).
    pub(crate) unsafe fn copy_to_host_raw(
        &self,
        dst: *mut c_void,
        src: sys::CUdeviceptr,
        bytes: usize,
    ) -> Result<()> {
        self.context.bind_to_thread()?;
        // SAFETY: the caller's guarantee for both ranges; the stream belongs to the current context.
        check(unsafe { sys::cuMemcpyDtoHAsync_v2(dst, src, bytes, self.raw) })?;
        Ok(())
    }
}

/// A stream as the driver tells streams apart: its context and its handle. The handle alone is not
/// enough: every context's legacy default stream is the null handle, so two devices' legacy streams
/// would compare equal, and a view lent to one would pass for work on the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct StreamId {
    context: usize,
    handle: usize,
}

impl StreamId {
    /// The stream `handle` (null for the legacy default stream) of `context`.
    pub(crate) fn new(context: sys::CUcontext, handle: sys::CUstream) -> StreamId {
        StreamId {
            context: context.addr(),
            handle: handle.addr(),
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // `cuStreamDestroy` with the stream's context current, on whatever thread drops it; where the
        // context cannot be made current the stream is leaked. Errors are ignored: `drop` cannot
        // return them, and a stream the driver refuses to destroy cannot be destroyed later.
        if self.context.bind_to_thread().is_ok() {
            // SAFETY: a stream this value created, destroyed once, with its context current. Work
            // still queued on it borrows nothing (a scope waits for its work before its borrows end);
            // the driver finishes it before releasing the stream.
            let _ = unsafe { sys::cuStreamDestroy_v2(self.raw) };
        }
    }
}
