//! [`Core`]: the `ncclComm_t` that a communicator, its registrations and its windows share,
//! destroyed with the last of them, and what every NCCL call on it goes through: the context bound,
//! the refusal once it is aborted or suspended, and, for a non-blocking communicator, the one
//! place that waits for NCCL's thread ([`Core::finish`]; see the [`CommOptions`](super::CommOptions)
//! docs). With it, this thread's depth inside [`group`](super::group)s, which decides whether a
//! call is settled now or at the group's end.

use core::cell::{Cell, RefCell};
use core::ffi::c_int;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::cudarc::driver::CudaContext;

use super::api::{self, IN_PROGRESS, RawComm};
use super::{TIMEOUT, pause};
use crate::error::{Error, check as check_driver};
use crate::sys;

thread_local! {
    /// How deeply this thread is inside [`group`](super::group) calls.
    static GROUP_DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Whether this thread is inside a [`group`](super::group) of this crate.
pub(super) fn in_group() -> bool {
    GROUP_DEPTH.with(Cell::get) > 0
}

/// One [`group`](super::group) level more on this thread.
pub(super) fn enter_group() {
    GROUP_DEPTH.with(|d| d.set(d.get().saturating_add(1)));
}

/// One [`group`](super::group) level less on this thread: the depth left.
pub(super) fn leave_group() -> usize {
    GROUP_DEPTH.with(|d| {
        let depth = d.get().saturating_sub(1);
        d.set(depth);
        depth
    })
}

/// What a communicator's registrations and windows share with it: the `ncclComm_t`, destroyed with
/// the last of them.
pub(crate) struct Core {
    pub(super) raw: RawComm,
    /// The primary context of the communicator's device, made current around every NCCL call.
    pub(super) context: Arc<CudaContext>,
    /// The address ranges `[start, end)` registered as windows of this communicator.
    pub(super) windows: RefCell<Vec<(u64, u64)>>,
    pub(super) registered: Cell<u64>,
    pub(super) deregistered: Cell<u64>,
    /// Set by `ncclCommAbort`: the handle is freed, and every later use is refused.
    pub(super) aborted: Cell<bool>,
    /// Set by `ncclCommSuspend` ([`Comm::suspend`](super::Comm::suspend)), cleared by `ncclCommResume`: every use but
    /// the resume is refused meanwhile.
    pub(super) suspended: Cell<bool>,
    /// `ncclConfig_t::blocking`: a non-blocking communicator's calls are settled by
    /// [`Core::finish`].
    pub(super) blocking: bool,
    /// How long a scope's end waits for the stream, and a non-blocking operation for NCCL, before
    /// the communicator is aborted ([`Comm::set_timeout`](super::Comm::set_timeout)).
    pub(super) timeout: Cell<Option<Duration>>,
}

impl Core {
    /// `cuCtxSetCurrent` of the communicator's context: NCCL calls the runtime API, which works in
    /// the current context (a primary context, the runtime's own).
    pub(super) fn bind(&self) -> Result<(), Error> {
        let context: sys::CUcontext = self.context.cu_ctx().cast();
        // SAFETY: a primary context that `self.context` keeps retained.
        check_driver(unsafe { sys::make_current(context) })?;
        Ok(())
    }

    /// Before every NCCL call on the communicator: the refusal once it was aborted (its handle
    /// is freed) or while it is suspended, else [`bind`](Core::bind).
    pub(super) fn live(&self, call: &'static str) -> Result<(), Error> {
        self.unless_aborted(call)?;
        if self.suspended.get() {
            return Err(Error::NcclRefused {
                call,
                why: SUSPENDED,
            });
        }
        self.bind()
    }

    /// The refusal of `call` once the communicator was aborted.
    pub(super) fn unless_aborted(&self, call: &'static str) -> Result<(), Error> {
        if self.aborted.get() {
            return Err(Error::NcclRefused { call, why: ABORTED });
        }
        Ok(())
    }

    /// `ncclCommAbort` — stop the communicator's work on the device (its kernels exit) and free it.
    /// From here on every use is refused and nothing is deregistered or destroyed: NCCL freed it
    /// all. A no-op on a communicator aborted already.
    pub(super) fn abort(&self) -> Result<(), Error> {
        if self.aborted.get() {
            return Ok(());
        }
        let api = api::api("ncclCommAbort")?;
        let abort = api::function(api.comm_abort, "ncclCommAbort")?;
        // Called even where the context cannot be made current: the abort is what stops NCCL's
        // thread of a pending non-blocking operation, and NCCL sets the communicator's device
        // itself where it frees it.
        let bound = self.bind();
        // Marked first: whatever the call returns, the handle is not used again (NCCL frees the
        // communicator also where it reports an error on the way).
        self.aborted.set(true);
        // SAFETY: a communicator that NCCL made, aborted once (checked above); the registrations
        // and windows that hold it never pass its handle to NCCL again (`live`, `aborted`).
        let code = unsafe { abort(self.raw) };
        bound?;
        api::check(code, "ncclCommAbort")
    }
}

/// Why a call on an aborted communicator is refused.
pub(super) const ABORTED: &str = "the communicator was aborted (ncclCommAbort, after an asynchronous error \
                       or a timeout of a scope's wait): make a new one";

impl Drop for Core {
    fn drop(&mut self) {
        // An aborted communicator was freed by `ncclCommAbort`.
        if self.aborted.get() {
            return;
        }
        // A non-blocking communicator is finalized first and polled until NCCL has done so; then
        // its `ncclCommDestroy` does not block. A finalize that fails or passes the timeout aborts
        // it instead (`ncclCommAbort` frees it): there is nothing left to destroy.
        if !self.blocking && self.finalize().is_err() {
            return;
        }
        // Every scope of the communicator has waited for its work, and every registration and
        // window is gone (each holds the communicator or this core). An error cannot be handled
        // here, and the communicator is unusable afterwards either way; it is ignored.
        let Ok(api) = api::api("ncclCommDestroy") else {
            return;
        };
        if let (Some(destroy), Ok(())) = (api.comm_destroy, self.bind()) {
            // SAFETY: a communicator that NCCL made and nothing else destroys; no work of it is
            // queued or running.
            let _ = unsafe { destroy(self.raw) };
        }
    }
}

/// Why a call on a suspended communicator is refused.
pub(super) const SUSPENDED: &str = "the communicator is suspended (Comm::suspend): resume it with \
                                    Comm::resume first";

/// What polling a non-blocking operation came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Settled {
    /// The state turned to `ncclSuccess`.
    Done,
    /// The state turned to this error.
    Failed(c_int),
    /// Still `ncclInProgress` once the timeout had passed.
    TimedOut,
}

