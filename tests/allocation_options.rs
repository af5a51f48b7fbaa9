//! `AllocationOptions` in the open: handle kinds and the `GPUDirect` RDMA flag, each checked before
//! `cuMemCreate` against the device attribute that allows it (fabric handles also against a probe),
//! and refused for the host locations that cannot take them.
//!
//! The GPU tests assert whatever the device says, compared with the driver's own answer to raw
//! calls, and print what they saw. The host-location refusals need no GPU: they come before any
//! driver call.

mod common;

use core::ffi::c_void;
use std::os::fd::{FromRawFd, OwnedFd};

use cuda_vmm::vmm::{AllocationOptions, HandleKinds, Location};
use cuda_vmm::{DriverError, Error, Granularity, PhysicalAllocation};

/// The tests of this file allocate and release; they run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

const POSIX_FD: u32 = 1;
const FABRIC: u32 = 8;

unsafe extern "C" {
    fn cuMemExportToShareableHandle(
        shareable: *mut c_void,
        handle: u64,
        handle_type: u32,
        flags: u64,
    ) -> u32;
    fn cuMemImportFromShareableHandle(handle: *mut u64, os_handle: *mut c_void, kind: u32) -> u32;
    fn cuMemGetAllocationPropertiesFromHandle(prop: *mut raw::Prop, handle: u64) -> u32;
}

/// The driver's description of `memory` (`cuMemGetAllocationPropertiesFromHandle`).
fn properties(memory: &PhysicalAllocation) -> raw::Prop {
    let mut prop = raw::Prop {
        type_: 0,
        handle_types: 0,
        location: raw::Location { type_: 0, id: 0 },
        win32: core::ptr::null_mut(),
        flags: 0,
    };
    // SAFETY: `prop` is a writable `CUmemAllocationProp` of integer fields; the handle is alive.
    let code = unsafe { cuMemGetAllocationPropertiesFromHandle(&raw mut prop, memory.as_raw()) };
    assert_eq!(code, 0, "properties: {}", common::code_name(code));
    prop
}

