//! The raw driver handles, in this crate's own terms: what the `as_raw`-style escape hatches return
//! (`Context::as_raw`, `Stream::as_raw`, `DeviceSlice::as_raw_ptr`, ...), for calling the driver, or
//! another library, where this crate has no safe call.
//!
//! These are the C API's types under their C names, defined here rather than taken from a bindings
//! crate, so that a program need not depend on one, and a new version of one does not change this
//! crate's API. The pointer types point at opaque structs of this module; cast them (`.cast()`) to
//! another binding's handle type, which is the same pointer to the driver.
//!
//! A handle returned by an escape hatch is owned by the value that returned it: it stays valid while
//! that value lives, and must not be destroyed, released or freed through the raw API.

#![allow(non_camel_case_types)]

use core::ffi::{c_int, c_ulonglong};

/// A device ordinal (`CUdevice`).
pub type CUdevice = c_int;
/// A device address (`CUdeviceptr`): an integer, never dereferenced on the host.
pub type CUdeviceptr = c_ulonglong;
/// A physical allocation (`CUmemGenericAllocationHandle`).
pub type CUmemGenericAllocationHandle = c_ulonglong;

macro_rules! opaque_handles {
    ($($(#[$doc:meta])* $alias:ident => $opaque:ident),* $(,)?) => {$(
        #[doc = concat!("The opaque driver object a [`", stringify!($alias), "`] points at.")]
        #[repr(C)]
        #[derive(Debug)]
        pub struct $opaque {
            _private: [u8; 0],
        }
        $(#[$doc])*
        pub type $alias = *mut $opaque;
    )*};
}

opaque_handles! {
    /// A context (`CUcontext`); this crate's are devices' primary contexts.
    CUcontext => CUctx_st,
    /// A stream (`CUstream`); null is the context's legacy default stream.
    CUstream => CUstream_st,
    /// An event (`CUevent`).
    CUevent => CUevent_st,
    /// A loaded module (`CUmodule`).
    CUmodule => CUmod_st,
    /// A kernel of a loaded module (`CUfunction`).
    CUfunction => CUfunc_st,
    /// A graph (`CUgraph`).
    CUgraph => CUgraph_st,
    /// An instantiated, launchable graph (`CUgraphExec`).
    CUgraphExec => CUgraphExec_st,
    /// A node of a graph (`CUgraphNode`).
    CUgraphNode => CUgraphNode_st,
}
