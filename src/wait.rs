//! The one wait that cannot come back early: every path of this crate that must not return while
//! work may still run waits here. That is both scopes' ends (the NCCL scope's by polling,
//! [`stream_polled`], so that it can give up on a peer that never comes), the ends of
//! [`RevocableAccess`](crate::vmm::RevocableAccess) and [`PeerAccess`](crate::PeerAccess), every
//! synchronous copy and memset, the staged copy, the synchronous launch, and the public
//! `synchronize` methods.
//!
//! # Why a plain wait is not enough
//! A failed `cuStreamSynchronize`, `cuCtxSynchronize` or synchronous `cuMemcpy*` does not mean
//! that the work has stopped. Stream capture makes the driver answer at once, without waiting:
//! - a wait on a stream that is capturing a graph fails in every capture mode;
//! - while any thread captures in `GLOBAL` mode (CUDA's default), every thread whose own mode is
//!   `GLOBAL` has its waits and synchronous copies refused. A refused synchronous copy may have
//!   been queued, and then runs afterwards.
//!
//! Those errors (900–908) are not sticky: the work queued before the capture runs on. A scope that
//! returned on such an error would end its borrows under running work (measured on an H200: an
//! unmap under a running memset, a host slice read while a DMA wrote it).
//!
//! # What this wait does
//! 1. The calling thread's capture mode is `RELAXED` for the wait
//!    (`cuThreadExchangeStreamCaptureMode`), and its own mode is restored afterwards. No other
//!    thread's capture then refuses the wait or a synchronous copy. A stream wait first tries once
//!    in the thread's own mode, which costs nothing where it succeeds, and goes on in `RELAXED`
//!    mode only where that try fails (see [`stream`]).
//! 2. A wait refused because the waited stream is itself capturing ends that capture
//!    (`cuStreamEndCapture`) where the driver lets this thread end it, destroys its graph, and
//!    waits again. The graph would hold the addresses of the work queued into it, and could run
//!    after the scope. The wait then reports [`Error::StreamCapturing`], after the work has
//!    finished.
//! 3. A capture of this thread's per-thread default stream that is in the wait's way is ended
//!    too, as in step 2: it makes a wait of the legacy default stream an implicit dependency
//!    (906), refuses a wait of the context, and cannot be ended through a stream that joined it.
//!    Only this thread can have begun it, so waiting for it to end would wait for this very thread.
//! 4. A capture that this thread may not end is waited out, polling. That is a capture that
//!    another stream began and the waited one joined, or that another thread began in a mode other
//!    than `RELAXED`. So is any capture in the context for a context wait: `cuCtxSynchronize` is
//!    refused, in `RELAXED` mode too, while any stream of the context captures (measured on an
//!    H200, `tests/capture_facts.rs`). Polling lasts at most [`CAPTURE_PATIENCE`].
//! 5. A wait that fails for any other reason is settled with `cuCtxSynchronize`. If that
//!    succeeds, every piece of work of the context has finished. If it fails with the same error,
//!    the error is sticky: the driver repeated it for a call that did not cause it, and a context
//!    in that state runs no more work. Either way the wait returns the error.
//! 6. Where none of this can prove the work finished, the process is **aborted**, with a line on
//!    stderr that starts with `cuda-vmm: aborting:`. That covers a capture that outlasts
//!    [`CAPTURE_PATIENCE`], an error that is neither repeated nor cleared, and a context that
//!    cannot be made current for any reason but a driver shutting down. Returning would let
//!    borrows end under running work, and unwinding would too. A process abort is the only answer
//!    that stays sound.

use core::cell::Cell;
use core::ptr;
use std::io::Write as _;
use std::time::{Duration, Instant};

use crate::error::{DriverError, DriverResult, Error, check};
use crate::sys;

/// How long a wait polls for a capture it cannot end itself before it aborts the process. A
/// capture normally lasts microseconds to milliseconds, while the host queues a step.
pub(crate) const CAPTURE_PATIENCE: Duration = Duration::from_secs(10);

/// The longest pause between two polls.
const LONGEST_PAUSE: Duration = Duration::from_millis(1);

