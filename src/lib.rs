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
//! an [`OwnedMapping`](owned::OwnedMapping) owns one allocation mapped into a
//! [`SharedReservation`](owned::SharedReservation). Every change that could pull memory or access
//! from under a view takes `&mut`, and both layers hand out the same views, [`DeviceSlice`] and
//! [`DeviceSliceMut`].
//!
//! # The modules
//! Each module is one concept; lower ones never name higher ones, and no files import each other
//! in a circle (`tests/layers.rs` checks both).
//! - [`device`]: initialisation, [`Device`], [`Context`] (a device's primary context, retained),
//!   and what a device can do beyond one process ([`Capabilities`](device::Capabilities)).
//! - [`vmm`]: the borrowed layer: [`PhysicalAllocation`], [`VirtualReservation`] and its
//!   [`Region`](vmm::Region)s, [`Mapping`], [`Access`] and the revocable grant.
//! - [`view`]: [`DeviceSlice`], [`DeviceSliceMut`] and their synchronous copies; [`DeviceBuffer`]
//!   (`cuMemAlloc`).
//! - [`owned`]: the owned layer: [`VirtualBuffer`], [`SharedReservation`](owned::SharedReservation),
//!   [`OwnedMapping`](owned::OwnedMapping), [`GrantedMapping`](owned::GrantedMapping),
//!   [`SharedPage`](owned::SharedPage), and [`ScopedBuffer`](owned::ScopedBuffer), a buffer lent to a
//!   scope whose pages grow and retire while the work runs.
//! - [`host`]: host memory mapped like device memory, and the CPU's slices of it (borrowed, and
//!   owned: [`OwnedHostMapping`](host::OwnedHostMapping)).
//! - [`stream`]: [`Stream`], [`Event`], [`PinnedBuffer`], and [`scope`], under which queued copies
//!   and kernels borrow what they use until the work has finished; its documentation says why work
//!   borrows through a scope, and what every wait does under stream capture.
//! - [`peer`]: several GPUs: links, [`PeerAccess`] guards, and [`copy_between`].
//! - [`module`]: PTX modules and their kernels ([`Module`]).
//! - `ipc` (Unix): memory shared between processes (POSIX file descriptors), between machines
//!   (fabric handles), and with network adapters (dma-buf descriptors of a buffer's range).
//! - `interop` (feature `cudarc`): this crate's views lent to cudarc.
//! - [`error`]: [`Error`], [`DriverError`], [`Result`]. [`raw`]: the handles the escape hatches
//!   return.
//! - [`safety_model`]: the one rule table.
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

pub mod device;
pub mod error;
pub mod host;
#[cfg(feature = "cudarc")]
pub mod interop;
#[cfg(unix)]
pub mod ipc;
pub mod module;
pub mod owned;
pub mod peer;
pub mod raw;
pub mod safety_model;
pub mod stream;
mod sys;
pub mod view;
pub mod vmm;
mod wait;

// The types a typical program names; every other public item is in its module.
pub use device::{Context, Device, init};
pub use error::{DriverError, Error, Result};
pub use module::Module;
pub use owned::VirtualBuffer;
pub use peer::{PeerAccess, copy_between};
pub use stream::{Event, PinnedBuffer, Stream, scope};
pub use view::{DeviceBuffer, DeviceSlice, DeviceSliceMut};
pub use vmm::{
    Access, Granularity, Mapping, PhysicalAllocation, ReadOnly, ReadWrite, VirtualReservation,
    align_size, allocation_granularity,
};

/// The README's example, compiled as a doctest so that it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
