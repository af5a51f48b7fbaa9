//! Stream-ordered work: [`Stream`], [`Event`], page-locked host memory ([`PinnedBuffer`]), and
//! [`scope`], under which queued copies, memsets and kernel launches borrow what they use until the
//! work has finished. The model, and why it is sound, are documented on [`scope`].

use core::ffi::c_void;
use core::fmt;
use core::marker::PhantomData;
use core::mem::ManuallyDrop;
use core::ops::{Deref, DerefMut};
use core::ptr::{self, NonNull};
use std::sync::{Mutex, PoisonError};

use bytemuck::Pod;

use crate::device::{Context, Device};
use crate::error::{DriverError, Error, Result, check, first_error};
use crate::module::Function;
use crate::sys;
use crate::view::{DeviceSlice, DeviceSliceMut};
use crate::wait;

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

    /// `cuStreamIsCapturing` — `Ok` where the stream is not capturing a graph: the check before any
    /// work that borrows memory is queued on it (a graph could run that work after the scope). Leaves
    /// the stream's context current, for the enqueue that follows.
    fn admit_work(&self) -> Result<(), Error> {
        self.context.bind_to_thread()?;
        if wait::is_capturing(self.raw)? {
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
        check(unsafe { sys::cuStreamWaitEvent(self.raw, event.raw, 0) })
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
        check(unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src, bytes, self.raw) })
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
        check(unsafe { sys::cuMemcpyDtoHAsync_v2(dst, src, bytes, self.raw) })
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

/// A marker in a stream's work (`CUevent`): [`Stream::record`] sets it, [`Stream::wait`] makes
/// another stream wait for it, [`Event::synchronize`] makes the host wait for it, and
/// [`Event::elapsed_ms`] reads the time between two of them. Destroyed on drop.
///
/// An event keeps its primary context retained and makes it current before every driver call on the
/// event, also when dropped.
pub struct Event {
    raw: sys::CUevent,
    timed: bool,
    context: Context,
}

// SAFETY: a `CUevent` is a handle to a driver object, not to thread-local state; the driver API is
// thread-safe, and every method makes the event's context current first.
unsafe impl Send for Event {}
// SAFETY: as for `Send`: every method takes `&self` and only passes the handle to thread-safe driver
// calls.
unsafe impl Sync for Event {}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("raw", &self.raw)
            .field("timed", &self.timed)
            .field("device", &self.context.device())
            .finish()
    }
}

impl Event {
    /// `cuEventCreate` — an event of `context`'s device without timing
    /// (`CU_EVENT_DISABLE_TIMING`): the cheapest kind, for ordering work.
    ///
    /// # Errors
    /// The driver's error, if any.
    #[doc(alias = "cuEventCreate")]
    pub fn new(context: &Context) -> Result<Event, Error> {
        Event::create(context, sys::CU_EVENT_DISABLE_TIMING)
    }

    /// `cuEventCreate` — an event of `context`'s device that also takes a time stamp when it
    /// completes, for [`elapsed_ms`](Event::elapsed_ms).
    ///
    /// # Errors
    /// The driver's error, if any.
    #[doc(alias = "cuEventCreate")]
    pub fn timed(context: &Context) -> Result<Event, Error> {
        Event::create(context, sys::CU_EVENT_DEFAULT)
    }

    fn create(context: &Context, flags: u32) -> Result<Event, Error> {
        let context = Context::new(context.device())?;
        context.bind_to_thread()?;
        let mut raw: sys::CUevent = ptr::null_mut();
        // SAFETY: `raw` is writable for the call; `context` is current (bound just above).
        check(unsafe { sys::cuEventCreate(&raw mut raw, flags) })?;
        Ok(Event {
            raw,
            timed: flags == sys::CU_EVENT_DEFAULT,
            context,
        })
    }

    /// The device whose primary context the event belongs to.
    #[must_use]
    pub fn device(&self) -> Device {
        self.context.device()
    }

    /// Whether the event takes time stamps (made by [`Event::timed`]).
    #[must_use]
    pub fn is_timed(&self) -> bool {
        self.timed
    }

    /// The raw `CUevent`: an escape hatch that owns nothing. It stays valid while `self` lives; do not
    /// destroy it.
    #[must_use]
    pub fn as_raw(&self) -> sys::CUevent {
        self.raw
    }

    /// `cuEventSynchronize` — wait until the event has completed (at once for an event never
    /// recorded).
    ///
    /// The wait holds under stream capture, as [`Stream::synchronize`] does: other threads'
    /// captures do not refuse it, and an event last recorded in a capture is waited out.
    ///
    /// # Errors
    /// A sticky error of earlier asynchronous work.
    #[doc(alias = "cuEventSynchronize")]
    pub fn synchronize(&self) -> Result<(), Error> {
        wait::event(self.context.as_raw(), self.raw)
    }

    /// `cuEventQuery` — whether the event has completed (`true` also for an event never recorded),
    /// without waiting.
    ///
    /// # Errors
    /// The driver's error other than `CUDA_ERROR_NOT_READY` (which is `Ok(false)`).
    #[doc(alias = "cuEventQuery")]
    pub fn is_complete(&self) -> Result<bool> {
        self.context.bind_to_thread()?;
        // SAFETY: a live event of the current context (bound just above).
        match check(unsafe { sys::cuEventQuery(self.raw) }) {
            Ok(()) => Ok(true),
            Err(e) if e == DriverError::NOT_READY => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `cuEventElapsedTime` — the milliseconds from this event to `end` (about half a microsecond of
    /// resolution), both of one device, made by [`Event::timed`], recorded and completed. Negative
    /// where `end` completed first.
    ///
    /// # Errors
    /// [`Error::NotTimed`] where either event was made without timing ([`Event::new`]), and
    /// [`Error::DeviceMismatch`] for events of two devices, both before any driver call; the
    /// driver's error otherwise: `CUDA_ERROR_INVALID_HANDLE` where either event was never recorded,
    /// `CUDA_ERROR_NOT_READY` where either has not completed (call
    /// [`synchronize`](Event::synchronize) on `end` first).
    #[doc(alias = "cuEventElapsedTime")]
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, Error> {
        if !self.is_timed() || !end.is_timed() {
            return Err(Error::NotTimed);
        }
        if end.device() != self.device() {
            return Err(Error::DeviceMismatch {
                expected: self.device().as_raw(),
                found: end.device().as_raw(),
            });
        }
        self.context.bind_to_thread()?;
        let mut ms = 0f32;
        // SAFETY: `ms` is writable for the call; both events are live and belong to the current
        // context (same device, primary contexts).
        check(unsafe { sys::cuEventElapsedTime(&raw mut ms, self.raw, end.raw) })?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // `cuEventDestroy` with the event's context current, on whatever thread drops it; where the
        // context cannot be made current the event is leaked. Errors are ignored (`drop`).
        if self.context.bind_to_thread().is_ok() {
            // SAFETY: an event this value created, destroyed once, with its context current; the
            // driver defers the release of an event still to complete.
            let _ = unsafe { sys::cuEventDestroy_v2(self.raw) };
        }
    }
}

/// `len` values of `T` in page-locked (pinned) host memory, the host memory that copies on a stream
/// overlap with other work: `cuMemHostAlloc` with `CU_MEMHOSTALLOC_PORTABLE`, so usable by the
/// streams of every device. Freed on drop (`cuMemFreeHost`).
///
/// Read and written as a `[T]` (it dereferences to one), and lent to queued copies inside [`scope`]
/// (`&buffer` as a source, `&mut buffer` or `&mut buffer[range]` as a destination), over and over:
/// pinning memory costs far more than copying it, so keep a buffer rather than making one per copy.
///
/// The buffer keeps the primary context it was pinned in retained: a primary context released by
/// its last user is reset, which would unpin the memory while the buffer still owned it. It makes
/// that context current to free the memory, on whichever thread drops it.
///
/// Made zeroed ([`zeroed`](PinnedBuffer::zeroed)) or copied ([`from_slice`](PinnedBuffer::from_slice)):
/// every `T` is plain data ([`Pod`]), so the memory always holds valid values. A zero-sized `T` does
/// not build (a `const` assertion in the constructors) and is refused at run time too.
pub struct PinnedBuffer<T: Pod> {
    ptr: NonNull<T>,
    len: usize,
    /// Declared after the memory's fields; the memory is freed in `Drop::drop`, before the context is
    /// released.
    context: Context,
    /// Owns `len` values of `T`.
    _data: PhantomData<T>,
}

// SAFETY: the buffer owns its memory outright, like a `Vec<T>`; page-locked host memory has no thread
// affinity, and `Context` is `Send`.
unsafe impl<T: Pod + Send> Send for PinnedBuffer<T> {}
// SAFETY: `&PinnedBuffer<T>` gives only `&[T]`, which is `Sync` where `T` is.
unsafe impl<T: Pod + Sync> Sync for PinnedBuffer<T> {}

impl<T: Pod> fmt::Debug for PinnedBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("device", &self.context.device())
            .finish()
    }
}

impl<T: Pod> PinnedBuffer<T> {
    /// `cuMemHostAlloc` — `len` zeroed values of `T` in page-locked host memory, pinned in
    /// `context` (and usable by every context).
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for a zero length or a zero-sized `T`; [`Error::Overflow`] where the byte
    /// size does not fit `usize`; both before any driver call. The driver's error otherwise (e.g.
    /// [`DriverError::OUT_OF_MEMORY`] when that much memory cannot be pinned).
    #[doc(alias = "cuMemHostAlloc")]
    pub fn zeroed(context: &Context, len: usize) -> Result<PinnedBuffer<T>, Error> {
        const {
            assert!(
                size_of::<T>() != 0,
                "PinnedBuffer of a zero-sized type: it would hold no memory"
            );
        }
        let buffer = PinnedBuffer::alloc(context, len)?;
        // SAFETY: `len * size_of::<T>()` writable bytes, owned by `buffer` and not yet shared; all-zero
        // bytes are a valid `T` (`Pod` implies `Zeroable`).
        unsafe { ptr::write_bytes(buffer.ptr.as_ptr(), 0, len) };
        Ok(buffer)
    }

