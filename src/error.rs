//! Errors: the CUDA driver's result codes, and this crate's own argument checks.
//!
//! # Driver codes
//!
//! Every driver call returns a `CUresult`. In `cuda.h` that is a C enum, but this crate never reads
//! it as a Rust `enum`: the driver is loaded at run time and may be newer than any header the crate
//! was built against, so it can return a code that no enum declares, and a Rust enum holding a
//! value outside its variants is undefined behaviour. Following rustix's `Errno`, a failure is
//! therefore an integer in a newtype, [`DriverError`]: every code is representable, the codes this
//! crate knows have names ([`DriverError::INVALID_VALUE`], ...), and an unknown one still prints its
//! number. It wraps a [`NonZeroU32`] because `0` is `CUDA_SUCCESS`, which is not an error; this
//! also makes a `Result<(), DriverError>` the size of a `u32`.
//!
//! The known codes are exactly those of the `CUresult` enum of CUDA 13.3 (`cuda.h` with
//! `CUDA_VERSION` 13030), 102 of them. Names and descriptions are what `cuGetErrorName` and
//! `cuGetErrorString` of a CUDA 13.0 driver return, verbatim (spelling included). The two codes
//! newer than that driver, `CUDA_ERROR_STREAM_DETACHED` (917, CUDA 13.1) and
//! `CUDA_ERROR_GRAPH_RECAPTURE_FAILURE` (918, CUDA 13.3), carry a description paraphrased from the
//! header's documentation instead.
//!
//! # One error type
//!
//! Every fallible public function of the crate returns [`Error`] (its [`Result`] is
//! `Result<T, Error>`). Most variants are argument checks made before any driver call: a size that
//! is not aligned, a range out of bounds, memory of the wrong device, and so on. A refusal by the
//! driver itself is [`Error::Driver`], which holds the [`DriverError`]; where a function's
//! documentation names a driver code as its error, such as `DriverError::OUT_OF_MEMORY`, it is
//! returned as that `Error::Driver`. [`Error::driver`] gives the code of any error the driver made.
//!
//! Inside the crate, one driver call's result is a [`DriverResult`], which keeps the bare code, so
//! that clean-up paths can report both codes of an [`Error::CleanupFailed`].

use core::fmt;
use core::num::NonZeroU32;

/// The result of every fallible function of this crate: `Ok`, or the [`Error`] that says why not.
pub type Result<T, E = Error> = core::result::Result<T, E>;

/// The result of one driver call inside the crate: `Ok` for `CUDA_SUCCESS`, otherwise the
/// [`DriverError`]. Internal helpers keep the driver's code this precise; every public function
/// turns it into an [`Error::Driver`].
pub(crate) type DriverResult<T> = core::result::Result<T, DriverError>;

/// A CUDA driver error: a `CUresult` other than `CUDA_SUCCESS`.
///
/// Any non-zero code can be held, including ones newer than this crate's table; [`name`] and
/// [`description`] return `None` for those, and [`Display`](fmt::Display) prints
/// `unknown CUDA error (N)`.
///
/// [`name`]: DriverError::name
/// [`description`]: DriverError::description
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DriverError(NonZeroU32);

impl DriverError {
    /// Wraps a raw `CUresult`; `None` for `0` (`CUDA_SUCCESS`).
    #[must_use]
    pub const fn from_raw(code: u32) -> Option<DriverError> {
        match NonZeroU32::new(code) {
            Some(code) => Some(DriverError(code)),
            None => None,
        }
    }

    /// Whether this error means that the machine has no usable GPU: [`NO_DEVICE`](Self::NO_DEVICE)
    /// (no GPU, or no kernel driver) or [`STUB_LIBRARY`](Self::STUB_LIBRARY) (a toolkit's stub was
    /// loaded instead of the driver). [`Error::is_no_gpu`] asks this of an [`Error::Driver`], such
    /// as [`init`](crate::init)'s error.
    #[must_use]
    pub fn is_no_gpu(self) -> bool {
        self == DriverError::NO_DEVICE || self == DriverError::STUB_LIBRARY
    }

    /// The raw `CUresult` value (never `0`).
    #[must_use]
    pub const fn code(self) -> u32 {
        self.0.get()
    }

    /// The code's name in `cuda.h`, such as `"CUDA_ERROR_INVALID_VALUE"`; `None` for a code the
    /// table does not know.
    #[must_use]
    pub fn name(self) -> Option<&'static str> {
        self.entry().map(|&(_, name, _)| name)
    }

    /// The driver's one-line description, as `cuGetErrorString` gives it (such as
    /// `"invalid argument"`); `None` for a code the table does not know.
    #[must_use]
    pub fn description(self) -> Option<&'static str> {
        self.entry().map(|&(_, _, description)| description)
    }

    /// The table row of this code, if it has one.
    fn entry(self) -> Option<&'static (u32, &'static str, &'static str)> {
        TABLE
            .binary_search_by_key(&self.code(), |&(code, _, _)| code)
            .ok()
            .and_then(|index| TABLE.get(index))
    }

    /// Builds the constant for a known, non-zero code; evaluated only in const context, where a
    /// zero would fail the build.
    #[allow(
        clippy::panic,
        reason = "evaluated at compile time only: a zero fails the build"
    )]
    const fn known(code: u32) -> DriverError {
        match NonZeroU32::new(code) {
            Some(code) => DriverError(code),
            None => panic!("CUDA_SUCCESS (0) is not an error"),
        }
    }
}

