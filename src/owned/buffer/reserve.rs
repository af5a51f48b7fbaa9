//! The reserve of a [`VirtualBuffer`]: pages created, mapped and granted ahead of need by a worker
//! thread, at the slots the next maps will use, so that a [`map_page`](VirtualBuffer::map_page) or
//! [`grow`](VirtualBuffer::grow) there makes no driver call; and retired pages unmapped and
//! released by the same thread once their events have completed. The thread that launches work
//! then makes no VMM call of its own.
//!
//! Why a thread: `cuMemCreate` (about 20 µs on an H200), `cuMemSetAccess` (about 27 µs),
//! `cuMemUnmap` and `cuMemRelease` on the launch thread delay every launch behind them, and a
//! decode step that launches a kernel doing little takes a few µs: a page every 8 steps tripled
//! its time. The same calls on another thread were measured not to delay the launches (the
//! `bench motion` rows say by how much, in the same run).
//!
//! How: the worker marks a slot in the page table (`Filling`) under the table's lock, makes its
//! driver calls without the lock, and hands the page back (`Ready`), so a map that takes the lock
//! meanwhile never waits for a driver call; the same for a retired page (`Releasing`). Every
//! check of the buffer refuses a page of the reserve as it refuses a hole, and names it.
//!
//! Each round of the worker: the retired pages whose events have completed are taken out of
//! their retire. Those that can be are recycled in place: a page of the reserve's kind (owned, of
//! its size, device and options, not exportable), granted to the current access set, lying where
//! the reserve fills next (the bound's worth of pages after the cursor), turns into a page of the
//! reserve where it is, still mapped and granted, while the bound leaves room: no driver call at
//! all. The others are unmapped; the memory of those that fit the reserve is mapped again at the
//! next slots to fill, while the bound leaves room (no `cuMemRelease`, no `cuMemCreate`: a page
//! costs the worker `cuMemUnmap`, `cuMemMap` and `cuMemSetAccess`), and the rest is released;
//! then the slots are filled, one at a time, nearest first, each handed back at once.
//!
//! A loop that maps and retires round a ring of slots no larger than the bound (a decode loop
//! writing its tokens round the same budget) thus reaches a steady state where its worker makes
//! no VMM call: each retired page, once its work has finished, waits in place for the map that
//! comes round to its slot again, and the worker's rounds are state changes and `cuEventQuery`.
//! A page recycled in place holds what the buffer's own work last wrote there: stale data of
//! this process, never of another, which no view reaches until a map takes the page again (a
//! page from the reserve is, as any new page, of unspecified content).

use core::time::Duration;
use std::sync::Arc;

use crate::device::{Context, Device};
use crate::error::{DriverError, Error};
use crate::vmm::access::AccessMode;
use crate::vmm::physical::{AllocationOptions, PhysicalAllocation, check_multiple};

use super::ahead::{IDLE, ReserveOptions, Shared, Worker, give_back};
use super::page::{Backing, Memory};
use super::retiring;
use super::table::{Calls, Fill, map_at, unmap_page};
use super::{BUDGET, VirtualBuffer};

/// How often the worker looks at the events of the retires that wait (`cuEventQuery`), while
/// some wait.
const POLL: Duration = Duration::from_micros(100);

/// How many rounds of [`POLL`] the worker goes on looking by itself once no retire waits, before
/// it sleeps until woken ([`IDLE`]). A retire wakes a worker that sleeps long, and the wake is a
/// system call on the retiring thread, with the worker's first look at the new events (not yet
/// completed, as a rule) right behind it: a loop that retires a page every few steps finds the
/// worker still looking, and its retires make no call beyond their events. The cost: a worker that
/// wakes every 100 us for 1.6 ms after the last retire, and takes the table's lock each time.
const LINGER: u32 = 16;