    /// `cuMemHostAlloc` — a page-locked copy of `data`, pinned in `context`.
    ///
    /// # Errors
    /// As [`zeroed`](PinnedBuffer::zeroed) (an empty `data` is a zero length).
    #[doc(alias = "cuMemHostAlloc")]
    pub fn from_slice(context: &Context, data: &[T]) -> Result<PinnedBuffer<T>, Error> {
        const {
            assert!(
                size_of::<T>() != 0,
                "PinnedBuffer of a zero-sized type: it would hold no memory"
            );
        }
        let buffer = PinnedBuffer::alloc(context, data.len())?;
        // SAFETY: `buffer` owns `data.len()` writable values of `T`, not yet shared; `data` is
        // readable for as many, and Rust memory, so it cannot overlap memory just pinned.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), buffer.ptr.as_ptr(), data.len()) };
        Ok(buffer)
    }

    /// Pins `len` values of `T`, uninitialised: the constructors fill them before handing the buffer
    /// out.
    fn alloc(context: &Context, len: usize) -> Result<PinnedBuffer<T>, Error> {
        let bytes = host_bytes::<T>(len)?;
        let context = Context::new(context.device())?;
        context.bind_to_thread()?;
        let mut raw: *mut c_void = ptr::null_mut();
        // SAFETY: `raw` is writable for the call; `context` is current (bound just above).
        check(unsafe { sys::cuMemHostAlloc(&raw mut raw, bytes, sys::CU_MEMHOSTALLOC_PORTABLE) })?;
        // The driver answers success only with memory; a null pointer would be its bug, reported as
        // the failure it would be.
        let ptr = NonNull::new(raw.cast::<T>()).ok_or(DriverError::OUT_OF_MEMORY)?;
        let buffer = PinnedBuffer {
            ptr,
            len,
            context,
            _data: PhantomData,
        };
        // Page-aligned in practice; checked, since a `T` may ask for more (dropping frees it).
        if !raw.addr().is_multiple_of(align_of::<T>()) {
            return Err(Error::NotAligned {
                what: "pinned host memory address",
                value: raw.addr(),
                granularity: align_of::<T>(),
            });
        }
        Ok(buffer)
    }

    /// The number of values.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no values (never: an empty buffer is refused when made).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device whose primary context the memory was pinned in (and which the buffer keeps
    /// retained).
    #[must_use]
    pub fn device(&self) -> Device {
        self.context.device()
    }

    /// The values, as a slice.
    #[must_use]
    pub fn as_slice(&self) -> &[T] {
        self
    }

    /// The values, as a mutable slice.
    #[must_use]
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        self
    }
}

impl<T: Pod> Deref for PinnedBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `len` initialised values of `T` (filled by the constructor), aligned (checked when
        // made), owned by `self` and borrowed shared with it. Queued work writes the memory only
        // while `self` is borrowed mutably for a scope, during which this cannot be called.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Pod> DerefMut for PinnedBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as for `deref`, borrowed exclusively with `self`, which no queued work holds now.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Pod> Drop for PinnedBuffer<T> {
    fn drop(&mut self) {
        // `cuMemFreeHost` needs the context the memory was pinned in current, and the buffer may be
        // dropped on any thread. Where it cannot be made current the memory is leaked. Errors are
        // ignored: `drop` cannot return them, and memory the driver refuses to free cannot be freed
        // later.
        if self.context.bind_to_thread().is_ok() {
            // SAFETY: memory from `cuMemHostAlloc` in the current context, freed once. No queued work
            // uses it: work lent it only for a scope, and a scope ends by waiting for its work.
            let _ = unsafe { sys::cuMemFreeHost(self.ptr.as_ptr().cast::<c_void>()) };
        }
    }
}

/// The byte size of `len` values of `T` in a pinned buffer.
///
/// # Errors
/// [`Error::ZeroSize`] for a zero-sized `T` or a zero `len`; [`Error::Overflow`] where the size does
/// not fit `usize`.
fn host_bytes<T>(len: usize) -> Result<usize, Error> {
    if size_of::<T>() == 0 {
        return Err(Error::ZeroSize {
            what: "element size",
        });
    }
    if len == 0 {
        return Err(Error::ZeroSize {
            what: "pinned buffer length",
        });
    }
    len.checked_mul(size_of::<T>()).ok_or(Error::Overflow {
        what: "pinned buffer size",
    })
}

