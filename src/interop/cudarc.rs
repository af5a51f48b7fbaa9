//! [cudarc](https://docs.rs/cudarc) 0.19 interop (feature `cudarc`): this crate's views lent to
//! cudarc's streams, kernel launches and libraries (cuBLAS, ...) inside [`scope`].
//!
//! # The model
//! cudarc takes device memory through its own traits: [`DevicePtr`] (read) and [`DevicePtrMut`]
//! (written) for its copies and libraries, [`PushKernelArg`] for kernel arguments. A
//! [`DeviceSlice`] or [`DeviceSliceMut`](crate::DeviceSliceMut) (of a grant, a
//! [`VirtualBuffer`](crate::VirtualBuffer) or a [`DeviceBuffer`](crate::DeviceBuffer)) does not
//! implement them: cudarc queues work and returns at once, and a view's borrow may end right after,
//! so the memory could be unmapped or revoked under the queued work. Instead, [`scope`] takes one
//! cudarc stream and waits for it before it returns, as [`crate::scope`] does for this crate's
//! streams; inside, [`Scope::lend`] and [`Scope::lend_mut`] turn views into [`Lent`] and
//! [`LentMut`], which borrow the view for the rest of the scope and implement cudarc's traits:
//!
//! | lent value | [`DevicePtr`] (read) | [`DevicePtrMut`] (written) | kernel argument |
//! | --- | --- | --- | --- |
//! | [`Lent`], from a read-only or a writable view | yes | no: a read-only grant gives nothing cudarc writes | `&lent` |
//! | [`LentMut`], from a writable view, lent exclusively | yes | yes | `&lent` (read), `&mut lent` (written) |
//!
//! ```no_run
//! use cuda_vmm::{Device, ReadWrite, VirtualBuffer, interop::cudarc::scope};
//! use cudarc::driver::CudaContext;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = CudaContext::new(0)?; // the device's primary context, as this crate's `Context`
//! let stream = ctx.new_stream()?;
//! let mut buffer = VirtualBuffer::new(1 << 30, &[Device::get(0)?], ReadWrite)?;
//! let page = buffer.grow(Device::get(0)?, 2 << 20)?;
//! let mut view = buffer.slice_bytes_mut::<f32>(page..page + (2 << 20))?;
//! let mut host = vec![0f32; view.len()];
//! scope(&stream, |s| -> Result<(), Box<dyn std::error::Error>> {
//!     let mut lent = s.lend_mut(&mut view)?; // borrowed until the stream has been waited for
//!     stream.memcpy_htod(&vec![1f32; host.len()], &mut lent)?; // cudarc's own copy
//!     stream.memcpy_dtoh(&lent, &mut host)?;
//!     Ok(())
//! })?; // waits for `stream`; only then does the borrow of `view` end
//! assert!(host.iter().all(|&x| x == 1.0));
//! # Ok(())
//! # }
//! ```
//!
//! # Why it is sound, with cudarc's event tracking and under `mem::forget`
//! cudarc's own [`CudaSlice`](::cudarc::driver::CudaSlice) tracks its uses with events: `device_ptr`
//! makes the stream wait for the slice's last write, and returns a [`SyncOnDrop`] guard that records
//! the slice's read (or write) event once the operation is queued; the slice's `Drop` waits for
//! those events before a stream-ordered free. That rests on two `Drop`s running, and on the memory's
//! end being stream-ordered. Neither holds here: a guard can be forgotten, and `cuMemUnmap` or a
//! revoking `cuMemSetAccess` is not ordered with any stream. So the guard a lent view returns is
//! empty (`SyncOnDrop::Sync(None)`), and nothing depends on any `Drop`:
//!
//! - **The wait is in `scope`'s frame**, after the closure returns or while a panic unwinds through
//!   it, as in [`crate::scope`]. A lent value borrows its view for `'scope`, which lasts until that
//!   wait; `'scope` is invariant and higher-ranked, so no lent value leaves the closure and nothing
//!   the closure owns can be lent. Forgetting a lent value, a guard or the scope handle changes
//!   nothing.
//! - **Only the scope's stream gets the address.** `device_ptr` and `device_ptr_mut` receive the
//!   stream the operation will run on; they hand out the view's address only for the scope's own
//!   stream (the `CudaStream` given to [`scope`], through any clone of its `Arc`), and only while it
//!   is not capturing a graph (a graph could run the work after the scope). For any other stream,
//!   and for cudarc's copy between two contexts (which asks a source for its address with the
//!   source's own [`stream`](::cudarc::driver::DeviceSlice::stream) and then reads on the
//!   destination's stream), they cannot return an error, so they return the address of a range
//!   that is reserved and never mapped: the operation fails or faults, and touches no memory. The
//!   scope then returns [`Error::StreamRefused`].
//! - **An operation pulled into a capture after the check is found.** cudarc's other arguments
//!   can pull the scope's stream into a capture after a lent view's check: its event tracking
//!   makes the stream wait for a `CudaSlice`'s last write, and where that write was recorded
//!   inside a capture of another stream, the wait joins the stream to the capture, so the
//!   operation is captured, not run (`memcpy_dtod(&lent, &mut slice)`). The guard a lent view
//!   returns therefore records an event of the scope (its probe) on the stream right after the
//!   operation is queued: a captured event exactly where the operation was captured. The next lend,
//!   launch builder or collective, and the scope's end, query it first. While the capture is under
//!   way the query answers `CUDA_ERROR_CAPTURED_EVENT` and invalidates the capture (its end makes no
//!   graph, so the captured work never runs), and the scope refuses every later lend and returns
//!   [`Error::StreamCapturing`]. Once the capture has ended with a graph, the query answers
//!   `CUDA_ERROR_INVALID_VALUE`: the graph may replay the lent address after the scope, nothing
//!   sound is left, and the process aborts with a line on stderr starting `cuda-vmm: aborting:`
//!   (measured on an H200, `tests/seam_facts.rs`; `tests/seams.rs` shows both). Where the stream's
//!   context tracks no events (cudarc then records nothing through a guard), the guard waits for the
//!   stream instead; the legacy default stream joins no capture (906), and its guard does nothing.
//! - **Kernel launches** ([`LaunchArgs::launch`]) are `unsafe` in cudarc, and [`PushKernelArg`] is
//!   not told the stream: the launch's contract gains one condition for lent arguments, that it runs
//!   on the scope's stream and is not captured into a graph ([`Scope::launch_builder`] makes a
//!   builder on that stream, after checking that it is not capturing; beginning a capture between
//!   the builder and the launch, or an argument whose events pull the stream into one, breaks the
//!   condition).
//! - **The wait holds under stream capture.** It is the crate's one wait (see
//!   [When a wait fails](crate::scope#when-a-wait-fails)): another thread's capture does not refuse
//!   it, and a capture begun on the scope's stream inside the closure (cudarc's safe
//!   `begin_capture`) is ended by the scope, its graph destroyed, before the scope waits for the work
//!   queued before it and returns [`Error::StreamCapturing`]; so is a capture of this thread's
//!   per-thread default stream that stands in the wait's way.
//! - **No `&mut [T]` of page-locked memory.** cudarc's `memcpy_dtoh` treats every `&mut [T]` as
//!   pageable memory, into which the driver copies before returning (so cudarc returns once the
//!   copy is queued). Behind a `&mut [T]` of page-locked memory the copy would still run after the
//!   return; a [`PinnedBuffer`](crate::PinnedBuffer) gives none, and cudarc's own `PinnedHostSlice`
//!   is made by an `unsafe` function and waits for its own event before it gives a slice. Copy into
//!   a `PinnedBuffer` with this crate's
//!   [`ScopedStream::copy_to_host`](crate::stream::ScopedStream::copy_to_host), whose borrow lasts
//!   until the scope has waited.
//!
//! # What it does not cover
//! - **A capture that another thread begins and ends within one cudarc call.** Any thread can
//!   capture a cudarc stream (`begin_capture` is safe in cudarc, and a `CudaStream` is shared by
//!   `Arc`), so no lock of this crate can keep a capture from beginning between a lent view's check
//!   and cudarc's enqueue. A capture that is still under way at the operation's end takes the probe
//!   too and is found as above; one that another thread begins after the check and ends before the
//!   guard records the probe (a window of one driver call) records the lent address into a graph
//!   that the scope never sees. Do not capture a stream lent to a scope from another thread while
//!   the scope runs; streams of this crate ([`Stream`](crate::Stream)) cannot be captured while a
//!   scope holds them (`Graph::capture` takes them by `&mut`).
//! - **A capture of a cudarc stream that the scope's stream joined and that this thread began.**
//!   The scope's wait cannot end it (only its origin stream can, and the driver does not say which
//!   stream that is), so the wait polls for it; it is ended by no one while this thread waits, and
//!   the process aborts after 10 seconds (see
//!   [When a wait fails](crate::scope#when-a-wait-fails)). End every
//!   capture begun inside the closure before the closure returns.
//! - **Result codes newer than cudarc's table.** cudarc reads every `CUresult` into a Rust enum.
//!   The interop builds cudarc with the CUDA 13.4 API, whose enum holds every code of this crate's
//!   table (13.0's lacks 917 and 918, which 13.x drivers return). A later driver that returns a code
//!   beyond 919 to one of cudarc's own calls would make that call undefined behaviour inside cudarc.
//!   This crate's own driver calls never go through cudarc.
//!
//! # Contexts and streams
//! cudarc's [`CudaContext::new`](::cudarc::driver::CudaContext::new) retains the device's primary
//! context (`cuDevicePrimaryCtxRetain`), as this crate's [`Context`] does: one context per device,
//! one driver (cudarc loads the `libcuda` this crate links, so its handles are this crate's
//! handles: `tests/cudarc.rs` compares them, and the first [`scope`] of the process checks it
//! before any of cudarc's handles reaches this crate's driver calls). Each side holds its own
//! retain, so either may be dropped first: the primary context lives until the last retain of
//! either side ends. A [`VirtualBuffer`](crate::VirtualBuffer) keeps the contexts of its access set
//! retained itself, so dropping every cudarc context does not reset a context under its memory.
//! [`scope`] accepts only streams of primary contexts, and not the per-thread default stream (whose
//! handle means another stream on every thread).