impl<M: AccessMode> VirtualBuffer<M> {
    /// Starts a reserve: a worker thread, owned by the buffer, keeps up to
    /// [`options.pages()`](ReserveOptions::pages) pages created, mapped and granted ahead of need
    /// (`cuMemCreate`, `cuMemMap`, `cuMemSetAccess`, made on that thread) at the next vacant slots
    /// of [`page_size`](ReserveOptions::page_size) bytes after the end of the last page mapped
    /// (wrapping round the budget; mapped, retired, evicted ranges skipped). A
    /// [`map_page`](VirtualBuffer::map_page) or [`grow`](VirtualBuffer::grow) of exactly such a
    /// slot, of the reserve's device, takes its page with no driver call. The worker also takes
    /// retired pages once their events have completed: a page that fits the reserve and lies
    /// where it fills next is recycled in place, with no driver call (it stays mapped and granted,
    /// and a map of exactly its range takes it); the others are unmapped, and released or their
    /// memory mapped again into the reserve (where it fits and the bound leaves room), so the
    /// thread that maps and retires makes no VMM call. A reserve started before is given back
    /// first, and replaced.
    ///
    /// - **Memory held.** The reserve's pages are memory the buffer holds, shown in
    ///   [`stats`](VirtualBuffer::stats) (`reserve_pages`, `reserve_bytes`) and never more than the
    ///   bound; [`trim`](VirtualBuffer::trim) and the drop give them back, and free device memory
    ///   is then what it was before the reserve, to the byte.
    /// - **Never reachable.** A page of the reserve is no page of the buffer: views, lends,
    ///   exports and retires refuse its bytes (as [`Error::PageRange`], which names them and says
    ///   why), [`pages`](VirtualBuffer::pages), [`mapped_bytes`](VirtualBuffer::mapped_bytes) and
    ///   [`end`](VirtualBuffer::end) leave it out.
    /// - **Other maps.** A map of another size or device over pages of the reserve gives them back
    ///   first (`cuMemUnmap`, `cuMemRelease` on the calling thread); a map of a range the worker
    ///   is filling waits until it is done (it is then taken). A map of exactly the range of a
    ///   retired page that the worker would recycle in place but has not yet, whose retire's
    ///   events have all completed (`cuEventQuery` on the calling thread), takes it in place, with
    ///   no VMM call.
    /// - **Faults.** A refused fill (`cuMemCreate` out of memory, say) stops the refills, and is
    ///   returned by the next map or grow that would have used the reserve (one whose range holds
    ///   no page of it), after which the refills start again. No page is lost: the slot is a hole
    ///   again.
    /// - **Through `&mut self`** (unmap, shrink, evict, restore, an access change, trim) the
    ///   buffer first waits for the worker's fill or release under way, so every page is as
    ///   without a reserve; an access change gives the reserve back and starts it again.
    ///
    /// Start it before [`in_scope`](VirtualBuffer::in_scope): the maps, grows and retires of a
    /// [`ScopedBuffer`](super::ScopedBuffer) use it.
    ///
    /// # Errors
    /// Before any driver call: [`Error::ZeroSize`] for no pages or a zero page size,
    /// [`Error::NotAligned`] for a page size that is not a multiple of the device's granularity,
    /// [`Error::OutOfBounds`] for a page larger than the budget. The driver's error of the
    /// granularity query; [`Error::Os`] where the thread cannot be spawned (no reserve then).
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::{Device, ReadWrite, VirtualBuffer, owned::ReserveOptions};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let page = 2 << 20;
    /// let mut kv = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// kv.reserve_ahead(ReserveOptions::new(device, page, 2))?;
    /// // ... later, on the launch thread: a map of a page made ahead is one table update.
    /// let at = kv.grow(device, page)?;
    /// assert_eq!(at, 0);
    /// assert!(kv.stats().reserve_pages <= 2);
    /// kv.trim()?; // every page of the reserve given back
    /// assert_eq!(kv.stats().reserve_pages, 0);
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuMemCreate")]
    #[doc(alias = "cuMemMap")]
    #[doc(alias = "cuMemSetAccess")]
    pub fn reserve_ahead(&mut self, options: ReserveOptions) -> Result<(), Error> {
        if options.pages == 0 || options.page_size == 0 {
            return Err(Error::ZeroSize {
                what: "reserve (pages and page size)",
            });
        }
        let allocation = self.options.for_device(options.device);
        let granularity = allocation.minimum_granularity_cached()?;
        check_multiple("reserve page size", options.page_size, granularity)?;
        if options.page_size > self.budget {
            return Err(Error::OutOfBounds {
                what: BUDGET,
                start: 0,
                end: options.page_size,
                len: self.budget,
            });
        }
        self.trim()?;
        let job = Job {
            shared: Arc::clone(&self.shared),
            base: self.base,
            access: self.access.clone(),
            flags: M::FLAGS,
            allocation,
            device: options.device,
            size: options.page_size,
            fail_create: options.fail_create,
            created: 0,
        };
        let budget = self.budget;
        self.table_mut()
            .start_reserve(options.pages, options.page_size, budget);
        let thread = std::thread::Builder::new()
            .name("cuda-vmm reserve".into())
            .spawn(move || job.run());
        match thread {
            Ok(thread) => {
                self.worker = Some(Worker { thread, options });
                Ok(())
            }
            Err(error) => {
                self.table_mut().end_reserve();
                Err(Error::Os {
                    what: "spawning the reserve's worker thread",
                    errno: error.raw_os_error().unwrap_or(0),
                })
            }
        }
    }

