//! The table of the driver codes this crate knows: one line per `CUresult` code, each made an
//! associated constant of [`DriverError`] and a row of [`TABLE`]. A constant's documentation is
//! made from its row, so it says what the driver says.

use super::driver::DriverError;

/// Declares the known driver codes once: each entry becomes an associated constant of
/// [`DriverError`], documented with the code's name, number and the driver's description, and a
/// row of [`TABLE`]. An entry's own doc lines, if any, follow that generated line.
macro_rules! driver_errors {
    ($($(#[$attr:meta])* $name:ident = $code:literal => $description:literal,)*) => {
        /// The codes of the `CUresult` enum, named without the `CUDA_ERROR_` prefix.
        impl DriverError {
            $(
                #[doc = concat!(
                    "`CUDA_ERROR_", stringify!($name), "` (", $code, "): \"", $description, "\""
                )]
                $(#[$attr])*
                pub const $name: DriverError = DriverError::known($code);
            )*
        }

        /// Every known code as `(code, name, description)`, sorted by code (checked at compile
        /// time below), so lookups can binary-search it.
        pub(super) const TABLE: &[(u32, &str, &str)] = &[
            $(($code, concat!("CUDA_ERROR_", stringify!($name)), $description),)*
        ];
    };
}

impl DriverError {
    /// The table row of this code, if it has one (the table is sorted: checked below).
    pub(super) fn entry(self) -> Option<&'static (u32, &'static str, &'static str)> {
        TABLE
            .binary_search_by_key(&self.code(), |&(code, _, _)| code)
            .ok()
            .and_then(|index| TABLE.get(index))
    }
}