/// Declares the known driver codes once: each entry becomes an associated constant of
/// [`DriverError`] and a row of [`TABLE`].
macro_rules! driver_errors {
    ($($(#[$attr:meta])* $name:ident = $code:literal => $description:literal,)*) => {
        /// The codes of the `CUresult` enum, named without the `CUDA_ERROR_` prefix.
        impl DriverError {
            $(
                $(#[$attr])*
                pub const $name: DriverError = DriverError::known($code);
            )*
        }

        /// Every known code as `(code, name, description)`, sorted by code (checked at compile
        /// time below), so lookups can binary-search it.
        const TABLE: &[(u32, &str, &str)] = &[
            $(($code, concat!("CUDA_ERROR_", stringify!($name)), $description),)*
        ];
    };
}

driver_errors! {
    /// One or more arguments of the call are outside the accepted range.
    INVALID_VALUE = 1 => "invalid argument",
    /// The driver could not allocate enough memory or other resources for the call.
    OUT_OF_MEMORY = 2 => "out of memory",
    /// The driver has not been initialized with `cuInit`, or initialization failed.
    NOT_INITIALIZED = 3 => "initialization error",
    /// The driver is shutting down.
    DEINITIALIZED = 4 => "driver shutting down",
    /// Profiling is disabled because the process runs under an external profiling tool.
    PROFILER_DISABLED = 5 => "profiler disabled while using external profiling tool",
    /// Deprecated since CUDA 5.0: profiling without initialization is no longer an error.
    PROFILER_NOT_INITIALIZED = 6 => "profiler not initialized: call cudaProfilerInitialize()",
    /// Deprecated since CUDA 5.0: starting the profiler twice is no longer an error.
    PROFILER_ALREADY_STARTED = 7 => "profiler already started",
    /// Deprecated since CUDA 5.0: stopping the profiler twice is no longer an error.
    PROFILER_ALREADY_STOPPED = 8 => "profiler already stopped",
    /// The loaded driver library is a stub (such as the toolkit's link-time stub), not a driver.
    STUB_LIBRARY = 34 => "CUDA driver is a stub library",
    /// The call needs a newer driver than the one installed.
    CALL_REQUIRES_NEWER_DRIVER = 36 => "API call is not supported in the installed CUDA driver",
    /// The device is busy or unavailable right now (for example held in exclusive compute mode).
    DEVICE_UNAVAILABLE = 46 => "CUDA-capable device(s) is/are busy or unavailable",
    /// The driver detected no CUDA-capable device.
    NO_DEVICE = 100 => "no CUDA-capable device is detected",
    /// The device ordinal does not name a device, or the action is invalid for that device.
    INVALID_DEVICE = 101 => "invalid device ordinal",
    /// The device has no valid Grid license.
    DEVICE_NOT_LICENSED = 102 => "device doesn't have valid Grid license",
    /// The kernel image or module is invalid.
    INVALID_IMAGE = 200 => "device kernel image is invalid",
    /// No context is current on the calling thread, or the context handle is invalid.
    INVALID_CONTEXT = 201 => "invalid device context",
    /// Deprecated since CUDA 3.2: the context was already current.
    CONTEXT_ALREADY_CURRENT = 202 => "context already current",
    /// A map or register operation failed.
    MAP_FAILED = 205 => "mapping of buffer object failed",
    /// An unmap or unregister operation failed.
    UNMAP_FAILED = 206 => "unmapping of buffer object failed",
    /// The array is mapped and cannot be destroyed.
    ARRAY_IS_MAPPED = 207 => "array is mapped",
    /// The resource is already mapped.
    ALREADY_MAPPED = 208 => "resource already mapped",
    /// No kernel image in the module suits the device.
    NO_BINARY_FOR_GPU = 209 => "no kernel image is available for execution on the device",
    /// The resource has already been acquired.
    ALREADY_ACQUIRED = 210 => "resource already acquired",
    /// The resource is not mapped.
    NOT_MAPPED = 211 => "resource not mapped",
    /// The mapped resource cannot be accessed as an array.
    NOT_MAPPED_AS_ARRAY = 212 => "resource not mapped as array",
    /// The mapped resource cannot be accessed as a pointer.
    NOT_MAPPED_AS_POINTER = 213 => "resource not mapped as pointer",
    /// An uncorrectable ECC error was detected during execution.
    ECC_UNCORRECTABLE = 214 => "uncorrectable ECC error encountered",
    /// The `CUlimit` is not supported by the active device.
    UNSUPPORTED_LIMIT = 215 => "limit is not supported on this architecture",
    /// The context is bound to another CPU thread already.
    CONTEXT_ALREADY_IN_USE = 216 => "exclusive-thread device already in use by a different thread",
    /// Peer access is not supported between the two devices.
    PEER_ACCESS_UNSUPPORTED = 217 => "peer access is not supported between these two devices",
    /// PTX JIT compilation failed.
    INVALID_PTX = 218 => "a PTX JIT compilation failed",
    /// The OpenGL or DirectX context is invalid.
    INVALID_GRAPHICS_CONTEXT = 219 => "invalid OpenGL or DirectX context",
    /// An uncorrectable `NVLink` error was detected during execution.
    NVLINK_UNCORRECTABLE = 220 => "uncorrectable NVLink error detected during the execution",
    /// The PTX JIT compiler library was not found.
    JIT_COMPILER_NOT_FOUND = 221 => "PTX JIT compiler library not found",
    /// The PTX was compiled with a toolchain the driver does not support.
    UNSUPPORTED_PTX_VERSION = 222 => "the provided PTX was compiled with an unsupported toolchain.",
    /// PTX JIT compilation is disabled.
    JIT_COMPILATION_DISABLED = 223 => "PTX JIT compilation was disabled",
    /// The execution affinity type is not supported by the device.
    UNSUPPORTED_EXEC_AFFINITY = 224 => "the provided execution affinity is not supported",
    /// The JIT-compiled code calls `cudaDeviceSynchronize`, which is unsupported there.
    UNSUPPORTED_DEVSIDE_SYNC = 225 =>
        "the provided PTX contains unsupported call to cudaDeviceSynchronize",
    /// An exception occurred on the device and is contained by the GPU's error containment.
    CONTAINED = 226 => "Invalid access of peer GPU memory over nvlink or a hardware error",
    /// The kernel source is invalid (including device-code compile or link errors).
    INVALID_SOURCE = 300 => "device kernel image is invalid",
    /// A file was not found.
    FILE_NOT_FOUND = 301 => "file not found",
    /// A link to a shared object failed to resolve.
    SHARED_OBJECT_SYMBOL_NOT_FOUND = 302 => "shared object symbol not found",
    /// Initialization of a shared object failed.
    SHARED_OBJECT_INIT_FAILED = 303 => "shared object initialization failed",
    /// An operating-system call failed.
    OPERATING_SYSTEM = 304 => "OS call failed or operation not supported on this OS",
    /// A resource handle passed to the call is invalid.
    INVALID_HANDLE = 400 => "invalid resource handle",
    /// A resource is not in a state that allows the operation.
    ILLEGAL_STATE = 401 => "the operation cannot be performed in the present state",
    /// The introspection asked for would lose semantically important information.
    LOSSY_QUERY = 402 => "attempted introspection would be semantically lossy",
    /// A named symbol was not found.
    NOT_FOUND = 500 => "named symbol not found",
    /// Asynchronous work issued earlier has not completed yet (not a failure).
    NOT_READY = 600 => "device not ready",
    /// A kernel accessed an invalid memory address; the context is unusable afterwards.
    ILLEGAL_ADDRESS = 700 => "an illegal memory access was encountered",
    /// The launch needs more resources than are available.
    LAUNCH_OUT_OF_RESOURCES = 701 => "too many resources requested for launch",
    /// The kernel ran past the watchdog time limit and was terminated.
    LAUNCH_TIMEOUT = 702 => "the launch timed out and was terminated",
    /// The launch uses an incompatible texturing mode.
    LAUNCH_INCOMPATIBLE_TEXTURING = 703 => "launch uses incompatible texturing mode",
    /// Peer access from the current context to the peer is already enabled.
    PEER_ACCESS_ALREADY_ENABLED = 704 => "peer access is already enabled",
    /// Peer access to the peer was never enabled, so it cannot be disabled.
    PEER_ACCESS_NOT_ENABLED = 705 => "peer access has not been enabled",
    /// The primary context of the device is active already.
    PRIMARY_CONTEXT_ACTIVE = 708 => "cannot set while device is active in this process",
    /// The current context has been destroyed or is an uninitialized primary context.
    CONTEXT_IS_DESTROYED = 709 => "context is destroyed",
    /// A device-side assertion failed during kernel execution.
    ASSERT = 710 => "device-side assert triggered",
    /// The hardware resources needed to enable peer access are exhausted.
    TOO_MANY_PEERS = 711 => "peer mapping resources exhausted",
    /// The host memory range is already registered.
    HOST_MEMORY_ALREADY_REGISTERED = 712 =>
        "part or all of the requested memory range is already mapped",
    /// The pointer does not belong to a registered host memory range.
    HOST_MEMORY_NOT_REGISTERED = 713 => "pointer does not correspond to a registered memory region",
    /// A kernel hit a hardware stack error; the context is unusable afterwards.
    HARDWARE_STACK_ERROR = 714 => "hardware stack error",
    /// A kernel executed an illegal instruction; the context is unusable afterwards.
    ILLEGAL_INSTRUCTION = 715 => "an illegal instruction was encountered",
    /// A kernel accessed a misaligned address; the context is unusable afterwards.
    MISALIGNED_ADDRESS = 716 => "misaligned address",
    /// A kernel used an instruction on the wrong address space; the context is unusable afterwards.
    INVALID_ADDRESS_SPACE = 717 => "operation not supported on global/shared address space",
    /// A kernel's program counter wrapped its address space; the context is unusable afterwards.
    INVALID_PC = 718 => "invalid program counter",
    /// A kernel raised an exception; the context is unusable afterwards.
    LAUNCH_FAILED = 719 => "unspecified launch failure",
    /// A cooperative launch asked for more blocks than can be resident at once.
    COOPERATIVE_LAUNCH_TOO_LARGE = 720 => "too many blocks in cooperative launch",
    /// A kernel exited without freeing all of its tensor memory.
    TENSOR_MEMORY_LEAK = 721 => "tensor memory not completely freed",
    /// The operation is not permitted.
    NOT_PERMITTED = 800 => "operation not permitted",
    /// The operation is not supported on this system or device.
    NOT_SUPPORTED = 801 => "operation not supported",
    /// The system is not ready to start CUDA work yet.
    SYSTEM_NOT_READY = 802 => "system not yet initialized",
    /// The display driver and the CUDA driver versions do not match.
    SYSTEM_DRIVER_MISMATCH = 803 =>
        "system has unsupported display driver / cuda driver combination",
    /// Forward-compatibility mode is not supported on this hardware.
    COMPAT_NOT_SUPPORTED_ON_DEVICE = 804 =>
        "forward compatibility was attempted on non supported HW",
    /// The MPS client could not connect to the MPS control daemon or server.
    MPS_CONNECTION_FAILED = 805 =>
        "MPS client failed to connect to the MPS control daemon or the MPS server",
    /// A remote procedure call between MPS server and client failed.
    MPS_RPC_FAILURE = 806 =>
        "the remote procedural call between the MPS server and the MPS client failed",
    /// The MPS server is not ready to accept new clients.
    MPS_SERVER_NOT_READY = 807 => "MPS server is not ready to accept new MPS client requests",
    /// The hardware resources for a new MPS client are exhausted.
    MPS_MAX_CLIENTS_REACHED = 808 =>
        "the hardware resources required to create MPS client have been exhausted",
    /// The hardware resources for device connections are exhausted.
    MPS_MAX_CONNECTIONS_REACHED = 809 =>
        "the hardware resources required to support device connections have been exhausted",
    /// The MPS server terminated the client.
    MPS_CLIENT_TERMINATED = 810 => "the MPS client has been terminated by the server",
    /// The module uses CUDA Dynamic Parallelism, which the current configuration does not support.
    CDP_NOT_SUPPORTED = 811 =>
        "is using CUDA Dynamic Parallelism, but the current configuration, like MPS, does not \
         support it",
    /// The module mixes different versions of CUDA Dynamic Parallelism.
    CDP_VERSION_MISMATCH = 812 =>
        "unsupported interaction between different versions of CUDA Dynamic Parallelism",
    /// The operation is not permitted while the stream is capturing.
    STREAM_CAPTURE_UNSUPPORTED = 900 => "operation not permitted when stream is capturing",
    /// The stream's capture sequence was invalidated by an earlier error.
    STREAM_CAPTURE_INVALIDATED = 901 => "operation failed due to a previous error during capture",
    /// The operation would merge two independent capture sequences.
    STREAM_CAPTURE_MERGE = 902 => "operation would result in a merge of separate capture sequences",
    /// The capture was not begun in this stream.
    STREAM_CAPTURE_UNMATCHED = 903 => "capture was not ended in the same stream as it began",
    /// The capture sequence has a fork that was never joined to the origin stream.
    STREAM_CAPTURE_UNJOINED = 904 => "capturing stream has unjoined work",
    /// A dependency would cross the capture sequence boundary.
    STREAM_CAPTURE_ISOLATION = 905 => "dependency created on uncaptured work in another stream",
    /// The operation would create a disallowed implicit dependency from the legacy stream.
    STREAM_CAPTURE_IMPLICIT = 906 =>
        "operation would make the legacy stream depend on a capturing blocking stream",
    /// The operation is not permitted on an event last recorded in a capturing stream.
    CAPTURED_EVENT = 907 =>
        "operation not permitted on an event last recorded in a capturing stream",
    /// A non-relaxed capture sequence was ended from a thread other than the one that began it.
    STREAM_CAPTURE_WRONG_THREAD = 908 =>
        "attempt to terminate a thread-local capture sequence from another thread",
    /// The wait operation timed out.
    TIMEOUT = 909 => "wait operation timed out",
    /// The graph update breaks a constraint of instantiated-graph update and was not applied.
    GRAPH_EXEC_UPDATE_FAILURE = 910 =>
        "the graph update was not performed because it included changes which violated \
         constraints specific to instantiated graph update",
    /// An asynchronous error occurred in a device outside the GPU.
    EXTERNAL_DEVICE = 911 => "an async error has occured in external entity outside of CUDA",
    /// A kernel launch failed because of a cluster misconfiguration.
    INVALID_CLUSTER_SIZE = 912 =>
        "a kernel launch error has occurred due to cluster misconfiguration",
    /// The function handle is not loaded, but the call needs a loaded function.
    FUNCTION_NOT_LOADED = 913 =>
        "the function handle is not loaded when calling an API that requires a loaded function",
    /// A resource passed to the operation is not of a valid resource type.
    INVALID_RESOURCE_TYPE = 914 =>
        "one or more resources passed in are not valid resource types for the operation",
    /// The resources passed are insufficient or do not apply to the operation.
    INVALID_RESOURCE_CONFIGURATION = 915 =>
        "one or more resources are insufficient or non-applicable for the operation",
    /// The key rotation sequence failed.
    KEY_ROTATION = 916 => "an error happened during the key rotation sequence",
    // Newer than the driver the descriptions were read from: this one paraphrases cuda.h.
    /// The stream is detached (for example its green context was destroyed).
    STREAM_DETACHED = 917 =>
        "the requested operation is not permitted because the stream is in a detached state",
    // Newer than the driver the descriptions were read from: this one paraphrases cuda.h.
    /// Graph recapture failed and was terminated.
    GRAPH_RECAPTURE_FAILURE = 918 => "graph recapture failed and had to be terminated",
    /// An unknown internal error occurred.
    UNKNOWN = 999 => "unknown error",
}

// The table must be strictly increasing by code for the binary search in `DriverError::entry`.
#[allow(
    clippy::indexing_slicing,
    reason = "evaluated at compile time: an index out of bounds fails the build"
)]
const _: () = {
    let mut index = 1;
    while index < TABLE.len() {
        assert!(
            TABLE[index - 1].0 < TABLE[index].0,
            "TABLE is not sorted by code"
        );
        index += 1;
    }
};

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.entry() {
            Some(&(code, name, description)) => write!(f, "{name} ({code}): {description}"),
            None => write!(f, "unknown CUDA error ({})", self.code()),
        }
    }
}

