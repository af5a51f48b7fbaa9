//! NCCL collectives on this crate's memory (feature `nccl`): all-reduce, broadcast, all-gather and
//! reduce-scatter, and point-to-point sends and receives, on views lent in a
//! [`cudarc` scope](super::cudarc::scope), buffers registered with a communicator for as long as
//! they are borrowed, symmetric windows, and communicators suspended while an engine sleeps.
//!
//! # Why it exists
//! Data-parallel training keeps each GPU's gradients in memory that grows (a
//! [`VirtualBuffer`]) and all-reduces it every step. NCCL queues its work on a stream and returns;
//! the memory must stay mapped until that work has run, and a registered buffer must stay mapped
//! until it is deregistered. Here both are borrows: collectives take views lent in a scope that
//! waits for the communicator's stream before it returns ([`Comm::scope`]), and a
//! [`Registration`] borrows its buffer (no unmap, shrink or access change) and its communicator.
//!
//! ```no_run
//! use cuda_vmm::interop::nccl::{Comm, ReduceOp};
//! use cuda_vmm::{Device, ReadWrite, VirtualBuffer};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // NVLink SHARP (multicast objects) off, before NCCL reads its environment (see below).
//! // SAFETY: no other thread runs yet.
//! unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
//! let stream = cudarc::driver::CudaContext::new(0)?.new_stream()?;
//! let comms = Comm::from_devices(&[stream])?; // one rank
//! let comm = &comms[0];
//! let device = Device::get(0)?;
//! let mut grads = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
//! grads.grow(device, 2 << 20)?;
//! let mut registered = comm.register(&mut grads, ..2 << 20)?; // ncclCommRegister
//! let mut view = registered.slice_bytes_mut::<f32>(..2 << 20)?;
//! comm.scope(|s| -> Result<(), cuda_vmm::Error> {
//!     let mut lent = s.lend_mut(&mut view)?;
//!     s.all_reduce_in_place(&mut lent, ReduceOp::Sum) // queued on the communicator's stream
//! })?; // waits for the stream: only then does the view's borrow end
//! drop(view);
//! drop(registered); // ncclCommDeregister: nothing uses the memory any more
//! # Ok(())
//! # }
//! ```
//!
//! # The rules, and where each is kept
//! - **Collectives take lent views of their own scope.** [`Comm::scope`] is
//!   [`cudarc::scope`](super::cudarc::scope) on the communicator's stream; its collectives, sends
//!   and receives take [`Lent`] and [`LentMut`] of that scope only, and what they write only as a
//!   [`LentMut`] (`'scope` is invariant and higher-ranked, so a value lent in another scope is
//!   another type). The scope waits for the stream before it returns, also on a panic.
//! - **Groups end inside the scopes whose views they hold.** NCCL launches a group's work at
//!   `ncclGroupEnd`. [`group`] is a closure: it ends the group when the closure returns or
//!   unwinds, inside every scope that encloses the call; a scope opened inside a group (whose wait
//!   would come before the group's launch) is refused at run time ([`Error::StreamRefused`]).
//!   A group begun elsewhere (cudarc's safe `group_start`, raw NCCL: the group state is the
//!   thread's, in the one library) would defer a collective to its own end, after the scope's
//!   wait. NCCL has no query for it, but a lone `ncclGroupEnd` outside any group answers
//!   `ncclInvalidUsage` and changes nothing but a line in NCCL's log where `NCCL_DEBUG` is `WARN`
//!   or more ("ncclGroupEnd: not in a group call"; measured on NCCL 2.28.3, about 60 ns): every
//!   collective outside a [`group`], every outermost [`group`] and every window registration makes
//!   that probe first. Inside a group begun elsewhere the probe ends one level, begins it again,
//!   and the call is refused ([`Error::NcclRefused`]); where that level was the outermost, what
//!   the group held so far is launched then. A group begun inside a [`group`] and left open is
//!   ended at the [`group`]'s end, level by level (launching the collectives before any scope's
//!   wait), begun again for its owner, and reported.
//! - **A registration borrows its buffer and its communicator.** [`Comm::register`] borrows the
//!   [`VirtualBuffer`] exclusively and lends it on: [`Registration::buffer`] gives every `&self`
//!   operation (growth, read-only views), [`Registration::slice_bytes_mut`] writable views; nothing
//!   that unmaps, shrinks or changes the access set. A shared borrow would keep those away too, but
//!   would leave no writable view of the registered bytes. Its `Drop` deregisters; views lent in a
//!   scope borrow the registration, so it is dropped only after the scope has waited.
//! - **A window is registered with exclusive use of the communicator.**
//!   [`Comm::register_window`] is collective (every rank calls it) and takes `&mut Comm`: no scope,
//!   group or registration of this communicator is alive meanwhile. Its memory is checked before
//!   the call: 4096-byte alignment, at most 8192 physical pieces, pages exportable as POSIX file
//!   descriptors (NCCL exports them to the other ranks), no second window over the same bytes of
//!   this communicator; a null window is an error.
//! - **A communicator stays on its thread** (`Comm` is neither `Send` nor `Sync`): NCCL does not allow
//!   one communicator to be used from two threads at once, and its registrations and windows use it
//!   when they are dropped. Make one communicator per thread ([`Comm::from_rank`] with a
//!   [`UniqueId`]), or drive several GPUs from one thread ([`Comm::from_devices`]).
//!
//! # Several hosts
//! An engine that outgrows one machine runs one rank per GPU, usually one process per GPU, and
//! makes each rank's communicator with [`Comm::from_rank`] (or [`Comm::from_rank_with`], whose
//! [timeout](CommOptions::with_timeout) bounds a peer that never joins):
//! - **The unique id travels through the engine's own channel.** Rank 0 makes it
//!   ([`UniqueId::new`]) and sends its 128 bytes to every other rank through whatever the engine
//!   already has between its processes (its coordinator, a TCP connection, a key-value store):
//!   [`UniqueId::as_bytes`] and [`UniqueId::from_bytes`], or [`UniqueId::write_to`] and
//!   [`UniqueId::read_from`] on a byte stream. The bytes hold rank 0's bootstrap address, which
//!   every host must reach (NCCL's `NCCL_SOCKET_IFNAME` picks the interface), and a random magic
//!   of the bootstrap: send them to the clique's ranks only, and do not log them.
//! - **One rank per GPU.** NCCL refuses two ranks of one clique on one GPU; [`Comm::from_devices`]
//!   checks it before the call. A process that drives several local GPUs makes one communicator
//!   per GPU and queues their work inside one [`group`].
//! - **Moving a KV cache or activations.** [`CommScope::send`] and [`CommScope::recv`] on lent
//!   views, paired inside a [`group`] where a rank both sends and receives; the scope returns only
//!   once the transfer has finished (or the communicator is aborted), so the cache's pages cannot
//!   be evicted or unmapped under the network.
//! - **Network zero-copy.** NCCL's InfiniBand and `RoCE` transports register user buffers with the
//!   adapter ([`Comm::register`], windows). For VMM memory the adapter needs pages made `GPUDirect`
//!   RDMA capable where the device offers it ([`PageOptions::with_rdma`] where
//!   [`Capabilities::gpu_direct_rdma_with_vmm`]), and NCCL registers them through dma-buf where
//!   the device supports it ([`Capabilities::dma_buf`]; `NCCL_DMABUF_ENABLE`) or through the
//!   `nvidia-peermem` module otherwise. Windows need pages exportable as POSIX file descriptors
//!   ([`PageOptions::posix_fd`]): NCCL maps them into the other ranks of the host. Across the
//!   nodes of a multi-node `NVLink` system NCCL shares memory as fabric handles
//!   ([`HandleKinds::FABRIC`], which needs an IMEX channel: [`Capabilities::fabric_usable`]); a
//!   window here is checked for POSIX file descriptors only, so on such a system its pages are
//!   made with both kinds (not measured here: these machines have no IMEX channel).
//!   [`Device::capabilities`] says which of these a device has, with no trial allocation.
//! - **An engine's own transport** (NIXL, UCX, libfabric, Mooncake) registers a buffer's pages
//!   itself: [`VirtualBuffer::export_dma_buf`] gives one dma-buf descriptor per page (each checked
//!   to cover its whole page), and [`FabricHandle`] carries a fabric-shareable allocation to
//!   another node in 64 bytes.
//!
//! [`PageOptions::with_rdma`]: crate::owned::PageOptions::with_rdma
//! [`PageOptions::posix_fd`]: crate::owned::PageOptions::posix_fd
//! [`Capabilities::gpu_direct_rdma_with_vmm`]: crate::device::Capabilities::gpu_direct_rdma_with_vmm
//! [`Capabilities::dma_buf`]: crate::device::Capabilities::dma_buf
//! [`Capabilities::fabric_usable`]: crate::device::Capabilities::fabric_usable
//! [`HandleKinds::FABRIC`]: crate::vmm::HandleKinds::FABRIC
//! [`Device::capabilities`]: crate::Device::capabilities
//! [`VirtualBuffer::export_dma_buf`]: crate::VirtualBuffer::export_dma_buf
//! [`FabricHandle`]: crate::ipc::FabricHandle
//!
//! # Sleeping engines
//! [`Comm::suspend`] gives back a communicator's own device memory (`ncclCommSuspend`, NCCL
//! 2.29.7 and later) and [`Comm::resume`] brings it back, the communicator kept; both take
//! `&mut self`, and every call in between is refused. Where the loaded NCCL is older, both return
//! [`Error::NcclUnavailable`] and the communicator stays as it was.
//!
//! # Loading NCCL
//! NCCL is opened at run time (`libnccl.so.2`, then `libnccl.so`), so the feature builds and its
//! tests run where NCCL is not installed: every function returns [`Error::NcclUnavailable`] then,
//! and [`version`] says whether it can be loaded. cudarc's own `nccl` module is not used: its `Comm`
//! hides the `ncclComm_t` that registration needs, it reads `ncclResult_t` into a Rust enum (a
//! newer NCCL's code would be undefined behaviour), and it panics in `Drop` and on a missing symbol.
//! Every NCCL error is [`Error::Nccl`], with the call and the `ncclResult_t` as an integer.
//!
//! # `NVLink` SHARP
//! NCCL's NVLS algorithms create multicast objects (`cuMulticastCreate`). This crate never does, and
//! its tests and examples set `NCCL_NVLS_ENABLE=0` at the start of the process, before any thread
//! or NCCL call reads the environment: on the machines it is measured on, multicast objects are not
//! to be created. Set it in your process too where that holds.
//!
//! # What it does not cover
//! - **Windows over pages of another origin.** A window over a [`VirtualBuffer`] is checked against
//!   its [`page_options`](VirtualBuffer::page_options), which every page it creates has. A page
//!   mapped from a [`SharedPage`](crate::owned::SharedPage) or imported from another process may
//!   not be exportable even so: NCCL's own export then fails, and the registration returns
//!   [`Error::Nccl`].
//!
//! # Asynchronous errors, hangs and aborts
//! NCCL reports a failed peer or network asynchronously (`ncclCommGetAsyncError`), and reports
//! nothing for a peer rank that never joins a collective: its kernels wait for it. So the end of
//! [`Comm::scope`] does not block blindly: it polls the stream (`cuStreamQuery`) until it is idle,
//! and the asynchronous error every 100 µs meanwhile (spinning for the first millisecond, then
//! yielding its thread until 20 ms, then sleeping 100 µs between polls). A poll that finds the
//! stream idle proves the work finished, and the scope returns: no `cuStreamSynchronize` follows.
//! On an asynchronous error, or once the communicator's [timeout](Comm::set_timeout) has passed,
//! it aborts the communicator (`ncclCommAbort`, which makes its kernels exit), and then still
//! waits for the stream through the crate's one wait ([`crate::scope`]'s, which aborts the process
//! where it cannot prove the work finished) before it returns the error: no scope returns while
//! work that uses its views can run. Where the kernels did not exit, that wait does not return
//! either. A stream that captures a graph, or a poll the driver refuses, goes to that wait too.
//! An aborted communicator refuses every later call with [`Error::NcclRefused`]
//! ([`Comm::is_aborted`]); its registrations and windows are dropped without a deregister (NCCL
//! freed them).
//!
//! # Non-blocking communicators
//! [`Comm::from_devices_with`] and [`Comm::from_rank_with`] take [`CommOptions`]
//! (`ncclCommInitRankConfig`); `CommOptions::new().with_blocking(false)` makes a non-blocking
//! communicator, whose NCCL calls return `ncclInProgress` while NCCL's own thread does the work.
//! Every call of this module settles it before returning (it polls `ncclCommGetAsyncError`), so
//! the rules above hold unchanged. The timeout then bounds NCCL's host side too: a creation whose
//! peers never join, a first collective waiting for a peer's connection, a group's end, the
//! teardown (`ncclCommFinalize`, then `ncclCommDestroy`) end in an error and an aborted
//! communicator instead of a hang. See [`CommOptions`].

