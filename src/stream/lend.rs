//! The sealed lending traits ([`ScopedRead`], [`ScopedWrite`], [`HostSource`]), through which queued
//! work borrows views and host memory, and the handles of what it writes ([`DeviceInFlight`],
//! [`HostInFlight`]).

use core::fmt;
use core::marker::PhantomData;

use bytemuck::Pod;

use crate::device::Device;
use crate::error::Error;
use crate::sys;
use crate::view::{DeviceSlice, DeviceSliceMut};

use super::StreamId;
use super::pinned::{PinnedBuffer, PinnedSliceMut};
#[cfg(doc)]
use super::{event::Event, rewritable::Rewritable, scope::ScopedStream, scope::scope};

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

/// Device memory lent to a scope's queued work for reading, and to nothing else: what a queued
/// write writes ([`ScopedStream::copy_from_host`],
/// [`copy_from_device`](ScopedStream::copy_from_device), [`memset`](ScopedStream::memset), and each
/// writable argument of [`launch`](ScopedStream::launch)), or a range of a scoped buffer lent for
/// reading (`ScopedBuffer::read`, of a buffer lent by
/// [`VirtualBuffer::in_scope`](crate::VirtualBuffer::in_scope), whose pages can be retired while
/// the scope lasts). Usable only by queued work (ordered after the write by the caller: on the same
/// stream, or behind an [`Event`]), as the source of a copy ([`ScopedStream::copy_to_host`],
/// [`ScopedStream::copy_from_device`]), a read-only kernel argument, or a view lent to cudarc for
/// reading (`interop::cudarc::Scope::lend`, feature `cudarc`). The host reads the bytes after
/// [`scope`] has returned, through the view it lent. A range of a scoped buffer is checked again at
/// every lend, and refused once its pages are retired.
///
/// It gives the host nothing: it has no `to_vec` or synchronous `copy_to_host` of its own, does
/// not become a [`DeviceSlice`], and is no source of [`copy_between`](crate::copy_between) or
/// [`DeviceSliceMut::copy_from_device`]. Those run on the legacy default stream, which does not
/// wait for the non-blocking streams of this crate, so they would read bytes the queued work is
/// still writing (or a page a retire has released).
///
/// # Lifetimes
/// `'scope` is the scope's: the exclusive borrow of the written view, or the scoped buffer's lend,
/// which lasts the scope.
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
    /// The memory, lent to the queued work for `'scope` and seen read-only. Private: only this
    /// crate's queued operations get it ([`ScopedRead::lend`]).
    view: DeviceSlice<'scope, T>,
    /// Where the memory can leave while the scope lasts (a range of a scoped buffer, which can be
    /// retired): checked again at every lend. `None` for memory borrowed for the whole scope.
    origin: Option<Origin<'scope>>,
    /// The one stream whose work may read it, where the crate ordered that stream after the writes
    /// (a scoped buffer's range read back); `None` where the caller orders the reads.
    stream: Option<StreamId>,
}

impl<'scope, T> DeviceInFlight<'scope, T> {
    /// `view`, lent to queued work only; `origin` where its memory can leave while the scope lasts.
    pub(crate) fn new(view: DeviceSlice<'scope, T>, origin: Option<Origin<'scope>>) -> Self {
        DeviceInFlight {
            view,
            origin,
            stream: None,
        }
    }

    /// As [`new`](DeviceInFlight::new), lent only to work on `stream`, which the crate ordered
    /// after the writes of the memory.
    pub(crate) fn on_stream(
        view: DeviceSlice<'scope, T>,
        origin: Option<Origin<'scope>>,
        stream: StreamId,
    ) -> Self {
        DeviceInFlight {
            view,
            origin,
            stream: Some(stream),
        }
    }
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
    /// the write, reads unspecified bytes. A scoped buffer's range is valid only until it is
    /// retired and the work queued before the retire has finished.
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

pub(crate) mod sealed {
    /// Sealing the lending traits: the scope's soundness rests on exactly these implementations.
    pub trait Read {}
    pub trait Write {}
    pub trait Host {}
    pub trait HostMut {}
    pub trait Arg {}
    pub trait Args {}

    /// The argument of [`ScopedRead::lend`](super::ScopedRead::lend), which only this crate can
    /// make (its field is private to this module). A public method of a public trait can be called
    /// by any code that names the trait; moving it to a supertrait in this private module would not
    /// help either, since a generic bound on the public trait makes the supertrait's methods
    /// callable too. So `lend` takes a value that code outside the crate cannot have. Without it,
    /// `written.lend()` would turn a [`DeviceInFlight`](super::DeviceInFlight) back into a
    /// `DeviceSlice`, and its host reads (`ui-tests/stream/written_view_lent_out_of_the_seal.rs`).
    #[derive(Debug, Clone, Copy)]
    pub struct Token {
        /// The stream the operation that lends queues its work on.
        pub(crate) stream: super::StreamId,
        /// Whether the work is captured into a graph rather than run.
        pub(crate) capture: bool,
    }