/// Reads `state` until it is something other than `ncclInProgress`, or until `elapsed` reaches
/// `timeout`; `pause` runs between two reads with the time waited so far.
pub(super) fn poll(
    mut state: impl FnMut() -> Result<c_int, Error>,
    timeout: Option<Duration>,
    mut elapsed: impl FnMut() -> Duration,
    mut pause: impl FnMut(Duration),
) -> Result<Settled, Error> {
    loop {
        match state()? {
            0 => return Ok(Settled::Done),
            IN_PROGRESS => {}
            code => return Ok(Settled::Failed(code)),
        }
        let waited = elapsed();
        if timeout.is_some_and(|t| waited >= t) {
            return Ok(Settled::TimedOut);
        }
        pause(waited);
    }
}

impl Core {
    /// Takes ownership of `raw`, a communicator NCCL has just made (or is making, for a
    /// non-blocking one) on the device of `context`.
    pub(super) fn own(
        raw: RawComm,
        context: &Arc<CudaContext>,
        blocking: bool,
        timeout: Option<Duration>,
    ) -> Rc<Core> {
        Rc::new(Core {
            raw,
            context: Arc::clone(context),
            windows: RefCell::new(Vec::new()),
            registered: Cell::new(0),
            deregistered: Cell::new(0),
            aborted: Cell::new(false),
            suspended: Cell::new(false),
            blocking,
            timeout: Cell::new(timeout),
        })
    }

    /// After an NCCL call on this communicator that returned `code`: `Ok` for `ncclSuccess` on a
    /// blocking communicator or inside a [`group`](super::group) (whose end settles it); on a
    /// non-blocking one, `ncclSuccess` or `ncclInProgress` is [settled](Core::settle) before this
    /// returns. Any other code is [`Error::Nccl`] naming `call`.
    pub(super) fn finish(&self, code: c_int, call: &'static str) -> Result<(), Error> {
        if self.blocking || in_group() || !(code == 0 || code == IN_PROGRESS) {
            return api::check(code, call);
        }
        self.settle(call)
    }

    /// Polls `ncclCommGetAsyncError` until the operation `call` of this non-blocking communicator
    /// has finished. On an error, a failed poll or a poll past the timeout, aborts the
    /// communicator (`ncclCommAbort` joins NCCL's thread of the operation: nothing of it runs
    /// once this returns) and returns the error: [`Error::Nccl`] naming `call`, with NCCL's code or
    /// 8 (`ncclTimeout`).
    pub(super) fn settle(&self, call: &'static str) -> Result<(), Error> {
        const GET: &str = "ncclCommGetAsyncError";
        let since = Instant::now();
        let polled = api::api(GET)
            .and_then(|api| api::function(api.comm_get_async_error, GET))
            .and_then(|get| {
                poll(
                    || {
                        self.live(GET)?;
                        let mut state: c_int = 0;
                        // SAFETY: a live communicator (not aborted: checked); `state` is writable
                        // for the call. Polling is what NCCL asks for while an operation of a
                        // non-blocking communicator is in progress.
                        api::check(unsafe { get(self.raw, &raw mut state) }, GET)?;
                        Ok(state)
                    },
                    self.timeout.get(),
                    || since.elapsed(),
                    pause,
                )
            });
        let error = match polled {
            Ok(Settled::Done) => return Ok(()),
            Ok(Settled::Failed(code)) => Error::Nccl { call, code },
            Ok(Settled::TimedOut) => Error::Nccl {
                call,
                code: TIMEOUT,
            },
            Err(e) => e,
        };
        // An abort that fails leaves nothing better to do: the error is returned either way.
        let _ = self.abort();
        Err(error)
    }