use core::cell::{Cell, RefCell};
use core::ffi::c_int;
use core::fmt;
use core::marker::PhantomData;
use core::ptr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use ::cudarc::driver::{CudaContext, CudaStream, DevicePtr};
use bytemuck::Pod;

use super::cudarc::{Lent, LentMut};
#[cfg(doc)]
use crate::VirtualBuffer;
use crate::device::Device;
use crate::error::{Error, check as check_driver};
use crate::sys;
use crate::wait::Polling;

mod api;
mod id;
mod nonblocking;
// `CommScope::send` and `CommScope::recv`.
mod p2p;
mod register;
mod scope;
// `Comm::suspend` and `Comm::resume`.
mod suspend;

pub use id::UniqueId;
pub use nonblocking::CommOptions;
pub use register::{Registration, RegistrationStats, Window, WindowMemory, WindowPieces};
pub use scope::{CommScope, group};
use scope::{in_group, no_foreign_group};

use api::RawComm;

/// `ncclGetVersion` — the version of the NCCL library this process loads, as NCCL encodes it
/// (`22803` for 2.28.3), loading it if it is not loaded yet.
///
/// # Errors
/// [`Error::NcclUnavailable`] where no NCCL library can be loaded.
#[doc(alias = "ncclGetVersion")]
pub fn version() -> Result<i32, Error> {
    Ok(api::api("ncclGetVersion")?.version)
}

