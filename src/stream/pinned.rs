//! [`PinnedBuffer`]: page-locked host memory, the host side of copies that overlap other work.

use core::ffi::c_void;
use core::fmt;
use core::marker::PhantomData;
use core::ops::{Deref, RangeBounds};
use core::ptr::{self, NonNull};

use bytemuck::Pod;

use crate::device::{Context, Device};
use crate::error::{DriverError, Error, Result, check};
use crate::sys;
use crate::view::range_bounds;

#[cfg(doc)]
use super::scope::scope;

/// `len` values of `T` in page-locked (pinned) host memory, the host memory that copies on a stream
/// overlap with other work: `cuMemHostAlloc` with `CU_MEMHOSTALLOC_PORTABLE`, so usable by the
/// streams of every device. Freed on drop (`cuMemFreeHost`).
///
/// Read as a `[T]` (it dereferences to one), written through [`copy_from_slice`], [`fill`] and
/// [`fill_with`] (or a [`PinnedSliceMut`] of part of it), and lent to queued copies inside
/// [`scope`] (`&buffer` as a source; `&mut buffer`, or a [`PinnedSliceMut`] from
/// [`slice_mut`](PinnedBuffer::slice_mut) or [`chunks_mut`](PinnedBuffer::chunks_mut), as a
/// destination), over and over: pinning memory costs far more than copying it, so keep a buffer
/// rather than making one per copy.
///
/// # No `&mut [T]`
/// The buffer never hands out a `&mut [T]` (nor a `&mut T`). Page-locked memory is what a
/// device-to-host copy writes asynchronously: a library that takes a `&mut [T]` as the destination
/// of a copy it queues and believes pageable (cudarc's `memcpy_dtoh`, whose driver call then
/// returns before the DMA has written a byte; measured on an H200) would return with the DMA still
/// writing, and a read of the buffer after the call would race it. Only this crate's own copies
/// write it, and they borrow it until their scope has waited.
///
/// ```compile_fail,E0596
/// # use cuda_vmm::{Context, Device, PinnedBuffer};
/// # fn main() -> Result<(), cuda_vmm::Error> {
/// # let context = Context::new(Device::get(0)?)?;
/// let mut buffer = PinnedBuffer::<u32>::zeroed(&context, 1024)?;
/// let slice: &mut [u32] = &mut buffer; // cudarc's `memcpy_dtoh` would write it after returning
/// # Ok(())
/// # }
/// ```
///
/// [`copy_from_slice`]: PinnedBuffer::copy_from_slice
/// [`fill`]: PinnedBuffer::fill
/// [`fill_with`]: PinnedBuffer::fill_with
///
/// The buffer keeps the primary context it was pinned in retained: a primary context released by
/// its last user is reset, which would unpin the memory while the buffer still owned it. It makes
/// that context current to free the memory, on whichever thread drops it.
///
/// Made zeroed ([`zeroed`](PinnedBuffer::zeroed)) or copied ([`from_slice`](PinnedBuffer::from_slice)):
/// every `T` is plain data ([`Pod`]), so the memory always holds valid values. A zero-sized `T` does
/// not build (a `const` assertion in the constructors) and is refused at run time too.
pub struct PinnedBuffer<T: Pod> {
    ptr: NonNull<T>,
    len: usize,
    /// Declared after the memory's fields; the memory is freed in `Drop::drop`, before the context is
    /// released.
    context: Context,
    /// Owns `len` values of `T`.
    _data: PhantomData<T>,
}

// SAFETY: the buffer owns its memory outright, like a `Vec<T>`; page-locked host memory has no thread
// affinity, and `Context` is `Send`.
unsafe impl<T: Pod + Send> Send for PinnedBuffer<T> {}
// SAFETY: `&PinnedBuffer<T>` gives only `&[T]`, which is `Sync` where `T` is.
unsafe impl<T: Pod + Sync> Sync for PinnedBuffer<T> {}

impl<T: Pod> fmt::Debug for PinnedBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("device", &self.context.device())
            .finish()
    }
}

