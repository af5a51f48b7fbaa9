//! What is queued: the operations, written once for every queue that takes them, a scope's
//! stream ([`ScopedStream`], whose methods are here) and a graph capture
//! ([`Capture`](super::graph::Capture)).

use core::ffi::c_void;
use core::marker::PhantomData;
use core::ptr;

use bytemuck::Pod;

use crate::error::{Error, check};
use crate::module::Function;
use crate::sys;

use super::Stream;
use super::launch::KernelArgs;
use super::lend::{
    DeviceInFlight, HostInFlight, HostSource, HostTarget, ScopedRead, ScopedWrite, lend, lend_mut,
    reachable, sealed,
};
use super::scope::ScopedStream;
#[cfg(doc)]
use super::{event::Event, pinned::PinnedBuffer, scope::scope};

/// Where queued work goes. Private to the crate: the soundness of every operation below rests on its
/// contract, which each implementation keeps.
///
/// # Contract
/// Work queued through a queue of `'a` is over before `'a` ends: a scope's stream is waited for
/// before its scope returns, and a capture records the work into a graph that borrows everything it
/// was given for `'a`, and is replayed only on scoped streams, each replay waited for in its turn.
pub(super) trait Queue<'a> {
    /// The stream the work goes to.
    fn stream(&self) -> &Stream;
    /// The token the views lent to the work get: the stream, and whether it is capturing.
    fn token(&self) -> sealed::Token;
    /// Binds the stream's context and checks that the stream takes the work now.
    fn admit(&self) -> Result<(), Error>;
    /// Records bytes that the operation about to be queued touches (`kernel`: an argument of the
    /// kernel launch about to be queued), before the driver call that queues it, so that what a
    /// refused call may have queued is recorded too. A capture keeps them for its graph's rebind;
    /// a scope's stream needs nothing.
    fn touch(&self, touch: sealed::Touch, kernel: bool) {
        let _ = (touch, kernel);
    }
}

fn check_len(expected: usize, found: usize) -> Result<(), Error> {
    if expected == found {
        Ok(())
    } else {
        Err(Error::LengthMismatch { expected, found })
    }
}

/// The body of [`ScopedStream::copy_from_host`], for any queue.
pub(super) fn copy_from_host<'a, T: Pod>(
    q: &impl Queue<'a>,
    dst: impl ScopedWrite<'a, T>,
    src: impl HostSource<'a, T>,
) -> Result<DeviceInFlight<'a, T>, Error> {
    let lent = lend_mut(dst, q.token())?;
    let dst = lent.view;
    let (src, len) = src.host_parts();
    check_len(dst.len(), len)?;
    reachable(&dst, q.stream().device())?;
    q.admit()?;
    if len > 0 {
        q.touch(
            sealed::Touch::device::<T>(dst.as_raw_ptr(), len, true),
            false,
        );
        q.touch(sealed::Touch::host(src, len, false), false);
        // SAFETY: `dst` is `len` values of device memory reachable from the stream's device
        // (checked above), lent exclusively to this copy for `'a` (a writable view, given up);
        // `src` is `len` readable values of host memory borrowed shared for `'a`, which nothing
        // writes meanwhile. The stream's context is current (`Queue::admit`). The work is over before
        // `'a` ends (the contract of `Queue`).
        check(unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                dst.as_raw_ptr(),
                src.cast::<c_void>(),
                len * size_of::<T>(),
                q.stream().raw,
            )
        })?;
    }
    Ok(lent.written())
}

/// The body of [`ScopedStream::copy_to_host`], for any queue.
pub(super) fn copy_to_host<'a, T: Pod>(
    q: &impl Queue<'a>,
    dst: impl HostTarget<'a, T>,
    src: impl ScopedRead<'a, T>,
) -> Result<HostInFlight<'a, T>, Error> {
    let lent = lend(src, q.token())?;
    let src = lent.view;
    let (dst, len) = dst.host_parts_mut();
    check_len(len, src.len())?;
    reachable(&src, q.stream().device())?;
    q.admit()?;
    let written = HostInFlight {
        ptr: dst,
        len,
        _host: PhantomData,
    };
    if written.len > 0 {
        q.touch(
            sealed::Touch::host(written.ptr.cast_const(), written.len, true),
            false,
        );
        q.touch(
            sealed::Touch::device::<T>(src.as_raw_ptr(), src.len(), false),
            false,
        );
        // SAFETY: `written.ptr` is `len` writable values of host memory, borrowed mutably for
        // `'a` through a `HostTarget` (so nothing else reads or writes it, and `HostInFlight`
        // gives the host no access to it); any bytes are a valid `T` (`Pod`). `src` is `len` values of device memory
        // reachable from the stream's device (checked above), lent for `'a`. The stream's
        // context is current (`Queue::admit`). The work is over before `'a` ends (the
        // contract of `Queue`).
        check(unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                written.ptr.cast::<c_void>(),
                src.as_raw_ptr(),
                written.len * size_of::<T>(),
                q.stream().raw,
            )
        })?;
    }
    Ok(written)
}

