//! Device-to-device copies across devices, with a portable fallback through pinned host memory.

use core::ffi::c_void;
use core::ptr;

use bytemuck::Pod;

use crate::device::{Context, Device};
use crate::error::{Error, Result, check};
use crate::sys;
use crate::view::{DeviceSlice, DeviceSliceMut, copy_device_to_device};

/// Which path [`copy_between`] should take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Route {
    /// [`CopyPath::Direct`] where one view's device can reach the other view's memory (see
    /// [`DeviceSlice::reachable_from`]), [`CopyPath::Staged`] otherwise. Between two devices the
    /// direct path is taken only where access is open (a grant that names the other device, or a peer
    /// view under a [`PeerAccess`](crate::PeerAccess) guard): a device that merely *could* access the
    /// other ([`can_access_peer`](crate::can_access_peer)) but has no access yet gets the staged path,
    /// never the driver's own, slower staging.
    #[default]
    Auto,
    /// Always [`CopyPath::Direct`]: refused with [`Error::NoPeerAccess`] before any driver call where
    /// neither device can reach the other view's memory.
    Direct,
    /// Always [`CopyPath::Staged`], also on one device (to compare the paths, or to avoid the
    /// peer link).
    Staged,
}

impl Route {
    /// The path [`copy_between`] takes on this route for a copy from `src` into `dst`. Changes nothing
    /// and calls no driver function.
    ///
    /// # Errors
    /// [`Error::NoPeerAccess`] for [`Route::Direct`] where neither view's device can reach the other
    /// view's memory.
    pub fn path<T: Pod>(
        self,
        dst: &DeviceSliceMut<'_, T>,
        src: &DeviceSlice<'_, T>,
    ) -> Result<CopyPath, Error> {
        let open = src.reachable_from(dst.device()) || dst.reachable_from(src.device());
        match self {
            Route::Auto | Route::Direct if open => Ok(CopyPath::Direct),
            Route::Auto | Route::Staged => Ok(CopyPath::Staged),
            Route::Direct => Err(Error::NoPeerAccess {
                device: dst.device().as_raw(),
                owner: src.device().as_raw(),
            }),
        }
    }
}

/// The path a copy took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CopyPath {
    /// One `cuMemcpyDtoD`, in a context whose device reaches both views' memory: the destination's
    /// where the source is open to it, else the source's. Between two devices it runs over the peer
    /// peer link at the link's speed.
    Direct,
    /// Through pinned host memory: chunks go device → host on a stream of the source's context and
    /// host → device on a stream of the destination's, double-buffered so both legs overlap.
    Staged,
}

/// The chunk size of the staged path: large enough to run both legs near their full speed.
pub const STAGING_CHUNK_BYTES: usize = 8 << 20;