driver_errors! {
    INVALID_VALUE = 1 => "invalid argument",
    OUT_OF_MEMORY = 2 => "out of memory",
    NOT_INITIALIZED = 3 => "initialization error",
    DEINITIALIZED = 4 => "driver shutting down",
    PROFILER_DISABLED = 5 => "profiler disabled while using external profiling tool",
    PROFILER_NOT_INITIALIZED = 6 => "profiler not initialized: call cudaProfilerInitialize()",
    PROFILER_ALREADY_STARTED = 7 => "profiler already started",
    PROFILER_ALREADY_STOPPED = 8 => "profiler already stopped",
    STUB_LIBRARY = 34 => "CUDA driver is a stub library",
    CALL_REQUIRES_NEWER_DRIVER = 36 => "API call is not supported in the installed CUDA driver",
    DEVICE_UNAVAILABLE = 46 => "CUDA-capable device(s) is/are busy or unavailable",
    NO_DEVICE = 100 => "no CUDA-capable device is detected",
    INVALID_DEVICE = 101 => "invalid device ordinal",
    DEVICE_NOT_LICENSED = 102 => "device doesn't have valid Grid license",
    INVALID_IMAGE = 200 => "device kernel image is invalid",
    INVALID_CONTEXT = 201 => "invalid device context",
    CONTEXT_ALREADY_CURRENT = 202 => "context already current",
    MAP_FAILED = 205 => "mapping of buffer object failed",
    UNMAP_FAILED = 206 => "unmapping of buffer object failed",
    ARRAY_IS_MAPPED = 207 => "array is mapped",
    ALREADY_MAPPED = 208 => "resource already mapped",
    NO_BINARY_FOR_GPU = 209 => "no kernel image is available for execution on the device",
    ALREADY_ACQUIRED = 210 => "resource already acquired",
    NOT_MAPPED = 211 => "resource not mapped",
    NOT_MAPPED_AS_ARRAY = 212 => "resource not mapped as array",
    NOT_MAPPED_AS_POINTER = 213 => "resource not mapped as pointer",
    ECC_UNCORRECTABLE = 214 => "uncorrectable ECC error encountered",
    UNSUPPORTED_LIMIT = 215 => "limit is not supported on this architecture",
    CONTEXT_ALREADY_IN_USE = 216 => "exclusive-thread device already in use by a different thread",
    PEER_ACCESS_UNSUPPORTED = 217 => "peer access is not supported between these two devices",
    INVALID_PTX = 218 => "a PTX JIT compilation failed",
    INVALID_GRAPHICS_CONTEXT = 219 => "invalid OpenGL or DirectX context",
    NVLINK_UNCORRECTABLE = 220 => "uncorrectable NVLink error detected during the execution",
    JIT_COMPILER_NOT_FOUND = 221 => "PTX JIT compiler library not found",
    UNSUPPORTED_PTX_VERSION = 222 => "the provided PTX was compiled with an unsupported toolchain.",
    JIT_COMPILATION_DISABLED = 223 => "PTX JIT compilation was disabled",
    UNSUPPORTED_EXEC_AFFINITY = 224 => "the provided execution affinity is not supported",
    UNSUPPORTED_DEVSIDE_SYNC = 225 =>
        "the provided PTX contains unsupported call to cudaDeviceSynchronize",
    CONTAINED = 226 => "Invalid access of peer GPU memory over nvlink or a hardware error",
    INVALID_SOURCE = 300 => "device kernel image is invalid",
    FILE_NOT_FOUND = 301 => "file not found",
    SHARED_OBJECT_SYMBOL_NOT_FOUND = 302 => "shared object symbol not found",
    SHARED_OBJECT_INIT_FAILED = 303 => "shared object initialization failed",
    OPERATING_SYSTEM = 304 => "OS call failed or operation not supported on this OS",
    INVALID_HANDLE = 400 => "invalid resource handle",
    ILLEGAL_STATE = 401 => "the operation cannot be performed in the present state",
    LOSSY_QUERY = 402 => "attempted introspection would be semantically lossy",
    NOT_FOUND = 500 => "named symbol not found",
    NOT_READY = 600 => "device not ready",
    ILLEGAL_ADDRESS = 700 => "an illegal memory access was encountered",
    LAUNCH_OUT_OF_RESOURCES = 701 => "too many resources requested for launch",
    LAUNCH_TIMEOUT = 702 => "the launch timed out and was terminated",
    LAUNCH_INCOMPATIBLE_TEXTURING = 703 => "launch uses incompatible texturing mode",
    PEER_ACCESS_ALREADY_ENABLED = 704 => "peer access is already enabled",
    PEER_ACCESS_NOT_ENABLED = 705 => "peer access has not been enabled",
    PRIMARY_CONTEXT_ACTIVE = 708 => "cannot set while device is active in this process",
    CONTEXT_IS_DESTROYED = 709 => "context is destroyed",
    ASSERT = 710 => "device-side assert triggered",
    TOO_MANY_PEERS = 711 => "peer mapping resources exhausted",
    HOST_MEMORY_ALREADY_REGISTERED = 712 =>
        "part or all of the requested memory range is already mapped",
    HOST_MEMORY_NOT_REGISTERED = 713 => "pointer does not correspond to a registered memory region",
    HARDWARE_STACK_ERROR = 714 => "hardware stack error",
    ILLEGAL_INSTRUCTION = 715 => "an illegal instruction was encountered",
    MISALIGNED_ADDRESS = 716 => "misaligned address",
    INVALID_ADDRESS_SPACE = 717 => "operation not supported on global/shared address space",
    INVALID_PC = 718 => "invalid program counter",
    LAUNCH_FAILED = 719 => "unspecified launch failure",
    COOPERATIVE_LAUNCH_TOO_LARGE = 720 => "too many blocks in cooperative launch",
    TENSOR_MEMORY_LEAK = 721 => "tensor memory not completely freed",
    NOT_PERMITTED = 800 => "operation not permitted",
    NOT_SUPPORTED = 801 => "operation not supported",
    SYSTEM_NOT_READY = 802 => "system not yet initialized",
    SYSTEM_DRIVER_MISMATCH = 803 =>
        "system has unsupported display driver / cuda driver combination",
    COMPAT_NOT_SUPPORTED_ON_DEVICE = 804 =>
        "forward compatibility was attempted on non supported HW",
    MPS_CONNECTION_FAILED = 805 =>
        "MPS client failed to connect to the MPS control daemon or the MPS server",
    MPS_RPC_FAILURE = 806 =>
        "the remote procedural call between the MPS server and the MPS client failed",
    MPS_SERVER_NOT_READY = 807 => "MPS server is not ready to accept new MPS client requests",
    MPS_MAX_CLIENTS_REACHED = 808 =>
        "the hardware resources required to create MPS client have been exhausted",
    MPS_MAX_CONNECTIONS_REACHED = 809 =>
        "the hardware resources required to support device connections have been exhausted",
    MPS_CLIENT_TERMINATED = 810 => "the MPS client has been terminated by the server",
    CDP_NOT_SUPPORTED = 811 =>
        "is using CUDA Dynamic Parallelism, but the current configuration, like MPS, does not \
         support it",
    CDP_VERSION_MISMATCH = 812 =>
        "unsupported interaction between different versions of CUDA Dynamic Parallelism",
    STREAM_CAPTURE_UNSUPPORTED = 900 => "operation not permitted when stream is capturing",
    STREAM_CAPTURE_INVALIDATED = 901 => "operation failed due to a previous error during capture",
    STREAM_CAPTURE_MERGE = 902 => "operation would result in a merge of separate capture sequences",
    STREAM_CAPTURE_UNMATCHED = 903 => "capture was not ended in the same stream as it began",
    STREAM_CAPTURE_UNJOINED = 904 => "capturing stream has unjoined work",
    STREAM_CAPTURE_ISOLATION = 905 => "dependency created on uncaptured work in another stream",
    STREAM_CAPTURE_IMPLICIT = 906 =>
        "operation would make the legacy stream depend on a capturing blocking stream",
    CAPTURED_EVENT = 907 =>
        "operation not permitted on an event last recorded in a capturing stream",
    STREAM_CAPTURE_WRONG_THREAD = 908 =>
        "attempt to terminate a thread-local capture sequence from another thread",
    TIMEOUT = 909 => "wait operation timed out",
    GRAPH_EXEC_UPDATE_FAILURE = 910 =>
        "the graph update was not performed because it included changes which violated \
         constraints specific to instantiated graph update",
    EXTERNAL_DEVICE = 911 => "an async error has occured in external entity outside of CUDA",
    INVALID_CLUSTER_SIZE = 912 =>
        "a kernel launch error has occurred due to cluster misconfiguration",
    FUNCTION_NOT_LOADED = 913 =>
        "the function handle is not loaded when calling an API that requires a loaded function",
    INVALID_RESOURCE_TYPE = 914 =>
        "one or more resources passed in are not valid resource types for the operation",
    INVALID_RESOURCE_CONFIGURATION = 915 =>
        "one or more resources are insufficient or non-applicable for the operation",
    KEY_ROTATION = 916 => "an error happened during the key rotation sequence",
    ///
    /// Newer than the CUDA 13.0 driver the other descriptions were read from: this one paraphrases
    /// the documentation in `cuda.h`.
    STREAM_DETACHED = 917 =>
        "the requested operation is not permitted because the stream is in a detached state",
    ///
    /// Newer than the CUDA 13.0 driver the other descriptions were read from: this one paraphrases
    /// the documentation in `cuda.h`.
    GRAPH_RECAPTURE_FAILURE = 918 => "graph recapture failed and had to be terminated",
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
