//! What a cudarc scope's lent values share with it: the stream it waits for, the first refusal,
//! the probe event that finds an operation pulled into a capture, and the checks every lend and
//! every address handed to cudarc go through.

use core::marker::PhantomData;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
#[cfg(feature = "nccl")]
use core::time::Duration;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use ::cudarc::driver::{CudaEvent, CudaStream, SyncOnDrop};
use bytemuck::Pod;

#[cfg(doc)]
use super::{Scope, scope};
use crate::device::Device;
use crate::error::{DriverError, DriverResult, Error, check};
use crate::stream::StreamId;
use crate::sys;
use crate::view::DeviceSlice;
use crate::vmm::physical::{Granularity, align_size, allocation_granularity};
use crate::vmm::reservation::VirtualReservation;
use crate::wait;

/// What lent values share with their scope.
pub(super) struct State<'scope> {
    /// The stream the scope waits for: the only one lent views give their address to.
    pub(super) stream: &'scope Arc<CudaStream>,
    /// What a lent view answers when cudarc asks for its stream (to learn its context): the legacy
    /// default stream of the scope's context, a `CudaStream` value of its own. cudarc's copy between
    /// two contexts asks a source for its address *with this stream*, and then reads on another;
    /// being a different value from [`State::stream`], it is refused. It owns nothing: dropping it,
    /// or a clone that cudarc's user kept, destroys no stream. Made when first asked for (most
    /// scopes, the NCCL scope's among them, never are), which saves an allocation per scope.
    marker: OnceLock<Arc<CudaStream>>,
    pub(super) device: Device,
    /// The first refusal of a lent view, returned by [`scope`].
    refused: Mutex<Option<Error>>,
    /// The event every cudarc operation that got a lent view's address records on the scope's
    /// stream once it has queued its work (through the guard `device_ptr` returns): recorded inside
    /// a capture exactly where the operation was captured. Made when first needed.
    probe: OnceLock<Option<CudaEvent>>,
    /// Whether the probe was handed to a guard since the scope began (so that a query means
    /// something).
    armed: AtomicBool,
    /// Set once a query found the probe recorded inside a capture still under way, and thereby
    /// invalidated it: every later lend is refused, so nothing records the probe again, and the
    /// capture's end (with no graph) is not taken for one that made a graph.
    poisoned: AtomicBool,
    /// Invariant in `'scope`: a lent value can neither leave the closure nor hold a borrow that ends
    /// before the wait. `Send` and `Sync`.
    _scope: PhantomData<&'scope mut &'scope ()>,
}