/// Copies `src` into `dst` (same length), on the path `route` asks for, and says which path it took.
/// Returns once the copy has finished, on every path, also where it fails: no copy is left in flight.
///
/// The two views may belong to different devices. The direct path runs only where one device can
/// reach the other's memory while the views live ([`Route`]); the staged path reads and writes each
/// view only from its own context. With [`Route::Auto`] the copy stays correct (and the bytes
/// identical) whatever the topology and whatever access is open.
///
/// To copy between two devices at the link's speed, open the source to the destination's device for
/// as long as the copies run, and copy from the view that the opening gives:
/// - VMM memory: [`Mapping::grant_scoped`](crate::Mapping::grant_scoped) (or `grant_all`) naming both
///   devices; the scoped grant is revoked when it ends.
/// - `cuMemAlloc` memory ([`DeviceBuffer`](crate::DeviceBuffer)): [`PeerAccess::open`](crate::PeerAccess::open)
///   from the destination's context to the source's, then
///   [`peer_slice`](crate::DeviceBuffer::peer_slice); access ends with the guard. Enabling peer
///   access costs milliseconds: keep the guard for a phase of copies, not one copy.
///
/// # Errors
/// [`Error::LengthMismatch`] where the lengths differ; [`Error::NoPeerAccess`] for [`Route::Direct`]
/// where neither device reaches the other's memory (before any driver call); the driver's error
/// otherwise (e.g. [`DriverError::OUT_OF_MEMORY`](crate::DriverError::OUT_OF_MEMORY) when no pinned
/// staging memory can be had). Staging resources are released on every path.
///
/// # Examples
/// ```no_run
/// use cuda_vmm::{Context, Device, DeviceBuffer, PeerAccess, Route, CopyPath, copy_between};
///
/// # fn main() -> Result<(), cuda_vmm::Error> {
/// let (gpu0, gpu1) = (Context::new(Device::get(0)?)?, Context::new(Device::get(1)?)?);
/// let src = DeviceBuffer::<f32>::zeroed(&gpu0, 1 << 20)?;
/// let mut dst = DeviceBuffer::<f32>::zeroed(&gpu1, 1 << 20)?;
///
/// // Without access, Auto stages through pinned host memory and Direct is refused.
/// assert_eq!(copy_between(&mut dst.as_mut_slice(), &src.as_slice(), Route::Auto)?, CopyPath::Staged);
///
/// // GPU 1 reads GPU 0's memory over the link while the guard lives.
/// let link = PeerAccess::open(&gpu1, &gpu0)?;
/// let path = copy_between(&mut dst.as_mut_slice(), &src.peer_slice(&link)?, Route::Direct)?;
/// assert_eq!(path, CopyPath::Direct);
/// # Ok(())
/// # }
/// ```
pub fn copy_between<T: Pod>(
    dst: &mut DeviceSliceMut<'_, T>,
    src: &DeviceSlice<'_, T>,
    route: Route,
) -> Result<CopyPath, Error> {
    copy(dst, src, route, None)
}

/// As [`copy_between`], with the pinned memory of the staged path taken from `staging` rather than
/// allocated for this copy: pinning host memory costs far more than a chunk's transfer, so a caller that
/// copies repeatedly keeps one [`Staging`].
///
/// # Errors
/// As [`copy_between`].
pub fn copy_between_with<T: Pod>(
    dst: &mut DeviceSliceMut<'_, T>,
    src: &DeviceSlice<'_, T>,
    route: Route,
    staging: &mut Staging,
) -> Result<CopyPath, Error> {
    copy(dst, src, route, Some(staging))
}

fn copy<T: Pod>(
    dst: &mut DeviceSliceMut<'_, T>,
    src: &DeviceSlice<'_, T>,
    route: Route,
    staging: Option<&mut Staging>,
) -> Result<CopyPath, Error> {
    if dst.len() != src.len() {
        return Err(Error::LengthMismatch {
            expected: dst.len(),
            found: src.len(),
        });
    }
    let path = route.path(dst, src)?;
    let (dst_ptr, _, dst_ctx) = dst.as_slice().parts();
    let (src_ptr, len, src_ctx) = src.parts();
    let bytes = len * size_of::<T>();
    if bytes == 0 {
        return Ok(path);
    }
    match path {
        CopyPath::Direct => {
            // `path` found one device that reaches both ranges: the destination's where the source is
            // open to it (always on one device), else the source's (the destination is open to it).
            let context = if src.reachable_from(dst.device()) {
                dst_ctx
            } else {
                src_ctx
            };
            copy_device_to_device(context, dst_ptr, src_ptr, bytes)?;
        }
        CopyPath::Staged => {
            let mut own = None;
            let staging = match staging {
                Some(staging) => staging,
                None => own.insert(Staging::new(src_ctx, STAGING_CHUNK_BYTES.min(bytes))?),
            };
            staged(dst_ptr, dst_ctx, src_ptr, src_ctx, bytes, staging)?;
        }
    }
    Ok(path)
}

/// A stream of one context, destroyed on drop.
struct Stream<'c> {
    raw: sys::CUstream,
    context: &'c Context,
}

