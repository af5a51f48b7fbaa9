//! [`ClaimedRange`]: a writable range of a [`VirtualBuffer`] held through a shared borrow of the
//! buffer, so that the buffer goes on growing while whatever writes the range (a captured graph,
//! most often) lives.

use core::fmt;
use core::marker::PhantomData;
use core::ops::{Range, RangeBounds};

use bytemuck::Pod;

use super::VirtualBuffer;
use crate::device::{Context, Device};
use crate::error::Error;
use crate::stream::{Covers, Rebind};
use crate::view::{DeviceSliceMut, Reach};
use crate::vmm::access::ReadWrite;

/// The bytes `[start, end)` of a [`VirtualBuffer`] claimed for one writer
/// ([`VirtualBuffer::claim_bytes_mut`]), borrowing the buffer shared rather than exclusively.
///
/// A writable view made by [`slice_bytes_mut`](VirtualBuffer::slice_bytes_mut) borrows the whole
/// buffer exclusively, and so does a graph that captured it: the buffer cannot
/// [`grow`](VirtualBuffer::grow) or [`map_page`](VirtualBuffer::map_page) while the graph lives,
/// though a new page touches no captured byte. A claim borrows the buffer shared, and makes the
/// range exclusive at run time instead:
///
/// - while it lives, no other view of the buffer covers its bytes: a read view
///   ([`slice_bytes`](VirtualBuffer::slice_bytes)), another claim, or a rebind that reads them
///   ([`Rebind::reads`]) is refused before any driver call, with [`Error::PageRange`] naming the
///   shared bytes; every way to a writable view or a lend other than a claim takes `&mut` of the
///   buffer, which the claim's borrow rules out;
/// - its pages stay mapped and granted: unmapping, shrinking, retiring, evicting and changing the
///   access set take `&mut` of the buffer too;
/// - what takes `&self` goes on: [`grow`](VirtualBuffer::grow), [`map_page`](VirtualBuffer::map_page)
///   and [`map_shared`](VirtualBuffer::map_shared) map only bytes no page holds, so none of the
///   claim's.
///
/// Its views ([`view`](ClaimedRange::view)) borrow the claim mutably, so there is one at a time,
/// as for a `&mut [T]`. Dropping the claim lets go of the range. A claim that is forgotten
/// (`mem::forget`) keeps its range until the buffer is next borrowed exclusively, which proves
/// that no claim lives.
///
/// # Lifetimes
/// `'buf` is the shared borrow of the buffer. Covariant, as `&'buf VirtualBuffer`.
///
/// # Examples
/// A graph that writes the claimed range, replayed while the cache grows:
/// ```no_run
/// use cuda_vmm::{Device, ReadWrite, Stream, VirtualBuffer, stream::Graph};
///
/// # fn main() -> cuda_vmm::Result<()> {
/// let device = Device::get(0)?;
/// let page = 2 << 20;
/// let cache = VirtualBuffer::new(64 * page, &[device], ReadWrite)?;
/// cache.grow(device, page)?;
/// let mut stream = Stream::new(&cache.contexts()[0])?;
/// let mut step = cache.claim_bytes_mut::<u32>(..page)?;
/// let view = step.view();
/// let graph = Graph::capture(&mut stream, move |c| c.memset(view, 7).map(drop))?;
/// for _ in 0..4 {
///     cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph))?;
///     cache.grow(device, page)?; // the graph lives, and the cache grows
/// }
/// assert!(cache.slice_bytes::<u32>(..page).is_err()); // claimed: no other view
/// drop(graph);
/// drop(step);
/// assert_eq!(cache.slice_bytes::<u32>(..page)?.to_vec()?, vec![7; page / 4]);
/// # Ok(())
/// # }
/// ```
///
/// The claim keeps its pages mapped: no unmap while it lives.
/// ```compile_fail,E0502
/// # use cuda_vmm::{Device, ReadWrite, VirtualBuffer};
/// # fn main() -> cuda_vmm::Result<()> {
/// # let device = Device::get(0)?;
/// let mut cache = VirtualBuffer::new(2 << 20, &[device], ReadWrite)?;
/// cache.grow(device, 2 << 20)?;
/// let mut claim = cache.claim_bytes_mut::<u32>(..4096)?;
/// cache.unmap(..)?; // `claim` still holds the page
/// claim.view().copy_from_host(&[0; 1024])?;
/// # Ok(())
/// # }
/// ```
pub struct ClaimedRange<'buf, T: Pod> {
    buffer: &'buf VirtualBuffer<ReadWrite>,
    /// The first context of the access set, which views copy through.
    context: &'buf Context,
    start: usize,
    end: usize,
    /// Elements of `T`, written through the views only: as a `&mut [T]` would, invariant in `T`
    /// and `Send`/`Sync` only where `&mut [T]` is.
    _elements: PhantomData<&'buf mut [T]>,
}