use core::fmt;
use core::marker::PhantomData;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
#[cfg(feature = "nccl")]
use core::time::Duration;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use ::cudarc::driver::{
    CudaEvent, CudaFunction, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice as CudarcSlice,
    LaunchArgs, PushKernelArg, SyncOnDrop,
};
use bytemuck::Pod;

use crate::device::{Context, Device};
use crate::error::{DriverError, DriverResult, Error, check};
use crate::stream::StreamId;
use crate::stream::lend::sealed::Token;
use crate::stream::{ScopedRead, ScopedWrite};
use crate::sys;
use crate::view::DeviceSlice;
use crate::vmm::physical::{Granularity, align_size, allocation_granularity};
use crate::vmm::reservation::VirtualReservation;
use crate::wait;

/// `cuStreamSynchronize` on `stream` when `f` returns — lend views to work queued on a cudarc
/// stream, and wait for it before returning.
///
/// `f` receives the [`Scope`]; [`Scope::lend`] and [`Scope::lend_mut`] turn views into values that
/// cudarc's copies, libraries and kernel launches take ([`Lent`], [`LentMut`]), borrowed for the rest
/// of the scope. When `f` returns, or panics, `scope` waits for `stream`, then returns. The model,
/// and why it is sound, are in the [module documentation](self).
///
/// `f` returns any error type that this crate's [`Error`] converts into (`Box<dyn Error>`, or an
/// application's own), so that cudarc's errors and this crate's can both be returned with `?`.
///
/// # Errors
/// Before `f` runs, [`Error::StreamRefused`] for a stream of a non-primary context, the per-thread
/// default stream, or a stream capturing a graph, or where cudarc loaded another driver library
/// than this crate links (checked once per process); a driver error where the device or the capture
/// status cannot be read. After it, in this order: [`Error::StreamRefused`] where a lent view was
/// refused to an operation (another stream, a copy between two contexts, a capture: the first such
/// refusal, which explains whatever error cudarc returned for the operation); `f`'s error;
/// [`Error::StreamCapturing`] where the stream was capturing when the closure returned (the scope
/// ended the capture and destroyed its graph); the driver's error of the wait (a sticky error of
/// earlier work, see [When a wait fails](crate::scope#when-a-wait-fails)). Whatever it returns, the
/// work queued on the stream has finished.
///
/// # Panics
/// Resumes a panic of `f`, after waiting for the stream.
///
/// # Examples
/// A lent view cannot be unmapped, or outlive its mapping, while cudarc may still use it:
/// ```compile_fail,E0505
/// # use cuda_vmm::{Context, Device, Granularity, PhysicalAllocation, ReadWrite, VirtualReservation};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let device = Device::get(0)?;
/// # let context = Context::new(device)?;
/// # let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
/// # let memory = PhysicalAllocation::new(device, size)?;
/// # let mut reservation = VirtualReservation::new(size, 0)?;
/// let stream = cudarc::driver::CudaContext::new(0)?.new_stream()?;
/// let mut mapping = reservation.region().map(&memory)?;
/// let mut access = mapping.grant(&context, ReadWrite)?;
/// let mut view = access.slice_mut::<u32>()?;
/// cuda_vmm::interop::cudarc::scope(&stream, |s| -> Result<(), Box<dyn std::error::Error>> {
///     stream.memset_zeros(&mut s.lend_mut(&mut view)?)?; // queued, not done
///     mapping.unmap()?; // the memset may still be writing
///     Ok(())
/// })?;
/// # Ok(())
/// # }
/// ```
#[doc(alias = "cuStreamSynchronize")]
pub fn scope<'env, F, R, E>(stream: &'env Arc<CudaStream>, f: F) -> Result<R, E>
where
    F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> Result<R, E>,
    E: From<Error>,
{
    run(stream, &|state| state.wait(), f)
}

