//! NCCL's functions, loaded at run time with integer results: the one place that names a raw NCCL
//! symbol.
//!
//! cudarc's `nccl::sys` declares `ncclResult_t` as a Rust enum: a value outside it (a newer NCCL's
//! code) would be undefined behaviour the moment it is returned, so this crate declares the few
//! functions it calls itself, with `c_int` results and `c_int` for the enum arguments it passes
//! (`ncclDataType_t`, `ncclRedOp_t`: C enums, int-sized on every Linux ABI). The library is opened
//! once per process, under its runtime name first (`libnccl.so.2`, what NCCL's runtime packages and
//! wheels install; cudarc's loader does not look for it) and then `libnccl.so`; every symbol is
//! looked up then, and a missing one is an [`Error::NcclUnavailable`] naming the function when it is
//! called, never a panic.

use core::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

use crate::error::Error;

/// `ncclComm_t`.
pub(crate) type RawComm = *mut c_void;
/// `ncclWindow_t`.
pub(crate) type RawWindow = *mut c_void;
/// `cudaStream_t`, the same handle as a driver `CUstream`.
pub(crate) type RawStream = *mut c_void;

/// `ncclUniqueId`: 128 opaque bytes, passed by value to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct RawId {
    pub(crate) internal: [c_char; ID_BYTES],
}

/// `NCCL_UNIQUE_ID_BYTES`.
pub(crate) const ID_BYTES: usize = 128;

static_assertions::assert_eq_size!(RawId, [u8; ID_BYTES]);
static_assertions::assert_eq_align!(RawId, u8);

/// `ncclInProgress`: what `ncclCommGetAsyncError` reports while a non-blocking operation of the
/// communicator is under way; not an error.
pub(crate) const IN_PROGRESS: c_int = 7;

/// `NCCL_CONFIG_UNDEF_INT` (`INT_MIN`): a config field left to NCCL's default.
pub(crate) const CONFIG_UNDEF_INT: c_int = c_int::MIN;

/// `NCCL_API_MAGIC`, which `NCCL_CONFIG_INITIALIZER` puts in `magic`.
pub(crate) const CONFIG_MAGIC: u32 = 0xcafe_beef;

/// `NCCL_VERSION(2, 14, 0)`: the release whose `ncclConfig_t` [`RawConfig`] mirrors.
pub(crate) const CONFIG_VERSION: u32 = 21_400;

/// `ncclConfig_t` as NCCL 2.14 declared it (`ncclConfig_v21400`: `size`, `magic`, `version`,
/// `blocking`), the first release with `ncclCommInitRankConfig`, and a prefix of every later
/// release's config, which grows at its end with each release (2.28 has 23 fields after
/// `blocking`).
///
/// Why a newer NCCL accepts it: `ncclCommInitRankConfig` starts from a config filled by its own
/// `NCCL_CONFIG_INITIALIZER` (every field undefined), copies only the caller's first `size` bytes
/// over it, refuses a `magic` other than `0xcafebeef`, and resets to its defaults every field that
/// the caller's `version` predates (below 2.17: `cgaClusterSize`, `minCTAs`, `maxCTAs`, `netName`;
/// read in `parseCommConfig` of NCCL 2.28's `init.cc`). So with `size` 24 and `version` 21400,
/// NCCL 2.28 reads `blocking` from offset 16 and takes its defaults for everything else. The C
/// struct's 4 bytes of tail padding (offset 20, `cgaClusterSize` in later layouts) are the field
/// `undefined`, set to `NCCL_CONFIG_UNDEF_INT` so that even a copy that kept them would read "not
/// set".
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawConfig {
    pub(crate) size: usize,
    pub(crate) magic: u32,
    pub(crate) version: u32,
    pub(crate) blocking: c_int,
    pub(crate) undefined: c_int,
}

impl RawConfig {
    /// `NCCL_CONFIG_INITIALIZER` of NCCL 2.14 with `blocking` set (1 blocking, 0 non-blocking).
    pub(crate) const fn new(blocking: bool) -> RawConfig {
        RawConfig {
            size: size_of::<RawConfig>(),
            magic: CONFIG_MAGIC,
            version: CONFIG_VERSION,
            blocking: if blocking { 1 } else { 0 },
            undefined: CONFIG_UNDEF_INT,
        }
    }
}

