//! The views of a [`VirtualBuffer`]: byte ranges of mapped, granted pages as [`DeviceSlice`]s and
//! [`DeviceSliceMut`]s, checked before any driver call.

use core::ops::{Range, RangeBounds};

use bytemuck::Pod;

use super::{BUDGET, VirtualBuffer};
use crate::device::{Context, Device};
use crate::error::Error;
use crate::stream::{Covers, Rebind};
use crate::view::{DeviceSlice, DeviceSliceMut, Reach, range_bounds};
use crate::vmm::access::{AccessMode, ReadWrite, elements};

impl<M: AccessMode> VirtualBuffer<M> {
    /// `bytes` as a range of whole `T`s inside the budget: its start, end and length in `T`s.
    /// Element `i` of a view of it is element `start / size_of::<T>() + i` of the buffer.
    pub(super) fn element_range<T>(
        &self,
        bytes: impl RangeBounds<usize>,
    ) -> Result<(usize, usize, usize), Error> {
        let (start, end) = range_bounds(bytes, self.budget, BUDGET)?;
        let len = elements::<T>(end - start)?;
        elements::<T>(start)?;
        Ok((start, end, len))
    }

    /// `[base + start, base + end)` for a view of `T`s, checked: whole elements, mapped and granted,
    /// and held by no claim.
    fn view_range<T>(&self, bytes: impl RangeBounds<usize>) -> Result<(u64, usize), Error> {
        let (start, end, len) = self.element_range::<T>(bytes)?;
        let table = self.lock();
        table.usable(start, end)?;
        table.not_held(start, end)?;
        Ok((self.base.wrapping_add(start as u64), len))
    }

    /// As `view_range`, for a view made through `&mut self`: no claim lives, so the table taken
    /// through `table_mut` has let go of the holds that forgotten ones left, and only the pages are
    /// checked.
    fn view_range_mut<T>(&mut self, bytes: impl RangeBounds<usize>) -> Result<(u64, usize), Error> {
        let (start, end, len) = self.element_range::<T>(bytes)?;
        self.table_mut().usable(start, end)?;
        Ok((self.base.wrapping_add(start as u64), len))
    }

    /// For a registration with a communicator on `device`, which holds the buffer exclusively: the
    /// address of the bytes `[start, end)` (counted from the base, inside the budget: the caller's
    /// check), checked as for a view (every byte on a mapped, granted page, none evicted), then
    /// `device` in the access set. Through `&mut self`, so that no lock is taken.
    #[cfg(feature = "nccl")]
    pub(crate) fn registrable(
        &mut self,
        start: usize,
        end: usize,
        device: Device,
    ) -> Result<u64, Error> {
        self.lock().usable(start, end)?;
        if self.context_of(device).is_err() {
            return Err(Error::NoPeerAccess {
                device: device.as_raw(),
                owner: self.first_context()?.device().as_raw(),
            });
        }
        Ok(self.base.wrapping_add(start as u64))
    }

    /// The context of `device` in the access set.
    pub(super) fn context_of(&self, device: Device) -> Result<&Context, Error> {
        self.access
            .iter()
            .find(|c| c.device() == device)
            .ok_or_else(|| Error::DeviceMismatch {
                expected: self.first_context().map_or(-1, |c| c.device().as_raw()),
                found: device.as_raw(),
            })
    }

    pub(super) fn first_context(&self) -> Result<&Context, Error> {
        self.access
            .first()
            .ok_or(Error::ZeroSize { what: "access set" })
    }

    /// A read-only view of the bytes `bytes` (counted from the base) as `T`s, copied through the first
    /// context of the access set.
    ///
    /// The range may span any run of adjacent mapped pages, of one device or several; the view
    /// borrows the buffer, so no page it covers can be unmapped while it lives.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] for a range outside the budget; [`Error::NotWholeElements`] where the
    /// range's start or length is not a whole number of `T`s, or `T` is zero-sized;
    /// [`Error::PageRange`] where some of the bytes are not mapped (the error names the first hole).
    pub fn slice_bytes<T: Pod>(
        &self,
        bytes: impl RangeBounds<usize>,
    ) -> Result<DeviceSlice<'_, T>, Error> {
        let context = self.first_context()?;
        self.slice_through(bytes, context)
    }

    /// As [`slice_bytes`](VirtualBuffer::slice_bytes), with copies made through the context of
    /// `device`, which must be in the access set (the device first, as in the borrowed layer's
    /// [`Access::slice_on`](crate::Access::slice_on)).
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] where `device` is not in the access set; as
    /// [`slice_bytes`](VirtualBuffer::slice_bytes) otherwise.
    pub fn slice_bytes_on<T: Pod>(
        &self,
        device: Device,
        bytes: impl RangeBounds<usize>,
    ) -> Result<DeviceSlice<'_, T>, Error> {
        self.slice_through(bytes, self.context_of(device)?)
    }

    fn slice_through<'a, T: Pod>(
        &'a self,
        bytes: impl RangeBounds<usize>,
        context: &'a Context,
    ) -> Result<DeviceSlice<'a, T>, Error> {
        let (ptr, len) = self.view_range::<T>(bytes)?;
        // Every byte of the range is mapped and granted to every device of the access set (checked),
        // `context`'s among them, and stays so while `self` is borrowed: unmapping and changing the
        // access set take `&mut self`.
        Ok(DeviceSlice::from_granted(
            ptr,
            len,
            context,
            Reach::Owned(&self.access),
        ))
    }
}