    impl Token {
        pub(crate) fn new(stream: super::StreamId, capture: bool) -> Token {
            Token { stream, capture }
        }
    }

    /// Bytes that one queued operation touches, `[start, end)`: device memory (or host memory, for
    /// the host side of a copy), read or written. A capture records every one, so that a parked
    /// graph is rebound only over memory that covers all it touches
    /// ([`Rebind::finish`](crate::stream::Rebind::finish)).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Touch {
        pub(crate) start: u64,
        pub(crate) end: u64,
        pub(crate) written: bool,
        pub(crate) host: bool,
    }

    impl Touch {
        /// The bytes of a device view of `len` values of `T` at `ptr`.
        pub(crate) fn device<T>(ptr: u64, len: usize, written: bool) -> Touch {
            Touch::new(ptr, len, size_of::<T>(), written, false)
        }

        /// The bytes of `len` values of `T` of host memory at `ptr`.
        pub(crate) fn host<T>(ptr: *const T, len: usize, written: bool) -> Touch {
            Touch::new(ptr as u64, len, size_of::<T>(), written, true)
        }

        /// Saturating: a view's bytes fit its reservation, and a slice's its address space, so
        /// nothing saturates; were it to, the range would only grow (and be refused, not missed).
        fn new(start: u64, len: usize, size: usize, written: bool, host: bool) -> Touch {
            let bytes = u64::try_from(len.saturating_mul(size)).unwrap_or(u64::MAX);
            Touch {
                start,
                end: start.saturating_add(bytes),
                written,
                host,
            }
        }
    }

    /// A view as lent to one queued operation: the view, where it came from, and, for memory that
    /// can leave while the scope lasts, the count of a lend in progress, held until the operation has
    /// queued its work (so that a retire records its events after that work). Only this crate makes
    /// one.
    pub struct Lent<'scope, T> {
        pub(in crate::stream) view: super::DeviceSlice<'scope, T>,
        pub(in crate::stream) origin: Option<super::Origin<'scope>>,
        pub(in crate::stream) counted: Counted<'scope>,
    }

    /// A lend in progress, counted by [`Tracker::admit`](super::Tracker::admit): uncounted when
    /// dropped, once the operation has queued its work. The second field holds the counts of a
    /// lend of several views (a block table's), empty (allocating nothing) for one view.
    pub struct Counted<'scope>(
        pub(in crate::stream) Option<(&'scope (dyn super::Tracker + 'scope), usize)>,
        pub(in crate::stream) Vec<(&'scope (dyn super::Tracker + 'scope), usize)>,
    );

    impl core::fmt::Debug for Counted<'_> {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            f.debug_tuple("Counted").field(&self.0.is_some()).finish()
        }
    }

    impl Drop for Counted<'_> {
        fn drop(&mut self) {
            for (pages, slot) in self.0.iter().chain(&self.1) {
                pages.done(*slot);
            }
        }
    }

    impl<T> core::fmt::Debug for Lent<'_, T> {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            f.debug_struct("Lent")
                .field("view", &self.view)
                .finish_non_exhaustive()
        }
    }
}

/// Memory whose pages can leave while a scope lasts: the page table of a buffer lent to a scope
/// ([`VirtualBuffer::in_scope`](crate::VirtualBuffer::in_scope)), which admits each lend of one of
/// its views. The owned layer implements it; this layer never names the buffer.
pub(crate) trait Tracker: Sync {
    /// Whether the view `[ptr, ptr + bytes)`, made when the table was at `epoch`, may be lent now:
    /// every byte on a page that is neither retired nor mapped after the view was made. On `Ok`, a
    /// lend in progress is counted, in the returned slot, until [`done`](Tracker::done).
    fn admit(&self, ptr: u64, bytes: usize, epoch: u64) -> Result<usize, Error>;
    /// As [`admit`](Tracker::admit), for a lend for writing to work on `stream`: the bytes must still
    /// be lent for writing (not read back since), and the table remembers `stream` as the one a
    /// read back of them is ordered after.
    fn admit_write(
        &self,
        ptr: u64,
        bytes: usize,
        epoch: u64,
        stream: StreamId,
    ) -> Result<usize, Error>;
    /// The lend counted by `admit` in `slot` has queued its work (or given up).
    fn done(&self, slot: usize);
}