static_assertions::assert_eq_size!(RawConfig, [u64; 3]);
static_assertions::assert_eq_align!(RawConfig, u64);
static_assertions::const_assert_eq!(core::mem::offset_of!(RawConfig, magic), 8);
static_assertions::const_assert_eq!(core::mem::offset_of!(RawConfig, version), 12);
static_assertions::const_assert_eq!(core::mem::offset_of!(RawConfig, blocking), 16);
static_assertions::const_assert_eq!(core::mem::offset_of!(RawConfig, undefined), 20);

/// `NCCL_WIN_COLL_SYMMETRIC`: a window that symmetric collective kernels may use.
pub(crate) const WIN_COLL_SYMMETRIC: c_int = 0x01;

/// `NCCL_SUSPEND_MEM` (NCCL 2.29.7): `ncclCommSuspend` releases the communicator's suspendable
/// device memory.
pub(crate) const SUSPEND_MEM: c_int = 0x01;

type GetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
type GetUniqueId = unsafe extern "C" fn(*mut RawId) -> c_int;
type CommInitRank = unsafe extern "C" fn(*mut RawComm, c_int, RawId, c_int) -> c_int;
pub(crate) type CommInitRankConfig =
    unsafe extern "C" fn(*mut RawComm, c_int, RawId, c_int, *mut RawConfig) -> c_int;
type CommFinalize = unsafe extern "C" fn(RawComm) -> c_int;
type CommInitAll = unsafe extern "C" fn(*mut RawComm, c_int, *const c_int) -> c_int;
type CommDestroy = unsafe extern "C" fn(RawComm) -> c_int;
type CommAbort = unsafe extern "C" fn(RawComm) -> c_int;
type CommGetAsyncError = unsafe extern "C" fn(RawComm, *mut c_int) -> c_int;
type AllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    RawStream,
) -> c_int;
type Broadcast = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    RawStream,
) -> c_int;
type AllGather =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, RawComm, RawStream) -> c_int;
type ReduceScatter = AllReduce;
type SendFn = unsafe extern "C" fn(*const c_void, usize, c_int, c_int, RawComm, RawStream) -> c_int;
type RecvFn = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, RawComm, RawStream) -> c_int;
type CommSuspend = unsafe extern "C" fn(RawComm, c_int) -> c_int;
type CommResume = unsafe extern "C" fn(RawComm) -> c_int;
type Group = unsafe extern "C" fn() -> c_int;
type CommRegister = unsafe extern "C" fn(RawComm, *mut c_void, usize, *mut *mut c_void) -> c_int;
type CommDeregister = unsafe extern "C" fn(RawComm, *mut c_void) -> c_int;
type WindowRegister =
    unsafe extern "C" fn(RawComm, *mut c_void, usize, *mut RawWindow, c_int) -> c_int;
type WindowDeregister = unsafe extern "C" fn(RawComm, RawWindow) -> c_int;

/// The loaded library and its functions; `None` for a function the library lacks.
pub(crate) struct Api {
    /// Kept open for the process: the function pointers below point into it.
    _library: libloading::Library,
    pub(crate) version: c_int,
    pub(crate) get_unique_id: Option<GetUniqueId>,
    pub(crate) comm_init_rank: Option<CommInitRank>,
    pub(crate) comm_init_rank_config: Option<CommInitRankConfig>,
    pub(crate) comm_init_all: Option<CommInitAll>,
    pub(crate) comm_finalize: Option<CommFinalize>,
    pub(crate) comm_destroy: Option<CommDestroy>,
    pub(crate) comm_abort: Option<CommAbort>,
    pub(crate) comm_get_async_error: Option<CommGetAsyncError>,
    pub(crate) all_reduce: Option<AllReduce>,
    pub(crate) broadcast: Option<Broadcast>,
    pub(crate) all_gather: Option<AllGather>,
    pub(crate) reduce_scatter: Option<ReduceScatter>,
    pub(crate) send: Option<SendFn>,
    pub(crate) recv: Option<RecvFn>,
    /// NCCL 2.29.7 and later.
    pub(crate) comm_suspend: Option<CommSuspend>,
    /// NCCL 2.29.7 and later.
    pub(crate) comm_resume: Option<CommResume>,
    pub(crate) group_start: Option<Group>,
    pub(crate) group_end: Option<Group>,
    pub(crate) comm_register: Option<CommRegister>,
    pub(crate) comm_deregister: Option<CommDeregister>,
    pub(crate) window_register: Option<WindowRegister>,
    pub(crate) window_deregister: Option<WindowDeregister>,
}

/// The names tried, in order.
const LIBRARY_NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

static API: OnceLock<Result<Api, &'static str>> = OnceLock::new();

