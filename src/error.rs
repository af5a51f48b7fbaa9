//! Errors: the one [`Error`] of every fallible function, and the driver's result codes it holds.
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
//! Inside the crate, one driver call's result is a `DriverResult`, which keeps the bare code, so
//! that clean-up paths can report both codes of an [`Error::CleanupFailed`].
//!
//! # Files
//!
//! - this file: [`Error`], [`Result`], and the helpers that turn driver codes into results
//!   (`check`, `first_error`);
//! - `error/driver.rs`: [`DriverError`], why it is a newtype of an integer, and what it prints;
//! - `error/codes.rs`: the table of the 102 codes this crate names, each with the driver's own
//!   name and description, from which the constants' documentation is made.

use core::fmt;

mod codes;
mod driver;

pub use driver::DriverError;

/// The result of every fallible function of this crate: `Ok`, or the [`Error`] that says why not.
pub type Result<T, E = Error> = core::result::Result<T, E>;

/// The result of one driver call inside the crate: `Ok` for `CUDA_SUCCESS`, otherwise the
/// [`DriverError`]. Internal helpers keep the driver's code this precise; every public function
/// turns it into an [`Error::Driver`].
pub(crate) type DriverResult<T> = core::result::Result<T, DriverError>;

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

/// `error`, or [`Error::CleanupFailed`] where undoing `what` failed too (`cleanup`).
pub(crate) fn with_cleanup(
    error: DriverError,
    cleanup: DriverResult<()>,
    what: &'static str,
) -> Error {
    match cleanup {
        Ok(()) => Error::Driver(error),
        Err(cleanup) => Error::CleanupFailed {
            error,
            cleanup,
            what,
        },
    }
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
    /// [`Route::Auto`](crate::peer::Route::Auto) or [`Route::Staged`](crate::peer::Route::Staged).
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
    /// [`SharedReservation`](crate::owned::SharedReservation)) that does not fit what is mapped there: a new
    /// page or mapping over bytes already mapped, a view over bytes not mapped, an unmap that would
    /// cut a page in two, a joined view ([`GrantedMapping::slice_joined`](crate::owned::GrantedMapping::slice_joined))
    /// over mappings that are not back to back in one reservation with one access set. Checked
    /// before any driver call.
    PageRange {
        /// The first byte of the range, counted from the reservation's base.
        start: usize,
        /// The end of the range (exclusive).
        end: usize,
        /// What is wrong with those bytes, such as `"are mapped already"`.
        problem: &'static str,
    },
    /// A parked graph ([`ParkedGraph`](crate::stream::ParkedGraph)) rebound without memory that
    /// covers bytes its work touches: `[start, end)`, device addresses (host addresses where
    /// `host`), in no memory given to the [`Rebind`](crate::stream::Rebind), in memory given for
    /// reading only where the graph writes them, or in memory the graph's device does not reach.
    /// Checked before the graph can be launched again.
    GraphRange {
        /// The first address of the bytes.
        start: u64,
        /// The end of the bytes (exclusive).
        end: u64,
        /// Whether the addresses are of host memory.
        host: bool,
        /// What is wrong with those bytes, such as `"are in no memory given to the rebind"`.
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
    /// An allocation option that memory at its location cannot have
    /// ([`AllocationOptions`](crate::vmm::AllocationOptions)): a shareable handle kind for host
    /// memory with no NUMA node, a fabric handle or the `GPUDirect` RDMA flag for host memory. Checked
    /// before `cuMemCreate`.
    NotForLocation {
        /// The option, such as `"a shareable handle kind"`.
        what: &'static str,
        /// Where the memory would live, in words.
        location: &'static str,
        /// Why the option is refused there.
        why: &'static str,
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
    /// Fabric-shareable memory (a fabric handle kind, [`Fabric`](crate::ipc::Fabric) memory, or
    /// the import of a fabric handle) was asked for where the machine has no IMEX channel
    /// ([`device::imex_channel`](crate::device::imex_channel) found no
    /// `/dev/nvidia-caps-imex-channels/channel<N>`). The driver would refuse it
    /// (`CUDA_ERROR_NOT_PERMITTED`); this is checked first, before any allocation or import. An
    /// IMEX channel comes with the IMEX service of a multi-node `NVLink` system (or a container
    /// given one); machines without it share memory between processes as POSIX file descriptors.
    NoImexChannel {
        /// The device whose fabric-shareable memory was asked for.
        device: i32,
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
    /// cudarc (feature `cudarc`) was built for an older CUDA version than the driver's API, so a
    /// scope of `interop::cudarc` is refused before its closure runs. cudarc reads every `CUresult`
    /// into a Rust enum of the codes of the version it was built for, and most CUDA releases add
    /// codes: a driver newer than that enum may return one, which is undefined behaviour inside
    /// cudarc, where nothing can catch it. Building cudarc for the driver's version or a newer one
    /// (one `cuda-NNNNN` feature in the application's cudarc dependency) lifts the refusal.
    CudarcOlderThanDriver {
        /// The version cudarc was built for (`cudarc::driver::sys::CUDA_VERSION`), as
        /// `1000 * major + 10 * minor`.
        cudarc: u32,
        /// The driver's API version ([`driver_version`](crate::device::driver_version)), as
        /// `1000 * major + 10 * minor`.
        driver: i32,
    },
    /// A stream capturing a graph: a stream of this crate's, asked to queue work that borrows memory
    /// (checked before the work is queued), or a stream a wait found capturing, whose capture the
    /// wait then ended and whose graph it destroyed, so that no graph holds an address lent to the
    /// work after its scope. Returned by a wait only once the work it waited for has finished.
    StreamCapturing {
        /// What was refused or done, in words.
        what: &'static str,
    },
    /// NCCL (feature `nccl`) returned an error: `code` is its `ncclResult_t`, read as the integer it
    /// is (a value this crate does not name prints as unknown, never as undefined behaviour).
    Nccl {
        /// The NCCL function, such as `"ncclAllReduce"`.
        call: &'static str,
        /// The `ncclResult_t` it returned (never 0, `ncclSuccess`).
        code: i32,
    },
    /// NCCL (feature `nccl`) cannot serve a call: the library cannot be loaded, or the loaded one
    /// lacks the function (older than the function's NCCL release).
    NcclUnavailable {
        /// The NCCL function, such as `"ncclCommWindowRegister"`.
        call: &'static str,
        /// Why, in words.
        why: &'static str,
    },
    /// An NCCL call (feature `nccl`) refused before it was made, for a reason NCCL would not check
    /// or would report only as a hang, a fault or a null handle: memory that is not exportable, a
    /// second window over registered bytes, a call inside a group that must not be deferred.
    NcclRefused {
        /// The NCCL function that was not called, such as `"ncclCommWindowRegister"`.
        call: &'static str,
        /// Why, in words.
        why: &'static str,
    },
}

/// The name and meaning of an `ncclResult_t` value, as NCCL 2.28's `nccl.h` names them (8,
/// `ncclTimeout`, is NCCL 2.29's).
pub(crate) fn nccl_code_name(code: i32) -> &'static str {
    match code {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError: a call to CUDA failed",
        2 => "ncclSystemError: a system call failed",
        3 => "ncclInternalError: an internal check failed (an NCCL bug or memory corruption)",
        4 => "ncclInvalidArgument: an argument is invalid",
        5 => "ncclInvalidUsage: the call is invalid here (a usage error)",
        6 => "ncclRemoteError: a remote rank or the network failed",
        7 => "ncclInProgress: the operation is still in progress",
        8 => "ncclTimeout: the operation timed out",
        _ => "an ncclResult_t this crate does not name",
    }
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
    // One arm per variant: the match is as long as the enum.
    #[allow(clippy::too_many_lines)]
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
            Error::GraphRange {
                start,
                end,
                host,
                problem,
            } => write!(
                f,
                "{} bytes {start:#x}..{end:#x} that the parked graph touches {problem}",
                if host { "host" } else { "device" }
            ),
            Error::Unsupported {
                what,
                device,
                attribute,
            } => write!(
                f,
                "device {device} does not support {what} (device attribute {attribute} is 0 or unknown \
                 to this driver)"
            ),
            Error::NotForLocation {
                what,
                location,
                why,
            } => write!(
                f,
                "{what} is not offered for memory located {location}: {why}"
            ),
            Error::Refused { what, why, error } => {
                write!(f, "the driver refused {what}: {why} ({error})")
            }
            Error::NoImexChannel { device } => write!(
                f,
                "fabric-shareable memory of device {device} needs an IMEX channel, and this machine \
                 has none (no /dev/nvidia-caps-imex-channels/channel<N>): checked before any \
                 allocation; share memory as a POSIX file descriptor instead, or run under an IMEX \
                 service"
            ),
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
            Error::CudarcOlderThanDriver { cudarc, driver } => write!(
                f,
                "cudarc was built for CUDA {}.{} ({cudarc}), older than the driver's CUDA {}.{} \
                 ({driver}), which can return result codes that cudarc's enum lacks (undefined \
                 behaviour inside cudarc): build cudarc for CUDA {}.{} or newer (its `cuda-{:05}` \
                 feature or a later one)",
                cudarc / 1000,
                cudarc % 1000 / 10,
                driver / 1000,
                driver % 1000 / 10,
                driver / 1000,
                driver % 1000 / 10,
                driver,
            ),
            Error::StreamCapturing { what } => write!(f, "a stream is capturing a graph: {what}"),
            Error::Nccl { call, code } => {
                write!(f, "{call} failed: {code} {}", nccl_code_name(code))
            }
            Error::NcclUnavailable { call, why } => write!(f, "NCCL cannot serve {call}: {why}"),
            Error::NcclRefused { call, why } => {
                write!(f, "{call} was not called: {why}")
            }
        }
    }
}

/// No error of this crate has a `source`: each one's text is whole on its own (an [`Error::Driver`]
/// prints the driver's name and description), and a reporter that printed a source too would print
/// the driver's text twice. [`Error::driver`] gives the driver's code.
impl std::error::Error for Error {}

#[cfg(test)]
mod tests;
