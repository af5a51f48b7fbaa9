//! Communicators made with a config ([`CommOptions`], `ncclCommInitRankConfig`), non-blocking ones
//! among them, and the one place that waits for NCCL's non-blocking operations: [`Core::finish`].
//!
//! # What NCCL does in non-blocking mode
//! A communicator made with `blocking = 0` never blocks its caller: `ncclCommInitRankConfig`,
//! the collectives, `ncclGroupEnd`, `ncclCommFinalize` and `ncclCommWindowRegister` may return
//! `ncclInProgress` (7) and go on in a thread of NCCL's. The communicator's state, read with
//! `ncclCommGetAsyncError`, stays `ncclInProgress` until that work is done, then turns to
//! `ncclSuccess` or an error; NCCL refuses every other call on the communicator meanwhile
//! (`ncclCommEnsureReady`: `ncclInvalidArgument`). Until the state has turned, a collective's
//! kernels may not even be queued on the stream yet. `ncclCommDestroy` and `ncclCommAbort` always
//! block (NCCL runs their group as a blocking one), and `ncclCommAbort` joins NCCL's thread of a
//! pending operation before it returns.
//!
//! # What this crate does
//! Every call on a non-blocking communicator is settled before it returns to the caller:
//! [`Core::finish`] polls `ncclCommGetAsyncError` until the state is no longer `ncclInProgress`
//! (spinning for the first millisecond, yielding the thread until 20 ms, then sleeping 100 µs
//! between polls, as a scope's end does). So a collective has queued its kernels before the scope
//! polls its stream and waits, a window handle is
//! written before it is read, and the next call never meets NCCL's refusal. A group's collectives
//! are settled at the group's end, for every non-blocking communicator the group used. An error
//! found while polling, or a poll past the communicator's [timeout](CommOptions::with_timeout),
//! aborts the communicator (`ncclCommAbort`): NCCL's thread has stopped when it returns, and the
//! scope's one wait still follows for the stream. Polling waits for NCCL's host thread, never for
//! the GPU: the scope's wait stays the one wait for the stream.

use core::cell::Cell;
use core::ffi::c_int;
use core::ptr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::cudarc::driver::{CudaContext, CudaStream};

use super::api::{self, Api, IN_PROGRESS, RawComm, RawConfig};
use super::scope::in_group;
use super::{Comm, Core, TIMEOUT, UniqueId, pause};
use crate::error::{Error, check as check_driver};
use crate::sys;

/// How a communicator is made by [`Comm::from_devices_with`] and [`Comm::from_rank_with`]
/// (`ncclConfig_t`): blocking or not, and how long its waits may take.
///
/// The default is what [`Comm::from_devices`] and [`Comm::from_rank`] make: blocking, no timeout.
///
/// # Non-blocking communicators
/// With [`with_blocking(false)`](CommOptions::with_blocking) NCCL returns from its calls while
/// their work goes on in a thread of its own (`ncclInProgress`). This crate polls the
/// communicator's state (`ncclCommGetAsyncError`) until that work is done before any call returns,
/// so nothing changes in the rules: scopes, groups, registrations and windows behave as with a
/// blocking communicator, and every call returns once NCCL has finished it. What changes:
/// - the [timeout](CommOptions::with_timeout) also bounds NCCL's host side: a communicator whose
///   peers never join its creation, a collective whose first launch waits for a peer to connect,
///   a group's end and the communicator's teardown end in [`Error::Nccl`] with code 8
///   (`ncclTimeout`) and an aborted communicator instead of a hang;
/// - an error NCCL reports while its work goes on aborts the communicator (`ncclCommAbort`), which
///   then refuses every call ([`Error::NcclRefused`]);
/// - dropping it calls `ncclCommFinalize`, polls it to its end, then `ncclCommDestroy` (an abort
///   where the finalize fails or passes the timeout);
/// - one [`group`](super::group) cannot mix blocking and non-blocking communicators (NCCL refuses
///   the mix; this crate refuses it before the call, [`Error::NcclRefused`]).
///
/// # Examples
/// ```no_run
/// use std::time::Duration;
/// use cuda_vmm::interop::nccl::{Comm, CommOptions};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let stream = cudarc::driver::CudaContext::new(0)?.new_stream()?;
/// let options = CommOptions::new()
///     .with_blocking(false)
///     .with_timeout(Some(Duration::from_secs(30)));
/// let comm = Comm::from_devices_with(&[stream], options)?.remove(0);
/// assert!(!comm.is_blocking());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CommOptions {
    blocking: bool,
    timeout: Option<Duration>,
}