/// The process's NCCL, opened on first use.
///
/// # Errors
/// [`Error::NcclUnavailable`] (for `call`) where no library can be opened, or it has no
/// `ncclGetVersion`.
pub(crate) fn api(call: &'static str) -> Result<&'static Api, Error> {
    API.get_or_init(open)
        .as_ref()
        .map_err(|&why| Error::NcclUnavailable { call, why })
}

/// A function of `api`, or the error that names it.
pub(crate) fn function<F: Copy>(f: Option<F>, call: &'static str) -> Result<F, Error> {
    f.ok_or(Error::NcclUnavailable {
        call,
        why: "the loaded NCCL library has no such function (it is older than the NCCL release \
              that added it: windows need NCCL 2.27, local registration 2.19, non-blocking communicators \
              2.14)",
    })
}

/// `Ok` for `ncclSuccess`, the crate's error naming `call` otherwise.
pub(crate) fn check(code: c_int, call: &'static str) -> Result<(), Error> {
    if code == 0 {
        Ok(())
    } else {
        Err(Error::Nccl { call, code })
    }
}

fn open() -> Result<Api, &'static str> {
    let library = LIBRARY_NAMES
        .iter()
        // SAFETY: opening NCCL runs its library constructors, which only set up its own state (no
        // callbacks into this process); the library is kept open for the rest of the process.
        .find_map(|name| unsafe { libloading::Library::new(*name) }.ok())
        .ok_or(
            "libnccl.so.2 (or libnccl.so) cannot be loaded: install NCCL (the libnccl2 package, or \
             a PyTorch or nvidia-nccl wheel) and put its directory on LD_LIBRARY_PATH",
        )?;
    let get_version: GetVersion = symbol(&library, b"ncclGetVersion\0")
        .ok_or("the library found as libnccl.so.2 has no ncclGetVersion: it is not NCCL")?;
    let mut version: c_int = 0;
    // SAFETY: `version` is writable for the call.
    if unsafe { get_version(&raw mut version) } != 0 {
        return Err("ncclGetVersion failed: the library is not a usable NCCL");
    }
    Ok(Api {
        version,
        get_unique_id: symbol(&library, b"ncclGetUniqueId\0"),
        comm_init_rank: symbol(&library, b"ncclCommInitRank\0"),
        comm_init_rank_config: symbol(&library, b"ncclCommInitRankConfig\0"),
        comm_init_all: symbol(&library, b"ncclCommInitAll\0"),
        comm_finalize: symbol(&library, b"ncclCommFinalize\0"),
        comm_destroy: symbol(&library, b"ncclCommDestroy\0"),
        comm_abort: symbol(&library, b"ncclCommAbort\0"),
        comm_get_async_error: symbol(&library, b"ncclCommGetAsyncError\0"),
        all_reduce: symbol(&library, b"ncclAllReduce\0"),
        broadcast: symbol(&library, b"ncclBroadcast\0"),
        all_gather: symbol(&library, b"ncclAllGather\0"),
        reduce_scatter: symbol(&library, b"ncclReduceScatter\0"),
        send: symbol(&library, b"ncclSend\0"),
        recv: symbol(&library, b"ncclRecv\0"),
        comm_suspend: symbol(&library, b"ncclCommSuspend\0"),
        comm_resume: symbol(&library, b"ncclCommResume\0"),
        group_start: symbol(&library, b"ncclGroupStart\0"),
        group_end: symbol(&library, b"ncclGroupEnd\0"),
        comm_register: symbol(&library, b"ncclCommRegister\0"),
        comm_deregister: symbol(&library, b"ncclCommDeregister\0"),
        window_register: symbol(&library, b"ncclCommWindowRegister\0"),
        window_deregister: symbol(&library, b"ncclCommWindowDeregister\0"),
        _library: library,
    })
}

/// The function `name` (NUL-terminated) with the type `F` this module declares for it.
fn symbol<F: Copy>(library: &libloading::Library, name: &[u8]) -> Option<F> {
    // SAFETY: every `F` this module asks for is the C signature of `name` in `nccl.h` (NCCL
    // 2.19 to 2.29; `ncclCommSuspend` and `ncclCommResume` are 2.29.7's), with `c_int` for
    // `ncclResult_t` and the int-sized enums, and `RawConfig` for `ncclConfig_t *` (a prefix NCCL
    // reads by its `size` and `version`, see `RawConfig`); the pointer is copied out of the
    // `Symbol` and used only while the library stays open (for the process).
    unsafe { library.get::<F>(name).ok().map(|s| *s) }
}
