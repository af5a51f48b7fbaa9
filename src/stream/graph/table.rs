//! [`GraphTable`]: a device table of block addresses that a graph uploads as its first node and its
//! kernels read, whose entries are set between replays from views a scope lent, and admitted and
//! counted at every replay as a lend of each would be.
//!
//! A [`ScopedGraph`] claims, once, the ranges its captured work touches. A paged kernel's reach is
//! not captured: it follows the addresses of a block table, which change every step. So the table
//! is part of the graph and of its replay:
//!
//! - **Uploaded by the graph itself, first.** [`Graph::capture_with_table`] queues the table's
//!   upload (`cuMemcpyHtoDAsync` from pinned staging memory into the table's device array) before
//!   the closure runs, and gives the closure the table only as a [`TableArg`] borrowed for the
//!   closure's call: every kernel that takes the table is captured after the upload, in stream
//!   order, so each replay's kernels read the addresses that replay uploaded, never an earlier
//!   replay's. A [`TableArg`] is refused by any queue but the capture that made it.
//! - **Entries from lends only.** [`ScopedGraph::set_read`] and [`ScopedGraph::set_write`] take
//!   what a launch takes ([`ScopedRead`] lendables; [`Rewritable`]s for the blocks the kernels
//!   write), each lent then to the table's stream (retired pages, claims and streams checked as a
//!   lend checks them) and exactly one block long: no raw address enters the table.
//! - **Admitted and counted at every replay.** [`ScopedStream::launch_scoped_graph`] admits every
//!   entry again, as a lend of its view: one whose page was retired since is refused, naming its
//!   bytes, before any driver call; each admission is counted until `cuGraphLaunch` has queued the
//!   replay, so a retire that runs meanwhile waits for it and records its events after it. Then
//!   the entries are written into a staging buffer the replay's upload reads
//!   (`cuGraphExecMemcpyNodeSetParams` points the node at it; queued replays keep the source they
//!   were launched with).
//! - **Staging never written under a queued replay.** The staging memory is a ring of `depth`
//!   buffers, each with the event recorded after the replay that read it last; a buffer is written
//!   again only once its event has completed (a query, no wait). A replay further ahead is refused
//!   ([`Error::StreamRefused`]): the host runs at most `depth` replays ahead of the table's stream.
//! - **Replayed on one stream, in a scope only.** The table is bound to one stream of the scope
//!   ([`ScopedRebind::table`]); a replay elsewhere is refused. A graph with a table is never
//!   replayed outside a scope ([`ScopedStream::launch_graph`] and [`Rebind::finish`] refuse it),
//!   so its upload never reads addresses that no replay admitted.
//!
//! Why no replay reaches a retired or unmapped page: the addresses a replay's kernels read are
//! those its own upload wrote, which are the entries admitted (and counted) for that replay; a
//! page is released only after every event of its retire, recorded on every stream of the scope
//! after every replay admitted before the retire marked the page; a replay admitted after the mark
//! is refused. Unset entries are null, and the kernel's contract is to read only through non-null
//! entries: so no placeholder page is mapped at holes, and none is needed.
//!
//! [`ScopedStream::launch_graph`]: crate::stream::ScopedStream::launch_graph
//! [`Rebind::finish`]: super::Rebind::finish

use core::fmt;
use core::marker::PhantomData;
use core::sync::atomic::{AtomicU64, Ordering};
use std::sync::PoisonError;

use bytemuck::Pod;

use crate::device::{Context, Device};
use crate::error::{Error, check};
use crate::sys;
use crate::view::DeviceBuffer;

use super::super::event::Event;
use super::super::launch::{KernelArg, Param};
use super::super::lend::{Origin, ScopedRead, ScopedWrite, lend_mut, sealed};
use super::super::pinned::PinnedBuffer;
use super::super::queue::Queue;
use super::super::rewritable::Rewritable;
use super::super::scope::ScopedStream;
use super::super::{Stream, StreamId};
use super::driver::last_node;
use super::{Capture, Graph, Instance, ScopedGraph, ScopedRebind, TableNode};