impl<'c> Stream<'c> {
    fn new(context: &'c Context) -> Result<Stream<'c>> {
        context.bind_to_thread()?;
        let mut raw: sys::CUstream = ptr::null_mut();
        // SAFETY: `raw` is writable; a context is current. Non-blocking: no implicit sync with the
        // legacy stream of other work.
        check(unsafe { sys::cuStreamCreate(&raw mut raw, sys::CU_STREAM_NON_BLOCKING) })?;
        Ok(Stream { raw, context })
    }

    fn synchronize(&self) -> Result<()> {
        // SAFETY: `self.raw` is a live stream.
        check(unsafe { sys::cuStreamSynchronize(self.raw) })
    }
}

impl Drop for Stream<'_> {
    fn drop(&mut self) {
        // Wait first: the staging memory the stream may still read is freed after the streams.
        let _ = self.synchronize();
        if self.context.bind_to_thread().is_ok() {
            // SAFETY: a live stream of this context, destroyed once. Errors are ignored (`drop`).
            let _ = unsafe { sys::cuStreamDestroy_v2(self.raw) };
        }
    }
}

/// An event without timing of one context, destroyed on drop.
struct Event<'c> {
    raw: sys::CUevent,
    context: &'c Context,
}

impl<'c> Event<'c> {
    fn new(context: &'c Context) -> Result<Event<'c>> {
        context.bind_to_thread()?;
        let mut raw: sys::CUevent = ptr::null_mut();
        // SAFETY: `raw` is writable; a context is current.
        check(unsafe { sys::cuEventCreate(&raw mut raw, sys::CU_EVENT_DISABLE_TIMING) })?;
        Ok(Event { raw, context })
    }

    fn record(&self, stream: &Stream<'_>) -> Result<()> {
        // SAFETY: a live event and a live stream (events may be recorded on a stream of their context).
        check(unsafe { sys::cuEventRecord(self.raw, stream.raw) })
    }

    fn synchronize(&self) -> Result<()> {
        // SAFETY: a live event.
        check(unsafe { sys::cuEventSynchronize(self.raw) })
    }
}

impl Drop for Event<'_> {
    fn drop(&mut self) {
        // Destroyed with its own context current, as the driver requires of calls on its objects.
        // Without it the event is leaked (errors are ignored: `drop`).
        if self.context.bind_to_thread().is_ok() {
            // SAFETY: a live event of the current context, destroyed once; the driver defers the
            // release until it completes.
            let _ = unsafe { sys::cuEventDestroy_v2(self.raw) };
        }
    }
}

/// Page-locked host memory usable by every context (`CU_MEMHOSTALLOC_PORTABLE`), freed on drop.
struct PinnedHost {
    ptr: *mut c_void,
}

impl PinnedHost {
    fn new(bytes: usize) -> Result<PinnedHost> {
        let mut ptr: *mut c_void = ptr::null_mut();
        // SAFETY: `ptr` is writable; portable pinned memory needs no particular current context, but one
        // is current (bound by the caller).
        check(unsafe { sys::cuMemHostAlloc(&raw mut ptr, bytes, sys::CU_MEMHOSTALLOC_PORTABLE) })?;
        Ok(PinnedHost { ptr })
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        // Its owner ([`Staging`]) has made the context the memory was pinned in current (its `Drop`
        // runs before its fields'; `Staging::new` binds it before making any).
        // SAFETY: memory from `cuMemHostAlloc`, freed once. Only `staged` queues work on it, and its
        // streams are synchronised (when dropped) before it returns. Errors are ignored (`drop`).
        let _ = unsafe { sys::cuMemFreeHost(self.ptr) };
    }
}

/// Two chunks of pinned host memory for the staged path of [`copy_between_with`], reusable across
/// copies and devices (`CU_MEMHOSTALLOC_PORTABLE`). Freed on drop.
///
/// It keeps the primary context it was made in retained: pinned memory belongs to that context, and a
/// primary context released by its last user is reset, which would unpin the memory (and let the
/// driver hand the same addresses to someone else) while `Staging` still owned it.
pub struct Staging {
    /// Declared before `context`, so freed while the context is still retained.
    buffers: [PinnedHost; 2],
    chunk: usize,
    context: Context,
}

// SAFETY: `Staging` owns its page-locked host memory outright (no other pointer to it exists outside a
// copy, which borrows `Staging` mutably), and keeps the context it belongs to retained; portable
// pinned memory has no thread or context affinity, and `Context` is `Send`.
unsafe impl Send for Staging {}
// SAFETY: `&Staging` gives access to nothing but the chunk size.
unsafe impl Sync for Staging {}

