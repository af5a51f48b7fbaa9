//! What a page of a [`VirtualBuffer`](super::VirtualBuffer) is: what it is made with
//! ([`PageOptions`]), its memory ([`Memory`], owned or a share of a [`SharedPage`]) and device
//! ([`Backing`]), where an evicted one was ([`Piece`]), how the buffer describes one to its users
//! ([`PageInfo`]), and the counts of the driver calls made on pages ([`BufferStats`]). The page
//! table (`table.rs`) holds them and changes their state.

use crate::device::Device;
use crate::error::DriverResult;
use crate::owned::shared::SharedPage;
use crate::sys;
use crate::vmm::physical::{AllocationOptions, HandleKinds, PhysicalAllocation};

/// What every page of a [`VirtualBuffer`](super::VirtualBuffer) is created with, whatever its device: the kinds of
/// shareable handle it can be exported as (`requestedHandleTypes`) and whether it is `GPUDirect`
/// RDMA capable (`allocFlags.gpuDirectRDMACapable`). Given to
/// [`VirtualBuffer::with_options`](super::VirtualBuffer::with_options), which checks it once against every device of the access set.
///
/// # Examples
/// ```
/// use cuda_vmm::owned::PageOptions;
/// use cuda_vmm::vmm::HandleKinds;
///
/// let options = PageOptions::posix_fd().with_rdma(true);
/// assert!(options.handle_kinds().contains(HandleKinds::POSIX_FD));
/// assert!(options.rdma());
/// assert_eq!(PageOptions::new(), PageOptions::default());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PageOptions {
    handle_kinds: HandleKinds,
    rdma: bool,
}

impl PageOptions {
    /// Plain pages: not exportable, not RDMA-flagged (what [`VirtualBuffer::new`](super::VirtualBuffer::new) uses).
    #[must_use]
    pub const fn new() -> PageOptions {
        PageOptions {
            handle_kinds: HandleKinds::NONE,
            rdma: false,
        }
    }

    /// Pages exportable as POSIX file descriptors, so that [`ExportableBuffer::export`](super::ExportableBuffer::export) can share
    /// them with another process of the machine.
    ///
    /// # Examples
    /// ```
    /// # use cuda_vmm::{owned::PageOptions, vmm::HandleKinds};
    /// assert_eq!(PageOptions::posix_fd().handle_kinds(), HandleKinds::POSIX_FD);
    /// ```
    #[must_use]
    pub const fn posix_fd() -> PageOptions {
        PageOptions::new().with_handle_kinds(HandleKinds::POSIX_FD)
    }

    /// The same options, exportable as every kind of `kinds`; replaces the kinds asked for before.
    ///
    /// # Examples
    /// ```
    /// # use cuda_vmm::{owned::PageOptions, vmm::HandleKinds};
    /// let options = PageOptions::new().with_handle_kinds(HandleKinds::POSIX_FD | HandleKinds::FABRIC);
    /// assert!(options.handle_kinds().contains(HandleKinds::FABRIC));
    /// ```
    #[must_use]
    pub const fn with_handle_kinds(self, kinds: HandleKinds) -> PageOptions {
        PageOptions {
            handle_kinds: kinds,
            rdma: self.rdma,
        }
    }

    /// The same options, `GPUDirect` RDMA capable or not.
    ///
    /// # Examples
    /// ```
    /// # use cuda_vmm::owned::PageOptions;
    /// assert!(PageOptions::new().with_rdma(true).rdma());
    /// ```
    #[must_use]
    pub const fn with_rdma(self, rdma: bool) -> PageOptions {
        PageOptions {
            handle_kinds: self.handle_kinds,
            rdma,
        }
    }

    /// The kinds of shareable handle every page can be exported as.
    #[must_use]
    pub const fn handle_kinds(&self) -> HandleKinds {
        self.handle_kinds
    }

    /// Whether every page is asked `GPUDirect` RDMA capable.
    #[must_use]
    pub const fn rdma(&self) -> bool {
        self.rdma
    }

    /// The allocation options of a page of `device`'s memory made with these options.
    ///
    /// # Examples
    /// ```no_run
    /// # use cuda_vmm::{Device, owned::PageOptions, vmm::{HandleKinds, Location}};
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let options = PageOptions::posix_fd().for_device(device);
    /// assert_eq!(options.location, Location::Device(device));
    /// assert!(options.handle_kinds().contains(HandleKinds::POSIX_FD));
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn for_device(self, device: Device) -> AllocationOptions {
        AllocationOptions::device(device)
            .with_handle_kinds(self.handle_kinds)
            .with_rdma(self.rdma)
    }
}