/// `cuStreamSynchronize` on every stream of a scope — run stream-ordered work that borrows views,
/// host memory and kernels for the rest of the scope, and wait for all of it before returning.
///
/// `f` receives the [`Scope`]; [`Scope::on`] turns a [`Stream`] into a [`ScopedStream`], which queues
/// copies, memsets and kernel launches that borrow what they use for `'scope`. When `f` returns, or
/// panics, `scope` waits for every stream it queued on, then returns `f`'s value, or the first error
/// (see `# Errors`), or resumes the panic.
///
/// # The model
/// A [`Stream`] runs the work queued on it in order, and alongside other streams' work. Work that
/// reads or writes memory is queued only here, through a [`ScopedStream`], and borrows every view,
/// host slice and kernel it uses for `'scope`, which lasts until `scope` returns; and `scope` returns
/// only after waiting for every stream it queued on. So no queued copy or kernel outlives what it
/// uses: the borrow checker refuses an unmap, a new grant, a drop, or a host access of anything lent
/// to the scope, for as long as the scope runs (the cases in `ui-tests/stream/`).
///
/// Between streams, [`Event`]s order work: [`Stream::record`] marks a point in one stream,
/// [`Stream::wait`] makes another stream, of any device, wait for it. A writable view is lent to
/// one operation for the rest of the scope, as `&mut` is to one scoped thread; an operation that
/// writes hands back a handle of what it writes, a [`DeviceInFlight`] for device memory or a
/// [`HostInFlight`] for host memory, with which only work queued after it (on the same stream, or
/// behind an event) reads the result. Neither gives the host any access to the bytes, which the
/// queued work may still be writing: a `DeviceInFlight` has no host read, is no source of the
/// synchronous copies (which run on the legacy default stream, which does not wait for the
/// scope's streams), and does not become a [`DeviceSlice`]. The host reads the results after
/// `scope` has returned, through the views and buffers it lent. To write the same memory again,
/// split the view first ([`DeviceSliceMut::split_at_mut`]) or use another scope.
///
/// # Why it is sound, also under `mem::forget`
/// The wait is in no value the caller holds. `scope` runs `f`, then waits for every stream
/// registered with the scope, in its own frame: on return, and while a panic unwinds through it (a
/// guard local to `scope`, which `f` never sees). `f` gets only `&'scope Scope`, and a
/// [`ScopedStream`] is a `Copy` handle: forgetting either changes nothing. A "pending copy" value
/// whose `Drop` waited would be unsound, since it could be forgotten while the borrows it held end;
/// there is none. `'scope` is invariant, as in [`std::thread::scope`], so a [`ScopedStream`] can
/// neither leave the closure nor accept a borrow that ends before the wait (a local of the closure,
/// say).
///
/// # When a wait fails
/// A failed `cuStreamSynchronize` does not by itself mean that the work has stopped. Under stream
/// capture the driver refuses a wait at once, without waiting, and the error (900–908) is not
/// sticky: the work queued before runs on. That happens on a stream that is capturing a graph,
/// and, in CUDA's default `GLOBAL` capture mode, on every thread while any thread captures. So
/// every wait of this crate (this scope's, cudarc's scope's, the ends of
/// [`ScopedAccess`](crate::ScopedAccess) and [`PeerAccess`](crate::PeerAccess), every synchronous copy, the staged copy, each `synchronize`) goes through one
/// wait that holds:
/// - the waiting thread's capture mode is `RELAXED` for the wait and restored after it, so no other
///   thread's capture refuses the wait. A stream wait first tries once in the thread's own mode,
///   which costs nothing where it succeeds; in `GLOBAL` mode, while another thread captures in
///   `GLOBAL` mode, that try is refused and the driver invalidates the other thread's capture, as
///   for any thread's potentially unsafe call during such a capture (capture in `THREAD_LOCAL` or
///   `RELAXED` mode to keep it), and the wait goes on in `RELAXED` mode;
/// - a stream found capturing when the scope ends has its capture ended and its graph destroyed,
///   where this thread may end it, and is then waited for. No graph keeps an address lent to the
///   scope, and `scope` returns [`Error::StreamCapturing`] once the work has finished;
/// - a capture this thread may not end is waited out, for up to 10 seconds. That is one the stream
///   joined from another stream, or one another thread began in a mode other than `RELAXED`;
/// - any other failure is settled by `cuCtxSynchronize`. Success proves that the work finished. The
///   same error again proves it sticky: the context runs no more work until the primary context is
///   reset, which cannot happen while a stream, event or pinned buffer of it lives (each keeps it
///   retained).
///
/// So when `scope` returns, with `Ok` or an error, nothing queued touches the borrowed memory any
/// more. After a fault, which operations ran before it is unknown, so the bytes they were to write
/// are unspecified. Where nothing proves the work finished, the process **aborts** with a line on
/// stderr that starts with `cuda-vmm: aborting:`: a capture outlasting the 10 seconds, or an
/// error neither repeated nor cleared. Returning, or unwinding, would end the borrows under
/// running work. `scope` waits for every other stream even after one wait failed, and returns the
/// first error.
///
/// Work is not queued onto a stream that is capturing: each operation checks first
/// (`cuStreamIsCapturing`) and returns [`Error::StreamCapturing`] before any work is queued.
///
/// # Lifetimes
/// - `'scope`: the lifetime of the scope itself — while `f` runs and until every queued operation
///   has finished, when `scope` returns. Everything lent to queued work is borrowed for `'scope`, so
///   it must be declared outside the closure (as with [`std::thread::scope`]). Invariant.
/// - `'env`: the lifetime of whatever the scope borrows from outside (the streams, views, buffers
///   and kernels); it outlives `'scope`.
///
/// # Errors
/// `f`'s error, if it returns one (the waits happen in any case; a wait's failure then is not
/// returned, but a sticky error shows again on the context's next call). Otherwise the first error
/// of the waits: every stream is waited for even after one failed (see
/// [When a wait fails](scope#when-a-wait-fails)). An error of one of `f`'s operations leaves the
/// work queued before it in place: it runs, and is waited for.
///
/// # Panics
/// Resumes a panic of `f`, after waiting for every stream (so the borrows it held are free when the
/// panic reaches the caller).
///
/// # Examples
/// Upload on one stream, download on another once the upload is done:
/// ```no_run
/// use cuda_vmm::{Context, Device, DeviceBuffer, Event, PinnedBuffer, Stream};
///
/// # fn main() -> Result<(), cuda_vmm::Error> {
/// let context = Context::new(Device::get(0)?)?;
/// let mut device = DeviceBuffer::<u32>::zeroed(&context, 1 << 20)?;
/// let input = PinnedBuffer::from_slice(&context, &vec![7u32; 1 << 20])?;
/// let mut output = PinnedBuffer::<u32>::zeroed(&context, 1 << 20)?;
/// let (up_stream, down_stream) = (Stream::new(&context)?, Stream::new(&context)?);
/// let uploaded = Event::new(&context)?;
/// let mut view = device.as_mut_slice();
///
/// cuda_vmm::scope(|s| {
///     let (up, down) = (s.on(&up_stream), s.on(&down_stream));
///     // Queued: `view` and `input` stay borrowed until the scope has waited for the copy.
///     let written = up.copy_from_host(&mut view, &input)?;
///     up.record(&uploaded)?;
///     down.wait(&uploaded)?;
///     down.copy_to_host(&mut output, written)?;
///     Ok(())
/// })?; // both streams waited for
/// assert!(output.iter().all(|&x| x == 7));
/// # Ok(())
/// # }
/// ```
///
/// A host buffer cannot be dropped while queued work may still read it (nor touched at all while
/// queued work writes it):
/// ```compile_fail,E0505
/// # use cuda_vmm::{Context, Device, DeviceBuffer, PinnedBuffer, Stream};
/// # fn main() -> Result<(), cuda_vmm::Error> {
/// # let context = Context::new(Device::get(0)?)?;
/// # let mut device = DeviceBuffer::<u32>::zeroed(&context, 1024)?;
/// # let mut view = device.as_mut_slice();
/// let input = PinnedBuffer::from_slice(&context, &[1u32; 1024])?;
/// let stream = Stream::new(&context)?;
/// cuda_vmm::scope(|s| {
///     s.on(&stream).copy_from_host(&mut view, &input)?;
///     drop(input); // the copy may not have run yet
///     Ok(())
/// })?;
/// # Ok(())
/// # }
/// ```
///
/// Nor can a value the closure owns be lent: it is dropped when the closure ends, before the wait.
/// ```compile_fail,E0597
/// # use cuda_vmm::{Context, Device, DeviceBuffer, PinnedBuffer, Stream};
/// # fn main() -> Result<(), cuda_vmm::Error> {
/// # let context = Context::new(Device::get(0)?)?;
/// # let device = DeviceBuffer::<u32>::zeroed(&context, 1024)?;
/// let stream = Stream::new(&context)?;
/// cuda_vmm::scope(|s| {
///     let mut output = PinnedBuffer::<u32>::zeroed(&context, 1024)?;
///     s.on(&stream).copy_to_host(&mut output, device.as_slice())?;
///     Ok(())
/// })?;
/// # Ok(())
/// # }
/// ```
#[doc(alias = "cuStreamSynchronize")]
pub fn scope<'env, F, T>(f: F) -> Result<T, Error>
where
    F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> Result<T, Error>,
{
    let scope = Scope {
        streams: Mutex::new(Streams::new()),
        _lifetimes: PhantomData,
    };
    // Local to this frame, never seen by `f`: if `f` panics, its `Drop` waits while the panic
    // unwinds through here, before any borrow lent to the scope ends.
    let guard = WaitOnUnwind(&scope);
    let result = f(&scope);
    let waited = guard.wait();
    let value = result?;
    waited?;
    Ok(value)
}

