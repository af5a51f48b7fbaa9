//! Compile-time facts about every public type: thread-safety and size. A wrong fact fails the build of
//! this file (and so `cargo test`), so there is no output to drift and no run-time test here.

use core::mem::size_of;

use cuda_vmm::{
    Access, Context, Device, DeviceBuffer, DeviceSlice, DeviceSliceMut, DriverError, Error,
    Granularity, Mapping, Module, PeerAccess, PhysicalAllocation, ReadOnly, ReadWrite,
    VirtualReservation, module::Function, peer::CopyPath, peer::P2PAttributes, peer::PeerLink,
    peer::Route, vmm::AllocationOptions, vmm::Location, vmm::Region, vmm::RevocableAccess,
};
use cuda_vmm::{
    VirtualBuffer, owned::BufferStats, owned::OwnedMapping, owned::PageInfo,
    owned::SharedReservation,
};
use static_assertions::{
    assert_eq_size, assert_impl_all, assert_not_impl_any, assert_type_eq_all, const_assert_eq,
};

// Owned driver objects move between threads and are shared by reference: the driver API is
// thread-safe and none of them has interior state of its own.
assert_impl_all!(Context: Send, Sync);
assert_impl_all!(PhysicalAllocation: Send, Sync);
assert_impl_all!(VirtualReservation: Send, Sync);
assert_impl_all!(Device: Send, Sync, Copy);
assert_impl_all!(DriverError: Send, Sync, Copy, std::error::Error);
assert_impl_all!(Error: Send, Sync, std::error::Error);
assert_impl_all!(Granularity: Send, Sync, Copy);
assert_impl_all!(Location: Send, Sync, Copy);
assert_impl_all!(AllocationOptions: Send, Sync, Copy);
assert_impl_all!(PeerLink: Send, Sync, Copy);
assert_impl_all!(P2PAttributes: Send, Sync, Copy);
assert_impl_all!(CopyPath: Send, Sync, Copy);
assert_impl_all!(Route: Send, Sync, Copy);