/// [`scope`], ending in a wait that polls the stream ([`wait::stream_polled`]) and calls `between`
/// between two polls that find it busy: the end of the NCCL scope, which can stop the work
/// (`ncclCommAbort`) of a peer that never comes.
#[cfg(feature = "nccl")]
pub(crate) fn scope_polled<'env, F, R, E>(
    stream: &'env Arc<CudaStream>,
    between: &dyn Fn(Duration) -> Result<wait::Polling, Error>,
    f: F,
) -> Result<R, E>
where
    F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> Result<R, E>,
    E: From<Error>,
{
    run(stream, &|state| state.wait_polled(between), f)
}

/// The scope of [`scope`] and [`scope_polled`], ending in `end`'s wait for the stream.
fn run<'env, F, R, E>(
    stream: &'env Arc<CudaStream>,
    end: &dyn Fn(&State<'_>) -> Result<(), Error>,
    f: F,
) -> Result<R, E>
where
    F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> Result<R, E>,
    E: From<Error>,
{
    let scope = Scope::enter(stream)?;
    // The wait is in `wait::after`'s frame, on return and while a panic of `f` unwinds, before any
    // borrow lent to the scope ends.
    let (result, waited) = wait::after(|| f(&scope), &|| end(&scope.state));
    if let Some(refusal) = scope.state.take_refusal() {
        return Err(refusal.into());
    }
    let value = result?;
    waited?;
    Ok(value)
}