/// Waits for every stream of a scope when dropped, which happens only while a panic unwinds through
/// [`scope`]; on a normal return [`WaitOnUnwind::wait`] takes its place and reports the error.
struct WaitOnUnwind<'a, 'scope, 'env>(&'a Scope<'scope, 'env>);

impl WaitOnUnwind<'_, '_, '_> {
    fn wait(self) -> Result<(), Error> {
        let this = ManuallyDrop::new(self);
        this.0.wait_all()
    }
}

impl Drop for WaitOnUnwind<'_, '_, '_> {
    fn drop(&mut self) {
        // Unwinding: the error cannot be returned, and the panic goes on once every stream is waited
        // for.
        let _ = self.0.wait_all();
    }
}

/// The scope of [`scope`]: where streams become [`ScopedStream`]s ([`Scope::on`]), and which waits
/// for every one of them before [`scope`] returns.
///
/// # Lifetimes
/// As [`scope`]: `'scope` is the scope itself (until every queued operation has finished), `'env`
/// what it borrows from outside. Both are invariant, as in [`std::thread::Scope`].
pub struct Scope<'scope, 'env: 'scope> {
    /// Every stream work was queued on, waited for when the scope ends. A `Mutex`, so that a scope
    /// can be shared with threads (`std::thread::scope`) that queue work too.
    streams: Mutex<Streams<'scope, Stream>>,
    /// Invariant in `'scope`, which can be neither shortened (that would let a queued operation
    /// borrow something that ends before the wait) nor lengthened; invariant in `'env`, as
    /// `std::thread::Scope`. `Send` and `Sync`.
    _lifetimes: PhantomData<(&'scope mut &'scope (), &'env mut &'env ())>,
}

impl fmt::Debug for Scope<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Scope")
            .field("streams", &streams.iter().collect::<Vec<_>>())
            .finish()
    }
}

impl<'scope> Scope<'scope, '_> {
    /// Registers `stream` with the scope, which will wait for it before [`scope`] returns, and returns
    /// the handle that queues work on it. Registering a stream again returns the same handle.
    pub fn on(&'scope self, stream: &'scope Stream) -> ScopedStream<'scope> {
        self.streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(stream);
        ScopedStream {
            stream,
            _scope: PhantomData,
        }
    }

    /// Waits for every registered stream, all of them even after an error; the first error.
    fn wait_all(&self) -> Result<(), Error> {
        let streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        first_error(streams.iter().map(Stream::synchronize))
    }
}

/// The streams of a scope, each once: the first few inline (a scope usually has one to four, and
/// registering them then allocates nothing), the rest in a `Vec`.
struct Streams<'a, S> {
    inline: [Option<&'a S>; 4],
    more: Vec<&'a S>,
}

impl<'a, S> Streams<'a, S> {
    fn new() -> Streams<'a, S> {
        Streams {
            inline: [None; 4],
            more: Vec::new(),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &'a S> + '_ {
        self.inline
            .iter()
            .flatten()
            .copied()
            .chain(self.more.iter().copied())
    }

    /// Adds `stream` unless it is there already (the same value: compared by address).
    fn insert(&mut self, stream: &'a S) {
        if self.iter().any(|s| ptr::eq(s, stream)) {
            return;
        }
        match self.inline.iter_mut().find(|slot| slot.is_none()) {
            Some(slot) => *slot = Some(stream),
            None => self.more.push(stream),
        }
    }
}

/// A [`Stream`] registered with a [`Scope`] (by [`Scope::on`]): it queues copies, memsets and kernel
/// launches that borrow what they use for `'scope`, and the scope waits for it before it ends.
///
/// Every operation checks its arguments before any driver call: lengths, and that the stream's
/// device reaches each view's memory ([`DeviceSlice::reachable_from`]; [`Error::NoPeerAccess`]
/// otherwise). It then checks that the stream is not capturing a graph, which could run the work
/// after the scope ([`Error::StreamCapturing`], before any work is queued), queues the work and
/// returns at once. An operation that writes device memory returns a [`DeviceInFlight`] of it,
/// valid for the scope, which only work queued after it (on this stream, or on another behind an
/// [`Event`]) reads; one that writes host memory returns a [`HostInFlight`] for the same purpose.
/// The host reads the results after [`scope`] has returned.
///
/// It dereferences to the [`Stream`], whose [`record`](Stream::record) and [`wait`](Stream::wait)
/// order work between streams.
///
/// # Lifetimes
/// `'scope` is the scope's: invariant, so the handle can neither leave the closure nor accept a
/// borrow that ends before the scope's wait.
#[derive(Clone, Copy)]
pub struct ScopedStream<'scope> {
    stream: &'scope Stream,
    /// Invariant in `'scope`, as [`Scope`].
    _scope: PhantomData<&'scope mut &'scope ()>,
}

impl fmt::Debug for ScopedStream<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ScopedStream").field(self.stream).finish()
    }
}

impl Deref for ScopedStream<'_> {
    type Target = Stream;
    fn deref(&self) -> &Stream {
        self.stream
    }
}

/// `Err(NoPeerAccess)` unless `view` is reachable from `device`.
fn reachable<T: Pod>(view: &DeviceSlice<'_, T>, device: Device) -> Result<(), Error> {
    if view.reachable_from(device) {
        Ok(())
    } else {
        Err(Error::NoPeerAccess {
            device: device.as_raw(),
            owner: view.device().as_raw(),
        })
    }
}

fn check_len(expected: usize, found: usize) -> Result<(), Error> {
    if expected == found {
        Ok(())
    } else {
        Err(Error::LengthMismatch { expected, found })
    }
}