/// Counts of the driver calls a [`VirtualBuffer`](super::VirtualBuffer) made on its pages, since it
/// was created.
///
/// They make the buffer's cost visible: with an access set that never changes and no reserve, every
/// page mapped costs exactly one `cuMemMap` and one `cuMemSetAccess`, however often its bytes are
/// viewed (`set_access_calls == pages_mapped`). With a reserve, the worker's calls count here too:
/// one `cuMemMap` and one `cuMemSetAccess` per page it made (`reserve_created`), and none for a page
/// a map took from it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct BufferStats {
    /// `cuMemMap` calls, including refused ones.
    pub map_calls: u64,
    /// `cuMemUnmap` calls, including refused ones and those that undo a failed grant.
    pub unmap_calls: u64,
    /// `cuMemSetAccess` calls, including refused ones: one for each page mapped, and, when the access
    /// set changes, one for each granted page to grant the new set and one for each to revoke the
    /// devices that left it.
    pub set_access_calls: u64,
    /// Pages mapped and granted ([`VirtualBuffer::map_page`](super::VirtualBuffer::map_page) and
    /// [`VirtualBuffer::grow`](super::VirtualBuffer::grow) that succeeded).
    pub pages_mapped: u64,
    /// Pages unmapped and handed to `cuMemRelease`.
    pub pages_released: u64,
    /// Pages retired ([`VirtualBuffer::retire_after`](super::VirtualBuffer::retire_after),
    /// [`ScopedBuffer::retire`](super::ScopedBuffer::retire),
    /// [`ScopedBuffer::retire_at_scope_end`](super::ScopedBuffer::retire_at_scope_end)): released
    /// once the work queued before the retire has finished (for a retire at the scope's end, once
    /// the scope has ended).
    pub pages_retired: u64,
    /// `cuEventRecord` calls of retires: one per stream the retire orders the release after (none
    /// for a retire at the scope's end).
    pub events_recorded: u64,
    /// Pages evicted ([`VirtualBuffer::evict`](super::VirtualBuffer::evict)): their bytes copied to
    /// host memory, then unmapped and released (each also counts in `pages_released`).
    pub pages_evicted: u64,
    /// Pages restored ([`VirtualBuffer::restore`](super::VirtualBuffer::restore)): created, mapped
    /// and granted again (each also counts in `pages_mapped`), their bytes copied back.
    pub pages_restored: u64,
    /// Pages the reserve holds now ([`VirtualBuffer::reserve_ahead`](super::VirtualBuffer::reserve_ahead)):
    /// created, mapped and granted ahead of need, not yet the buffer's. Memory the buffer holds,
    /// on top of [`mapped_bytes`](super::VirtualBuffer::mapped_bytes).
    pub reserve_pages: u64,
    /// The bytes of the pages the reserve holds now.
    pub reserve_bytes: u64,
    /// The most pages the reserve held at once, those being made included: never more than its
    /// bound.
    pub reserve_peak_pages: u64,
    /// Pages the reserve's worker put in the reserve, mapped and granted: created, or the memory
    /// of a retired page recycled (`reserve_recycled`). Its `cuMemMap` and `cuMemSetAccess` count
    /// in `map_calls` and `set_access_calls`.
    pub reserve_created: u64,
    /// Pages of the reserve a map or grow took, with no driver call (each also counts in
    /// `pages_mapped`). `reserve_created + reserve_recycled_in_place == reserve_taken +
    /// reserve_released + reserve_pages`.
    pub reserve_taken: u64,
    /// Pages of the reserve unmapped and released unused: by
    /// [`trim`](super::VirtualBuffer::trim), the drop, or a map of another size or device over them.
    pub reserve_released: u64,
    /// Fills of the reserve the driver refused (or a fault injected for tests refused): each is
    /// returned by the next map or grow that would have used the reserve.
    pub reserve_faults: u64,
    /// Retired pages the reserve's worker unmapped and released, off the caller's thread (each
    /// also counts in `pages_released`).
    pub released_in_background: u64,
    /// Retired pages the reserve's worker unmapped and mapped again into the reserve, their memory
    /// kept (no `cuMemRelease`, no `cuMemCreate`); each also counts in `reserve_created` once its
    /// memory is mapped and granted again, and where the driver refuses that (a fill's `cuMemMap`
    /// or `cuMemSetAccess`) the memory is released by the worker and the refusal counts in
    /// `reserve_faults` instead: the page left the buffer as a recycled one either way. Memory
    /// made exportable (an [`ExportableBuffer`](super::ExportableBuffer)'s) or exported as a
    /// dma-buf is never kept: a process that imported it may still map it. Every page mapped is
    /// released or recycled in the end: `pages_mapped == pages_released + reserve_recycled +
    /// reserve_recycled_in_place` once none is mapped.
    pub reserve_recycled: u64,
    /// Retired pages that became pages of the reserve where they were, still mapped and granted:
    /// no driver call at all (no `cuMemUnmap`, `cuMemMap` or `cuMemSetAccess`). A map of exactly
    /// such a page's range then takes it (`reserve_taken`). The worker recycles in place only
    /// pages the reserve would make (its page size, device and options, owned by the buffer),
    /// granted to the current access set, lying where the reserve fills next, and while it holds
    /// less than its bound. A map that comes before the worker, once the retire has finished,
    /// takes the page there itself, and counts in both: a page of the reserve's page size,
    /// granted to the current access set, owned by the buffer and never exported, whose memory is
    /// what the map asks for (its device and options), wherever it lies and whatever the reserve
    /// holds, since it never enters the reserve.
    pub reserve_recycled_in_place: u64,
}