/// What a wait waits for.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// Every operation queued on the stream (the null handle: the context's legacy default stream).
    Stream(sys::CUstream),
    /// The event's last record.
    Event(sys::CUevent),
    /// Every operation queued in the context.
    Context,
}

/// Waits until every operation queued on `stream`, a live stream of `context` (or null for its
/// legacy default stream), has finished. See the [module documentation](self).
///
/// # Errors
/// [`Error::StreamCapturing`] where the stream was capturing and the wait ended the capture; a
/// driver error where the work failed (a sticky error, proven) or the context's other work
/// finished with the wait's error. In every case the work has finished when this returns.
pub(crate) fn stream(context: sys::CUcontext, stream: sys::CUstream) -> Result<(), Error> {
    // First in the thread's own mode, which costs no driver call beyond the wait itself (the
    // overhead of a scope around a small copy is measured against the raw wait): where it succeeds,
    // the work has finished. Any failure, a capture's refusal included, goes on to the wait that
    // holds. In `GLOBAL` mode that first attempt is refused while another thread captures in
    // `GLOBAL` mode, and the driver then invalidates that capture, as it does for every
    // potentially unsafe call of any thread during such a capture; a capture in `THREAD_LOCAL` or
    // `RELAXED` mode is not disturbed.
    // A thread that is capturing a graph itself (`Graph::capture`, `THREAD_LOCAL` mode) skips that
    // attempt: the driver would refuse it and invalidate the capture.
    if CAPTURING.with(Cell::get) == 0 {
        bind(context)?;
        // SAFETY: a live stream of the current context (bound just above), or null for its legacy
        // default stream: the caller's guarantee.
        if check(unsafe { sys::cuStreamSynchronize(stream) }).is_ok() {
            return Ok(());
        }
    }
    wait(context, Target::Stream(stream))
}

/// What the caller of [`stream_polled`] says between two polls of a stream that is still busy.
#[cfg(feature = "nccl")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Polling {
    /// Poll again (the caller has paused as long as it wants).
    Again,
    /// Stop polling: [`stream`] decides, blocking until the work has finished.
    Block,
}

/// Waits until every operation queued on `stream`, a live stream of `context` (or null for its
/// legacy default stream), has finished, by polling it (`cuStreamQuery`) and calling `between`
/// with the time waited so far between two polls that find it busy: for a wait that must be able
/// to give up on work that may never finish (NCCL's, whose peer can vanish), where `between` can
/// stop the work (abort the communicator) and return why.
///
/// A poll that finds the stream idle proves the work finished, as the one wait would, and returns
/// at once: no `cuStreamSynchronize` follows (measured on an H200: one after a poll that found the
/// work done costs about 1.3 µs, a cost the wait of a 64 MiB collective would pay each time).
/// Everything else goes to [`stream`], which returns only once the work has finished: a stream
/// that is capturing (not polled at all), a poll that fails (a capture's refusal, a sticky
/// error), [`Polling::Block`], and an error of `between`, which this returns after that wait. The
/// polls run with this thread in `RELAXED` capture mode, so that another thread's capture neither
/// refuses them nor is invalidated by them (nor is this thread's own, under `Graph::capture`).
///
/// # Errors
/// `between`'s error, after [`stream`]'s wait; else as [`stream`]. In every case the work has
/// finished when this returns.
#[cfg(feature = "nccl")]
pub(crate) fn stream_polled(
    context: sys::CUcontext,
    stream: sys::CUstream,
    between: &dyn Fn(Duration) -> Result<Polling, Error>,
) -> Result<(), Error> {
    let polled = {
        let _relaxed = Relaxed::enter();
        bind(context)?;
        poll(stream, between)
    };
    match polled {
        Ok(true) => Ok(()),
        Ok(false) => self::stream(context, stream),
        Err(error) => {
            // The error is what the caller asked to report; the wait's own error, if any, comes
            // from the work it stopped.
            let _ = self::stream(context, stream);
            Err(error)
        }
    }
}