/// A device array of up to `capacity` block addresses (`u64`s, each that of `block_len` values of
/// `T`, or null), uploaded by a graph as its first node and read by its kernels as one argument (a
/// `const T* const*`): the block table of a paged kernel in a decode step captured once and
/// replayed every step.
///
/// Made outside a scope; captured with [`Graph::capture_with_table`]; the parked graph is bound
/// to a scope with the table ([`ScopedRebind::table`]), whose entries are set between replays
/// ([`ScopedGraph::set_read`], [`ScopedGraph::set_write`]). The rules, and why no replay reaches
/// a retired page, are the module's ([`crate::stream`]'s graph table section).
///
/// The kernel's contract (the launch's `# Safety`) gains one line: it reads at most `block_len`
/// values through each non-null address of the table, and never through a null one; it writes
/// only through the entries set for writing.
///
/// # Examples
/// A gather captured once over a table, replayed every step while the cache grows, with the
/// table's entries set from lent views before each replay:
/// ```no_run
/// use cuda_vmm::stream::{Graph, GraphTable};
/// use cuda_vmm::{Context, Device, DeviceBuffer, Module, PinnedBuffer, ReadWrite, Stream, VirtualBuffer};
///
/// # fn main() -> cuda_vmm::Result<()> {
/// # let ptx = c"";
/// let device = Device::get(0)?;
/// let context = Context::new(device)?;
/// let module = Module::load_ptx(&context, ptx)?;
/// // gather_table(u32 *out, const u32 *const *table, u32 blocks, u32 len, u64 ns): null entries
/// // give zeros.
/// let gather = module.function(c"gather_table")?;
/// let (block, blocks) = (1024, 8); // u32s, entries
/// let mut cache = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
/// let mut table = GraphTable::<u32>::new(&context, blocks, block, 2)?;
/// let mut out = DeviceBuffer::<u32>::zeroed(&context, blocks * block)?;
/// let mut stream = Stream::new(&context)?;
/// let parked = {
///     let mut out = out.as_mut_slice();
///     Graph::capture_with_table(&mut stream, &mut table, |c, t| {
///         // SAFETY: `gather_table` takes these five parameters, reads `len` values through each
///         // non-null entry of the table and writes `blocks * len` values of `out`.
///         unsafe { c.launch(&gather, (8, 1, 1), (256, 1, 1), (&mut out, t, 8u32, 1024u32, 0u64))? };
///         Ok(())
///     })?
///     .park()
/// };
/// let input = PinnedBuffer::from_slice(&context, &vec![5u32; block])?;
/// cuda_vmm::scope(|s| {
///     let work = s.on(&stream);
///     let cache = cache.in_scope(s);
///     let mut graph = parked
///         .in_scope()
///         .table(&mut table, work)
///         .writes_device(&mut out)
///         .module(&module)
///         .finish()?;
///     for step in 0..4 {
///         let at = cache.grow(device, 2 << 20)?; // a page per step, while the replays run
///         let mut kv = cache.write::<u32>(at..at + 4 * block)?;
///         work.copy_from_host(&mut kv, &input)?;
///         graph.set_read(step, cache.read_back::<u32>(at..at + 4 * block, work)?)?;
///         work.launch_scoped_graph(&mut graph)?; // no re-capture
///     }
///     Ok(())
/// })?;
/// # Ok(())
/// # }
/// ```
pub struct GraphTable<T> {
    inner: TableInner,
    /// Blocks of `T`: the table holds addresses, no `T`. Covariant, `Send` and `Sync` as a
    /// function pointer is.
    _blocks: PhantomData<fn() -> T>,
}

