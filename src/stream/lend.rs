//! The sealed lending traits ([`ScopedRead`], [`ScopedWrite`], [`HostSource`]), through which queued
//! work borrows views and host memory, and the handles of what it writes ([`DeviceInFlight`],
//! [`HostInFlight`]).

use core::fmt;
use core::marker::PhantomData;

use bytemuck::Pod;

use crate::device::Device;
use crate::sys;
use crate::view::{DeviceSlice, DeviceSliceMut};

#[cfg(doc)]
use super::event::Event;
use super::pinned::PinnedBuffer;
#[cfg(doc)]
use super::scope::{ScopedStream, scope};

/// Host memory that a queued download writes ([`ScopedStream::copy_to_host`]): usable only as the
/// source of later queued uploads ([`ScopedStream::copy_from_host`]), ordered after the download
/// by the caller (on the same stream, or behind an [`Event`]). The host reads the bytes after
/// [`scope`] has returned, through the buffer it lent.
///
/// It gives the host no access to the bytes, which the device may be writing: a Rust reference to
/// them would be a data race.
///
/// # Lifetimes
/// `'scope` is the mutable borrow of the host memory, which lasts the scope.
pub struct HostInFlight<'scope, T> {
    pub(super) ptr: *mut T,
    pub(super) len: usize,
    /// The host memory, borrowed mutably for `'scope`: covariant in `'scope`, invariant in `T`.
    pub(super) _host: PhantomData<&'scope mut [T]>,
}

impl<T> Clone for HostInFlight<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for HostInFlight<'_, T> {}

// SAFETY: a `HostInFlight` is an address and a length that only queued copies dereference; it gives
// no thread any access to the memory itself.
unsafe impl<T: Send> Send for HostInFlight<'_, T> {}
// SAFETY: as for `Send`: `&HostInFlight` gives nothing but the length.
unsafe impl<T: Sync> Sync for HostInFlight<'_, T> {}

impl<T> fmt::Debug for HostInFlight<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostInFlight")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl<T> HostInFlight<'_, T> {
    /// The number of values.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Device memory that a queued write writes ([`ScopedStream::copy_from_host`],
/// [`copy_from_device`](ScopedStream::copy_from_device), [`memset`](ScopedStream::memset), and each
/// writable argument of [`launch`](ScopedStream::launch)): usable only by later queued work, ordered
/// after the write by the caller (on the same stream, or behind an [`Event`]), as the source of a
/// copy ([`ScopedStream::copy_to_host`], [`ScopedStream::copy_from_device`]), a read-only kernel
/// argument, or a view lent to cudarc for reading (`interop::cudarc::Scope::lend`, feature
/// `cudarc`). The host reads the bytes after [`scope`] has returned, through the view it lent.
///
/// It gives the host nothing: it has no `to_vec` or synchronous `copy_to_host` of its own, does
/// not become a [`DeviceSlice`], and is no source of [`copy_between`](crate::copy_between) or
/// [`DeviceSliceMut::copy_from_device`]. Those run on the legacy default stream, which does not
/// wait for the non-blocking streams of this crate, so they would read bytes the queued work is
/// still writing.
///
/// # Lifetimes
/// `'scope` is the exclusive borrow of the written view, which lasts the scope.
///
/// # Examples
/// Upload, then hand the result to a kernel on the same stream and to a download on another one,
/// behind an event:
/// ```no_run
/// use cuda_vmm::{Context, Device, DeviceBuffer, Event, Module, PinnedBuffer, Stream};
///
/// # fn main() -> Result<(), cuda_vmm::Error> {
/// # let ptx = c"";
/// let context = Context::new(Device::get(0)?)?;
/// let module = Module::load_ptx(&context, ptx)?;
/// let scale = module.function(c"scale")?; // scale(const float* x, float* y, unsigned n)
/// let mut x = DeviceBuffer::<f32>::zeroed(&context, 256)?;
/// let mut y = DeviceBuffer::<f32>::zeroed(&context, 256)?;
/// let input = PinnedBuffer::from_slice(&context, &[1.5f32; 256])?;
/// let mut output = PinnedBuffer::<f32>::zeroed(&context, 256)?;
/// let (work, down) = (Stream::new(&context)?, Stream::new(&context)?);
/// let done = Event::new(&context)?;
/// let (mut x_view, mut y_view) = (x.as_mut_slice(), y.as_mut_slice());
///
/// cuda_vmm::scope(|s| {
///     let work = s.on(&work);
///     let uploaded = work.copy_from_host(&mut x_view, &input)?; // a DeviceInFlight
///     // SAFETY: `scale` takes two float pointers and a count, and touches `n` values of each.
///     let (_, scaled, _) = unsafe {
///         work.launch(&scale, (1, 1, 1), (256, 1, 1), (uploaded, &mut y_view, 256u32))?
///     };
///     work.record(&done)?;
///     let down = s.on(&down);
///     down.wait(&done)?; // ordered after the kernel
///     down.copy_to_host(&mut output, scaled)?;
///     Ok(())
/// })?;
/// // The scope has waited: the host reads the results, here and through the views.
/// assert_eq!(y_view.to_vec()?, output.to_vec());
/// # Ok(())
/// # }
/// ```
///
/// The host cannot read it inside the scope, where the queued write may still be running:
/// ```compile_fail,E0599
/// # use cuda_vmm::{Context, Device, DeviceBuffer, PinnedBuffer, Stream};
/// # fn main() -> Result<(), cuda_vmm::Error> {
/// # let context = Context::new(Device::get(0)?)?;
/// # let mut device = DeviceBuffer::<u32>::zeroed(&context, 1024)?;
/// # let mut view = device.as_mut_slice();
/// let input = PinnedBuffer::from_slice(&context, &[1u32; 1024])?;
/// let stream = Stream::new(&context)?;
/// cuda_vmm::scope(|s| {
///     let written = s.on(&stream).copy_from_host(&mut view, &input)?;
///     let bytes = written.to_vec()?; // the copy may not have run yet
///     Ok(())
/// })?;
/// # Ok(())
/// # }
/// ```
pub struct DeviceInFlight<'scope, T> {
    /// The written memory, lent exclusively to the queued work for `'scope` and seen read-only.
    /// Private: only this crate's queued operations get it ([`ScopedRead::lend`]).
    pub(super) view: DeviceSlice<'scope, T>,
}