/// The scope of [`scope`]: it lends views to the work queued on its cudarc stream, and waits for
/// that stream before [`scope`] returns.
///
/// # Lifetimes
/// As [`crate::stream::Scope`]: `'scope` is the scope itself (until the stream has been waited for), `'env`
/// what it borrows from outside (the stream, the views). Both are invariant.
pub struct Scope<'scope, 'env: 'scope> {
    state: State<'scope>,
    /// Invariant in `'env`, as `std::thread::Scope`. `Send` and `Sync`.
    _env: PhantomData<&'env mut &'env ()>,
}

/// What lent values share with their scope.
struct State<'scope> {
    /// The stream the scope waits for: the only one lent views give their address to.
    stream: &'scope Arc<CudaStream>,
    /// What a lent view answers when cudarc asks for its stream (to learn its context): the legacy
    /// default stream of the scope's context, a `CudaStream` value of its own. cudarc's copy between
    /// two contexts asks a source for its address *with this stream*, and then reads on another;
    /// being a different value from [`State::stream`], it is refused. It owns nothing: dropping it,
    /// or a clone that cudarc's user kept, destroys no stream. Made when first asked for (most
    /// scopes, the NCCL scope's among them, never are), which saves an allocation per scope.
    marker: OnceLock<Arc<CudaStream>>,
    device: Device,
    /// The first refusal of a lent view, returned by [`scope`].
    refused: Mutex<Option<Error>>,
    /// The event every cudarc operation that got a lent view's address records on the scope's
    /// stream once it has queued its work (through the guard `device_ptr` returns): recorded inside
    /// a capture exactly where the operation was captured. Made when first needed.
    probe: OnceLock<Option<CudaEvent>>,
    /// Whether the probe was handed to a guard since the scope began (so that a query means
    /// something).
    armed: AtomicBool,
    /// Set once a query found the probe recorded inside a capture still under way, and thereby
    /// invalidated it: every later lend is refused, so nothing records the probe again, and the
    /// capture's end (with no graph) is not taken for one that made a graph.
    poisoned: AtomicBool,
    /// Invariant in `'scope`: a lent value can neither leave the closure nor hold a borrow that ends
    /// before the wait. `Send` and `Sync`.
    _scope: PhantomData<&'scope mut &'scope ()>,
}

impl fmt::Debug for Scope<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope")
            .field("stream", &self.state.stream.cu_stream())
            .field("device", &self.state.device)
            .finish_non_exhaustive()
    }
}

impl<'env> Scope<'_, 'env> {
    /// The checks before the closure runs.
    fn enter(stream: &'env Arc<CudaStream>) -> Result<Self, Error> {
        let context = stream.context();
        if !context.is_primary() {
            return Err(Error::StreamRefused {
                why: "its context is not a primary context (CudaContext::new retains one; this \
                      crate works in primary contexts)",
            });
        }
        if stream.cu_stream().addr() == sys::CU_STREAM_PER_THREAD {
            return Err(Error::StreamRefused {
                why: "it is the per-thread default stream, another stream on every thread",
            });
        }
        let device = Device::get(context.ordinal())?;
        same_driver(device, context.cu_ctx().addr())?;
        let state = State {
            stream,
            marker: OnceLock::new(),
            device,
            refused: Mutex::new(None),
            probe: OnceLock::new(),
            armed: AtomicBool::new(false),
            poisoned: AtomicBool::new(false),
            _scope: PhantomData,
        };
        state.not_capturing()?;
        Ok(Scope {
            state,
            _env: PhantomData,
        })
    }
}

