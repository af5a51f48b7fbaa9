//! [`Graph`]: work captured once and replayed on scoped streams, borrowing everything it captured for
//! as long as it lives.
//!
//! A CUDA graph holds the raw addresses of the memory its work touched when it was captured, so it is
//! the one object that most often outlives its memory: replaying it after an unmap is an illegal
//! address. Here a graph is captured by the same typed operations a [`ScopedStream`] queues, which
//! borrow their views, host memory and kernels for the graph's lifetime `'g`; a replay
//! ([`ScopedStream::launch_graph`]) borrows the graph for the scope, which waits for it. So no
//! replay outlives what the graph uses, and nothing it uses is unmapped, regranted, shrunk or
//! dropped while it lives: the borrow checker refuses it (the cases in `ui-tests/stream/`).
//!
//! A graph whose memory must leave for a while (a [`VirtualBuffer`](crate::VirtualBuffer) range
//! evicted while an engine sleeps) is parked ([`Graph::park`]): a [`ParkedGraph`] keeps the
//! instantiation, borrows nothing and cannot be launched. [`ParkedGraph::rebind`] gives it the
//! memory and kernels again once they are back at the same addresses, checking that they cover
//! every byte range and kernel the capture recorded, and the rebound [`Graph`] borrows them as
//! before. The rules:
//!
//! - a graph does not outlive, nor replay after, what it captured (borrowed for `'g`);
//! - a parked graph is never launched (it has no way to be);
//! - a rebind covers every range the graph touches: written ranges by memory given for writing,
//!   every byte of a [`VirtualBuffer`](crate::VirtualBuffer) mapped, not evicted
//!   ([`Error::PageRange`] names the evicted bytes), not retired, granted to the graph's device;
//!   every kernel's module given; otherwise the parked graph comes back in a [`NotRebound`];
//! - a rebound graph borrows what it was given for as long as it lives, so nothing it touches is
//!   evicted, unmapped, regranted or unloaded under it.

use core::cell::RefCell;
use core::fmt;
use core::marker::PhantomData;
use core::ptr;
use std::sync::PoisonError;

use bytemuck::Pod;

use crate::device::{Context, Device};
use crate::error::{Error, check};
use crate::module::Function;
use crate::sys;
use crate::wait;

use super::Stream;
use super::launch::KernelArgs;
use super::lend::sealed::Touch;
use super::lend::{
    DeviceInFlight, HostInFlight, HostSource, HostTarget, ScopedRead, ScopedWrite, sealed,
};
use super::queue::{self, Queue};
use super::scope::ScopedStream;

mod driver;
mod park;
mod scoped;
mod table;

use driver::{EndOnUnwind, capture_id, destroy_graph, end_capture, last_node};

pub(crate) use park::Covers;
pub use park::{NotRebound, ParkedGraph, Rebind};
pub(crate) use scoped::{Claim, Lender};
pub use scoped::{ScopedGraph, ScopedRebind};
pub use table::{GraphTable, TableArg};