impl<'scope> ScopedStream<'scope> {
    /// `cuMemcpyHtoDAsync` — queue a copy of `src` (host memory, the same length) into `dst`.
    ///
    /// `dst` is a writable view lent for the rest of the scope (`&mut view`, or a view made inside
    /// the closure); `src` is `&[T]`, `&PinnedBuffer<T>` or the [`HostInFlight`] of an earlier
    /// download, borrowed for the rest of the scope. Only page-locked memory ([`PinnedBuffer`])
    /// overlaps: from pageable memory the driver first copies `src` into its own staging memory
    /// before this returns. Returns a [`DeviceInFlight`] of `dst`: only work queued after the copy
    /// (on this stream, or behind an [`Event`]) reads it; the host reads `dst` after [`scope`] has
    /// returned, through the view it lent.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] where the lengths differ; [`Error::NoPeerAccess`] where the stream's
    /// device does not reach `dst`'s memory; both before any driver call. The driver's error
    /// otherwise.
    #[doc(alias = "cuMemcpyHtoDAsync")]
    pub fn copy_from_host<T: Pod>(
        &self,
        dst: impl ScopedWrite<'scope, T>,
        src: impl HostSource<'scope, T>,
    ) -> Result<DeviceInFlight<'scope, T>, Error> {
        let dst = dst.lend_mut();
        let (src, len) = src.host_parts();
        check_len(dst.len(), len)?;
        reachable(&dst, self.device())?;
        self.stream.admit_work()?;
        if len > 0 {
            // SAFETY: `dst` is `len` values of device memory reachable from the stream's device
            // (checked above), lent exclusively to this copy for `'scope` (a writable view, given up);
            // `src` is `len` readable values of host memory borrowed shared for `'scope`, which nothing
            // writes meanwhile. The stream's context is current (`admit_work`). The scope waits for
            // this stream before `'scope` ends.
            check(unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    dst.as_raw_ptr(),
                    src.cast::<c_void>(),
                    len * size_of::<T>(),
                    self.stream.raw,
                )
            })?;
        }
        Ok(DeviceInFlight { view: dst })
    }

    /// `cuMemcpyDtoHAsync` — queue a copy of `src` into `dst` (host memory, the same length).
    ///
    /// `dst` is borrowed mutably for the rest of the scope (`&mut pinned_buffer`, or a part of it), so
    /// nothing reads or writes it until the scope has waited for the copy; `src` is a view lent for
    /// the rest of the scope, also the [`DeviceInFlight`] of an earlier write ordered before this
    /// copy. Only page-locked memory ([`PinnedBuffer`]) overlaps: into pageable memory the driver
    /// returns only once the copy is done. Returns a [`HostInFlight`] of `dst`, with which a later
    /// queued upload (ordered after this copy) reads what this one wrote.
    ///
    /// # Errors
    /// As [`copy_from_host`](ScopedStream::copy_from_host), for `src`.
    #[doc(alias = "cuMemcpyDtoHAsync")]
    pub fn copy_to_host<T: Pod>(
        &self,
        dst: &'scope mut [T],
        src: impl ScopedRead<'scope, T>,
    ) -> Result<HostInFlight<'scope, T>, Error> {
        let src = lend(src);
        check_len(dst.len(), src.len())?;
        reachable(&src, self.device())?;
        self.stream.admit_work()?;
        let written = HostInFlight {
            ptr: dst.as_mut_ptr(),
            len: dst.len(),
            _host: PhantomData,
        };
        if written.len > 0 {
            // SAFETY: `written.ptr` is `len` writable values of host memory, borrowed mutably for
            // `'scope` (so nothing else reads or writes it, and `HostInFlight` gives the host no access
            // to it); any bytes are a valid `T` (`Pod`). `src` is `len` values of device memory
            // reachable from the stream's device (checked above), lent for `'scope`. The stream's
            // context is current (`admit_work`). The scope waits for this stream before `'scope`
            // ends.
            check(unsafe {
                sys::cuMemcpyDtoHAsync_v2(
                    written.ptr.cast::<c_void>(),
                    src.as_raw_ptr(),
                    written.len * size_of::<T>(),
                    self.stream.raw,
                )
            })?;
        }
        Ok(written)
    }

    /// `cuMemcpyDtoDAsync` — queue a copy of `src` into `dst` (the same length), which may belong to
    /// two devices: the stream's device must reach both views' memory (a VMM grant that names it, a
    /// peer view under a guard, or its own memory), so the copy runs over the link, never through the
    /// driver's hidden staging. `src` may be the [`DeviceInFlight`] of an earlier write, ordered
    /// before this copy. Returns a [`DeviceInFlight`] of `dst`: only work queued after the copy (on
    /// this stream, or behind an [`Event`]) reads it.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] where the lengths differ; [`Error::NoPeerAccess`] where the stream's
    /// device does not reach either view's memory; both before any driver call. The driver's error
    /// otherwise. For views that no one device reaches, use the staged
    /// [`copy_between`](crate::copy_between) outside the scope.
    #[doc(alias = "cuMemcpyDtoDAsync")]
    pub fn copy_from_device<T: Pod>(
        &self,
        dst: impl ScopedWrite<'scope, T>,
        src: impl ScopedRead<'scope, T>,
    ) -> Result<DeviceInFlight<'scope, T>, Error> {
        let (dst, src) = (dst.lend_mut(), lend(src));
        check_len(dst.len(), src.len())?;
        reachable(&dst, self.device())?;
        reachable(&src, self.device())?;
        self.stream.admit_work()?;
        if !dst.is_empty() {
            // SAFETY: both ranges are `len` values of device memory reachable from the stream's device
            // (checked above), whose context is current (`admit_work`); `dst` is lent exclusively for
            // `'scope`, `src` shared. Their virtual ranges cannot overlap (one exclusive, one shared);
            // through aliases the physical memory may, which leaves unspecified bytes in device memory
            // but touches no Rust memory. The scope waits for this stream before `'scope` ends.
            check(unsafe {
                sys::cuMemcpyDtoDAsync_v2(
                    dst.as_raw_ptr(),
                    src.as_raw_ptr(),
                    dst.len() * size_of::<T>(),
                    self.stream.raw,
                )
            })?;
        }
        Ok(DeviceInFlight { view: dst })
    }

    /// `cuMemsetD8Async` — queue setting every byte of `dst` to `byte` (any bytes are a valid `T`).
    /// Returns a [`DeviceInFlight`] of `dst`: only work queued after the memset (on this stream, or
    /// behind an [`Event`]) reads it.
    ///
    /// # Errors
    /// [`Error::NoPeerAccess`] where the stream's device does not reach `dst`'s memory (before any
    /// driver call); the driver's error otherwise.
    #[doc(alias = "cuMemsetD8Async")]
    pub fn memset<T: Pod>(
        &self,
        dst: impl ScopedWrite<'scope, T>,
        byte: u8,
    ) -> Result<DeviceInFlight<'scope, T>, Error> {
        let dst = dst.lend_mut();
        reachable(&dst, self.device())?;
        self.stream.admit_work()?;
        if !dst.is_empty() {
            // SAFETY: `dst` is device memory reachable from the stream's device (checked above), whose
            // context is current (`admit_work`), lent exclusively for `'scope`. The scope waits for this
            // stream before `'scope` ends.
            check(unsafe {
                sys::cuMemsetD8Async(
                    dst.as_raw_ptr(),
                    byte,
                    dst.len() * size_of::<T>(),
                    self.stream.raw,
                )
            })?;
        }
        Ok(DeviceInFlight { view: dst })
    }

    /// `cuLaunchKernel` — queue `function` on `grid` × `block` threads, with `args`, a tuple of
    /// typed arguments ([`KernelArgs`]): read-only views (`&DeviceSlice`, `DeviceSlice`,
    /// `&DeviceSliceMut`, and the [`DeviceInFlight`] of an earlier write), writable views
    /// (`&mut DeviceSliceMut`, `DeviceSliceMut`), each passed to the kernel as its device address
    /// (a `u64`), and plain values ([`Pod`]), passed as they are. Views and the kernel are borrowed
    /// for the rest of the scope, writable views exclusively. Returns, for each argument in order,
    /// a [`DeviceInFlight`] of each writable view, which only work queued after the kernel (on this
    /// stream, or behind an [`Event`]) reads, and `()` for the others.
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for an empty grid or block; [`Error::DeviceMismatch`] for a kernel loaded
    /// on another device than the stream's; [`Error::NoPeerAccess`] for a view whose memory the
    /// stream's device does not reach; all before any driver call. The driver's error otherwise
    /// (a fault of the kernel itself shows at the scope's wait, as a sticky error).
    ///
    /// # Safety
    /// The kernel's parameter list is not checked:
    /// - `args` must match it in number, order and types (a view is a `u64` device address);
    /// - the kernel must write only through the writable views, and read and write only within the
    ///   `len()` values of the views it is given. It may use other memory only through addresses
    ///   passed as plain values, and then the caller guarantees that memory, reachable from this
    ///   device, until the scope ends.
    #[doc(alias = "cuLaunchKernel")]
    pub unsafe fn launch<A: KernelArgs<'scope>>(
        &self,
        function: &'scope Function<'_>,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        args: A,
    ) -> Result<A::Output, Error> {
        if [grid.0, grid.1, grid.2, block.0, block.1, block.2].contains(&0) {
            return Err(Error::ZeroSize {
                what: "kernel grid or block",
            });
        }
        let device = self.device();
        if function.device() != device {
            return Err(Error::DeviceMismatch {
                expected: device.as_raw(),
                found: function.device().as_raw(),
            });
        }
        args.check(device)?;
        self.stream.admit_work()?;
        args.launch_with(|params| {
            let params = if params.is_empty() {
                ptr::null_mut()
            } else {
                params.as_mut_ptr()
            };
            // SAFETY: `function` is a kernel of a loaded module of the stream's device (checked
            // above; the module stays loaded, borrowed for `'scope`), whose context is current
            // (`admit_work`, and `launch_with` makes no driver call). `params` points at one live value per argument, which the driver copies
            // before returning. The caller guarantees that they match the kernel's parameters and
            // that the kernel uses only the memory of the views (`# Safety`); every view is
            // reachable from this device (checked above) and lent for `'scope`, writable ones
            // exclusively. The scope waits for this stream before `'scope` ends.
            Ok(check(unsafe {
                sys::cuLaunchKernel(
                    function.raw(),
                    grid.0,
                    grid.1,
                    grid.2,
                    block.0,
                    block.1,
                    block.2,
                    0,
                    self.stream.raw,
                    params,
                    ptr::null_mut(),
                )
            })?)
        })
    }
}

