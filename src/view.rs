//! Typed, non-owning views of device memory and the synchronous copies between them and the host.

pub(crate) mod buffer;

pub use buffer::DeviceBuffer;

use core::ffi::c_void;
use core::fmt;
use core::marker::PhantomData;
use core::ops::{Bound, RangeBounds};

use bytemuck::Pod;

use crate::device::{Context, Device};
use crate::error::Error;
use crate::sys;
use crate::wait::{self, Returns};

/// The contexts whose devices reach a view's memory directly besides the view's own, for as long as
/// the view lives: the view borrows what makes this true (the grant that names them, the peer-access
/// guard under which a peer view reads its owner's memory, or the owned buffer whose kept access set
/// names them). Empty for a buffer's own memory and a grant to one device.
#[derive(Clone, Copy)]
pub(crate) enum Reach<'mem> {
    /// Contexts borrowed from their owners: a grant's list.
    Borrowed(&'mem [&'mem Context]),
    /// Contexts an owner keeps (retained by it, borrowed by the view): an owned buffer's access set,
    /// or the context of the `DeviceBuffer` whose memory a peer view reads.
    Owned(&'mem [Context]),
}

impl Reach<'_> {
    /// No other device reaches the memory.
    pub(crate) const NONE: Reach<'static> = Reach::Borrowed(&[]);

    /// Whether one of the contexts belongs to `device`.
    pub(crate) fn contains(self, device: Device) -> bool {
        match self {
            Reach::Borrowed(contexts) => contexts.iter().any(|c| c.device() == device),
            Reach::Owned(contexts) => contexts.iter().any(|c| c.device() == device),
        }
    }
}

/// A read-only view of `len` values of `T` in device memory, reachable from the device of its context.
///
/// Made from an [`Access`](crate::Access) or a [`DeviceBuffer`]; it borrows what it
/// views, so it cannot outlive the mapping or buffer. `T` is plain data ([`Pod`]): any bytes the device
/// holds are a valid `T`. A view has no write method; [`DeviceSliceMut`] has.
///
/// Besides its own device, a view knows which other devices can reach its memory while it lives
/// ([`reachable_from`](DeviceSlice::reachable_from)): the other devices of its VMM grant, or the owner
/// of a peer view's memory. Copies between devices take the direct path only where one of them does.
///
/// # Lifetimes
/// `'mem` is the borrow of the memory's owner (the grant or the buffer), of the context copies run in, and
/// of whatever opens the memory to other devices (the grant's list of contexts, or a peer guard).
pub struct DeviceSlice<'mem, T> {
    ptr: sys::CUdeviceptr,
    len: usize,
    context: &'mem Context,
    reach: Reach<'mem>,
    /// Shared access to `len` values of `T` for `'mem`: covariant; `Send`/`Sync` only where `&[T]` is.
    _data: PhantomData<&'mem [T]>,
}

/// A writable view of `len` values of `T` in device memory, reachable from the device of its context.
///
/// Exclusive over its virtual range, like `&mut [T]`: made only from a
/// [`ReadWrite`](crate::ReadWrite) grant or a [`DeviceBuffer`] borrowed mutably.
/// One physical allocation mapped twice (an alias) is reached through two ranges, so two such views
/// can reach the same bytes; device bytes are never Rust memory and every `T` is plain data, so that
/// is a data race on the device, not undefined behaviour in Rust (see the README on aliases).
///
/// # Lifetimes
/// `'mem` is the exclusive borrow of the memory's owner, and the borrow of the context copies run in and
/// of whatever opens the memory to other devices.
pub struct DeviceSliceMut<'mem, T> {
    ptr: sys::CUdeviceptr,
    len: usize,
    context: &'mem Context,
    reach: Reach<'mem>,
    /// Exclusive access to `len` values of `T` for `'mem`: invariant in `T`, as `&mut [T]`; `Send`/`Sync`
    /// only where `&mut [T]` is.
    _data: PhantomData<&'mem mut [T]>,
}

