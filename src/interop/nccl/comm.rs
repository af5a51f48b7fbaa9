//! [`Comm`]: one rank of an NCCL clique, on the stream its collectives run on; made blocking here
//! ([`Comm::from_devices`], [`Comm::from_rank`]), with a config in `nonblocking.rs`.

use core::cell::Cell;
use core::ffi::c_int;
use core::fmt;
use core::ptr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use ::cudarc::driver::CudaStream;

use super::api::{self, RawComm};
use super::handle::Core;
use super::id::UniqueId;
use super::{CHECK_EVERY, TIMEOUT, pause};
use crate::device::Device;
use crate::error::{Error, check as check_driver};
use crate::sys;
use crate::wait::Polling;

/// An NCCL communicator: one rank of a clique, with the stream its collectives run on.
///
/// Neither `Send` nor `Sync` (see the [module documentation](super)). Dropping it destroys the
/// communicator (`ncclCommDestroy`, after `ncclCommFinalize` for a
/// [non-blocking](super::CommOptions#non-blocking-communicators) one) once its windows are gone too.
pub struct Comm {
    pub(super) core: Rc<Core>,
    pub(super) stream: Arc<CudaStream>,
    pub(super) device: Device,
    pub(super) rank: usize,
    pub(super) size: usize,
}

impl fmt::Debug for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Comm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("device", &self.device)
            .field("blocking", &self.core.blocking)
            .finish_non_exhaustive()
    }
}

impl Comm {
    /// `ncclCommInitAll` — one communicator per stream, rank `i` on the device of `streams[i]`, for
    /// one thread that drives every GPU of the clique ([`group`](super::group) launches their collectives
    /// together). One stream gives a single-rank communicator.
    ///
    /// # Errors
    /// Before NCCL is called: [`Error::ZeroSize`] for no stream; [`Error::InvalidArgument`] where
    /// two streams share a device (NCCL takes one rank per GPU) or the count does not fit a C `int`.
    /// [`Error::NcclUnavailable`] where NCCL cannot be loaded; [`Error::Nccl`] for its refusal.
    #[doc(alias = "ncclCommInitAll")]
    pub fn from_devices(streams: &[Arc<CudaStream>]) -> Result<Vec<Comm>, Error> {
        let (ordinals, count) = clique(streams)?;
        let api = api::api("ncclCommInitAll")?;
        let init = api::function(api.comm_init_all, "ncclCommInitAll")?;
        let mut raw: Vec<RawComm> = vec![ptr::null_mut(); streams.len()];
        // SAFETY: `raw` has room for `count` communicators and `ordinals` holds `count` device
        // ordinals, both alive for the call.
        let code = unsafe { init(raw.as_mut_ptr(), count, ordinals.as_ptr()) };
        api::check(code, "ncclCommInitAll")?;
        // Owned from here: each `Comm` destroys its communicator, also when a later one fails.
        let mut comms = Vec::with_capacity(streams.len());
        for (rank, (raw, stream)) in raw.into_iter().zip(streams).enumerate() {
            comms.push(Comm::own(raw, stream, rank, streams.len())?);
        }
        Ok(comms)
    }

    /// `ncclCommInitRank` — rank `rank` of a clique of `size` ranks that meet through `id` (made by
    /// one rank with [`UniqueId::new`] and passed to the others, e.g. with
    /// [`UniqueId::write_to`] and [`UniqueId::read_from`]), on the device of `stream`. Blocks until
    /// every rank has joined.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] for `rank >= size`, [`Error::InvalidArgument`] where either does not
    /// fit a C `int`, before NCCL is called; a driver error where the stream's context cannot be made
    /// current; [`Error::NcclUnavailable`], [`Error::Nccl`] as [`from_devices`](Comm::from_devices).
    #[doc(alias = "ncclCommInitRank")]
    pub fn from_rank(
        stream: &Arc<CudaStream>,
        rank: usize,
        size: usize,
        id: &UniqueId,
    ) -> Result<Comm, Error> {
        let (c_rank, c_size) = rank_and_size(rank, size)?;
        let api = api::api("ncclCommInitRank")?;
        let init = api::function(api.comm_init_rank, "ncclCommInitRank")?;
        // NCCL makes the communicator on the current device.
        bind(stream)?;
        let mut raw: RawComm = ptr::null_mut();
        // SAFETY: `raw` is writable for the call; the id is 128 bytes passed by value.
        let code = unsafe { init(&raw mut raw, c_size, id.raw(), c_rank) };
        api::check(code, "ncclCommInitRank")?;
        Comm::own(raw, stream, rank, size)
    }

    /// Takes ownership of `raw`, a blocking communicator NCCL has just made.
    fn own(
        raw: RawComm,
        stream: &Arc<CudaStream>,
        rank: usize,
        size: usize,
    ) -> Result<Comm, Error> {
        let core = Core::own(raw, stream.context(), true, None);
        Comm::with_core(core, stream, rank, size)
    }

    /// The communicator of `core`, rank `rank` of `size`, on `stream`.
    pub(super) fn with_core(
        core: Rc<Core>,
        stream: &Arc<CudaStream>,
        rank: usize,
        size: usize,
    ) -> Result<Comm, Error> {
        let device = Device::get(stream.context().ordinal())?;
        Ok(Comm {
            core,
            stream: Arc::clone(stream),
            device,
            rank,
            size,
        })
    }

    /// This communicator's rank.
    #[must_use]
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks of the clique.
    #[must_use]
    pub fn size(&self) -> usize {
        self.size
    }

    /// The device of this rank.
    #[must_use]
    pub fn device(&self) -> Device {
        self.device
    }

