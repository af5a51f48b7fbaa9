//! The views of a [`VirtualBuffer`]: byte ranges of mapped, granted pages as [`DeviceSlice`]s and
//! [`DeviceSliceMut`]s, checked before any driver call.

use core::ops::RangeBounds;

use bytemuck::Pod;

use super::{BUDGET, VirtualBuffer};
use crate::device::{Context, Device};
use crate::error::Error;
use crate::owned::pages::check_covered;
use crate::view::{DeviceSlice, DeviceSliceMut, Reach, range_bounds};
use crate::vmm::access::{AccessMode, ReadWrite, elements};

impl<M: AccessMode> VirtualBuffer<M> {
    /// `[base + start, base + end)` for a view of `T`s, checked: whole elements, mapped and granted.
    fn view_range<T>(&self, bytes: impl RangeBounds<usize>) -> Result<(u64, usize), Error> {
        let (start, end) = range_bounds(bytes, self.budget, BUDGET)?;
        let len = elements::<T>(end - start)?;
        // Element `i` of the view is element `start / size_of::<T>() + i` of the buffer.
        elements::<T>(start)?;
        check_covered(&self.pages, start, end)?;
        Ok((self.base.wrapping_add(start as u64), len))
    }

    /// The context of `device` in the access set.
    fn context_of(&self, device: Device) -> Result<&Context, Error> {
        self.access
            .iter()
            .find(|c| c.device() == device)
            .ok_or_else(|| Error::DeviceMismatch {
                expected: self.first_context().map_or(-1, |c| c.device().as_raw()),
                found: device.as_raw(),
            })
    }

    fn first_context(&self) -> Result<&Context, Error> {
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
        let (ptr, len) = self.view_range::<T>(bytes)?;
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
        let (ptr, len) = self.view_range::<T>(bytes)?;
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
}
