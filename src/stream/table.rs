//! [`BlockTable`]: a device array of block (page or slot) addresses that a kernel takes as one
//! argument, built only from views a scope lent, uploaded by queued work, refreshed between steps
//! without a host wait, and checked at every launch as each of its views would be.

use core::fmt;
use core::marker::PhantomData;

use bytemuck::Pod;

use crate::device::{Context, Device};
use crate::error::Error;
use crate::sys;
use crate::view::{DeviceBuffer, DeviceSlice};

use super::event::Event;
use super::launch::{KernelArg, Param};
use super::lend::{Origin, ScopedRead, ScopedWrite, lend_mut, reachable, sealed};
use super::pinned::PinnedBuffer;
use super::queue::Queue;
use super::rewritable::Rewritable;
use super::scope::ScopedStream;
#[cfg(doc)]
use super::{lend::DeviceInFlight, scope::scope};

/// A device array of up to `capacity` block addresses (`u64`s), each the address of a view of
/// `block_len` values of `T`, that a kernel takes as one argument (a `const T* const*`), the way a
/// paged-attention kernel takes a sequence's block table.
///
/// Made outside a scope; lent to one with [`in_scope`](BlockTable::in_scope), which binds it to
/// one stream of the scope for all of it. Inside:
/// - **Built only from lent views.** [`ScopedBlockTable::upload`] takes read-only lendables
///   ([`ScopedRead`]: a [`DeviceInFlight`] of a write or of a scoped buffer's range, a view borrowed
///   for the scope), each lent to the table's stream as a copy or a launch would lend it, and each
///   exactly `block_len` values long: no raw address enters the table. Blocks the kernels write
///   ([`ScopedBlockTable::upload_mut`]) are a scoped buffer's [`Rewritable`]s, lent for writing and
///   taken by the table.
/// - **Uploaded by queued work.** The addresses are written into pinned staging memory and copied
///   into the device array by `cuMemcpyHtoDAsync` on the table's stream, so a kernel queued after it
///   on that stream reads them. The staging memory is a ring of `depth` buffers, each reused only once
///   the copy that read it has completed (an event query, no wait): the host runs at most `depth`
///   uploads ahead of the stream, and an upload further ahead is refused
///   ([`Error::StreamRefused`]). The table is borrowed for the whole scope, so neither the staging
///   memory nor the device array is freed before the scope's wait.
/// - **Checked at every launch.** As an argument of [`ScopedStream::launch`] (`&table`), every view
///   of the current upload is admitted again, as a lend of it would be: one whose pages were retired
///   since is refused ([`Error::PageRange`], naming its bytes), and a retire records its events after
///   the launch (whose admission it waits for), so a page named by a table is released only after
///   every kernel that used the table has completed. A launch on another stream than the table's is
///   refused ([`Error::StreamRefused`]), so each upload is ordered between the kernels before and
///   after it; so is a capture into a graph.
///
/// The kernel's contract (the launch's `# Safety`) gains one line: it reads at most `block_len`
/// values through each of the first `len` addresses, and writes none, unless the last upload was
/// [`upload_mut`](ScopedBlockTable::upload_mut)'s (then it may write them too).
///
/// # Examples
/// ```no_run
/// use cuda_vmm::stream::BlockTable;
/// use cuda_vmm::{Context, Device, Module, PinnedBuffer, ReadWrite, Stream, VirtualBuffer};
///
/// # fn main() -> cuda_vmm::Result<()> {
/// # let ptx = c"";
/// let device = Device::get(0)?;
/// let context = Context::new(device)?;
/// let module = Module::load_ptx(&context, ptx)?;
/// // gather(u32 *out, const u32 *const *table, u32 blocks, u32 block_len)
/// let gather = module.function(c"gather")?;
/// let mut cache = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
/// let block = 1024; // u32s
/// let mut table = BlockTable::<u32>::new(&context, 64, block, 2)?;
/// let input = PinnedBuffer::from_slice(&context, &vec![5u32; block])?;
/// let mut out = cuda_vmm::DeviceBuffer::<u32>::zeroed(&context, 2 * block)?;
/// let mut out_view = out.as_mut_slice();
/// let stream = Stream::new(&context)?;
/// cuda_vmm::scope(|s| {
///     let work = s.on(&stream);
///     let cache = cache.in_scope(s);
///     let at = cache.grow(device, 2 << 20)?;
///     let mut a = cache.write::<u32>(at..at + 4 * block)?;
///     let mut b = cache.write::<u32>(at + 4 * block..at + 8 * block)?;
///     let a = work.copy_from_host(&mut a, &input)?;
///     let b = work.copy_from_host(&mut b, &input)?;
///     let mut table = table.in_scope(work);
///     table.upload([a, b])?;
///     // SAFETY: `gather` takes these four parameters, reads `block_len` values through each of
///     // the first `blocks` addresses of the table and writes `blocks * block_len` values of `out`.
///     unsafe { work.launch(&gather, (8, 1, 1), (256, 1, 1), (&mut out_view, &table, 2u32, block as u32))? };
///     Ok(())
/// })?;
/// # Ok(())
/// # }
/// ```
pub struct BlockTable<T> {
    /// The addresses, as the kernel reads them.
    device: DeviceBuffer<u64>,
    /// The ring of staging buffers, each with the event recorded after the copy that read it last.
    staging: Vec<(PinnedBuffer<u64>, Event)>,
    /// The ring's next buffer.
    next: usize,
    block_len: usize,
    /// Blocks of `T`: the table holds addresses, no `T`. Covariant, `Send` and `Sync` as a
    /// function pointer is.
    _blocks: PhantomData<fn() -> T>,
}