/// The polls of [`stream_polled`], in the current context: `Ok(true)` once a poll found `stream`
/// idle, `Ok(false)` where polling cannot decide (the stream captures, a poll failed, `between`
/// said [`Polling::Block`]), `between`'s error.
#[cfg(feature = "nccl")]
fn poll(
    stream: sys::CUstream,
    between: &dyn Fn(Duration) -> Result<Polling, Error>,
) -> Result<bool, Error> {
    if !matches!(is_capturing(stream), Ok(false)) {
        return Ok(false);
    }
    let since = Instant::now();
    loop {
        // SAFETY: a live stream of the current context (the caller's guarantee; bound by
        // `stream_polled`); a query only reads the stream's state.
        match check(unsafe { sys::cuStreamQuery(stream) }) {
            Ok(()) => return Ok(true),
            Err(e) if e == DriverError::NOT_READY => {}
            Err(_) => return Ok(false),
        }
        if between(since.elapsed())? == Polling::Block {
            return Ok(false);
        }
    }
}

thread_local! {
    /// How many graph captures this thread has under way (`Graph::capture`, nested ones included).
    static CAPTURING: Cell<u32> = const { Cell::new(0) };
}

/// Whether this thread is capturing a graph (`Graph::capture`) now.
#[cfg(feature = "nccl")]
pub(crate) fn capturing_here() -> bool {
    CAPTURING.with(Cell::get) > 0
}

/// This thread captures a graph for as long as the value lives: its waits go straight to
/// `RELAXED` mode, where its own `THREAD_LOCAL` capture refuses none of them.
pub(crate) struct CapturingHere(());

impl CapturingHere {
    pub(crate) fn enter() -> CapturingHere {
        CAPTURING.with(|c| c.set(c.get().saturating_add(1)));
        CapturingHere(())
    }
}

impl Drop for CapturingHere {
    fn drop(&mut self) {
        CAPTURING.with(|c| c.set(c.get().saturating_sub(1)));
    }
}

/// Waits until `event`, a live event of `context`, has completed its last record.
///
/// # Errors
/// As [`stream`]; an event last recorded in a capture is waited out, as a capture this thread
/// cannot end.
pub(crate) fn event(context: sys::CUcontext, event: sys::CUevent) -> Result<(), Error> {
    wait(context, Target::Event(event))
}

/// Waits until every operation queued in `context` has finished.
///
/// # Errors
/// As [`stream`].
pub(crate) fn context(context: sys::CUcontext) -> Result<(), Error> {
    wait(context, Target::Context)
}

/// How a synchronous driver call relates to the work it queues on the legacy default stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Returns {
    /// The call may return before its work has finished (a copy from host or between devices, a
    /// memset, a launch): the legacy default stream is always waited for afterwards.
    Early,
    /// The call returns once its work has finished, when it succeeds (a copy to host memory). Only
    /// a failed call is followed by a wait, since it may have queued the work all the same.
    WhenDone,
}

/// Runs `call`, a synchronous copy, memset or launch on the legacy default stream of `context`,
/// with this thread in `RELAXED` capture mode, and then waits for that stream as [`stream`] does
/// (see [`Returns`]). When this returns, the work `call` queued has finished, whether `call`
/// succeeded or not.
///
/// # Errors
/// `call`'s error, else the wait's (as [`stream`]).
pub(crate) fn synchronous(
    context: sys::CUcontext,
    returns: Returns,
    call: impl FnOnce() -> sys::CUresult,
) -> Result<(), Error> {
    let _relaxed = Relaxed::enter();
    bind(context)?;
    let called = check(call());
    if called.is_ok() && returns == Returns::WhenDone {
        return Ok(());
    }
    let waited = stream(context, ptr::null_mut());
    called?;
    waited
}