impl<T: Pod> PinnedBuffer<T> {
    /// `cuMemHostAlloc` — `len` zeroed values of `T` in page-locked host memory, pinned in
    /// `context` (and usable by every context).
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for a zero length or a zero-sized `T`; [`Error::Overflow`] where the byte
    /// size does not fit `usize`; both before any driver call. The driver's error otherwise (e.g.
    /// [`DriverError::OUT_OF_MEMORY`] when that much memory cannot be pinned).
    #[doc(alias = "cuMemHostAlloc")]
    pub fn zeroed(context: &Context, len: usize) -> Result<PinnedBuffer<T>, Error> {
        const {
            assert!(
                size_of::<T>() != 0,
                "PinnedBuffer of a zero-sized type: it would hold no memory"
            );
        }
        let buffer = PinnedBuffer::alloc(context, len)?;
        // SAFETY: `len * size_of::<T>()` writable bytes, owned by `buffer` and not yet shared; all-zero
        // bytes are a valid `T` (`Pod` implies `Zeroable`).
        unsafe { ptr::write_bytes(buffer.ptr.as_ptr(), 0, len) };
        Ok(buffer)
    }

    /// `cuMemHostAlloc` — a page-locked copy of `data`, pinned in `context`.
    ///
    /// # Errors
    /// As [`zeroed`](PinnedBuffer::zeroed) (an empty `data` is a zero length).
    #[doc(alias = "cuMemHostAlloc")]
    pub fn from_slice(context: &Context, data: &[T]) -> Result<PinnedBuffer<T>, Error> {
        const {
            assert!(
                size_of::<T>() != 0,
                "PinnedBuffer of a zero-sized type: it would hold no memory"
            );
        }
        let buffer = PinnedBuffer::alloc(context, data.len())?;
        // SAFETY: `buffer` owns `data.len()` writable values of `T`, not yet shared; `data` is
        // readable for as many, and Rust memory, so it cannot overlap memory just pinned.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), buffer.ptr.as_ptr(), data.len()) };
        Ok(buffer)
    }

    /// `cuMemHostAlloc` — `len` values of `T` in page-locked host memory that nothing here writes:
    /// for memory the driver's copies fill whole before anything reads it (an eviction's bytes),
    /// where zeroing first would cost more than the copies (a memset of 1 GiB against a copy at the
    /// host link's speed). Write it only through [`as_mut_ptr`](PinnedBuffer::as_mut_ptr).
    ///
    /// # Safety
    /// No reference to the values (`Deref`, [`as_slice`](PinnedBuffer::as_slice), ...)
    /// may be made, and nothing may read them, before every value has been written: by copies of
    /// the driver that have completed, or by the host through the raw pointer ([`as_mut_ptr`](PinnedBuffer::as_mut_ptr)). A buffer dropped
    /// before that is merely freed.
    ///
    /// # Errors
    /// As [`zeroed`](PinnedBuffer::zeroed).
    pub(crate) unsafe fn unfilled(context: &Context, len: usize) -> Result<PinnedBuffer<T>, Error> {
        PinnedBuffer::alloc(context, len)
    }

    /// The start of the values, as a raw pointer made from the allocation itself (no reference to
    /// the values is made): an escape hatch for raw driver copies. Writing through it is `unsafe`
    /// and the caller's to prove; the buffer is borrowed exclusively only for this call.
    #[must_use]
    pub fn as_mut_ptr(&mut self) -> *mut T {
        self.ptr.as_ptr()
    }

    /// Pins `len` values of `T`, uninitialised: the constructors fill them before handing the buffer
    /// out.
    fn alloc(context: &Context, len: usize) -> Result<PinnedBuffer<T>, Error> {
        let bytes = host_bytes::<T>(len)?;
        let context = Context::new(context.device())?;
        context.bind_to_thread()?;
        let mut raw: *mut c_void = ptr::null_mut();
        // SAFETY: `raw` is writable for the call; `context` is current (bound just above).
        check(unsafe { sys::cuMemHostAlloc(&raw mut raw, bytes, sys::CU_MEMHOSTALLOC_PORTABLE) })?;
        // The driver answers success only with memory; a null pointer would be its bug, reported as
        // the failure it would be.
        let ptr = NonNull::new(raw.cast::<T>()).ok_or(DriverError::OUT_OF_MEMORY)?;
        let buffer = PinnedBuffer {
            ptr,
            len,
            context,
            _data: PhantomData,
        };
        // Page-aligned in practice; checked, since a `T` may ask for more (dropping frees it).
        if !raw.addr().is_multiple_of(align_of::<T>()) {
            return Err(Error::NotAligned {
                what: "pinned host memory address",
                value: raw.addr(),
                granularity: align_of::<T>(),
            });
        }
        Ok(buffer)
    }