impl<'scope> State<'scope> {
    /// The state of a scope on `stream`, of `device`, before any lend.
    pub(super) fn new(stream: &'scope Arc<CudaStream>, device: Device) -> State<'scope> {
        State {
            stream,
            marker: OnceLock::new(),
            device,
            refused: Mutex::new(None),
            probe: OnceLock::new(),
            armed: AtomicBool::new(false),
            poisoned: AtomicBool::new(false),
            _scope: PhantomData,
        }
    }

    /// `cuCtxSetCurrent` of the scope's context: the primary context cudarc retained for the stream,
    /// alive while the stream is.
    pub(super) fn bind(&self) -> DriverResult<()> {
        let context: sys::CUcontext = self.stream.context().cu_ctx().cast();
        // SAFETY: a context that the stream's `CudaContext` keeps retained, and the stream is
        // borrowed for the whole scope.
        check(unsafe { sys::make_current(context) })
    }

    /// [`State::marker`], made on the first call.
    pub(super) fn marker(&self) -> &Arc<CudaStream> {
        self.marker
            .get_or_init(|| self.stream.context().default_stream())
    }

    pub(super) fn raw_stream(&self) -> sys::CUstream {
        self.stream.cu_stream().cast()
    }

    /// The scope's stream as this crate's scopes tell streams apart: its context and its handle.
    pub(super) fn stream_id(&self) -> StreamId {
        StreamId::new(self.stream.context().cu_ctx().cast(), self.raw_stream())
    }

    /// `cuStreamSynchronize` of the scope's stream, through the wait that holds under stream
    /// capture: it ends a capture begun on the scope's stream (and returns
    /// [`Error::StreamCapturing`] then), and returns only once the work has finished.
    pub(super) fn wait(&self) -> Result<(), Error> {
        self.last_probe();
        // The stream is alive for the whole scope (the `CudaStream` is borrowed for it), in a
        // context its `CudaContext` keeps retained.
        wait::stream(self.stream.context().cu_ctx().cast(), self.raw_stream())
    }

    /// At the scope's end, before its wait: the probe's last check ([`probed`](State::probed)),
    /// whose refusal the scope returns.
    pub(super) fn last_probe(&self) {
        if !self.armed.load(Ordering::Acquire) {
            return;
        }
        let checked = self
            .bind()
            .map_err(Error::from)
            .and_then(|()| self.probed());
        if let Err(error) = checked {
            self.refuse(error);
        }
    }

    /// As [`wait`](State::wait), polling the stream and calling `between` between two polls
    /// ([`wait::stream_polled`]).
    #[cfg(feature = "nccl")]
    pub(super) fn wait_polled(
        &self,
        between: &dyn Fn(Duration) -> Result<wait::Polling, Error>,
    ) -> Result<(), Error> {
        self.last_probe();
        // As in `wait`.
        wait::stream_polled(
            self.stream.context().cu_ctx().cast(),
            self.raw_stream(),
            between,
        )
    }

    /// `Ok` where the scope's stream is not capturing a graph (`cuStreamIsCapturing`), and no
    /// operation that got a lent address before was captured ([`probed`](State::probed)).
    pub(super) fn not_capturing(&self) -> Result<(), Error> {
        self.bind()?;
        self.probed()?;
        if wait::is_capturing(self.raw_stream())? {
            Err(Error::StreamRefused {
                why: "it is capturing a graph, which could run the work after the scope",
            })
        } else {
            Ok(())
        }
    }

    /// The probe event, made on first use in the scope's context; `None` where the driver refused
    /// to make one (every guard then waits for the stream instead).
    pub(super) fn probe(&self) -> Option<&CudaEvent> {
        self.probe
            .get_or_init(|| self.stream.context().new_event(None).ok())
            .as_ref()
    }

    /// The guard a lent view's `device_ptr` returns for an operation on `stream`, the scope's
    /// stream, admitted: it records the probe after the operation is queued. Where cudarc would not
    /// record it (its context does not track events), the guard waits for the stream instead;
    /// where the stream is the legacy default stream, which no capture can take (waiting for a
    /// captured event there is refused: 906, measured), it does nothing.
    pub(super) fn guard<'a>(&'a self, stream: &'a CudaStream) -> SyncOnDrop<'a> {
        if stream.cu_stream().is_null() {
            return SyncOnDrop::Sync(None);
        }
        match self.probe() {
            Some(probe) if stream.context().is_managing_stream_synchronization() => {
                self.armed.store(true, Ordering::Release);
                SyncOnDrop::Record(Some((probe, stream)))
            }
            _ => SyncOnDrop::Sync(Some(stream)),
        }
    }

    /// `cuEventQuery` of the probe, the scope's context current: `Ok` where no cudarc operation
    /// that got a lent address was captured into a graph.
    ///
    /// A cudarc operation checks the stream before it queues, but its other arguments can pull the
    /// stream into a capture after that check: cudarc's event tracking makes the stream wait for a
    /// `CudaSlice`'s last write, and where that write was recorded inside a capture of another
    /// stream, the wait joins this stream to the capture, and the operation is captured, not run.
    /// The probe, recorded right after the operation, is then a captured event too, and the query
    /// tells (measured on an H200, `tests/seam_facts.rs`):
    /// - `CUDA_ERROR_CAPTURED_EVENT` while the capture is under way, and the query invalidates it:
    ///   its end makes no graph, and the captured work never runs. The scope is refused from here
    ///   on ([`Error::StreamCapturing`]);
    /// - `CUDA_ERROR_INVALID_VALUE` once the capture ended with a graph (also after the graph's
    ///   destruction, until the next record). A graph may then hold the lent address and replay it
    ///   after the scope: nothing sound is left, and the process is aborted.
    pub(super) fn probed(&self) -> Result<(), Error> {
        const CAPTURED: &str = "a cudarc operation on a lent view was captured into a graph (its \
                                stream was pulled into another stream's capture, by cudarc's event \
                                tracking say); the capture was invalidated, and the scope lends \
                                nothing more";
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::StreamCapturing { what: CAPTURED });
        }
        if !self.armed.load(Ordering::Acquire) {
            return Ok(());
        }
        let Some(probe) = self.probe() else {
            return Ok(());
        };
        // SAFETY: an event of the scope's context (current: the callers bind it), alive while the
        // scope is; the query only reads its state. The result is read as an integer.
        let code = unsafe { sys::cuEventQuery(probe.cu_event().cast()) };
        match DriverError::from_raw(code) {
            Some(e) if (900..=908).contains(&e.code()) => {
                self.poisoned.store(true, Ordering::Release);
                Err(Error::StreamCapturing { what: CAPTURED })
            }
            Some(e) if e == DriverError::INVALID_VALUE => wait::abort_process(format_args!(
                "a cudarc operation on a view lent to a scope was captured into a graph that \
                 outlived its capture (the scope's probe event was last recorded inside it): the \
                 graph may replay the lent address after the scope"
            )),
            // Not ready, complete, or a sticky error that the scope's wait reports.
            _ => Ok(()),
        }
    }

    /// The checks of [`Scope::lend`]: the scope's device reaches the view; returns the address of a
    /// never-mapped range at least as large as the view.
    pub(super) fn admit_view<T>(&self, view: &DeviceSlice<'_, T>) -> Result<u64, Error>
    where
        T: Pod,
    {
        if !view.reachable_from(self.device) {
            return Err(Error::NoPeerAccess {
                device: self.device.as_raw(),
                owner: view.device().as_raw(),
            });
        }
        let bytes = view
            .len()
            .checked_mul(size_of::<T>())
            .ok_or(Error::Overflow { what: "view size" })?;
        never_mapped(bytes, self.device)
    }

    /// The address an operation on `stream` gets, with its guard: `ptr` and the probe's guard
    /// ([`guard`](State::guard)) for the scope's own stream while it is not capturing and nothing
    /// lent was captured; `never_mapped` and no guard (and a refusal the scope returns) otherwise.
    pub(super) fn address<'a>(
        &'a self,
        stream: &'a CudaStream,
        ptr: u64,
        never_mapped: u64,
    ) -> (u64, SyncOnDrop<'a>) {
        let admitted = if ptr::eq(stream, Arc::as_ptr(self.stream)) {
            self.not_capturing()
        } else {
            Err(Error::StreamRefused {
                why: "a lent view was asked for its address for another stream than its scope's \
                      (queue the work on Scope::stream; a copy between two contexts reads on the \
                      destination's stream, so lend both views in a scope on that stream)",
            })
        };
        match admitted {
            Ok(()) => (ptr, self.guard(stream)),
            Err(error) => {
                self.refuse(error);
                (never_mapped, SyncOnDrop::Sync(None))
            }
        }
    }

    /// Keeps `error` as the scope's refusal, unless an earlier one is kept already.
    pub(super) fn refuse(&self, error: Error) {
        let mut refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        refused.get_or_insert(error);
    }

    pub(super) fn take_refusal(&self) -> Option<Error> {
        self.refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// Ranges of address space that are reserved and never mapped, and never freed (a `static`'s value
/// is never dropped): a refused lent view answers with an address in one, so that work queued where
/// the scope does not wait for it touches no memory at all.
static NEVER_MAPPED: Mutex<Vec<VirtualReservation>> = Mutex::new(Vec::new());

/// The smallest never-mapped range: one serves every view up to this size.
const NEVER_MAPPED_MINIMUM: usize = 1 << 30;

/// The base of the first range of [`NEVER_MAPPED`] (at least [`NEVER_MAPPED_MINIMUM`] bytes), 0
/// before there is one: read without the lock by every lend of a view that fits it.
static NEVER_MAPPED_FIRST: AtomicU64 = AtomicU64::new(0);

/// The base of a never-mapped range of at least `bytes`, reserved once per process (and again only
/// for a larger view).
fn never_mapped(bytes: usize, device: Device) -> Result<u64, Error> {
    if bytes <= NEVER_MAPPED_MINIMUM {
        // Stored only once its range is reserved, which is never freed.
        let first = NEVER_MAPPED_FIRST.load(Ordering::Acquire);
        if first != 0 {
            return Ok(first);
        }
    }
    let mut ranges = NEVER_MAPPED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(range) = ranges.iter().find(|r| r.size() >= bytes) {
        return Ok(range.base());
    }
    let granularity = allocation_granularity(device, Granularity::Minimum)?;
    let range =
        VirtualReservation::new(align_size(bytes.max(NEVER_MAPPED_MINIMUM), granularity)?, 0)?;
    let base = range.base();
    ranges.push(range);
    if ranges.len() == 1 {
        NEVER_MAPPED_FIRST.store(base, Ordering::Release);
    }
    Ok(base)
}
