//! Stream-ordered work: [`Stream`], [`Event`], page-locked host memory ([`PinnedBuffer`]), and
//! [`scope`], under which queued copies, memsets and kernel launches borrow what they use until the
//! work has finished.
//!
//! # Why a scope
//! A queued copy or kernel runs after the call that queued it has returned, so whatever it reads
//! or writes must stay alive, mapped and granted, and the host must keep its hands off it, until
//! the GPU is done. Other bindings leave that to the caller, or hand back a "pending" value whose
//! `Drop` waits, which `mem::forget` defeats. Here the wait is a scope, as in
//! [`std::thread::scope`]: [`scope`] runs a closure, lends it [`ScopedStream`]s that queue work
//! borrowing what it uses for the scope's lifetime, and waits for every stream before it returns,
//! in its own frame. The borrow checker then refuses an unmap, a new grant, a drop or a host read
//! of anything lent, for as long as the work can run.
//!
//! ## The model
//! A [`Stream`] runs the work queued on it in order, and alongside other streams' work. Work that
//! reads or writes memory is queued only inside [`scope`], through a [`ScopedStream`], and borrows
//! every view, host slice and kernel it uses for `'scope`, which lasts until `scope` returns; and
//! `scope` returns only after waiting for every stream it queued on. So no queued copy or kernel
//! outlives what it uses: the borrow checker refuses an unmap, a new grant, a drop, or a host
//! access of anything lent to the scope, for as long as the scope runs (the cases in
//! `ui-tests/stream/`).
//!
//! Between streams, [`Event`]s order work: [`Stream::record`] marks a point in one stream,
//! [`Stream::wait`] makes another stream, of any device, wait for it. A writable view is lent to
//! one operation for the rest of the scope, as `&mut` is to one scoped thread; an operation that
//! writes hands back a handle of what it writes, a [`DeviceInFlight`] for device memory or a
//! [`HostInFlight`] for host memory, with which only work queued after it (on the same stream, or
//! behind an event) reads the result. Neither gives the host any access to the bytes, which the
//! queued work may still be writing: a `DeviceInFlight` has no host read, is no source of the
//! synchronous copies (which run on the legacy default stream, which does not wait for the scope's
//! streams), and does not become a [`DeviceSlice`](crate::DeviceSlice). The host reads the results
//! after `scope` has returned, through the views and buffers it lent. To write the same memory
//! again in the scope, lend it as a [`Rewritable`] ([`ScopedStream::rewritable`]), whose writes are
//! ordered on its stream. A kernel that reads many blocks (a sequence's pages) takes them as one
//! argument through a [`BlockTable`], built only from lent views and checked at every launch.
//!
//! ## Why it is sound, also under `mem::forget`
//! The wait is in no value the caller holds. `scope` runs its closure, then waits for every stream
//! registered with the scope, in its own frame: on return, and while a panic unwinds through it (a
//! guard local to `scope`, which the closure never sees). The closure gets only `&'scope Scope`,
//! and a [`ScopedStream`] is a `Copy` handle: forgetting either changes nothing. A "pending copy"
//! value whose `Drop` waited would be unsound, since it could be forgotten while the borrows it
//! held end; there is none. `'scope` is invariant, as in [`std::thread::scope`], so a
//! [`ScopedStream`] can neither leave the closure nor accept a borrow that ends before the wait (a
//! local of the closure, say).
//!
//! # When a wait fails
//! A failed `cuStreamSynchronize` does not by itself mean that the work has stopped. Under stream
//! capture the driver refuses a wait at once, without waiting, and the error (900–908) is not
//! sticky: the work queued before runs on. That happens on a stream that is capturing a graph, and,
//! in CUDA's default `GLOBAL` capture mode, on every thread while any thread captures. So every
//! wait of this crate (this scope's, cudarc's scope's, the ends of
//! [`RevocableAccess`](crate::vmm::RevocableAccess) and [`PeerAccess`](crate::PeerAccess), every
//! synchronous copy, the staged copy, each `synchronize`) goes through one wait that holds:
//! - the waiting thread's capture mode is `RELAXED` for the wait and restored after it, so no other
//!   thread's capture refuses the wait. A stream wait first tries once in the thread's own mode,
//!   which costs nothing where it succeeds; in `GLOBAL` mode, while another thread captures in
//!   `GLOBAL` mode, that try is refused and the driver invalidates the other thread's capture, as
//!   for any thread's potentially unsafe call during such a capture (capture in `THREAD_LOCAL` or
//!   `RELAXED` mode to keep it), and the wait goes on in `RELAXED` mode;
//! - a stream found capturing when the scope ends has its capture ended and its graph destroyed,
//!   where this thread may end it, and is then waited for. No graph keeps an address lent to the
//!   scope, and `scope` returns [`Error::StreamCapturing`] once the work has finished;
//! - so is a capture of this thread's per-thread default stream that stands in the wait's way (it
//!   makes a wait of the legacy default stream an implicit dependency, refuses a wait of the
//!   context, and is the capture a stream may have joined): only this thread can have begun it;
//! - a capture this thread may not end is waited out, for up to 10 seconds. That is one the stream
//!   joined from another stream, or one another thread began in a mode other than `RELAXED`;
//! - any other failure is settled by `cuCtxSynchronize`. Success proves that the work finished. The
//!   same error again proves it sticky: the context runs no more work until the primary context is
//!   reset, which cannot happen while a stream, event or pinned buffer of it lives (each keeps it
//!   retained).
//!
//! So when `scope` returns, with `Ok` or an error, nothing queued touches the borrowed memory any
//! more. After a fault, which operations ran before it is unknown, so the bytes they were to write
//! are unspecified. Where nothing proves the work finished, the process **aborts** with a line on
//! stderr that starts with `cuda-vmm: aborting:`: a capture outlasting the 10 seconds, or an
//! error neither repeated nor cleared. Returning, or unwinding, would end the borrows under
//! running work. `scope` waits for every other stream even after one wait failed, and returns the
//! first error.
//!
//! Work is not queued onto a stream that is capturing: each operation checks first
//! (`cuStreamIsCapturing`) and returns [`Error::StreamCapturing`] before any work is queued.
//!
//!
//! # Memory in motion
//! Some memory changes while one scope lasts. A [`Rewritable`] is a writable view that queued work
//! writes again and again inside one scope (a ring of two slots for any number of batches), each
//! write ordered after the one before on one stream, handed to another only behind an event. A
//! buffer lent to a scope ([`VirtualBuffer::in_scope`](crate::VirtualBuffer::in_scope)) grows,
//! lends its pages and retires them while the GPU runs: a retire records an event on every
//! stream of the scope, after the work queued so far, and returns at once; the pages are unmapped
//! and released once every event has completed. Each lend of such memory is checked again, so a
//! retired page reaches no later work. This layer knows such memory by trait only (the lend
//! traits of `lend.rs`), never the buffer itself.
//!
//! A [`Graph`] is work captured once ([`Graph::capture`]) that borrows what it uses for as long
//! as it lives, replayed in scopes ([`ScopedStream::launch_graph`]), and parked ([`ParkedGraph`])
//! while its memory is evicted. Memory that can leave while a scope lasts is not captured; a
//! parked graph over a buffer lent to a scope is bound to that scope instead ([`ScopedGraph`]):
//! the ranges it touches there are claimed for the scope and admitted at every replay
//! ([`ScopedStream::launch_scoped_graph`]), so a retire orders its release after the replays.
//! A graph whose kernels reach pages through a block table is captured with a [`GraphTable`]
//! ([`Graph::capture_with_table`]): the table's upload is the graph's first node, its entries are
//! set between replays from the scope's lends ([`ScopedGraph::set_read`],
//! [`ScopedGraph::set_write`]), and each entry is admitted and counted at every replay, so pages
//! map and retire under one graph replayed every step, with no re-capture and no host wait.
//!
//! # The files
//! By concept, lowest first, none naming a higher one (`tests/layers.rs` checks it): this file
//! ([`Stream`] and its identity), `event.rs`, `pinned.rs`; `lend.rs` (what may be lent: the sealed
//! traits, and what a queued write hands back); `scope.rs` (the scope and its registry of
//! streams); `rewritable.rs`; `launch.rs` and `queue.rs` (what is queued: kernel arguments, and
//! the operations of a scoped stream and of a capture); `graph.rs`, `graph/park.rs` and
//! `graph/scoped.rs`, `graph/table.rs` (the graph's block table), `graph/driver.rs` (its driver
//! calls).

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
// A table of block addresses a kernel takes as one argument.
mod table;
// Work captured once and replayed.
mod graph;

pub use event::Event;
pub use graph::{
    Capture, Graph, GraphTable, KernelNode, NotRebound, ParkedGraph, Rebind, ScopedGraph,
    ScopedRebind, TableArg,
};
pub(crate) use graph::{Claim, Covers, Lender};
pub use launch::{KernelArg, KernelArgs};
pub use lend::{DeviceInFlight, HostInFlight, HostSource, HostTarget, ScopedRead, ScopedWrite};
pub use pinned::{PinnedBuffer, PinnedChunks, PinnedSliceMut};
pub use rewritable::Rewritable;
pub use scope::{Scope, ScopedStream, scope};
pub use table::{BlockTable, ScopedBlockTable};

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
    /// it ends a capture of this stream itself (see [When a wait fails](self#when-a-wait-fails)).
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