/// Work captured from typed operations and instantiated, replayed by
/// [`ScopedStream::launch_graph`]: `cuStreamBeginCapture` (in `THREAD_LOCAL` mode),
/// `cuStreamEndCapture` and `cuGraphInstantiateWithFlags` when made, `cuGraphLaunch` at each replay.
///
/// - **It borrows what it captured.** [`Graph::capture`] hands the closure a [`Capture`], whose
///   copies, memsets and launches take the same views and host memory as a [`ScopedStream`]'s and
///   borrow them for `'g`, the graph's lifetime. While the graph lives, nothing it uses can be
///   unmapped, regranted, shrunk or dropped, and a writable view it writes is not used elsewhere.
///   Memory that can leave while a scope lasts (the views of a buffer lent to a scope,
///   [`VirtualBuffer::in_scope`](crate::VirtualBuffer::in_scope), a
///   [`Rewritable`](super::Rewritable)) is not
///   captured ([`Error::StreamRefused`]). Pages mapped elsewhere in the same
///   [`VirtualBuffer`](crate::VirtualBuffer) (`grow` takes `&self`) disturb no captured address;
///   a graph that writes part of a buffer which must keep growing captures the view of a claimed
///   range ([`VirtualBuffer::claim_bytes_mut`](crate::VirtualBuffer::claim_bytes_mut)), which
///   borrows the buffer shared.
/// - **Replays are scoped.** A replay borrows the graph for its scope, which waits for it: no
///   replay outlives the graph, and the graph's kernel arguments change
///   ([`set_kernel_args`](Graph::set_kernel_args), `&mut self`) only between scopes.
/// - **Parked across an eviction.** [`park`](Graph::park) gives up the borrows and keeps the
///   instantiation; the [`ParkedGraph`] cannot be launched, and is rebound
///   ([`ParkedGraph::rebind`]) only over memory that covers every range the capture recorded.
/// - **No enqueue a capture takes unseen.** A capture records everything queued on its stream, by
///   any thread, and the driver decides at each enqueue, so a check of the stream before an enqueue
///   proves nothing while another thread can begin a capture in between. [`Graph::capture`]
///   therefore takes the stream by `&mut`: while it records, no [`ScopedStream`] of that stream
///   exists on any thread (a scope borrows the stream shared for its whole length), and a
///   capture cannot begin on a stream that a scope holds. The capture itself queues only
///   through its [`Capture`], which records no event and waits for none, so no stream of this
///   crate is pulled into it either.
/// - **Capture holds every wait.** The capture is `THREAD_LOCAL`: other threads' calls are neither
///   refused nor able to invalidate it, and this crate's waits on other threads go on waiting. A
///   potentially unsafe call of the capturing thread itself (a synchronous copy, say) is refused by
///   the driver and invalidates the capture, which then returns that error, with no graph.
///
/// # Lifetimes
/// `'g` is the borrow of everything the graph captured: the views, host memory and kernels. It
/// outlives every scope that replays the graph. Invariant.
///
/// # Examples
/// Capture an upload and a kernel once, replay them in a scope:
/// ```no_run
/// use cuda_vmm::{Context, Device, DeviceBuffer, Module, PinnedBuffer, Stream, stream::Graph};
///
/// # fn main() -> cuda_vmm::Result<()> {
/// # let ptx = c"";
/// let context = Context::new(Device::get(0)?)?;
/// let module = Module::load_ptx(&context, ptx)?;
/// let add_one = module.function(c"add_one")?; // add_one(u32* dst, const u32* src, u32 n)
/// let (mut x, mut y) = (DeviceBuffer::<u32>::zeroed(&context, 256)?, DeviceBuffer::<u32>::zeroed(&context, 256)?);
/// let input = PinnedBuffer::from_slice(&context, &[41u32; 256])?;
/// let mut stream = Stream::new(&context)?;
/// let (mut xs, mut ys) = (x.as_mut_slice(), y.as_mut_slice());
/// let graph = Graph::capture(&mut stream, |c| {
///     let uploaded = c.copy_from_host(&mut xs, &input)?;
///     // SAFETY: add_one takes two u32 pointers and a count, and touches `n` values of each.
///     unsafe { c.launch(&add_one, (1, 1, 1), (256, 1, 1), (&mut ys, uploaded, 256u32))? };
///     Ok(())
/// })?;
/// cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph))?;
/// drop(graph); // the views are free again
/// assert_eq!(ys.to_vec()?, vec![42; 256]);
/// # Ok(())
/// # }
/// ```
///
/// A graph cannot outlive a view it captured:
/// ```compile_fail,E0597
/// # use cuda_vmm::{Context, Device, DeviceBuffer, Stream, stream::Graph};
/// # fn main() -> cuda_vmm::Result<()> {
/// # let context = Context::new(Device::get(0)?)?;
/// # let mut stream = Stream::new(&context)?;
/// let graph;
/// {
///     let mut buffer = DeviceBuffer::<u32>::zeroed(&context, 256)?;
///     let view = buffer.as_mut_slice();
///     graph = Graph::capture(&mut stream, move |c| c.memset(view, 0).map(drop))?;
/// } // `buffer` is freed here, under the graph's address
/// cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph))?;
/// # Ok(())
/// # }
/// ```
pub struct Graph<'g> {
    inner: Instance,
    /// Everything captured is borrowed for `'g`: invariant, as [`Capture`]. No effect on auto
    /// traits.
    _borrows: PhantomData<&'g mut &'g ()>,
}

