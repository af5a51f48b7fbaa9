//! [`ParkedGraph`]: a graph's instantiation kept while the memory it uses is evicted, unmapped or
//! regranted, and given that memory again by [`Rebind`] before it can be launched.

use core::fmt;
use core::marker::PhantomData;

use bytemuck::Pod;

use crate::device::Device;
use crate::error::Error;
use crate::module::Module;
use crate::stream::PinnedBuffer;
use crate::view::DeviceBuffer;

use super::{Graph, Instance, Touch};

/// A [`Graph`] that borrows nothing and cannot be launched: made by [`Graph::park`], rebound by
/// [`rebind`](ParkedGraph::rebind) once the memory it touches is there again. Its instantiation is
/// kept (no capture, no `cuGraphInstantiate` again); dropping it destroys it
/// (`cuGraphExecDestroy`, `cuGraphDestroy`).
///
/// A graph holds raw addresses, so what makes a replay valid is that every byte it touches is
/// mapped, granted to its device in the mode it needs, and borrowed (exclusively where written) for
/// as long as it can be launched. A parked graph gives up the borrows, so the memory can change:
/// a [`VirtualBuffer`](crate::VirtualBuffer) range can be evicted and restored at the same addresses (new pages at the
/// same addresses serve as well: the addresses are what the graph knows), a kernel's module can be
/// unloaded. The rules:
///
/// - **No launch while parked.** A `ParkedGraph` has no lifetime and no way to be launched
///   ([`ScopedStream::launch_graph`](crate::stream::ScopedStream::launch_graph) takes a [`Graph`]):
///   the compiler refuses it (`ui-tests/stream/parked_graph_launched.rs`).
/// - **Rebound only over all it touches.** The capture recorded every byte range its work reads and
///   writes (device and host), and every kernel's module; [`Rebind::finish`] checks, before any
///   driver call, that each range lies inside memory given to the [`Rebind`]: each written range in
///   memory given for writing, each read range in memory given for reading or writing, every byte
///   of a [`VirtualBuffer`](crate::VirtualBuffer) on a mapped page, not evicted, not retired, granted to the graph's
///   device; every kernel's module given. Where the range is evicted the refusal is
///   [`Error::PageRange`] naming the evicted bytes, so a replay while the range is evicted is refused
///   twice over: at compile time (no launch while parked) and at run time (no rebind).
/// - **Then it borrows again.** The rebound [`Graph<'g>`](Graph) borrows everything given for
///   `'g`, as a captured graph borrows its views: no eviction, unmap, shrink, access change or
///   module unload while it lives (`ui-tests/stream/buffer_evicted_while_rebound_graph_lives.rs`).
/// - **Only what can be given back is rebound.** Device memory is given as a [`VirtualBuffer`](crate::VirtualBuffer)
///   (for writing only a [`ReadWrite`](crate::ReadWrite) one, by its type) or a [`DeviceBuffer`] of the graph's
///   device, host memory as a [`PinnedBuffer`]. A graph that touches other memory (a mapping of the
///   borrowed layer, another device's `DeviceBuffer` through a peer guard, host memory mapped
///   through VMM) is refused ([`Error::GraphRange`] naming the bytes): capture it again instead.
///
/// # Examples
/// A graph over a buffer's range, parked across an eviction, rebound after the restore:
/// ```no_run
/// use cuda_vmm::{Context, Device, ReadWrite, Stream, VirtualBuffer, stream::Graph};
///
/// # fn main() -> cuda_vmm::Result<()> {
/// let device = Device::get(0)?;
/// let context = Context::new(device)?;
/// let page = 2 << 20;
/// let mut weights = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
/// weights.grow(device, page)?;
/// let mut out = VirtualBuffer::new(page, &[device], ReadWrite)?;
/// out.grow(device, page)?;
/// let mut stream = Stream::new(&context)?;
/// let graph = {
///     let (src, mut dst) = (weights.slice_bytes::<u32>(..page)?, out.slice_bytes_mut::<u32>(..)?);
///     Graph::capture(&mut stream, |c| c.copy_from_device(&mut dst, src).map(drop))?.park()
/// };
/// let evicted = weights.evict(..)?; // the graph borrows nothing now
/// weights.restore(evicted)?; // the same addresses, new pages
/// let graph = graph.rebind().reads(&weights).writes(&mut out).finish()?;
/// cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph))?;
/// # Ok(())
/// # }
/// ```
///
/// A rebound graph borrows the buffer again, so the range is not evicted under it:
/// ```compile_fail,E0499
/// # use cuda_vmm::{Context, Device, ReadWrite, Stream, VirtualBuffer, stream::Graph};
/// # fn main() -> cuda_vmm::Result<()> {
/// # let device = Device::get(0)?;
/// # let context = Context::new(device)?;
/// # let mut stream = Stream::new(&context)?;
/// # let mut buffer = VirtualBuffer::new(2 << 20, &[device], ReadWrite)?;
/// # buffer.grow(device, 2 << 20)?;
/// # let parked = {
/// #     let mut view = buffer.slice_bytes_mut::<u32>(..)?;
/// #     Graph::capture(&mut stream, |c| c.memset(&mut view, 0).map(drop))?.park()
/// # };
/// let graph = parked.rebind().writes(&mut buffer).finish()?;
/// let evicted = buffer.evict(..)?; // the graph writes these pages at every replay
/// cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph))?;
/// # Ok(())
/// # }
/// ```
pub struct ParkedGraph {
    /// Boxed: a parked graph is moved about (inside a [`NotRebound`] too), and parking is rare.
    pub(super) inner: Box<Instance>,
}

