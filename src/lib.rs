//! CUDA Virtual Memory Management (VMM) with the driver's ordering rules enforced by the type system.
//!
//! VMM splits device memory into separate steps: allocate physical memory (`cuMemCreate`), reserve a
//! virtual address range (`cuMemAddressReserve`), map one into the other (`cuMemMap`) and grant devices
//! access (`cuMemSetAccess`). The driver has strict rules about their order, which other bindings leave
//! to the caller. Here breaking one does not compile, and what the types cannot see is checked at run
//! time before any driver call.
//!
//! # Two layers
//! The **borrowed layer** proves the order with lifetimes, so it lives in one scope:
//!
//! ```text
//! PhysicalAllocation      VirtualReservation
//!          ^                      ^ (&mut, through a Region)
//!           \                    /
//!            Mapping<'va, 'mem> ---- grant ----> Access<'a, ReadWrite | ReadOnly>
//!                                                    |
//!                                                    v
//!                                  DeviceSlice<'_, T> / DeviceSliceMut<'_, T>
//! ```
//!
//! The **owned layer** holds the same driver objects by ownership, as std's `OwnedFd` is beside
//! `BorrowedFd`: a [`VirtualBuffer`] owns one reservation, the pages mapped into it (at any offset, of
//! any device) and its access set, so it has no lifetime and can live in a struct field for hours;
//! an [`OwnedMapping`] owns one allocation mapped into a [`SharedReservation`]. Every change that could
//! pull memory or access from under a view takes `&mut`, and both layers hand out the same views,
//! [`DeviceSlice`] and [`DeviceSliceMut`].
//!
//! # Where to start
//! - Memory that outlives the code that made it: [`VirtualBuffer`] ([`VirtualBuffer::new`],
//!   [`grow`](VirtualBuffer::grow), [`slice_bytes_mut`](VirtualBuffer::slice_bytes_mut)).
//! - A scoped lifecycle: [`PhysicalAllocation`], [`VirtualReservation::region`], [`Region::map`],
//!   [`Mapping::grant`].
//! - Work queued on streams: [`scope`], [`Stream`], [`PinnedBuffer`], [`Event`].
//! - Several GPUs: [`can_access_peer`], [`PeerAccess`], [`Mapping::grant_all`], [`copy_between`].
//! - Host memory: [`HostAllocation`]; memory shared between processes: `ShareableAllocation` (Unix).
//! - cudarc: the `interop` module (feature `cudarc`).
//! - Errors: [`Error`] and [`DriverError`].
//!
//! # Safety model
//! Every rule the types enforce, the driver failure it prevents and the compile-fail case that proves
//! it, with the rules checked at run time instead: [`safety_model`].

#![deny(unsafe_op_in_unsafe_fn)]
// Library code returns errors; it never panics (the unit tests may).
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

mod access;
mod buffer;
mod device;
mod error;
mod host;
#[cfg(feature = "cudarc")]
pub mod interop;
#[cfg(unix)]
pub mod ipc;
mod mapped;
mod mapping;
mod module;
mod owned;
mod peer;
mod physical;
pub mod raw;
mod reservation;
pub mod safety_model;
pub mod stream;
mod sys;
mod transfer;
mod view;
mod wait;

pub use access::{Access, AccessMode, ReadOnly, ReadWrite, ScopedAccess};
pub use buffer::DeviceBuffer;
pub use device::{Context, Device, driver_version, init};
pub use error::{DriverError, Error, Result};
pub use host::{HostAccess, HostAllocation, HostMapping};
#[cfg(unix)]
pub use ipc::{ExportInfo, ExportedAllocation, Fabric, HandleKind, PosixFd, ShareableAllocation};
pub use mapping::Mapping;
pub use module::{Function, Module};
pub use owned::{BufferStats, OwnedMapping, PageInfo, SharedReservation, VirtualBuffer};
pub use peer::{P2PAttributes, PeerAccess, PeerLink, can_access_peer, p2p_attributes};
pub use physical::{
    AllocationOptions, Granularity, Location, PhysicalAllocation, align_size,
    allocation_granularity,
};
pub use reservation::{Region, VirtualReservation};
pub use stream::{
    DeviceInFlight, Event, HostInFlight, HostSource, KernelArg, KernelArgs, PinnedBuffer, Scope,
    ScopedRead, ScopedStream, ScopedWrite, Stream, scope,
};
pub use transfer::{
    CopyPath, Route, STAGING_CHUNK_BYTES, Staging, copy_between, copy_between_with,
};
pub use view::{DeviceSlice, DeviceSliceMut};

/// The README's example, compiled as a doctest so that it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