impl Default for CommOptions {
    fn default() -> CommOptions {
        CommOptions::new()
    }
}

impl CommOptions {
    /// Blocking, with no timeout.
    #[must_use]
    pub const fn new() -> CommOptions {
        CommOptions {
            blocking: true,
            timeout: None,
        }
    }

    /// `ncclConfig_t::blocking`: `false` makes a non-blocking communicator (see the
    /// [type's documentation](CommOptions#non-blocking-communicators)).
    #[must_use]
    pub const fn with_blocking(self, blocking: bool) -> CommOptions {
        CommOptions { blocking, ..self }
    }

    /// The communicator's [timeout](Comm::set_timeout) from its creation on: for a non-blocking
    /// communicator it bounds its creation too.
    #[must_use]
    pub const fn with_timeout(self, timeout: Option<Duration>) -> CommOptions {
        CommOptions { timeout, ..self }
    }

    /// Whether the communicator blocks.
    #[must_use]
    pub const fn blocking(&self) -> bool {
        self.blocking
    }

    /// The timeout.
    #[must_use]
    pub const fn timeout(&self) -> Option<Duration> {
        self.timeout
    }
}

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

/// The checks before `ncclCommInitRankConfig`, of [`Comm::from_devices_with`] and
/// [`Comm::from_rank_with`]: not inside a group ([`MADE_IN_GROUP`]), the loaded NCCL and the
/// function, and for a non-blocking communicator the functions it needs besides its creation (the
/// poll, the abort that stops NCCL's thread, and the teardown).
fn init_config(options: CommOptions) -> Result<(&'static Api, api::CommInitRankConfig), Error> {
    const CALL: &str = "ncclCommInitRankConfig";
    if in_group() {
        return Err(Error::NcclRefused {
            call: CALL,
            why: MADE_IN_GROUP,
        });
    }
    let api = api::api(CALL)?;
    let init = api::function(api.comm_init_rank_config, CALL)?;
    if !options.blocking {
        api::function(api.comm_get_async_error, "ncclCommGetAsyncError")?;
        api::function(api.comm_abort, "ncclCommAbort")?;
        api::function(api.comm_finalize, "ncclCommFinalize")?;
    }
    Ok((api, init))
}

