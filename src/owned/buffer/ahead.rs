//! What a [`VirtualBuffer`](super::VirtualBuffer)'s reserve is made of, below the buffer: its
//! options ([`ReserveOptions`]), the page table behind its lock with the condition that its worker
//! and its waiters share ([`Shared`]), the worker's handle ([`Worker`]), and the one path that
//! gives pages of the reserve back ([`give_back`]). The reserve itself (its start, trim and the
//! worker's loop) is `reserve.rs`.

use core::fmt;
use core::sync::atomic::{AtomicBool, Ordering};
use core::time::Duration;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use crate::device::Device;
use crate::error::Error;

use super::table::{Calls, Table, unmap_and_release};

/// How long a waiter on the table (the worker with nothing to do, a map waiting for a fill) sleeps
/// unless woken, before it looks again.
pub(super) const IDLE: Duration = Duration::from_millis(20);

/// What a [`VirtualBuffer`](super::VirtualBuffer)'s reserve holds ahead of need: at most `pages`
/// pages of `page_size` bytes of `device`'s memory, made with the buffer's
/// [`PageOptions`](super::PageOptions) and granted to its access set, at the next vacant slots
/// after the end of the last page mapped. Given to
/// [`VirtualBuffer::reserve_ahead`](super::VirtualBuffer::reserve_ahead).
///
/// # Examples
/// ```no_run
/// use cuda_vmm::owned::ReserveOptions;
/// # fn main() -> cuda_vmm::Result<()> {
/// let device = cuda_vmm::Device::get(0)?;
/// let options = ReserveOptions::new(device, 2 << 20, 4); // at most four 2 MiB pages ahead
/// assert_eq!(options.pages(), 4);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReserveOptions {
    pub(super) device: Device,
    pub(super) page_size: usize,
    pub(super) pages: usize,
    pub(super) fail_create: Option<u64>,
}

impl ReserveOptions {
    /// A reserve of at most `pages` pages of `page_size` bytes of `device`'s memory.
    #[must_use]
    pub const fn new(device: Device, page_size: usize, pages: usize) -> ReserveOptions {
        ReserveOptions {
            device,
            page_size,
            pages,
            fail_create: None,
        }
    }

    /// The same reserve, whose worker refuses the `nth` page it would ask `cuMemCreate` for
    /// (counted from 1, since the reserve started; the memory of retired pages it recycles does
    /// not count) as `cuMemCreate` refuses one when memory runs out
    /// ([`DriverError::OUT_OF_MEMORY`](crate::error::DriverError::OUT_OF_MEMORY)), without asking
    /// the driver. For testing an engine's handling of a refill that fails: the next map or grow
    /// that would have used the page returns the error. Nothing else differs.
    #[must_use]
    pub const fn with_failing_create(self, nth: u64) -> ReserveOptions {
        ReserveOptions {
            fail_create: Some(nth),
            ..self
        }
    }

    /// The device whose memory the pages are.
    #[must_use]
    pub const fn device(&self) -> Device {
        self.device
    }

    /// The size of each page, in bytes.
    #[must_use]
    pub const fn page_size(&self) -> usize {
        self.page_size
    }

    /// The most pages held ahead at once: the bound.
    #[must_use]
    pub const fn pages(&self) -> usize {
        self.pages
    }
}

/// The page table behind its lock, and the two conditions around it: `done`, which the worker
/// signals after each fill or release it hands back (a map waiting on a range being filled, a
/// change through `&mut` waiting for the worker, wait on it), and `work`, on which the worker sleeps
/// until there is work for it (a page of the reserve taken, a retire, a stop).
pub(super) struct Shared {
    table: Mutex<Table>,
    done: Condvar,
    work: Condvar,
    /// Whether the worker sleeps on `work` for long ([`IDLE`]; while retires wait, and for a
    /// while after, it sleeps a short poll only, and looks again by itself): set and cleared by
    /// the worker under the lock, read under the lock by [`wake_worker`](Shared::wake_worker), so
    /// that a thread that found work for it makes the wake-up call (a system call) only where it
    /// would otherwise wait long.
    asleep: AtomicBool,
}

impl Shared {
    pub(super) fn new(table: Table) -> Shared {
        Shared {
            table: Mutex::new(table),
            done: Condvar::new(),
            work: Condvar::new(),
            asleep: AtomicBool::new(false),
        }
    }