impl fmt::Debug for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "DriverError({name} = {})", self.code()),
            None => write!(f, "DriverError(unknown = {})", self.code()),
        }
    }
}

impl std::error::Error for DriverError {}

/// Turns a raw `CUresult` into a [`DriverResult`].
///
/// # Errors
///
/// Returns the [`DriverError`] for every code other than `0` (`CUDA_SUCCESS`).
pub(crate) fn check(code: u32) -> DriverResult<()> {
    match DriverError::from_raw(code) {
        None => Ok(()),
        Some(error) => Err(error),
    }
}

/// Every result of `results`, each one made even after an error (for clean-up that must reach
/// every item); the first error, if any.
pub(crate) fn first_error<E>(results: impl IntoIterator<Item = Result<(), E>>) -> Result<(), E> {
    // A loop, not `try_fold`: stopping at the first error would skip the rest.
    let mut first = Ok(());
    for result in results {
        if first.is_ok() {
            first = result;
        }
    }
    first
}

/// The error of every fallible function of this crate: an argument refused before any driver call,
/// or the driver's refusal ([`Error::Driver`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The driver refused the call.
    Driver(DriverError),
    /// A size or offset is not a multiple of the allocation granularity the driver requires.
    NotAligned {
        /// What the value is, such as `"size"` or `"offset"`.
        what: &'static str,
        /// The value that is not aligned.
        value: usize,
        /// The granularity it must be a multiple of.
        granularity: usize,
    },
    /// A size that must be non-zero was zero.
    ZeroSize {
        /// What the size is, such as `"size"`.
        what: &'static str,
    },
    /// An arithmetic result would not fit in `usize` (or in the driver's integer type).
    Overflow {
        /// What was being computed, such as `"offset + size"`.
        what: &'static str,
    },
    /// A range reaches past the end of what it indexes.
    OutOfBounds {
        /// What the range indexes, such as `"mapping"`.
        what: &'static str,
        /// The start of the range.
        start: usize,
        /// The end of the range (exclusive).
        end: usize,
        /// The length of what the range indexes.
        len: usize,
    },
    /// Two lengths that must match differ.
    LengthMismatch {
        /// The length required.
        expected: usize,
        /// The length given.
        found: usize,
    },
    /// A byte size that is not a whole number of elements (`size % size_of::<T>() != 0`).
    NotWholeElements {
        /// The size in bytes.
        bytes: usize,
        /// The size of one element in bytes.
        element_size: usize,
    },
    /// The operation needs the memory of one device but was given another's.
    DeviceMismatch {
        /// The ordinal of the device required.
        expected: i32,
        /// The ordinal of the device whose memory was given.
        found: i32,
    },
    /// A device ordinal at or above the number of devices the driver reports
    /// ([`Device::count`](crate::Device::count)): [`Device::get`](crate::Device::get) checks it
    /// before asking the driver, and so does an import of an allocation described for a device
    /// this process does not have.
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// The number of devices the driver reports: the ordinals are `0..count`.
        count: usize,
    },
    /// A device cannot reach another device's memory directly, so a direct copy between them would be
    /// staged by the driver at a fraction of the link's speed (or refused). Checked before any driver
    /// call. Open the memory to the device first (a grant that names it, or a
    /// [`PeerAccess`](crate::PeerAccess) guard and a peer view), or copy with
    /// [`Route::Auto`](crate::Route::Auto) or [`Route::Staged`](crate::Route::Staged).
    NoPeerAccess {
        /// The ordinal of the device that would access the memory.
        device: i32,
        /// The ordinal of the device whose view holds the memory.
        owner: i32,
    },
    /// The driver reports no peer link in this direction (`cuDeviceCanAccessPeer` answered 0), so peer
    /// access cannot be enabled.
    NoPeerLink {
        /// The ordinal of the device that would access.
        from: i32,
        /// The ordinal of the device whose memory would be accessed.
        to: i32,
    },
    /// An ordinal, count or descriptor that the driver or the kernel cannot represent (for example a
    /// device ordinal above `i32::MAX`, or a negative file descriptor number).
    InvalidArgument {
        /// What the argument is, such as `"device ordinal"`.
        what: &'static str,
    },
    /// Text given as PTX holds a byte that PTX text never has: the safe loader
    /// ([`Module::load_ptx`](crate::Module::load_ptx)) accepts only tab, LF, CR and printable ASCII
    /// (`0x20..=0x7E`), so that no binary image reaches the driver, which would read it as far as
    /// its headers say rather than to the terminating NUL.
    NotPtxText {
        /// The offset of the first refused byte.
        offset: usize,
        /// The refused byte.
        byte: u8,
    },
    /// The driver refused an operation, and undoing the part of it that had been done was refused
    /// too: the clean state the operation promises on error could not be restored. The operation's
    /// documentation says what is left (for example a front of a region taken out of use, or a device
    /// that may keep access to a mapping). [`Error::driver`] returns the refusal of the operation;
    /// both errors are here.
    CleanupFailed {
        /// The driver's refusal of the operation itself.
        error: DriverError,
        /// The driver's refusal of the undo.
        cleanup: DriverError,
        /// What was being undone, such as `"mapping"` or `"grant"`.
        what: &'static str,
    },
    /// A byte range of a reservation of the owned layer ([`VirtualBuffer`](crate::VirtualBuffer),
    /// [`SharedReservation`](crate::SharedReservation)) that does not fit what is mapped there: a new
    /// page or mapping over bytes already mapped, a view over bytes not mapped, an unmap that would
    /// cut a page in two. Checked before any driver call.
    PageRange {
        /// The first byte of the range, counted from the reservation's base.
        start: usize,
        /// The end of the range (exclusive).
        end: usize,
        /// What is wrong with those bytes, such as `"are mapped already"`.
        problem: &'static str,
    },
    /// The device does not support what was asked, as its attribute says (checked before the call
    /// that needs it): host or host-NUMA memory, or a kind of shareable handle.
    Unsupported {
        /// What is not supported, such as `"host NUMA memory"`.
        what: &'static str,
        /// The device's ordinal.
        device: i32,
        /// The `CUdevice_attribute` that answered 0 (or that the driver does not know).
        attribute: i32,
    },
    /// The driver refused an operation for a reason this crate can name: for fabric-shareable memory,
    /// `CUDA_ERROR_NOT_PERMITTED` means that the process has no IMEX channel.
    Refused {
        /// What was refused, such as `"fabric-shareable memory"`.
        what: &'static str,
        /// Why, in words.
        why: &'static str,
        /// The driver's error.
        error: DriverError,
    },
    /// The operating system refused a call that passes a handle between processes (`sendmsg`,
    /// `recvmsg`, `pidfd_open`, `pidfd_getfd`).
    Os {
        /// The call, and where it helps, when the kernel refuses it.
        what: &'static str,
        /// The `errno` value.
        errno: i32,
    },
    /// A handle received from another process, or its description, is malformed: checked before any
    /// driver call sees it.
    InvalidMessage {
        /// What is wrong, such as `"expected exactly one file descriptor"`.
        what: &'static str,
    },
    /// An event made without timing ([`Event::new`](crate::Event::new)) was asked for a time:
    /// both events of [`Event::elapsed_ms`](crate::Event::elapsed_ms) must come from
    /// [`Event::timed`](crate::Event::timed). Checked before any driver call.
    NotTimed,
    /// A stream of another library (cudarc, behind the `cudarc` feature) cannot take this crate's
    /// memory, or was given it where its scope does not wait for the work: the scope's stream is of
    /// a non-primary context, the per-thread default stream or capturing a graph, or a lent view was
    /// asked for its address for another stream. Checked before the work is queued; a view refused
    /// this way gives the work the address of a range that is never mapped, never its memory.
    StreamRefused {
        /// Why, in words.
        why: &'static str,
    },
    /// A stream capturing a graph: a stream of this crate's, asked to queue work that borrows memory
    /// (checked before the work is queued), or a stream a wait found capturing, whose capture the
    /// wait then ended and whose graph it destroyed, so that no graph holds an address lent to the
    /// work after its scope. Returned by a wait only once the work it waited for has finished.
    StreamCapturing {
        /// What was refused or done, in words.
        what: &'static str,
    },
}