impl VirtualBuffer<ReadWrite> {
    /// A writable view of the bytes `bytes` (counted from the base) as `T`s, copied through the first
    /// context of the access set. Only a [`ReadWrite`] buffer has one; it borrows the buffer
    /// exclusively, so it is the only view while it lives (split it with
    /// [`DeviceSliceMut::split_at_mut`]).
    ///
    /// # Errors
    /// As [`slice_bytes`](VirtualBuffer::slice_bytes).
    pub fn slice_bytes_mut<T: Pod>(
        &mut self,
        bytes: impl RangeBounds<usize>,
    ) -> Result<DeviceSliceMut<'_, T>, Error> {
        let (ptr, len) = self.view_range_mut::<T>(bytes)?;
        let context = self.first_context()?;
        Ok(DeviceSliceMut::from_granted(
            ptr,
            len,
            context,
            Reach::Owned(&self.access),
        ))
    }

    /// As [`slice_bytes_mut`](VirtualBuffer::slice_bytes_mut), with copies made through the context
    /// of `device`, which must be in the access set (the device first, as in the borrowed layer).
    ///
    /// # Errors
    /// As [`slice_bytes_on`](VirtualBuffer::slice_bytes_on).
    pub fn slice_bytes_mut_on<T: Pod>(
        &mut self,
        device: Device,
        bytes: impl RangeBounds<usize>,
    ) -> Result<DeviceSliceMut<'_, T>, Error> {
        let (ptr, len) = self.view_range_mut::<T>(bytes)?;
        let context = self.context_of(device)?;
        // As for `slice_through`; the range is writable (`ReadWrite` grants) and exclusive for as
        // long as `self` is borrowed mutably.
        Ok(DeviceSliceMut::from_granted(
            ptr,
            len,
            context,
            Reach::Owned(&self.access),
        ))
    }

    /// Writable views of several disjoint byte ranges at once (counted from the base), each as `T`s
    /// and copied through the first context of the access set: for one launch or one scope that
    /// writes several sequences of a cache, as `slice::get_disjoint_mut` does for a slice. The views
    /// borrow the buffer exclusively together, so no page they cover changes while any lives.
    ///
    /// Every range is checked before any view is made (no driver call is made at all): as for
    /// [`slice_bytes_mut`](VirtualBuffer::slice_bytes_mut), and that no two ranges share a byte.
    ///
    /// # Errors
    /// As [`slice_bytes_mut`](VirtualBuffer::slice_bytes_mut), for the first range that fails;
    /// [`Error::PageRange`] naming the shared bytes where two ranges overlap.
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::{Device, ReadWrite, VirtualBuffer};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let mut cache = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// let page = cache.grow(device, 2 << 20)?;
    /// let [mut keys, mut values] = cache.slice_bytes_disjoint_mut::<u32, 2>([0..1 << 20, 1 << 20..2 << 20])?;
    /// keys.copy_from_host(&vec![1; keys.len()])?;
    /// values.copy_from_host(&vec![2; values.len()])?;
    /// # let _ = page;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// The buffer cannot change while any of the views lives (overlapping ranges are refused at run
    /// time instead):
    /// ```compile_fail,E0499
    /// # use cuda_vmm::{Device, ReadWrite, VirtualBuffer};
    /// # fn main() -> cuda_vmm::Result<()> {
    /// # let device = Device::get(0)?;
    /// # let mut cache = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// # cache.grow(device, 2 << 20)?;
    /// let [a, b] = cache.slice_bytes_disjoint_mut::<u32, 2>([0..4096, 4096..8192])?;
    /// cache.shrink()?; // `a` and `b` still borrow the buffer
    /// # drop((a, b));
    /// # Ok(())
    /// # }
    /// ```
    pub fn slice_bytes_disjoint_mut<T: Pod, const N: usize>(
        &mut self,
        ranges: [Range<usize>; N],
    ) -> Result<[DeviceSliceMut<'_, T>; N], Error> {
        let mut parts = [(0u64, 0usize); N];
        let mut spans = [(0usize, 0usize); N];
        for ((part, span), range) in parts.iter_mut().zip(spans.iter_mut()).zip(ranges) {
            *span = (range.start, range.end);
            *part = self.view_range_mut::<T>(range)?;
        }
        if let Some((start, end)) = first_overlap(&mut spans) {
            return Err(Error::PageRange {
                start,
                end,
                problem: "are in two of the views asked for at once",
            });
        }
        let context = self.first_context()?;
        let access = &self.access;
        // Every range is mapped and granted to every device of the access set (checked), and no
        // two share a byte (checked), so each view is exclusive over its range, as the views of
        // `DeviceSliceMut::split_at_mut` are; all of them borrow the buffer mutably, so no page
        // they cover is unmapped, and no grant changed, while any lives.
        Ok(parts.map(|(ptr, len)| {
            DeviceSliceMut::from_granted(ptr, len, context, Reach::Owned(access))
        }))
    }
}