/// The streams of a scope, which a retire records its events on.
pub(crate) trait Registry: Sync {
    /// Whether work queued on `stream` is waited for by the scope.
    fn registered(&self, stream: StreamId) -> bool;
    /// Calls `f` with every stream of the scope; the first error, every stream tried.
    fn each(&self, f: &mut dyn FnMut(&super::Stream) -> Result<(), Error>) -> Result<(), Error>;
}

/// Where a lent view came from, when its memory can leave while the scope lasts: checked at every
/// lend ([`Tracker::admit`]), and only for work queued on a stream of the scope the memory was lent
/// to ([`Registry::registered`]), since a retire orders its release after that work only.
///
/// Covariant in `'scope` (trait objects' lifetime bounds are), so a handle of an enclosing scope
/// still lends into an inner one, where the registry refuses a stream it does not know.
#[derive(Clone, Copy)]
pub(crate) struct Origin<'scope> {
    pub(crate) pages: &'scope (dyn Tracker + 'scope),
    pub(crate) streams: &'scope (dyn Registry + 'scope),
    pub(crate) epoch: u64,
}

impl Origin<'_> {
    /// Admits a lend of `view` (of this memory) to work on `stream`, for writing or reading: the
    /// slot its count goes in, until the work is queued.
    pub(super) fn admit<T: Pod>(
        self,
        view: &DeviceSlice<'_, T>,
        stream: StreamId,
        write: bool,
    ) -> Result<usize, Error> {
        let bytes = view
            .len()
            .checked_mul(size_of::<T>())
            .ok_or(Error::Overflow { what: "view size" })?;
        self.admit_bytes(view.as_raw_ptr(), bytes, stream, write)
    }

    /// As [`admit`](Origin::admit), for the `bytes` bytes at `ptr` (a graph's captured range).
    pub(super) fn admit_bytes(
        self,
        ptr: u64,
        bytes: usize,
        stream: StreamId,
        write: bool,
    ) -> Result<usize, Error> {
        if !self.streams.registered(stream) {
            return Err(Error::StreamRefused {
                why: "a view of a scoped buffer is lent only to work on a stream of its scope \
                      (`Scope::on`), which its retires record their events on",
            });
        }
        if write {
            self.pages.admit_write(ptr, bytes, self.epoch, stream)
        } else {
            self.pages.admit(ptr, bytes, self.epoch)
        }
    }
}

impl<'scope, T: Pod> sealed::Lent<'scope, T> {
    /// A view borrowed for the whole scope: nothing to check.
    pub(crate) fn plain(view: DeviceSlice<'scope, T>) -> sealed::Lent<'scope, T> {
        sealed::Lent {
            view,
            origin: None,
            counted: sealed::Counted(None, Vec::new()),
        }
    }

    /// A view of `origin`'s memory, or one borrowed for the scope (`None`), lent to work on `stream`
    /// for reading.
    pub(crate) fn admit(
        view: DeviceSlice<'scope, T>,
        origin: Option<Origin<'scope>>,
        token: sealed::Token,
    ) -> Result<sealed::Lent<'scope, T>, Error> {
        Self::admit_as(view, origin, token, false)
    }

    /// As [`admit`](sealed::Lent::admit), for writing: a scoped buffer's range must still be lent
    /// for writing (not read back since).
    pub(crate) fn admit_write(
        view: DeviceSlice<'scope, T>,
        origin: Option<Origin<'scope>>,
        token: sealed::Token,
    ) -> Result<sealed::Lent<'scope, T>, Error> {
        Self::admit_as(view, origin, token, true)
    }

    fn admit_as(
        view: DeviceSlice<'scope, T>,
        origin: Option<Origin<'scope>>,
        token: sealed::Token,
        write: bool,
    ) -> Result<sealed::Lent<'scope, T>, Error> {
        let Some(origin) = origin else {
            return Ok(sealed::Lent::plain(view));
        };
        if token.capture {
            return Err(Error::StreamRefused {
                why: "a view of a scoped buffer, whose pages can be retired while the scope lasts, \
                      is not captured into a graph, which would keep its address",
            });
        }
        let slot = origin.admit(&view, token.stream, write)?;
        Ok(sealed::Lent {
            view,
            origin: Some(origin),
            counted: sealed::Counted(Some((origin.pages, slot)), Vec::new()),
        })
    }

    /// The view, where it came from, and the count held until the work is queued.
    pub(crate) fn into_parts(
        self,
    ) -> (
        DeviceSlice<'scope, T>,
        Option<Origin<'scope>>,
        sealed::Counted<'scope>,
    ) {
        (self.view, self.origin, self.counted)
    }

    /// The handle an operation that wrote the view returns.
    pub(crate) fn written(&self) -> DeviceInFlight<'scope, T> {
        DeviceInFlight::new(self.view, self.origin)
    }
}