impl fmt::Debug for ParkedGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.debug(f, "ParkedGraph")
    }
}

impl Graph<'_> {
    /// Park the graph: keep its instantiation and let go of everything it borrows, so that the
    /// memory it uses can be evicted, unmapped or regranted meanwhile. No driver call. A
    /// [`ParkedGraph`] cannot be launched; [`ParkedGraph::rebind`] gives a [`Graph`] again once
    /// the memory it touches is given back, mapped and granted.
    ///
    /// # Examples
    /// See [`ParkedGraph`].
    #[must_use = "a parked graph is launched only once rebound"]
    pub fn park(self) -> ParkedGraph {
        ParkedGraph {
            inner: Box::new(self.inner),
        }
    }
}

impl ParkedGraph {
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

    /// Start giving the graph the memory and kernels it touches, for `'g`: see [`Rebind`]. No
    /// driver call.
    #[must_use = "a rebind gives a graph only through `finish`"]
    pub fn rebind<'g>(self) -> Rebind<'g> {
        Rebind {
            parked: self,
            gifts: Gifts::default(),
        }
    }
}

/// A [`ParkedGraph`] being given, for `'g`, the memory and kernels it touches: each method borrows
/// one buffer or module for `'g` and gives it back by value, and [`finish`](Rebind::finish) checks
/// that they cover everything the graph touches (before any driver call) and returns the
/// [`Graph<'g>`](Graph) that borrows them all.
///
/// # Lifetimes
/// `'g` is the borrow of everything given, which the rebound graph holds as a captured graph holds
/// its views. Invariant.
pub struct Rebind<'g> {
    parked: ParkedGraph,
    gifts: Gifts<'g>,
}

/// What a [`Rebind`] (or a [`ScopedRebind`](super::ScopedRebind)) was given for `'g`, and the
/// check that it covers everything a graph touches: written once for both.
pub(super) struct Gifts<'g> {
    given: Vec<Given<'g>>,
    /// The ids of the modules given.
    modules: Vec<u64>,
    /// The id of the [`GraphTable`](super::GraphTable) given, for a graph that uploads one.
    pub(super) table: Option<u64>,
    /// Everything given is borrowed for `'g`: invariant, as [`Graph`]. No effect on auto traits.
    _borrows: PhantomData<&'g mut &'g ()>,
}

impl Default for Gifts<'_> {
    fn default() -> Self {
        Gifts {
            given: Vec::new(),
            modules: Vec::new(),
            table: None,
            _borrows: PhantomData,
        }
    }
}

