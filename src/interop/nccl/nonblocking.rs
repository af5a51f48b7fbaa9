//! Communicators made with a config ([`CommOptions`], `ncclCommInitRankConfig`), non-blocking ones
//! among them. The one place that waits for NCCL's non-blocking operations is `Core::finish`
//! (`handle.rs`).
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
//! `Core::finish` polls `ncclCommGetAsyncError` until the state is no longer `ncclInProgress`
//! (spinning for the first millisecond, yielding the thread until 20 ms, then sleeping 100 µs
//! between polls, as a scope's end does). So a collective has queued its kernels before the scope
//! polls its stream and waits, a window handle is
//! written before it is read, and the next call never meets NCCL's refusal. A group's collectives
//! are settled at the group's end, for every non-blocking communicator the group used. An error
//! found while polling, or a poll past the communicator's [timeout](CommOptions::with_timeout),
//! aborts the communicator (`ncclCommAbort`): NCCL's thread has stopped when it returns, and the
//! scope's one wait still follows for the stream. Polling waits for NCCL's host thread, never for
//! the GPU: the scope's wait stays the one wait for the stream.

use core::ptr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use ::cudarc::driver::CudaStream;

use super::api::{self, Api, IN_PROGRESS, RawComm, RawConfig};
use super::comm::{Comm, bind, clique, rank_and_size};
use super::handle::{Core, in_group};
use super::id::UniqueId;
use crate::error::Error;

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
            .map(|(raw, stream)| {
                Core::own(raw, stream.context(), options.blocking, options.timeout)
            })
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
        let owned = Core::own(raw, stream.context(), options.blocking, options.timeout);
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
    use core::ffi::c_int;

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
}
