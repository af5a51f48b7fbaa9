//! [`VirtualBuffer`]: one reservation, pages mapped and unmapped in it at any offset, a kept access
//! set granted to every page once.
//!
//! One idea, a page table over one reservation, and its faces. The files go by type, then by
//! feature:
//! - `table.rs` (with `table/driver.rs`, and `table/calls.rs` for one page's driver calls): the
//!   page table, the only code that changes a page's state (live, ungranted, retired with its
//!   ticket, evicted); `page.rs`: what a page holds;
//!   `retiring.rs`: the retires waiting for their events.
//! - The host-waiting [`VirtualBuffer`]: this file (reserve, grow, map, unmap, access changes,
//!   teardown), `views.rs`, `retire.rs` (stream-ordered release), `evict.rs` (evict and restore),
//!   `exportable.rs` (page options, export and import), `dmabuf.rs` (dma-buf export of a range).
//! - The scoped one, [`ScopedBuffer`] (the same table, lent to a scope, no host wait): `scoped.rs`,
//!   `scoped/evict.rs`, `scoped/read_back.rs` and `scoped/graph.rs` (a parked graph's ranges
//!   claimed for the scope and admitted at every replay).

use core::fmt;
use core::marker::PhantomData;
use core::ops::RangeBounds;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::device::{Context, Device};
use crate::error::Error;
use crate::sys;
use crate::view::range_bounds;
use crate::vmm::access::{AccessMode, ReadWrite, retain_distinct};
use crate::vmm::physical::{AllocationOptions, PhysicalAllocation, check_multiple};
use crate::vmm::reservation::VirtualReservation;

use super::pages::check_new_range;
use super::shared::SharedPage;
use ahead::{Shared, Worker};
use page::Memory;
use table::Table;

mod ahead;
mod claimed;
mod dmabuf;
mod evict;
mod exportable;
mod page;
mod reserve;
mod retire;
mod retiring;
mod scoped;
mod table;
mod views;

pub use ahead::ReserveOptions;
pub use claimed::ClaimedRange;
pub use evict::{Evicted, NotRestored};
pub use exportable::ExportableBuffer;
pub use page::{BufferStats, PageInfo, PageOptions};
pub use scoped::{EvictedInFlight, ScopedBuffer};

/// What a range out of a buffer's bounds is out of, in errors.
const BUDGET: &str = "virtual buffer's address budget";