/// Runs `body`, then `wait`, in this frame: on return, and also while a panic unwinds out of `body`
/// (a guard local to this frame, which `body` never sees, waits in its `Drop`). The one wait both
/// scopes end with ([`crate::scope`] and the cudarc interop's): the borrows lent to queued work
/// end only after it, whatever `body` does, and forgetting any value `body` holds changes nothing.
/// Returns `body`'s value and the wait's result; where `body` panics, the panic goes on once the wait
/// has returned (its error is then dropped).
pub(crate) fn after<T>(
    body: impl FnOnce() -> T,
    wait: &dyn Fn() -> Result<(), Error>,
) -> (T, Result<(), Error>) {
    /// Waits when dropped, which happens only while a panic unwinds through [`after`]; on a normal
    /// return the guard is not dropped, and [`after`] waits itself to report the error.
    struct WaitOnUnwind<'w>(&'w dyn Fn() -> Result<(), Error>);

    impl Drop for WaitOnUnwind<'_> {
        fn drop(&mut self) {
            // Unwinding: the error cannot be returned, and the panic goes on once the work has
            // been waited for.
            let _ = (self.0)();
        }
    }

    let guard = WaitOnUnwind(wait);
    let value = body();
    let guard = core::mem::ManuallyDrop::new(guard);
    (value, (guard.0)())
}

/// `cuStreamIsCapturing`: `true` where `stream` (of the current context) is capturing a graph,
/// valid or invalidated.
///
/// # Errors
/// The driver's error, such as `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` for the legacy default stream
/// while a blocking stream of its context captures.
pub(crate) fn is_capturing(stream: sys::CUstream) -> DriverResult<bool> {
    let mut status: u32 = sys::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: `status` is writable for the call; the caller passes a live stream of the current
    // context. The status is read as an integer, never as an enum.
    check(unsafe { sys::cuStreamIsCapturing(stream, &raw mut status) })?;
    Ok(status != sys::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// `cuStreamIsCapturing` of the legacy default stream: `true` where a blocking stream of the current
/// context captures a graph, in any mode, begun by any thread. The driver answers
/// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` then, and leaves the capture as it was; the per-thread
/// default streams are blocking streams. A capture of a non-blocking stream is not seen here
/// (`tests/seam_facts.rs`, `a_legacy_query_sees_the_captures_of_blocking_streams_only`).
///
/// # Errors
/// Any other error of the driver's.
#[cfg(feature = "nccl")]
pub(crate) fn blocking_stream_capturing() -> DriverResult<bool> {
    match is_capturing(sys::CU_STREAM_LEGACY as sys::CUstream) {
        Err(e) if e == DriverError::STREAM_CAPTURE_IMPLICIT => Ok(true),
        // The legacy stream itself never captures: its own status is `NONE`.
        other => other,
    }
}

/// Sets the calling thread's capture mode to `RELAXED` for the rest of its life: for a thread of
/// this crate's own that runs no code but the crate's (a reserve's worker). Another thread's capture
/// in `GLOBAL` mode then neither refuses the thread's VMM calls nor is invalidated by them; every
/// call the worker makes concerns pages no captured work can reach. A refused exchange leaves the
/// thread's mode as it was (its calls are then refused under such a capture, and reported as
/// faults).
pub(crate) fn relax_this_thread() {
    let mut mode = sys::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: `mode` is readable and writable for the call; the exchange concerns only the
    // calling thread and needs no context.
    let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&raw mut mode) };
}

/// The calling thread's capture mode set to `RELAXED` for as long as the value lives, and given
/// back when it is dropped. Local to the frames of this module: it is never handed out, so a
/// forgotten one cannot leave a thread relaxed.
struct Relaxed {
    /// The mode to give back; `None` where the exchange failed (the wait then runs in the thread's
    /// own mode, and a refusal is handled as a failed wait).
    previous: Option<u32>,
}

impl Relaxed {
    fn enter() -> Relaxed {
        let mut mode = sys::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: `mode` is readable and writable for the call; the exchange concerns only the
        // calling thread and needs no context.
        let code = unsafe { sys::cuThreadExchangeStreamCaptureMode(&raw mut mode) };
        Relaxed {
            previous: check(code).is_ok().then_some(mode),
        }
    }
}

impl Drop for Relaxed {
    fn drop(&mut self) {
        if let Some(mut mode) = self.previous {
            // SAFETY: as in `enter`; `mode` is the value the driver gave this thread back then.
            // An error is ignored: the thread keeps the `RELAXED` mode, which makes none of its
            // later calls less safe (the driver still refuses what conflicts with a capture).
            let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&raw mut mode) };
        }
    }
}

/// Polls a condition that only someone else can end, for at most [`CAPTURE_PATIENCE`].
struct Patience {
    since: Option<Instant>,
    pause: Duration,
}