impl<T> fmt::Debug for BlockTable<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockTable")
            .field("capacity", &self.device.len())
            .field("block_len", &self.block_len)
            .field("depth", &self.staging.len())
            .finish_non_exhaustive()
    }
}

impl<T: Pod> BlockTable<T> {
    /// `cuMemAlloc`, `cuMemHostAlloc`, `cuEventCreate` — a table of up to `capacity` blocks of
    /// `block_len` values of `T` each, in `context`'s device memory, with `depth` staging buffers.
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for a zero capacity, block length or depth (before any driver call); the
    /// driver's error otherwise.
    #[doc(alias = "cuMemAlloc")]
    pub fn new(
        context: &Context,
        capacity: usize,
        block_len: usize,
        depth: usize,
    ) -> Result<BlockTable<T>, Error> {
        for (n, what) in [
            (capacity, "block table capacity"),
            (block_len, "block length"),
            (depth, "block table depth"),
        ] {
            if n == 0 {
                return Err(Error::ZeroSize { what });
            }
        }
        let device = DeviceBuffer::zeroed(context, capacity)?;
        let staging = (0..depth)
            .map(|_| {
                Ok((
                    PinnedBuffer::zeroed(context, capacity)?,
                    Event::new(context)?,
                ))
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(BlockTable {
            device,
            staging,
            next: 0,
            block_len,
            _blocks: PhantomData,
        })
    }

    /// The most blocks an upload holds.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.device.len()
    }

    /// The values of `T` each block holds.
    #[must_use]
    pub fn block_len(&self) -> usize {
        self.block_len
    }

    /// The device whose memory holds the table.
    #[must_use]
    pub fn device(&self) -> Device {
        self.device.as_slice().device()
    }

    /// Lends the table to the scope of `stream` for all of it, bound to `stream`: uploads are
    /// queued on it, and only kernels on it take the table. No driver call.
    pub fn in_scope<'scope>(
        &'scope mut self,
        stream: ScopedStream<'scope>,
    ) -> ScopedBlockTable<'scope, T> {
        ScopedBlockTable {
            table: self,
            stream,
            blocks: Vec::new(),
            written: false,
        }
    }
}