impl Drop for Staging {
    fn drop(&mut self) {
        // `cuMemFreeHost` (the buffers' `Drop`, which runs right after this) needs a current context,
        // and `Staging` is `Send`: it may be dropped on a thread where no context, or another, is
        // current. Bind the one the memory belongs to. Errors are ignored (`drop`).
        let _ = self.context.bind_to_thread();
    }
}

impl core::fmt::Debug for Staging {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Staging")
            .field("chunk_bytes", &self.chunk)
            .finish_non_exhaustive()
    }
}

impl Staging {
    /// `cuMemHostAlloc` — two pinned chunks of `chunk_bytes` each (made with `context` current).
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for a zero chunk size; the driver's error otherwise.
    #[doc(alias = "cuMemHostAlloc")]
    pub fn new(context: &Context, chunk_bytes: usize) -> Result<Staging, Error> {
        if chunk_bytes == 0 {
            return Err(Error::ZeroSize {
                what: "staging chunk",
            });
        }
        let context = Context::new(context.device())?;
        context.bind_to_thread()?;
        let buffers = [PinnedHost::new(chunk_bytes)?, PinnedHost::new(chunk_bytes)?];
        Ok(Staging {
            buffers,
            chunk: chunk_bytes,
            context,
        })
    }

    /// The device whose primary context the memory was made in (and which `Staging` keeps retained).
    #[must_use]
    pub fn device(&self) -> Device {
        self.context.device()
    }

    /// The size of each chunk in bytes.
    #[must_use]
    pub fn chunk_bytes(&self) -> usize {
        self.chunk
    }
}

/// The double-buffered staged copy of `bytes` from `src` (reachable from `src_ctx`) to `dst`
/// (reachable from `dst_ctx`), in chunks of the staging memory's size.
fn staged(
    dst: sys::CUdeviceptr,
    dst_ctx: &Context,
    src: sys::CUdeviceptr,
    src_ctx: &Context,
    bytes: usize,
    staging: &mut Staging,
) -> Result<(), Error> {
    let (buffers, chunk) = (&staging.buffers, staging.chunk);
    // The streams are dropped (and so synchronised) before `staging` is released by the caller.
    let down_done = [Event::new(src_ctx)?, Event::new(src_ctx)?];
    let up_done = [Event::new(dst_ctx)?, Event::new(dst_ctx)?];
    let down = Stream::new(src_ctx)?;
    let up = Stream::new(dst_ctx)?;

    // The two buffers take turns, each with the event of its download and of its upload.
    let mut slots = buffers.iter().zip(&down_done).zip(&up_done).cycle();
    let mut offset = 0usize;
    let mut chunks = 0usize;
    while offset < bytes {
        // `cycle` over two slots never ends.
        let Some(((buffer, downloaded), uploaded)) = slots.next() else {
            break;
        };
        let n = chunk.min(bytes - offset);
        if chunks >= 2 {
            // This buffer was last read by the upload of the chunk two before this one.
            uploaded.synchronize()?;
        }
        src_ctx.bind_to_thread()?;
        // SAFETY: `buffer` is `chunk >= n` writable pinned bytes no queued work uses (checked just
        // above); `src + offset` is `n` bytes of device memory reachable from the current context.
        check(unsafe { sys::cuMemcpyDtoHAsync_v2(buffer.ptr, src + offset as u64, n, down.raw) })?;
        downloaded.record(&down)?;
        dst_ctx.bind_to_thread()?;
        // SAFETY: a live stream and event; the event may belong to another context.
        check(unsafe { sys::cuStreamWaitEvent(up.raw, downloaded.raw, 0) })?;
        // SAFETY: the upload waits (above) for the download into `buffer`; `dst + offset` is `n`
        // bytes of exclusive device memory reachable from the current context.
        check(unsafe { sys::cuMemcpyHtoDAsync_v2(dst + offset as u64, buffer.ptr, n, up.raw) })?;
        uploaded.record(&up)?;
        offset += n;
        chunks += 1;
    }
    down.synchronize()?;
    up.synchronize()?;
    Ok(())
}
