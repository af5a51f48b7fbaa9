//! Device-to-device copies across devices, with a portable fallback through pinned host memory.

use core::ffi::c_void;

use bytemuck::Pod;

use crate::device::{Context, Device};
use crate::error::{Error, first_error};
use crate::stream::{Event, PinnedBuffer, Stream};
use crate::sys;
use crate::view::{DeviceSlice, DeviceSliceMut, copy_device_to_device};

/// Which path [`copy_between`] should take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Route {
    /// [`CopyPath::Direct`] where one view's device can reach the other view's memory (see
    /// [`DeviceSlice::reachable_from`]), [`CopyPath::Staged`] otherwise. Between two devices the
    /// direct path is taken only where access is open (a grant that names the other device, or a peer
    /// view under a [`PeerAccess`](crate::PeerAccess) guard): a device that merely *could* access the
    /// other ([`can_access_peer`](crate::peer::can_access_peer)) but has no access yet gets the staged path,
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
/// - VMM memory: [`Mapping::grant_revocable`](crate::Mapping::grant_revocable) (or `grant_all`)
///   naming both devices; the revocable grant is revoked when it ends.
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
/// use cuda_vmm::{Context, Device, DeviceBuffer, PeerAccess, peer::Route, peer::CopyPath, copy_between};
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

/// Two chunks of pinned host memory for the staged path of [`copy_between_with`], reusable across
/// copies and devices (`CU_MEMHOSTALLOC_PORTABLE`). Freed on drop.
///
/// Each chunk is a [`PinnedBuffer`], which keeps the primary context it was pinned in retained: a
/// primary context released by its last user is reset, which would unpin the memory (and let the
/// driver hand the same addresses to someone else) while `Staging` still owned it.
pub struct Staging {
    buffers: [PinnedBuffer<u8>; 2],
}

impl core::fmt::Debug for Staging {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Staging")
            .field("chunk_bytes", &self.chunk_bytes())
            .finish_non_exhaustive()
    }
}

impl Staging {
    /// `cuMemHostAlloc` — two pinned chunks of `chunk_bytes` each (pinned in `context`).
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
        Ok(Staging {
            buffers: [
                PinnedBuffer::zeroed(context, chunk_bytes)?,
                PinnedBuffer::zeroed(context, chunk_bytes)?,
            ],
        })
    }

    /// The device whose primary context the memory was pinned in (and which `Staging` keeps
    /// retained).
    #[must_use]
    pub fn device(&self) -> Device {
        let [first, _] = &self.buffers;
        first.device()
    }

    /// The size of each chunk in bytes.
    #[must_use]
    pub fn chunk_bytes(&self) -> usize {
        let [first, _] = &self.buffers;
        first.len()
    }
}

/// The double-buffered staged copy of `bytes` from `src` (reachable from `src_ctx`) to `dst`
/// (reachable from `dst_ctx`), in chunks of the staging memory's size: downloads on a stream of the
/// source's context, uploads on one of the destination's, each upload waiting for its download and
/// each download for the upload that last read its buffer. Returns once both streams are idle, on
/// every path: no copy is left in flight on the staging memory.
fn staged(
    dst: sys::CUdeviceptr,
    dst_ctx: &Context,
    src: sys::CUdeviceptr,
    src_ctx: &Context,
    bytes: usize,
    staging: &mut Staging,
) -> Result<(), Error> {
    let down = Stream::new(src_ctx)?;
    let up = Stream::new(dst_ctx)?;
    let down_done = [Event::new(src_ctx)?, Event::new(src_ctx)?];
    let up_done = [Event::new(dst_ctx)?, Event::new(dst_ctx)?];
    let queued = queue_chunks(
        (dst, &up, &up_done),
        (src, &down, &down_done),
        bytes,
        staging,
    );
    // Whatever was queued reads or writes `staging`, which the caller gets back (or frees) once this
    // returns: wait for both streams in any case, then report the first error.
    let waited = first_error([down.synchronize(), up.synchronize()]);
    queued?;
    waited
}

/// One leg of [`staged`]: the device address, the stream and the events of its two buffers.
type Leg<'a> = (sys::CUdeviceptr, &'a Stream, &'a [Event; 2]);

/// Queues the chunks of [`staged`]; the caller waits for both streams, also where this fails.
fn queue_chunks(
    (dst, up, up_done): Leg<'_>,
    (src, down, down_done): Leg<'_>,
    bytes: usize,
    staging: &mut Staging,
) -> Result<(), Error> {
    let chunk = staging.chunk_bytes();
    let [first, second] = &mut staging.buffers;
    let buffers = [first.as_mut_ptr(), second.as_mut_ptr()];

    // The two buffers take turns, each with the event of its download and of its upload.
    let mut slots = buffers.iter().zip(down_done).zip(up_done).cycle();
    let mut offset = 0usize;
    let mut chunks = 0usize;
    while offset < bytes {
        // `cycle` over two slots never ends.
        let Some(((&buffer, downloaded), uploaded)) = slots.next() else {
            break;
        };
        let n = chunk.min(bytes - offset);
        if chunks >= 2 {
            // This buffer was last read by the upload of the chunk two before this one.
            uploaded.synchronize()?;
        }
        // SAFETY: `buffer` is `chunk >= n` writable bytes of pinned memory, borrowed mutably from
        // `staging` for this call, which no queued work uses (checked just above); `src + offset` is
        // `n` bytes of device memory reachable from the download stream's device. The caller waits
        // for the stream before `staging` is released.
        unsafe { down.copy_to_host_raw(buffer.cast::<c_void>(), src + offset as u64, n) }?;
        down.record(downloaded)?;
        up.wait(downloaded)?;
        // SAFETY: the upload waits (just above) for the download into `buffer`; `dst + offset` is `n`
        // bytes of exclusive device memory reachable from the upload stream's device. The caller
        // waits for the stream before `staging` is released.
        unsafe { up.copy_from_host_raw(dst + offset as u64, buffer.cast::<c_void>(), n) }?;
        up.record(uploaded)?;
        offset += n;
        chunks += 1;
    }
    Ok(())
}