impl<T> Clone for DeviceInFlight<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DeviceInFlight<'_, T> {}

impl<T> fmt::Debug for DeviceInFlight<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DeviceInFlight").field(&self.view).finish()
    }
}

impl<T: Pod> DeviceInFlight<'_, T> {
    /// The number of values.
    #[must_use]
    pub fn len(&self) -> usize {
        self.view.len()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.view.is_empty()
    }

    /// The device whose context the written view's copies run in.
    #[must_use]
    pub fn device(&self) -> Device {
        self.view.device()
    }

    /// The device address of the first value: an escape hatch that owns nothing and frees nothing.
    /// The bytes behind it may still be being written by the queued work until [`scope`] has
    /// returned; reading them through the address before then, other than in work ordered after
    /// the write, reads unspecified bytes.
    #[must_use]
    pub fn as_raw_ptr(&self) -> sys::CUdeviceptr {
        self.view.as_raw_ptr()
    }

    /// Whether `device` can read this memory directly while the scope lasts: as
    /// [`DeviceSlice::reachable_from`] of the written view.
    #[must_use]
    pub fn reachable_from(&self, device: Device) -> bool {
        self.view.reachable_from(device)
    }
}

pub(super) mod sealed {
    /// Sealing the lending traits: the scope's soundness rests on exactly these implementations.
    pub trait Read {}
    pub trait Write {}
    pub trait Host {}
    pub trait Arg {}
    pub trait Args {}

    /// The argument of [`ScopedRead::lend`](super::ScopedRead::lend), which only this crate can
    /// make (its field is private to this module). A public method of a public trait can be called
    /// by any code that names the trait; moving it to a supertrait in this private module would not
    /// help either, since a generic bound on the public trait makes the supertrait's methods
    /// callable too. So `lend` takes a value that code outside the crate cannot have. Without it,
    /// `written.lend()` would turn a [`DeviceInFlight`](super::DeviceInFlight) back into a
    /// `DeviceSlice`, and its host reads (`ui-tests/stream/written_view_lent_out_of_the_seal.rs`).
    #[derive(Debug)]
    pub struct Token(());

    impl Token {
        pub(super) fn new() -> Token {
            Token(())
        }
    }
}

/// The view `view` lends for reading, for the crate's own operations (the only callers of
/// [`ScopedRead::lend`], which takes a [`sealed::Token`]).
pub(crate) fn lend<'scope, T>(view: impl ScopedRead<'scope, T>) -> DeviceSlice<'scope, T> {
    view.lend(sealed::Token::new())
}