/// The body of [`ScopedStream::copy_from_device`], for any queue.
pub(super) fn copy_from_device<'a, T: Pod>(
    q: &impl Queue<'a>,
    dst: impl ScopedWrite<'a, T>,
    src: impl ScopedRead<'a, T>,
) -> Result<DeviceInFlight<'a, T>, Error> {
    let (written, read) = (lend_mut(dst, q.token())?, lend(src, q.token())?);
    let (dst, src) = (written.view, read.view);
    check_len(dst.len(), src.len())?;
    reachable(&dst, q.stream().device())?;
    reachable(&src, q.stream().device())?;
    q.admit()?;
    if !dst.is_empty() {
        q.touch(
            sealed::Touch::device::<T>(dst.as_raw_ptr(), dst.len(), true),
            false,
        );
        q.touch(
            sealed::Touch::device::<T>(src.as_raw_ptr(), src.len(), false),
            false,
        );
        // SAFETY: both ranges are `len` values of device memory reachable from the stream's device
        // (checked above), whose context is current (`Queue::admit`); `dst` is lent exclusively for
        // `'a`, `src` shared. Their virtual ranges cannot overlap (one exclusive, one shared);
        // through aliases the physical memory may, which leaves unspecified bytes in device memory
        // but touches no Rust memory. The work is over before `'a` ends (the contract of `Queue`).
        check(unsafe {
            sys::cuMemcpyDtoDAsync_v2(
                dst.as_raw_ptr(),
                src.as_raw_ptr(),
                dst.len() * size_of::<T>(),
                q.stream().raw,
            )
        })?;
    }
    Ok(written.written())
}

/// The body of [`ScopedStream::memset`], for any queue.
pub(super) fn memset<'a, T: Pod>(
    q: &impl Queue<'a>,
    dst: impl ScopedWrite<'a, T>,
    byte: u8,
) -> Result<DeviceInFlight<'a, T>, Error> {
    let lent = lend_mut(dst, q.token())?;
    let dst = lent.view;
    reachable(&dst, q.stream().device())?;
    q.admit()?;
    if !dst.is_empty() {
        q.touch(
            sealed::Touch::device::<T>(dst.as_raw_ptr(), dst.len(), true),
            false,
        );
        // SAFETY: `dst` is device memory reachable from the stream's device (checked above), whose
        // context is current (`Queue::admit`), lent exclusively for `'a`. The work is over before `'a`
        // ends (the contract of `Queue`).
        check(unsafe {
            sys::cuMemsetD8Async(
                dst.as_raw_ptr(),
                byte,
                dst.len() * size_of::<T>(),
                q.stream().raw,
            )
        })?;
    }
    Ok(lent.written())
}

/// The body of [`ScopedStream::launch`], for any queue.
pub(super) unsafe fn launch<'a, A: KernelArgs<'a>>(
    q: &impl Queue<'a>,
    function: &'a Function<'_>,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    args: A,
) -> Result<A::Output, Error> {
    if [grid.0, grid.1, grid.2, block.0, block.1, block.2].contains(&0) {
        return Err(Error::ZeroSize {
            what: "kernel grid or block",
        });
    }
    let device = q.stream().device();
    if function.device() != device {
        return Err(Error::DeviceMismatch {
            expected: device.as_raw(),
            found: function.device().as_raw(),
        });
    }
    // SAFETY: `function` is a kernel of a loaded module of the stream's device (checked above),
    // which stays loaded while it is borrowed, for `'a`; the rest is the caller's contract.
    unsafe { launch_raw(q, function.raw(), (grid, block, 0), args) }
}