impl<T> Clone for DeviceSlice<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DeviceSlice<'_, T> {}

impl<T> fmt::Debug for DeviceSlice<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        debug_view(f, "DeviceSlice", self.ptr, self.len, self.context.device())
    }
}
impl<T> fmt::Debug for DeviceSliceMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        debug_view(
            f,
            "DeviceSliceMut",
            self.ptr,
            self.len,
            self.context.device(),
        )
    }
}

fn debug_view(
    f: &mut fmt::Formatter<'_>,
    name: &str,
    ptr: u64,
    len: usize,
    device: Device,
) -> fmt::Result {
    f.debug_struct(name)
        .field("ptr", &format_args!("{ptr:#x}"))
        .field("len", &len)
        .field("device", &device)
        .finish()
}

/// `[start, end)` of `range` over `0..len`, or a clear error.
fn bounds(range: impl RangeBounds<usize>, len: usize) -> Result<(usize, usize), Error> {
    range_bounds(range, len, "slice range")
}

/// `[start, end)` of `range` over `0..len`, or a clear error naming the range `what`.
pub(crate) fn range_bounds(
    range: impl RangeBounds<usize>,
    len: usize,
    what: &'static str,
) -> Result<(usize, usize), Error> {
    let start = match range.start_bound() {
        Bound::Included(&s) => Some(s),
        Bound::Excluded(&s) => s.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => Some(len),
    };
    let (Some(start), Some(end)) = (start, end) else {
        return Err(Error::Overflow { what });
    };
    if start > end || end > len {
        return Err(Error::OutOfBounds {
            what,
            start,
            end,
            len,
        });
    }
    Ok((start, end))
}

/// The device address of element `index` (which is at most the length of a live view, so the byte
/// offset fits the mapped range and cannot overflow).
fn offset<T>(ptr: sys::CUdeviceptr, index: usize) -> sys::CUdeviceptr {
    ptr + (index * size_of::<T>()) as u64
}

fn check_len(expected: usize, found: usize) -> Result<(), Error> {
    if expected == found {
        Ok(())
    } else {
        Err(Error::LengthMismatch { expected, found })
    }
}

/// `cuMemcpyDtoD` of `bytes` from `src` to `dst` in `context`, awaited.
///
/// The caller guarantees that both ranges are device memory reachable from `context`'s device for the
/// duration of the call (the views' invariants and their `reach`), `dst` exclusive.
pub(crate) fn copy_device_to_device(
    context: &Context,
    dst: sys::CUdeviceptr,
    src: sys::CUdeviceptr,
    bytes: usize,
) -> Result<(), Error> {
    if bytes == 0 {
        return Ok(());
    }
    // `cuMemcpyDtoD` returns at once: the wait after it makes the copy finished before either view
    // can go away, also where the copy failed after being queued (see `wait::synchronous`).
    wait::synchronous(context.as_raw(), Returns::Early, || {
        // SAFETY: both ranges are `bytes` of device memory reachable from the current context (the
        // caller's guarantee; `synchronous` binds it). Their virtual ranges cannot overlap (`dst` is
        // exclusive, `src` shared); through aliases the physical memory may, which leaves
        // unspecified bytes in device memory but touches no Rust memory.
        unsafe { sys::cuMemcpyDtoD_v2(dst, src, bytes) }
    })
}