impl Patience {
    fn new() -> Patience {
        Patience {
            since: None,
            pause: Duration::from_micros(10),
        }
    }

    /// Sleeps a little (10 µs first, twice as long each time, 1 ms at most), or aborts the process
    /// once [`CAPTURE_PATIENCE`] has passed since the first pause.
    fn pause(&mut self, error: DriverError) {
        let since = *self.since.get_or_insert_with(Instant::now);
        if since.elapsed() >= CAPTURE_PATIENCE {
            abort(format_args!(
                "a wait for GPU work stayed refused for {CAPTURE_PATIENCE:?} by a stream capture \
                 this thread cannot end ({error}); returning would end borrows while the work may \
                 still run"
            ));
        }
        std::thread::sleep(self.pause);
        self.pause = (self.pause * 2).min(LONGEST_PAUSE);
    }
}

/// Whether `error` is one of the stream-capture family (900–908), which the driver answers at
/// once, without waiting and without a sticky error.
fn is_capture_error(error: DriverError) -> bool {
    (900..=908).contains(&error.code())
}

/// [`abort`], for the other modules' last resorts (a lent address kept in a graph that outlived
/// its capture).
#[cfg(feature = "cudarc")]
pub(crate) fn abort_process(why: core::fmt::Arguments<'_>) -> ! {
    abort(why)
}

/// Prints why, then aborts the process: the last resort where no wait can be proven.
fn abort(why: core::fmt::Arguments<'_>) -> ! {
    // A failed write changes nothing: the process aborts either way.
    let _ = writeln!(std::io::stderr(), "cuda-vmm: aborting: {why}");
    std::process::abort()
}

/// `cuCtxSetCurrent` of `context`, on which the wait depends. Only a driver that is shutting down
/// (`CUDA_ERROR_DEINITIALIZED`, which runs no more work) is an error; any other failure aborts.
fn bind(context: sys::CUcontext) -> Result<(), Error> {
    // SAFETY: the caller passes a context it keeps retained for the call.
    match check(unsafe { sys::make_current(context) }) {
        Ok(()) => Ok(()),
        Err(error) if error == DriverError::DEINITIALIZED => Err(error.into()),
        Err(error) => abort(format_args!(
            "the context of a wait for GPU work could not be made current ({error})"
        )),
    }
}

fn wait(context: sys::CUcontext, target: Target) -> Result<(), Error> {
    let _relaxed = Relaxed::enter();
    bind(context)?;
    let mut patience = Patience::new();
    let mut ended = false;
    loop {
        let code = match target {
            // SAFETY: a live stream of the current context (bound above), or null for its legacy
            // default stream: the caller's guarantee.
            Target::Stream(stream) => unsafe { sys::cuStreamSynchronize(stream) },
            // SAFETY: a live event of the current context: the caller's guarantee.
            Target::Event(event) => unsafe { sys::cuEventSynchronize(event) },
            // SAFETY: no arguments; the context is current (bound above).
            Target::Context => unsafe { sys::cuCtxSynchronize() },
        };
        let Err(error) = check(code) else {
            return if ended {
                Err(Error::StreamCapturing {
                    what: "a stream being waited for was capturing, or this thread's per-thread \
                           default stream captured in the wait's way: the wait ended the capture \
                           and destroyed its graph (which could hold addresses of lent memory), \
                           then waited for the work queued before it",
                })
            } else {
                Ok(())
            };
        };
        if !is_capture_error(error) {
            return settle(error, &mut patience);
        }
        if let Target::Stream(stream) = target {
            ended |= end_capture(stream);
        }
        ended |= end_per_thread_capture(target);
        // Also after ending a capture: a thread that keeps beginning new ones is waited out, not
        // spun on.
        patience.pause(error);
    }
}

/// After a wait failed with `error`, not a capture's: `cuCtxSynchronize` proves the work finished
/// (success) or the error sticky (the same error again); a capture in the way is waited out; any
/// other answer aborts.
fn settle(error: DriverError, patience: &mut Patience) -> Result<(), Error> {
    loop {
        // SAFETY: no arguments; the context is current (bound by `wait`).
        match check(unsafe { sys::cuCtxSynchronize() }) {
            Ok(()) => return Err(error.into()),
            Err(again) if again == error => return Err(error.into()),
            Err(again) if is_capture_error(again) => patience.pause(again),
            Err(again) => abort(format_args!(
                "a wait for GPU work failed with {error}, and the context's own wait with {again}: \
                 neither proves the work finished nor the error sticky"
            )),
        }
    }
}