impl<'scope> Scope<'scope, '_> {
    /// The stream the scope waits for: the stream to queue work with lent views on.
    #[must_use]
    pub fn stream(&self) -> &'scope Arc<CudaStream> {
        self.state.stream
    }

    /// The device of the scope's stream.
    #[must_use]
    pub fn device(&self) -> Device {
        self.state.device
    }

    /// Lends `view` for reading to the work queued on the scope's stream, for the rest of the scope:
    /// a `DeviceSlice<'scope, T>`, a `&'scope DeviceSlice<'_, T>`, a `&'scope DeviceSliceMut<'_, T>`
    /// or the [`DeviceInFlight`](crate::stream::DeviceInFlight) of a write queued in an enclosing
    /// [`crate::scope`], which the caller orders before the work on this stream ([`ScopedRead`]).
    ///
    /// # Errors
    /// [`Error::NoPeerAccess`] where the stream's device does not reach the view's memory
    /// ([`DeviceSlice::reachable_from`]); a driver error where the range refused views answer with
    /// cannot be reserved (once per process, at least 1 GiB of address space and no memory).
    /// [`Error::StreamRefused`] for a view of a [`ScopedBuffer`](crate::owned::ScopedBuffer), whose
    /// retires record their events only on its own scope's streams.
    pub fn lend<T: Pod>(
        &'scope self,
        view: impl ScopedRead<'scope, T>,
    ) -> Result<Lent<'scope, T>, Error> {
        // A view whose memory can leave while a scope lasts (a `ScopedBuffer`'s) is refused here: the
        // registry of its scope does not know this stream.
        let (view, _, _) =
            crate::stream::lend::lend(view, Token::new(self.state.stream_id(), false))?
                .into_parts();
        let never_mapped = self.state.admit_view(&view)?;
        Ok(Lent {
            ptr: view.as_raw_ptr(),
            never_mapped,
            view,
            state: &self.state,
        })
    }

    /// Lends `view` for writing, exclusively, to the work queued on the scope's stream, for the rest
    /// of the scope: a `&'scope mut DeviceSliceMut<'_, T>` or a `DeviceSliceMut<'scope, T>`
    /// ([`ScopedWrite`]). A read-only view ([`DeviceSlice`]) is not one: a read-only grant gives
    /// nothing that cudarc writes.
    ///
    /// # Errors
    /// As [`lend`](Scope::lend).
    pub fn lend_mut<T: Pod>(
        &'scope self,
        view: impl ScopedWrite<'scope, T>,
    ) -> Result<LentMut<'scope, T>, Error> {
        let (view, _, _) =
            crate::stream::lend::lend_mut(view, Token::new(self.state.stream_id(), false))?
                .into_parts();
        let never_mapped = self.state.admit_view(&view)?;
        Ok(LentMut {
            ptr: view.as_raw_ptr(),
            never_mapped,
            view,
            state: &self.state,
        })
    }

    /// cudarc's kernel launch builder ([`CudaStream::launch_builder`]) on the scope's stream, the
    /// stream [`LaunchArgs::launch`] must run lent arguments on (and not under a graph capture
    /// begun after this call).
    ///
    /// # Errors
    /// [`Error::StreamRefused`] where the stream is capturing a graph, which could launch the
    /// kernel after the scope; a driver error where the capture status cannot be read.
    pub fn launch_builder<'a>(
        &'a self,
        function: &'a CudaFunction,
    ) -> Result<LaunchArgs<'a>, Error> {
        self.state.not_capturing()?;
        Ok(self.state.stream.launch_builder(function))
    }
}