/// An element type NCCL reduces and copies: the `ncclDataType_t` of a plain-data type.
///
/// Sealed: implemented for `i8`, `u8`, `i32`, `u32`, `i64`, `u64`, `f32` and `f64`.
pub trait NcclType: Pod + sealed::Element {}

/// An NCCL reduction (`ncclRedOp_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// `ncclSum`.
    Sum,
    /// `ncclProd`.
    Prod,
    /// `ncclMax`.
    Max,
    /// `ncclMin`.
    Min,
    /// `ncclAvg` (the sum divided by the number of ranks).
    Avg,
}

impl ReduceOp {
    fn raw(self) -> c_int {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
            ReduceOp::Avg => 4,
        }
    }
}

mod sealed {
    use core::ffi::c_int;

    pub trait Element {
        /// The `ncclDataType_t`.
        const DATA_TYPE: c_int;
    }

    pub trait Source {
        /// What a collective takes of the value (its address comes from
        /// [`collective_addresses`](crate::interop::cudarc::Scope::collective_addresses)).
        fn lent_address(&self) -> crate::interop::cudarc::sealed::LentAddress;
    }
}

macro_rules! nccl_types {
    ($($t:ty => $code:expr),* $(,)?) => {$(
        impl sealed::Element for $t {
            const DATA_TYPE: c_int = $code;
        }
        impl NcclType for $t {}
    )*};
}