/// The accessors both view types share: they read the same fields.
macro_rules! view_accessors {
    () => {
        /// The number of elements.
        #[must_use]
        pub fn len(&self) -> usize {
            self.len
        }

        /// Whether the view has no elements.
        #[must_use]
        pub fn is_empty(&self) -> bool {
            self.len == 0
        }

        /// The device whose context the view's copies run in.
        #[must_use]
        pub fn device(&self) -> Device {
            self.context.device()
        }

        /// The device address of the first element: an escape hatch that owns nothing and frees nothing.
        #[must_use]
        pub fn as_raw_ptr(&self) -> sys::CUdeviceptr {
            self.ptr
        }

        /// Whether `device` can read and write this memory directly while the view lives: the
        /// view's own device, every device of the VMM grant it came from, and for a peer view the
        /// device that owns the memory. A device for which this is `false` may still be physically
        /// linked: the link is opened by a grant
        /// ([`Mapping::grant_all`](crate::Mapping::grant_all),
        /// [`Mapping::grant_revocable`](crate::Mapping::grant_revocable)) or, for `cuMemAlloc`
        /// memory, by a [`PeerAccess`](crate::PeerAccess) guard and
        /// [`DeviceBuffer::peer_slice`](crate::DeviceBuffer::peer_slice).
        #[must_use]
        pub fn reachable_from(&self, device: Device) -> bool {
            device == self.context.device() || self.reach.contains(device)
        }
    };
}

impl<'mem, T: Pod> DeviceSlice<'mem, T> {
    /// A view of `[ptr, ptr + len * size_of::<T>())`, which the caller guarantees is device memory
    /// reachable from `context`'s device, and from every device `reach` names, for `'mem`.
    pub(crate) fn from_granted(
        ptr: sys::CUdeviceptr,
        len: usize,
        context: &'mem Context,
        reach: Reach<'mem>,
    ) -> DeviceSlice<'mem, T> {
        DeviceSlice {
            ptr,
            len,
            context,
            reach,
            _data: PhantomData,
        }
    }

    /// The address, length and context: for the copy routines of this crate.
    pub(crate) fn parts(&self) -> (sys::CUdeviceptr, usize, &'mem Context) {
        (self.ptr, self.len, self.context)
    }

    view_accessors!();

    /// A sub-view of the elements in `range`.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] where `range` is not inside `0..len`.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceSlice<'mem, T>, Error> {
        let (start, end) = bounds(range, self.len)?;
        Ok(DeviceSlice {
            ptr: offset::<T>(self.ptr, start),
            len: end - start,
            ..*self
        })
    }

    /// `cuMemcpyDtoH` — copy the view into `dst`, which must have the same length. Returns when the copy
    /// has finished.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] where the lengths differ; the driver's error otherwise.
    #[doc(alias = "cuMemcpyDtoH")]
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<(), Error> {
        check_len(self.len, dst.len())?;
        // SAFETY: `dst` is writable for its `len` values, borrowed exclusively for the call.
        unsafe { self.copy_to_host_raw(dst.as_mut_ptr()) }
    }

    /// `cuMemcpyDtoH` of the whole view to `dst`, a raw pointer: as
    /// [`copy_to_host`](DeviceSlice::copy_to_host), for host memory that no reference may cover yet
    /// (an unfilled pinned buffer). Returns when the copy has finished.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `self.len()` values of `T`, and nothing else may read or
    /// write them until this returns.
    pub(crate) unsafe fn copy_to_host_raw(&self, dst: *mut T) -> Result<(), Error> {
        if self.len == 0 {
            return Ok(());
        }
        let bytes = size_of::<T>().saturating_mul(self.len);
        let ptr = dst.cast::<c_void>();
        // A copy to host memory returns once it has finished; a failed one may still have been
        // queued, and is then waited for before `dst` is given back (see `wait::synchronous`).
        wait::synchronous(self.context.as_raw(), Returns::WhenDone, || {
            // SAFETY: `dst` is writable for `bytes` bytes (the caller's contract; a view's length
            // times `size_of::<T>()` fits `usize`, as its device range does) and any bytes are a
            // valid `T` (`Pod`); the source range is device memory reachable from the current
            // context (the view's invariant; `synchronous` binds it).
            unsafe { sys::cuMemcpyDtoH_v2(ptr, self.ptr, bytes) }
        })
    }

    /// Copies the view into a new `Vec`.
    ///
    /// # Errors
    /// The driver's error, if any.
    pub fn to_vec(&self) -> Result<Vec<T>, Error> {
        let mut out = vec![T::zeroed(); self.len];
        self.copy_to_host(&mut out)?;
        Ok(out)
    }
}

