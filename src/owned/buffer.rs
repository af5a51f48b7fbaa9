//! [`VirtualBuffer`]: one reservation, pages mapped and unmapped in it at any offset, a kept access
//! set granted to every page once.

use crate::vmm::access::{retain_distinct, with_contexts};
use core::fmt;
use core::marker::PhantomData;
use core::ops::{Range, RangeBounds};
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::device::{Context, Device};
use crate::error::{DriverError, DriverResult, Error, check, first_error};
use crate::stream::{Event, PinnedBuffer};
use crate::sys;
use crate::view::range_bounds;
use crate::vmm::access::set_access;
use crate::vmm::access::{AccessMode, Contexts, ReadWrite};
use crate::vmm::physical::{AllocationOptions, PhysicalAllocation, check_multiple};
use crate::vmm::reservation::VirtualReservation;

use super::pages::{Claims, RETIRED, Span, check_new_range, insertion_point, pages_inside};
use super::shared::SharedPage;

mod dmabuf;
mod evict;
mod evict_ordered;
mod exportable;
mod retire;
mod scoped;
mod views;

pub use evict::{Evicted, NotRestored};
pub use evict_ordered::EvictedInFlight;
pub use exportable::{ExportableBuffer, PageOptions};
pub use scoped::ScopedBuffer;

/// What a range out of a buffer's bounds is out of, in errors.
const BUDGET: &str = "virtual buffer's address budget";

/// Counts of the driver calls a [`VirtualBuffer`] made on its pages, since it was created.
///
/// They make the buffer's cost visible: with an access set that never changes, every page mapped costs
/// exactly one `cuMemMap` and one `cuMemSetAccess`, however often its bytes are viewed
/// (`set_access_calls == pages_mapped`).
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
    /// Pages mapped and granted ([`VirtualBuffer::map_page`] and [`VirtualBuffer::grow`] that
    /// succeeded).
    pub pages_mapped: u64,
    /// Pages unmapped and handed to `cuMemRelease`.
    pub pages_released: u64,
    /// Pages retired ([`VirtualBuffer::retire_after`], [`ScopedBuffer::retire`](super::ScopedBuffer::retire)):
    /// released once the work queued before the retire has finished.
    pub pages_retired: u64,
    /// `cuEventRecord` calls of retires: one per stream the retire orders the release after.
    pub events_recorded: u64,
    /// Pages evicted ([`VirtualBuffer::evict`]): their bytes copied to host memory, then unmapped and
    /// released (each also counts in `pages_released`).
    pub pages_evicted: u64,
    /// Pages restored ([`VirtualBuffer::restore`]): created, mapped and granted again (each also
    /// counts in `pages_mapped`), their bytes copied back.
    pub pages_restored: u64,
}

/// One page of a [`VirtualBuffer`], as [`VirtualBuffer::pages`] lists it.
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
    /// failed and whose unmapping failed too ([`Error::CleanupFailed`]): no view covers it, and it is
    /// unmapped with the others.
    pub granted: bool,
    /// Whether the page is retired: no view covers it and no page is mapped over it, and it is
    /// unmapped and released once the work queued before the retire has finished.
    pub retired: bool,
}

/// The memory of a page: owned by the buffer, or a share of a [`SharedPage`] mapped elsewhere too.
enum Memory {
    Own(PhysicalAllocation),
    Shared(SharedPage),
}

impl Memory {
    fn allocation(&self) -> &PhysicalAllocation {
        match self {
            Memory::Own(memory) => memory,
            Memory::Shared(page) => page.allocation(),
        }
    }

    fn size(&self) -> usize {
        self.allocation().size()
    }

    fn as_raw(&self) -> sys::CUmemGenericAllocationHandle {
        self.allocation().as_raw()
    }

    /// `cuMemRelease` of owned memory; a share is dropped, and the memory released (by its last
    /// share's drop, which ignores the driver's answer) where it was the last.
    fn release_code(self) -> DriverResult<()> {
        match self {
            Memory::Own(memory) => memory.release_code(),
            Memory::Shared(page) => match page.into_allocation() {
                Ok(memory) => memory.release_code(),
                Err(_shared_elsewhere) => Ok(()),
            },
        }
    }
}

/// A page: a whole physical allocation mapped at `offset`.
struct Page {
    offset: usize,
    memory: Memory,
    /// The device the memory was created on (every page of a buffer is device memory).
    device: Device,
    granted: bool,
    /// Retired: waiting for the events of its retire, then unmapped and released.
    retired: bool,
    /// [`Table::epoch`] when the page was mapped.
    epoch: u64,
}