impl VirtualBuffer<ReadWrite> {
    /// Claims the bytes `bytes` (counted from the base) as `T`s for one writer, through a shared
    /// borrow of the buffer: see [`ClaimedRange`]. No driver call.
    ///
    /// # Errors
    /// Before anything is claimed: [`Error::OutOfBounds`] for a range outside the budget;
    /// [`Error::NotWholeElements`] where the range or its start is not a whole number of `T`s;
    /// [`Error::PageRange`] naming the first bytes not on a mapped, granted page (a hole, a
    /// retired, evicted or ungranted page), or the first bytes another live claim holds.
    pub fn claim_bytes_mut<T: Pod>(
        &self,
        bytes: impl RangeBounds<usize>,
    ) -> Result<ClaimedRange<'_, T>, Error> {
        let (start, end, _) = self.element_range::<T>(bytes)?;
        let context = self.first_context()?;
        self.lock().hold(start, end)?;
        Ok(ClaimedRange {
            buffer: self,
            context,
            start,
            end,
            _elements: PhantomData,
        })
    }
}

impl<T: Pod> ClaimedRange<'_, T> {
    /// The claimed bytes, counted from the buffer's base.
    #[must_use]
    pub fn bytes(&self) -> Range<usize> {
        self.start..self.end
    }

    /// The number of `T`s claimed.
    #[must_use]
    pub fn len(&self) -> usize {
        (self.end - self.start) / size_of::<T>().max(1)
    }

    /// Whether no byte is claimed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// The writable view of the claimed range, copied through the first context of the buffer's
    /// access set; it borrows the claim mutably, so it is the only one while it lives.
    pub fn view(&mut self) -> DeviceSliceMut<'_, T> {
        self.view_through(self.context)
    }

    /// As [`view`](ClaimedRange::view), with copies made through the context of `device`, which
    /// must be in the buffer's access set.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] for a device outside the access set.
    pub fn view_on(&mut self, device: Device) -> Result<DeviceSliceMut<'_, T>, Error> {
        let context = self.buffer.context_of(device)?;
        Ok(self.view_through(context))
    }

    fn view_through<'v>(&'v self, context: &'v Context) -> DeviceSliceMut<'v, T> {
        let ptr = self.buffer.base.wrapping_add(self.start as u64);
        // Every byte of the range was on a mapped page granted to every device of the access set
        // when it was claimed (checked under the table's lock), and stays so while the claim
        // borrows the buffer: unmapping, retiring, evicting and changing the access set take
        // `&mut` of it. The range is exclusive: no other view of the buffer covers it while the
        // hold is in the table (every view through `&self` checks the holds; every other way to a
        // writable view takes `&mut` of the buffer), and the view borrows the claim mutably, so
        // there is one at a time. The grants are `ReadWrite`.
        DeviceSliceMut::from_granted(ptr, self.len(), context, Reach::Owned(&self.buffer.access))
    }
}

impl<T: Pod> Drop for ClaimedRange<'_, T> {
    fn drop(&mut self) {
        self.buffer.lock().release_hold(self.start, self.end);
    }
}

impl<T: Pod> fmt::Debug for ClaimedRange<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimedRange")
            .field("bytes", &self.bytes())
            .field("base", &format_args!("{:#x}", self.buffer.base))
            .finish()
    }
}

// A parked graph is rebound over a claimed range for writing: the claim covers its own bytes, and
// nothing else.
impl<T: Pod> Covers for ClaimedRange<'_, T> {
    /// `Ok(false)` where the device addresses `[start, end)` are not all inside the claimed
    /// range; `Ok(true)` where they are and `device` is in the buffer's access set (the claim
    /// keeps its pages mapped and granted); [`Error::GraphRange`] for a device outside it.
    fn covers(&self, start: u64, end: u64, device: Device) -> Result<bool, Error> {
        let base = self.buffer.base;
        let first = base.wrapping_add(self.start as u64);
        let last = base.wrapping_add(self.end as u64);
        if start < first || end > last || start >= end {
            return Ok(false);
        }
        if self.buffer.context_of(device).is_err() {
            return Err(Error::GraphRange {
                start,
                end,
                host: false,
                problem: "are in a ClaimedRange whose buffer's access set does not name the graph's \
                          device",
            });
        }
        Ok(true)
    }
}

impl<'g> Rebind<'g> {
    /// Give the claimed range `claimed` for the graph to read and write, exclusively, for `'g`:
    /// the way to rebind a graph that writes part of a buffer that goes on growing. The claim
    /// covers its own bytes only; give the rest of the buffer with [`reads`](Rebind::reads).
    #[must_use = "the rebind is made by `finish`"]
    pub fn writes_claimed<T: Pod + Sync>(self, claimed: &'g mut ClaimedRange<'_, T>) -> Rebind<'g> {
        // The exclusive borrow of the claim, held for `'g`, seen as shared: the rebound graph is
        // its one writer while it lives.
        let claimed: &'g ClaimedRange<'_, T> = claimed;
        self.give_pages(claimed, true)
    }
}