/// The id of the next [`GraphTable`].
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A [`GraphTable`]'s memory, of no `T`: what a [`ScopedGraph`] holds for its scope.
struct TableInner {
    /// Which table a graph's upload node reads.
    id: u64,
    /// The addresses, as the kernels read them.
    device: DeviceBuffer<u64>,
    /// The ring of staging buffers, each with the event recorded after the replay that read it.
    staging: Vec<(PinnedBuffer<u64>, Event)>,
    /// The ring's next buffer.
    next: usize,
    block_len: usize,
    /// `size_of::<T>()`.
    value_size: usize,
}

impl<T> fmt::Debug for GraphTable<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphTable")
            .field("capacity", &self.inner.device.len())
            .field("block_len", &self.inner.block_len)
            .field("depth", &self.inner.staging.len())
            .finish_non_exhaustive()
    }
}

impl<T: Pod> GraphTable<T> {
    /// `cuMemAlloc`, `cuMemHostAlloc`, `cuEventCreate` — a table of up to `capacity` blocks of
    /// `block_len` values of `T` each, in `context`'s device memory, with `depth` staging buffers
    /// (the most replays the host runs ahead of the table's stream).
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
    ) -> Result<GraphTable<T>, Error> {
        for (n, what) in [
            (capacity, "graph table capacity"),
            (block_len, "block length"),
            (depth, "graph table depth"),
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
        Ok(GraphTable {
            inner: TableInner {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                device,
                staging,
                next: 0,
                block_len,
                value_size: size_of::<T>(),
            },
            _blocks: PhantomData,
        })
    }

    /// The most entries the table holds.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.inner.device.len()
    }

    /// The values of `T` each block holds.
    #[must_use]
    pub fn block_len(&self) -> usize {
        self.inner.block_len
    }

    /// The number of staging buffers: the most replays the host runs ahead.
    #[must_use]
    pub fn depth(&self) -> usize {
        self.inner.staging.len()
    }

    /// The device whose memory holds the table.
    #[must_use]
    pub fn device(&self) -> Device {
        self.inner.device.as_slice().device()
    }
}

/// A [`GraphTable`] as a kernel argument, inside [`Graph::capture_with_table`]'s closure only
/// (`&TableArg`): the kernel receives the device array's address. Taken by no other queue
/// ([`Error::StreamRefused`]), and borrowed for the closure's call, so no kernel captured before
/// the table's upload, nor any later one outside the capture, reads it.
#[derive(Debug)]
pub struct TableArg {
    table: sys::CUdeviceptr,
    device: Device,
    /// The capturing stream.
    stream: StreamId,
}

impl sealed::Arg for &TableArg {}
impl<'scope> KernelArg<'scope> for &TableArg {
    type Output = ();
    type Param = sys::CUdeviceptr;
    fn check(&self, device: Device) -> Result<(), Error> {
        if device == self.device {
            Ok(())
        } else {
            Err(Error::DeviceMismatch {
                expected: self.device.as_raw(),
                found: device.as_raw(),
            })
        }
    }
    fn into_param(self, token: sealed::Token) -> Result<Param<'scope, Self>, Error> {
        if !token.capture || token.stream != self.stream {
            return Err(Error::StreamRefused {
                why: "a graph table is taken only by kernels of the capture that uploads it, after \
                      its upload",
            });
        }
        // The kernel reads the table's device array, which the ScopedGraph holds for its scope; no
        // touch is recorded (the rebind asks for the table itself).
        Ok((self.table, (), sealed::Counted(None, Vec::new()), None))
    }
}