    /// The stream the collectives run on, and [`scope`](Comm::scope) waits for.
    #[must_use]
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The raw `ncclComm_t`, for NCCL calls this crate does not wrap. It stays valid while `self`
    /// lives; do not destroy it.
    #[must_use]
    pub fn as_raw(&self) -> *mut core::ffi::c_void {
        self.core.raw
    }

    /// `ncclCommGetAsyncError` — `Ok` where NCCL reports no asynchronous error of this
    /// communicator (a failed peer or network), the error otherwise.
    ///
    /// # Errors
    /// [`Error::Nccl`] with `call` `"ncclCommGetAsyncError"` and the asynchronous error's code;
    /// [`Error::NcclUnavailable`] where the function is missing; [`Error::NcclRefused`] once the
    /// communicator was aborted.
    #[doc(alias = "ncclCommGetAsyncError")]
    pub fn async_error(&self) -> Result<(), Error> {
        match self.async_code()? {
            0 | api::IN_PROGRESS => Ok(()),
            code => Err(Error::Nccl {
                call: "ncclCommGetAsyncError",
                code,
            }),
        }
    }

    /// The communicator's asynchronous `ncclResult_t`, as an integer.
    pub(super) fn async_code(&self) -> Result<c_int, Error> {
        const CALL: &str = "ncclCommGetAsyncError";
        let api = api::api(CALL)?;
        let get = api::function(api.comm_get_async_error, CALL)?;
        self.core.live(CALL)?;
        let mut code: c_int = 0;
        // SAFETY: a live communicator (not aborted: checked); `code` is writable for the call.
        let called = unsafe { get(self.core.raw, &raw mut code) };
        api::check(called, CALL)?;
        Ok(code)
    }

    /// How long the end of a [`scope`](Comm::scope) waits for the communicator's stream before it
    /// aborts the communicator; `None` (the default) waits for as long as the work runs. NCCL
    /// reports no error for a peer rank that never joins a collective: its kernels wait for it.
    /// A timeout turns that wait into an error. Set it well above the longest step. On a
    /// [non-blocking](super::CommOptions#non-blocking-communicators) communicator it also bounds each wait
    /// for NCCL's own thread (a collective's launch, a group's end, the teardown).
    pub fn set_timeout(&mut self, timeout: Option<Duration>) {
        self.core.timeout.set(timeout);
    }

    /// The timeout of [`set_timeout`](Comm::set_timeout).
    #[must_use]
    pub fn timeout(&self) -> Option<Duration> {
        self.core.timeout.get()
    }

    /// Whether the communicator was aborted: by [`scope`](Comm::scope) after an asynchronous error
    /// or a timeout. An aborted communicator refuses every call ([`Error::NcclRefused`]).
    #[must_use]
    pub fn is_aborted(&self) -> bool {
        self.core.aborted.get()
    }

    /// `ncclCommAbort` — abort the communicator instead of destroying it (`ncclCommDestroy`, what
    /// dropping it does): for a rank whose peers failed or left, where a destroy could wait for them.
    /// Its windows, if any are alive, are not deregistered any more (NCCL frees them here).
    ///
    /// # Errors
    /// [`Error::Nccl`] for NCCL's error (the communicator is gone either way);
    /// [`Error::NcclUnavailable`] where the loaded NCCL has no `ncclCommAbort` (the communicator is
    /// then destroyed).
    ///
    /// # Examples
    /// ```no_run
    /// # use cuda_vmm::interop::nccl::Comm;
    /// fn leave(comm: Comm) -> cuda_vmm::Result<()> {
    ///     comm.abort() // the peers are gone: no ncclCommDestroy
    /// }
    /// ```
    #[doc(alias = "ncclCommAbort")]
    pub fn abort(self) -> Result<(), Error> {
        self.core.abort()
    }

    /// Between two polls of a scope's end that find the stream busy, `waited` into the wait:
    /// every [`CHECK_EVERY`] from the first such interval on (`next_check`), asks NCCL for an
    /// asynchronous error and checks the [timeout](Comm::set_timeout); on either, aborts the
    /// communicator (its kernels exit) and returns the error, which the wait returns once the
    /// stream has finished ([`crate::wait::stream_polled`]). Otherwise [pauses](pause): a step's
    /// collectives are seen finished within a poll (a query of the stream, 0.15–0.3 µs), as by
    /// the driver's own spinning wait, and a peer that hangs costs no core. Where NCCL cannot be
    /// asked (an aborted communicator, a missing function), the wait blocks instead.
    pub(super) fn between_polls(
        &self,
        waited: Duration,
        next_check: &Cell<Duration>,
    ) -> Result<Polling, Error> {
        if waited >= next_check.get() {
            next_check.set(waited.saturating_add(CHECK_EVERY));
            let failed = match self.async_code() {
                Ok(0 | api::IN_PROGRESS) => None,
                Ok(code) => Some(Error::Nccl {
                    call: "ncclCommGetAsyncError",
                    code,
                }),
                // Nothing to poll: the wait blocks.
                Err(_) => return Ok(Polling::Block),
            };
            let failed = failed.or_else(|| {
                self.timeout()
                    .filter(|&t| waited >= t)
                    .map(|_| Error::Nccl {
                        call: "Comm::scope's wait (past the communicator's timeout, so it \
                               aborted the communicator)",
                        code: TIMEOUT,
                    })
            });
            if let Some(error) = failed {
                // An abort that fails leaves the kernels as they are: the wait then waits for
                // them, and returns only once they have finished.
                let _ = self.core.abort();
                return Err(error);
            }
        }
        pause(waited);
        Ok(Polling::Again)
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

#[cfg(test)]
mod tests {
    use super::*;

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
