//! Ordinary device allocations: `cuMemAlloc` / `cuMemFree`.

use core::fmt;
use core::marker::PhantomData;

use bytemuck::Pod;

use crate::device::Context;
use crate::error::{Error, check};
use crate::sys;
use crate::view::{DeviceSlice, DeviceSliceMut, Reach};

/// `len` values of `T` in memory from `cuMemAlloc`, freed with `cuMemFree` on drop.
///
/// The buffer's memory always comes from its own `cuMemAlloc`: there is no constructor from a raw
/// address, so a VMM address (owned by a mapping, reservation and physical allocation) can never be
/// wrapped in a buffer that would `cuMemFree` it.
///
/// # Ownership
/// The buffer owns a clone of the [`Context`] it was allocated in (see
/// [Clones share one retain](Context#clones-share-one-retain)), so the context stays retained while the
/// buffer lives and the buffer has no lifetime: it can live in a struct field beside, or instead of,
/// the `Context` it was made with. Its views borrow the buffer.
///
/// # Zero-sized types
/// A zero-sized `T` has no device memory to hold, and every length of it would be zero bytes at
/// address 0. [`zeroed`](DeviceBuffer::zeroed) and [`from_host`](DeviceBuffer::from_host) refuse it
/// when the program is built (a `const` assertion, evaluated where the constructor is compiled for
/// that `T`, so `cargo check` does not report it), and again at run time, before any driver call,
/// with [`Error::ZeroSize`]:
///
/// ```compile_fail,E0080
/// # fn main() -> Result<(), cuda_vmm::Error> {
/// let context = cuda_vmm::Context::new(cuda_vmm::Device::get(0)?)?;
/// let units = cuda_vmm::DeviceBuffer::<()>::zeroed(&context, 1)?; // does not build
/// # Ok(())
/// # }
/// ```
pub struct DeviceBuffer<T: Pod> {
    ptr: sys::CUdeviceptr,
    len: usize,
    context: Context,
    /// Owns `len` values of `T`: `Send`/`Sync` as `T` is (plain data always is).
    _data: PhantomData<T>,
}

impl<T: Pod> fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("device", &self.context.device())
            .finish()
    }
}

impl<T: Pod> DeviceBuffer<T> {
    /// `cuMemAlloc` + `cuMemsetD8` — allocate `len` values of `T` on `context`'s device, zero-filled
    /// (all-zero bytes are a valid `T`: `Pod` implies `Zeroable`).
    ///
    /// A zero-sized `T` does not build (see [Zero-sized types](DeviceBuffer#zero-sized-types)).
    ///
    /// # Errors
    /// [`Error::Overflow`] where the byte size overflows; [`Error::ZeroSize`] for a zero-sized `T`
    /// (the run-time check behind the build-time one); the driver's error otherwise (e.g.
    /// [`DriverError::OUT_OF_MEMORY`](crate::DriverError::OUT_OF_MEMORY)).
    #[doc(alias = "cuMemAlloc")]
    pub fn zeroed(context: &Context, len: usize) -> Result<DeviceBuffer<T>, Error> {
        const {
            assert!(
                size_of::<T>() != 0,
                "DeviceBuffer of a zero-sized type: it would hold no memory"
            );
        }
        let buffer = DeviceBuffer::uninit_zeroable(context, len)?;
        if buffer.ptr != 0 {
            // The fill has finished when this returns, also where it failed after being queued
            // (dropping the buffer then frees memory that nothing writes any more).
            crate::wait::synchronous(context.as_raw(), crate::wait::Returns::Early, || {
                // SAFETY: `[ptr, ptr + len * size_of::<T>())` is this buffer's own memory, in the
                // current context (`synchronous` binds it).
                unsafe { sys::cuMemsetD8_v2(buffer.ptr, 0, len * size_of::<T>()) }
            })?;
        }
        Ok(buffer)
    }

    /// `cuMemAlloc` + `cuMemcpyHtoD` — a buffer holding a copy of `data`.
    ///
    /// A zero-sized `T` does not build (see [Zero-sized types](DeviceBuffer#zero-sized-types)).
    ///
    /// # Errors
    /// As [`DeviceBuffer::zeroed`].
    #[doc(alias = "cuMemAlloc")]
    pub fn from_host(context: &Context, data: &[T]) -> Result<DeviceBuffer<T>, Error> {
        const {
            assert!(
                size_of::<T>() != 0,
                "DeviceBuffer of a zero-sized type: it would hold no memory"
            );
        }
        let mut buffer = DeviceBuffer::uninit_zeroable(context, data.len())?;
        buffer.as_mut_slice().copy_from_host(data)?;
        Ok(buffer)
    }