// `nccl.h`: ncclInt8 0, ncclUint8 1, ncclInt32 2, ncclUint32 3, ncclInt64 4, ncclUint64 5,
// ncclFloat32 7, ncclFloat64 8.
nccl_types!(i8 => 0, u8 => 1, i32 => 2, u32 => 3, i64 => 4, u64 => 5, f32 => 7, f64 => 8);

/// A value a collective reads: a view lent in the collective's scope, read-only ([`Lent`]) or
/// writable ([`LentMut`]). Sealed.
pub trait Source<'scope, T>: DevicePtr<T> + sealed::Source {}

impl<T> sealed::Source for Lent<'_, T> {
    fn lent_address(&self) -> crate::interop::cudarc::sealed::LentAddress {
        Lent::lent_address(self)
    }
}
impl<T> sealed::Source for LentMut<'_, T> {
    fn lent_address(&self) -> crate::interop::cudarc::sealed::LentAddress {
        LentMut::lent_address(self)
    }
}
impl<'scope, T: Pod> Source<'scope, T> for Lent<'scope, T> {}
impl<'scope, T: Pod> Source<'scope, T> for LentMut<'scope, T> {}

/// What a communicator's registrations and windows share with it: the `ncclComm_t`, destroyed with
/// the last of them.
pub(crate) struct Core {
    raw: RawComm,
    /// The primary context of the communicator's device, made current around every NCCL call.
    context: Arc<CudaContext>,
    /// The address ranges `[start, end)` registered as windows of this communicator.
    windows: RefCell<Vec<(u64, u64)>>,
    registered: Cell<u64>,
    deregistered: Cell<u64>,
    /// Set by `ncclCommAbort`: the handle is freed, and every later use is refused.
    aborted: Cell<bool>,
    /// Set by `ncclCommSuspend` ([`Comm::suspend`]), cleared by `ncclCommResume`: every use but
    /// the resume is refused meanwhile.
    suspended: Cell<bool>,
    /// `ncclConfig_t::blocking`: a non-blocking communicator's calls are settled by
    /// [`Core::finish`].
    blocking: bool,
    /// How long a scope's end waits for the stream, and a non-blocking operation for NCCL, before
    /// the communicator is aborted ([`Comm::set_timeout`]).
    timeout: Cell<Option<Duration>>,
}