impl<'g> Graph<'g> {
    /// `cuStreamBeginCapture`, `cuMemcpyHtoDAsync`, `cuStreamEndCapture`,
    /// `cuGraphInstantiateWithFlags` — as [`capture`](Graph::capture), with the upload of `table`
    /// captured first: `f` gets the table as a kernel argument ([`TableArg`]) for kernels captured
    /// after the upload. The graph is replayed only in a scope, once parked and bound with its
    /// table ([`ScopedRebind::table`]), where every replay uploads the entries set for it.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] for a table of another device than the stream's (before any
    /// driver call); as [`capture`](Graph::capture) otherwise; [`Error::InvalidArgument`] where
    /// the node the driver made of the upload is not the one-dimensional copy of the table into
    /// its device array that was queued (no replay could then point it at another buffer).
    ///
    /// # Panics
    /// Resumes a panic of `f`, after ending the capture and destroying its graph.
    ///
    /// # Examples
    /// See [`GraphTable`].
    #[doc(alias = "cuStreamBeginCapture")]
    pub fn capture_with_table<T: Pod, F>(
        stream: &mut Stream,
        table: &'g mut GraphTable<T>,
        f: F,
    ) -> Result<Graph<'g>, Error>
    where
        F: FnOnce(&Capture<'_, 'g>, &TableArg) -> Result<(), Error>,
    {
        if table.device() != stream.device() {
            return Err(Error::DeviceMismatch {
                expected: stream.device().as_raw(),
                found: table.device().as_raw(),
            });
        }
        let inner = &table.inner;
        // What the upload node must be (`check_upload`), which every replay's change rests on.
        let table_ptr = inner.device.as_slice().as_raw_ptr();
        let table_bytes = inner.device.len().saturating_mul(size_of::<u64>());
        let mut graph = Graph::capture_with(stream, |c| {
            Queue::admit(c)?;
            let (staging, _) = inner.staging.first().ok_or(Error::ZeroSize {
                what: "graph table depth",
            })?;
            let device = inner.device.as_slice().as_raw_ptr();
            let bytes = staging.len().saturating_mul(size_of::<u64>());
            // SAFETY: recorded into the graph, not run: the stream is capturing this capture
            // (`Queue::admit`). Each replay copies a staging buffer of the table (`capacity`
            // page-locked u64s, the node's source set by `launch_scoped_graph`) into its device
            // array (`capacity` u64s); both are held by the `ScopedGraph` for its scope, and
            // no other replay of the graph is possible (`launch_graph` and `Rebind` refuse it).
            unsafe {
                c.stream
                    .copy_from_host_raw(device, staging.as_ptr().cast(), bytes)?;
            }
            let node = last_node(c.stream)?;
            let arg = TableArg {
                table: device,
                device: c.stream.device(),
                stream: c.stream.id(),
            };
            f(c, &arg)?;
            Ok(Some(TableNode {
                node,
                table: inner.id,
                params: sys::CUDA_MEMCPY3D::zeroed(),
            }))
        })?;
        if let Some(node) = graph.inner.table.as_mut() {
            graph.inner.context.bind_to_thread()?;
            // SAFETY: `node` is a memcpy node of the graph just captured (owned by `graph`, dropped
            // on an error here), in the current context; `params` is written.
            check(unsafe { sys::cuGraphMemcpyNodeGetParams(node.node, &raw mut node.params) })?;
            check_upload(&node.params, table_ptr, table_bytes)?;
        }
        Ok(graph)
    }
}

/// `Ok` where `params`, read back from a captured upload node, are a one-dimensional copy of
/// `bytes` bytes to the start of the device array at `table` (what each replay's change of source
/// rests on: the same copy, from another buffer of the same size), else an error: the driver made
/// the node otherwise than the copy queued, and the graph is not replayed.
fn check_upload(params: &sys::CUDA_MEMCPY3D, table: u64, bytes: usize) -> Result<(), Error> {
    let one_dimensional = params.Height <= 1
        && params.Depth <= 1
        && params.dstXInBytes == 0
        && params.dstY == 0
        && params.dstZ == 0
        && params.srcY == 0
        && params.srcZ == 0;
    let into_table = matches!(
        params.dstMemoryType,
        sys::CU_MEMORYTYPE_DEVICE | sys::CU_MEMORYTYPE_UNIFIED
    ) && params.dstDevice == table;
    if one_dimensional && into_table && params.WidthInBytes == bytes {
        Ok(())
    } else {
        Err(Error::InvalidArgument {
            what: "a graph table's captured upload is not the one-dimensional copy of the table \
                   into its device array that was queued",
        })
    }
}