/// The view `view` lends for reading to work queued on `stream`, for the crate's own operations (the
/// only callers of [`ScopedRead::lend`], which takes a [`sealed::Token`]).
pub(crate) fn lend<'scope, T>(
    view: impl ScopedRead<'scope, T>,
    token: sealed::Token,
) -> Result<sealed::Lent<'scope, T>, Error> {
    view.lend(token)
}

/// The view `view` lends for writing to work queued on `stream`, for the crate's own operations.
pub(crate) fn lend_mut<'scope, T>(
    view: impl ScopedWrite<'scope, T>,
    token: sealed::Token,
) -> Result<sealed::Lent<'scope, T>, Error> {
    view.lend_mut(token)
}

/// A device view lent to queued work for reading, for the rest of a scope: a
/// `DeviceSlice<'scope, T>` (made inside the closure, or copied), a `&'scope DeviceSlice<'_, T>`,
/// a `&'scope DeviceSliceMut<'_, T>`, or a [`DeviceInFlight<'scope, T>`](DeviceInFlight): the
/// result of an earlier queued write, or a scoped buffer's range lent for reading. Sealed.
pub trait ScopedRead<'scope, T>: sealed::Read {
    /// The view, for `'scope`, as lent to work on the token's stream. Only this crate can call it:
    /// the token is a type that no code outside it can make, so a [`DeviceInFlight`] never becomes
    /// a host-readable view.
    #[doc(hidden)]
    fn lend(self, token: sealed::Token) -> Result<sealed::Lent<'scope, T>, Error>;
    /// `Err(NoPeerAccess)` unless `device` reaches the view's memory: checked before any driver
    /// call. Code outside the crate can call it, to no harm.
    #[doc(hidden)]
    fn check_reach(&self, device: Device) -> Result<(), Error>;
}

/// A device view lent to queued work for writing, exclusively, for the rest of a scope: a
/// `&'scope mut DeviceSliceMut<'_, T>`, a `DeviceSliceMut<'scope, T>` made inside the closure, or a
/// `&mut` [`Rewritable`], which lends the same memory for writing again and again. Sealed: a
/// read-only view ([`DeviceSlice`]) is not one.
pub trait ScopedWrite<'scope, T>: sealed::Write {
    /// The memory, lent exclusively for `'scope` to work on the token's stream, as a read-only view
    /// that the operation wraps in the [`DeviceInFlight`] it returns. Only this crate can call it.
    #[doc(hidden)]
    fn lend_mut(self, token: sealed::Token) -> Result<sealed::Lent<'scope, T>, Error>;
    /// As [`ScopedRead::check_reach`].
    #[doc(hidden)]
    fn check_reach(&self, device: Device) -> Result<(), Error>;
    /// Whether this is a [`Rewritable`] lent again (`&mut Rewritable`): a handle that is already
    /// one writer of its bytes for the scope, which no second [`Rewritable`] may be made of.
    #[doc(hidden)]
    fn rewritable_already(&self) -> bool {
        false
    }
}

/// `Err(NoPeerAccess)` unless `view` is reachable from `device`.
pub(crate) fn reachable<T: Pod>(view: &DeviceSlice<'_, T>, device: Device) -> Result<(), Error> {
    if view.reachable_from(device) {
        Ok(())
    } else {
        Err(Error::NoPeerAccess {
            device: device.as_raw(),
            owner: view.device().as_raw(),
        })
    }
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
    fn lend(self, _: sealed::Token) -> Result<sealed::Lent<'scope, T>, Error> {
        Ok(sealed::Lent::plain(self))
    }
    fn check_reach(&self, device: Device) -> Result<(), Error> {
        reachable(self, device)
    }
}
impl<T: Pod> sealed::Read for &DeviceSlice<'_, T> {}
impl<'scope, T: Pod> ScopedRead<'scope, T> for &'scope DeviceSlice<'_, T> {
    fn lend(self, _: sealed::Token) -> Result<sealed::Lent<'scope, T>, Error> {
        Ok(sealed::Lent::plain(*self))
    }
    fn check_reach(&self, device: Device) -> Result<(), Error> {
        reachable(self, device)
    }
}
impl<T: Pod> sealed::Read for &DeviceSliceMut<'_, T> {}
impl<'scope, T: Pod> ScopedRead<'scope, T> for &'scope DeviceSliceMut<'_, T> {
    fn lend(self, _: sealed::Token) -> Result<sealed::Lent<'scope, T>, Error> {
        Ok(sealed::Lent::plain(self.as_slice()))
    }
    fn check_reach(&self, device: Device) -> Result<(), Error> {
        reachable(&self.as_slice(), device)
    }
}
impl<T: Pod> sealed::Read for DeviceInFlight<'_, T> {}
impl<'scope, T: Pod> ScopedRead<'scope, T> for DeviceInFlight<'scope, T> {
    fn lend(self, token: sealed::Token) -> Result<sealed::Lent<'scope, T>, Error> {
        if self.stream.is_some_and(|s| s != token.stream) {
            return Err(Error::StreamRefused {
                why: "bytes read back for one stream are read by work on that stream only, which the \
                      read back ordered after their writes: read them back again for another",
            });
        }
        sealed::Lent::admit(self.view, self.origin, token)
    }
    fn check_reach(&self, device: Device) -> Result<(), Error> {
        reachable(&self.view, device)
    }
}