/// A growable, address-stable buffer of device memory: one reserved address range (the *budget*),
/// and pages of physical memory mapped into it and unmapped again at any offset, each granted to the
/// buffer's access set once, when it is mapped.
///
/// - **Address-stable.** The base address never changes: pages come and go inside the reservation,
///   nothing is ever copied or moved. [`grow`](VirtualBuffer::grow) maps a page after the last one,
///   [`map_page`](VirtualBuffer::map_page) anywhere, [`unmap`](VirtualBuffer::unmap) releases the pages
///   of any range, in the middle too.
/// - **Pages** are whole physical allocations (`cuMemCreate`), each of any multiple of its device's
///   granularity, of any device: one buffer can be striped over every GPU's memory.
/// - **Kept grants.** The buffer keeps its access set (retained primary contexts, and the mode `M`:
///   [`ReadWrite`] or [`ReadOnly`](crate::ReadOnly)) and grants it on each page when the page is
///   mapped: one `cuMemSetAccess` per page, never one per view ([`BufferStats`] counts them).
///   [`set_access`](VirtualBuffer::set_access) changes the set for every page.
/// - **Views** ([`slice_bytes`](VirtualBuffer::slice_bytes), [`slice_bytes_mut`](VirtualBuffer::slice_bytes_mut)) borrow the
///   buffer and may span any run of adjacent mapped pages, of one device or several. Every structural
///   change takes `&mut self`, so no view survives an unmap, a shrink or a change of the access set,
///   and only a `ReadWrite` buffer has writable views.
/// - **Owned.** No lifetime: it lives in a struct field or a `Vec`, moves between threads (`Send`,
///   `Sync`) and is returned from functions. Dropping it unmaps every page, releases the memory and
///   frees the reservation, in that order; [`free`](VirtualBuffer::free) reports the driver's answer.
///
/// Arguments are checked before any driver call, and a failed operation leaves the buffer as it was
/// (where even undoing failed, [`Error::CleanupFailed`] says so; each method says what it left).
///
/// # Examples
/// ```no_run
/// use cuda_vmm::{Device, Granularity, ReadWrite, VirtualBuffer, allocation_granularity};
///
/// # fn main() -> Result<(), cuda_vmm::Error> {
/// let device = Device::get(0)?;
/// let page = allocation_granularity(device, Granularity::Minimum)?;
/// let mut buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?; // 1 GiB of address space
/// let base = buffer.base();
/// buffer.grow(device, page)?; // cuMemCreate, cuMemMap, cuMemSetAccess
/// buffer.slice_bytes_mut::<u8>(..page)?.copy_from_host(&vec![7; page])?;
/// buffer.grow(device, page)?; // the first page keeps its address and its bytes
/// assert_eq!(buffer.base(), base);
/// assert_eq!(buffer.slice_bytes::<u8>(..page)?.to_vec()?, vec![7; page]);
/// # Ok(())
/// # }
/// ```
///
/// A view borrows the buffer, so it cannot be kept across a change of its pages:
/// ```compile_fail,E0502
/// # fn main() -> Result<(), cuda_vmm::Error> {
/// # let device = cuda_vmm::Device::get(0)?;
/// # let page = 2 << 20;
/// let mut buffer = cuda_vmm::VirtualBuffer::new(1 << 30, &[device], cuda_vmm::ReadWrite)?;
/// buffer.grow(device, page)?;
/// let view = buffer.slice_bytes::<u8>(..page)?;
/// buffer.shrink()?; // unmaps the page the view reads
/// view.to_vec()?;
/// # Ok(())
/// # }
/// ```
pub struct VirtualBuffer<M: AccessMode = ReadWrite> {
    base: sys::CUdeviceptr,
    budget: usize,
    /// Unique among the buffers of the process: an [`Evicted`] handle is restored only into the
    /// buffer whose id it carries.
    id: u64,
    /// What every page this buffer creates is made with (handle kinds, RDMA flag), checked against
    /// the access set's devices when the buffer was made.
    options: PageOptions,
    /// The reserved range; `None` only within [`free`](VirtualBuffer::free), once it has been freed.
    /// Declared before `access`, so that it is freed before the contexts are released.
    reservation: Option<VirtualReservation>,
    /// The page table (the pages, their states, counts and retires) and the condition its changes
    /// signal. Locked for each change through `&self` (a grow, a retire, a scoped buffer's view)
    /// and for each view, for the length of the check. Shared with the reserve's worker, if any.
    shared: Arc<Shared>,
    /// The reserve's worker thread and what it was started with, while a reserve runs: joined by
    /// [`trim`](VirtualBuffer::trim), an access change (which starts it again) and the teardown.
    worker: Option<Worker>,
    /// Lends of a [`ScopedBuffer`](super::ScopedBuffer)'s views in progress: admitted (under the
    /// lock), their work not queued yet, counted in the slot of the table's lend generation at
    /// their admission ([`Table::admit`]). A retire turns the generation, lets go of the lock, and
    /// waits for the slot of the old one to empty before it records its events, so that they come
    /// after that work; lends admitted meanwhile count in the other slot (and cannot reach the
    /// retired pages).
    lending: [AtomicUsize; 2],
    /// Held for the whole of a retire, so that two never wait on the same slot of `lending`.
    one_retire: Mutex<()>,
    /// Never empty; one context per device. Granted on every live page.
    access: Vec<Context>,
    /// The mode of the kept grants, at the type level only. `M` is a zero-sized, `Copy`, `Send`,
    /// `Sync`, `'static` marker ([`AccessMode`]), so this changes neither variance nor auto traits.
    _mode: PhantomData<M>,
}

