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
//! - **A registration under a capture it cannot see.** [`Comm::register`] and
//!   [`Comm::register_window`] are refused while the communicator's stream, any blocking stream of
//!   its context or a [`Graph::capture`](crate::stream::Graph::capture) of this thread captures. A
//!   capture of another non-blocking stream (cudarc's streams are non-blocking) is not seen: the
//!   driver has no query for it. Where its mode refuses NCCL's driver calls (a capture of this
//!   thread, or another thread's in `GLOBAL` mode), the registration fails with [`Error::Nccl`]
//!   and the capture is invalidated, as it would be without this crate (vLLM #54626).
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

use core::ffi::c_int;
use std::time::Duration;

use ::cudarc::driver::DevicePtr;
use bytemuck::Pod;

use super::cudarc::{Lent, LentMut};
#[cfg(doc)]
use crate::VirtualBuffer;
use crate::error::Error;

// NCCL's functions, opened at run time, and the clique's id.
mod api;
mod id;
// The communicator's handle (`Core`), shared with its registrations and windows, and this
// thread's group depth.
mod handle;
// The communicator (blocking), and with a config (non-blocking ones among them).
mod comm;
mod nonblocking;
// Groups; scopes and their collectives; `CommScope::send` and `CommScope::recv`.
mod group;
mod p2p;
mod scope;
// Registrations and windows; `Comm::suspend` and `Comm::resume`.
mod register;
mod suspend;

pub use comm::Comm;
pub use group::group;
pub use id::UniqueId;
pub use nonblocking::CommOptions;
pub use register::{Registration, RegistrationStats, Window, WindowMemory, WindowPieces};
pub use scope::CommScope;

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
