//! Fabric handles (`ShareableAllocation<Fabric>`, `FabricHandle`) against a real driver. Where the
//! machine has no IMEX channel (the machines this crate is measured on), creation and import are
//! refused with `Error::NoImexChannel` before any allocation or import, and a raw `cuMemCreate` of
//! fabric-shareable memory shows that the driver refuses it too (`CUDA_ERROR_NOT_PERMITTED`): the
//! check refuses nothing the driver would allow. Where a channel exists, the memory is created,
//! exported as 64 bytes, sent through their wire format, imported in this process and mapped: the
//! importer reads what the exporter wrote.

#![cfg(target_os = "linux")]

mod common;

use cuda_vmm::ipc::{Fabric, FabricHandle, ShareableAllocation};
use cuda_vmm::owned::SharedReservation;
use cuda_vmm::vmm::{AllocationOptions, HandleKinds};
use cuda_vmm::{DriverError, Error, Granularity, ReadWrite, device::imex_channel};

#[path = "common/raw_vmm.rs"]
mod raw;

/// The tests of this file measure free memory; they run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `CU_MEM_HANDLE_TYPE_FABRIC`.
const FABRIC: u32 = 8;

/// A raw `cuMemCreate` of `size` bytes of fabric-shareable memory on `device`, released at once:
/// the driver's own answer.
fn raw_fabric_create(device: i32, size: usize) -> u32 {
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
    // SAFETY: `handle` is writable and `prop` a complete `CUmemAllocationProp`, both alive for the
    // call.
    let code = unsafe { raw::cuMemCreate(&raw mut handle, size, &raw const prop, 0) };
    if code == 0 {
        // SAFETY: created just above, released once.
        assert_eq!(unsafe { raw::cuMemRelease(handle) }, 0);
    }
    code
}

#[test]
fn fabric_memory_is_shared_or_refused_before_any_allocation() {
    const TEST: &str = "fabric_memory_is_shared_or_refused_before_any_allocation";
    let _serial = serial();
    let Some((device, ctx)) = common::gpu_or_skip(TEST) else {
        return;
    };
    let caps = device.capabilities().unwrap();
    let g = AllocationOptions::device(device)
        .with_handle_kinds(HandleKinds::FABRIC)
        .granularity(Granularity::Minimum)
        .unwrap();
    println!(
        "{TEST}: {device:?}: HANDLE_TYPE_FABRIC_SUPPORTED (128) {}, IMEX channel {:?}, fabric \
         granularity {g}",
        caps.fabric_handles,
        imex_channel()
    );
    // An import of a well-formed description is checked the same way before any driver call.
    let foreign = FabricHandle::from_parts([0x5a; 64], g, g).unwrap();
    let free_before = ctx.memory_info().unwrap().0;
    let created = ShareableAllocation::<Fabric>::new(device, g);
    match created {
        Err(e @ Error::Unsupported { attribute: 128, .. }) => {
            assert!(!caps.fabric_handles, "{e}");
            assert!(matches!(
                foreign.import(device),
                Err(Error::Unsupported { attribute: 128, .. })
            ));
            println!("{TEST}: no fabric handles on this device: {e}");
        }
        Err(e @ Error::NoImexChannel { .. }) => {
            assert!(caps.fabric_handles && imex_channel().is_none(), "{e}");
            assert_eq!(
                ctx.memory_info().unwrap().0,
                free_before,
                "{TEST}: refused, yet memory is gone"
            );
            let import = foreign.import(device);
            assert!(
                matches!(import, Err(Error::NoImexChannel { .. })),
                "{TEST}: {import:?}"
            );
            // The driver agrees: without a channel it refuses the memory itself.
            let raw = raw_fabric_create(device.as_raw(), g);
            println!(
                "{TEST}: refused before any allocation: {e}; the driver's own cuMemCreate: {}",
                common::code_name(raw)
            );
            assert_eq!(raw, DriverError::NOT_PERMITTED.code(), "{TEST}");
        }
        Err(e @ Error::Refused { .. }) => {
            // A channel exists, but this process may not use it.
            assert!(imex_channel().is_some(), "{e}");
            println!("{TEST}: an IMEX channel exists but the driver refuses: {e}");
        }
        Err(e) => panic!("{TEST}: {e}"),
        Ok(memory) => {
            assert!(caps.fabric_usable());
            share_in_this_process(TEST, device, memory, g);
        }
    }
    assert_eq!(ctx.memory_info().unwrap().0, free_before, "{TEST}: leaked");
}

/// Where fabric memory can be made: exported, carried as bytes, imported, both mapped; the
/// importer reads what the exporter wrote.
fn share_in_this_process(
    test: &str,
    device: cuda_vmm::Device,
    memory: ShareableAllocation<Fabric>,
    g: usize,
) {
    let handle = memory.export().unwrap();
    assert_eq!((handle.size(), handle.granularity()), (g, g));
    let wire = handle.to_bytes();
    let received = FabricHandle::from_bytes(&wire).unwrap();
    assert_eq!(received, handle);
    let import = received.import(device).unwrap();
    assert_eq!(import.size(), g);
    let reservation = SharedReservation::new(2 * g, 0).unwrap();
    let mut exporter = reservation
        .map(0, memory.into_allocation())
        .unwrap()
        .keep_grant(&[device], ReadWrite)
        .unwrap();
    let importer = reservation
        .map(g, import)
        .unwrap()
        .keep_grant(&[device], ReadWrite)
        .unwrap();
    let data = common::pattern(g / 4, 34);
    exporter
        .slice_mut::<u32>()
        .unwrap()
        .copy_from_host(&data)
        .unwrap();
    assert_eq!(
        importer.slice::<u32>().unwrap().to_vec().unwrap(),
        data,
        "{test}: the import is the exporter's memory"
    );
    println!("{test}: fabric memory exported, imported and read back");
}