/// Host memory that a queued download writes ([`ScopedStream::copy_to_host`]): usable only as the
/// source of later queued uploads ([`ScopedStream::copy_from_host`]), ordered after the download
/// by the caller (on the same stream, or behind an [`Event`]). The host reads the bytes after
/// [`scope`] has returned, through the buffer it lent.
///
/// It gives the host no access to the bytes, which the device may be writing: a Rust reference to
/// them would be a data race.
///
/// # Lifetimes
/// `'scope` is the mutable borrow of the host memory, which lasts the scope.
pub struct HostInFlight<'scope, T> {
    ptr: *mut T,
    len: usize,
    /// The host memory, borrowed mutably for `'scope`: covariant in `'scope`, invariant in `T`.
    _host: PhantomData<&'scope mut [T]>,
}

impl<T> Clone for HostInFlight<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for HostInFlight<'_, T> {}

// SAFETY: a `HostInFlight` is an address and a length that only queued copies dereference; it gives
// no thread any access to the memory itself.
unsafe impl<T: Send> Send for HostInFlight<'_, T> {}
// SAFETY: as for `Send`: `&HostInFlight` gives nothing but the length.
unsafe impl<T: Sync> Sync for HostInFlight<'_, T> {}

impl<T> fmt::Debug for HostInFlight<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostInFlight")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl<T> HostInFlight<'_, T> {
    /// The number of values.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Device memory that a queued write writes ([`ScopedStream::copy_from_host`],
/// [`copy_from_device`](ScopedStream::copy_from_device), [`memset`](ScopedStream::memset), and each
/// writable argument of [`launch`](ScopedStream::launch)): usable only by later queued work, ordered
/// after the write by the caller (on the same stream, or behind an [`Event`]), as the source of a
/// copy ([`ScopedStream::copy_to_host`], [`ScopedStream::copy_from_device`]), a read-only kernel
/// argument, or a view lent to cudarc for reading (`interop::cudarc::Scope::lend`, feature
/// `cudarc`). The host reads the bytes after [`scope`] has returned, through the view it lent.
///
/// It gives the host nothing: it has no `to_vec` or synchronous `copy_to_host` of its own, does
/// not become a [`DeviceSlice`], and is no source of [`copy_between`](crate::copy_between) or
/// [`DeviceSliceMut::copy_from_device`]. Those run on the legacy default stream, which does not
/// wait for the non-blocking streams of this crate, so they would read bytes the queued work is
/// still writing.
///
/// # Lifetimes
/// `'scope` is the exclusive borrow of the written view, which lasts the scope.
///
/// # Examples
/// Upload, then hand the result to a kernel on the same stream and to a download on another one,
/// behind an event:
/// ```no_run
/// use cuda_vmm::{Context, Device, DeviceBuffer, Event, Module, PinnedBuffer, Stream};
///
/// # fn main() -> Result<(), cuda_vmm::Error> {
/// # let ptx = c"";
/// let context = Context::new(Device::get(0)?)?;
/// let module = Module::load_ptx(&context, ptx)?;
/// let scale = module.function(c"scale")?; // scale(const float* x, float* y, unsigned n)
/// let mut x = DeviceBuffer::<f32>::zeroed(&context, 256)?;
/// let mut y = DeviceBuffer::<f32>::zeroed(&context, 256)?;
/// let input = PinnedBuffer::from_slice(&context, &[1.5f32; 256])?;
/// let mut output = PinnedBuffer::<f32>::zeroed(&context, 256)?;
/// let (work, down) = (Stream::new(&context)?, Stream::new(&context)?);
/// let done = Event::new(&context)?;
/// let (mut x_view, mut y_view) = (x.as_mut_slice(), y.as_mut_slice());
///
/// cuda_vmm::scope(|s| {
///     let work = s.on(&work);
///     let uploaded = work.copy_from_host(&mut x_view, &input)?; // a DeviceInFlight
///     // SAFETY: `scale` takes two float pointers and a count, and touches `n` values of each.
///     let (_, scaled, _) = unsafe {
///         work.launch(&scale, (1, 1, 1), (256, 1, 1), (uploaded, &mut y_view, 256u32))?
///     };
///     work.record(&done)?;
///     let down = s.on(&down);
///     down.wait(&done)?; // ordered after the kernel
///     down.copy_to_host(&mut output, scaled)?;
///     Ok(())
/// })?;
/// // The scope has waited: the host reads the results, here and through the views.
/// assert_eq!(y_view.to_vec()?, output.to_vec());
/// # Ok(())
/// # }
/// ```
///
/// The host cannot read it inside the scope, where the queued write may still be running:
/// ```compile_fail,E0599
/// # use cuda_vmm::{Context, Device, DeviceBuffer, PinnedBuffer, Stream};
/// # fn main() -> Result<(), cuda_vmm::Error> {
/// # let context = Context::new(Device::get(0)?)?;
/// # let mut device = DeviceBuffer::<u32>::zeroed(&context, 1024)?;
/// # let mut view = device.as_mut_slice();
/// let input = PinnedBuffer::from_slice(&context, &[1u32; 1024])?;
/// let stream = Stream::new(&context)?;
/// cuda_vmm::scope(|s| {
///     let written = s.on(&stream).copy_from_host(&mut view, &input)?;
///     let bytes = written.to_vec()?; // the copy may not have run yet
///     Ok(())
/// })?;
/// # Ok(())
/// # }
/// ```
pub struct DeviceInFlight<'scope, T> {
    /// The written memory, lent exclusively to the queued work for `'scope` and seen read-only.
    /// Private: only this crate's queued operations get it ([`ScopedRead::lend`]).
    view: DeviceSlice<'scope, T>,
}

impl<T> Clone for DeviceInFlight<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DeviceInFlight<'_, T> {}