impl<T: Pod> sealed::Write for DeviceSliceMut<'_, T> {}
impl<'scope, T: Pod> ScopedWrite<'scope, T> for DeviceSliceMut<'scope, T> {
    fn lend_mut(self, _: sealed::Token) -> Result<sealed::Lent<'scope, T>, Error> {
        Ok(sealed::Lent::plain(self.into_slice()))
    }
    fn check_reach(&self, device: Device) -> Result<(), Error> {
        reachable(&self.as_slice(), device)
    }
}
impl<T: Pod> sealed::Write for &mut DeviceSliceMut<'_, T> {}
impl<'scope, T: Pod> ScopedWrite<'scope, T> for &'scope mut DeviceSliceMut<'_, T> {
    fn lend_mut(self, _: sealed::Token) -> Result<sealed::Lent<'scope, T>, Error> {
        // The exclusive borrow, held for `'scope`, seen as shared: nothing else can use the view until
        // the scope ends.
        let lent: &'scope DeviceSliceMut<'_, T> = self;
        Ok(sealed::Lent::plain(lent.as_slice()))
    }
    fn check_reach(&self, device: Device) -> Result<(), Error> {
        reachable(&self.as_slice(), device)
    }
}

/// Host memory lent to a queued download as its destination, exclusively, for the rest of a scope:
/// a `&'scope mut [T]` or `&'scope mut Vec<T>` (pageable memory), a `&'scope mut` [`PinnedBuffer<T>`], or a
/// [`PinnedSliceMut<'scope, T>`] of one (by value or `&'scope mut`). Sealed.
pub trait HostTarget<'scope, T>: sealed::HostMut {
    /// The address and length, writable for `'scope` and used by nothing else. Code outside the
    /// crate can call it, to no harm: a raw pointer gives nothing without `unsafe`.
    #[doc(hidden)]
    fn host_parts_mut(self) -> (*mut T, usize);
}

impl<T: Pod> sealed::HostMut for &mut [T] {}
impl<'scope, T: Pod> HostTarget<'scope, T> for &'scope mut [T] {
    fn host_parts_mut(self) -> (*mut T, usize) {
        (self.as_mut_ptr(), self.len())
    }
}
impl<T: Pod> sealed::HostMut for &mut Vec<T> {}
impl<'scope, T: Pod> HostTarget<'scope, T> for &'scope mut Vec<T> {
    fn host_parts_mut(self) -> (*mut T, usize) {
        (self.as_mut_ptr(), self.len())
    }
}
impl<T: Pod> sealed::HostMut for &mut PinnedBuffer<T> {}
impl<'scope, T: Pod> HostTarget<'scope, T> for &'scope mut PinnedBuffer<T> {
    fn host_parts_mut(self) -> (*mut T, usize) {
        self.as_pinned_mut().raw_parts()
    }
}
impl<T: Pod> sealed::HostMut for PinnedSliceMut<'_, T> {}
impl<'scope, T: Pod> HostTarget<'scope, T> for PinnedSliceMut<'scope, T> {
    fn host_parts_mut(self) -> (*mut T, usize) {
        self.raw_parts()
    }
}
impl<T: Pod> sealed::HostMut for &mut PinnedSliceMut<'_, T> {}
impl<'scope, T: Pod> HostTarget<'scope, T> for &'scope mut PinnedSliceMut<'_, T> {
    fn host_parts_mut(self) -> (*mut T, usize) {
        self.raw_parts()
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