/// `cuMemExportToShareableHandle` as a POSIX file descriptor: the descriptor, or the driver's code.
fn export_fd(handle: u64) -> Result<OwnedFd, u32> {
    let mut fd: i32 = -1;
    // SAFETY: for a POSIX descriptor the driver writes one `int`; `fd` is one. The handle is alive.
    let code = unsafe {
        cuMemExportToShareableHandle((&raw mut fd).cast::<c_void>(), handle, POSIX_FD, 0)
    };
    if code != 0 {
        return Err(code);
    }
    assert!(fd >= 0, "the driver exported descriptor {fd}");
    // SAFETY: the driver has just opened `fd` for this export; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[test]
fn posix_fd_pages_are_created_and_exported() {
    const TEST: &str = "posix_fd_pages_are_created_and_exported";
    let _serial = serial();
    let Some((device, _ctx)) = common::gpu_or_skip(TEST) else {
        return;
    };
    let options = AllocationOptions::device(device).with_handle_kinds(HandleKinds::POSIX_FD);
    assert_eq!(options.handle_kinds(), HandleKinds::POSIX_FD);
    assert!(!options.rdma());
    let g = options.granularity(Granularity::Minimum).unwrap();
    let supported = device.supports_posix_fd_handles().unwrap();
    println!("{device:?}: POSIX fd handles supported: {supported}");
    match PhysicalAllocation::with_options(2 * g, options) {
        Err(Error::Unsupported { attribute, .. }) => {
            assert!(!supported, "refused although the attribute says yes");
            assert_eq!(attribute, 103);
        }
        Err(e) => panic!("POSIX fd pages: unexpected error {e}"),
        Ok(memory) => {
            assert!(supported, "created although the attribute says no");
            assert_eq!(memory.options(), options);
            assert_eq!(
                properties(&memory).handle_types,
                POSIX_FD,
                "the driver was asked for the kind"
            );
            let fd = export_fd(memory.as_raw()).unwrap_or_else(|code| {
                panic!("export of POSIX fd pages: {}", common::code_name(code))
            });
            println!("exported as descriptor {fd:?}");
            drop(fd);
            memory.release().unwrap();
        }
    }
    // Without the kind, the driver refuses the export: the option is what makes it exportable.
    let plain = PhysicalAllocation::new(device, g).unwrap();
    assert_eq!(properties(&plain).handle_types, 0);
    let refused = export_fd(plain.as_raw()).expect_err("a plain allocation was exported");
    println!(
        "export of a plain allocation: {}",
        common::code_name(refused)
    );
}

#[test]
fn rdma_flag_is_accepted_where_the_attribute_allows_it() {
    const TEST: &str = "rdma_flag_is_accepted_where_the_attribute_allows_it";
    let _serial = serial();
    let Some((device, _ctx)) = common::gpu_or_skip(TEST) else {
        return;
    };
    let options = AllocationOptions::device(device).with_rdma(true);
    assert!(options.rdma());
    assert!(!options.with_rdma(false).rdma());
    let g = options.granularity(Granularity::Minimum).unwrap();
    let supported = device.supports_gpu_direct_rdma_with_vmm().unwrap();
    println!("{device:?}: GPUDirect RDMA with VMM supported: {supported}");
    match PhysicalAllocation::with_options(g, options) {
        Err(Error::Unsupported { attribute, .. }) => {
            assert!(!supported, "refused although the attribute says yes");
            assert_eq!(attribute, 110);
        }
        Err(e) => panic!("RDMA-capable memory: unexpected error {e}"),
        Ok(memory) => {
            assert!(supported, "created although the attribute says no");
            assert!(memory.options().rdma());
            // `allocFlags.gpuDirectRDMACapable` is byte 1 of the 8-byte `allocFlags`.
            let flags = properties(&memory).flags.to_ne_bytes();
            println!("allocFlags as the driver reports them: {flags:?}");
            assert_eq!(flags[1], 1, "the driver reports the memory RDMA capable");
            memory.release().unwrap();
        }
    }
    let plain = PhysicalAllocation::new(device, g).unwrap();
    assert_eq!(properties(&plain).flags.to_ne_bytes()[1], 0);
}

/// The probe the crate makes, made here with raw calls: one allocation of the fabric handle type,
/// exported and imported again; the first refusal, if any.
fn raw_fabric_probe(device: i32, size: usize) -> Result<(), u32> {
    let prop = raw::Prop {
        type_: 1,
        handle_types: FABRIC,
        location: raw::Location {
            type_: 1,
            id: device,
        },
        win32: core::ptr::null_mut(),
        flags: 0,
    };
    let mut handle = 0u64;
    // SAFETY: `handle` is writable and `prop` a complete `CUmemAllocationProp`, both alive for the call.
    let code = unsafe { raw::cuMemCreate(&raw mut handle, size, &raw const prop, 0) };
    if code != 0 {
        return Err(code);
    }
    let mut shared = [0u8; 64];
    // SAFETY: the driver writes a 64-byte `CUmemFabricHandle` into `shared`; the handle is alive.
    let mut result = match unsafe {
        cuMemExportToShareableHandle(shared.as_mut_ptr().cast(), handle, FABRIC, 0)
    } {
        0 => Ok(()),
        code => Err(code),
    };
    if result.is_ok() {
        let mut imported = 0u64;
        // SAFETY: the driver reads the fabric handle `shared` holds; `imported` is writable.
        let code = unsafe {
            cuMemImportFromShareableHandle(&raw mut imported, shared.as_mut_ptr().cast(), FABRIC)
        };
        if code == 0 {
            // SAFETY: the import's own reference, released once.
            assert_eq!(unsafe { raw::cuMemRelease(imported) }, 0);
        } else {
            result = Err(code);
        }
    }
    // SAFETY: created above, released once.
    assert_eq!(unsafe { raw::cuMemRelease(handle) }, 0);
    result
}

#[test]
fn fabric_pages_follow_the_attribute_and_the_probe() {
    const TEST: &str = "fabric_pages_follow_the_attribute_and_the_probe";
    let _serial = serial();
    let Some((device, ctx)) = common::gpu_or_skip(TEST) else {
        return;
    };
    let options = AllocationOptions::device(device).with_handle_kinds(HandleKinds::FABRIC);
    let g = options.granularity(Granularity::Minimum).unwrap();
    let supported = device.supports_fabric_handles().unwrap();
    // Probed only where the attribute says yes, as the crate does.
    let probe = supported.then(|| raw_fabric_probe(device.as_raw(), g));
    println!(
        "{device:?}: fabric attribute {supported}, raw probe: {}",
        probe.map_or_else(
            || "not made".to_owned(),
            |p| p.map_or_else(common::code_name, |()| "passed".to_owned())
        )
    );
    let (free_before, _) = ctx.memory_info().unwrap();
    // Twice: the second answer comes from the cache and must be the same.
    for round in 0..2 {
        match PhysicalAllocation::with_options(g, options) {
            Err(Error::Unsupported { attribute, .. }) => {
                assert!(!supported, "refused although the attribute says yes");
                assert_eq!(attribute, 128);
            }
            // Refused before the probe: the machine has no IMEX channel. The driver must agree
            // (the raw probe's `cuMemCreate` refused with NOT_PERMITTED), or the check refuses
            // what the driver would allow.
            Err(e @ Error::NoImexChannel { .. }) => {
                assert!(supported);
                assert_eq!(cuda_vmm::device::imex_channel(), None);
                assert_eq!(
                    probe,
                    Some(Err(DriverError::NOT_PERMITTED.code())),
                    "no IMEX channel found, but the driver's answer is another: {e}"
                );
                println!("round {round}: fabric pages refused before any allocation: {e}");
            }
            Err(e @ Error::Refused { error, .. }) => {
                assert!(supported);
                assert!(cuda_vmm::device::imex_channel().is_some());
                assert_eq!(
                    probe,
                    Some(Err(error.code())),
                    "the crate's probe and the raw probe disagree: {e}"
                );
                if error == DriverError::NOT_PERMITTED {
                    assert!(e.to_string().contains("IMEX channel"), "{e}");
                }
                println!("round {round}: fabric pages refused: {e}");
            }
            Err(e) => panic!("fabric pages: unexpected error {e}"),
            Ok(memory) => {
                assert_eq!(probe, Some(Ok(())), "created although the probe failed");
                assert_eq!(properties(&memory).handle_types, FABRIC);
                println!("round {round}: fabric pages created: the probe passed");
                memory.release().unwrap();
            }
        }
    }
    let (free_after, _) = ctx.memory_info().unwrap();
    assert_eq!(free_after, free_before, "the probe or the pages leaked");
}

/// Refused before any driver call, so this runs without a GPU too.
#[test]
fn host_locations_refuse_what_they_cannot_take() {
    let size = 2 << 20;
    let cases = [
        (
            AllocationOptions::host().with_handle_kinds(HandleKinds::POSIX_FD),
            "a shareable handle kind",
        ),
        (
            AllocationOptions::host().with_handle_kinds(HandleKinds::FABRIC),
            "a shareable handle kind",
        ),
        (
            AllocationOptions::host().with_rdma(true),
            "the GPUDirect RDMA flag",
        ),
        (
            AllocationOptions::host_numa(0).with_handle_kinds(HandleKinds::FABRIC),
            "a fabric handle",
        ),
        (
            AllocationOptions::host_numa(0)
                .with_handle_kinds(HandleKinds::POSIX_FD | HandleKinds::FABRIC),
            "a fabric handle",
        ),
        (
            AllocationOptions::host_numa(0).with_rdma(true),
            "the GPUDirect RDMA flag",
        ),
    ];
    for (options, expected) in cases {
        match PhysicalAllocation::with_options(size, options) {
            Err(e @ Error::NotForLocation { what, .. }) => {
                assert_eq!(what, expected, "{options:?}");
                assert!(e.driver().is_none());
                println!("{options:?}: {e}");
            }
            other => panic!("{options:?}: {other:?}"),
        }
    }
}

/// What the host-location refusals rest on, recorded with raw calls: `cuMemCreate` refuses a handle
/// type for `CU_MEM_LOCATION_TYPE_HOST`; its answer for a POSIX descriptor on `HOST_NUMA`, which the
/// crate passes on, is compared with the crate's.
#[test]
fn host_handle_types_driver_facts() {
    const TEST: &str = "host_handle_types_driver_facts";
    let _serial = serial();
    let Some((device, _ctx)) = common::gpu_or_skip(TEST) else {
        return;
    };
    if device.supports_host_memory().unwrap() {
        let g = AllocationOptions::host()
            .granularity(Granularity::Minimum)
            .unwrap();
        let prop = raw::Prop {
            type_: 1,
            handle_types: POSIX_FD,
            location: raw::Location { type_: 2, id: 0 },
            win32: core::ptr::null_mut(),
            flags: 0,
        };
        let mut handle = 0u64;
        // SAFETY: `handle` is writable and `prop` a complete `CUmemAllocationProp`.
        let code = unsafe { raw::cuMemCreate(&raw mut handle, g, &raw const prop, 0) };
        println!("cuMemCreate(HOST, POSIX fd): {}", common::code_name(code));
        if code == 0 {
            // SAFETY: just created, released once.
            assert_eq!(unsafe { raw::cuMemRelease(handle) }, 0);
            panic!("the driver now makes Location::Host shareable: the crate could offer it");
        }
    } else {
        common::skip(&format!(
            "SKIPPED {TEST} (Location::Host part): {device:?} does not support it"
        ));
    }
    if device.supports_host_numa_memory().unwrap() {
        let node = device.host_numa_node().unwrap().unwrap_or(0);
        let options = AllocationOptions::host_numa(node).with_handle_kinds(HandleKinds::POSIX_FD);
        let g = options.granularity(Granularity::Minimum).unwrap();
        match PhysicalAllocation::with_options(g, options) {
            Ok(memory) => {
                assert_eq!(memory.location(), Location::HostNuma(node));
                let exported = export_fd(memory.as_raw());
                println!(
                    "host NUMA memory with a POSIX fd: created; export: {}",
                    exported
                        .as_ref()
                        .map_or_else(|&code| common::code_name(code), |fd| format!("{fd:?}"))
                );
                memory.release().unwrap();
            }
            Err(e) => {
                let driver = e
                    .driver()
                    .unwrap_or_else(|| panic!("refused by the crate, not the driver: {e}"));
                println!("host NUMA memory with a POSIX fd: the driver refuses: {driver}");
            }
        }
    } else {
        common::skip(&format!(
            "SKIPPED {TEST} (Location::HostNuma part): {device:?} does not support it"
        ));
    }
}

/// The driver's own symbols with integer results, for what the safe API does not (or must not) offer.
#[path = "common/raw_vmm.rs"]
mod raw;
