//! [`PinnedBuffer`]: page-locked host memory, the host side of copies that overlap other work.

use core::ffi::c_void;
use core::fmt;
use core::marker::PhantomData;
use core::ops::{Deref, DerefMut};
use core::ptr::{self, NonNull};

use bytemuck::Pod;

use crate::device::{Context, Device};
use crate::error::{DriverError, Error, Result, check};
use crate::sys;

#[cfg(doc)]
use super::scope::scope;

/// `len` values of `T` in page-locked (pinned) host memory, the host memory that copies on a stream
/// overlap with other work: `cuMemHostAlloc` with `CU_MEMHOSTALLOC_PORTABLE`, so usable by the
/// streams of every device. Freed on drop (`cuMemFreeHost`).
///
/// Read and written as a `[T]` (it dereferences to one), and lent to queued copies inside [`scope`]
/// (`&buffer` as a source, `&mut buffer` or `&mut buffer[range]` as a destination), over and over:
/// pinning memory costs far more than copying it, so keep a buffer rather than making one per copy.
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
    /// host link's speed). Write it only through [`as_raw_mut_ptr`](PinnedBuffer::as_raw_mut_ptr).
    ///
    /// # Safety
    /// No reference to the values (`Deref`, `DerefMut`, [`as_slice`](PinnedBuffer::as_slice), ...)
    /// may be made, and nothing may read them, before every value has been written: by copies of
    /// the driver that have completed, or by the host through the raw pointer. A buffer dropped
    /// before that is merely freed.
    ///
    /// # Errors
    /// As [`zeroed`](PinnedBuffer::zeroed).
    pub(crate) unsafe fn unfilled(context: &Context, len: usize) -> Result<PinnedBuffer<T>, Error> {
        PinnedBuffer::alloc(context, len)
    }

    /// The start of the values, as a raw pointer made from the allocation itself (no reference to
    /// the values is made): for the driver's copies into an [`unfilled`](PinnedBuffer::unfilled)
    /// buffer.
    pub(crate) fn as_raw_mut_ptr(&mut self) -> *mut T {
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

    /// The values, as a mutable slice.
    #[must_use]
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        self
    }
}

impl<T: Pod> Deref for PinnedBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `len` initialised values of `T` (filled by the constructor), aligned (checked when
        // made), owned by `self` and borrowed shared with it. Queued work writes the memory only
        // while `self` is borrowed mutably for a scope, during which this cannot be called.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Pod> DerefMut for PinnedBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as for `deref`, borrowed exclusively with `self`, which no queued work holds now.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
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
    use super::host_bytes;
    use crate::Error;

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