impl State<'_> {
    /// `cuCtxSetCurrent` of the scope's context: the primary context cudarc retained for the stream,
    /// alive while the stream is.
    fn bind(&self) -> DriverResult<()> {
        let context: sys::CUcontext = self.stream.context().cu_ctx().cast();
        // SAFETY: a context that the stream's `CudaContext` keeps retained, and the stream is
        // borrowed for the whole scope.
        check(unsafe { sys::make_current(context) })
    }

    /// [`State::marker`], made on the first call.
    fn marker(&self) -> &Arc<CudaStream> {
        self.marker
            .get_or_init(|| self.stream.context().default_stream())
    }

    fn raw_stream(&self) -> sys::CUstream {
        self.stream.cu_stream().cast()
    }

    /// The scope's stream as this crate's scopes tell streams apart: its context and its handle.
    fn stream_id(&self) -> StreamId {
        StreamId::new(self.stream.context().cu_ctx().cast(), self.raw_stream())
    }

    /// `cuStreamSynchronize` of the scope's stream, through the wait that holds under stream
    /// capture: it ends a capture begun on the scope's stream (and returns
    /// [`Error::StreamCapturing`] then), and returns only once the work has finished.
    fn wait(&self) -> Result<(), Error> {
        self.last_probe();
        // The stream is alive for the whole scope (the `CudaStream` is borrowed for it), in a
        // context its `CudaContext` keeps retained.
        wait::stream(self.stream.context().cu_ctx().cast(), self.raw_stream())
    }

    /// At the scope's end, before its wait: the probe's last check ([`probed`](State::probed)),
    /// whose refusal the scope returns.
    fn last_probe(&self) {
        if !self.armed.load(Ordering::Acquire) {
            return;
        }
        let checked = self
            .bind()
            .map_err(Error::from)
            .and_then(|()| self.probed());
        if let Err(error) = checked {
            self.refuse(error);
        }
    }

    /// As [`wait`](State::wait), polling the stream and calling `between` between two polls
    /// ([`wait::stream_polled`]).
    #[cfg(feature = "nccl")]
    fn wait_polled(
        &self,
        between: &dyn Fn(Duration) -> Result<wait::Polling, Error>,
    ) -> Result<(), Error> {
        self.last_probe();
        // As in `wait`.
        wait::stream_polled(
            self.stream.context().cu_ctx().cast(),
            self.raw_stream(),
            between,
        )
    }

    /// `Ok` where the scope's stream is not capturing a graph (`cuStreamIsCapturing`), and no
    /// operation that got a lent address before was captured ([`probed`](State::probed)).
    fn not_capturing(&self) -> Result<(), Error> {
        self.bind()?;
        self.probed()?;
        if wait::is_capturing(self.raw_stream())? {
            Err(Error::StreamRefused {
                why: "it is capturing a graph, which could run the work after the scope",
            })
        } else {
            Ok(())
        }
    }

    /// The probe event, made on first use in the scope's context; `None` where the driver refused
    /// to make one (every guard then waits for the stream instead).
    fn probe(&self) -> Option<&CudaEvent> {
        self.probe
            .get_or_init(|| self.stream.context().new_event(None).ok())
            .as_ref()
    }

    /// The guard a lent view's `device_ptr` returns for an operation on `stream`, the scope's
    /// stream, admitted: it records the probe after the operation is queued. Where cudarc would not
    /// record it (its context does not track events), the guard waits for the stream instead;
    /// where the stream is the legacy default stream, which no capture can take (waiting for a
    /// captured event there is refused: 906, measured), it does nothing.
    fn guard<'a>(&'a self, stream: &'a CudaStream) -> SyncOnDrop<'a> {
        if stream.cu_stream().is_null() {
            return SyncOnDrop::Sync(None);
        }
        match self.probe() {
            Some(probe) if stream.context().is_managing_stream_synchronization() => {
                self.armed.store(true, Ordering::Release);
                SyncOnDrop::Record(Some((probe, stream)))
            }
            _ => SyncOnDrop::Sync(Some(stream)),
        }
    }

    /// `cuEventQuery` of the probe, the scope's context current: `Ok` where no cudarc operation
    /// that got a lent address was captured into a graph.
    ///
    /// A cudarc operation checks the stream before it queues, but its other arguments can pull the
    /// stream into a capture after that check: cudarc's event tracking makes the stream wait for a
    /// `CudaSlice`'s last write, and where that write was recorded inside a capture of another
    /// stream, the wait joins this stream to the capture, and the operation is captured, not run.
    /// The probe, recorded right after the operation, is then a captured event too, and the query
    /// tells (measured on an H200, `tests/seam_facts.rs`):
    /// - `CUDA_ERROR_CAPTURED_EVENT` while the capture is under way, and the query invalidates it:
    ///   its end makes no graph, and the captured work never runs. The scope is refused from here
    ///   on ([`Error::StreamCapturing`]);
    /// - `CUDA_ERROR_INVALID_VALUE` once the capture ended with a graph (also after the graph's
    ///   destruction, until the next record). A graph may then hold the lent address and replay it
    ///   after the scope: nothing sound is left, and the process is aborted.
    fn probed(&self) -> Result<(), Error> {
        const CAPTURED: &str = "a cudarc operation on a lent view was captured into a graph (its \
                                stream was pulled into another stream's capture, by cudarc's event \
                                tracking say); the capture was invalidated, and the scope lends \
                                nothing more";
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::StreamCapturing { what: CAPTURED });
        }
        if !self.armed.load(Ordering::Acquire) {
            return Ok(());
        }
        let Some(probe) = self.probe() else {
            return Ok(());
        };
        // SAFETY: an event of the scope's context (current: the callers bind it), alive while the
        // scope is; the query only reads its state. The result is read as an integer.
        let code = unsafe { sys::cuEventQuery(probe.cu_event().cast()) };
        match DriverError::from_raw(code) {
            Some(e) if (900..=908).contains(&e.code()) => {
                self.poisoned.store(true, Ordering::Release);
                Err(Error::StreamCapturing { what: CAPTURED })
            }
            Some(e) if e == DriverError::INVALID_VALUE => wait::abort_process(format_args!(
                "a cudarc operation on a view lent to a scope was captured into a graph that \
                 outlived its capture (the scope's probe event was last recorded inside it): the \
                 graph may replay the lent address after the scope"
            )),
            // Not ready, complete, or a sticky error that the scope's wait reports.
            _ => Ok(()),
        }
    }

    /// The checks of [`Scope::lend`]: the scope's device reaches the view; returns the address of a
    /// never-mapped range at least as large as the view.
    fn admit_view<T>(&self, view: &DeviceSlice<'_, T>) -> Result<u64, Error>
    where
        T: Pod,
    {
        if !view.reachable_from(self.device) {
            return Err(Error::NoPeerAccess {
                device: self.device.as_raw(),
                owner: view.device().as_raw(),
            });
        }
        let bytes = view
            .len()
            .checked_mul(size_of::<T>())
            .ok_or(Error::Overflow { what: "view size" })?;
        never_mapped(bytes, self.device)
    }

    /// The address an operation on `stream` gets, with its guard: `ptr` and the probe's guard
    /// ([`guard`](State::guard)) for the scope's own stream while it is not capturing and nothing
    /// lent was captured; `never_mapped` and no guard (and a refusal the scope returns) otherwise.
    fn address<'a>(
        &'a self,
        stream: &'a CudaStream,
        ptr: u64,
        never_mapped: u64,
    ) -> (u64, SyncOnDrop<'a>) {
        let admitted = if ptr::eq(stream, Arc::as_ptr(self.stream)) {
            self.not_capturing()
        } else {
            Err(Error::StreamRefused {
                why: "a lent view was asked for its address for another stream than its scope's \
                      (queue the work on Scope::stream; a copy between two contexts reads on the \
                      destination's stream, so lend both views in a scope on that stream)",
            })
        };
        match admitted {
            Ok(()) => (ptr, self.guard(stream)),
            Err(error) => {
                self.refuse(error);
                (never_mapped, SyncOnDrop::Sync(None))
            }
        }
    }

    /// Keeps `error` as the scope's refusal, unless an earlier one is kept already.
    fn refuse(&self, error: Error) {
        let mut refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        refused.get_or_insert(error);
    }

    fn take_refusal(&self) -> Option<Error> {
        self.refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

#[cfg(feature = "nccl")]
impl Scope<'_, '_> {
    /// For one collective of the NCCL scope, queued on this scope's stream: the address of each of
    /// `lent`, from one capture check for all of them (a lent value's own `device_ptr` checks
    /// once per address). Where the stream captures a graph, or a value was lent in another scope,
    /// each gets its never-mapped address instead, and the scope returns the refusal.
    pub(crate) fn collective_addresses<const N: usize>(
        &self,
        lent: [sealed::LentAddress; N],
    ) -> [u64; N] {
        let ours = ptr::from_ref(&self.state).cast::<()>();
        let admitted = if lent.iter().all(|l| l.state == ours) {
            self.state.not_capturing()
        } else {
            Err(Error::StreamRefused {
                why: "a lent view was given to a collective of another scope than the one it was \
                      lent in",
            })
        };
        match admitted {
            Ok(()) => lent.map(|l| l.ptr),
            Err(error) => {
                self.state.refuse(error);
                lent.map(|l| l.never_mapped)
            }
        }
    }
}

/// What the NCCL scope's collectives take of a lent value, in a module of its own: a public type
/// that only this crate can name.
#[cfg(feature = "nccl")]
pub(crate) mod sealed {
    /// A lent value's address, its never-mapped address, and the scope it was lent in
    /// ([`Scope::collective_addresses`](super::Scope::collective_addresses)).
    #[derive(Debug, Clone, Copy)]
    pub struct LentAddress {
        pub(super) ptr: u64,
        pub(super) never_mapped: u64,
        /// The lending scope's state, compared by address only.
        pub(super) state: *const (),
    }
}

/// Whether cudarc's driver is this crate's: 0 not known yet, 1 checked.
static SAME_DRIVER: AtomicU8 = AtomicU8::new(0);

/// `Ok` where `cudarc_context`, a primary context cudarc retained for `device`, is the primary
/// context this crate's driver has for it: cudarc loads `libcuda` at run time, and a library other
/// than the one this crate links would be a second driver, whose handles must never reach this
/// crate's calls. Checked once per process (no handle of cudarc's is passed to the driver before),
/// by retaining the primary context here as well: while both are retained, one driver answers with
/// the same handle.
fn same_driver(device: Device, cudarc_context: usize) -> Result<(), Error> {
    if SAME_DRIVER.load(Ordering::Acquire) == 1 {
        return Ok(());
    }
    let ours = Context::new(device)?;
    if ours.as_raw().addr() != cudarc_context {
        return Err(Error::StreamRefused {
            why: "its context is not the device's primary context of this crate's driver: cudarc \
                  loaded another CUDA driver library than the one this crate links",
        });
    }
    SAME_DRIVER.store(1, Ordering::Release);
    Ok(())
}

/// Ranges of address space that are reserved and never mapped, and never freed (a `static`'s value
/// is never dropped): a refused lent view answers with an address in one, so that work queued where
/// the scope does not wait for it touches no memory at all.
static NEVER_MAPPED: Mutex<Vec<VirtualReservation>> = Mutex::new(Vec::new());

/// The smallest never-mapped range: one serves every view up to this size.
const NEVER_MAPPED_MINIMUM: usize = 1 << 30;

/// The base of the first range of [`NEVER_MAPPED`] (at least [`NEVER_MAPPED_MINIMUM`] bytes), 0
/// before there is one: read without the lock by every lend of a view that fits it.
static NEVER_MAPPED_FIRST: AtomicU64 = AtomicU64::new(0);

/// The base of a never-mapped range of at least `bytes`, reserved once per process (and again only
/// for a larger view).
fn never_mapped(bytes: usize, device: Device) -> Result<u64, Error> {
    if bytes <= NEVER_MAPPED_MINIMUM {
        // Stored only once its range is reserved, which is never freed.
        let first = NEVER_MAPPED_FIRST.load(Ordering::Acquire);
        if first != 0 {
            return Ok(first);
        }
    }
    let mut ranges = NEVER_MAPPED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(range) = ranges.iter().find(|r| r.size() >= bytes) {
        return Ok(range.base());
    }
    let granularity = allocation_granularity(device, Granularity::Minimum)?;
    let range =
        VirtualReservation::new(align_size(bytes.max(NEVER_MAPPED_MINIMUM), granularity)?, 0)?;
    let base = range.base();
    ranges.push(range);
    if ranges.len() == 1 {
        NEVER_MAPPED_FIRST.store(base, Ordering::Release);
    }
    Ok(base)
}

/// A view lent for reading to the work queued on a [`scope`]'s cudarc stream: cudarc's
/// [`DevicePtr`] for its copies and libraries, and `&lent` as a kernel argument ([`PushKernelArg`]).
/// Made by [`Scope::lend`]; it borrows the view for the rest of the scope.
///
/// # Lifetimes
/// `'scope` is the scope's: invariant, so the value can neither leave the closure nor hold a borrow
/// that ends before the scope's wait.
pub struct Lent<'scope, T> {
    /// The view's address, kept in the value so that a kernel argument can point at it.
    ptr: u64,
    /// What a refused operation gets instead: a never-mapped range at least as large.
    never_mapped: u64,
    /// The view, borrowed for the scope.
    view: DeviceSlice<'scope, T>,
    state: &'scope State<'scope>,
}