/// A captured graph and its instantiation, with what its work touches: the one owner of the driver
/// objects, and of the only `Drop`, wrapped by [`Graph`] (which borrows what the work touches) and
/// [`ParkedGraph`] (which borrows nothing and cannot be launched).
struct Instance {
    captured: sys::CUgraph,
    exec: sys::CUgraphExec,
    /// The context the graph was captured in, retained: its replays and kernels run there.
    context: Context,
    /// The capture's id: a [`KernelNode`] of another graph is refused.
    id: u64,
    kernels: Vec<Kernel>,
    /// The bytes the graph's copies and memsets touch, and those of kernel launches that were
    /// refused or whose node was not found (the kernels keep their own).
    touches: Vec<Touch>,
    /// The upload of a [`GraphTable`], the graph's first node, where it has one: replayed only by
    /// [`ScopedStream::launch_scoped_graph`], which sets the node's source first.
    table: Option<TableNode>,
    /// Held across each `cuGraphLaunch`: the driver's graph objects are not internally
    /// synchronized, so replays from two threads are queued one at a time.
    launches: std::sync::Mutex<()>,
}

// SAFETY: a graph and its instantiation are driver objects, not thread-local state; the driver API
// is thread-safe, and every call on them binds the graph's context first. Moving the handle moves no
// memory it borrows. The kernels' handles are names the driver resolves, read only through `&mut`
// (a new set of arguments) or copied.
unsafe impl Send for Instance {}
// SAFETY: `&Instance` gives only replays (`cuGraphLaunch`, and for a graph with a table the
// `cuGraphExecMemcpyNodeSetParams` before it, both one thread at a time under `launches`; the
// driver orders a launch behind the graph's earlier ones, and a change of parameters affects only
// launches after it) and reads of its fields.
unsafe impl Sync for Instance {}

/// One captured kernel launch: its node, what a new set of arguments keeps, and what a rebind
/// needs: the kernel's module and the bytes its arguments reach.
struct Kernel {
    node: sys::CUgraphNode,
    function: sys::CUfunction,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    /// The id of the kernel's [`Module`](crate::Module), which must stay loaded while the graph
    /// can be launched.
    module: u64,
    /// The bytes of its view arguments (the kernel touches only those: the launch's contract).
    touches: Vec<Touch>,
}

/// The upload of a [`GraphTable`] in a graph: its memcpy node, the table's id and the node's
/// operands as captured, whose source each replay changes (`table.rs`).
struct TableNode {
    node: sys::CUgraphNode,
    table: u64,
    params: sys::CUDA_MEMCPY3D,
}

/// A kernel launch captured into a [`Graph`], whose arguments [`Graph::set_kernel_args`] changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelNode {
    graph: u64,
    index: usize,
}

impl Instance {
    fn debug(&self, f: &mut fmt::Formatter<'_>, name: &str) -> fmt::Result {
        f.debug_struct(name)
            .field("device", &self.context.device())
            .field("id", &self.id)
            .field("kernels", &self.kernels.len())
            .finish_non_exhaustive()
    }

    /// `cuGraphLaunch` on `stream`, one thread at a time.
    ///
    /// # Safety
    /// The graph's context is current, `stream` a live stream of it, and every byte and kernel the
    /// graph touches stays valid until the replay has run.
    unsafe fn launch(&self, stream: sys::CUstream) -> Result<(), Error> {
        let _one = self.launches.lock().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: this instantiation, launched one thread at a time; the rest is the caller's.
        Ok(check(unsafe { sys::cuGraphLaunch(self.exec, stream) })?)
    }