/// Memory given to a [`Rebind`], and whether for writing.
enum Given<'g> {
    /// A buffer whose page table says which of its bytes are mapped and granted.
    Buffer {
        buffer: &'g (dyn Covers + Sync),
        writable: bool,
    },
    /// Memory whose bytes are all there while it is borrowed: `[start, end)` of device memory of
    /// `Some(device)`, or of host memory (`None`).
    Span {
        start: u64,
        end: u64,
        device: Option<Device>,
        writable: bool,
    },
    /// The reservation `[start, end)` of a buffer lent to a scope, whose bytes the graph touches
    /// are claimed for the scope and admitted at every replay (a [`ScopedGraph`](super::ScopedGraph)):
    /// writable where the buffer's grants are, `granted` where its access set names the graph's
    /// device.
    Scoped {
        start: u64,
        end: u64,
        writable: bool,
        granted: bool,
    },
}

/// Device memory with pages, which a [`Rebind`] checks a range against: the owned layer's
/// [`VirtualBuffer`](crate::VirtualBuffer) implements it, and gives itself with
/// [`Rebind::reads`] and [`Rebind::writes`] (written there, so that this layer never names it).
pub(crate) trait Covers {
    /// `Ok(false)` where device addresses `[start, end)` are not all inside this memory's reserved
    /// range; `Ok(true)` where every byte is on a page that is mapped, not evicted, not retired and
    /// granted to `device`; the error naming the bytes otherwise.
    fn covers(&self, start: u64, end: u64, device: Device) -> Result<bool, Error>;
}

impl fmt::Debug for Rebind<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rebind")
            .field("graph", &self.parked)
            .field("given", &self.gifts.given.len())
            .field("modules", &self.gifts.modules.len())
            .finish()
    }
}