impl<T> fmt::Debug for DeviceInFlight<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DeviceInFlight").field(&self.view).finish()
    }
}

impl<T: Pod> DeviceInFlight<'_, T> {
    /// The number of values.
    #[must_use]
    pub fn len(&self) -> usize {
        self.view.len()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.view.is_empty()
    }

    /// The device whose context the written view's copies run in.
    #[must_use]
    pub fn device(&self) -> Device {
        self.view.device()
    }

    /// The device address of the first value: an escape hatch that owns nothing and frees nothing.
    /// The bytes behind it may still be being written by the queued work until [`scope`] has
    /// returned; reading them through the address before then, other than in work ordered after
    /// the write, reads unspecified bytes.
    #[must_use]
    pub fn as_raw_ptr(&self) -> sys::CUdeviceptr {
        self.view.as_raw_ptr()
    }

    /// Whether `device` can read this memory directly while the scope lasts: as
    /// [`DeviceSlice::reachable_from`] of the written view.
    #[must_use]
    pub fn reachable_from(&self, device: Device) -> bool {
        self.view.reachable_from(device)
    }
}

mod sealed {
    /// Sealing the lending traits: the scope's soundness rests on exactly these implementations.
    pub trait Read {}
    pub trait Write {}
    pub trait Host {}
    pub trait Arg {}
    pub trait Args {}

    /// The argument of [`ScopedRead::lend`](super::ScopedRead::lend), which only this crate can
    /// make (its field is private to this module). A public method of a public trait can be called
    /// by any code that names the trait; moving it to a supertrait in this private module would not
    /// help either, since a generic bound on the public trait makes the supertrait's methods
    /// callable too. So `lend` takes a value that code outside the crate cannot have. Without it,
    /// `written.lend()` would turn a [`DeviceInFlight`](super::DeviceInFlight) back into a
    /// `DeviceSlice`, and its host reads (`ui-tests/stream/written_view_lent_out_of_the_seal.rs`).
    #[derive(Debug)]
    pub struct Token(());

    impl Token {
        pub(super) fn new() -> Token {
            Token(())
        }
    }
}

/// The view `view` lends for reading, for the crate's own operations (the only callers of
/// [`ScopedRead::lend`], which takes a [`sealed::Token`]).
pub(crate) fn lend<'scope, T>(view: impl ScopedRead<'scope, T>) -> DeviceSlice<'scope, T> {
    view.lend(sealed::Token::new())
}

/// A device view lent to queued work for reading, for the rest of a scope: a
/// `DeviceSlice<'scope, T>` (made inside the closure, or copied), a `&'scope DeviceSlice<'_, T>`,
/// a `&'scope DeviceSliceMut<'_, T>`, or the [`DeviceInFlight<'scope, T>`](DeviceInFlight) of an
/// earlier queued write. Sealed.
pub trait ScopedRead<'scope, T>: sealed::Read {
    /// The view, for `'scope`. Only this crate can call it: the token is a type that no code
    /// outside it can make, so a [`DeviceInFlight`] never becomes a host-readable view.
    #[doc(hidden)]
    fn lend(self, token: sealed::Token) -> DeviceSlice<'scope, T>;
}

/// A device view lent to queued work for writing, exclusively, for the rest of a scope: a
/// `&'scope mut DeviceSliceMut<'_, T>`, or a `DeviceSliceMut<'scope, T>` made inside the closure.
/// Sealed: a read-only view ([`DeviceSlice`]) is not one.
pub trait ScopedWrite<'scope, T>: sealed::Write {
    /// The memory, lent exclusively for `'scope`, as a read-only view, which the operation wraps in
    /// the [`DeviceInFlight`] it returns. Code outside the crate can call it, to no harm: it gives
    /// what [`DeviceSliceMut::into_slice`] and [`DeviceSliceMut::as_slice`] give, of a view that the
    /// call consumes or borrows mutably for as long as the result lives, so no queued work holds it.
    #[doc(hidden)]
    fn lend_mut(self) -> DeviceSlice<'scope, T>;
}

/// Host memory lent to queued uploads for the rest of a scope: a `&'scope [T]`, a
/// `&'scope PinnedBuffer<T>`, or the [`HostInFlight`] of an earlier download. Sealed.
pub trait HostSource<'scope, T>: sealed::Host {
    /// The address and length, readable for `'scope`. Code outside the crate can call it, to no
    /// harm: a raw pointer gives nothing without `unsafe`.
    #[doc(hidden)]
    fn host_parts(self) -> (*const T, usize);
}

impl<T: Pod> sealed::Read for DeviceSlice<'_, T> {}
impl<'scope, T: Pod> ScopedRead<'scope, T> for DeviceSlice<'scope, T> {
    fn lend(self, _: sealed::Token) -> DeviceSlice<'scope, T> {
        self
    }
}
impl<T: Pod> sealed::Read for &DeviceSlice<'_, T> {}
impl<'scope, T: Pod> ScopedRead<'scope, T> for &'scope DeviceSlice<'_, T> {
    fn lend(self, _: sealed::Token) -> DeviceSlice<'scope, T> {
        *self
    }
}
impl<T: Pod> sealed::Read for &DeviceSliceMut<'_, T> {}
impl<'scope, T: Pod> ScopedRead<'scope, T> for &'scope DeviceSliceMut<'_, T> {
    fn lend(self, _: sealed::Token) -> DeviceSlice<'scope, T> {
        self.as_slice()
    }
}
impl<T: Pod> sealed::Read for DeviceInFlight<'_, T> {}
impl<'scope, T: Pod> ScopedRead<'scope, T> for DeviceInFlight<'scope, T> {
    fn lend(self, _: sealed::Token) -> DeviceSlice<'scope, T> {
        self.view
    }
}

impl<T: Pod> sealed::Write for DeviceSliceMut<'_, T> {}
impl<'scope, T: Pod> ScopedWrite<'scope, T> for DeviceSliceMut<'scope, T> {
    fn lend_mut(self) -> DeviceSlice<'scope, T> {
        self.into_slice()
    }
}
impl<T: Pod> sealed::Write for &mut DeviceSliceMut<'_, T> {}
impl<'scope, T: Pod> ScopedWrite<'scope, T> for &'scope mut DeviceSliceMut<'_, T> {
    fn lend_mut(self) -> DeviceSlice<'scope, T> {
        // The exclusive borrow, held for `'scope`, seen as shared: nothing else can use the view until
        // the scope ends.
        let lent: &'scope DeviceSliceMut<'_, T> = self;
        lent.as_slice()
    }
}

impl<T: Pod> sealed::Host for &[T] {}
impl<'scope, T: Pod> HostSource<'scope, T> for &'scope [T] {
    fn host_parts(self) -> (*const T, usize) {
        (self.as_ptr(), self.len())
    }
}
impl<T: Pod> sealed::Host for &PinnedBuffer<T> {}
impl<'scope, T: Pod> HostSource<'scope, T> for &'scope PinnedBuffer<T> {
    fn host_parts(self) -> (*const T, usize) {
        (self.as_ptr(), self.len())
    }
}
impl<T: Pod> sealed::Host for HostInFlight<'_, T> {}
impl<'scope, T: Pod> HostSource<'scope, T> for HostInFlight<'scope, T> {
    fn host_parts(self) -> (*const T, usize) {
        (self.ptr.cast_const(), self.len)
    }
}