    /// The number of values.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no values (never: an empty buffer is refused when made).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device whose primary context the memory was pinned in (and which the buffer keeps
    /// retained).
    #[must_use]
    pub fn device(&self) -> Device {
        self.context.device()
    }

    /// The values, as a slice.
    #[must_use]
    pub fn as_slice(&self) -> &[T] {
        self
    }

    /// All the values, as a writable window of page-locked memory (no `&mut [T]`: see
    /// [No `&mut [T]`](PinnedBuffer#no-mut-t)).
    #[must_use]
    pub fn as_pinned_mut(&mut self) -> PinnedSliceMut<'_, T> {
        PinnedSliceMut {
            ptr: self.ptr,
            len: self.len,
            _memory: PhantomData,
        }
    }

    /// The values of `range`, as a writable window of page-locked memory.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] for a range outside the buffer.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<PinnedSliceMut<'_, T>> {
        self.as_pinned_mut().into_slice(range)
    }

    /// The values in windows of `chunk` values each (the last one shorter), in order: one
    /// destination per queued download, say.
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for a zero `chunk`.
    pub fn chunks_mut(&mut self, chunk: usize) -> Result<PinnedChunks<'_, T>> {
        self.as_pinned_mut().into_chunks(chunk)
    }

    /// Copies `src`, as long as the buffer, into it.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] where the lengths differ.
    pub fn copy_from_slice(&mut self, src: &[T]) -> Result<()> {
        self.as_pinned_mut().copy_from_slice(src)
    }

    /// Sets every value to `value`.
    pub fn fill(&mut self, value: T) {
        self.as_pinned_mut().fill(value);
    }

    /// Sets value `i` to `f(i)`, for every `i` in order.
    pub fn fill_with(&mut self, f: impl FnMut(usize) -> T) {
        self.as_pinned_mut().fill_with(f);
    }
}

/// Part of a [`PinnedBuffer`], borrowed exclusively: read as a `[T]`, written through
/// [`copy_from_slice`](PinnedSliceMut::copy_from_slice), [`fill`](PinnedSliceMut::fill) and
/// [`fill_with`](PinnedSliceMut::fill_with), and lent to a queued download as its destination
/// ([`ScopedStream::copy_to_host`](super::ScopedStream::copy_to_host)). It gives no `&mut [T]`, for
/// the reason the buffer gives none ([No `&mut [T]`](PinnedBuffer#no-mut-t)).
///
/// # Lifetimes
/// `'a` is the exclusive borrow of the buffer.
pub struct PinnedSliceMut<'a, T> {
    ptr: NonNull<T>,
    len: usize,
    /// The buffer's values, borrowed exclusively for `'a`: covariant in `'a`, invariant in `T`.
    _memory: PhantomData<&'a mut [T]>,
}

// SAFETY: an exclusive borrow of values in page-locked host memory, as `&mut [T]` is `Send` where
// `T` is.
unsafe impl<T: Send> Send for PinnedSliceMut<'_, T> {}
// SAFETY: `&PinnedSliceMut<T>` gives only `&[T]`, which is `Sync` where `T` is.
unsafe impl<T: Sync> Sync for PinnedSliceMut<'_, T> {}