    /// Allocates without initialising. The bytes are unspecified but any bytes are a valid `T` (`Pod`),
    /// and device memory is never read as Rust memory without a copy.
    ///
    /// # Errors
    /// As [`byte_size`], before any driver call; the driver's error otherwise.
    fn uninit_zeroable(context: &Context, len: usize) -> Result<DeviceBuffer<T>, Error> {
        let bytes = byte_size::<T>(len)?;
        let mut ptr: sys::CUdeviceptr = 0;
        if bytes > 0 {
            context.bind_to_thread()?;
            // SAFETY: `ptr` is writable for the call; a context is current (bound just above).
            check(unsafe { sys::cuMemAlloc_v2(&raw mut ptr, bytes) })?;
        }
        Ok(DeviceBuffer {
            ptr,
            len,
            context: context.clone(),
            _data: PhantomData,
        })
    }

    /// The number of elements.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The context the memory belongs to (the buffer's own clone of it).
    #[must_use]
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// A read-only view of the whole buffer.
    #[must_use]
    pub fn as_slice(&self) -> DeviceSlice<'_, T> {
        DeviceSlice::from_granted(self.ptr, self.len, &self.context, Reach::NONE)
    }

    /// A writable view of the whole buffer.
    #[must_use]
    pub fn as_mut_slice(&mut self) -> DeviceSliceMut<'_, T> {
        DeviceSliceMut::from_granted(self.ptr, self.len, &self.context, Reach::NONE)
    }

    /// `cuMemFree` — free the buffer and report the driver's answer, which `drop` ignores.
    ///
    /// # Errors
    /// The driver's error, if any.
    #[doc(alias = "cuMemFree")]
    pub fn free(mut self) -> Result<(), Error> {
        let freed = self.free_raw();
        // Freed, or refused for good: `drop` frees nothing more and only releases the context.
        self.ptr = 0;
        freed
    }

    fn free_raw(&self) -> Result<(), Error> {
        if self.ptr == 0 {
            return Ok(());
        }
        self.context.bind_to_thread()?;
        // SAFETY: `ptr` came from `cuMemAlloc` in this context and is freed once (`free` zeroes it, so
        // `drop` does not free it again).
        // Every view borrows the buffer, so none is alive; their copies finished before they returned.
        Ok(check(unsafe { sys::cuMemFree_v2(self.ptr) })?)
    }
}

/// The size in bytes of `len` values of `T`, for a buffer.
///
/// A zero-sized `T` is refused here, at run time, although the public constructors also refuse it at
/// compile time: their `const` assertion is evaluated only where they are compiled to machine code for
/// that `T` (not by `cargo check`, nor for a constructor added later without it), so this is the check
/// the buffer's soundness rests on. Without it, any `len` would be zero bytes: a buffer of `usize::MAX`
/// elements at address 0, whose copies the driver answers with success.
///
/// # Errors
/// [`Error::ZeroSize`] for a zero-sized `T`; [`Error::Overflow`] where the size does not fit `usize`.
fn byte_size<T>(len: usize) -> Result<usize, Error> {
    if size_of::<T>() == 0 {
        return Err(Error::ZeroSize {
            what: "element size",
        });
    }
    len.checked_mul(size_of::<T>()).ok_or(Error::Overflow {
        what: "buffer size",
    })
}

impl<T: Pod> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        // The error is ignored: `drop` cannot return it, and memory the driver refuses to free cannot be
        // freed later. Call `free` to see it.
        let _ = self.free_raw();
    }
}

#[cfg(test)]
mod tests {
    use super::byte_size;
    use crate::error::Error;

    #[test]
    fn zero_sized_elements_are_refused() {
        for len in [0, 1, usize::MAX] {
            assert_eq!(
                byte_size::<()>(len),
                Err(Error::ZeroSize {
                    what: "element size"
                })
            );
            assert_eq!(
                byte_size::<[u32; 0]>(len),
                Err(Error::ZeroSize {
                    what: "element size"
                })
            );
        }
        assert_eq!(
            Error::ZeroSize {
                what: "element size"
            }
            .to_string(),
            "element size must not be zero"
        );
    }

    #[test]
    fn byte_sizes_are_exact_or_overflow() {
        assert_eq!(byte_size::<u8>(0), Ok(0));
        assert_eq!(byte_size::<u32>(0), Ok(0));
        assert_eq!(byte_size::<u32>(3), Ok(12));
        assert_eq!(byte_size::<u8>(usize::MAX), Ok(usize::MAX));
        assert_eq!(byte_size::<u16>(usize::MAX / 2), Ok(usize::MAX - 1));
        assert_eq!(
            byte_size::<u16>(usize::MAX / 2 + 1),
            Err(Error::Overflow {
                what: "buffer size"
            })
        );
    }
}
