//! CUDA Virtual Memory Management (VMM) with the driver's ordering rules enforced by the type system.
//!
//! VMM splits device memory into separate steps: allocate physical memory (`cuMemCreate`), reserve a
//! virtual address range (`cuMemAddressReserve`), map one into the other (`cuMemMap`) and grant devices
//! access (`cuMemSetAccess`). The driver has strict rules about their order, which other bindings leave
//! to the caller. Here they are lifetimes and types:
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
//! # Example
//! ```no_run
//! use cuda_vmm::{Context, Device, Granularity, PhysicalAllocation, ReadWrite, VirtualReservation};
//!
//! # fn main() -> Result<(), cuda_vmm::Error> {
//! let device = Device::get(0)?;
//! let context = Context::new(device)?;
//! let granularity = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
//! let size = cuda_vmm::align_size(4096, granularity)?;
//!
//! let memory = PhysicalAllocation::new(device, size)?;
//! let mut reservation = VirtualReservation::new(size, 0)?;
//! let mut region = reservation.region();
//! let mut mapping = region.map(&memory)?;
//! let mut access = mapping.grant(&context, ReadWrite)?;
//!
//! let mut view = access.slice_mut::<u32>()?;
//! let input: Vec<u32> = (0..view.len() as u32).collect();
//! view.copy_from_host(&input)?;
//! assert_eq!(view.to_vec()?, input);
//! # Ok(())
//! # }
//! // Dropped in reverse order: view, access, mapping (cuMemUnmap), region, reservation
//! // (cuMemAddressFree), memory (cuMemRelease). The orders that matter are enforced: dropping the
//! // memory or the reservation before the mapping, or the access before its views, does not compile.
//! ```
//!
//! # Safety model
//! Safe code cannot do any of the following; each rule has a compile-fail case in `ui-tests/` (indexed
//! in `ui-tests/README.md`):
//!
//! | rule | driver failure prevented | ui case |
//! | --- | --- | --- |
//! | a physical allocation is not dropped, released or moved while mapped | mapping backed by released memory | `vmm/physical_dropped_while_mapped`, `vmm/physical_released_while_mapped`, `vmm/physical_moved_while_mapped` |
//! | a reservation is not dropped or freed while mapped | `cuMemAddressFree` fails, the range leaks | `vmm/reservation_dropped_while_mapped`, `vmm/reservation_freed_while_mapped`, `vmm/mapping_escapes_reservation_scope` |
//! | mappings of one reservation never overlap | `cuMemMap` over a mapped range | `vmm/region_taken_twice`, `vmm/region_used_after_split` |
//! | a mapping is unmapped once, and not used after | double unmap, which the driver does not catch | `vmm/mapping_unmapped_twice`, `vmm/mapping_used_after_unmap` |
//! | no view, and no address from a mapping, before access is granted | use of an inaccessible mapping | `access/view_before_grant`, `access/pointer_before_grant` |
//! | a read-only grant gives no write path | write to a read-only mapping | `access/write_through_read_only`, `view/read_only_slice_written` |
//! | one grant of a mapping in use at a time | a read-only grant widened under its views | `access/second_grant_while_access_lives` |
//! | a view does not outlive its mapping, grant or buffer | use after unmap or free | `view/view_outlives_mapping`, `view/view_outlives_access`, `view/view_outlives_buffer` |
//! | only plain data is copied to and from the device | invalid values made from device bytes | `view/non_pod_copy`, `view/non_pod_bool_copy` |
//! | a VMM address never becomes an owning buffer | `cuMemFree` of a VMM address | `view/vmm_address_into_buffer` |
//! | peer access is enabled only with the driver's yes (a [`PeerLink`]) | `cuCtxEnablePeerAccess` on an unsupported pair | `peer/enable_without_capability` |
//! | a peer-access guard does not outlive its contexts | peer access to a released context | `peer/guard_outlives_context` |
//! | peer memory is not used after its access ends | use of peer memory after `cuCtxDisablePeerAccess` | `peer/peer_view_after_guard_ended`, `peer/guard_disabled_while_view_lives` |
//! | a scoped grant does not outlive its mapping, nor its views the grant | use after unmap or revoke | `peer/scoped_grant_outlives_mapping`, `peer/scoped_view_outlives_grant` |
//! | the access a direct copy between devices relies on lives as long as the view that carries it | a copy over the link after access ended | `peer/direct_copy_source_outlives_grant` |
//! | a view of a [`VirtualBuffer`] is not kept across an unmap, a shrink or a change of the access set, nor past the buffer | use after unmap, release or revoke | `owned/buffer_view_kept_across_unmap`, `owned/buffer_view_kept_across_shrink`, `owned/buffer_view_kept_across_access_change`, `owned/buffer_view_outlives_buffer` |
//! | a read-only [`VirtualBuffer`] gives no write path | write to a read-only mapping | `owned/read_only_buffer_written` |
//! | one writable view of a [`VirtualBuffer`] at a time | two writers of one range | `owned/buffer_two_writable_views` |
//! | an [`OwnedMapping`] is not used past its unmap, is unmapped once, and has one grant in use at a time | use after unmap, double unmap, a grant widened under its views | `owned/mapping_view_outlives_mapping`, `owned/mapping_unmapped_twice`, `owned/mapping_in_struct_granted_twice` |
//! | only memory created shareable ([`ShareableAllocation<PosixFd>`]) can be exported | `cuMemExportToShareableHandle` of memory created without `requestedHandleTypes` | `ipc/physical_exported` |
//! | an imported allocation is not used after its release | `cuMemMap` of a released handle | `ipc/imported_used_after_release` |
//! | a CPU slice of host memory does not outlive its CPU grant | CPU access after the grant ended | `host/slice_outlives_host_grant` |
//! | the CPU borrows host memory only while no device view of the mapping, and no alias mapping, exists | a device write racing a Rust `&mut [T]` | `host/slice_mut_while_device_view_writable`, `host/aliased_while_host_mapped` |
//! | work queued inside [`scope`] borrows its views, host memory and kernel until the scope has waited for it: nothing lent is dropped, freed, unmapped or regranted meanwhile, and what queued work writes is not touched at all: the host reads it only after the scope (a write hands back a `DeviceInFlight` or `HostInFlight`, which only later queued work reads: no host read, no synchronous copy, no way back to a `DeviceSlice`) | a queued copy or kernel on unmapped, revoked or freed memory; DMA into freed host memory, or racing a host access; a synchronous read on the legacy stream of bytes a queued write is still writing | `stream/view_written_while_lent`, `stream/view_dropped_while_lent`, `stream/mapping_unmapped_while_lent`, `stream/buffer_shrunk_while_lent`, `stream/grant_changed_while_lent`, `stream/host_buffer_dropped_while_lent`, `stream/host_buffer_read_while_download_queued`, `stream/written_view_read_on_host`, `stream/written_view_copied_between`, `stream/written_view_lent_out_of_the_seal`, `stream/module_unloaded_while_kernel_queued` |
//! | only what outlives a scope is lent to its work, and a [`ScopedStream`] does not leave its scope (`'scope` is invariant) | queued work outliving what it uses | `stream/closure_local_lent_to_queued_work`, `stream/scoped_stream_escapes_scope` |
//! | queued work writes only through writable views | writes into a read-only mapping, failing on the stream | `stream/read_only_view_lent_for_writing` |
//! | a view lent to cudarc (`interop::cudarc::scope`, feature `cudarc`) keeps its mapping, grant and owner until the scope has waited for its stream, and does not leave the scope | cudarc's queued work on unmapped or revoked memory | `cudarc/view_unmapped_while_queued`, `cudarc/lent_view_escapes_scope` |
//! | a read-only view lent to cudarc is no cudarc copy destination (`DevicePtrMut`) and no written kernel argument | writes into a read-only mapping | `cudarc/read_only_view_copied_into`, `cudarc/read_only_view_written_by_kernel` |
//! | no wait returns while work it waits for can still run, under stream capture too; no work that borrows memory is queued on a capturing stream | a scope or copy returning on a refused wait (900–908) while the work runs on | run time: [`Error::StreamCapturing`], and an abort where nothing proves the work finished ([When a wait fails](scope#when-a-wait-fails)) |
//!
//! Which pages of a [`VirtualBuffer`] or ranges of a [`SharedReservation`] are mapped is a run-time
//! value, so a new page or owned mapping over a mapped one, an unmap that would cut a page and a view
//! over bytes not mapped are refused at run time, before any driver call ([`Error::PageRange`]).
//!
//! A peer view for a guard of the other direction is refused at run time
//! ([`Error::DeviceMismatch`]): devices are run-time values, so the types cannot tell two contexts
//! apart. For the same reason a direct copy between two devices checks at run time that one of them
//! reaches the other view's memory ([`DeviceSlice::reachable_from`]), and is refused with
//! [`Error::NoPeerAccess`] before any driver call where neither does. Work queued on a stream is
//! checked the same way: the stream's device must reach every view ([`Error::NoPeerAccess`]) and own
//! the kernel and a recorded event ([`Error::DeviceMismatch`]). A view lent to cudarc gives its
//! address only to work on its scope's stream outside a graph capture; cudarc's traits cannot fail,
//! so anything else gets a never-mapped address and the scope returns [`Error::StreamRefused`].
//!
//! Static facts (thread-safety of each type, sizes equal to the raw handles) are asserted in
//! `tests/static_facts.rs`. `mem::forget` is safe and stays harmless: forgetting a mapping leaks its range
//! and keeps its borrows' owners alive in the driver, nothing more. The wait for queued work is in
//! [`scope`]'s own frame, never in a value the caller could forget.
//!
//! # Owned or borrowed
//! The types above are the borrowed layer: their lifetimes prove the driver's order, so they live in
//! one scope. [`VirtualBuffer`] is the owned layer beside it, as std's `OwnedFd` is beside
//! `BorrowedFd`: it owns one reservation, the pages mapped into it (at any offset, of any device) and
//! its access set, so it has no lifetime and can live in a struct field for hours. Every change of
//! its pages or access set takes `&mut self`, and its views are the same [`DeviceSlice`] and
//! [`DeviceSliceMut`] as the borrowed layer's. An [`OwnedMapping`] owns one allocation mapped into a
//! [`SharedReservation`] and a share of that reservation, and is granted like a [`Mapping`].
//!
//! # Several GPUs
//! Context peer access ([`PeerAccess`], for [`DeviceBuffer`] memory) and VMM grants
//! ([`Mapping::grant_all`], [`Mapping::grant_scoped`]) are separate driver mechanisms; neither opens
//! the other's memory. [`can_access_peer`] answers with the [`PeerLink`] that enabling requires
//! ([`PeerAccess::open`] asks and enables in one call), and [`copy_between`] copies across devices
//! directly over the link where one reaches the other's memory (a grant naming it, or a peer view
//! under a guard) or, everywhere else, through pinned host memory: never through the driver's own,
//! far slower staging.
//!
//! # Driver values
//! Driver results are integers wrapped in [`DriverError`], never Rust enums: a driver newer than any
//! header returns codes no enum has, and reading such a value through an enum is undefined behaviour.
//! The raw FFI layer is private; the raw handles are reachable through `as_raw`-style methods that own
//! nothing.
//!
//! # Contexts
//! Driver calls that need a current context make their own context current first (`cuCtxSetCurrent`) and
//! leave it current on the calling thread. Every copy returns only once it has finished, except the
//! work queued on a [`Stream`] inside [`scope`], which has finished when [`scope`] returns. Every
//! wait holds under stream capture, also from other threads: it returns only once the work has
//! finished, and aborts the process where nothing can prove that
//! ([When a wait fails](scope#when-a-wait-fails)).

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
mod reservation;
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