    /// Every range the graph's work touches: its copies' and memsets', and its kernels'.
    fn touches(&self) -> impl Iterator<Item = &Touch> {
        self.touches
            .iter()
            .chain(self.kernels.iter().flat_map(|k| k.touches.iter()))
    }
}

impl fmt::Debug for Graph<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.debug(f, "Graph")
    }
}

impl<'g> Graph<'g> {
    /// `cuStreamBeginCapture`, `cuStreamEndCapture`, `cuGraphInstantiateWithFlags` — capture the
    /// work `f` queues on its [`Capture`] into a graph, on `stream` (which runs nothing meanwhile),
    /// and instantiate it. Nothing runs until a replay.
    ///
    /// The stream is borrowed exclusively for the capture: a capture records whatever any thread
    /// queues on its stream, so a stream that a scope (of this thread or another) could queue on
    /// meanwhile is not captured on (see [`Graph`]).
    ///
    /// # Errors
    /// [`Error::StreamCapturing`] where `stream` is capturing already; `f`'s error (the capture is
    /// ended and its graph destroyed); the driver's error, such as
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` where `f` made a call the capture refused.
    ///
    /// # Panics
    /// Resumes a panic of `f`, after ending the capture and destroying its graph.
    #[doc(alias = "cuStreamBeginCapture")]
    #[doc(alias = "cuStreamEndCapture")]
    #[doc(alias = "cuGraphInstantiate")]
    pub fn capture<F>(stream: &mut Stream, f: F) -> Result<Graph<'g>, Error>
    where
        F: FnOnce(&Capture<'_, 'g>) -> Result<(), Error>,
    {
        Graph::capture_with(stream, |c| f(c).map(|()| None))
    }

    /// As [`capture`](Graph::capture), where `f` may queue a [`GraphTable`]'s upload first and
    /// returns its node.
    fn capture_with<F>(stream: &mut Stream, f: F) -> Result<Graph<'g>, Error>
    where
        F: FnOnce(&Capture<'_, 'g>) -> Result<Option<TableNode>, Error>,
    {
        // Held exclusively for the whole capture: no scope, on any thread, can queue work on the
        // stream between its capture check and its enqueue while this capture records (the work
        // would be recorded into this graph, not run, and the driver's graph would be written by
        // two threads at once: measured on an H200, the enqueue crashed inside the driver while the
        // capturing thread instantiated the graph).
        let stream: &Stream = stream;
        if stream.is_capturing()? {
            return Err(Error::StreamCapturing {
                what: "a graph is captured only on a stream that is not capturing already",
            });
        }
        // SAFETY: a live stream of the current context (bound above), not capturing (checked).
        check(unsafe {
            sys::cuStreamBeginCapture_v2(stream.as_raw(), sys::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        })?;
        let id = match capture_id(stream) {
            Ok(id) => id,
            Err(error) => {
                if let Ok(graph) = end_capture(stream) {
                    destroy_graph(graph);
                }
                return Err(error);
            }
        };
        let capture = Capture {
            stream,
            id,
            kernels: RefCell::new(Vec::new()),
            touches: RefCell::new(Vec::new()),
            pending: RefCell::new(Vec::new()),
            _borrows: PhantomData,
        };
        // Ends the capture and destroys its graph while a panic of `f` unwinds (the guard is local
        // and never forgotten).
        let unwinding = EndOnUnwind(stream);
        let result = {
            let _here = wait::CapturingHere::enter();
            f(&capture)
        };
        core::mem::forget(unwinding);
        let (graph, table) = match (end_capture(stream), result) {
            (Ok(graph), Ok(table)) => (graph, table),
            (Ok(graph), Err(error)) => {
                destroy_graph(graph);
                return Err(error);
            }
            (Err(error), _) => return Err(error.into()),
        };
        let mut exec: sys::CUgraphExec = ptr::null_mut();
        // SAFETY: `graph` is the graph just captured, owned here; `exec` is written on success.
        let instantiated = unsafe { sys::cuGraphInstantiateWithFlags(&raw mut exec, graph, 0) };
        if let Err(error) = check(instantiated) {
            destroy_graph(graph);
            return Err(error.into());
        }
        let mut touches = capture.touches.into_inner();
        touches.extend(capture.pending.into_inner());
        Ok(Graph {
            inner: Instance {
                captured: graph,
                exec,
                context: stream.context().clone(),
                id,
                kernels: capture.kernels.into_inner(),
                touches,
                table,
                launches: std::sync::Mutex::new(()),
            },
            _borrows: PhantomData,
        })
    }

    /// `cuGraphExecKernelNodeSetParams` — give the captured launch `node` new arguments, for every
    /// replay from now on: the grid, block and kernel stay. The new views are borrowed for `'g`,
    /// as the captured ones are; `&mut self`, so no replay is under way (every scope that replayed
    /// the graph has waited for it).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a node of another graph; [`Error::NoPeerAccess`] for a view the
    /// graph's device does not reach; [`Error::StreamRefused`] for a view that is not captured
    /// (see [`Graph`]); all before any driver call. The driver's error otherwise; the node keeps
    /// its old arguments then.
    ///
    /// # Safety
    /// As [`ScopedStream::launch`]: `args` must match the kernel's parameters, and the kernel uses
    /// only the memory of the views it is given.
    #[doc(alias = "cuGraphExecKernelNodeSetParams")]
    pub unsafe fn set_kernel_args<A: KernelArgs<'g>>(
        &mut self,
        node: KernelNode,
        args: A,
    ) -> Result<A::Output, Error> {
        let inner = &mut self.inner;
        let kernel = inner
            .kernels
            .get_mut(node.index)
            .filter(|_| node.graph == inner.id)
            .ok_or(Error::InvalidArgument {
                what: "kernel node of another graph",
            })?;
        let device = inner.context.device();
        args.check(device)?;
        inner.context.bind_to_thread()?;
        let exec = inner.exec;
        let (function, grid, block, kernel_node) =
            (kernel.function, kernel.grid, kernel.block, kernel.node);
        let mut touched = Vec::new();
        let set = args.launch_with(
            sealed::Token::new(
                super::StreamId::new(inner.context.as_raw(), ptr::null_mut()),
                true,
            ),
            |params, touches| {
                // Recorded before the call: where the driver refuses it, the old arguments stay, and
                // a rebind then asks for both the old and the new memory.
                touched.extend(touches.iter().flatten().copied());
                let params = sys::CUDA_KERNEL_NODE_PARAMS_v2 {
                    func: function,
                    gridDimX: grid.0,
                    gridDimY: grid.1,
                    gridDimZ: grid.2,
                    blockDimX: block.0,
                    blockDimY: block.1,
                    blockDimZ: block.2,
                    sharedMemBytes: 0,
                    kernelParams: if params.is_empty() {
                        ptr::null_mut()
                    } else {
                        params.as_mut_ptr()
                    },
                    extra: ptr::null_mut(),
                    kern: ptr::null_mut(),
                    ctx: ptr::null_mut(),
                };
                // SAFETY: `exec` is this graph's instantiation and `kernel.node` one of its kernel
                // nodes (captured with it), in the current context (bound above); the driver copies
                // the parameters before returning. No replay runs (`&mut self`). The caller guarantees
                // that the arguments match the kernel (`# Safety`); every view is reachable from the
                // graph's device (checked) and borrowed for `'g`, as the graph is.
                Ok(check(unsafe {
                    sys::cuGraphExecKernelNodeSetParams_v2(exec, kernel_node, &raw const params)
                })?)
            },
        );
        if set.is_ok() {
            kernel.touches = touched;
        } else {
            kernel.touches.extend(touched);
        }
        set
    }

    /// The device the graph runs on.
    #[must_use]
    pub fn device(&self) -> Device {
        self.inner.context.device()
    }

    /// The number of kernel launches captured.
    #[must_use]
    pub fn kernels(&self) -> usize {
        self.inner.kernels.len()
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // Errors are ignored: `drop` cannot return them, and an instantiation or graph the driver
        // refuses to destroy is leaked, which touches no memory. No replay is under way: every scope
        // that borrowed the graph has waited for it (a parked graph has none).
        let _ = self.context.bind_to_thread();
        // SAFETY: the instantiation and graph made by `capture`, destroyed once, here (the one owner
        // is this value: `park` and `finish` move it whole).
        let _ = unsafe { sys::cuGraphExecDestroy(self.exec) };
        destroy_graph(self.captured);
    }
}