impl<M: AccessMode> fmt::Debug for VirtualBuffer<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VirtualBuffer")
            .field("base", &format_args!("{:#x}", self.base))
            .field("budget", &self.budget)
            .field("mapped_bytes", &self.mapped_bytes())
            .field("pages", &self.lock().page_count())
            .field("mode", &M::NAME)
            .field("devices", &self.devices())
            .finish_non_exhaustive()
    }
}

impl<M: AccessMode> VirtualBuffer<M> {
    /// `cuMemAddressReserve` — reserve `budget` bytes of address space for a buffer whose pages will be
    /// granted to `devices` in `mode`. Nothing is mapped yet, and no memory is used.
    ///
    /// `budget` is address space, not memory: it can be far larger than any device's memory (a 64 GiB
    /// budget costs nothing until pages are mapped). It must be a multiple of the granularity of every
    /// device in `devices`. The devices' primary contexts are retained for as long as the buffer
    /// lives; views copy through the first one ([`slice_bytes_on`](VirtualBuffer::slice_bytes_on) picks another).
    /// A device named twice counts once.
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for a zero budget or an empty list of devices; [`Error::NotAligned`] for a
    /// budget that is not a multiple of a device's granularity; the driver's error otherwise.
    #[doc(alias = "cuMemAddressReserve")]
    pub fn new(budget: usize, devices: &[Device], mode: M) -> Result<VirtualBuffer<M>, Error> {
        VirtualBuffer::with_options(budget, devices, mode, PageOptions::new())
    }

