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

use core::cell::RefCell;
use core::fmt;
use core::marker::PhantomData;
use core::ptr;

use bytemuck::Pod;

use crate::device::Context;
use crate::error::{DriverResult, Error, check};
use crate::module::Function;
use crate::sys;
use crate::wait;

use super::Stream;
use super::launch::KernelArgs;
use super::lend::{DeviceInFlight, HostInFlight, HostSource, ScopedRead, ScopedWrite, sealed};
use super::queue::{self, Queue};
use super::scope::ScopedStream;

/// Work captured from typed operations and instantiated, replayed by
/// [`ScopedStream::launch_graph`]: `cuStreamBeginCapture` (in `THREAD_LOCAL` mode),
/// `cuStreamEndCapture` and `cuGraphInstantiateWithFlags` when made, `cuGraphLaunch` at each replay.
///
/// - **It borrows what it captured.** [`Graph::capture`] hands the closure a [`Capture`], whose
///   copies, memsets and launches take the same views and host memory as a [`ScopedStream`]'s and
///   borrow them for `'g`, the graph's lifetime. While the graph lives, nothing it uses can be
///   unmapped, regranted, shrunk or dropped, and a writable view it writes is not used elsewhere.
///   Memory that can leave while a scope lasts (the views of a
///   [`ScopedBuffer`](crate::owned::ScopedBuffer), a [`Rewritable`](super::Rewritable)) is not
///   captured ([`Error::StreamRefused`]). Pages mapped elsewhere in the same
///   [`VirtualBuffer`](crate::VirtualBuffer) (`grow` takes `&self`) disturb no captured address.
/// - **Replays are scoped.** A replay borrows the graph for its scope, which waits for it: no
///   replay outlives the graph, and the graph's kernel arguments change
///   ([`set_kernel_args`](Graph::set_kernel_args), `&mut self`) only between scopes.
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
/// let stream = Stream::new(&context)?;
/// let (mut xs, mut ys) = (x.as_mut_slice(), y.as_mut_slice());
/// let graph = Graph::capture(&stream, |c| {
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
/// # let stream = Stream::new(&context)?;
/// let graph;
/// {
///     let mut buffer = DeviceBuffer::<u32>::zeroed(&context, 256)?;
///     let view = buffer.as_mut_slice();
///     graph = Graph::capture(&stream, move |c| c.memset(view, 0).map(drop))?;
/// } // `buffer` is freed here, under the graph's address
/// cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph))?;
/// # Ok(())
/// # }
/// ```
pub struct Graph<'g> {
    captured: sys::CUgraph,
    exec: sys::CUgraphExec,
    /// The context the graph was captured in, retained: its replays and kernels run there.
    context: Context,
    /// The capture's id: a [`KernelNode`] of another graph is refused.
    id: u64,
    kernels: Vec<Kernel>,
    /// Everything captured is borrowed for `'g`: invariant, as [`Capture`].
    _borrows: PhantomData<&'g mut &'g ()>,
}

// SAFETY: a graph and its instantiation are driver objects, not thread-local state; the driver API
// is thread-safe, and every call on them binds the graph's context first. Moving the handle moves no
// memory it borrows.
unsafe impl Send for Graph<'_> {}
// SAFETY: `&Graph` gives only replays (`cuGraphLaunch`, which the driver orders behind the graph's
// earlier launches) and reads of its fields.
unsafe impl Sync for Graph<'_> {}

/// One captured kernel launch: its node, and what a new set of arguments keeps.
struct Kernel {
    node: sys::CUgraphNode,
    function: sys::CUfunction,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
}

/// A kernel launch captured into a [`Graph`], whose arguments [`Graph::set_kernel_args`] changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelNode {
    graph: u64,
    index: usize,
}

impl fmt::Debug for Graph<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph")
            .field("device", &self.context.device())
            .field("id", &self.id)
            .field("kernels", &self.kernels.len())
            .finish_non_exhaustive()
    }
}