/// The body of [`launch`] and of a launch of another library's kernel, once the function is known
/// to be a kernel of the stream's context: the same checks and the same lends.
///
/// # Safety
/// As [`ScopedStream::launch`], and `function` is a kernel loaded in the stream's context that stays
/// loaded for `'a`; `shared` bytes of dynamic shared memory are what it expects.
pub(super) unsafe fn launch_raw<'a, A: KernelArgs<'a>>(
    q: &impl Queue<'a>,
    function: sys::CUfunction,
    (grid, block, shared): ((u32, u32, u32), (u32, u32, u32), u32),
    args: A,
) -> Result<A::Output, Error> {
    if [grid.0, grid.1, grid.2, block.0, block.1, block.2].contains(&0) {
        return Err(Error::ZeroSize {
            what: "kernel grid or block",
        });
    }
    let device = q.stream().device();
    args.check(device)?;
    q.admit()?;
    args.launch_with(q.token(), |params, touches| {
        for touch in touches.iter().flatten() {
            q.touch(*touch, true);
        }
        let params = if params.is_empty() {
            ptr::null_mut()
        } else {
            params.as_mut_ptr()
        };
        // SAFETY: `function` is a kernel loaded in the stream's context, which stays loaded for
        // `'a` (the caller's contract), and that context is current (`Queue::admit`, and
        // `launch_with` makes no driver call). `params` points at one live value per argument,
        // which the driver copies before returning. The caller guarantees that they match the kernel's parameters and
        // that the kernel uses only the memory of the views (`# Safety`); every view is
        // reachable from this device (checked above) and lent for `'a`, writable ones
        // exclusively. The work is over before `'a` ends (the contract of `Queue`).
        Ok(check(unsafe {
            sys::cuLaunchKernel(
                function,
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                shared,
                q.stream().raw,
                params,
                ptr::null_mut(),
            )
        })?)
    })
}

impl<'scope> ScopedStream<'scope> {
    /// `cuLaunchKernel` of another library's kernel (cudarc's, feature `cudarc`), with the checks
    /// and lends of [`launch`](ScopedStream::launch) and `shared` bytes of dynamic shared memory.
    ///
    /// # Safety
    /// As [`launch`](ScopedStream::launch); and `function` is a kernel loaded in this stream's
    /// context (the device's primary context), whose module stays loaded for `'scope`.
    #[cfg_attr(not(feature = "cudarc"), allow(dead_code))]
    pub(crate) unsafe fn launch_raw<A: KernelArgs<'scope>>(
        &self,
        function: sys::CUfunction,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared: u32,
        args: A,
    ) -> Result<A::Output, Error> {
        // SAFETY: the caller's contract, which is `launch_raw`'s.
        unsafe { launch_raw(self, function, (grid, block, shared), args) }
    }
}

impl<'scope> Queue<'scope> for ScopedStream<'scope> {
    fn stream(&self) -> &Stream {
        self
    }

    fn token(&self) -> sealed::Token {
        sealed::Token::new(self.id(), false)
    }

    /// The stream's context bound, and the stream not capturing: a graph could run the work after
    /// the scope.
    fn admit(&self) -> Result<(), Error> {
        self.admit_work()
    }
}