impl Core {
    /// Takes ownership of `raw`, a communicator NCCL has just made (or is making, for a
    /// non-blocking one) on the device of `context`.
    pub(super) fn own(raw: RawComm, context: &Arc<CudaContext>, options: CommOptions) -> Rc<Core> {
        Rc::new(Core {
            raw,
            context: Arc::clone(context),
            windows: core::cell::RefCell::new(Vec::new()),
            registered: Cell::new(0),
            deregistered: Cell::new(0),
            aborted: Cell::new(false),
            suspended: Cell::new(false),
            blocking: options.blocking,
            timeout: Cell::new(options.timeout),
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

/// The checks of [`Comm::from_devices`] and [`Comm::from_devices_with`]: one stream or more, one per
/// device, each ordinal and the count fitting a C `int`. The device ordinals and the count.
pub(super) fn clique(streams: &[Arc<CudaStream>]) -> Result<(Vec<c_int>, c_int), Error> {
    if streams.is_empty() {
        return Err(Error::ZeroSize {
            what: "list of streams",
        });
    }
    let mut ordinals = Vec::with_capacity(streams.len());
    for stream in streams {
        let ordinal =
            c_int::try_from(stream.context().ordinal()).map_err(|_| Error::InvalidArgument {
                what: "device ordinal",
            })?;
        if ordinals.contains(&ordinal) {
            return Err(Error::InvalidArgument {
                what: "list of streams with two streams of one device (NCCL takes one rank per GPU)",
            });
        }
        ordinals.push(ordinal);
    }
    let count = c_int::try_from(streams.len()).map_err(|_| Error::InvalidArgument {
        what: "number of ranks",
    })?;
    Ok((ordinals, count))
}

/// The checks of [`Comm::from_rank`] and [`Comm::from_rank_with`]: the rank inside the clique,
/// both fitting a C `int`.
pub(super) fn rank_and_size(rank: usize, size: usize) -> Result<(c_int, c_int), Error> {
    if rank >= size {
        return Err(Error::OutOfBounds {
            what: "clique",
            start: rank,
            end: rank.saturating_add(1),
            len: size,
        });
    }
    c_int::try_from(rank)
        .ok()
        .zip(c_int::try_from(size).ok())
        .ok_or(Error::InvalidArgument {
            what: "rank or clique size",
        })
}

/// `cuCtxSetCurrent` of the stream's context: NCCL makes a communicator on the current device.
pub(super) fn bind(stream: &CudaStream) -> Result<(), Error> {
    let context: sys::CUcontext = stream.context().cu_ctx().cast();
    // SAFETY: the stream's context, kept retained by its `CudaContext`.
    check_driver(unsafe { sys::make_current(context) })?;
    Ok(())
}

/// Why a communicator is not made inside a group.
const MADE_IN_GROUP: &str = "it was asked inside an NCCL group, which would make the communicator \
                             only at the group's end";

impl Comm {
    /// `ncclCommInitRankConfig` for every stream inside one group (`ncclGroupStart`,
    /// `ncclGroupEnd`), with `options` — [`from_devices`](Comm::from_devices) with a config: rank
    /// `i` on the device of `streams[i]`, for one thread that drives every GPU of the clique. A
    /// non-blocking clique is polled until NCCL has made every communicator (see
    /// [`CommOptions`]).
    ///
    /// # Errors
    /// Before NCCL is called: as [`from_devices`](Comm::from_devices), and [`Error::NcclRefused`]
    /// inside a [`group`](super::group). [`Error::NcclUnavailable`] where NCCL cannot be loaded or
    /// lacks `ncclCommInitRankConfig` (before 2.14), or, for a non-blocking clique,
    /// `ncclCommGetAsyncError`, `ncclCommAbort` or `ncclCommFinalize`. [`Error::Nccl`] for NCCL's
    /// refusal (`ncclGetUniqueId`, `ncclCommInitRankConfig`, `ncclGroupEnd`), for an error found
    /// while polling, or with code 8 past the timeout: every communicator of the clique is then
    /// aborted. Where a call inside the group fails, the handles NCCL made are left to it (this
    /// crate cannot tell which it freed): a leak on that path, never a double free.
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::interop::nccl::{Comm, CommOptions};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let streams = [
    ///     cudarc::driver::CudaContext::new(0)?.new_stream()?,
    ///     cudarc::driver::CudaContext::new(1)?.new_stream()?,
    /// ];
    /// let comms = Comm::from_devices_with(&streams, CommOptions::new().with_blocking(false))?;
    /// assert_eq!(comms.len(), 2);
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "ncclCommInitRankConfig")]
    pub fn from_devices_with(
        streams: &[Arc<CudaStream>],
        options: CommOptions,
    ) -> Result<Vec<Comm>, Error> {
        const CALL: &str = "ncclCommInitRankConfig";
        let (_, count) = clique(streams)?;
        let (api, init) = init_config(options)?;
        let start = api::function(api.group_start, "ncclGroupStart")?;
        let end = api::function(api.group_end, "ncclGroupEnd")?;
        let id = UniqueId::new()?;
        let mut config = RawConfig::new(options.blocking);
        let mut raw: Vec<RawComm> = vec![ptr::null_mut(); streams.len()];
        // SAFETY: no arguments; the group is ended below on every path.
        api::check(unsafe { start() }, "ncclGroupStart")?;
        let mut failed = None;
        for ((slot, stream), rank) in raw.iter_mut().zip(streams).zip(0..count) {
            if let Err(e) = bind(stream) {
                failed = Some(e);
                break;
            }
            // SAFETY: `slot` is writable for the call and NCCL writes it before returning (a
            // communicator inside a group is set up at the group's end, but its handle is written
            // at once); `config` is a valid 2.14 config, read during the call only; the id is 128
            // bytes passed by value.
            let code = unsafe { init(slot, count, id.raw(), rank, &raw mut config) };
            if code != 0 {
                failed = Some(Error::Nccl { call: CALL, code });
                break;
            }
        }
        // SAFETY: ends the group begun above on this thread.
        let ended = unsafe { end() };
        if let Some(error) = failed {
            return Err(error);
        }
        if !(ended == 0 || ended == IN_PROGRESS) {
            return Err(Error::Nccl {
                call: "ncclGroupEnd",
                code: ended,
            });
        }
        if raw.iter().any(|r| r.is_null()) {
            return Err(Error::NcclRefused {
                call: CALL,
                why: "NCCL returned success with a null communicator",
            });
        }
        // Owned from here: each core destroys (or aborts) its communicator, also on the error
        // paths below.
        let cores: Vec<Rc<Core>> = raw
            .into_iter()
            .zip(streams)
            .map(|(raw, stream)| Core::own(raw, stream.context(), options))
            .collect();
        for core in &cores {
            if let Err(error) = core.finish(ended, CALL) {
                // One rank failed: the clique cannot work, and a finalize of the others could
                // wait for it.
                for core in &cores {
                    let _ = core.abort();
                }
                return Err(error);
            }
        }
        let mut comms = Vec::with_capacity(streams.len());
        for (rank, (core, stream)) in cores.into_iter().zip(streams).enumerate() {
            comms.push(Comm::with_core(core, stream, rank, streams.len())?);
        }
        Ok(comms)
    }

    /// `ncclCommInitRankConfig` — [`from_rank`](Comm::from_rank) with `options`: rank `rank` of a
    /// clique of `size` ranks that meet through `id`, on the device of `stream`. A blocking
    /// communicator blocks until every rank has joined; a non-blocking one is polled until then,
    /// for at most its [timeout](CommOptions::with_timeout).
    ///
    /// # Errors
    /// Before NCCL is called: as [`from_rank`](Comm::from_rank), and [`Error::NcclRefused`] inside
    /// a [`group`](super::group). [`Error::NcclUnavailable`] as
    /// [`from_devices_with`](Comm::from_devices_with); [`Error::Nccl`] for NCCL's refusal, an
    /// error found while polling, or code 8 (`ncclTimeout`) where the other ranks did not join
    /// within the timeout (the communicator is then aborted).
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use cuda_vmm::interop::nccl::{Comm, CommOptions, UniqueId};
    ///
    /// fn join(id: &UniqueId, rank: usize) -> Result<Comm, Box<dyn std::error::Error>> {
    ///     let stream = cudarc::driver::CudaContext::new(rank)?.new_stream()?;
    ///     let options = CommOptions::new()
    ///         .with_blocking(false)
    ///         .with_timeout(Some(Duration::from_secs(60))); // the peers' deadline
    ///     Ok(Comm::from_rank_with(&stream, rank, 2, id, options)?)
    /// }
    /// ```
    #[doc(alias = "ncclCommInitRankConfig")]
    pub fn from_rank_with(
        stream: &Arc<CudaStream>,
        rank: usize,
        size: usize,
        id: &UniqueId,
        options: CommOptions,
    ) -> Result<Comm, Error> {
        const CALL: &str = "ncclCommInitRankConfig";
        let (c_rank, c_size) = rank_and_size(rank, size)?;
        let (_, init) = init_config(options)?;
        bind(stream)?;
        let mut config = RawConfig::new(options.blocking);
        let mut raw: RawComm = ptr::null_mut();
        // SAFETY: `raw` is writable for the call, and NCCL writes it before returning, also for a
        // non-blocking communicator (whose set-up goes on in NCCL's thread); `config` is a valid
        // 2.14 config, read during the call only; the id is 128 bytes passed by value.
        let code = unsafe { init(&raw mut raw, c_size, id.raw(), c_rank, &raw mut config) };
        if !(code == 0 || code == IN_PROGRESS) {
            // Nothing is owned: a handle NCCL may have written is not touched (at worst a leak).
            return Err(Error::Nccl { call: CALL, code });
        }
        if raw.is_null() {
            return Err(Error::NcclRefused {
                call: CALL,
                why: "NCCL returned success with a null communicator",
            });
        }
        let owned = Core::own(raw, stream.context(), options);
        owned.finish(code, CALL)?;
        Comm::with_core(owned, stream, rank, size)
    }

    /// Whether the communicator blocks (see [`CommOptions`]); [`from_devices`](Comm::from_devices)
    /// and [`from_rank`](Comm::from_rank) make blocking ones.
    #[must_use]
    pub fn is_blocking(&self) -> bool {
        self.core.blocking
    }
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

    #[test]
    fn options_are_built() {
        let default = CommOptions::default();
        assert!(default.blocking());
        assert_eq!(default.timeout(), None);
        let options = CommOptions::new()
            .with_blocking(false)
            .with_timeout(Some(Duration::from_secs(3)));
        assert!(!options.blocking());
        assert_eq!(options.timeout(), Some(Duration::from_secs(3)));
        assert!(options.with_blocking(true).blocking());
    }

    #[test]
    fn the_config_is_nccl_2_14s() {
        let config = RawConfig::new(false);
        assert_eq!(config.size, 24);
        assert_eq!(config.magic, 0xcafe_beef);
        assert_eq!(config.version, 21_400);
        assert_eq!(config.blocking, 0);
        assert_eq!(config.undefined, c_int::MIN);
        assert_eq!(RawConfig::new(true).blocking, 1);
    }

    #[test]
    fn cliques_are_checked() {
        assert!(matches!(clique(&[]), Err(Error::ZeroSize { .. })));
        assert_eq!(rank_and_size(1, 2), Ok((1, 2)));
        assert!(matches!(
            rank_and_size(2, 2),
            Err(Error::OutOfBounds { len: 2, .. })
        ));
    }
}