    /// `ncclCommFinalize`, [settled](Core::settle): the non-blocking teardown before
    /// `ncclCommDestroy`. On any error the communicator is aborted (and freed by NCCL).
    pub(super) fn finalize(&self) -> Result<(), Error> {
        const CALL: &str = "ncclCommFinalize";
        let finalized = api::api(CALL)
            .and_then(|api| api::function(api.comm_finalize, CALL))
            .and_then(|finalize| {
                self.live(CALL)?;
                // SAFETY: a live communicator that NCCL made, finalized once (only `Drop` calls
                // this); no work of it is queued: every scope waited, every registration is gone.
                let code = unsafe { finalize(self.raw) };
                self.finish(code, CALL)
            });
        if finalized.is_err() {
            let _ = self.abort();
        }
        finalized
    }
}

/// `Ok` where none of the captures the driver lets this thread see is under way: the
/// communicator's stream's, any blocking stream's of the context (every thread's per-thread
/// default stream among them: one query of the legacy stream sees them all), or a
/// [`Graph::capture`](crate::stream::Graph) of this thread. A registration is refused during one
/// (`Error::StreamCapturing`, before NCCL is called): NCCL's registration makes driver calls that
/// a capture of this thread refuses, and the refusal invalidates the capture (vLLM #54626:
/// "unhandled cuda error"). A capture of another non-blocking stream is not seen: the driver has
/// no query for it. The caller has made the communicator's context current ([`Core::live`]): one
/// bind, not two (measured on an H200, a second one was a visible part of a registration's cost).
pub(super) fn not_capturing(stream: sys::CUstream) -> Result<(), Error> {
    const WHAT: &str = "NCCL registers memory only while no capture of this thread, of a blocking \
                        stream of the context or of the communicator's stream is under way: \
                        NCCL's driver calls would be refused, invalidating the capture";
    if crate::wait::capturing_here()
        || crate::wait::is_capturing(stream)?
        || crate::wait::blocking_stream_capturing()?
    {
        return Err(Error::StreamCapturing { what: WHAT });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake state: the codes in turn, the last one for ever, on a fake clock that each pause
    /// moves on by `step`. What it came to, and how many pauses it took.
    fn run(codes: &[c_int], timeout: Option<Duration>, step: Duration) -> (Settled, usize) {
        let mut reads = codes.iter().copied();
        let last = codes.last().copied().unwrap_or(0);
        let clock = Cell::new(Duration::ZERO);
        let pauses = Cell::new(0);
        let settled = poll(
            || Ok(reads.next().unwrap_or(last)),
            timeout,
            || clock.get(),
            |_| {
                pauses.set(pauses.get() + 1);
                clock.set(clock.get() + step);
            },
        )
        .unwrap();
        (settled, pauses.get())
    }

    #[test]
    fn in_progress_is_polled_until_it_turns() {
        let ms = Duration::from_millis(1);
        assert_eq!(run(&[0], None, ms), (Settled::Done, 0));
        assert_eq!(run(&[7, 7, 7, 0], None, ms), (Settled::Done, 3));
        assert_eq!(run(&[7, 6], None, ms), (Settled::Failed(6), 1));
        assert_eq!(run(&[3], Some(Duration::ZERO), ms), (Settled::Failed(3), 0));
        // Never turns: the timeout ends it, after as many pauses as fit in it.
        assert_eq!(
            run(&[7], Some(Duration::from_millis(5)), ms),
            (Settled::TimedOut, 5)
        );
        // A state that turns at the last poll before the timeout is done, not timed out.
        assert_eq!(
            run(&[7, 7, 0], Some(Duration::from_millis(2)), ms),
            (Settled::Done, 2)
        );
    }

    #[test]
    fn a_failed_poll_is_the_error() {
        let failed = poll(
            || {
                Err(Error::NcclRefused {
                    call: "x",
                    why: "y",
                })
            },
            None,
            || Duration::ZERO,
            |_| {},
        );
        assert!(matches!(failed, Err(Error::NcclRefused { .. })));
    }
}