/// A [`BlockTable`] lent to a scope ([`BlockTable::in_scope`]), bound to one of its streams: what
/// [`upload`](ScopedBlockTable::upload) fills and a kernel on that stream takes as one argument
/// (`&table`).
///
/// # Lifetimes
/// `'scope` is the scope's: the table is borrowed exclusively for all of it.
pub struct ScopedBlockTable<'scope, T> {
    table: &'scope mut BlockTable<T>,
    stream: ScopedStream<'scope>,
    /// The views of the last upload, each admitted again at every launch.
    blocks: Vec<(DeviceSlice<'scope, T>, Option<Origin<'scope>>)>,
    /// Whether the last upload lent its blocks for writing ([`upload_mut`](ScopedBlockTable::upload_mut)).
    written: bool,
}

impl<T> fmt::Debug for ScopedBlockTable<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedBlockTable")
            .field("table", &self.table)
            .field("blocks", &self.blocks.len())
            .finish_non_exhaustive()
    }
}

impl<'scope, T: Pod> ScopedBlockTable<'scope, T> {
    /// The number of blocks of the last upload.
    #[must_use]
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether the last upload held none (or nothing was uploaded yet).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// `cuEventQuery`, `cuMemcpyHtoDAsync`, `cuEventRecord` — the addresses of `blocks`, in order,
    /// uploaded into the table by a copy queued on its stream: kernels queued after it on that
    /// stream read them, kernels queued before it read the upload before. No host wait.
    ///
    /// # Errors
    /// Before any driver call: [`Error::OutOfBounds`] for more blocks than the capacity;
    /// [`Error::LengthMismatch`] for a view of another length than `block_len`;
    /// [`Error::DeviceMismatch`] for a table of another device than its stream's;
    /// [`Error::NoPeerAccess`] for a view the table's device does not reach; a view's lend refused
    /// ([`Error::PageRange`] for retired pages, [`Error::StreamRefused`] for a view of another
    /// scope or bound to another stream). Then [`Error::StreamCapturing`] where the stream is
    /// capturing; [`Error::StreamRefused`] where the staging buffer's last copy has not completed
    /// (the host is `depth` uploads ahead); the driver's error otherwise. On an error before the
    /// copy is queued the table keeps its last upload; where the event after a queued copy is
    /// refused, the table holds the new blocks, and the call waits for the stream (the only host
    /// wait, so that the staging buffer is never written under its copy).
    #[doc(alias = "cuMemcpyHtoDAsync")]
    pub fn upload<V: ScopedRead<'scope, T>>(
        &mut self,
        blocks: impl IntoIterator<Item = V>,
    ) -> Result<(), Error> {
        let token = Queue::token(&self.stream);
        let device = self.checked_device()?;
        let mut lent = Vec::new();
        let mut held = Vec::new();
        for block in blocks {
            self.check_room(lent.len())?;
            block.check_reach(device)?;
            let (view, origin, counted) = block.lend(token)?.into_parts();
            self.check_len(view.len())?;
            lent.push((view, origin));
            held.push(counted);
        }
        self.queue_upload(lent, held, false)
    }

    /// As [`upload`](ScopedBlockTable::upload), for blocks the kernels write: each a
    /// [`Rewritable`] of a scoped buffer, lent for writing to the table's stream (refused where it
    /// is bound to another, [`Error::StreamRefused`]) and taken by the table, so that no other work
    /// writes it; every launch admits each again as a write lend, so a block read
    /// back (`ScopedBuffer::read_back`) or reused since is
    /// refused, and a read back of it is ordered after the table's stream. The kernel may write at
    /// most `block_len` values through each of the first `len` addresses.
    ///
    /// # Errors
    /// As [`upload`](ScopedBlockTable::upload).
    ///
    /// # Examples
    /// A kernel appends one token's K/V into the last block of each of two sequences, through one
    /// table; the blocks are read back on another stream:
    /// ```no_run
    /// use cuda_vmm::stream::BlockTable;
    /// use cuda_vmm::{Context, Device, Module, PinnedBuffer, ReadWrite, Stream, VirtualBuffer};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// # let ptx = c"";
    /// let device = Device::get(0)?;
    /// let context = Context::new(device)?;
    /// let module = Module::load_ptx(&context, ptx)?;
    /// // scatter(u32 *const *table, const u32 *src, u32 blocks, u32 block_len)
    /// let scatter = module.function(c"scatter")?;
    /// let block = 1024; // u32s
    /// let mut cache = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// let mut table = BlockTable::<u32>::new(&context, 64, block, 2)?;
    /// let tokens = PinnedBuffer::from_slice(&context, &vec![9u32; 2 * block])?;
    /// let mut src = cuda_vmm::DeviceBuffer::<u32>::zeroed(&context, 2 * block)?;
    /// let mut src_view = src.as_mut_slice();
    /// let mut back = PinnedBuffer::<u32>::zeroed(&context, block)?;
    /// let (work, other) = (Stream::new(&context)?, Stream::new(&context)?);
    /// cuda_vmm::scope(|s| {
    ///     let (work, other) = (s.on(&work), s.on(&other));
    ///     let cache = cache.in_scope(s);
    ///     let at = cache.grow(device, 2 << 20)?;
    ///     let src = work.copy_from_host(&mut src_view, &tokens)?;
    ///     let first = cache.write::<u32>(at..at + 4 * block)?;
    ///     let second = cache.write::<u32>(at + 4 * block..at + 8 * block)?;
    ///     let mut table = table.in_scope(work);
    ///     table.upload_mut([first, second])?;
    ///     // SAFETY: `scatter` takes these four parameters, writes `block_len` values through each
    ///     // of the first `blocks` addresses of the table and reads `blocks * block_len` of `src`.
    ///     unsafe { work.launch(&scatter, (8, 1, 1), (256, 1, 1), (&table, src, 2u32, block as u32))? };
    ///     let first = cache.read_back::<u32>(at..at + 4 * block, other)?; // after the kernel
    ///     other.copy_to_host(&mut back, first)?;
    ///     Ok(())
    /// })?;
    /// assert!(back.iter().all(|&v| v == 9));
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuMemcpyHtoDAsync")]
    pub fn upload_mut(
        &mut self,
        blocks: impl IntoIterator<Item = Rewritable<'scope, T>>,
    ) -> Result<(), Error> {
        let token = Queue::token(&self.stream);
        let device = self.checked_device()?;
        let mut lent = Vec::new();
        let mut held = Vec::new();
        for mut block in blocks {
            self.check_room(lent.len())?;
            ScopedWrite::check_reach(&&mut block, device)?;
            let (view, origin, counted) = lend_mut(&mut block, token)?.into_parts();
            self.check_len(view.len())?;
            lent.push((view, origin));
            held.push(counted);
        }
        self.queue_upload(lent, held, true)
    }

    /// The table's device, which must be its stream's.
    fn checked_device(&self) -> Result<Device, Error> {
        let device = self.table.device();
        if self.stream.device() == device {
            Ok(device)
        } else {
            Err(Error::DeviceMismatch {
                expected: self.stream.device().as_raw(),
                found: device.as_raw(),
            })
        }
    }

    /// `Ok` where one more block than `count` fits.
    fn check_room(&self, count: usize) -> Result<(), Error> {
        let capacity = self.table.capacity();
        if count < capacity {
            Ok(())
        } else {
            Err(Error::OutOfBounds {
                what: "block table",
                start: 0,
                end: capacity.saturating_add(1),
                len: capacity,
            })
        }
    }

    /// `Ok` where a view of `len` values is one block long.
    fn check_len(&self, len: usize) -> Result<(), Error> {
        if len == self.table.block_len {
            Ok(())
        } else {
            Err(Error::LengthMismatch {
                expected: self.table.block_len,
                found: len,
            })
        }
    }

    /// Queues the upload of the addresses of `lent` (lent for writing where `written`), whose lends
    /// are counted in `held` until the copy is queued.
    fn queue_upload(
        &mut self,
        lent: Vec<(DeviceSlice<'scope, T>, Option<Origin<'scope>>)>,
        held: Vec<sealed::Counted<'scope>>,
        written: bool,
    ) -> Result<(), Error> {
        Queue::admit(&self.stream)?;
        let ring = self.table.staging.len();
        let slot = self.table.next % ring;
        let (staging, event) = self.table.staging.get_mut(slot).ok_or(Error::ZeroSize {
            what: "block table depth",
        })?;
        if !event.is_complete()? {
            return Err(Error::StreamRefused {
                why: "the block table's staging buffer is still being copied: the host is `depth` \
                      uploads ahead of the table's stream",
            });
        }
        staging.fill_with(|i| lent.get(i).map_or(0, |(view, _)| view.as_raw_ptr()));
        let bytes = lent.len().saturating_mul(size_of::<u64>());
        if bytes > 0 {
            // SAFETY: `device` holds `capacity` u64s of the table's own device memory, which no
            // other work uses but the kernels on this stream (ordered before and after this copy),
            // and `staging` at least `lent.len()` (at most `capacity`) page-locked u64s that the host
            // writes again only once the event recorded below has completed. Both are borrowed for
            // `'scope` (`in_scope`), so neither is freed before the scope's wait. The stream's context
            // is current (`Queue::admit`).
            unsafe {
                self.stream.copy_from_host_raw(
                    self.table.device.as_slice().as_raw_ptr(),
                    staging.as_ptr().cast(),
                    bytes,
                )?;
            }
        }
        // From here on, in stream order, the device array holds these blocks' addresses.
        self.blocks = lent;
        self.written = written;
        drop(held);
        if let Err(e) = self.stream.record(event) {
            // The staging buffer's event does not cover the copy: wait for the copy before the
            // buffer can be written again. The wait returns only once the work has finished (or the
            // context is proven dead, when no copy runs), so its own error changes nothing here.
            let _ = self.stream.synchronize();
            return Err(e);
        }
        self.table.next = self.table.next.wrapping_add(1);
        Ok(())
    }
}