    /// `cuMemUnmap`, `cuMemRelease` — stop the reserve: its worker is joined (its fill or release
    /// under way finished first), and every page of the reserve is unmapped and released here.
    /// Returns how many were given back. Free device memory is then what it was before the
    /// reserve started, to the byte (retired pages still waiting for their events aside). A
    /// buffer with no reserve gives back nothing. [`reserve_ahead`](VirtualBuffer::reserve_ahead)
    /// starts one again.
    ///
    /// # Errors
    /// The first driver error; every page is tried. A page whose `cuMemUnmap` the driver refuses
    /// stays in the table, as a page of no reserve, and the drop tries it again.
    #[doc(alias = "cuMemUnmap")]
    #[doc(alias = "cuMemRelease")]
    pub fn trim(&mut self) -> Result<usize, Error> {
        self.stop_reserve();
        let (base, budget) = (self.base, self.budget);
        give_back(&mut self.table_mut(), base, 0, budget)
    }

    /// Stops the worker, if one runs, and forgets the reserve: the options it ran with. Its pages
    /// stay in the table until a trim or the teardown gives them back.
    pub(super) fn stop_reserve(&mut self) -> Option<ReserveOptions> {
        let worker = self.worker.take()?;
        {
            let mut table = self.lock();
            table.stop_reserve();
            self.shared.wake_worker(&table);
        }
        // The worker never panics (no code of this crate does); were it to, its ranges stay
        // marked, and the teardown leaves them.
        let _ = worker.thread.join();
        self.table_mut().end_reserve();
        Some(worker.options)
    }
}

/// What the worker thread holds: the table, where to map, what to grant, what to make.
struct Job {
    shared: Arc<Shared>,
    base: u64,
    access: Vec<Context>,
    flags: u32,
    allocation: AllocationOptions,
    device: Device,
    size: usize,
    fail_create: Option<u64>,
    /// The pages this worker asked `cuMemCreate` for (recycled memory aside).
    created: u64,
}

impl Job {
    /// The worker's loop: release the retired pages whose events have completed, fill the next
    /// slot while the reserve is under its bound, else sleep until woken (polling the retires'
    /// events while some wait, and [`LINGER`] rounds after). Returns once asked to stop.
    fn run(mut self) {
        // The worker's calls must neither be refused by another thread's capture in `GLOBAL` mode
        // nor invalidate it: this thread runs nothing but them.
        crate::wait::relax_this_thread();
        let shared = Arc::clone(&self.shared);
        let mut table = shared.lock();
        // Rounds since a retire last waited: none yet, so the worker sleeps long until woken.
        let mut quiet = LINGER;
        loop {
            if table.stopping() {
                return;
            }
            if table.has_retires() {
                quiet = 0;
            }
            // The retires' events are queried without the lock: a query takes a microsecond or
            // more (1.3 us measured on an H100), and the launch thread's lends wait for the lock.
            let queries = table.retire_queries();
            let releasing = if queries.is_empty() {
                Vec::new()
            } else {
                drop(table);
                let done = retiring::finished(&queries);
                drop(queries);
                table = shared.lock();
                if table.stopping() {
                    return;
                }
                table.release_finished(&done, |backing| self.fits_in_place(backing))
            };
            // The slots to fill in this round: one per page released, up to the room the bound
            // leaves (their memory is recycled where it fits), or one where none is released.
            let mut slots = Vec::new();
            while slots.len() < releasing.len().max(1) {
                match table.next_fill() {
                    Some((offset, _)) => slots.push(offset),
                    None => break,
                }
            }
            if releasing.is_empty() && slots.is_empty() {
                let wait = if quiet < LINGER { POLL } else { IDLE };
                quiet = quiet.saturating_add(1);
                table = shared.sleep(table, wait);
                continue;
            }
            drop(table);
            let mut spare = Vec::new();
            if !releasing.is_empty() {
                let mut calls = Calls::default();
                let mut outcomes = Vec::with_capacity(releasing.len());
                for (offset, size, backing) in releasing {
                    // SAFETY: a retired page whose retire's events have all completed (each
                    // recorded after all the work queued before the retire, with no lend left in
                    // progress), mapped whole at `offset`: no queued work uses it and no view
                    // reaches it; it is `Releasing` in the table, which only this worker changes,
                    // and nothing maps or unmaps there until `released` below.
                    let unmapped = unsafe { unmap_page(self.base, offset, size, &mut calls) };
                    let outcome = match unmapped {
                        Err(_) => Err(backing),
                        Ok(()) => match self.recyclable(backing, spare.len() < slots.len()) {
                            Ok(memory) => {
                                spare.push(memory);
                                Ok(true)
                            }
                            Err(backing) => {
                                // Ignored, as in `drop`: the page is unmapped and gone either way.
                                let _ = backing.memory.release_code();
                                Ok(false)
                            }
                        },
                    };
                    outcomes.push((offset, outcome));
                }
                table = shared.lock();
                table.count_calls(0, 0, calls.unmaps);
                for (offset, outcome) in outcomes {
                    table.released(offset, outcome);
                }
                shared.handed_back();
                drop(table);
            }
            for offset in slots {
                let mut calls = Calls::default();
                let fill = self.fill(offset, spare.pop(), &mut calls);
                table = shared.lock();
                table.count_calls(calls.maps, calls.grants, calls.unmaps);
                table.filled(offset, fill);
                shared.handed_back();
                drop(table);
            }
            // Every spare was mapped: there are no more of them than slots.
            table = shared.lock();
        }
    }