    /// The table, locked (a poisoned lock taken as it is, as `VirtualBuffer::lock` says).
    #[inline]
    pub(super) fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The table, locked, once the worker holds no range without the lock.
    #[inline]
    pub(super) fn settled(&self) -> MutexGuard<'_, Table> {
        let mut table = self.lock();
        while table.worker_busy() {
            table = self.wait(table);
        }
        table
    }

    /// Lets go of the lock until the worker hands a fill or release back (or a while passes), and
    /// takes it again.
    pub(super) fn wait<'a>(&self, table: MutexGuard<'a, Table>) -> MutexGuard<'a, Table> {
        wait_on(&self.done, table, IDLE)
    }

    /// Wakes the worker where it sleeps: there is work for it. Called with the lock held (`_table`),
    /// so that it cannot miss a worker just going to sleep.
    pub(super) fn wake_worker(&self, _table: &Table) {
        if self.asleep.load(Ordering::Relaxed) {
            self.work.notify_one();
        }
    }

    /// Wakes the worker where it sleeps and has a slot to fill ([`Table::fill_pending`]): what a
    /// map that took a page of the reserve calls. Where every slot it could fill holds a page, the
    /// wake would cost the map a system call and give the worker nothing to do; the slots are
    /// looked at only where it sleeps. Called with the lock held, as
    /// [`wake_worker`](Shared::wake_worker).
    pub(super) fn wake_worker_to_fill(&self, table: &mut Table) {
        if self.asleep.load(Ordering::Relaxed) && table.fill_pending() {
            self.work.notify_one();
        }
    }

    /// The worker handed a fill or release back: wakes whoever waits for it.
    pub(super) fn handed_back(&self) {
        self.done.notify_all();
    }

    /// The worker sleeps until woken, or `timeout` passes (woken by others only for a timeout of
    /// [`IDLE`] or longer).
    pub(super) fn sleep<'a>(
        &self,
        table: MutexGuard<'a, Table>,
        timeout: Duration,
    ) -> MutexGuard<'a, Table> {
        self.asleep.store(timeout >= IDLE, Ordering::Relaxed);
        let table = wait_on(&self.work, table, timeout);
        self.asleep.store(false, Ordering::Relaxed);
        table
    }
}

/// Waits on `condition` with the lock of `table`, for at most `timeout` (a poisoned lock taken as
/// it is).
fn wait_on<'a>(
    condition: &Condvar,
    table: MutexGuard<'a, Table>,
    timeout: Duration,
) -> MutexGuard<'a, Table> {
    condition
        .wait_timeout(table, timeout)
        .map_or_else(|poisoned| poisoned.into_inner().0, |(table, _)| table)
}

/// The reserve's worker thread and the options it was started with.
pub(super) struct Worker {
    pub(super) thread: JoinHandle<()>,
    pub(super) options: ReserveOptions,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// `cuMemUnmap`, `cuMemRelease` — give back the pages of the reserve that share a byte with
/// `[start, end)`, on this thread, under the table's lock (`table`): a map of another size or
/// device there, or a trim. How many were given back; the first error, every page tried. A page
/// the driver refuses to unmap is put back as an `Ungranted` page of the buffer (which no view
/// reaches, and the next unmap or the drop unmaps).
pub(super) fn give_back(
    table: &mut Table,
    base: u64,
    start: usize,
    end: usize,
) -> Result<usize, Error> {
    let mut first = Ok(());
    let mut given = 0usize;
    let mut calls = Calls::default();
    for (offset, size, backing) in table.take_reserve(start, end) {
        // SAFETY: a page of the reserve, mapped whole at `offset` by the worker (`map_at`): no
        // view, lend or export reached it (every check refuses a page of the reserve), no work
        // was queued on it, and it left the table just above, under the lock this caller holds
        // until its outcome is back in the table.
        let outcome = unsafe { unmap_and_release(base, offset, size, backing, &mut calls) };
        if let Err(backing) = outcome {
            table.keep_unreleased(offset, size, backing);
            if first.is_ok() {
                first = Err(Error::PageRange {
                    start: offset,
                    end: offset.saturating_add(size),
                    problem: "are a page of the reserve the driver refused to unmap",
                });
            }
        } else {
            given = given.saturating_add(1);
        }
    }
    table.count_calls(0, 0, calls.unmaps);
    first.map(|()| given)
}