impl Error {
    /// The driver's error, if the driver refused the call.
    #[must_use]
    pub fn driver(&self) -> Option<DriverError> {
        match *self {
            Error::Driver(error)
            | Error::CleanupFailed { error, .. }
            | Error::Refused { error, .. } => Some(error),
            _ => None,
        }
    }

    /// Whether this error means that the machine has no usable GPU: an [`Error::Driver`] whose code
    /// [is a no-GPU code](DriverError::is_no_gpu) (no GPU or no kernel driver, or a toolkit's stub
    /// loaded instead of the driver). Programs and tests that should say so and stop, rather than
    /// fail, ask this of [`init`](crate::init)'s error.
    #[must_use]
    pub fn is_no_gpu(&self) -> bool {
        matches!(*self, Error::Driver(error) if error.is_no_gpu())
    }
}

impl From<DriverError> for Error {
    fn from(error: DriverError) -> Self {
        Error::Driver(error)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            // The driver's own text, so that printing the error alone says what went wrong.
            Error::Driver(error) => write!(f, "CUDA driver call failed: {error}"),
            Error::NotAligned {
                what,
                value,
                granularity,
            } => write!(
                f,
                "{what} {value} is not a multiple of the allocation granularity {granularity}"
            ),
            Error::ZeroSize { what } => write!(f, "{what} must not be zero"),
            Error::Overflow { what } => write!(f, "arithmetic overflow computing {what}"),
            Error::OutOfBounds {
                what,
                start,
                end,
                len,
            } => {
                write!(
                    f,
                    "range {start}..{end} is out of bounds of the {what} of length {len}"
                )
            }
            Error::LengthMismatch { expected, found } => {
                write!(f, "length mismatch: expected {expected}, found {found}")
            }
            Error::NotWholeElements {
                bytes,
                element_size,
            } => write!(
                f,
                "{bytes} bytes is not a whole number of {element_size}-byte elements"
            ),
            Error::DeviceMismatch { expected, found } => write!(
                f,
                "memory of device {found} was given where memory of device {expected} is needed"
            ),
            Error::NoSuchDevice { ordinal, count } => write!(
                f,
                "device ordinal {ordinal} is not below the device count {count}"
            ),
            Error::NoPeerAccess { device, owner } => write!(
                f,
                "device {device} has no access to the memory of the view on device {owner}: grant it \
                 access or open peer access first, or copy with Route::Auto or Route::Staged"
            ),
            Error::NoPeerLink { from, to } => write!(
                f,
                "the driver reports no peer link from device {from} to device {to}"
            ),
            Error::InvalidArgument { what } => {
                write!(f, "{what} cannot be represented by the driver")
            }
            Error::NotPtxText { offset, byte } => write!(
                f,
                "byte {byte:#04x} at offset {offset} is not PTX text \
                 (only tab, LF, CR and printable ASCII are loaded)"
            ),
            Error::CleanupFailed {
                error,
                cleanup,
                what,
            } => write!(
                f,
                "{error}; undoing the partial {what} failed too: {cleanup}"
            ),
            Error::PageRange {
                start,
                end,
                problem,
            } => write!(f, "bytes {start}..{end} of the reserved range {problem}"),
            Error::Unsupported {
                what,
                device,
                attribute,
            } => write!(
                f,
                "device {device} does not support {what} (device attribute {attribute} is 0 or unknown \
                 to this driver)"
            ),
            Error::Refused { what, why, error } => {
                write!(f, "the driver refused {what}: {why} ({error})")
            }
            Error::Os { what, errno } => write!(
                f,
                "{what} failed: {}",
                std::io::Error::from_raw_os_error(errno)
            ),
            Error::InvalidMessage { what } => {
                write!(f, "invalid shared-allocation message: {what}")
            }
            Error::NotTimed => write!(
                f,
                "an event made without timing (Event::new) cannot be timed: make both with Event::timed"
            ),
            Error::StreamRefused { why } => {
                write!(f, "the stream cannot take this crate's memory: {why}")
            }
            Error::StreamCapturing { what } => write!(f, "a stream is capturing a graph: {what}"),
        }
    }
}