/// One argument of a kernel launched on a [`ScopedStream`]: a view lent for the rest of the scope
/// (read-only: `DeviceSlice<'scope, T>`, `&'scope DeviceSlice<'_, T>`,
/// `&'scope DeviceSliceMut<'_, T>`, [`DeviceInFlight<'scope, T>`](DeviceInFlight); written:
/// `DeviceSliceMut<'scope, T>`, `&'scope mut DeviceSliceMut<'_, T>`), which the kernel receives as
/// its device address (a `u64`), or a plain value ([`Pod`]), which it receives as it is. Sealed.
pub trait KernelArg<'scope>: sealed::Arg {
    /// What the launch returns for this argument: the [`DeviceInFlight`] of a written view, `()`
    /// for the others.
    type Output;
    /// The value the kernel receives.
    #[doc(hidden)]
    type Param: Copy;
    /// `Err` unless `device` reaches the view's memory; `Ok` for a plain value.
    #[doc(hidden)]
    fn check(&self, device: Device) -> Result<(), Error>;
    /// The parameter, and what the launch returns.
    #[doc(hidden)]
    fn into_param(self) -> (Self::Param, Self::Output);
}

impl<T: Pod> sealed::Arg for T {}
impl<T: Pod> KernelArg<'_> for T {
    type Output = ();
    type Param = T;
    fn check(&self, _: Device) -> Result<(), Error> {
        Ok(())
    }
    fn into_param(self) -> (T, ()) {
        (self, ())
    }
}

/// `KernelArg` for the read-only view forms: the address, and no output.
macro_rules! read_arg {
    ($($ty:ty),*) => {$(
        impl<'scope, T: Pod> sealed::Arg for $ty {}
        impl<'scope, T: Pod> KernelArg<'scope> for $ty {
            type Output = ();
            type Param = sys::CUdeviceptr;
            fn check(&self, device: Device) -> Result<(), Error> {
                reachable(&lend::<'scope, T>(*self), device)
            }
            fn into_param(self) -> (sys::CUdeviceptr, ()) {
                (lend::<'scope, T>(self).as_raw_ptr(), ())
            }
        }
    )*};
}
read_arg!(
    DeviceSlice<'scope, T>,
    &'scope DeviceSlice<'_, T>,
    &'scope DeviceSliceMut<'_, T>,
    DeviceInFlight<'scope, T>
);

impl<T: Pod> sealed::Arg for DeviceSliceMut<'_, T> {}
impl<'scope, T: Pod> KernelArg<'scope> for DeviceSliceMut<'scope, T> {
    type Output = DeviceInFlight<'scope, T>;
    type Param = sys::CUdeviceptr;
    fn check(&self, device: Device) -> Result<(), Error> {
        reachable(&self.as_slice(), device)
    }
    fn into_param(self) -> (sys::CUdeviceptr, DeviceInFlight<'scope, T>) {
        let written = self.lend_mut();
        (written.as_raw_ptr(), DeviceInFlight { view: written })
    }
}
impl<T: Pod> sealed::Arg for &mut DeviceSliceMut<'_, T> {}
impl<'scope, T: Pod> KernelArg<'scope> for &'scope mut DeviceSliceMut<'_, T> {
    type Output = DeviceInFlight<'scope, T>;
    type Param = sys::CUdeviceptr;
    fn check(&self, device: Device) -> Result<(), Error> {
        reachable(&self.as_slice(), device)
    }
    fn into_param(self) -> (sys::CUdeviceptr, DeviceInFlight<'scope, T>) {
        let written = self.lend_mut();
        (written.as_raw_ptr(), DeviceInFlight { view: written })
    }
}

/// The arguments of a kernel launched on a [`ScopedStream`]: a tuple (of up to 12) of
/// [`KernelArg`]s, `()` for none. Sealed.
pub trait KernelArgs<'scope>: sealed::Args {
    /// What the launch returns: the tuple of each argument's [`KernelArg::Output`].
    type Output;
    /// `Err` unless `device` reaches every view's memory.
    #[doc(hidden)]
    fn check(&self, device: Device) -> Result<(), Error>;
    /// Calls `launch` with one pointer per argument, each at the argument's value, alive for the call.
    #[doc(hidden)]
    fn launch_with(
        self,
        launch: impl FnOnce(&mut [*mut c_void]) -> Result<(), Error>,
    ) -> Result<Self::Output, Error>;
}

impl sealed::Args for () {}
impl KernelArgs<'_> for () {
    type Output = ();
    fn check(&self, _: Device) -> Result<(), Error> {
        Ok(())
    }
    fn launch_with(
        self,
        launch: impl FnOnce(&mut [*mut c_void]) -> Result<(), Error>,
    ) -> Result<(), Error> {
        launch(&mut [])
    }
}

macro_rules! kernel_args {
    ($(($($arg:ident $value:ident $out:ident),+))*) => {$(
        impl<'scope, $($arg: KernelArg<'scope>),+> sealed::Args for ($($arg,)+) {}
        impl<'scope, $($arg: KernelArg<'scope>),+> KernelArgs<'scope> for ($($arg,)+) {
            type Output = ($($arg::Output,)+);
            fn check(&self, device: Device) -> Result<(), Error> {
                let ($($value,)+) = self;
                $($arg::check($value, device)?;)+
                Ok(())
            }
            fn launch_with(
                self,
                launch: impl FnOnce(&mut [*mut c_void]) -> Result<(), Error>,
            ) -> Result<Self::Output, Error> {
                let ($($value,)+) = self;
                $(let (mut $value, $out) = $arg::into_param($value);)+
                launch(&mut [$((&raw mut $value).cast::<c_void>()),+])?;
                Ok(($($out,)+))
            }
        }
    )*};
}

kernel_args! {
    (A a oa)
    (A a oa, B b ob)
    (A a oa, B b ob, C c oc)
    (A a oa, B b ob, C c oc, D d od)
    (A a oa, B b ob, C c oc, D d od, E e oe)
    (A a oa, B b ob, C c oc, D d od, E e oe, F f of)
    (A a oa, B b ob, C c oc, D d od, E e oe, F f of, G g og)
    (A a oa, B b ob, C c oc, D d od, E e oe, F f of, G g og, H h oh)
    (A a oa, B b ob, C c oc, D d od, E e oe, F f of, G g og, H h oh, I i oi)
    (A a oa, B b ob, C c oc, D d od, E e oe, F f of, G g og, H h oh, I i oi, J j oj)
    (A a oa, B b ob, C c oc, D d od, E e oe, F f of, G g og, H h oh, I i oi, J j oj, K k ok)
    (A a oa, B b ob, C c oc, D d od, E e oe, F f of, G g og, H h oh, I i oi, J j oj, K k ok, L l ol)
}

#[cfg(test)]
mod tests {
    use super::{Streams, host_bytes};
    use crate::Error;

    #[test]
    fn a_stream_is_registered_once_and_every_one_is_kept() {
        let values: Vec<u32> = (0..10).collect();
        let mut streams = Streams::new();
        for v in values.iter().chain(&values) {
            streams.insert(v);
        }
        let kept: Vec<u32> = streams.iter().copied().collect();
        assert_eq!(kept, values, "inline ones first, then the rest, each once");
        // Equal values at two addresses are two streams.
        let twin = 3u32;
        streams.insert(&twin);
        assert_eq!(streams.iter().count(), 11);
    }

    #[test]
    fn pinned_sizes_are_exact_or_refused() {
        assert_eq!(host_bytes::<u32>(3), Ok(12));
        assert_eq!(host_bytes::<u8>(usize::MAX), Ok(usize::MAX));
        assert_eq!(
            host_bytes::<u32>(0),
            Err(Error::ZeroSize {
                what: "pinned buffer length"
            })
        );
        assert_eq!(
            host_bytes::<()>(5),
            Err(Error::ZeroSize {
                what: "element size"
            })
        );
        assert_eq!(
            host_bytes::<u16>(usize::MAX / 2 + 1),
            Err(Error::Overflow {
                what: "pinned buffer size"
            })
        );
    }
}