/// Work being captured into a [`Graph`]: the operations of a [`ScopedStream`], each borrowing what
/// it uses for `'g`, the graph's lifetime. Given only to [`Graph::capture`]'s closure, on its thread.
///
/// # Lifetimes
/// `'s` is the borrow of the capturing stream; `'g` the graph's, as [`Graph`]. Invariant in `'g`.
pub struct Capture<'s, 'g> {
    stream: &'s Stream,
    /// The capture's id, which each [`KernelNode`] records.
    id: u64,
    kernels: RefCell<Vec<Kernel>>,
    /// The bytes the captured copies and memsets touch.
    touches: RefCell<Vec<Touch>>,
    /// The bytes of the arguments of the kernel launch being captured: the kernel's own once its
    /// node is known, else the graph's.
    pending: RefCell<Vec<Touch>>,
    /// Invariant in `'g`, so no operation accepts a borrow shorter than the graph's.
    _borrows: PhantomData<&'g mut &'g ()>,
}

impl fmt::Debug for Capture<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Capture").field(self.stream).finish()
    }
}

impl<'g> Queue<'g> for Capture<'_, 'g> {
    fn stream(&self) -> &Stream {
        self.stream
    }

    fn token(&self) -> sealed::Token {
        sealed::Token::new(self.stream.id(), true)
    }

