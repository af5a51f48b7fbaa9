//! Device-to-device copies across devices, with a portable fallback through pinned host memory.

use core::ffi::c_void;
use core::ptr;

use bytemuck::Pod;

use crate::device::{Context, Device};
use crate::error::{Error, Result, check};
use crate::peer::can_access_peer;
use crate::sys;
use crate::view::{DeviceSlice, DeviceSliceMut};

/// Which path [`copy_between`] should take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Route {
    /// [`CopyPath::Direct`] where the destination device can reach the source device
    /// ([`can_access_peer`]) or both views are on one device; [`CopyPath::Staged`] otherwise.
    #[default]
    Auto,
    /// Always [`CopyPath::Direct`].
    Direct,
    /// Always [`CopyPath::Staged`], also on one device (to compare the paths, or to avoid the
    /// peer link).
    Staged,
}

impl Route {
    /// The path [`copy_between`] takes on this route for a copy from a view on `src` to a view on
    /// `dst` (for [`Route::Auto`]: `cuDeviceCanAccessPeer(dst, src)`). Changes nothing.
    ///
    /// # Errors
    /// The driver's error from the peer query, if any.
    pub fn path(self, dst: Device, src: Device) -> Result<CopyPath> {
        let direct = match self {
            Route::Direct => true,
            Route::Staged => false,
            Route::Auto => dst == src || can_access_peer(dst, src)?.is_some(),
        };
        Ok(if direct {
            CopyPath::Direct
        } else {
            CopyPath::Staged
        })
    }
}

/// The path a copy took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CopyPath {
    /// One driver copy: `cuMemcpyDtoD` on one device, `cuMemcpyPeer` between two. Between two devices
    /// it uses the peer link directly where context peer access is enabled for the pair (a
    /// [`PeerAccess`](crate::PeerAccess) from the destination's context), and is staged by the driver
    /// otherwise.
    Direct,
    /// Through pinned host memory: chunks go device → host on a stream of the source's context and
    /// host → device on a stream of the destination's, double-buffered so both legs overlap.
    Staged,
}

/// The chunk size of the staged path: large enough to run both legs near their full speed.
pub const STAGING_CHUNK_BYTES: usize = 8 << 20;

/// Copies `src` into `dst` (same length), on the path `route` asks for, and says which path it took.
/// Returns once the copy has finished.
///
/// The two views may belong to different devices; each is read or written only from its own context.
/// This is the chapter's fallback for systems where GPUs cannot reach each other: with
/// [`Route::Auto`] the copy stays correct (and the bytes identical) whatever the topology.
///
/// # Errors
/// [`Error::LengthMismatch`] where the lengths differ; the driver's error otherwise (e.g.
/// [`DriverError::OUT_OF_MEMORY`](crate::DriverError::OUT_OF_MEMORY) when no pinned staging memory
/// can be had). Staging resources are released on every path.
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
    let path = route.path(dst.device(), src.device())?;
    let (dst_ptr, _, dst_ctx) = dst.as_slice().parts();
    let (src_ptr, len, src_ctx) = src.parts();
    let bytes = len * size_of::<T>();
    if bytes == 0 {
        return Ok(path);
    }
    match path {
        CopyPath::Direct if dst.device() == src.device() => dst.copy_from_device(src)?,
        CopyPath::Direct => {
            dst_ctx.bind_to_thread()?;
            // SAFETY: each range is device memory reachable from its own context (the views'
            // invariants), `bytes` long; `dst` is exclusive. The driver reads through `src_ctx` and
            // writes through `dst_ctx`. Both contexts are synchronised below, so the copy has finished
            // before either view can go away.
            check(unsafe {
                sys::cuMemcpyPeer(dst_ptr, dst_ctx.as_raw(), src_ptr, src_ctx.as_raw(), bytes)
            })?;
            src_ctx.synchronize()?;
            dst_ctx.synchronize()?;
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

/// An event without timing, destroyed on drop.
struct Event {
    raw: sys::CUevent,
}

impl Event {
    fn new(context: &Context) -> Result<Event> {
        context.bind_to_thread()?;
        let mut raw: sys::CUevent = ptr::null_mut();
        // SAFETY: `raw` is writable; a context is current.
        check(unsafe { sys::cuEventCreate(&raw mut raw, sys::CU_EVENT_DISABLE_TIMING) })?;
        Ok(Event { raw })
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

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: a live event, destroyed once; the driver defers the release until it completes.
        // Errors are ignored (`drop`).
        let _ = unsafe { sys::cuEventDestroy_v2(self.raw) };
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

    let mut offset = 0usize;
    let mut i = 0usize;
    while offset < bytes {
        let n = chunk.min(bytes - offset);
        let b = i % 2;
        if i >= 2 {
            // Buffer `b` was last read by chunk `i - 2`'s upload.
            up_done[b].synchronize()?;
        }
        src_ctx.bind_to_thread()?;
        // SAFETY: `buffers[b]` is `chunk >= n` writable pinned bytes no queued work uses (checked just
        // above); `src + offset` is `n` bytes of device memory reachable from the current context.
        check(unsafe {
            sys::cuMemcpyDtoHAsync_v2(buffers[b].ptr, src + offset as u64, n, down.raw)
        })?;
        down_done[b].record(&down)?;
        dst_ctx.bind_to_thread()?;
        // SAFETY: a live stream and event; the event may belong to another context.
        check(unsafe { sys::cuStreamWaitEvent(up.raw, down_done[b].raw, 0) })?;
        // SAFETY: the upload waits (above) for the download into `buffers[b]`; `dst + offset` is `n`
        // bytes of exclusive device memory reachable from the current context.
        check(unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst + offset as u64, buffers[b].ptr, n, up.raw)
        })?;
        up_done[b].record(&up)?;
        offset += n;
        i += 1;
    }
    down.synchronize()?;
    up.synchronize()?;
    Ok(())
}