// Borrowing types: Send and Sync, so disjoint regions, mappings and views can be used from several
// threads at once (the concurrency tests rely on it).
assert_impl_all!(Region<'static>: Send, Sync);
assert_impl_all!(Mapping<'static, 'static>: Send, Sync);
assert_impl_all!(Access<'static, ReadWrite>: Send, Sync);
assert_impl_all!(Access<'static, ReadOnly>: Send, Sync);
assert_impl_all!(DeviceSlice<'static, u32>: Send, Sync, Copy);
assert_impl_all!(DeviceSliceMut<'static, u32>: Send, Sync);
// A peer-access guard is two `&Context`; a revocable grant is the `Access` it dereferences to.
assert_impl_all!(PeerAccess<'static>: Send, Sync);
assert_impl_all!(RevocableAccess<'static, ReadWrite>: Send, Sync);

// A plain device buffer and a loaded module own a clone of their context, so they have no lifetime:
// they live in struct fields beside the context they were made with, move between threads and are
// shared by reference (thread-safe driver handles; each binds its context before every driver call).
// A kernel borrows its module and is shared like it.
assert_impl_all!(DeviceBuffer<u32>: Send, Sync);
assert_impl_all!(Module: Send, Sync);
assert_impl_all!(Function<'static>: Send, Sync);
const _: () = owned_outright::<DeviceBuffer<u32>>();
const _: () = owned_outright::<Module>();

// Exclusive things are not copyable: a copy would be a second owner (double unmap, double free) or a
// second writer.
assert_not_impl_any!(Region<'static>: Clone, Copy);
assert_not_impl_any!(Mapping<'static, 'static>: Clone, Copy);
assert_not_impl_any!(Access<'static, ReadWrite>: Clone, Copy);
assert_not_impl_any!(DeviceSliceMut<'static, u32>: Clone, Copy);
assert_not_impl_any!(PhysicalAllocation: Clone, Copy);
assert_not_impl_any!(VirtualReservation: Clone, Copy);
// A context is cloned as a shared retain (one release, by the last clone), never copied.
assert_impl_all!(Context: Clone);
assert_not_impl_any!(Context: Copy);
assert_not_impl_any!(DeviceBuffer<u32>: Clone, Copy);
// A copied guard or revocable grant would end twice: two disables, two revokes.
assert_not_impl_any!(PeerAccess<'static>: Clone, Copy);
assert_not_impl_any!(RevocableAccess<'static, ReadWrite>: Clone, Copy);
assert_not_impl_any!(Module: Clone, Copy);

// Zero cost: each safe type is exactly the raw data the driver calls need.
/// The raw data of a mapping, region or reservation: `CUdeviceptr` and `size_t`.
type RawRange = (u64, usize);
assert_eq_size!(Mapping<'static, 'static>, RawRange);
assert_eq_size!(Region<'static>, RawRange);
assert_eq_size!(VirtualReservation, RawRange);
assert_eq_size!(Device, i32);
assert_eq_size!(DriverError, u32);
assert_eq_size!(Option<DriverError>, u32);
assert_eq_size!(cuda_vmm::Result<(), DriverError>, u32);
// A context is one pointer, to the retain its clones share (the handle and the device). A view is the
// address, length and the context copies use, plus the other contexts whose devices reach its memory,
// which copies between devices read to choose their path: a slice reference (the grant's list, the
// owner of a peer view's memory, none, or an owned buffer's access set) and a word that says whether
// the slice holds `&Context`s or `Context`s. That word is the one cost of sharing the view types
// between the borrowed and the owned layer.
assert_eq_size!(Context, usize);
assert_eq_size!(
    DeviceSlice<'static, u32>,
    (u64, usize, usize, usize, &[&Context])
);
assert_eq_size!(
    DeviceSliceMut<'static, u32>,
    (u64, usize, usize, usize, &[&Context])
);
// A peer-access guard is its two contexts' addresses; a link is its two device ordinals.
assert_eq_size!(PeerAccess<'static>, (usize, usize));
assert_eq_size!(PeerLink, (i32, i32));
const_assert_eq!(
    size_of::<RevocableAccess<'static, ReadWrite>>(),
    size_of::<Access<'static, ReadWrite>>()
);
const_assert_eq!(
    size_of::<Access<'static, ReadWrite>>(),
    size_of::<Access<'static, ReadOnly>>()
);
// The mode is a type, not a field: both modes are zero-sized.
assert_eq_size!(ReadWrite, ());
assert_eq_size!(ReadOnly, ());

// Staging memory is owned outright and has no thread affinity.
assert_impl_all!(cuda_vmm::peer::Staging: Send, Sync);
assert_not_impl_any!(cuda_vmm::peer::Staging: Clone, Copy);

// The owned layer: a buffer owns its reservation, pages and contexts outright, so it has no lifetime,
// moves between threads and is shared by reference (its views are the shared view types above). It
// is never copied: a copy would unmap, release and free everything twice.
assert_impl_all!(VirtualBuffer<ReadWrite>: Send, Sync);
assert_impl_all!(VirtualBuffer<ReadOnly>: Send, Sync);
assert_not_impl_any!(VirtualBuffer<ReadWrite>: Clone, Copy);
assert_not_impl_any!(VirtualBuffer<ReadOnly>: Clone, Copy);
assert_impl_all!(BufferStats: Send, Sync, Copy);
assert_impl_all!(PageInfo: Send, Sync, Copy);
/// Compiles only for `'static` types: a buffer can live in a struct field, a `Vec`, a thread.
const fn owned_outright<T: 'static + Send>() {}
const _: () = owned_outright::<VirtualBuffer<ReadWrite>>();
const _: () = owned_outright::<VirtualBuffer<ReadOnly>>();
// An owned mapping owns its memory and a share of its reservation: no lifetime, movable between
// threads. A reservation handle is a shared `Arc` (cloning shares the range); a mapping is not
// copyable (a copy would unmap twice).
assert_impl_all!(SharedReservation: Send, Sync, Clone);
assert_impl_all!(OwnedMapping: Send, Sync);
assert_not_impl_any!(OwnedMapping: Clone, Copy);
assert_not_impl_any!(SharedReservation: Copy);
const _: () = owned_outright::<OwnedMapping>();
const _: () = owned_outright::<SharedReservation>();
// A shared page is a shared `Arc` of one allocation (cloning shares the memory, the last share
// releases it), so it moves between threads and lives in struct fields; what an unmap gives back
// (the memory, or a share of a page) too.
assert_impl_all!(cuda_vmm::owned::SharedPage: Send, Sync, Clone);
assert_not_impl_any!(cuda_vmm::owned::SharedPage: Copy);
assert_eq_size!(cuda_vmm::owned::SharedPage, usize);
const _: () = owned_outright::<cuda_vmm::owned::SharedPage>();
assert_impl_all!(cuda_vmm::owned::Unmapped: Send, Sync);
assert_not_impl_any!(cuda_vmm::owned::Unmapped: Clone, Copy);
// Evicted bytes are pinned host memory owned outright, restored once: no copy (a second restore).
assert_impl_all!(cuda_vmm::owned::Evicted: Send, Sync);
assert_not_impl_any!(cuda_vmm::owned::Evicted: Clone, Copy);
assert_impl_all!(cuda_vmm::owned::NotRestored: Send, Sync, std::error::Error);
// An eviction in flight owns its pinned bytes and the event after its copies: no lifetime, so it
// leaves its scope; not a copy (its bytes are taken once, by `wait`).
assert_impl_all!(cuda_vmm::owned::EvictedInFlight: Send, Sync);
assert_not_impl_any!(cuda_vmm::owned::EvictedInFlight: Clone, Copy);
assert_impl_all!(cuda_vmm::owned::PageOptions: Send, Sync, Copy);
assert_impl_all!(cuda_vmm::owned::ReserveOptions: Send, Sync, Copy);
// An exportable buffer is the buffer itself (a newtype): the same auto traits, no lifetime, no
// copy, and no byte more than a `VirtualBuffer`; `ReadWrite` by default, as `VirtualBuffer`.
assert_impl_all!(cuda_vmm::owned::ExportableBuffer<ReadWrite>: Send, Sync);
assert_impl_all!(cuda_vmm::owned::ExportableBuffer<ReadOnly>: Send, Sync);
assert_not_impl_any!(cuda_vmm::owned::ExportableBuffer: Clone, Copy);
assert_eq_size!(
    cuda_vmm::owned::ExportableBuffer<ReadWrite>,
    VirtualBuffer<ReadWrite>
);
assert_type_eq_all!(
    cuda_vmm::owned::ExportableBuffer,
    cuda_vmm::owned::ExportableBuffer<ReadWrite>
);
const _: () = owned_outright::<cuda_vmm::owned::ExportableBuffer<ReadWrite>>();
// Host memory and memory shared between processes: owned allocations move between threads like any
// other; the CPU grant is an exclusive borrow of the mapped bytes (`&mut [u8]`), so Send and Sync.
assert_impl_all!(cuda_vmm::host::HostAllocation: Send, Sync);
assert_impl_all!(cuda_vmm::host::HostMapping<'static, 'static>: Send, Sync);
assert_impl_all!(cuda_vmm::host::HostAccess<'static, ReadWrite>: Send, Sync);
assert_not_impl_any!(cuda_vmm::host::HostAllocation: Clone, Copy);
assert_not_impl_any!(cuda_vmm::host::HostMapping<'static, 'static>: Clone, Copy);
assert_not_impl_any!(cuda_vmm::host::HostAccess<'static, ReadWrite>: Clone, Copy);
// A host mapping is the mapping plus its address, size and location; the CPU grant is the address
// and size only.
assert_eq_size!(cuda_vmm::host::HostAccess<'static, ReadWrite>, RawRange);
#[cfg(unix)]
mod shared {
    use super::*;
    use cuda_vmm::{
        ipc::ExportInfo, ipc::ExportedAllocation, ipc::Fabric, ipc::PosixFd,
        ipc::ShareableAllocation,
    };
    assert_impl_all!(ShareableAllocation<PosixFd>: Send, Sync);
    assert_impl_all!(ShareableAllocation<Fabric>: Send, Sync);
    assert_impl_all!(ExportedAllocation: Send, Sync);
    assert_impl_all!(ExportInfo: Send, Sync, Copy);
    // A copy of a shareable allocation or an exported descriptor would be a second owner: a double
    // release or close.
    assert_not_impl_any!(ShareableAllocation<PosixFd>: Clone, Copy);
    assert_not_impl_any!(ExportedAllocation: Clone, Copy);
    // A whole buffer's descriptors: owned, never copied (a double close).
    assert_impl_all!(cuda_vmm::ipc::ExportedBuffer: Send, Sync);
    assert_not_impl_any!(cuda_vmm::ipc::ExportedBuffer: Clone, Copy);
    assert_impl_all!(cuda_vmm::ipc::BufferInfo: Send, Sync, Clone);
    assert_impl_all!(cuda_vmm::ipc::BufferPiece: Send, Sync, Copy);
    // A dma-buf export owns its descriptors (a copy would close them twice) and borrows its buffer:
    // as large as the descriptors' vector and the range, the borrow costing nothing.
    assert_impl_all!(cuda_vmm::ipc::DmaBufExport<'static>: Send, Sync);
    assert_not_impl_any!(cuda_vmm::ipc::DmaBufExport<'static>: Clone, Copy);
    assert_impl_all!(cuda_vmm::ipc::DmaBufChunk: Send, Sync);
    assert_not_impl_any!(cuda_vmm::ipc::DmaBufChunk: Clone, Copy);
    assert_eq_size!(
        cuda_vmm::ipc::DmaBufExport<'static>,
        (Vec<cuda_vmm::ipc::DmaBufChunk>, core::ops::Range<usize>)
    );
    // A fabric handle is bytes that open memory, not an owner of it: cloned freely, each import its
    // own reference.
    assert_impl_all!(cuda_vmm::ipc::FabricHandle: Send, Sync, Clone);
    assert_impl_all!(cuda_vmm::ipc::DmaBufLayout: Send, Sync, Copy);
}
// The capability reports are plain values.
assert_impl_all!(cuda_vmm::device::Capabilities: Send, Sync, Copy);
assert_impl_all!(cuda_vmm::peer::PairCapabilities: Send, Sync, Copy);
// Stream-ordered work: owned streams, events and pinned memory move between threads and are shared
// by reference (thread-safe driver handles; each binds its context before every call); a copy would
// destroy or free twice. A scope is shared with threads that queue work too; a scoped stream is a
// `Copy` handle, a reference and nothing more.
assert_impl_all!(cuda_vmm::Stream: Send, Sync);
assert_impl_all!(cuda_vmm::Event: Send, Sync);
assert_impl_all!(cuda_vmm::PinnedBuffer<u32>: Send, Sync);
assert_not_impl_any!(cuda_vmm::Stream: Clone, Copy);
assert_not_impl_any!(cuda_vmm::Event: Clone, Copy);
assert_not_impl_any!(cuda_vmm::PinnedBuffer<u32>: Clone, Copy);
// Page-locked memory gives the host no `&mut [T]`: the buffer and its windows dereference only to
// `[T]` (a library that takes `&mut [T]` for a copy it leaves running would write it after
// returning). A window is an exclusive borrow: `Send` and `Sync` as `&mut [T]`, never `Copy`, two
// words.
assert_not_impl_any!(cuda_vmm::PinnedBuffer<u32>: core::ops::DerefMut);
assert_impl_all!(cuda_vmm::stream::PinnedSliceMut<'static, u32>: Send, Sync);
assert_not_impl_any!(cuda_vmm::stream::PinnedSliceMut<'static, u32>: Clone, Copy, core::ops::DerefMut);
assert_eq_size!(cuda_vmm::stream::PinnedSliceMut<'static, u32>, &mut [u32]);
assert_impl_all!(cuda_vmm::stream::PinnedChunks<'static, u32>: Send, Sync, ExactSizeIterator);
assert_impl_all!(cuda_vmm::stream::Scope<'static, 'static>: Send, Sync);
assert_not_impl_any!(cuda_vmm::stream::Scope<'static, 'static>: Clone, Copy);
assert_impl_all!(cuda_vmm::stream::ScopedStream<'static>: Send, Sync, Copy);
assert_eq_size!(cuda_vmm::stream::ScopedStream<'static>, &cuda_vmm::Stream);
assert_impl_all!(cuda_vmm::stream::HostInFlight<'static, u32>: Send, Sync, Copy);
// What a queued device write hands back is a `Copy` handle, as the `DeviceSlice` it wraps: the view,
// and where its memory came from when that memory can be retired while the scope lasts (a scoped
// buffer's page table and the scope's streams, two trait-object references, and the table's epoch),
// checked again at every lend, and the one stream a range read back is lent to (its context and
// handle, and the option's tag).
assert_impl_all!(cuda_vmm::stream::DeviceInFlight<'static, u32>: Send, Sync, Copy);
// A block table owns its device array, staging ring and events, like the buffers it is made of.
assert_impl_all!(cuda_vmm::stream::BlockTable<u32>: Send, Sync);
assert_not_impl_any!(cuda_vmm::stream::ScopedBlockTable<'static, u32>: Clone, Copy);
assert_eq_size!(
    cuda_vmm::stream::DeviceInFlight<'static, u32>,
    (DeviceSlice<'static, u32>, [usize; 8])
);
// A slot written again and again is exclusive: no copy of it is a second writer. Its read handle, and
// the scoped buffer it may come from, are `Copy`.
assert_impl_all!(cuda_vmm::stream::Rewritable<'static, u32>: Send, Sync);
assert_not_impl_any!(cuda_vmm::stream::Rewritable<'static, u32>: Clone, Copy);
assert_impl_all!(cuda_vmm::owned::ScopedBuffer<'static, ReadWrite>: Send, Sync, Copy);
assert_impl_all!(cuda_vmm::owned::ScopedBuffer<'static, ReadOnly>: Send, Sync, Copy);
// A claimed range is its writer's alone: sent to a thread, shared read-only (its views need
// `&mut`), never copied into a second writer.
assert_impl_all!(cuda_vmm::owned::ClaimedRange<'static, u32>: Send, Sync);
assert_not_impl_any!(cuda_vmm::owned::ClaimedRange<'static, u32>: Clone, Copy);
// The cudarc interop: a scope is shared with threads that queue work on its stream too; a read-only
// lent view is a `Copy` handle, as a `DeviceSlice` is; a writable one is exclusive, as a
// `DeviceSliceMut` is, and a copy of it would be a second writer.
#[cfg(feature = "cudarc")]
mod cudarc_interop {
    use cuda_vmm::interop::cudarc::{Lent, LentMut, Scope};
    use static_assertions::{assert_impl_all, assert_not_impl_any};
    assert_impl_all!(Scope<'static, 'static>: Send, Sync);
    assert_not_impl_any!(Scope<'static, 'static>: Clone, Copy);
    assert_impl_all!(Lent<'static, u32>: Send, Sync, Copy);
    assert_impl_all!(LentMut<'static, u32>: Send, Sync);
    assert_not_impl_any!(LentMut<'static, u32>: Clone, Copy);
}

// The raw handles the escape hatches return are the crate's own types, as large as the C API's.
assert_eq_size!(cuda_vmm::raw::CUcontext, *mut core::ffi::c_void);
assert_eq_size!(cuda_vmm::raw::CUstream, *mut core::ffi::c_void);
assert_eq_size!(cuda_vmm::raw::CUdeviceptr, u64);
assert_eq_size!(cuda_vmm::raw::CUdevice, i32);

// A granted mapping lives in a struct field and moves between threads, as an owned mapping does.
assert_impl_all!(cuda_vmm::owned::GrantedMapping: Send, Sync);
assert_impl_all!(cuda_vmm::owned::GrantedMapping<cuda_vmm::ReadOnly>: Send, Sync);

// An owned host mapping owns its allocation, its reservation and its devices' contexts: no
// lifetime, it lives in a struct field and moves between threads. Shared by reference it gives only
// device read views (its CPU slices need `&mut`), so it is `Sync` too. A copy would unmap, release
// and free twice. The mode is a type, not a field.
assert_impl_all!(cuda_vmm::host::OwnedHostMapping<ReadWrite>: Send, Sync);
assert_impl_all!(cuda_vmm::host::OwnedHostMapping<ReadOnly>: Send, Sync);
assert_not_impl_any!(cuda_vmm::host::OwnedHostMapping<ReadWrite>: Clone, Copy);
const _: () = owned_outright::<cuda_vmm::host::OwnedHostMapping<ReadWrite>>();
const _: () = owned_outright::<cuda_vmm::host::OwnedHostMapping<ReadOnly>>();
const_assert_eq!(
    size_of::<cuda_vmm::host::OwnedHostMapping<ReadWrite>>(),
    size_of::<cuda_vmm::host::OwnedHostMapping<ReadOnly>>()
);
// A set of handle kinds is the driver's `CUmemAllocationHandleType` bits and nothing more.
assert_impl_all!(cuda_vmm::vmm::HandleKinds: Send, Sync, Copy, Default, core::hash::Hash);
assert_eq_size!(cuda_vmm::vmm::HandleKinds, u32);
// A graph is replayed from any thread's scope and moves between threads with its borrows; it is one
// owner of its driver objects (no `Clone`). Its capture stays on the capturing thread, and a kernel
// node is a plain, copyable name.
assert_impl_all!(cuda_vmm::stream::Graph<'static>: Send, Sync);
assert_not_impl_any!(cuda_vmm::stream::Graph<'static>: Clone, Copy);
assert_not_impl_any!(cuda_vmm::stream::Capture<'static, 'static>: Send, Sync);
assert_impl_all!(cuda_vmm::stream::KernelNode: Send, Sync, Copy);
// A parked graph borrows nothing: owned outright (no lifetime), movable between threads, one owner
// of its driver objects; it comes back whole in a refused rebind. A rebind in progress holds shared
// borrows only (exclusive ones seen as shared), so it moves between threads too.
const _: () = owned_outright::<cuda_vmm::stream::ParkedGraph>();
assert_impl_all!(cuda_vmm::stream::ParkedGraph: Send, Sync);
assert_not_impl_any!(cuda_vmm::stream::ParkedGraph: Clone, Copy);
assert_eq_size!(cuda_vmm::stream::ParkedGraph, usize);
assert_impl_all!(cuda_vmm::stream::Rebind<'static>: Send, Sync);
assert_not_impl_any!(cuda_vmm::stream::Rebind<'static>: Clone, Copy);
assert_impl_all!(cuda_vmm::stream::NotRebound: Send, Sync, std::error::Error);
// A graph bound to a scope holds shared borrows only (the parked graph, the buffers' page tables
// and the scope's streams): it moves between the scope's threads, and is replayed through `&mut`,
// so one replay is admitted and queued at a time. One binding, one set of claims: no `Clone`.
assert_impl_all!(cuda_vmm::stream::ScopedGraph<'static>: Send, Sync);
assert_not_impl_any!(cuda_vmm::stream::ScopedGraph<'static>: Clone, Copy);
assert_impl_all!(cuda_vmm::stream::ScopedRebind<'static>: Send, Sync);
assert_not_impl_any!(cuda_vmm::stream::ScopedRebind<'static>: Clone, Copy);
// A graph table owns its device array, staging ring and events; one scoped graph holds it for a
// scope. Its kernel argument exists only inside the capture's closure, borrowed: no `Clone`, so no
// copy of it outlives the borrow.
assert_impl_all!(cuda_vmm::stream::GraphTable<u32>: Send, Sync);
assert_not_impl_any!(cuda_vmm::stream::GraphTable<u32>: Clone, Copy);
assert_not_impl_any!(cuda_vmm::stream::TableArg: Clone, Copy);

// NCCL (feature `nccl`): a communicator stays on the thread that made it, and so do its
// registrations and windows (NCCL does not allow one communicator to be used from two threads at
// once, and they use it when dropped); none is copied (each deregisters or destroys once). A unique
// id is 128 plain bytes, sent to other processes and threads.
#[cfg(feature = "nccl")]
mod nccl_interop {
    use cuda_vmm::interop::nccl::{
        Comm, CommOptions, CommScope, ReduceOp, Registration, UniqueId, Window,
    };
    use static_assertions::{assert_eq_size, assert_impl_all, assert_not_impl_any};

    assert_not_impl_any!(Comm: Send, Sync, Clone);
    assert_not_impl_any!(Registration<'static, 'static>: Send, Sync, Clone);
    assert_not_impl_any!(Window<'static>: Send, Sync, Clone);
    assert_not_impl_any!(CommScope<'static, 'static>: Send, Sync);
    assert_impl_all!(UniqueId: Send, Sync, Copy, Eq, core::hash::Hash);
    assert_eq_size!(UniqueId, [u8; 128]);
    assert_impl_all!(ReduceOp: Send, Sync, Copy, Eq);
    // A communicator's options are plain values, built once and passed to every rank's thread.
    assert_impl_all!(CommOptions: Send, Sync, Copy, Eq, Default, core::hash::Hash);
    assert_eq_size!(CommOptions, (bool, Option<core::time::Duration>));
}
