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
//! - **The wait holds under stream capture.** It is the crate's one wait (see [When a wait
//!   fails](crate::stream#when-a-wait-fails)): another thread's capture does not refuse it, and a
//!   capture begun on the scope's stream inside the closure (cudarc's safe `begin_capture`) is
//!   ended by the scope, its graph destroyed, before the scope waits for the work queued before it
//!   and returns [`Error::StreamCapturing`]; so is a capture of this thread's per-thread default
//!   stream that stands in the wait's way.
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
//!   [When a wait fails](crate::stream#when-a-wait-fails)). End every
//!   capture begun inside the closure before the closure returns.
//! - **Result codes newer than cudarc's enum.** cudarc reads every `CUresult` into a Rust enum of
//!   the codes of the CUDA version it was built for, and a code outside it is undefined behaviour
//!   inside cudarc, which this crate cannot fix. The `cudarc` feature picks no version (cudarc
//!   allows one per build, and cargo merges every crate's choice): the application's cudarc
//!   dependency does, or else `nvcc`, or else the newest cudarc knows. So [`scope`] compares,
//!   before its closure runs (once per process), the driver's API version (`cuDriverGetVersion`)
//!   with the one cudarc was built for ([`CUDA_VERSION`](::cudarc::driver::sys::CUDA_VERSION)),
//!   and refuses a newer driver with [`Error::CudarcOlderThanDriver`]: most CUDA releases add codes
//!   (13.0 added 36, 13.1 917, 13.3 918, 13.4 47, 227 and 919) and none has removed one, so a
//!   driver no newer than the enum returns only codes it holds. This crate's own tests build cudarc
//!   for 13.4, the newest cudarc 0.19 knows (from 0.19.10), which admits every driver up to 13.4.
//!   What remains: cudarc's own calls outside the scopes (making its contexts and streams, NVRTC,
//!   cuBLAS) are not checked, so on a newer driver the application's first cudarc call, before
//!   any scope, may already be undefined behaviour; and a driver that returned a code its own
//!   version does not declare would escape the comparison. This crate's own driver calls never go
//!   through cudarc.
//!
//!   Checked with cudarc 0.19.10, the oldest release it builds with (the first with
//!   [`CudaFunction::cu_function`], which [`ScopedStream::launch_cudarc`](crate::stream::ScopedStream::launch_cudarc)
//!   launches; its tests run with 0.19.10 built for CUDA 13.4, on a 13.0 driver); `tests/compat/`
//!   builds the feature, and `nccl`, beside cudarc 0.19.10 built for CUDA 12.8, 13.0 and 13.4,
//!   beside candle's and cubecl's cudarc lines, and in `oldest/` pinned to 0.19.10, with no CUDA
//!   toolkit installed.
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
#[cfg(feature = "nccl")]
use core::ptr;
use core::sync::atomic::{AtomicU8, Ordering};
#[cfg(feature = "nccl")]
use core::time::Duration;
use std::sync::Arc;

use ::cudarc::driver::{CudaFunction, CudaStream, LaunchArgs};
#[cfg(doc)]
use ::cudarc::driver::{DevicePtr, DevicePtrMut, PushKernelArg, SyncOnDrop};
use bytemuck::Pod;

use crate::device::{Context, Device};
use crate::error::Error;
use crate::stream::lend::sealed::Token;
use crate::stream::{ScopedRead, ScopedWrite};
use crate::sys;
#[cfg(doc)]
use crate::view::DeviceSlice;
use crate::wait;

mod launch;
mod lent;
mod state;

#[cfg(feature = "nccl")]
pub(crate) use lent::sealed;
pub use lent::{Lent, LentMut};
use state::State;

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
/// than this crate links (checked once per process); [`Error::CudarcOlderThanDriver`] where the
/// driver's API is newer than the CUDA version cudarc was built for (see the
/// [limit](self#what-it-does-not-cover)); a driver error where the device, the driver's version or
/// the capture status cannot be read. After it, in this order: [`Error::StreamRefused`] where a
/// lent view was refused to an operation (another stream, a copy between two contexts, a capture:
/// the first such refusal, which explains whatever error cudarc returned for the operation); `f`'s
/// error; [`Error::StreamCapturing`] where the stream was capturing when the closure returned (the
/// scope ended the capture and destroyed its graph); the driver's error of the wait (a sticky error
/// of earlier work, see [When a wait fails](crate::stream#when-a-wait-fails)). Whatever it returns,
/// the work queued on the stream has finished.
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
        driver_within_cudarc()?;
        let device = Device::get(context.ordinal())?;
        same_driver(device, context.cu_ctx().addr())?;
        let state = State::new(stream, device);
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
        Ok(Lent::new(view, never_mapped, &self.state))
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
        Ok(LentMut::new(view, never_mapped, &self.state))
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

/// Whether the driver's API version is no newer than the CUDA version cudarc was built for: 0 not
/// known yet, 1 checked.
static DRIVER_WITHIN_CUDARC: AtomicU8 = AtomicU8::new(0);

/// `cuDriverGetVersion` against the CUDA version cudarc was built for
/// ([`CUDA_VERSION`](::cudarc::driver::sys::CUDA_VERSION)): [`Error::CudarcOlderThanDriver`] where
/// the driver is newer. cudarc reads the `CUresult` of each of its calls into a Rust enum of that
/// version's codes, and most CUDA releases add codes (13.0 added 36, 13.1 917, 13.3 918, 13.4 47,
/// 227 and 919); none has removed one, so a driver no newer than the enum returns only codes it
/// holds, and a newer one may return a code it lacks: undefined behaviour inside cudarc. Checked
/// once per process, before any handle of cudarc's reaches this crate's driver calls.
fn driver_within_cudarc() -> Result<(), Error> {
    if DRIVER_WITHIN_CUDARC.load(Ordering::Acquire) == 1 {
        return Ok(());
    }
    cudarc_covers(
        ::cudarc::driver::sys::CUDA_VERSION,
        crate::device::driver_version()?,
    )?;
    DRIVER_WITHIN_CUDARC.store(1, Ordering::Release);
    Ok(())
}

/// The comparison of [`driver_within_cudarc`], both versions as `1000 * major + 10 * minor`.
fn cudarc_covers(cudarc: u32, driver: i32) -> Result<(), Error> {
    if i64::from(driver) > i64::from(cudarc) {
        return Err(Error::CudarcOlderThanDriver { cudarc, driver });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_driver_newer_than_cudarc_is_refused_and_no_other() {
        assert_eq!(
            cudarc_covers(13040, 13000),
            Ok(()),
            "the crate's own build on a 13.0 driver"
        );
        assert_eq!(cudarc_covers(13040, 13040), Ok(()));
        assert_eq!(cudarc_covers(12080, 11040), Ok(()));
        for (cudarc, driver) in [(12080, 13000), (13000, 13010), (13040, 13050), (0, 1)] {
            assert_eq!(
                cudarc_covers(cudarc, driver),
                Err(Error::CudarcOlderThanDriver { cudarc, driver })
            );
        }
        assert_eq!(cudarc_covers(u32::MAX, i32::MAX), Ok(()));
        assert_eq!(cudarc_covers(0, i32::MIN), Ok(()));
    }
}
