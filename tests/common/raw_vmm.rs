//! The VMM entry points of the driver and the structs they take, declared with integer results and
//! integer fields (no driver value lands in a Rust enum), for tests and the bench that make the raw
//! calls the safe API makes. Included with `#[path]` where needed.

#![allow(dead_code, unreachable_pub)]

use core::ffi::c_void;

#[repr(C)]
pub(crate) struct Location {
    pub(crate) type_: u32,
    pub(crate) id: i32,
}
#[repr(C)]
pub(crate) struct Prop {
    pub(crate) type_: u32,
    pub(crate) handle_types: u32,
    pub(crate) location: Location,
    pub(crate) win32: *mut c_void,
    pub(crate) flags: u64,
}
#[repr(C)]
pub(crate) struct AccessDesc {
    pub(crate) location: Location,
    pub(crate) flags: u32,
}
unsafe extern "C" {
    pub(crate) fn cuMemCreate(handle: *mut u64, size: usize, prop: *const Prop, flags: u64) -> u32;
    pub(crate) fn cuMemRelease(handle: u64) -> u32;
    pub(crate) fn cuMemAddressReserve(
        ptr: *mut u64,
        size: usize,
        align: usize,
        addr: u64,
        flags: u64,
    ) -> u32;
    pub(crate) fn cuMemAddressFree(ptr: u64, size: usize) -> u32;
    pub(crate) fn cuMemMap(ptr: u64, size: usize, offset: usize, handle: u64, flags: u64) -> u32;
    pub(crate) fn cuMemUnmap(ptr: u64, size: usize) -> u32;
    pub(crate) fn cuMemSetAccess(
        ptr: u64,
        size: usize,
        desc: *const AccessDesc,
        count: usize,
    ) -> u32;
}