/// A view lent for writing, exclusively, to the work queued on a [`scope`]'s cudarc stream: cudarc's
/// [`DevicePtr`] and [`DevicePtrMut`], and `&lent` (read) or `&mut lent` (written) as a kernel
/// argument. Made by [`Scope::lend_mut`] from a writable view; it borrows it exclusively for the
/// rest of the scope.
///
/// # Lifetimes
/// As [`Lent`].
pub struct LentMut<'scope, T> {
    ptr: u64,
    never_mapped: u64,
    /// The writable view's memory, lent exclusively for the scope (seen as read-only, as a queued
    /// write of [`crate::stream::ScopedStream`] returns it).
    view: DeviceSlice<'scope, T>,
    state: &'scope State<'scope>,
}

#[cfg(feature = "nccl")]
impl<T> Lent<'_, T> {
    /// What a collective of the NCCL scope takes of the value.
    pub(crate) fn lent_address(&self) -> sealed::LentAddress {
        sealed::LentAddress {
            ptr: self.ptr,
            never_mapped: self.never_mapped,
            state: ptr::from_ref(self.state).cast(),
        }
    }
}

#[cfg(feature = "nccl")]
impl<T> LentMut<'_, T> {
    /// As [`Lent::lent_address`].
    pub(crate) fn lent_address(&self) -> sealed::LentAddress {
        sealed::LentAddress {
            ptr: self.ptr,
            never_mapped: self.never_mapped,
            state: ptr::from_ref(self.state).cast(),
        }
    }
}