impl Core {
    /// `cuCtxSetCurrent` of the communicator's context: NCCL calls the runtime API, which works in
    /// the current context (a primary context, the runtime's own).
    fn bind(&self) -> Result<(), Error> {
        let context: sys::CUcontext = self.context.cu_ctx().cast();
        // SAFETY: a primary context that `self.context` keeps retained.
        check_driver(unsafe { sys::make_current(context) })?;
        Ok(())
    }

    /// Before every NCCL call on the communicator: the refusal once it was aborted (its handle
    /// is freed) or while it is suspended, else [`bind`](Core::bind).
    fn live(&self, call: &'static str) -> Result<(), Error> {
        self.unless_aborted(call)?;
        if self.suspended.get() {
            return Err(Error::NcclRefused {
                call,
                why: suspend::SUSPENDED,
            });
        }
        self.bind()
    }

    /// The refusal of `call` once the communicator was aborted.
    fn unless_aborted(&self, call: &'static str) -> Result<(), Error> {
        if self.aborted.get() {
            return Err(Error::NcclRefused { call, why: ABORTED });
        }
        Ok(())
    }

    /// `ncclCommAbort` — stop the communicator's work on the device (its kernels exit) and free it.
    /// From here on every use is refused and nothing is deregistered or destroyed: NCCL freed it
    /// all. A no-op on a communicator aborted already.
    fn abort(&self) -> Result<(), Error> {
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
const ABORTED: &str = "the communicator was aborted (ncclCommAbort, after an asynchronous error \
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

/// An NCCL communicator: one rank of a clique, with the stream its collectives run on.
///
/// Neither `Send` nor `Sync` (see the [module documentation](self)). Dropping it destroys the
/// communicator (`ncclCommDestroy`, after `ncclCommFinalize` for a
/// [non-blocking](CommOptions#non-blocking-communicators) one) once its windows are gone too.
pub struct Comm {
    core: Rc<Core>,
    stream: Arc<CudaStream>,
    device: Device,
    rank: usize,
    size: usize,
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
    /// one thread that drives every GPU of the clique ([`group`] launches their collectives
    /// together). One stream gives a single-rank communicator.
    ///
    /// # Errors
    /// Before NCCL is called: [`Error::ZeroSize`] for no stream; [`Error::InvalidArgument`] where
    /// two streams share a device (NCCL takes one rank per GPU) or the count does not fit a C `int`.
    /// [`Error::NcclUnavailable`] where NCCL cannot be loaded; [`Error::Nccl`] for its refusal.
    #[doc(alias = "ncclCommInitAll")]
    pub fn from_devices(streams: &[Arc<CudaStream>]) -> Result<Vec<Comm>, Error> {
        let (ordinals, count) = nonblocking::clique(streams)?;
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
        let (c_rank, c_size) = nonblocking::rank_and_size(rank, size)?;
        let api = api::api("ncclCommInitRank")?;
        let init = api::function(api.comm_init_rank, "ncclCommInitRank")?;
        // NCCL makes the communicator on the current device.
        nonblocking::bind(stream)?;
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
        let core = Core::own(raw, stream.context(), CommOptions::new());
        Comm::with_core(core, stream, rank, size)
    }

    /// The communicator of `core`, rank `rank` of `size`, on `stream`.
    fn with_core(
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

    /// How many local registrations of this communicator were made and deregistered so far.
    #[must_use]
    pub fn registration_stats(&self) -> RegistrationStats {
        RegistrationStats {
            registered: self.core.registered.get(),
            deregistered: self.core.deregistered.get(),
        }
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
    fn async_code(&self) -> Result<c_int, Error> {
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
    /// [non-blocking](CommOptions#non-blocking-communicators) communicator it also bounds each wait
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
    fn between_polls(
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

    /// [`cudarc::scope`](super::cudarc::scope) on the communicator's stream: lend views with
    /// [`CommScope::lend`] and [`CommScope::lend_mut`] and queue collectives on them; when `f`
    /// returns or panics, the scope polls the stream's work and the communicator's asynchronous
    /// error until the stream is idle, aborts the communicator on an error or past its
    /// [timeout](Comm::set_timeout), and waits for the stream then (see
    /// [Asynchronous errors](self#asynchronous-errors-hangs-and-aborts)).
    ///
    /// # Errors
    /// Before `f` runs: [`Error::StreamRefused`] inside a [`group`] (the group would launch the
    /// work after this scope's wait), [`Error::NcclRefused`] on an aborted communicator, or as
    /// [`cudarc::scope`](super::cudarc::scope). After it: a refusal of a lent view and `f`'s error
    /// as [`cudarc::scope`](super::cudarc::scope); [`Error::Nccl`] for an asynchronous error
    /// (`call` `"ncclCommGetAsyncError"`) or a timeout (code 8, `ncclTimeout`), the communicator
    /// then aborted; the wait's error; the asynchronous error polled after the wait. Whatever it
    /// returns, the work queued on the stream has finished.
    ///
    /// # Panics
    /// Resumes a panic of `f`, after waiting for the stream.
    ///
    /// # Examples
    /// A window cannot be registered while a scope uses the communicator:
    /// ```compile_fail,E0502
    /// # use cuda_vmm::interop::nccl::Comm;
    /// # use cuda_vmm::owned::GrantedMapping;
    /// fn register_mid_scope(mut comm: Comm, memory: &mut GrantedMapping) -> cuda_vmm::Result<()> {
    ///     comm.scope(|_s| -> cuda_vmm::Result<()> {
    ///         let _window = comm.register_window(memory, ..)?; // collective, mid-scope
    ///         Ok(())
    ///     })
    /// }
    /// ```
    pub fn scope<'env, F, R, E>(&'env self, f: F) -> Result<R, E>
    where
        F: for<'scope> FnOnce(&CommScope<'scope, 'env>) -> Result<R, E>,
        E: From<Error>,
    {
        if in_group() {
            return Err(Error::StreamRefused {
                why: "the scope was opened inside an NCCL group, whose work is launched at the \
                      group's end, after this scope's wait; open the scopes first, the group inside",
            }
            .into());
        }
        if self.core.aborted.get() {
            return Err(Error::NcclRefused {
                call: "Comm::scope",
                why: ABORTED,
            }
            .into());
        }
        if self.core.suspended.get() {
            return Err(Error::NcclRefused {
                call: "Comm::scope",
                why: suspend::SUSPENDED,
            }
            .into());
        }
        // The first check comes after one interval: an error of work that ends sooner is read by
        // the check after the wait, at no cost to the polls.
        let next_check = Cell::new(CHECK_EVERY);
        let between = |waited| self.between_polls(waited, &next_check);
        // The cudarc scope's wait polls the stream, on return and while a panic of `f` unwinds,
        // before any lent borrow ends.
        let value = super::cudarc::scope_polled(&self.stream, &between, |inner| -> Result<R, E> {
            f(&CommScope {
                inner,
                comm: self,
                _env: PhantomData,
            })
        })?;
        self.async_error()?;
        Ok(value)
    }
}

/// `Ok` where no capture that this thread can see is under way: the communicator's stream's,
/// this thread's per-thread default stream's, or a [`Graph::capture`](crate::stream::Graph)
/// of this thread. A registration is refused during one (`Error::StreamCapturing`, before NCCL
/// is called): NCCL's registration makes driver calls that a capture of this thread refuses,
/// and the refusal invalidates the capture (vLLM #54626: "unhandled cuda error"). The
/// caller has made the communicator's context current ([`Core::live`]).
fn not_capturing(stream: sys::CUstream) -> Result<(), Error> {
    const WHAT: &str = "NCCL registers memory only while no capture of this thread, of its \
                        per-thread default stream or of the communicator's stream is under \
                        way: NCCL's driver calls would be refused, invalidating the capture";
    if crate::wait::capturing_here()
        || crate::wait::is_capturing(stream)?
        || crate::wait::is_capturing(sys::CU_STREAM_PER_THREAD as sys::CUstream)?
    {
        return Err(Error::StreamCapturing { what: WHAT });
    }
    Ok(())
}

/// Between two polls of a host-side wait (a scope's end, a non-blocking operation's settling), with
/// `waited` so far: a spin for [`SPIN_HARD`], then a yield of the thread until [`SPIN`], then a
/// sleep of [`PAUSE`].
fn pause(waited: Duration) {
    if waited < SPIN_HARD {
        core::hint::spin_loop();
    } else if waited < SPIN {
        std::thread::yield_now();
    } else {
        std::thread::sleep(PAUSE);
    }
}

/// How long a scope's end polls its stream in a tight loop, before it yields its thread between
/// polls: a collective of tens of megabytes ends within it.
const SPIN_HARD: Duration = Duration::from_millis(1);

/// How long a scope's end polls without sleeping (yielding its thread between polls, as the
/// driver's own waits spin): the steps of a training loop end within it.
const SPIN: Duration = Duration::from_millis(20);

/// How often a scope's end asks NCCL for an asynchronous error (and checks its timeout) while it
/// polls the stream: often enough that a failed peer is seen at once, rarely enough that the
/// polls of the stream find finished work without delay.
const CHECK_EVERY: Duration = Duration::from_micros(100);

/// The pause between two polls after [`SPIN`]: a peer that hangs costs no core.
const PAUSE: Duration = Duration::from_micros(100);

/// `ncclTimeout` (NCCL 2.29), the code of a scope whose wait passed its timeout, and of a
/// non-blocking operation polled past it.
const TIMEOUT: c_int = 8;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_types_and_ops_are_nccl_h_values() {
        assert_eq!(<f32 as sealed::Element>::DATA_TYPE, 7);
        assert_eq!(<u8 as sealed::Element>::DATA_TYPE, 1);
        assert_eq!(<f64 as sealed::Element>::DATA_TYPE, 8);
        assert_eq!(ReduceOp::Avg.raw(), 4);
        assert_eq!(ReduceOp::Sum.raw(), 0);
    }
}