/// One page of a [`VirtualBuffer`](super::VirtualBuffer), as
/// [`VirtualBuffer::pages`](super::VirtualBuffer::pages) lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct PageInfo {
    /// The page's first byte, counted from the buffer's base.
    pub offset: usize,
    /// The page's size in bytes: the size of its physical allocation.
    pub size: usize,
    /// The device whose memory backs the page.
    pub device: Device,
    /// Whether the buffer's access set is granted on the page. `false` only for a page whose grant
    /// failed and whose unmapping failed too ([`Error::CleanupFailed`](crate::error::Error::CleanupFailed)): no view covers it, and it is
    /// unmapped with the others.
    pub granted: bool,
    /// Whether the page is retired: no view covers it and no page is mapped over it, and it is
    /// unmapped and released once the work queued before the retire has finished.
    pub retired: bool,
}

/// The memory of a page: owned by the buffer, or a share of a [`SharedPage`] mapped elsewhere too.
pub(super) enum Memory {
    Own(PhysicalAllocation),
    Shared(SharedPage),
}

impl Memory {
    pub(super) fn allocation(&self) -> &PhysicalAllocation {
        match self {
            Memory::Own(memory) => memory,
            Memory::Shared(page) => page.allocation(),
        }
    }

    pub(super) fn size(&self) -> usize {
        self.allocation().size()
    }

    pub(super) fn as_raw(&self) -> sys::CUmemGenericAllocationHandle {
        self.allocation().as_raw()
    }

    /// `cuMemRelease` of owned memory; a share is dropped, and the memory released (by its last
    /// share's drop, which ignores the driver's answer) where it was the last.
    pub(super) fn release_code(self) -> DriverResult<()> {
        match self {
            Memory::Own(memory) => memory.release_code(),
            Memory::Shared(page) => page
                .drop_share()
                .map_or(Ok(()), PhysicalAllocation::release_code),
        }
    }
}

/// What a mapped page holds: its memory, the device the memory was created on (every page of a
/// buffer is device memory), and whether a dma-buf of it was ever exported.
pub(super) struct Backing {
    pub(super) memory: Memory,
    pub(super) device: Device,
    /// A dma-buf of the page was exported ([`VirtualBuffer::export_dma_buf`](super::VirtualBuffer::export_dma_buf)):
    /// whoever imported it (a network adapter's registration) may keep the memory after this
    /// buffer lets it go, so the memory is released at the end, never made a page again.
    pub(super) exported: bool,
}

impl Backing {
    /// Whether this memory can be a page of the reserve kept where it is mapped (recycled in
    /// place): `size` bytes of `device`'s memory made with `allocation` options, owned by the
    /// buffer (a share of a [`SharedPage`] is memory other mappings use), and exportable as no
    /// handle kind and never exported as a dma-buf, so that nobody who imported it (another
    /// process, a network adapter) reads what the next page writes.
    pub(super) fn recyclable_as(
        &self,
        device: Device,
        size: usize,
        allocation: AllocationOptions,
    ) -> bool {
        !self.exported
            && self.device == device
            && matches!(
                &self.memory,
                Memory::Own(m) if m.size() == size
                    && m.options() == allocation
                    && m.options().handle_kinds() == HandleKinds::NONE
            )
    }
}

/// One evicted page: where it was, its size and its device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Piece {
    pub(super) offset: usize,
    pub(super) size: usize,
    pub(super) device: Device,
}

impl Piece {
    pub(super) fn end(&self) -> usize {
        self.offset.saturating_add(self.size)
    }
}