impl<'mem, T: Pod> DeviceSliceMut<'mem, T> {
    /// A writable view; the caller guarantees exclusive, writable device memory reachable from
    /// `context`'s device, and from every device `reach` names, for `'mem`.
    pub(crate) fn from_granted(
        ptr: sys::CUdeviceptr,
        len: usize,
        context: &'mem Context,
        reach: Reach<'mem>,
    ) -> DeviceSliceMut<'mem, T> {
        DeviceSliceMut {
            ptr,
            len,
            context,
            reach,
            _data: PhantomData,
        }
    }

    view_accessors!();

    /// A read-only view of the same elements, for as long as it is borrowed.
    #[must_use]
    pub fn as_slice(&self) -> DeviceSlice<'_, T> {
        DeviceSlice {
            ptr: self.ptr,
            len: self.len,
            context: self.context,
            reach: self.reach,
            _data: PhantomData,
        }
    }

    /// A read-only view of the same elements for the whole of `'mem`, giving up the writable one (as
    /// `&'mem mut [T]` becomes `&'mem [T]`).
    #[must_use]
    pub fn into_slice(self) -> DeviceSlice<'mem, T> {
        DeviceSlice {
            ptr: self.ptr,
            len: self.len,
            context: self.context,
            reach: self.reach,
            _data: PhantomData,
        }
    }

    /// A writable sub-view of the elements in `range`.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] where `range` is not inside `0..len`.
    pub fn slice_mut(
        &mut self,
        range: impl RangeBounds<usize>,
    ) -> Result<DeviceSliceMut<'_, T>, Error> {
        let (start, end) = bounds(range, self.len)?;
        Ok(DeviceSliceMut {
            ptr: offset::<T>(self.ptr, start),
            len: end - start,
            context: self.context,
            reach: self.reach,
            _data: PhantomData,
        })
    }

    /// The writable sub-view of the elements in `range`, for the whole of `'mem`: as
    /// [`slice_mut`](DeviceSliceMut::slice_mut), consuming the view, so that a sub-view can be named in
    /// one expression (`access.slice_mut::<f32>()?.into_slice_mut(..n)?`).
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] where `range` is not inside `0..len`.
    pub fn into_slice_mut(
        self,
        range: impl RangeBounds<usize>,
    ) -> Result<DeviceSliceMut<'mem, T>, Error> {
        let (start, end) = bounds(range, self.len)?;
        Ok(DeviceSliceMut {
            ptr: offset::<T>(self.ptr, start),
            len: end - start,
            ..self
        })
    }

    /// Splits into two disjoint writable views, `[0, mid)` and `[mid, len)`.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] where `mid > len`.
    pub fn split_at_mut(
        self,
        mid: usize,
    ) -> Result<(DeviceSliceMut<'mem, T>, DeviceSliceMut<'mem, T>), Error> {
        if mid > self.len {
            return Err(Error::OutOfBounds {
                what: "split point",
                start: mid,
                end: mid,
                len: self.len,
            });
        }
        let tail = DeviceSliceMut {
            ptr: offset::<T>(self.ptr, mid),
            len: self.len - mid,
            ..self
        };
        Ok((DeviceSliceMut { len: mid, ..self }, tail))
    }

    /// `cuMemcpyHtoD` — copy `src`, which must have the same length, into the view. Returns when the copy
    /// has finished.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] where the lengths differ; the driver's error otherwise.
    #[doc(alias = "cuMemcpyHtoD")]
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<(), Error> {
        check_len(self.len, src.len())?;
        if self.len == 0 {
            return Ok(());
        }
        let (ptr, bytes) = (src.as_ptr().cast::<c_void>(), size_of_val(src));
        // `cuMemcpyHtoD` may return before its DMA has reached device memory: the wait after it
        // makes the copy finished before `src` or the view can go away (see `wait::synchronous`).
        wait::synchronous(self.context.as_raw(), Returns::Early, || {
            // SAFETY: `src` is readable for `bytes` bytes; the destination is this view's writable
            // device memory reachable from the current context (the view's invariant;
            // `synchronous` binds it).
            unsafe { sys::cuMemcpyHtoD_v2(self.ptr, ptr, bytes) }
        })
    }

    /// `cuMemcpyDtoD` — copy `src`, which must have the same length and be reachable from this view's
    /// device ([`src.reachable_from(self.device())`](DeviceSlice::reachable_from)), into the view, in
    /// this view's context. Returns when the copy has finished.
    ///
    /// Between two devices this reads over the peer link: `src` is then a view of a VMM grant that
    /// includes this view's device, or a view of memory this view's device owns. For views of two
    /// devices that cannot reach each other, [`copy_between`](crate::copy_between) takes the staged path.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] where the lengths differ; [`Error::NoPeerAccess`] where `src` is not
    /// reachable from this view's device (checked before any driver call); the driver's error otherwise.
    #[doc(alias = "cuMemcpyDtoD")]
    pub fn copy_from_device(&mut self, src: &DeviceSlice<'_, T>) -> Result<(), Error> {
        check_len(self.len, src.len)?;
        if !src.reachable_from(self.device()) {
            return Err(Error::NoPeerAccess {
                device: self.device().as_raw(),
                owner: src.device().as_raw(),
            });
        }
        copy_device_to_device(self.context, self.ptr, src.ptr, self.len * size_of::<T>())
    }

    /// `cuMemcpyDtoH` — copy the view into `dst`; see [`DeviceSlice::copy_to_host`].
    ///
    /// # Errors
    /// As [`DeviceSlice::copy_to_host`].
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<(), Error> {
        self.as_slice().copy_to_host(dst)
    }

    /// Copies the view into a new `Vec`.
    ///
    /// # Errors
    /// The driver's error, if any.
    pub fn to_vec(&self) -> Result<Vec<T>, Error> {
        self.as_slice().to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::bounds;
    use crate::error::Error;
    use proptest::prelude::*;

    proptest! {
        /// `bounds` accepts exactly the ranges inside `0..len`, for every kind of range.
        #[test]
        fn bounds_accept_exactly_the_ranges_inside(a in any::<usize>(), b in any::<usize>(), len in any::<usize>()) {
            prop_assert_eq!(bounds(a..b, len).is_ok(), a <= b && b <= len);
            let inclusive_ok = b != usize::MAX && a <= b + 1 && b < len;
            prop_assert_eq!(bounds(a..=b, len).is_ok(), inclusive_ok);
            prop_assert_eq!(bounds(a.., len).is_ok(), a <= len);
            prop_assert_eq!(bounds(..b, len).is_ok(), b <= len);
            if let Ok((s, e)) = bounds(a..b, len) {
                prop_assert_eq!((s, e), (a, b));
            }
        }
    }

    #[test]
    fn bounds_edges() {
        assert_eq!(bounds(.., 10), Ok((0, 10)));
        assert_eq!(bounds(3..3, 3), Ok((3, 3)));
        assert!(matches!(
            bounds(..=usize::MAX, usize::MAX),
            Err(Error::Overflow { .. })
        ));
        let excluded_start = (
            core::ops::Bound::Excluded(usize::MAX),
            core::ops::Bound::Unbounded,
        );
        assert!(matches!(
            bounds(excluded_start, 5),
            Err(Error::Overflow { .. })
        ));
        assert!(matches!(
            bounds(core::ops::Range { start: 4, end: 2 }, 10),
            Err(Error::OutOfBounds {
                start: 4,
                end: 2,
                len: 10,
                ..
            })
        ));
    }
}