    /// The stream's context bound, and the stream still capturing this capture, so that the work
    /// is recorded, not run (only replays run it). Only this thread can end the capture (it is
    /// `THREAD_LOCAL`), so it is still under way when the work is queued just after. A wait of this
    /// thread on the capturing stream ends it, for instance; work queued after that would run at
    /// once, under borrows that end when `capture` returns its error.
    fn admit(&self) -> Result<(), Error> {
        self.stream.context().bind_to_thread()?;
        if capture_id(self.stream)? == self.id {
            Ok(())
        } else {
            Err(Error::StreamCapturing {
                what: "the stream is capturing another graph than this capture's",
            })
        }
    }

    fn touch(&self, touch: Touch, kernel: bool) {
        if kernel {
            self.pending.borrow_mut().push(touch);
        } else {
            self.touches.borrow_mut().push(touch);
        }
    }
}

impl<'g> Capture<'_, 'g> {
    /// As [`ScopedStream::copy_from_host`], captured: each replay copies `src` (borrowed for `'g`)
    /// into `dst`.
    ///
    /// # Errors
    /// As [`ScopedStream::copy_from_host`].
    #[doc(alias = "cuMemcpyHtoDAsync")]
    pub fn copy_from_host<T: Pod>(
        &self,
        dst: impl ScopedWrite<'g, T>,
        src: impl HostSource<'g, T>,
    ) -> Result<DeviceInFlight<'g, T>, Error> {
        queue::copy_from_host(self, dst, src)
    }

    /// As [`ScopedStream::copy_to_host`], captured: each replay writes `dst`, borrowed mutably for
    /// `'g`; the host reads it once the graph is gone.
    ///
    /// # Errors
    /// As [`ScopedStream::copy_to_host`].
    #[doc(alias = "cuMemcpyDtoHAsync")]
    pub fn copy_to_host<T: Pod>(
        &self,
        dst: impl HostTarget<'g, T>,
        src: impl ScopedRead<'g, T>,
    ) -> Result<HostInFlight<'g, T>, Error> {
        queue::copy_to_host(self, dst, src)
    }

    /// As [`ScopedStream::copy_from_device`], captured.
    ///
    /// # Errors
    /// As [`ScopedStream::copy_from_device`].
    #[doc(alias = "cuMemcpyDtoDAsync")]
    pub fn copy_from_device<T: Pod>(
        &self,
        dst: impl ScopedWrite<'g, T>,
        src: impl ScopedRead<'g, T>,
    ) -> Result<DeviceInFlight<'g, T>, Error> {
        queue::copy_from_device(self, dst, src)
    }

    /// As [`ScopedStream::memset`], captured.
    ///
    /// # Errors
    /// As [`ScopedStream::memset`].
    #[doc(alias = "cuMemsetD8Async")]
    pub fn memset<T: Pod>(
        &self,
        dst: impl ScopedWrite<'g, T>,
        byte: u8,
    ) -> Result<DeviceInFlight<'g, T>, Error> {
        queue::memset(self, dst, byte)
    }

    /// As [`ScopedStream::launch`], captured; also returns the launch's [`KernelNode`], whose
    /// arguments [`Graph::set_kernel_args`] changes later.
    ///
    /// # Errors
    /// As [`ScopedStream::launch`]; the driver's error where the capture's last node cannot be read.
    ///
    /// # Safety
    /// As [`ScopedStream::launch`].
    #[doc(alias = "cuLaunchKernel")]
    pub unsafe fn launch<A: KernelArgs<'g>>(
        &self,
        function: &'g Function<'_>,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        args: A,
    ) -> Result<(A::Output, KernelNode), Error> {
        // SAFETY: the caller keeps `launch`'s contract (`# Safety`), which is the queue's.
        let launched = unsafe { queue::launch(self, function, grid, block, args) };
        let touches = core::mem::take(&mut *self.pending.borrow_mut());
        // A refused launch, or one whose node is not found, may still have added a node: its bytes
        // are kept as the graph's.
        let (output, node) = match launched.and_then(|o| Ok((o, last_node(self.stream)?))) {
            Ok(done) => done,
            Err(error) => {
                self.touches.borrow_mut().extend(touches);
                return Err(error);
            }
        };
        let mut kernels = self.kernels.borrow_mut();
        kernels.push(Kernel {
            node,
            function: function.raw(),
            grid,
            block,
            module: function.module_id(),
            touches,
        });
        let index = kernels.len().saturating_sub(1);
        Ok((
            output,
            KernelNode {
                graph: self.id,
                index,
            },
        ))
    }
}