impl<'g> Graph<'g> {
    /// `cuStreamBeginCapture`, `cuStreamEndCapture`, `cuGraphInstantiateWithFlags` — capture the
    /// work `f` queues on its [`Capture`] into a graph, on `stream` (which runs nothing meanwhile),
    /// and instantiate it. Nothing runs until a replay.
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
    pub fn capture<F>(stream: &Stream, f: F) -> Result<Graph<'g>, Error>
    where
        F: FnOnce(&Capture<'_, 'g>) -> Result<(), Error>,
    {
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
        let graph = match (end_capture(stream), result) {
            (Ok(graph), Ok(())) => graph,
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
        Ok(Graph {
            captured: graph,
            exec,
            context: stream.context().clone(),
            id,
            kernels: capture.kernels.into_inner(),
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
        let kernel = self
            .kernels
            .get(node.index)
            .filter(|_| node.graph == self.id)
            .ok_or(Error::InvalidArgument {
                what: "kernel node of another graph",
            })?;
        let device = self.context.device();
        args.check(device)?;
        self.context.bind_to_thread()?;
        let exec = self.exec;
        args.launch_with(sealed::Token::new(ptr::null_mut(), true), |params| {
            let params = sys::CUDA_KERNEL_NODE_PARAMS_v2 {
                func: kernel.function,
                gridDimX: kernel.grid.0,
                gridDimY: kernel.grid.1,
                gridDimZ: kernel.grid.2,
                blockDimX: kernel.block.0,
                blockDimY: kernel.block.1,
                blockDimZ: kernel.block.2,
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
                sys::cuGraphExecKernelNodeSetParams_v2(exec, kernel.node, &raw const params)
            })?)
        })
    }

    /// The device the graph runs on.
    #[must_use]
    pub fn device(&self) -> crate::Device {
        self.context.device()
    }

    /// The number of kernel launches captured.
    #[must_use]
    pub fn kernels(&self) -> usize {
        self.kernels.len()
    }

    /// `cuGraphLaunch` on `stream`, for [`ScopedStream::launch_graph`], which checks the device and
    /// admits the work first.
    pub(super) fn launch_on(&self, stream: sys::CUstream) -> Result<(), Error> {
        // SAFETY: `exec` is this graph's instantiation, in the current context (the scoped stream's,
        // of the graph's device: checked by the caller). Its work uses only what the graph borrows
        // for `'g`, which outlives the scope that borrows the graph for the replay and waits for
        // its stream.
        Ok(check(unsafe { sys::cuGraphLaunch(self.exec, stream) })?)
    }
}

impl Drop for Graph<'_> {
    fn drop(&mut self) {
        // Errors are ignored: `drop` cannot return them, and an instantiation or graph the driver
        // refuses to destroy is leaked, which touches no memory. No replay is under way: every scope
        // that borrowed the graph has waited for it.
        let _ = self.context.bind_to_thread();
        // SAFETY: the instantiation and graph made by `capture`, destroyed once, here.
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
        sealed::Token::new(self.stream.as_raw(), true)
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
        dst: &'g mut [T],
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
        let output = unsafe { queue::launch(self, function, grid, block, args)? };
        let node = last_node(self.stream)?;
        let mut kernels = self.kernels.borrow_mut();
        kernels.push(Kernel {
            node,
            function: function.raw(),
            grid,
            block,
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
    /// [`Error::DeviceMismatch`] for a graph of another device (before any driver call);
    /// [`Error::StreamCapturing`] where this stream is capturing; the driver's error otherwise.
    #[doc(alias = "cuGraphLaunch")]
    pub fn launch_graph(&self, graph: &'scope Graph<'_>) -> Result<(), Error> {
        if graph.device() != self.device() {
            return Err(Error::DeviceMismatch {
                expected: self.device().as_raw(),
                found: graph.device().as_raw(),
            });
        }
        self.admit()?;
        graph.launch_on(self.as_raw())
    }
}

/// Ends the capture on its stream and destroys its graph when dropped: while a panic of the
/// capturing closure unwinds.
struct EndOnUnwind<'s>(&'s Stream);

impl Drop for EndOnUnwind<'_> {
    fn drop(&mut self) {
        if let Ok(graph) = end_capture(self.0) {
            destroy_graph(graph);
        }
    }
}

/// `cuStreamGetCaptureInfo` — the id of the capture under way on `stream` (its context current).
fn capture_id(stream: &Stream) -> Result<u64, Error> {
    let (mut status, mut id) = (0u32, 0u64);
    // SAFETY: a live stream of the current context; `status` and `id` are written, the optional
    // outputs are null.
    check(unsafe {
        sys::cuStreamGetCaptureInfo_v2(
            stream.as_raw(),
            &raw mut status,
            &raw mut id,
            ptr::null_mut(),
            ptr::null_mut(),
            ptr::null_mut(),
        )
    })?;
    if status == sys::CU_STREAM_CAPTURE_STATUS_ACTIVE {
        Ok(id)
    } else {
        Err(Error::StreamCapturing {
            what: "the capture was invalidated by a call it refused",
        })
    }
}

/// The node the capture on `stream` added last: the one node the stream's next work depends on.
fn last_node(stream: &Stream) -> Result<sys::CUgraphNode, Error> {
    let mut status = 0u32;
    let mut nodes: *const sys::CUgraphNode = ptr::null();
    let mut count = 0usize;
    // SAFETY: a live stream of the current context (the operation just bound it); `nodes` is set to
    // the driver's array of `count` nodes, read below before any other call on the stream.
    check(unsafe {
        sys::cuStreamGetCaptureInfo_v2(
            stream.as_raw(),
            &raw mut status,
            ptr::null_mut(),
            ptr::null_mut(),
            &raw mut nodes,
            &raw mut count,
        )
    })?;
    if status != sys::CU_STREAM_CAPTURE_STATUS_ACTIVE || count != 1 || nodes.is_null() {
        return Err(Error::StreamCapturing {
            what: "the capture's last node is not one kernel launch",
        });
    }
    // SAFETY: `nodes` points at `count` (one) nodes, valid until the next call on the stream.
    Ok(unsafe { *nodes })
}

/// `cuStreamEndCapture` of the capture under way on `stream`: its graph.
fn end_capture(stream: &Stream) -> DriverResult<sys::CUgraph> {
    let mut graph: sys::CUgraph = ptr::null_mut();
    // SAFETY: a live stream of the current context, capturing (begun by `Graph::capture`); `graph`
    // is written.
    let ended = check(unsafe { sys::cuStreamEndCapture(stream.as_raw(), &raw mut graph) });
    if let Err(error) = ended {
        // An invalidated capture may still hand back a graph to destroy.
        destroy_graph(graph);
        return Err(error);
    }
    Ok(graph)
}

/// `cuGraphDestroy`, of a graph owned by the caller (null: nothing).
fn destroy_graph(graph: sys::CUgraph) {
    if !graph.is_null() {
        // SAFETY: a graph this module made and owns, destroyed once; its instantiation (if any) was
        // destroyed before or never made. The error is ignored: a graph the driver refuses to
        // destroy is leaked, which touches no memory.
        let _ = unsafe { sys::cuGraphDestroy(graph) };
    }
}