    /// `cuMemAddressReserve` of a buffer whose pages are all made with `options`; `new` and
    /// [`with_options`](VirtualBuffer::with_options) share it, once the options are checked.
    fn reserve(
        budget: usize,
        devices: &[Device],
        options: PageOptions,
    ) -> Result<VirtualBuffer<M>, Error> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        if budget == 0 {
            return Err(Error::ZeroSize {
                what: "address budget",
            });
        }
        let access = retain_distinct(devices)?;
        let mut alignment = 0;
        for context in &access {
            let granularity = options
                .for_device(context.device())
                .minimum_granularity_cached()?;
            check_multiple("address budget", budget, granularity)?;
            alignment = alignment.max(granularity);
        }
        let reservation = VirtualReservation::new(budget, alignment)?;
        let base = reservation.base();
        Ok(VirtualBuffer {
            base,
            budget,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            options,
            reservation: Some(reservation),
            shared: Arc::new(Shared::new(Table::new(base))),
            worker: None,
            lending: [AtomicUsize::new(0), AtomicUsize::new(0)],
            one_retire: Mutex::new(()),
            access,
            _mode: PhantomData,
        })
    }

    /// The first address of the reservation. It never changes while the buffer lives.
    #[must_use]
    pub fn base(&self) -> u64 {
        self.base
    }

    /// The size of the reservation in bytes: the address budget pages can be mapped in.
    #[must_use]
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// The end of the last page, retired and evicted ones included (0 where none is mapped): where
    /// [`grow`](VirtualBuffer::grow) maps the next one.
    #[must_use]
    pub fn end(&self) -> usize {
        self.lock().end()
    }

    /// The bytes of physical memory mapped: the sum of the pages' sizes, retired pages included until
    /// they are released.
    #[must_use]
    pub fn mapped_bytes(&self) -> usize {
        self.lock().mapped_bytes()
    }

    /// The bytes of retired pages not released yet.
    #[must_use]
    pub fn retired_bytes(&self) -> usize {
        self.lock().retired_bytes()
    }

    /// The pages, in address order (a snapshot: pages may be mapped meanwhile through `&self`).
    #[must_use]
    pub fn pages(&self) -> impl ExactSizeIterator<Item = PageInfo> + use<M> {
        self.lock().infos().into_iter()
    }

    /// The devices of the access set, in the order given.
    #[must_use]
    pub fn devices(&self) -> Vec<Device> {
        self.access.iter().map(Context::device).collect()
    }

    /// The retained contexts of the access set, in the order given.
    #[must_use]
    pub fn contexts(&self) -> &[Context] {
        &self.access
    }

    /// The counts of the driver calls this buffer made on its pages.
    #[must_use]
    pub fn stats(&self) -> BufferStats {
        self.lock().stats()
    }

    /// The table, locked. No code of this crate panics while it holds the lock; a poisoned lock (a
    /// panic of the allocator, say) is taken as it is: every change leaves the table consistent
    /// before any call that could fail.
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.shared.lock()
    }

    /// The table, through `&mut self`, once the reserve's worker holds no range without the lock
    /// (a fill or a release under way, which it finishes): every page is then as a buffer with no
    /// reserve would have it (a retired page whose events completed is still `Retired`, so the
    /// `reclaim` that follows releases it here).
    ///
    /// The exclusive borrow also proves that no [`ClaimedRange`] lives, so the holds a forgotten
    /// one left are let go here, and that no `ScopedBuffer` lives.
    fn table_mut(&mut self) -> MutexGuard<'_, Table> {
        let mut table = self.shared.settled();
        table.forget_holds();
        // And that the scope a scoped handle was lent to has ended: its retires at the scope's end
        // are finished.
        table.scope_ended();
        table
    }

    /// `cuMemCreate`, `cuMemMap`, `cuMemSetAccess` — allocate `size` bytes of `device`'s memory and map
    /// them as one page at byte `offset` of the buffer, granted to the access set.
    ///
    /// `offset` and `size` must be multiples of `device`'s granularity, and the page must lie inside
    /// the budget and overlap no mapped or retired page. The page need not touch the others: holes
    /// are allowed (views cannot span them).
    ///
    /// Takes `&self`: mapping a page into an unmapped range disturbs no view of the other pages, so
    /// it happens while views of them live (also from several threads: the page table is behind a
    /// lock, held for the whole call). Retires whose work has finished are reclaimed first.
    ///
    /// # Errors
    /// Before any driver call: [`Error::ZeroSize`], [`Error::NotAligned`] (offset, size or address
    /// not a multiple of the granularity), [`Error::Overflow`], [`Error::OutOfBounds`] (past the
    /// budget) and [`Error::PageRange`] (over a mapped, retired or evicted page, which the error
    /// names). Then the driver's error, e.g.
    /// [`DriverError::OUT_OF_MEMORY`](crate::error::DriverError::OUT_OF_MEMORY) from `cuMemCreate`.
    /// On any error the buffer is as it was: what was done for the page is undone (the grant, the
    /// mapping, the memory). Where undoing fails too, the error is [`Error::CleanupFailed`]: if
    /// `cuMemUnmap` failed, the page stays in the buffer, mapped but not granted
    /// ([`PageInfo::granted`] is `false`), no view covers it, and [`unmap`](VirtualBuffer::unmap)
    /// or dropping the buffer tries again; if `cuMemRelease` failed, nothing is mapped and the
    /// memory may be lost until the process ends.
    #[doc(alias = "cuMemCreate")]
    #[doc(alias = "cuMemMap")]
    #[doc(alias = "cuMemSetAccess")]
    pub fn map_page(&self, offset: usize, device: Device, size: usize) -> Result<(), Error> {
        self.map_new(Some(offset), device, size).map(drop)
    }

    /// Maps a page of `size` bytes of `device`'s memory right after the last page (at
    /// [`end`](VirtualBuffer::end)), and returns its offset. As [`map_page`](VirtualBuffer::map_page),
    /// also in that it takes `&self`.
    ///
    /// # Errors
    /// As [`map_page`](VirtualBuffer::map_page); [`Error::OutOfBounds`] where the budget is used up.
    ///
    /// # Examples
    /// A read-only view lives across a growth:
    /// ```no_run
    /// use cuda_vmm::{Device, ReadWrite, VirtualBuffer};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// buffer.grow(device, 2 << 20)?;
    /// let first = buffer.slice_bytes::<u8>(..2 << 20)?;
    /// buffer.grow(device, 2 << 20)?; // `first` is still valid: its page did not move
    /// assert_eq!(first.to_vec()?.len(), 2 << 20);
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuMemCreate")]
    #[doc(alias = "cuMemMap")]
    #[doc(alias = "cuMemSetAccess")]
    pub fn grow(&self, device: Device, size: usize) -> Result<usize, Error> {
        self.map_new(None, device, size)
    }

    /// `cuMemUnmap`, `cuMemRelease` — unmap the last page and release its memory; returns what it
    /// was, or `None` where no page is mapped.
    ///
    /// # Errors
    /// As [`unmap`](VirtualBuffer::unmap).
    #[doc(alias = "cuMemUnmap")]
    #[doc(alias = "cuMemRelease")]
    pub fn shrink(&mut self) -> Result<Option<PageInfo>, Error> {
        let mut table = self.table_mut();
        table.reclaim_finished();
        table.shrink()
    }

    /// `cuMemUnmap`, `cuMemRelease` — unmap every page inside the byte range `range` and release its
    /// memory; returns how many pages were unmapped. Holes inside the range are fine; a page that
    /// the range would cut in two is not, nor a retired page whose work has not finished.
    ///
    /// The pages' addresses become free for new pages; the other pages keep their addresses and their
    /// bytes. Evicted ranges inside the range hold no page and stay evicted.
    ///
    /// # Errors
    /// Before any driver call: [`Error::OutOfBounds`] for a range outside the budget,
    /// [`Error::PageRange`] where a page straddles either end of the range, or is retired and its
    /// work has not finished (the error names it). Then the first driver error: every page of the
    /// range is tried; a page whose `cuMemUnmap` the driver refuses stays in the buffer (it is tried
    /// again by the next unmap of its range and by drop) and the others are gone; memory whose
    /// `cuMemRelease` is refused is unmapped and gone from the buffer, and may be lost until the
    /// process ends. No driver failure of a whole-mapping unmap is known.
    #[doc(alias = "cuMemUnmap")]
    #[doc(alias = "cuMemRelease")]
    pub fn unmap(&mut self, range: impl RangeBounds<usize>) -> Result<usize, Error> {
        let (start, end) = range_bounds(range, self.budget, BUDGET)?;
        let mut table = self.table_mut();
        table.reclaim_finished();
        table.unmap(start, end)
    }

    /// `cuMemSetAccess` — make `devices` the access set, in the buffer's mode, on every mapped page
    /// that is not retired: first each page is granted the new set, then the devices that left it
    /// are revoked from each page. The new devices' primary contexts are retained, and the old ones
    /// released. Retired pages keep the old set until they are released: the work they wait for may
    /// still read them, and no view reaches them.
    ///
    /// Takes `&mut self`, so no view (which carries the devices that reach its memory) lives across the
    /// change. A reserve ([`reserve_ahead`](VirtualBuffer::reserve_ahead)) is given back first and
    /// started again after the change, its pages then granted the new set; a page retired before
    /// the change keeps the old set's grants, so it is never recycled in place into the reserve
    /// (it is unmapped, as without a reserve).
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for an empty list, before any driver call. A refused grant: the access set
    /// stays as it was, and the devices that were to join are revoked again from the pages granted so
    /// far; where that revoke fails too, [`Error::CleanupFailed`], and those devices may keep access
    /// to some pages (which is harmless to the buffer: its views only ever claim the recorded set)
    /// until the pages are unmapped. A refused revoke: the new set is in place on every page, and a
    /// device that left it may keep access to some pages until they are unmapped; the first error is
    /// returned after every page was tried. Where a reserve cannot be started again, the error of
    /// [`reserve_ahead`](VirtualBuffer::reserve_ahead) (the access change is made; no reserve runs).
    #[doc(alias = "cuMemSetAccess")]
    pub fn set_access(&mut self, devices: &[Device]) -> Result<(), Error> {
        let new = retain_distinct(devices)?;
        // The reserve's pages are granted the old set: given back first, and made again for the
        // new set once it is in place (or for the old one, where the change is refused).
        let reserve = self.stop_reserve();
        let regranted = {
            let mut table = self.shared.settled();
            table.regrant(&self.access, &new, M::FLAGS)
        };
        // Every live page grants the new set now (also where a revoke failed): record it. The old
        // contexts are released here, after the last driver call that named them; retired pages,
        // which keep the old grants, need no context to be unmapped.
        if regranted.is_ok() {
            self.access = new;
        }
        if let Some(options) = reserve {
            let restarted = self.reserve_ahead(options);
            // A refused change returns its own error; the reserve's, if any, is lost with it.
            if regranted.is_ok() {
                restarted?;
            }
        }
        regranted?
    }

    /// Checks a new page and maps it: at `offset`, or after the last page. Its offset. Where a
    /// reserve runs, a page of it at exactly that range, of `device`, is taken (no driver call),
    /// or a retired page there whose work has finished and which the worker could recycle in
    /// place but has not yet (`cuEventQuery` of its retire, no VMM call);
    /// else the reserve's last fault is returned, if it keeps one; else pages of the reserve in
    /// the range are given back and the page is made here. A range the worker is filling is waited
    /// for (it is then taken, or the range is a hole again).
    fn map_new(&self, offset: Option<usize>, device: Device, size: usize) -> Result<usize, Error> {
        let options = self.options.for_device(device);
        let granularity = options.minimum_granularity_cached()?;
        let mut table = self.lock();
        table.reclaim_here();
        let (offset, end) = loop {
            let offset = offset.unwrap_or_else(|| table.end());
            let end = check_new_range((self.base, self.budget, BUDGET), offset, size, granularity)?;
            if !table.filling_in(offset, end) {
                break (offset, end);
            }
            table = self.shared.wait(table);
        };
        if table.reserving() {
            if table.take_ready(offset, end, |b| b.device == device)
                || table
                    .take_finished_retired(offset, end, |b| b.recyclable_as(device, size, options))
            {
                self.shared.wake_worker_to_fill(&mut table);
                return Ok(offset);
            }
            if let Some(fault) = table.take_fault() {
                self.shared.wake_worker(&table);
                return Err(fault);
            }
        }
        if ahead::give_back(&mut table, self.base, offset, end)? > 0 {
            self.shared.wake_worker(&table);
        }
        table.check_vacant(offset, end)?;
        let memory = PhysicalAllocation::with_options(size, options)?;
        table.map(offset, Memory::Own(memory), device, &self.access, M::FLAGS)?;
        Ok(offset)
    }

    /// `cuMemMap`, `cuMemSetAccess` — map one more mapping of `page`'s memory (a whole
    /// [`SharedPage`] of device memory, mapped elsewhere too, or not yet) at byte `offset` of the
    /// buffer, granted to the access set in the buffer's mode. The buffer holds a share of the page:
    /// its memory is released with its last share and its last mapping, in this buffer or any other.
    ///
    /// Each mapping of a shared page has its own grant: a prefix page shared by many sequences is
    /// mapped into a [`ReadOnly`](crate::ReadOnly) buffer (or a read-only
    /// [`OwnedMapping`](super::OwnedMapping)) where it is shared, and written through one read-write
    /// mapping. Takes `&self`, as [`map_page`](VirtualBuffer::map_page).
    ///
    /// # Errors
    /// Before any driver call: as [`map_page`](VirtualBuffer::map_page) for the offset and the page's
    /// size, and [`Error::NotForLocation`] for a page of host memory. The driver's error otherwise;
    /// the buffer is then as it was, and the share is dropped.
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::{Device, ReadOnly, ReadWrite, VirtualBuffer, owned::SharedPage};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let page = 2 << 20;
    /// let prefix = SharedPage::new(device, page)?;
    /// let writer = VirtualBuffer::new(page, &[device], ReadWrite)?;
    /// writer.map_shared(0, &prefix)?;
    /// let sequence = VirtualBuffer::new(4 * page, &[device], ReadOnly)?;
    /// sequence.map_shared(0, &prefix)?; // read-only here
    /// sequence.map_shared(page, &prefix)?; // and at a second offset
    /// assert_eq!(prefix.share_count(), 4);
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuMemMap")]
    #[doc(alias = "cuMemSetAccess")]
    pub fn map_shared(&self, offset: usize, page: &SharedPage) -> Result<(), Error> {
        let Some(device) = page.device() else {
            return Err(Error::NotForLocation {
                what: "a shared page",
                location: "host memory",
                why: "the pages of a virtual buffer are device memory",
            });
        };
        let mut table = self.lock();
        table.reclaim_here();
        let granularity = granularity(device)?.max(page.granularity());
        let end = check_new_range(
            (self.base, self.budget, BUDGET),
            offset,
            page.size(),
            granularity,
        )?;
        while table.filling_in(offset, end) {
            table = self.shared.wait(table);
        }
        ahead::give_back(&mut table, self.base, offset, end)?;
        // `map` checks the range vacant first, before any driver call.
        table.map(
            offset,
            Memory::Shared(page.clone()),
            device,
            &self.access,
            M::FLAGS,
        )
    }

    /// Stops the reserve's worker, waits for every retire, unmaps every page (the reserve's too),
    /// then releases every page's memory: every page is tried. The first error.
    fn teardown(&mut self) -> Result<(), Error> {
        self.stop_reserve();
        self.table_mut().teardown()
    }

    /// `cuMemUnmap`, `cuMemRelease`, `cuMemAddressFree` — wait for the work of every retire, unmap
    /// every page, release the memory, free the reservation, in that order, and report the first
    /// error, which `drop` ignores.
    ///
    /// # Errors
    /// The first driver error; every step is tried after any error. A page the driver refused to
    /// unmap keeps its range mapped, and then `cuMemAddressFree` fails too: the range leaks.
    #[doc(alias = "cuMemUnmap")]
    #[doc(alias = "cuMemRelease")]
    #[doc(alias = "cuMemAddressFree")]
    pub fn free(mut self) -> Result<(), Error> {
        let torn_down = self.teardown();
        let freed = self
            .reservation
            .take()
            .map_or(Ok(()), VirtualReservation::free_code);
        // `drop` finds no page and no reservation left, and releases the contexts.
        torn_down.and(freed.map_err(Error::from))
    }
}

impl<M: AccessMode> Drop for VirtualBuffer<M> {
    fn drop(&mut self) {
        // Wait for every retire's work, unmap every page, then release the memory; the reservation
        // is freed after this body (the field's own drop), and the contexts are released after it.
        // Errors are ignored: `drop` cannot return them, and a range the driver refuses to unmap
        // cannot be unmapped later either (it, and the reservation around it, then leak). Call
        // `free` to see them.
        let _ = self.teardown();
    }
}

/// `cuMemGetAllocationGranularity` of `device`'s pinned memory (remembered per device, read with
/// no lock).
#[inline]
fn granularity(device: Device) -> Result<usize, Error> {
    AllocationOptions::device(device).minimum_granularity_cached()
}