impl<T: Pod> fmt::Debug for PinnedSliceMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedSliceMut")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl<T: Pod> Deref for PinnedSliceMut<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `len` initialised values of `T` of the buffer, borrowed exclusively by `self` for
        // `'a` and shared with the caller for the borrow of `self`. Queued work writes them only
        // while `self` (or the buffer) is lent to a scope, during which this cannot be called.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<'a, T: Pod> PinnedSliceMut<'a, T> {
    /// The window again, borrowed from this one for a shorter time.
    #[must_use]
    pub fn as_pinned_mut(&mut self) -> PinnedSliceMut<'_, T> {
        PinnedSliceMut {
            ptr: self.ptr,
            len: self.len,
            _memory: PhantomData,
        }
    }

    /// The values of `range`, borrowed from this window.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] for a range outside the window.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<PinnedSliceMut<'_, T>> {
        self.as_pinned_mut().into_slice(range)
    }

    /// The window in windows of `chunk` values each (the last one shorter), borrowed from it.
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for a zero `chunk`.
    pub fn chunks_mut(&mut self, chunk: usize) -> Result<PinnedChunks<'_, T>> {
        self.as_pinned_mut().into_chunks(chunk)
    }

    /// The values of `range` of this window.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] for a range outside the window ([`Error::Overflow`] for a bound
    /// past `usize::MAX`).
    pub fn into_slice(self, range: impl RangeBounds<usize>) -> Result<PinnedSliceMut<'a, T>> {
        let (start, end) = range_bounds(range, self.len, "pinned values")?;
        Ok(PinnedSliceMut {
            // SAFETY: `start <= len` (checked), so the pointer stays inside the window or one past
            // its end.
            ptr: unsafe { self.ptr.add(start) },
            len: end - start,
            _memory: PhantomData,
        })
    }

    /// The window split at `mid` into two disjoint windows.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] where `mid` is past the end.
    pub fn split_at(self, mid: usize) -> Result<(PinnedSliceMut<'a, T>, PinnedSliceMut<'a, T>)> {
        if mid > self.len {
            return Err(Error::OutOfBounds {
                what: "pinned values",
                start: mid,
                end: mid,
                len: self.len,
            });
        }
        let head = PinnedSliceMut {
            ptr: self.ptr,
            len: mid,
            _memory: PhantomData,
        };
        Ok((head, self.into_slice(mid..)?))
    }

    /// The window in windows of `chunk` values each (the last one shorter), in order.
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for a zero `chunk`.
    pub fn into_chunks(self, chunk: usize) -> Result<PinnedChunks<'a, T>> {
        if chunk == 0 {
            return Err(Error::ZeroSize {
                what: "chunk length",
            });
        }
        Ok(PinnedChunks { rest: self, chunk })
    }

    /// Copies `src`, as long as the window, into it.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] where the lengths differ.
    pub fn copy_from_slice(&mut self, src: &[T]) -> Result<()> {
        if src.len() != self.len {
            return Err(Error::LengthMismatch {
                expected: self.len,
                found: src.len(),
            });
        }
        // SAFETY: the window's `len` values are writable, borrowed exclusively by `self` (no queued
        // work holds them now); `src` is Rust memory, which cannot overlap pinned memory lent here.
        unsafe { ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr(), self.len) };
        Ok(())
    }

    /// Sets every value to `value`.
    pub fn fill(&mut self, value: T) {
        self.fill_with(|_| value);
    }

    /// Sets value `i` to `f(i)`, for every `i` in order.
    pub fn fill_with(&mut self, mut f: impl FnMut(usize) -> T) {
        for i in 0..self.len {
            let value = f(i);
            // SAFETY: `i < len`: a value of the window, writable and borrowed exclusively by `self`;
            // written by value, with no reference made to it.
            unsafe { self.ptr.as_ptr().add(i).write(value) };
        }
    }

    /// The start and the length, for the crate's queued downloads (which borrow `self` for their
    /// scope).
    pub(crate) fn raw_parts(&self) -> (*mut T, usize) {
        (self.ptr.as_ptr(), self.len)
    }
}

/// The windows of [`PinnedBuffer::chunks_mut`] and [`PinnedSliceMut::into_chunks`]: `chunk` values
/// each, the last one shorter, disjoint, in order.
pub struct PinnedChunks<'a, T> {
    /// What the next windows are cut from.
    rest: PinnedSliceMut<'a, T>,
    /// Not zero.
    chunk: usize,
}

impl<T: Pod> fmt::Debug for PinnedChunks<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedChunks")
            .field("rest", &self.rest)
            .field("chunk", &self.chunk)
            .finish()
    }
}

impl<'a, T: Pod> Iterator for PinnedChunks<'a, T> {
    type Item = PinnedSliceMut<'a, T>;

    fn next(&mut self) -> Option<PinnedSliceMut<'a, T>> {
        if self.rest.len == 0 {
            return None;
        }
        let take = self.chunk.min(self.rest.len);
        let next = PinnedSliceMut {
            ptr: self.rest.ptr,
            len: take,
            _memory: PhantomData,
        };
        // SAFETY: `take <= len`: the pointer stays inside the window or one past its end; the
        // window handed out and the rest are disjoint.
        self.rest.ptr = unsafe { self.rest.ptr.add(take) };
        self.rest.len -= take;
        Some(next)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.rest.len.div_ceil(self.chunk);
        (n, Some(n))
    }
}

impl<T: Pod> ExactSizeIterator for PinnedChunks<'_, T> {}