/// `cuStreamGetCaptureInfo` — the id of the capture `stream` (of the current context) is in, active
/// or invalidated; `None` where it captures nothing or cannot be asked.
fn capture_id(stream: sys::CUstream) -> Option<u64> {
    let (mut status, mut id) = (sys::CU_STREAM_CAPTURE_STATUS_NONE, 0u64);
    // SAFETY: `status` and `id` are writable for the call; the optional outputs are null; the
    // caller passes a live stream of the current context (or the per-thread default stream). The
    // status is read as an integer, never as an enum.
    let code = unsafe {
        sys::cuStreamGetCaptureInfo_v2(
            stream,
            &raw mut status,
            &raw mut id,
            ptr::null_mut(),
            ptr::null_mut(),
            ptr::null_mut(),
        )
    };
    (check(code).is_ok() && status != sys::CU_STREAM_CAPTURE_STATUS_NONE).then_some(id)
}

/// Ends a capture of this thread's per-thread default stream where it is in the way of `target`,
/// and destroys its graph: `true` where it did. Only this thread can have begun it (the handle
/// names the calling thread's own stream), so only this thread can end it, and it cannot while it
/// waits here: polling would only run out [`CAPTURE_PATIENCE`] and abort. It is in the way of a
/// wait of the legacy default stream (an implicit dependency on a capturing stream, 906) and of
/// the context (refused while any of its streams captures), and of a wait of a stream that joined
/// it (the same capture id). A capture of the per-thread stream that is in no one's way is left
/// alone.
fn end_per_thread_capture(target: Target) -> bool {
    let per_thread = sys::CU_STREAM_PER_THREAD as sys::CUstream;
    let Some(id) = capture_id(per_thread) else {
        return false;
    };
    let in_the_way = match target {
        Target::Stream(stream) if stream.is_null() => true,
        Target::Stream(stream) => capture_id(stream) == Some(id),
        Target::Context => true,
        Target::Event(_) => false,
    };
    in_the_way && end_capture(per_thread)
}

/// Ends the capture of `stream` where the driver lets this thread end it (`cuStreamEndCapture`)
/// and destroys its graph. `true` where it did: the stream no longer captures.
fn end_capture(stream: sys::CUstream) -> bool {
    if !matches!(is_capturing(stream), Ok(true)) {
        return false;
    }
    let mut graph: sys::CUgraph = ptr::null_mut();
    // SAFETY: `graph` is writable for the call; `stream` is a live stream of the current context,
    // capturing (checked just above). A capture this thread may not end (begun on another stream,
    // or on another thread in a mode other than RELAXED) is refused and left as it is. The result
    // is not read: an invalidated capture ends with an error and no graph, and what matters is
    // whether the stream still captures, asked below.
    let _ = unsafe { sys::cuStreamEndCapture(stream, &raw mut graph) };
    if !graph.is_null() {
        // SAFETY: a graph the driver just made for this call, owned by nothing else and destroyed
        // once; it was never instantiated.
        let _ = unsafe { sys::cuGraphDestroy(graph) };
    }
    matches!(is_capturing(stream), Ok(false))
}

#[cfg(test)]
mod tests {
    use super::is_capture_error;
    use crate::error::DriverError;

    #[test]
    fn the_capture_family_is_900_to_908() {
        let family: Vec<u32> = (1..=1000)
            .filter_map(DriverError::from_raw)
            .filter(|&e| is_capture_error(e))
            .map(DriverError::code)
            .collect();
        assert_eq!(family, (900..=908).collect::<Vec<u32>>());
        assert_eq!(
            DriverError::STREAM_CAPTURE_WRONG_THREAD.code(),
            908,
            "the family ends with the wrong-thread error"
        );
        assert!(!is_capture_error(DriverError::TIMEOUT));
    }
}