/// A [`GraphTable`] bound to a scope's [`ScopedGraph`], on one stream: the entries of the next
/// replay.
pub(super) struct Bound<'scope> {
    table: &'scope mut TableInner,
    stream: ScopedStream<'scope>,
    /// One per entry of the table; `None` is a null entry.
    entries: Vec<Option<Entry<'scope>>>,
}

/// One entry: a view's address and bytes, lent for the scope, where it came from, and whether the
/// kernels write it.
#[derive(Clone, Copy)]
struct Entry<'scope> {
    ptr: u64,
    bytes: usize,
    origin: Option<Origin<'scope>>,
    written: bool,
}

impl<'scope> ScopedRebind<'scope> {
    /// Give the [`GraphTable`] the graph uploads, for the scope, bound to `stream`: replays are
    /// queued on it only. All its entries start null; set them with [`ScopedGraph::set_read`] and
    /// [`ScopedGraph::set_write`] before a replay. A graph with a table is bound only with it
    /// ([`finish`](ScopedRebind::finish) refuses it otherwise, and refuses another table).
    ///
    /// # Examples
    /// See [`GraphTable`].
    #[must_use = "the scoped graph is made by `finish`"]
    pub fn table<T: Pod>(
        mut self,
        table: &'scope mut GraphTable<T>,
        stream: ScopedStream<'scope>,
    ) -> ScopedRebind<'scope> {
        let inner = &mut table.inner;
        self.gifts.table = Some(inner.id);
        let entries = vec![None; inner.device.len()];
        self.table = Some(Bound {
            table: inner,
            stream,
            entries,
        });
        self
    }
}

impl Bound<'_> {
    /// The id of the table.
    pub(super) fn id(&self) -> u64 {
        self.table.id
    }

    /// `Ok` where `stream` is the table's.
    pub(super) fn check_stream(&self, stream: StreamId) -> Result<(), Error> {
        if stream == self.stream.id() {
            Ok(())
        } else {
            Err(Error::StreamRefused {
                why: "a graph with a graph table is replayed only on the table's stream \
                      (`ScopedRebind::table`)",
            })
        }
    }
}

impl<'scope> Bound<'scope> {
    /// Admits every entry again for a replay on `stream` (the table's), each counted in
    /// `counted` until the replay is queued.
    pub(super) fn admit(
        &self,
        stream: StreamId,
        counted: &mut sealed::Counted<'scope>,
    ) -> Result<(), Error> {
        for entry in self.entries.iter().flatten() {
            if let Some(origin) = entry.origin {
                let slot = origin.admit_bytes(entry.ptr, entry.bytes, stream, entry.written)?;
                counted.1.push((origin.pages, slot));
            }
        }
        Ok(())
    }