/// No error of this crate has a `source`: each one's text is whole on its own (an [`Error::Driver`]
/// prints the driver's name and description), and a reporter that printed a source too would print
/// the driver's text twice. [`Error::driver`] gives the driver's code.
impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn first_error_tries_every_item_and_keeps_the_first_error() {
        let mut tried = Vec::new();
        let first = first_error([0u32, 1, 0, 2, 0].into_iter().map(|code| {
            tried.push(code);
            check(code)
        }));
        assert_eq!(first, Err(DriverError::INVALID_VALUE));
        assert_eq!(tried, [0, 1, 0, 2, 0], "every item was tried");
        assert_eq!(first_error([Ok::<(), DriverError>(()), Ok(())]), Ok(()));
    }

    #[test]
    fn every_code_formats_without_panicking() {
        for code in (0..=1000).chain([u32::MAX]) {
            let Some(error) = DriverError::from_raw(code) else {
                assert_eq!(code, 0, "only CUDA_SUCCESS maps to None");
                continue;
            };
            assert_eq!(error.code(), code);
            let display = error.to_string();
            let debug = format!("{error:?}");
            if let Some(name) = error.name() {
                assert!(name.starts_with("CUDA_ERROR_"), "{name}");
                let description = error.description().expect("known code without description");
                assert!(!description.is_empty());
                assert_eq!(display, format!("{name} ({code}): {description}"));
                assert_eq!(debug, format!("DriverError({name} = {code})"));
            } else {
                assert_eq!(error.description(), None);
                assert_eq!(display, format!("unknown CUDA error ({code})"));
                assert_eq!(debug, format!("DriverError(unknown = {code})"));
            }
        }
    }

    #[test]
    fn table_is_sorted_unique_and_prefixed() {
        assert_eq!(TABLE.len(), 102);
        for pair in TABLE.windows(2) {
            assert!(pair[0].0 < pair[1].0, "{} before {}", pair[0].0, pair[1].0);
        }
        let mut names: Vec<&str> = TABLE.iter().map(|&(_, name, _)| name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), TABLE.len(), "duplicate names");
        for &(code, name, description) in TABLE {
            assert_ne!(code, 0);
            assert!(name.starts_with("CUDA_ERROR_"), "{name}");
            assert!(!description.is_empty(), "{name}");
            assert_eq!(
                DriverError::from_raw(code).and_then(DriverError::name),
                Some(name)
            );
        }
    }

    #[test]
    fn spot_checks() {
        let name = |code| DriverError::from_raw(code).and_then(DriverError::name);
        assert_eq!(name(1), Some("CUDA_ERROR_INVALID_VALUE"));
        assert_eq!(name(34), Some("CUDA_ERROR_STUB_LIBRARY"));
        assert_eq!(name(704), Some("CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED"));
        assert_eq!(name(999), Some("CUDA_ERROR_UNKNOWN"));
        assert_eq!(name(12345), None);

        assert_eq!(DriverError::INVALID_VALUE.code(), 1);
        assert_eq!(
            DriverError::OUT_OF_MEMORY.description(),
            Some("out of memory")
        );
        assert_eq!(DriverError::STUB_LIBRARY.code(), 34);
        assert_eq!(DriverError::PEER_ACCESS_UNSUPPORTED.code(), 217);
        assert_eq!(DriverError::TOO_MANY_PEERS.code(), 711);
        assert_eq!(DriverError::GRAPH_RECAPTURE_FAILURE.code(), 918);
        assert_eq!(DriverError::UNKNOWN.code(), 999);
        assert_eq!(
            DriverError::INVALID_VALUE.to_string(),
            "CUDA_ERROR_INVALID_VALUE (1): invalid argument"
        );
        assert_eq!(
            format!("{:?}", DriverError::INVALID_VALUE),
            "DriverError(CUDA_ERROR_INVALID_VALUE = 1)"
        );
        let unknown = DriverError::from_raw(12345).unwrap();
        assert_eq!(unknown.to_string(), "unknown CUDA error (12345)");
        assert_eq!(format!("{unknown:?}"), "DriverError(unknown = 12345)");
    }

    #[test]
    fn check_and_layout() {
        assert_eq!(check(0), Ok(()));
        assert_eq!(check(1), Err(DriverError::INVALID_VALUE));
        assert_eq!(check(u32::MAX).unwrap_err().code(), u32::MAX);
        assert_eq!(size_of::<DriverResult<()>>(), size_of::<u32>());
    }

    #[test]
    fn errors_of_host_memory_and_ipc() {
        let refused = Error::Refused {
            what: "fabric-shareable memory",
            why: "no IMEX channel is accessible to this process",
            error: DriverError::NOT_PERMITTED,
        };
        assert_eq!(refused.driver(), Some(DriverError::NOT_PERMITTED));
        assert_eq!(
            refused.to_string(),
            "the driver refused fabric-shareable memory: no IMEX channel is accessible to this \
             process (CUDA_ERROR_NOT_PERMITTED (800): operation not permitted)"
        );
        let unsupported = Error::Unsupported {
            what: "host NUMA memory",
            device: 0,
            attribute: 141,
        };
        assert_eq!(
            unsupported.to_string(),
            "device 0 does not support host NUMA memory (device attribute 141 is 0 or unknown to \
             this driver)"
        );
        let os = Error::Os {
            what: "pidfd_getfd",
            errno: 1,
        };
        assert!(os.to_string().starts_with("pidfd_getfd failed: "), "{os}");
        let message = Error::InvalidMessage {
            what: "expected exactly one file descriptor",
        };
        assert_eq!(
            message.to_string(),
            "invalid shared-allocation message: expected exactly one file descriptor"
        );
        for error in [&unsupported, &os, &message] {
            assert_eq!(error.driver(), None);
            assert!(error.source().is_none());
        }
    }

    #[test]
    fn is_no_gpu_is_asked_of_the_drivers_refusal() {
        assert!(Error::Driver(DriverError::NO_DEVICE).is_no_gpu());
        assert!(Error::from(DriverError::STUB_LIBRARY).is_no_gpu());
        assert!(!Error::Driver(DriverError::INVALID_VALUE).is_no_gpu());
        assert!(!Error::NotTimed.is_no_gpu());
        assert!(
            !Error::Refused {
                what: "fabric-shareable memory",
                why: "no IMEX channel is accessible to this process",
                error: DriverError::NO_DEVICE,
            }
            .is_no_gpu(),
            "only a plain driver refusal says that there is no GPU"
        );
    }

    #[test]
    fn not_timed_says_what_to_do() {
        assert_eq!(
            Error::NotTimed.to_string(),
            "an event made without timing (Event::new) cannot be timed: make both with Event::timed"
        );
        assert_eq!(Error::NotTimed.driver(), None);
        assert!(Error::NotTimed.source().is_none());
    }

    #[test]
    fn error_display_source_and_conversion() {
        let driver = Error::from(DriverError::OUT_OF_MEMORY);
        let cleanup = Error::CleanupFailed {
            error: DriverError::OUT_OF_MEMORY,
            cleanup: DriverError::INVALID_VALUE,
            what: "mapping",
        };
        // (error, its whole text, or "" where only non-emptiness is checked)
        let cases = [
            (
                driver.clone(),
                "CUDA driver call failed: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory",
            ),
            (
                Error::NotAligned {
                    what: "size",
                    value: 4096,
                    granularity: 2 << 20,
                },
                "size 4096 is not a multiple of the allocation granularity 2097152",
            ),
            (Error::ZeroSize { what: "size" }, ""),
            (
                Error::Overflow {
                    what: "offset + size",
                },
                "",
            ),
            (
                Error::OutOfBounds {
                    what: "mapping",
                    start: 10,
                    end: 20,
                    len: 15,
                },
                "",
            ),
            (
                Error::LengthMismatch {
                    expected: 4,
                    found: 5,
                },
                "",
            ),
            (
                Error::NotWholeElements {
                    bytes: 7,
                    element_size: 4,
                },
                "",
            ),
            (
                Error::DeviceMismatch {
                    expected: 0,
                    found: 1,
                },
                "",
            ),
            (
                Error::InvalidArgument {
                    what: "device ordinal",
                },
                "device ordinal cannot be represented by the driver",
            ),
            (
                Error::NotPtxText {
                    offset: 1,
                    byte: 0xed,
                },
                "byte 0xed at offset 1 is not PTX text (only tab, LF, CR and printable ASCII are loaded)",
            ),
            (
                cleanup.clone(),
                "CUDA_ERROR_OUT_OF_MEMORY (2): out of memory; undoing the partial mapping failed too: \
                 CUDA_ERROR_INVALID_VALUE (1): invalid argument",
            ),
            (
                Error::NoPeerAccess {
                    device: 1,
                    owner: 0,
                },
                "device 1 has no access to the memory of the view on device 0: grant it access or \
                 open peer access first, or copy with Route::Auto or Route::Staged",
            ),
            (
                Error::NoPeerLink { from: 0, to: 3 },
                "the driver reports no peer link from device 0 to device 3",
            ),
        ];
        for (error, text) in &cases {
            assert!(!error.to_string().is_empty(), "{error:?}");
            if !text.is_empty() {
                assert_eq!(error.to_string(), *text);
            }
            // Every text is whole on its own (the driver's text included), so no error also hands
            // out a source that a reporter would print a second time.
            assert!(error.source().is_none(), "{error:?}");
        }
        // The driver's refusal, where there was one: for a failed clean-up, the operation's own.
        assert_eq!(driver.driver(), Some(DriverError::OUT_OF_MEMORY));
        assert_eq!(cleanup.driver(), Some(DriverError::OUT_OF_MEMORY));
        for (error, _) in cases.iter().skip(1).filter(|(e, _)| *e != cleanup) {
            assert_eq!(error.driver(), None, "{error:?}");
        }
    }

    #[test]
    fn no_such_device_is_no_driver_error() {
        let error = Error::NoSuchDevice {
            ordinal: 2,
            count: 2,
        };
        assert_eq!(
            error.to_string(),
            "device ordinal 2 is not below the device count 2"
        );
        assert_eq!(error.driver(), None);
        assert!(!error.is_no_gpu());
        assert!(error.source().is_none());
    }

    #[test]
    fn page_range_display_and_source() {
        let range = Error::PageRange {
            start: 2 << 20,
            end: 4 << 20,
            problem: "are mapped already",
        };
        assert_eq!(
            range.to_string(),
            "bytes 2097152..4194304 of the reserved range are mapped already"
        );
        assert!(range.source().is_none());
        assert_eq!(range.driver(), None);

        // `CleanupFailed` itself is covered by `error_display_source_and_conversion`.
    }
}