impl<T> Clone for Lent<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Lent<'_, T> {}

impl<T: Pod> fmt::Debug for Lent<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Lent").field(&self.view).finish()
    }
}

impl<T: Pod> fmt::Debug for LentMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LentMut").field(&self.view).finish()
    }
}

impl<T: Pod> CudarcSlice<T> for Lent<'_, T> {
    fn len(&self) -> usize {
        self.view.len()
    }

    /// The legacy default stream of the scope's context, which cudarc asks for the view's context:
    /// not the scope's stream, and refused the view's address. Queue work on [`Scope::stream`].
    fn stream(&self) -> &Arc<CudaStream> {
        self.state.marker()
    }
}

impl<T: Pod> CudarcSlice<T> for LentMut<'_, T> {
    fn len(&self) -> usize {
        self.view.len()
    }

    /// The legacy default stream of the scope's context, which cudarc asks for the view's context:
    /// not the scope's stream, and refused the view's address. Queue work on [`Scope::stream`].
    fn stream(&self) -> &Arc<CudaStream> {
        self.state.marker()
    }
}

impl<T: Pod> DevicePtr<T> for Lent<'_, T> {
    /// The view's address for an operation on the scope's stream; a never-mapped address (and a
    /// refusal the scope returns) otherwise. The guard is empty: the scope waits for the stream.
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        self.state.address(stream, self.ptr, self.never_mapped)
    }
}

impl<T: Pod> DevicePtr<T> for LentMut<'_, T> {
    /// As for [`Lent`].
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        self.state.address(stream, self.ptr, self.never_mapped)
    }
}

impl<T: Pod> DevicePtrMut<T> for LentMut<'_, T> {
    /// As `device_ptr`: the view's address for an operation on the scope's stream, a never-mapped
    /// address otherwise.
    fn device_ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        self.state.address(stream, self.ptr, self.never_mapped)
    }
}

// SAFETY: pushes a pointer to `arg.ptr` through cudarc's own implementation for `&'b u64` (a
// `DeviceRepr`): a `u64` device address that lives in `arg`, borrowed for `'b`, which outlives the
// builder (`'b: 'a`), as that implementation requires. The kernel receives the view's address; the
// view is borrowed for `'scope` (`'scope: 'b`), until the scope has waited for its stream. What the
// pointer's use needs beyond this is the condition that `LaunchArgs::launch` (which is `unsafe`)
// adds for lent arguments: the launch runs on the scope's stream, not captured into a graph (module
// documentation), and the kernel only reads a read-only argument, within its `len()` values.
unsafe impl<'a, 'b: 'a, T: Pod> PushKernelArg<&'b Lent<'_, T>> for LaunchArgs<'a> {
    #[inline]
    fn arg(&mut self, arg: &'b Lent<'_, T>) -> &mut Self {
        <Self as PushKernelArg<&'b u64>>::arg(self, &arg.ptr)
    }
}

// SAFETY: as for `&Lent`: a read-only argument made from a writable lent view.
unsafe impl<'a, 'b: 'a, T: Pod> PushKernelArg<&'b LentMut<'_, T>> for LaunchArgs<'a> {
    #[inline]
    fn arg(&mut self, arg: &'b LentMut<'_, T>) -> &mut Self {
        <Self as PushKernelArg<&'b u64>>::arg(self, &arg.ptr)
    }
}

// SAFETY: as for `&Lent`; the view is lent exclusively, so the kernel may write its `len()` values.
unsafe impl<'a, 'b: 'a, T: Pod> PushKernelArg<&'b mut LentMut<'_, T>> for LaunchArgs<'a> {
    #[inline]
    fn arg(&mut self, arg: &'b mut LentMut<'_, T>) -> &mut Self {
        let ptr: &'b u64 = &arg.ptr;
        <Self as PushKernelArg<&'b u64>>::arg(self, ptr)
    }
}