    /// `cuEventQuery`, `cuGraphExecMemcpyNodeSetParams`, `cuGraphLaunch`, `cuEventRecord` — the
    /// entries written into the next staging buffer, the graph's upload pointed at it, the replay
    /// queued on the table's stream, and the buffer's event recorded after it.
    ///
    /// # Safety
    /// Every entry was admitted for this replay and stays counted until this call returns; the
    /// graph's other memory and kernels are held for the scope (`ScopedRebind::finish`), and
    /// `graph` is the instance whose upload node reads this table.
    pub(super) unsafe fn launch(&mut self, graph: &Instance) -> Result<(), Error> {
        let node = graph
            .table
            .as_ref()
            .filter(|n| n.table == self.table.id)
            .ok_or(Error::InvalidArgument {
                what: "a graph table given to a graph that does not upload it",
            })?;
        let ring = self.table.staging.len();
        let slot = self.table.next % ring.max(1);
        let (staging, event) = self.table.staging.get_mut(slot).ok_or(Error::ZeroSize {
            what: "graph table depth",
        })?;
        if !event.is_complete()? {
            return Err(Error::StreamRefused {
                why: "the graph table's staging buffer is still read by a queued replay: the host is \
                      `depth` replays ahead of the table's stream",
            });
        }
        let entries = &self.entries;
        staging.fill_with(|i| {
            entries
                .get(i)
                .copied()
                .flatten()
                .map_or(0, |entry| entry.ptr)
        });
        let mut params = node.params;
        params.srcXInBytes = 0;
        match params.srcMemoryType {
            sys::CU_MEMORYTYPE_HOST => params.srcHost = staging.as_ptr().cast(),
            sys::CU_MEMORYTYPE_UNIFIED | sys::CU_MEMORYTYPE_DEVICE => {
                params.srcDevice = staging.as_ptr() as u64;
            }
            _ => {
                return Err(Error::InvalidArgument {
                    what: "a graph table's upload node whose source is not host memory",
                });
            }
        }
        // SAFETY: the caller's guarantee for every byte the replay reaches; `params` are the
        // node's own operands with the source moved to a staging buffer of the same table (the same
        // size, page-locked in the same context), which no queued replay reads (its event has
        // completed) and which the host writes again only after the event recorded below.
        unsafe { graph.launch_from(self.stream.as_raw(), node.node, &params)? };
        if let Err(e) = self.stream.record(event) {
            // The buffer's event does not cover the replay: wait for it before the buffer can be
            // written again. The wait returns only once the work has finished (or the context is
            // proven dead, when no copy runs), so its own error changes nothing here.
            let _ = self.stream.synchronize();
            return Err(e);
        }
        self.table.next = self.table.next.wrapping_add(1);
        Ok(())
    }
}

impl Instance {
    /// `cuGraphExecMemcpyNodeSetParams`, `cuGraphLaunch` — the copy node `node` given `params`,
    /// then the graph launched on `stream`, one thread at a time.
    ///
    /// # Safety
    /// As [`Instance::launch`], for the graph with `params`; `node` is a memcpy node of this graph.
    unsafe fn launch_from(
        &self,
        stream: sys::CUstream,
        node: sys::CUgraphNode,
        params: &sys::CUDA_MEMCPY3D,
    ) -> Result<(), Error> {
        let _one = self.launches.lock().unwrap_or_else(PoisonError::into_inner);
        self.context.bind_to_thread()?;
        // SAFETY: this instantiation and one of its memcpy nodes, under the lock that orders its
        // launches; the driver copies `params`, and changes only the launches queued after it.
        check(unsafe {
            sys::cuGraphExecMemcpyNodeSetParams(self.exec, node, params, self.context.as_raw())
        })?;
        // SAFETY: the caller's guarantee.
        Ok(check(unsafe { sys::cuGraphLaunch(self.exec, stream) })?)
    }
}