impl<T: Pod> Deref for PinnedBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `len` initialised values of `T` (filled by the constructor), aligned (checked when
        // made), owned by `self` and borrowed shared with it. Queued work writes the memory only
        // while `self` is borrowed mutably for a scope, during which this cannot be called.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Pod> Drop for PinnedBuffer<T> {
    fn drop(&mut self) {
        // `cuMemFreeHost` needs the context the memory was pinned in current, and the buffer may be
        // dropped on any thread. Where it cannot be made current the memory is leaked. Errors are
        // ignored: `drop` cannot return them, and memory the driver refuses to free cannot be freed
        // later.
        if self.context.bind_to_thread().is_ok() {
            // SAFETY: memory from `cuMemHostAlloc` in the current context, freed once. No queued work
            // uses it: work lent it only for a scope, and a scope ends by waiting for its work.
            let _ = unsafe { sys::cuMemFreeHost(self.ptr.as_ptr().cast::<c_void>()) };
        }
    }
}

/// The byte size of `len` values of `T` in a pinned buffer.
///
/// # Errors
/// [`Error::ZeroSize`] for a zero-sized `T` or a zero `len`; [`Error::Overflow`] where the size does
/// not fit `usize`.
fn host_bytes<T>(len: usize) -> Result<usize, Error> {
    if size_of::<T>() == 0 {
        return Err(Error::ZeroSize {
            what: "element size",
        });
    }
    if len == 0 {
        return Err(Error::ZeroSize {
            what: "pinned buffer length",
        });
    }
    len.checked_mul(size_of::<T>()).ok_or(Error::Overflow {
        what: "pinned buffer size",
    })
}

#[cfg(test)]
mod tests {
    use core::marker::PhantomData;
    use core::ptr::NonNull;

    use super::{PinnedSliceMut, host_bytes};
    use crate::error::Error;

    /// A window over ordinary memory: the windows' arithmetic needs no page-locked memory.
    fn window(values: &mut [u32]) -> PinnedSliceMut<'_, u32> {
        PinnedSliceMut {
            ptr: NonNull::from(&mut values[0]),
            len: values.len(),
            _memory: PhantomData,
        }
    }

    #[test]
    fn windows_cut_chunk_split_and_write_only_their_own_values() {
        let mut values: Vec<u32> = (0..10).collect();
        let mut all = window(&mut values);
        let lengths: Vec<usize> = all.chunks_mut(4).unwrap().map(|c| c.len()).collect();
        assert_eq!(lengths, [4, 4, 2]);
        assert_eq!(all.chunks_mut(4).unwrap().len(), 3);
        assert!(matches!(all.chunks_mut(0), Err(Error::ZeroSize { .. })));
        for (i, mut chunk) in all.chunks_mut(3).unwrap().enumerate() {
            let base = u32::try_from(i).unwrap() * 100;
            chunk.fill_with(|j| base + u32::try_from(j).unwrap());
        }
        assert_eq!(&*all, &[0, 1, 2, 100, 101, 102, 200, 201, 202, 300]);
        let mut middle = all.slice_mut(2..5).unwrap();
        assert_eq!(&*middle, &[2, 100, 101]);
        assert!(matches!(
            middle.copy_from_slice(&[7, 7]),
            Err(Error::LengthMismatch {
                expected: 3,
                found: 2
            })
        ));
        middle.copy_from_slice(&[7, 8, 9]).unwrap();
        assert!(matches!(
            all.slice_mut(4..11),
            Err(Error::OutOfBounds { .. })
        ));
        let (head, mut tail) = all.split_at(9).unwrap();
        assert_eq!((head.len(), tail.len()), (9, 1));
        tail.fill(5);
        assert!(window(&mut [1, 2]).split_at(3).is_err());
        assert_eq!(values, [0, 1, 7, 8, 9, 102, 200, 201, 202, 5]);
    }

    #[test]
    fn pinned_sizes_are_exact_or_refused() {
        assert_eq!(host_bytes::<u32>(3), Ok(12));
        assert_eq!(host_bytes::<u8>(usize::MAX), Ok(usize::MAX));
        assert_eq!(
            host_bytes::<u32>(0),
            Err(Error::ZeroSize {
                what: "pinned buffer length"
            })
        );
        assert_eq!(
            host_bytes::<()>(5),
            Err(Error::ZeroSize {
                what: "element size"
            })
        );
        assert_eq!(
            host_bytes::<u16>(usize::MAX / 2 + 1),
            Err(Error::Overflow {
                what: "pinned buffer size"
            })
        );
    }
}