impl<'scope> ScopedStream<'scope> {
    /// `cuGraphLaunch` — replay `graph` on this stream, borrowed for the rest of the scope, which
    /// waits for the replay before it returns.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] for a graph of another device and [`Error::StreamRefused`] for a
    /// graph that uploads a [`GraphTable`] (before any driver call); [`Error::StreamCapturing`]
    /// where this stream is capturing; the driver's error otherwise.
    #[doc(alias = "cuGraphLaunch")]
    pub fn launch_graph(&self, graph: &'scope Graph<'_>) -> Result<(), Error> {
        if graph.device() != self.device() {
            return Err(Error::DeviceMismatch {
                expected: self.device().as_raw(),
                found: graph.device().as_raw(),
            });
        }
        if graph.inner.table.is_some() {
            return Err(Error::StreamRefused {
                why: "a graph that uploads a graph table is replayed only in a scope, by \
                      `launch_scoped_graph`, which sets the table's entries from lent views first",
            });
        }
        self.admit()?;
        // SAFETY: the graph's context is this stream's (the device is checked, `admit` bound it).
        // Its work uses only what the graph borrows for `'g`, which outlives the scope that borrows
        // the graph for the replay and waits for its stream.
        unsafe { graph.inner.launch(self.as_raw()) }
    }
}