/// A device view lent to queued work for reading, for the rest of a scope: a
/// `DeviceSlice<'scope, T>` (made inside the closure, or copied), a `&'scope DeviceSlice<'_, T>`,
/// a `&'scope DeviceSliceMut<'_, T>`, or the [`DeviceInFlight<'scope, T>`](DeviceInFlight) of an
/// earlier queued write. Sealed.
pub trait ScopedRead<'scope, T>: sealed::Read {
    /// The view, for `'scope`. Only this crate can call it: the token is a type that no code
    /// outside it can make, so a [`DeviceInFlight`] never becomes a host-readable view.
    #[doc(hidden)]
    fn lend(self, token: sealed::Token) -> DeviceSlice<'scope, T>;
}

/// A device view lent to queued work for writing, exclusively, for the rest of a scope: a
/// `&'scope mut DeviceSliceMut<'_, T>`, or a `DeviceSliceMut<'scope, T>` made inside the closure.
/// Sealed: a read-only view ([`DeviceSlice`]) is not one.
pub trait ScopedWrite<'scope, T>: sealed::Write {
    /// The memory, lent exclusively for `'scope`, as a read-only view, which the operation wraps in
    /// the [`DeviceInFlight`] it returns. Code outside the crate can call it, to no harm: it gives
    /// what [`DeviceSliceMut::into_slice`] and [`DeviceSliceMut::as_slice`] give, of a view that the
    /// call consumes or borrows mutably for as long as the result lives, so no queued work holds it.
    #[doc(hidden)]
    fn lend_mut(self) -> DeviceSlice<'scope, T>;
}

/// Host memory lent to queued uploads for the rest of a scope: a `&'scope [T]`, a
/// `&'scope PinnedBuffer<T>`, or the [`HostInFlight`] of an earlier download. Sealed.
pub trait HostSource<'scope, T>: sealed::Host {
    /// The address and length, readable for `'scope`. Code outside the crate can call it, to no
    /// harm: a raw pointer gives nothing without `unsafe`.
    #[doc(hidden)]
    fn host_parts(self) -> (*const T, usize);
}

impl<T: Pod> sealed::Read for DeviceSlice<'_, T> {}
impl<'scope, T: Pod> ScopedRead<'scope, T> for DeviceSlice<'scope, T> {
    fn lend(self, _: sealed::Token) -> DeviceSlice<'scope, T> {
        self
    }
}
impl<T: Pod> sealed::Read for &DeviceSlice<'_, T> {}
impl<'scope, T: Pod> ScopedRead<'scope, T> for &'scope DeviceSlice<'_, T> {
    fn lend(self, _: sealed::Token) -> DeviceSlice<'scope, T> {
        *self
    }
}
impl<T: Pod> sealed::Read for &DeviceSliceMut<'_, T> {}
impl<'scope, T: Pod> ScopedRead<'scope, T> for &'scope DeviceSliceMut<'_, T> {
    fn lend(self, _: sealed::Token) -> DeviceSlice<'scope, T> {
        self.as_slice()
    }
}
impl<T: Pod> sealed::Read for DeviceInFlight<'_, T> {}
impl<'scope, T: Pod> ScopedRead<'scope, T> for DeviceInFlight<'scope, T> {
    fn lend(self, _: sealed::Token) -> DeviceSlice<'scope, T> {
        self.view
    }
}

impl<T: Pod> sealed::Write for DeviceSliceMut<'_, T> {}
impl<'scope, T: Pod> ScopedWrite<'scope, T> for DeviceSliceMut<'scope, T> {
    fn lend_mut(self) -> DeviceSlice<'scope, T> {
        self.into_slice()
    }
}
impl<T: Pod> sealed::Write for &mut DeviceSliceMut<'_, T> {}
impl<'scope, T: Pod> ScopedWrite<'scope, T> for &'scope mut DeviceSliceMut<'_, T> {
    fn lend_mut(self) -> DeviceSlice<'scope, T> {
        // The exclusive borrow, held for `'scope`, seen as shared: nothing else can use the view until
        // the scope ends.
        let lent: &'scope DeviceSliceMut<'_, T> = self;
        lent.as_slice()
    }
}

impl<T: Pod> sealed::Host for &[T] {}
impl<'scope, T: Pod> HostSource<'scope, T> for &'scope [T] {
    fn host_parts(self) -> (*const T, usize) {
        (self.as_ptr(), self.len())
    }
}
impl<T: Pod> sealed::Host for &PinnedBuffer<T> {}
impl<'scope, T: Pod> HostSource<'scope, T> for &'scope PinnedBuffer<T> {
    fn host_parts(self) -> (*const T, usize) {
        (self.as_ptr(), self.len())
    }
}
impl<T: Pod> sealed::Host for HostInFlight<'_, T> {}
impl<'scope, T: Pod> HostSource<'scope, T> for HostInFlight<'scope, T> {
    fn host_parts(self) -> (*const T, usize) {
        (self.ptr.cast_const(), self.len)
    }
}