impl Span for Page {
    fn start(&self) -> usize {
        self.offset
    }

    /// `offset + size` was checked against the budget when the page was mapped, so it does not
    /// overflow.
    fn end(&self) -> usize {
        self.offset.saturating_add(self.memory.size())
    }

    fn granted(&self) -> bool {
        self.granted
    }

    fn retired(&self) -> bool {
        self.retired
    }

    fn epoch(&self) -> u64 {
        self.epoch
    }
}

impl Page {
    fn info(&self) -> PageInfo {
        PageInfo {
            offset: self.offset,
            size: self.memory.size(),
            device: self.device,
            granted: self.granted,
            retired: self.retired,
        }
    }
}

/// What can change through `&self`: the pages, behind the buffer's lock.
#[derive(Default)]
struct Table {
    /// Sorted by offset, disjoint, inside `[0, budget)`.
    pages: Vec<Page>,
    stats: BufferStats,
    /// The count of pages mapped so far: each page records it, and so does each view of a
    /// [`ScopedBuffer`](super::ScopedBuffer), which then never covers a page mapped after it.
    epoch: u64,
    /// Retires whose events have not all been seen complete, oldest first.
    retiring: Vec<Retiring>,
    /// Events of finished retires, for the next ones.
    spare_events: Vec<Event>,
    /// The ranges a [`ScopedBuffer`](super::ScopedBuffer) lent, cleared when the next one is made.
    claims: Claims,
    /// Turned by each retire; its parity is the slot of `VirtualBuffer::lending` that admissions
    /// count in.
    generation: usize,
    /// The byte ranges `[start, end)` of evicted pages, sorted and disjoint, none overlapping a page
    /// that is not retired (an eviction inside a scope keeps its pages, retired, until their
    /// release): no view, lend or new page reaches them until a restore maps them again.
    evicted: Vec<(usize, usize)>,
}

impl Table {
    /// The end of the last page or evicted range (0 where there is none).
    fn end(&self) -> usize {
        let pages = self.pages.last().map_or(0, Page::end);
        let evicted = self.evicted.last().map_or(0, |e| e.1);
        pages.max(evicted)
    }
}