// A parked graph is rebound over a buffer's pages: the stream layer asks by its trait, and the
// buffer gives itself here, so that the stream layer never names it.
impl<M: AccessMode> Covers for VirtualBuffer<M> {
    /// `Ok(false)` where the device addresses `[start, end)` are not all inside the reservation;
    /// `Ok(true)` where every byte is on a mapped, granted page that is neither evicted nor
    /// retired, and `device` is in the access set; otherwise the error naming the bytes:
    /// [`Error::PageRange`] (counted from the base, the evicted range for evicted bytes) or
    /// [`Error::GraphRange`] for a device outside the access set. Checked as for a view.
    fn covers(&self, start: u64, end: u64, device: Device) -> Result<bool, Error> {
        let offsets = start
            .checked_sub(self.base)
            .zip(end.checked_sub(self.base))
            .and_then(|(s, e)| Some((usize::try_from(s).ok()?, usize::try_from(e).ok()?)));
        let Some((from, to)) = offsets.filter(|&(s, e)| s < e && e <= self.budget) else {
            return Ok(false);
        };
        if self.context_of(device).is_err() {
            return Err(Error::GraphRange {
                start,
                end,
                host: false,
                problem: "are in a VirtualBuffer whose access set does not name the graph's device",
            });
        }
        let table = self.lock();
        table.usable(from, to)?;
        // Bytes a claim holds are its writer's: only the claim itself covers them
        // (`Rebind::writes_claimed`).
        table.not_held(from, to)?;
        Ok(true)
    }
}

impl<'g> Rebind<'g> {
    /// Give `buffer` for the graph to read, for `'g`: any of its ranges the graph reads is checked
    /// by [`finish`](Rebind::finish) against its pages. Bytes a live
    /// [`ClaimedRange`](super::ClaimedRange) holds are not covered: give the claim itself
    /// ([`writes_claimed`](Rebind::writes_claimed)).
    #[must_use = "the rebind is made by `finish`"]
    pub fn reads<M: AccessMode>(self, buffer: &'g VirtualBuffer<M>) -> Rebind<'g> {
        self.give_pages(buffer, false)
    }

    /// Give `buffer` for the graph to read and write, exclusively, for `'g`. Only a [`ReadWrite`]
    /// buffer is given for writing.
    #[must_use = "the rebind is made by `finish`"]
    pub fn writes(self, buffer: &'g mut VirtualBuffer<ReadWrite>) -> Rebind<'g> {
        // The exclusive borrow, held for `'g`, seen as shared: nothing else uses the buffer while
        // the rebound graph lives.
        let buffer: &'g VirtualBuffer<ReadWrite> = buffer;
        self.give_pages(buffer, true)
    }
}

/// The bytes two of `spans` (`[start, end)` pairs, empty ones included) share, if any: the first such
/// pair once they are sorted by start. Sorts `spans`.
fn first_overlap(spans: &mut [(usize, usize)]) -> Option<(usize, usize)> {
    spans.sort_unstable();
    let mut furthest: Option<usize> = None;
    for &(start, end) in spans.iter().filter(|(start, end)| start != end) {
        if let Some(reached) = furthest
            && start < reached
        {
            return Some((start, end.min(reached)));
        }
        furthest = Some(furthest.map_or(end, |reached| reached.max(end)));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::first_overlap;

    #[test]
    fn overlapping_spans_are_named_and_disjoint_ones_pass() {
        assert_eq!(first_overlap(&mut [(0, 4), (4, 8), (8, 12)]), None);
        assert_eq!(first_overlap(&mut [(8, 12), (0, 4)]), None);
        assert_eq!(first_overlap(&mut [(0, 8), (4, 12)]), Some((4, 8)));
        assert_eq!(first_overlap(&mut [(4, 12), (0, 8)]), Some((4, 8)));
        // One range inside another, and a span that overlaps only an earlier, longer one.
        assert_eq!(first_overlap(&mut [(0, 16), (4, 8)]), Some((4, 8)));
        assert_eq!(first_overlap(&mut [(0, 16), (2, 4), (8, 10)]), Some((2, 4)));
        // Empty ranges share no byte with anything.
        assert_eq!(first_overlap(&mut [(0, 8), (4, 4)]), None);
        assert_eq!(first_overlap(&mut []), None);
    }
}