impl<'scope> ScopedStream<'scope> {
    /// `cuMemcpyHtoDAsync` — queue a copy of `src` (host memory, the same length) into `dst`.
    ///
    /// `dst` is a writable view lent for the rest of the scope (`&mut view`, or a view made inside
    /// the closure); `src` is `&[T]`, `&PinnedBuffer<T>` or the [`HostInFlight`] of an earlier
    /// download, borrowed for the rest of the scope. Only page-locked memory ([`PinnedBuffer`])
    /// overlaps: from pageable memory the driver first copies `src` into its own staging memory
    /// before this returns. Returns a [`DeviceInFlight`] of `dst`: only work queued after the copy
    /// (on this stream, or behind an [`Event`]) reads it; the host reads `dst` after [`scope`] has
    /// returned, through the view it lent.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] where the lengths differ; [`Error::NoPeerAccess`] where the stream's
    /// device does not reach `dst`'s memory; both before any driver call. The driver's error
    /// otherwise.
    #[doc(alias = "cuMemcpyHtoDAsync")]
    pub fn copy_from_host<T: Pod>(
        &self,
        dst: impl ScopedWrite<'scope, T>,
        src: impl HostSource<'scope, T>,
    ) -> Result<DeviceInFlight<'scope, T>, Error> {
        copy_from_host(self, dst, src)
    }

    /// `cuMemcpyDtoHAsync` — queue a copy of `src` into `dst` (host memory, the same length).
    ///
    /// `dst` is borrowed mutably for the rest of the scope (`&mut pinned_buffer`, or a part of it), so
    /// nothing reads or writes it until the scope has waited for the copy; `src` is a view lent for
    /// the rest of the scope, also the [`DeviceInFlight`] of an earlier write ordered before this
    /// copy. Only page-locked memory ([`PinnedBuffer`]) overlaps: into pageable memory the driver
    /// returns only once the copy is done. Returns a [`HostInFlight`] of `dst`, with which a later
    /// queued upload (ordered after this copy) reads what this one wrote.
    ///
    /// # Errors
    /// As [`copy_from_host`](ScopedStream::copy_from_host), for `src`.
    #[doc(alias = "cuMemcpyDtoHAsync")]
    pub fn copy_to_host<T: Pod>(
        &self,
        dst: impl HostTarget<'scope, T>,
        src: impl ScopedRead<'scope, T>,
    ) -> Result<HostInFlight<'scope, T>, Error> {
        copy_to_host(self, dst, src)
    }

    /// `cuMemcpyDtoDAsync` — queue a copy of `src` into `dst` (the same length), which may belong to
    /// two devices: the stream's device must reach both views' memory (a VMM grant that names it, a
    /// peer view under a guard, or its own memory), so the copy runs over the link, never through the
    /// driver's hidden staging. `src` may be the [`DeviceInFlight`] of an earlier write, ordered
    /// before this copy. Returns a [`DeviceInFlight`] of `dst`: only work queued after the copy (on
    /// this stream, or behind an [`Event`]) reads it.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] where the lengths differ; [`Error::NoPeerAccess`] where the stream's
    /// device does not reach either view's memory; both before any driver call. The driver's error
    /// otherwise. For views that no one device reaches, use the staged
    /// [`copy_between`](crate::copy_between) outside the scope.
    #[doc(alias = "cuMemcpyDtoDAsync")]
    pub fn copy_from_device<T: Pod>(
        &self,
        dst: impl ScopedWrite<'scope, T>,
        src: impl ScopedRead<'scope, T>,
    ) -> Result<DeviceInFlight<'scope, T>, Error> {
        copy_from_device(self, dst, src)
    }

    /// `cuMemsetD8Async` — queue setting every byte of `dst` to `byte` (any bytes are a valid `T`).
    /// Returns a [`DeviceInFlight`] of `dst`: only work queued after the memset (on this stream, or
    /// behind an [`Event`]) reads it.
    ///
    /// # Errors
    /// [`Error::NoPeerAccess`] where the stream's device does not reach `dst`'s memory (before any
    /// driver call); the driver's error otherwise.
    #[doc(alias = "cuMemsetD8Async")]
    pub fn memset<T: Pod>(
        &self,
        dst: impl ScopedWrite<'scope, T>,
        byte: u8,
    ) -> Result<DeviceInFlight<'scope, T>, Error> {
        memset(self, dst, byte)
    }

    /// `cuLaunchKernel` — queue `function` on `grid` × `block` threads, with `args`, a tuple of
    /// typed arguments ([`KernelArgs`]): read-only views (`&DeviceSlice`, `DeviceSlice`,
    /// `&DeviceSliceMut`, and the [`DeviceInFlight`] of an earlier write), writable views
    /// (`&mut DeviceSliceMut`, `DeviceSliceMut`), each passed to the kernel as its device address
    /// (a `u64`), and plain values ([`Pod`]), passed as they are. Views and the kernel are borrowed
    /// for the rest of the scope, writable views exclusively. Returns, for each argument in order,
    /// a [`DeviceInFlight`] of each writable view, which only work queued after the kernel (on this
    /// stream, or behind an [`Event`]) reads, and `()` for the others.
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for an empty grid or block; [`Error::DeviceMismatch`] for a kernel loaded
    /// on another device than the stream's; [`Error::NoPeerAccess`] for a view whose memory the
    /// stream's device does not reach; all before any driver call. The driver's error otherwise
    /// (a fault of the kernel itself shows at the scope's wait, as a sticky error).
    ///
    /// # Safety
    /// The kernel's parameter list is not checked:
    /// - `args` must match it in number, order and types (a view is a `u64` device address);
    /// - the kernel must write only through the writable views, and read and write only within the
    ///   `len()` values of the views it is given. It may use other memory only through addresses
    ///   passed as plain values, and then the caller guarantees that memory, reachable from this
    ///   device, until the scope ends.
    #[doc(alias = "cuLaunchKernel")]
    pub unsafe fn launch<A: KernelArgs<'scope>>(
        &self,
        function: &'scope Function<'_>,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        args: A,
    ) -> Result<A::Output, Error> {
        // SAFETY: the caller keeps this function's contract (`# Safety`), which is the queue's.
        unsafe { launch(self, function, grid, block, args) }
    }
}