impl<'g> Rebind<'g> {
    /// Gives `pages` for `'g`, for reading, or for writing where `writable` (the caller holds the
    /// exclusive borrow for `'g`): [`Rebind::reads`] and [`Rebind::writes`] of the owned layer.
    pub(crate) fn give_pages(
        mut self,
        pages: &'g (dyn Covers + Sync),
        writable: bool,
    ) -> Rebind<'g> {
        self.gifts.given.push(Given::Buffer {
            buffer: pages,
            writable,
        });
        self
    }

    /// Give `buffer`, memory of the graph's device, for the graph to read, for `'g`.
    #[must_use = "the rebind is made by `finish`"]
    pub fn reads_device<T: Pod>(self, buffer: &'g DeviceBuffer<T>) -> Rebind<'g> {
        self.device_span(buffer, false)
    }

    /// Give `buffer`, memory of the graph's device, for the graph to read and write, exclusively,
    /// for `'g`.
    #[must_use = "the rebind is made by `finish`"]
    pub fn writes_device<T: Pod>(self, buffer: &'g mut DeviceBuffer<T>) -> Rebind<'g> {
        let buffer: &'g DeviceBuffer<T> = buffer;
        self.device_span(buffer, true)
    }

    fn device_span<T: Pod>(mut self, buffer: &'g DeviceBuffer<T>, writable: bool) -> Rebind<'g> {
        self.gifts.device_span(buffer, writable);
        self
    }

    /// Give `buffer`, page-locked host memory, for the graph's uploads to read, for `'g`.
    #[must_use = "the rebind is made by `finish`"]
    pub fn reads_host<T: Pod>(self, buffer: &'g PinnedBuffer<T>) -> Rebind<'g> {
        self.host_span(buffer, false)
    }

    /// Give `buffer`, page-locked host memory, for the graph's downloads to write, exclusively, for
    /// `'g`: the host reads it once the rebound graph is gone.
    #[must_use = "the rebind is made by `finish`"]
    pub fn writes_host<T: Pod>(self, buffer: &'g mut PinnedBuffer<T>) -> Rebind<'g> {
        let buffer: &'g PinnedBuffer<T> = buffer;
        self.host_span(buffer, true)
    }

    fn host_span<T: Pod>(mut self, buffer: &'g PinnedBuffer<T>, writable: bool) -> Rebind<'g> {
        self.gifts.host_span(buffer, writable);
        self
    }

    /// Give `module`, loaded for `'g`, for the graph's kernels that came from it.
    #[must_use = "the rebind is made by `finish`"]
    pub fn module(mut self, module: &'g Module) -> Rebind<'g> {
        self.gifts.module(module);
        self
    }

    /// The rebound graph, borrowing everything given for `'g`, launched again with
    /// [`ScopedStream::launch_graph`](crate::stream::ScopedStream::launch_graph). No driver call:
    /// the instantiation is the parked graph's.
    ///
    /// # Errors
    /// A [`NotRebound`] holding the error and the parked graph back, unchanged:
    /// [`Error::InvalidArgument`] for a kernel whose module was not given;
    /// [`Error::PageRange`] (counted from the buffer's base) for bytes the graph touches in a
    /// given [`VirtualBuffer`](crate::VirtualBuffer) that are evicted, not mapped, retired or not granted;
    /// [`Error::GraphRange`] (addresses) for bytes in a buffer whose access set lacks the graph's
    /// device, in a [`DeviceBuffer`] of another device, written by the graph but given for reading
    /// only, or in no memory given.
    ///
    /// # Examples
    /// A rebind while the range is evicted is refused, naming the evicted bytes:
    /// ```no_run
    /// use cuda_vmm::{Context, Device, Error, ReadWrite, Stream, VirtualBuffer, stream::Graph};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let context = Context::new(device)?;
    /// let mut buffer = VirtualBuffer::new(2 << 20, &[device], ReadWrite)?;
    /// buffer.grow(device, 2 << 20)?;
    /// let mut stream = Stream::new(&context)?;
    /// let parked = {
    ///     let mut view = buffer.slice_bytes_mut::<u32>(..)?;
    ///     Graph::capture(&mut stream, |c| c.memset(&mut view, 0).map(drop))?.park()
    /// };
    /// let evicted = buffer.evict(..)?;
    /// let refused = parked.rebind().writes(&mut buffer).finish().unwrap_err();
    /// assert!(matches!(refused.error(), Error::PageRange { start: 0, end, .. } if *end == 2 << 20));
    /// let parked = refused.into_graph();
    /// buffer.restore(evicted)?;
    /// let graph = parked.rebind().writes(&mut buffer).finish()?;
    /// cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph))?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn finish(self) -> Result<Graph<'g>, NotRebound> {
        match self.gifts.check(&self.parked.inner) {
            Ok(()) => Ok(Graph {
                inner: *self.parked.inner,
                _borrows: PhantomData,
            }),
            Err(error) => Err(NotRebound {
                error,
                graph: self.parked,
            }),
        }
    }
}

impl<'g> Gifts<'g> {
    /// Gives `buffer`'s device memory, for writing where `writable`.
    pub(super) fn device_span<T: Pod>(&mut self, buffer: &'g DeviceBuffer<T>, writable: bool) {
        let view = buffer.as_slice();
        let touch = Touch::device::<T>(view.as_raw_ptr(), view.len(), writable);
        self.given.push(Given::Span {
            start: touch.start,
            end: touch.end,
            device: Some(buffer.context().device()),
            writable,
        });
    }

    /// Gives `buffer`'s host memory, for writing where `writable`.
    pub(super) fn host_span<T: Pod>(&mut self, buffer: &'g PinnedBuffer<T>, writable: bool) {
        let touch = Touch::host(buffer.as_ptr(), buffer.len(), writable);
        self.given.push(Given::Span {
            start: touch.start,
            end: touch.end,
            device: None,
            writable,
        });
    }

    /// Gives `module`'s kernels.
    pub(super) fn module(&mut self, module: &'g Module) {
        self.modules.push(module.id());
    }

    /// Gives the reservation `[start, end)` of a scoped buffer, whose bytes the graph touches are
    /// claimed and admitted by the [`ScopedGraph`](super::ScopedGraph) instead.
    pub(super) fn scoped(&mut self, start: u64, end: u64, writable: bool, granted: bool) {
        self.given.push(Given::Scoped {
            start,
            end,
            writable,
            granted,
        });
    }

    /// Every kernel's module given, every range the graph `inner` touches covered.
    pub(super) fn check(&self, inner: &Instance) -> Result<(), Error> {
        if inner
            .kernels
            .iter()
            .any(|k| !self.modules.contains(&k.module))
        {
            return Err(Error::InvalidArgument {
                what: "a parked graph rebound without the module of one of its kernels \
                       (Rebind::module)",
            });
        }
        if let Some(table) = &inner.table
            && self.table != Some(table.table)
        {
            return Err(Error::InvalidArgument {
                what: "a graph that uploads a graph table is bound only in a scope, with its table \
                       (ScopedRebind::table)",
            });
        }
        let device = inner.context.device();
        inner
            .touches()
            .try_for_each(|touch| self.covered(touch, device))
    }

    /// `Ok` where memory given covers `touch` in the mode it needs.
    fn covered(&self, touch: &Touch, device: Device) -> Result<(), Error> {
        if touch.start >= touch.end {
            // An empty view given to a kernel: no byte to cover.
            return Ok(());
        }
        let mut read_only = false;
        // A buffer's refusal (bytes evicted, say, or held by a claim) stands unless another
        // given memory covers the bytes: a claimed range given for writing covers bytes that the
        // whole buffer, given for reading, refuses.
        let mut refused = None;
        for given in &self.given {
            let (inside, writable) = match *given {
                Given::Buffer { buffer, writable } => {
                    if touch.host {
                        (false, writable)
                    } else {
                        match buffer.covers(touch.start, touch.end, device) {
                            Ok(inside) => (inside, writable),
                            Err(error) => {
                                refused.get_or_insert(error);
                                continue;
                            }
                        }
                    }
                }
                Given::Scoped {
                    start,
                    end,
                    writable,
                    granted,
                } => {
                    let inside = !touch.host && start <= touch.start && touch.end <= end;
                    if inside && !granted {
                        return Err(graph_range(
                            touch,
                            "are in a scoped buffer whose access set does not name the graph's \
                             device",
                        ));
                    }
                    (inside, writable)
                }
                Given::Span {
                    start,
                    end,
                    device: owner,
                    writable,
                } => {
                    let inside =
                        touch.host == owner.is_none() && start <= touch.start && touch.end <= end;
                    if inside && owner.is_some_and(|owner| owner != device) {
                        return Err(graph_range(
                            touch,
                            "are in a DeviceBuffer of another device than the graph's",
                        ));
                    }
                    (inside, writable)
                }
            };
            if inside {
                if writable || !touch.written {
                    return Ok(());
                }
                read_only = true;
            }
        }
        if let Some(error) = refused {
            return Err(error);
        }
        Err(graph_range(
            touch,
            if read_only {
                "are written by the graph, but were given for reading only"
            } else {
                "are in no memory given to the rebind"
            },
        ))
    }
}

fn graph_range(touch: &Touch, problem: &'static str) -> Error {
    Error::GraphRange {
        start: touch.start,
        end: touch.end,
        host: touch.host,
        problem,
    }
}

/// A refused [`Rebind::finish`]: the error, and the [`ParkedGraph`] back, unchanged, to rebind
/// later. `?` turns it into the crate's [`Error`].
#[derive(Debug)]
pub struct NotRebound {
    error: Error,
    graph: ParkedGraph,
}

impl NotRebound {
    /// Why the rebind was refused.
    #[must_use]
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// The parked graph, unchanged.
    #[must_use]
    pub fn into_graph(self) -> ParkedGraph {
        self.graph
    }

    /// The error and the parked graph.
    #[must_use]
    pub fn into_parts(self) -> (Error, ParkedGraph) {
        (self.error, self.graph)
    }
}

impl fmt::Display for NotRebound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "parked graph not rebound: {}", self.error)
    }
}

impl std::error::Error for NotRebound {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<NotRebound> for Error {
    fn from(refused: NotRebound) -> Error {
        refused.error
    }
}