/// One retire: its pages (by offset) and an event recorded after the work it waits for, on each
/// stream that work may run on. Its pages are unmapped and released once every event has completed.
struct Retiring {
    offsets: Vec<usize>,
    events: Vec<Event>,
    /// Host memory that the work reads (the source of a stream-ordered restore's copies), freed
    /// with the retire: once every event has completed, or after the drop's wait for them.
    host: Option<PinnedBuffer<u8>>,
}

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
    /// The pages, their counts and retires. Locked for each change through `&self` (a grow, a
    /// retire, a scoped buffer's view) and for each view, for the length of the check.
    table: Mutex<Table>,
    /// Lends of a [`ScopedBuffer`](super::ScopedBuffer)'s views in progress: admitted (under the
    /// lock), their work not queued yet, counted in the slot of [`Table::generation`]'s parity at
    /// their admission. A retire turns the generation, lets go of the lock, and waits for the slot
    /// of the old one to empty before it records its events, so that they come after that work;
    /// lends admitted meanwhile count in the other slot (and cannot reach the retired pages).
    lending: [AtomicUsize; 2],
    /// Held for the whole of a retire, so that two never wait on the same slot of `lending`.
    retires: Mutex<()>,
    /// Never empty; one context per device. Granted on every page whose `granted` is true.
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
            .field("pages", &self.lock().pages.len())
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
        Ok(VirtualBuffer {
            base: reservation.base(),
            budget,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            options,
            reservation: Some(reservation),
            table: Mutex::new(Table::default()),
            lending: [AtomicUsize::new(0), AtomicUsize::new(0)],
            retires: Mutex::new(()),
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
        self.lock().pages.iter().map(|p| p.memory.size()).sum()
    }

    /// The bytes of retired pages not released yet.
    #[must_use]
    pub fn retired_bytes(&self) -> usize {
        let table = self.lock();
        table
            .pages
            .iter()
            .filter(|p| p.retired)
            .map(|p| p.memory.size())
            .sum()
    }

    /// The pages, in address order (a snapshot: pages may be mapped meanwhile through `&self`).
    #[must_use]
    pub fn pages(&self) -> impl ExactSizeIterator<Item = PageInfo> + use<M> {
        let pages: Vec<PageInfo> = self.lock().pages.iter().map(Page::info).collect();
        pages.into_iter()
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
        self.lock().stats
    }

    /// The table, locked. No code of this crate panics while it holds the lock; a poisoned lock (a
    /// panic of the allocator, say) is taken as it is: every change leaves the table consistent
    /// before any call that could fail.
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The table, through `&mut self`: no lock needed.
    fn table_mut(&mut self) -> &mut Table {
        self.table.get_mut().unwrap_or_else(PoisonError::into_inner)
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
    /// budget) and [`Error::PageRange`] (over a mapped, retired or evicted page, which the error names). Then
    /// the driver's error, e.g. [`DriverError::OUT_OF_MEMORY`] from `cuMemCreate`. On any error the
    /// buffer is as it was: what was done for the page is undone (the grant, the mapping, the
    /// memory). Where undoing fails too, the error is [`Error::CleanupFailed`]: if `cuMemUnmap`
    /// failed, the page stays in the buffer, mapped but not granted ([`PageInfo::granted`] is
    /// `false`), no view covers it, and [`unmap`](VirtualBuffer::unmap) or dropping the buffer tries
    /// again; if `cuMemRelease` failed, nothing is mapped and the memory may be lost until the
    /// process ends.
    #[doc(alias = "cuMemCreate")]
    #[doc(alias = "cuMemMap")]
    #[doc(alias = "cuMemSetAccess")]
    pub fn map_page(&self, offset: usize, device: Device, size: usize) -> Result<(), Error> {
        let mut table = self.lock();
        self.reclaim_finished(&mut table);
        self.map_new(&mut table, Some(offset), device, size)
            .map(drop)
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
        let mut table = self.lock();
        self.reclaim_finished(&mut table);
        self.map_new(&mut table, None, device, size)
    }

    /// `cuMemUnmap`, `cuMemRelease` — unmap the last page and release its memory; returns what it
    /// was, or `None` where no page is mapped.
    ///
    /// # Errors
    /// As [`unmap`](VirtualBuffer::unmap).
    #[doc(alias = "cuMemUnmap")]
    #[doc(alias = "cuMemRelease")]
    pub fn shrink(&mut self) -> Result<Option<PageInfo>, Error> {
        self.reclaim_all_finished();
        let base = self.base;
        let table = self.table_mut();
        let Some(info) = table.pages.last().map(Page::info) else {
            return Ok(None);
        };
        let last = table.pages.len().saturating_sub(1);
        unmap_span(base, table, last..table.pages.len())?;
        Ok(Some(info))
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
        self.reclaim_all_finished();
        let base = self.base;
        let table = self.table_mut();
        let span = pages_inside(&table.pages, start, end)?;
        unmap_span(base, table, span)
    }

    /// `cuMemSetAccess` — make `devices` the access set, in the buffer's mode, on every mapped page
    /// that is not retired: first each page is granted the new set, then the devices that left it
    /// are revoked from each page. The new devices' primary contexts are retained, and the old ones
    /// released. Retired pages keep the old set until they are released: the work they wait for may
    /// still read them, and no view reaches them.
    ///
    /// Takes `&mut self`, so no view (which carries the devices that reach its memory) lives across the
    /// change.
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for an empty list, before any driver call. A refused grant: the access set
    /// stays as it was, and the devices that were to join are revoked again from the pages granted so
    /// far; where that revoke fails too, [`Error::CleanupFailed`], and those devices may keep access
    /// to some pages (which is harmless to the buffer: its views only ever claim the recorded set)
    /// until the pages are unmapped. A refused revoke: the new set is in place on every page, and a
    /// device that left it may keep access to some pages until they are unmapped; the first error is
    /// returned after every page was tried.
    #[doc(alias = "cuMemSetAccess")]
    pub fn set_access(&mut self, devices: &[Device]) -> Result<(), Error> {
        let new = retain_distinct(devices)?;
        let base = self.base;
        let access = &self.access;
        let table = self.table.get_mut().unwrap_or_else(PoisonError::into_inner);
        let joining: Vec<&Context> = new
            .iter()
            .filter(|c| !access.iter().any(|o| o.device() == c.device()))
            .collect();
        let leaving: Vec<&Context> = access
            .iter()
            .filter(|o| !new.iter().any(|c| c.device() == o.device()))
            .collect();
        let stats = &mut table.stats;
        let pages = &table.pages;
        let granted = || pages.iter().filter(|p| p.granted && !p.retired);
        let mut done = 0usize;
        for page in granted() {
            bump(&mut stats.set_access_calls);
            let address = base.wrapping_add(page.offset as u64);
            let size = page.memory.size();
            if let Err(error) = with_contexts(&new, |c| set_access(address, size, c, M::FLAGS)) {
                // Also the refused page: the driver may have applied part of the call.
                let cleanup = if joining.is_empty() {
                    Ok(())
                } else {
                    first_error(granted().take(done.saturating_add(1)).map(|p| {
                        bump(&mut stats.set_access_calls);
                        revoke(base, p, &joining)
                    }))
                };
                return Err(with_cleanup(error, cleanup, "access change"));
            }
            done = done.saturating_add(1);
        }
        let revoked = if leaving.is_empty() {
            Ok(())
        } else {
            first_error(granted().map(|p| {
                bump(&mut stats.set_access_calls);
                revoke(base, p, &leaving)
            }))
        };
        // Every granted page grants the new set now (also where a revoke failed): record it. The old
        // contexts are released here, after the last driver call that named them; retired pages,
        // which keep the old grants, need no context to be unmapped.
        self.access = new;
        Ok(revoked?)
    }

    /// Checks a new page and maps it: at `offset`, or after the last page. Its offset.
    fn map_new(
        &self,
        table: &mut Table,
        offset: Option<usize>,
        device: Device,
        size: usize,
    ) -> Result<usize, Error> {
        let offset = offset.unwrap_or_else(|| table.end());
        let options = self.options.for_device(device);
        let granularity = options.minimum_granularity_cached()?;
        let end = check_new_range((self.base, self.budget, BUDGET), offset, size, granularity)?;
        evict::check_not_evicted(&table.evicted, offset, end)?;
        let index = insertion_point(&table.pages, offset, end)?;
        let memory = PhysicalAllocation::with_options(size, options)?;
        self.map_at(table, index, offset, Memory::Own(memory), device)?;
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
        self.reclaim_finished(&mut table);
        let granularity = granularity(device)?.max(page.granularity());
        let end = check_new_range(
            (self.base, self.budget, BUDGET),
            offset,
            page.size(),
            granularity,
        )?;
        evict::check_not_evicted(&table.evicted, offset, end)?;
        let index = insertion_point(&table.pages, offset, end)?;
        self.map_at(
            &mut table,
            index,
            offset,
            Memory::Shared(page.clone()),
            device,
        )
    }

    /// `cuMemMap` and `cuMemSetAccess` of `memory` at `offset` (checked by `map_new`, which found
    /// `index`); undone on failure.
    fn map_at(
        &self,
        table: &mut Table,
        index: usize,
        offset: usize,
        memory: Memory,
        device: Device,
    ) -> Result<(), Error> {
        let address = self.base.wrapping_add(offset as u64);
        let size = memory.size();
        bump(&mut table.stats.map_calls);
        // SAFETY: `[address, address + size)` lies inside this buffer's reservation (checked against
        // the budget), which only this buffer maps into, and overlaps none of its pages, retired
        // ones included (checked, under the lock that every change of the pages holds); both ends
        // are multiples of the memory's granularity (checked). `memory` is a live allocation handle
        // of `size` bytes, owned here or shared (a share held, so it is not released while mapped);
        // offset 0 and flags 0 as the driver requires.
        if let Err(error) = check(unsafe { sys::cuMemMap(address, size, 0, memory.as_raw(), 0) }) {
            return Err(with_cleanup(error, memory.release_code(), "page mapping"));
        }
        table.epoch = table.epoch.saturating_add(1);
        let epoch = table.epoch;
        bump(&mut table.stats.set_access_calls);
        if let Err(error) = with_contexts(&self.access, |c| set_access(address, size, c, M::FLAGS))
        {
            bump(&mut table.stats.unmap_calls);
            // SAFETY: `[address, address + size)` was mapped just above, by this call, and is unmapped
            // once here; nothing has seen its address (the lock is held).
            if let Err(cleanup) = check(unsafe { sys::cuMemUnmap(address, size) }) {
                // Still mapped, perhaps partly granted: kept, so that the next unmap of its range or
                // drop unmaps it, and marked so that no view covers it.
                table.pages.insert(
                    index,
                    Page {
                        offset,
                        memory,
                        device,
                        granted: false,
                        retired: false,
                        epoch,
                    },
                );
                return Err(Error::CleanupFailed {
                    error,
                    cleanup,
                    what: "page mapping",
                });
            }
            return Err(with_cleanup(error, memory.release_code(), "page mapping"));
        }
        table.pages.insert(
            index,
            Page {
                offset,
                memory,
                device,
                granted: true,
                retired: false,
                epoch,
            },
        );
        bump(&mut table.stats.pages_mapped);
        Ok(())
    }

    /// Unmaps every page, then releases every page's memory: every page is tried, after every retire
    /// has been waited for. The first error.
    fn teardown(&mut self) -> Result<(), Error> {
        let waited = self.wait_retires();
        let base = self.base;
        let table = self.table_mut();
        let pages = core::mem::take(&mut table.pages);
        let stats = &mut table.stats;
        let unmapped = first_error(pages.iter().map(|page| {
            bump(&mut stats.unmap_calls);
            // SAFETY: each page's whole mapping, made by `map_at`, unmapped once: the pages have left
            // the buffer. No view lives (`&mut self`, or drop), and every retire's work has finished
            // (waited for just above: the wait returns only then, or aborts).
            check(unsafe {
                sys::cuMemUnmap(base.wrapping_add(page.offset as u64), page.memory.size())
            })
        }));
        // Released after every unmap was tried: where an unmap failed, the driver keeps the memory
        // until that range is unmapped, which then never happens (a leak, not a dangling mapping).
        let released = first_error(pages.into_iter().map(|page| {
            bump(&mut stats.pages_released);
            page.memory.release_code()
        }));
        waited
            .and(unmapped.map_err(Error::from))
            .and(released.map_err(Error::from))
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

/// Unmaps and releases `table.pages[span]`, every one tried; the pages the driver refuses to unmap
/// stay. A retired page in the span is refused before any driver call.
fn unmap_span(base: u64, table: &mut Table, span: Range<usize>) -> Result<usize, Error> {
    let Some(pages) = table.pages.get(span.clone()) else {
        return Ok(0);
    };
    if let Some(page) = pages.iter().find(|p| p.retired) {
        return Err(Error::PageRange {
            start: page.offset,
            end: page.end(),
            problem: RETIRED,
        });
    }
    let mut kept = Vec::new();
    let mut first: DriverResult<()> = Ok(());
    let mut unmapped = 0usize;
    for page in table.pages.drain(span.clone()) {
        bump(&mut table.stats.unmap_calls);
        let address = base.wrapping_add(page.offset as u64);
        // SAFETY: `[address, address + size)` is the page's whole mapping, made by `map_at` and
        // unmapped once: the page leaves the buffer below unless the driver refuses. It is not
        // retired (checked), so no work of a retire can use it; no view lives (`&mut self`), and
        // every copy through one finished before it returned.
        let result = check(unsafe { sys::cuMemUnmap(address, page.memory.size()) });
        let result = match result {
            Ok(()) => {
                unmapped = unmapped.saturating_add(1);
                bump(&mut table.stats.pages_released);
                page.memory.release_code()
            }
            Err(error) => {
                kept.push(page);
                Err(error)
            }
        };
        if first.is_ok() {
            first = result;
        }
    }
    // Back where they were: `kept` is sorted and lies inside the drained span.
    table.pages.splice(span.start..span.start, kept);
    first?;
    Ok(unmapped)
}

/// `cuMemGetAllocationGranularity` of `device`'s pinned memory (remembered per device).
fn granularity(device: Device) -> Result<usize, Error> {
    AllocationOptions::device(device).minimum_granularity_cached()
}

/// `cuMemSetAccess` with no access, for `contexts`' devices, on the whole of `page`.
fn revoke(base: u64, page: &Page, contexts: &[&Context]) -> DriverResult<()> {
    // An empty list revokes nothing (callers pass the non-empty joining or leaving devices).
    Contexts::many(contexts).map_or(Ok(()), |contexts| {
        set_access(
            base.wrapping_add(page.offset as u64),
            page.memory.size(),
            contexts,
            sys::CU_MEM_ACCESS_FLAGS_PROT_NONE,
        )
    })
}

/// `error`, or [`Error::CleanupFailed`] where undoing `what` failed too.
pub(super) fn with_cleanup(
    error: DriverError,
    cleanup: DriverResult<()>,
    what: &'static str,
) -> Error {
    match cleanup {
        Ok(()) => Error::Driver(error),
        Err(cleanup) => Error::CleanupFailed {
            error,
            cleanup,
            what,
        },
    }
}

fn bump(count: &mut u64) {
    *count = count.saturating_add(1);
}