impl<T: Pod> sealed::Arg for &ScopedBlockTable<'_, T> {}
impl<'scope, T: Pod> KernelArg<'scope> for &ScopedBlockTable<'scope, T> {
    type Output = ();
    type Param = sys::CUdeviceptr;
    fn check(&self, device: Device) -> Result<(), Error> {
        reachable(&self.table.device.as_slice(), device)?;
        for (view, _) in &self.blocks {
            reachable(view, device)?;
        }
        Ok(())
    }
    fn into_param(self, token: sealed::Token) -> Result<Param<'scope, Self>, Error> {
        if token.capture {
            return Err(Error::StreamRefused {
                why: "a block table is not captured into a graph: its next upload rewrites the \
                      addresses the graph would read",
            });
        }
        if token.stream != self.stream.id() {
            return Err(Error::StreamRefused {
                why: "a block table is taken only by kernels on its own stream, where each upload is \
                      ordered between the kernels before and after it",
            });
        }
        let mut counted = sealed::Counted(None, Vec::new());
        for (view, origin) in &self.blocks {
            if let Some(origin) = origin {
                let slot = origin.admit(view, token.stream, self.written)?;
                counted.1.push((origin.pages, slot));
            }
        }
        let table = self.table.device.as_slice().as_raw_ptr();
        // The kernel reads the table, and the blocks through it; a capture is refused above, so no
        // touch is recorded.
        Ok((table, (), counted, None))
    }
}