    /// The memory of `backing`, unmapped, where it can be a page of the reserve (`wanted`, owned by
    /// the buffer, of the reserve's size, device and options, and exportable as no handle kind),
    /// else `backing` back.
    ///
    /// Memory made exportable, or a page a dma-buf was exported of, is never used again: a handle
    /// of it may have been exported, and whoever imported it (another process, a network adapter)
    /// keeps the memory after this buffer lets go of it, so a page made of it again would hand the
    /// next bytes written there to that importer, and let it write them. It is released, which
    /// frees it once every importer has too.
    fn recyclable(&self, backing: Backing, wanted: bool) -> Result<PhysicalAllocation, Backing> {
        let fits = wanted && self.fits_in_place(&backing);
        match backing.memory {
            Memory::Own(memory) if fits => Ok(memory),
            memory => Err(Backing {
                memory,
                device: backing.device,
                exported: backing.exported,
            }),
        }
    }

    /// Whether a retired page's memory is of the kind the reserve makes ([`Backing::recyclable_as`]),
    /// for a recycle in place or a map again into the reserve (the table checks the rest for a
    /// recycle in place: its grants, place and the bound).
    fn fits_in_place(&self, backing: &Backing) -> bool {
        backing.recyclable_as(self.device, self.size, self.allocation)
    }

    /// `cuMemCreate` (unless `recycled` memory is given), `cuMemMap`, `cuMemSetAccess` of one page
    /// at `offset`, which the table marks `Filling` for this worker.
    fn fill(
        &mut self,
        offset: usize,
        recycled: Option<PhysicalAllocation>,
        calls: &mut Calls,
    ) -> Fill<Backing> {
        let memory = if let Some(memory) = recycled {
            memory
        } else {
            self.created = self.created.saturating_add(1);
            if self.fail_create == Some(self.created) {
                return Fill::Refused(Error::Driver(DriverError::OUT_OF_MEMORY));
            }
            match PhysicalAllocation::with_options(self.size, self.allocation) {
                Ok(memory) => memory,
                Err(error) => return Fill::Refused(error),
            }
        };
        let backing = Backing {
            memory: Memory::Own(memory),
            device: self.device,
            exported: false,
        };
        // SAFETY: `[offset, offset + size)` is marked `Filling` in the table, under its lock, for
        // this worker alone: it was vacant, it lies inside the budget (the reserve's slots do), it
        // is aligned to the page size, a multiple of the device's granularity (checked when the
        // reserve started), and nothing else maps there until `filled` hands the page back.
        match unsafe { map_at(self.base, offset, backing, &self.access, self.flags, calls) } {
            Ok(backing) => Fill::Ready(backing),
            Err((error, Some(backing))) => Fill::Ungranted(backing, error),
            Err((error, None)) => Fill::Refused(error),
        }
    }
}