impl<'scope> ScopedGraph<'scope> {
    /// The table's entries as a mutable list, with the checks each new entry needs: the index in
    /// range, a view of the table's device's reach and one block long.
    fn entry_slot(&mut self, index: usize) -> Result<&mut Bound<'scope>, Error> {
        let bound = self.table.as_mut().ok_or(Error::InvalidArgument {
            what: "a scoped graph without a graph table (ScopedRebind::table)",
        })?;
        let capacity = bound.entries.len();
        if index < capacity {
            Ok(bound)
        } else {
            Err(Error::OutOfBounds {
                what: "graph table",
                start: index,
                end: index.saturating_add(1),
                len: capacity,
            })
        }
    }

    /// Sets entry `index` of the graph's table to `block`, read by the kernels from the next replay
    /// on: lent now to the table's stream, as a launch lends a read-only view (refused where its
    /// pages are retired, or it is bound to another stream), and admitted again at every replay
    /// until it is replaced or cleared. No driver call.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a graph without a table; [`Error::OutOfBounds`] for an index
    /// past the capacity; [`Error::NoPeerAccess`] for a view the table's device does not reach;
    /// the lend's refusal ([`Error::PageRange`] naming retired bytes, [`Error::StreamRefused`]);
    /// [`Error::LengthMismatch`] for a view that is not one block of the table's values long. The
    /// entry is unchanged then.
    ///
    /// # Examples
    /// See [`GraphTable`].
    pub fn set_read<T: Pod>(
        &mut self,
        index: usize,
        block: impl ScopedRead<'scope, T>,
    ) -> Result<(), Error> {
        let device = self.device();
        let bound = self.entry_slot(index)?;
        block.check_reach(device)?;
        let (view, origin, counted) = block.lend(Queue::token(&bound.stream))?.into_parts();
        drop(counted);
        bound.set(
            index,
            view.as_raw_ptr(),
            view.len(),
            size_of::<T>(),
            origin,
            false,
        )
    }

    /// Sets entry `index` of the graph's table to `block`, which the kernels write (and may read)
    /// from the next replay on: lent now for writing to the table's stream, as a launch lends a
    /// [`Rewritable`] (refused where it is bound to another stream, read back, reused or retired),
    /// taken by the table, and admitted again as a write at every replay until it is replaced or
    /// cleared, so that a read back of its bytes is ordered after the table's stream (and ends it:
    /// the next replay is refused until the entry is replaced). No driver call.
    ///
    /// # Errors
    /// As [`set_read`](ScopedGraph::set_read).
    pub fn set_write<T: Pod>(
        &mut self,
        index: usize,
        mut block: Rewritable<'scope, T>,
    ) -> Result<(), Error> {
        let device = self.device();
        let bound = self.entry_slot(index)?;
        // Before the lend, which binds the handle and records the table's stream in the claim.
        bound.check_len(block.len(), size_of::<T>())?;
        ScopedWrite::check_reach(&&mut block, device)?;
        let (view, origin, counted) =
            lend_mut(&mut block, Queue::token(&bound.stream))?.into_parts();
        drop(counted);
        bound.set(
            index,
            view.as_raw_ptr(),
            view.len(),
            size_of::<T>(),
            origin,
            true,
        )
    }

    /// Makes entry `index` of the graph's table null from the next replay on: the kernels read
    /// nothing through it, and its view is no longer admitted (its pages may retire). No driver
    /// call.
    ///
    /// # Errors
    /// As [`set_read`](ScopedGraph::set_read) for the graph and the index.
    pub fn clear_entry(&mut self, index: usize) -> Result<(), Error> {
        let bound = self.entry_slot(index)?;
        if let Some(entry) = bound.entries.get_mut(index) {
            *entry = None;
        }
        Ok(())
    }

    /// The number of non-null entries of the graph's table (none for a graph without one).
    #[must_use]
    pub fn table_entries(&self) -> usize {
        self.table
            .as_ref()
            .map_or(0, |bound| bound.entries.iter().flatten().count())
    }
}

impl<'scope> Bound<'scope> {
    /// `Ok` where `len` values of `size` bytes are one block of the table, else
    /// [`Error::LengthMismatch`] in bytes.
    fn check_len(&self, len: usize, size: usize) -> Result<(), Error> {
        if size != self.table.value_size || len != self.table.block_len {
            let expected = self.table.block_len.saturating_mul(self.table.value_size);
            return Err(Error::LengthMismatch {
                expected,
                found: len.saturating_mul(size),
            });
        }
        Ok(())
    }

    /// Sets entry `index` to `len` values of `size` bytes at `ptr`.
    fn set(
        &mut self,
        index: usize,
        ptr: u64,
        len: usize,
        size: usize,
        origin: Option<Origin<'scope>>,
        written: bool,
    ) -> Result<(), Error> {
        self.check_len(len, size)?;
        let bytes = len.saturating_mul(size);
        if let Some(entry) = self.entries.get_mut(index) {
            *entry = Some(Entry {
                ptr,
                bytes,
                origin,
                written,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
