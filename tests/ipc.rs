//! Memory shared between two real processes: this test binary re-executes itself as the child
//! (`current_exe()` with `<test name> --exact --nocapture`, the role in `CUDA_VMM_IPC_CHILD`), so it
//! works from the bundled test binary on a machine without cargo. The child's standard input is its
//! end of a Unix socket pair; the exported allocation travels over it (`SCM_RIGHTS`), and so do the
//! one-byte steps of each scenario.
//!
//! Every scenario ends by checking that the parent's device free memory is back to the byte once both
//! processes have released everything (the child's context and its imports go when it exits; the
//! driver may take a moment after the exit, so the check waits up to ten seconds). The tests of this
//! file measure free memory and so run one at a time.

#![cfg(target_os = "linux")]

mod common;

use common::processes::{
    self, expect_byte, receive_byte, send_byte, settled_free, shareable_gpu_or_skip, wait_success,
};

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

use cuda_vmm::{
    Device, DriverError, Error, Granularity, ReadWrite, VirtualReservation, allocation_granularity,
    ipc::ExportInfo, ipc::ExportedAllocation, ipc::Fabric, ipc::PosixFd, ipc::ShareableAllocation,
};

const CHILD: &str = "CUDA_VMM_IPC_CHILD";

/// The tests of this file measure free memory; they must not run at the same time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The child's role, where this process is the child of `test`.
/// Starts this test binary again as the child of `test` in `role`, with `socket` as its standard
/// input.
fn spawn_child(test: &str, role: &str, socket: UnixStream) -> std::process::Child {
    processes::spawn_child(CHILD, test, role, socket)
}

fn child_role() -> Option<String> {
    std::env::var(CHILD).ok()
}

/// Driver bookkeeping that the first shareable allocation sets up and keeps for the process, made
/// before the free memory is measured.
fn warm_up(device: Device, g: usize) {
    let memory = ShareableAllocation::<PosixFd>::new(device, g).unwrap();
    drop(memory.export().unwrap());
    memory.release().unwrap();
}

fn pattern(bytes: usize, seed: u32) -> Vec<u32> {
    common::pattern(bytes / 4, seed)
}

// ---------------------------------------------------------------------------------------------------

/// The re-execution itself, without a GPU: the child (this binary, run with `--exact`) receives a
/// descriptor (a pipe's end standing in for an exported allocation) over its standard input and
/// writes through it.
#[test]
fn child_receives_a_descriptor_over_its_standard_input() {
    const TEST: &str = "child_receives_a_descriptor_over_its_standard_input";
    if child_role().is_some() {
        let received = ExportedAllocation::receive(std::io::stdin()).unwrap();
        assert_eq!(received.info(), ExportInfo::new(4096, 0, 4096).unwrap());
        let (fd, _) = received.into_parts();
        std::io::Write::write_all(&mut std::fs::File::from(fd), b"child").unwrap();
        return;
    }
    let _serial = serial();
    let (read, write) = std::io::pipe().unwrap();
    let (socket, child_end) = UnixStream::pair().unwrap();
    let child = spawn_child(TEST, "pipe", child_end);
    let info = ExportInfo::new(4096, 0, 4096).unwrap();
    ExportedAllocation::from_parts(write.into(), info)
        .send(&socket)
        .unwrap();
    wait_success(child, TEST);
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::fs::File::from(OwnedFd::from(read)), &mut text)
        .unwrap();
    assert_eq!(text, "child");
}

#[test]
fn child_imports_writes_and_parent_reads() {
    const TEST: &str = "child_imports_writes_and_parent_reads";
    if child_role().is_some() {
        return child_writes();
    }
    let _serial = serial();
    let Some((device, ctx)) = shareable_gpu_or_skip(TEST) else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    warm_up(device, g);
    let (free_before, _) = ctx.memory_info().unwrap();
    {
        let memory = ShareableAllocation::<PosixFd>::new(device, g).unwrap();
        let mut reservation = VirtualReservation::new(g, 0).unwrap();
        let mut region = reservation.region();
        let mut mapping = region.map(&memory).unwrap();
        let mut access = mapping.grant(&ctx, ReadWrite).unwrap();
        access
            .slice_mut::<u32>()
            .unwrap()
            .copy_from_host(&pattern(g, 1))
            .unwrap();

        let (socket, child_end) = UnixStream::pair().unwrap();
        let child = spawn_child(TEST, "write", child_end);
        let exported = memory.export().unwrap();
        assert_eq!(exported.info().size(), g);
        assert_eq!(exported.info().device_ordinal(), device.ordinal());
        exported.send(&socket).unwrap();
        drop(exported); // the child has its own descriptor
        expect_byte(&socket, b'D');
        wait_success(child, TEST);
        assert_eq!(
            access.slice::<u32>().unwrap().to_vec().unwrap(),
            pattern(g, 2),
            "the parent reads the child's bytes"
        );
    }
    assert_eq!(settled_free(&ctx, free_before), free_before, "leak");
}

/// The child: import, map, grant, read the parent's bytes, write its own, say so.
fn child_writes() {
    let (_, ctx) = common::gpu_or_skip("child").expect("the child sees the parent's GPU");
    let socket = std::io::stdin();
    let exported = ExportedAllocation::receive(&socket).unwrap();
    let memory = exported.import().unwrap();
    drop(exported);
    let size = memory.size();
    let mut reservation = VirtualReservation::new(size, 0).unwrap();
    let mut region = reservation.region();
    let mut mapping = region.map(&memory).unwrap();
    let mut access = mapping.grant(&ctx, ReadWrite).unwrap();
    assert_eq!(
        access.slice::<u32>().unwrap().to_vec().unwrap(),
        pattern(size, 1),
        "the child reads the parent's bytes"
    );
    access
        .slice_mut::<u32>()
        .unwrap()
        .copy_from_host(&pattern(size, 2))
        .unwrap();
    send_byte(&socket, b'D');
}

// ---------------------------------------------------------------------------------------------------

#[test]
fn child_killed_halfway_leaves_parent_memory_intact() {
    const TEST: &str = "child_killed_halfway_leaves_parent_memory_intact";
    if child_role().is_some() {
        return child_writes_half_then_hangs();
    }
    let _serial = serial();
    let Some((device, ctx)) = shareable_gpu_or_skip(TEST) else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    warm_up(device, g);
    let (free_before, _) = ctx.memory_info().unwrap();
    {
        let memory = ShareableAllocation::<PosixFd>::new(device, 2 * g).unwrap();
        let mut reservation = VirtualReservation::new(2 * g, 0).unwrap();
        let mut region = reservation.region();
        let mut mapping = region.map(&memory).unwrap();
        let mut access = mapping.grant(&ctx, ReadWrite).unwrap();
        access
            .slice_mut::<u32>()
            .unwrap()
            .copy_from_host(&pattern(2 * g, 1))
            .unwrap();

        let (socket, child_end) = UnixStream::pair().unwrap();
        let mut child = spawn_child(TEST, "half", child_end);
        memory.export().unwrap().send(&socket).unwrap();
        // The child has imported, mapped and written the first half, and now waits forever, its
        // mapping live.
        expect_byte(&socket, b'H');
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert!(!status.success(), "the child was killed: {status}");

        let mut expected = pattern(g, 3);
        expected.extend_from_slice(&pattern(2 * g, 1)[g / 4..]);
        assert_eq!(
            access.slice::<u32>().unwrap().to_vec().unwrap(),
            expected,
            "the child's finished writes, and the parent's bytes elsewhere"
        );
        // The parent's memory still works.
        let mut view = access.slice_mut::<u32>().unwrap();
        view.copy_from_host(&pattern(2 * g, 4)).unwrap();
        assert_eq!(view.as_slice().to_vec().unwrap(), pattern(2 * g, 4));
    }
    assert_eq!(settled_free(&ctx, free_before), free_before, "leak");
}

fn child_writes_half_then_hangs() {
    let (_, ctx) = common::gpu_or_skip("child").expect("the child sees the parent's GPU");
    let socket = std::io::stdin();
    let memory = ExportedAllocation::receive(&socket)
        .unwrap()
        .import()
        .unwrap();
    let size = memory.size();
    let mut reservation = VirtualReservation::new(size, 0).unwrap();
    let mut region = reservation.region();
    let mut mapping = region.map(&memory).unwrap();
    let mut access = mapping.grant(&ctx, ReadWrite).unwrap();
    let mut view = access.slice_mut::<u32>().unwrap();
    view.slice_mut(..size / 8)
        .unwrap()
        .copy_from_host(&pattern(size / 2, 3))
        .unwrap();
    send_byte(&socket, b'H');
    // Never answered: the parent kills this process here.
    let _ = receive_byte(&socket);
    panic!("the child should have been killed");
}

// ---------------------------------------------------------------------------------------------------

/// The six orders of the three ends: `F` the importer closes its descriptor, `E` the exporter unmaps
/// and releases, `I` the importer unmaps and releases. The exporter's descriptor is closed right after
/// sending in each. Whoever still has a mapping checks after every step that it reads the parent's
/// bytes (no mapping dangles); after all three, free memory is back to the byte.
#[test]
fn every_order_of_close_and_release() {
    const TEST: &str = "every_order_of_close_and_release";
    if let Some(role) = child_role() {
        return child_in_order(&role);
    }
    let _serial = serial();
    let Some((device, ctx)) = shareable_gpu_or_skip(TEST) else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    warm_up(device, g);
    for order in ["FEI", "FIE", "EFI", "EIF", "IFE", "IEF"] {
        let (free_before, _) = ctx.memory_info().unwrap();
        let (socket, child_end) = UnixStream::pair().unwrap();
        let child = spawn_child(TEST, order, child_end);
        let split = order.find('E').unwrap();
        let (before, after) = (&order[..split], &order[split + 1..]);
        {
            let memory = ShareableAllocation::<PosixFd>::new(device, g).unwrap();
            let mut reservation = VirtualReservation::new(g, 0).unwrap();
            let mut region = reservation.region();
            let mut mapping = region.map(&memory).unwrap();
            let mut access = mapping.grant(&ctx, ReadWrite).unwrap();
            access
                .slice_mut::<u32>()
                .unwrap()
                .copy_from_host(&pattern(g, 7))
                .unwrap();
            memory.export().unwrap().send(&socket).unwrap();
            expect_byte(&socket, b'M'); // the child has mapped and read the memory
            for step in before.bytes() {
                send_byte(&socket, step);
                expect_byte(&socket, b'K');
                assert_eq!(
                    access.slice::<u32>().unwrap().to_vec().unwrap(),
                    pattern(g, 7),
                    "{order}: the exporter's mapping after {}",
                    step as char
                );
            }
            // E: the exporter's end, in the only order that compiles (the grant's borrow ends at its
            // last use above).
            mapping.unmap().unwrap();
            reservation.free().unwrap();
            memory.release().unwrap();
        }
        send_byte(&socket, b'E');
        expect_byte(&socket, b'K');
        for step in after.bytes() {
            send_byte(&socket, step);
            expect_byte(&socket, b'K');
        }
        send_byte(&socket, b'Q');
        wait_success(child, TEST);
        assert_eq!(
            settled_free(&ctx, free_before),
            free_before,
            "{order}: leak"
        );
    }
}

/// The importer's side of one order: takes each step as the parent announces it, and checks its own
/// mapping after each while it has one.
fn child_in_order(order: &str) {
    let (_, ctx) = common::gpu_or_skip("child").expect("the child sees the parent's GPU");
    let socket = std::io::stdin();
    let mut exported = Some(ExportedAllocation::receive(&socket).unwrap());
    let memory = exported.as_ref().unwrap().import().unwrap();
    let size = memory.size();
    let split = order.find('I').unwrap();
    let (before, after) = (&order[..split], &order[split + 1..]);
    let step = |expected: u8, exported: &mut Option<ExportedAllocation>| {
        assert_eq!(receive_byte(&socket) as char, expected as char, "{order}");
        if expected == b'F' {
            drop(exported.take().expect("the descriptor is closed once"));
        }
    };
    {
        let mut reservation = VirtualReservation::new(size, 0).unwrap();
        let mut region = reservation.region();
        let mut mapping = region.map(&memory).unwrap();
        let access = mapping.grant(&ctx, ReadWrite).unwrap();
        assert_eq!(
            access.slice::<u32>().unwrap().to_vec().unwrap(),
            pattern(size, 7)
        );
        send_byte(&socket, b'M');
        for expected in before.bytes() {
            step(expected, &mut exported);
            assert_eq!(
                access.slice::<u32>().unwrap().to_vec().unwrap(),
                pattern(size, 7),
                "{order}: the importer's mapping after {}",
                expected as char
            );
            send_byte(&socket, b'K');
        }
        step(b'I', &mut exported);
        mapping.unmap().unwrap();
        reservation.free().unwrap();
        memory.release().unwrap();
        send_byte(&socket, b'K');
    }
    for expected in after.bytes() {
        step(expected, &mut exported);
        send_byte(&socket, b'K');
    }
    assert!(exported.is_none(), "{order}: the descriptor was closed");
    expect_byte(&socket, b'Q');
}

// ---------------------------------------------------------------------------------------------------

#[test]
fn child_maps_gpu0_memory_and_grants_gpu1() {
    const TEST: &str = "child_maps_gpu0_memory_and_grants_gpu1";
    if child_role().is_some() {
        return child_grants_second_gpu();
    }
    let _serial = serial();
    let Some(gpus) = common::gpus_or_skip(TEST, 2) else {
        return;
    };
    let (device, ctx) = (gpus[0].0, &gpus[0].1);
    if !device.supports_posix_fd_handles().unwrap() {
        common::skip(&format!("SKIPPED {TEST}: no POSIX-fd shareable memory"));
        return;
    }
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    warm_up(device, g);
    let (free_before, _) = ctx.memory_info().unwrap();
    {
        let memory = ShareableAllocation::<PosixFd>::new(device, g).unwrap();
        let mut reservation = VirtualReservation::new(g, 0).unwrap();
        let mut region = reservation.region();
        let mut mapping = region.map(&memory).unwrap();
        let mut access = mapping.grant(ctx, ReadWrite).unwrap();
        access
            .slice_mut::<u32>()
            .unwrap()
            .copy_from_host(&pattern(g, 1))
            .unwrap();
        let (socket, child_end) = UnixStream::pair().unwrap();
        let child = spawn_child(TEST, "gpu1", child_end);
        memory.export().unwrap().send(&socket).unwrap();
        expect_byte(&socket, b'D');
        wait_success(child, TEST);
        assert_eq!(
            access.slice::<u32>().unwrap().to_vec().unwrap(),
            pattern(g, 5),
            "GPU 1's writes in the child, read on GPU 0 in the parent"
        );
    }
    assert_eq!(settled_free(ctx, free_before), free_before, "leak");
}

/// The child maps GPU 0's memory and grants GPU 1 only: GPU 1 reads the parent's bytes and writes
/// its own over the link.
fn child_grants_second_gpu() {
    let gpus = common::gpus_or_skip("child", 2).expect("the child sees both GPUs");
    let socket = std::io::stdin();
    let memory = ExportedAllocation::receive(&socket)
        .unwrap()
        .import()
        .unwrap();
    assert_eq!(
        memory.location(),
        cuda_vmm::vmm::Location::Device(gpus[0].0)
    );
    let size = memory.size();
    let mut reservation = VirtualReservation::new(size, 0).unwrap();
    let mut region = reservation.region();
    let mut mapping = region.map(&memory).unwrap();
    let mut access = mapping.grant(&gpus[1].1, ReadWrite).unwrap();
    assert_eq!(access.devices(), [gpus[1].0]);
    assert_eq!(
        access.slice::<u32>().unwrap().to_vec().unwrap(),
        pattern(size, 1)
    );
    access
        .slice_mut::<u32>()
        .unwrap()
        .copy_from_host(&pattern(size, 5))
        .unwrap();
    send_byte(&socket, b'D');
}

// ---------------------------------------------------------------------------------------------------

/// A description that lies about the size is caught by the driver's `cuMemMap` in the importer, as a
/// named error, and leaks nothing: a smaller size is a partial mapping (801), a larger one is refused.
#[test]
fn sizes_that_lie_are_refused_by_map() {
    const TEST: &str = "sizes_that_lie_are_refused_by_map";
    if child_role().is_some() {
        return child_maps_lies();
    }
    let _serial = serial();
    let Some((device, ctx)) = shareable_gpu_or_skip(TEST) else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    warm_up(device, g);
    let (free_before, _) = ctx.memory_info().unwrap();
    {
        let memory = ShareableAllocation::<PosixFd>::new(device, 2 * g).unwrap();
        let (socket, child_end) = UnixStream::pair().unwrap();
        let child = spawn_child(TEST, "lies", child_end);
        for claimed in [g, 3 * g] {
            let (fd, _) = memory.export().unwrap().into_parts();
            let info = ExportInfo::new(claimed, device.ordinal(), g).unwrap();
            ExportedAllocation::from_parts(fd, info)
                .send(&socket)
                .unwrap();
        }
        expect_byte(&socket, b'D');
        wait_success(child, TEST);
    }
    assert_eq!(settled_free(&ctx, free_before), free_before, "leak");
}

fn child_maps_lies() {
    let (_, _ctx) = common::gpu_or_skip("child").expect("the child sees the parent's GPU");
    let socket = std::io::stdin();
    for _ in 0..2 {
        let exported = ExportedAllocation::receive(&socket).unwrap();
        let memory = exported.import().unwrap();
        let mut reservation = VirtualReservation::new(4 * memory.size(), 0).unwrap();
        let e = reservation.region().map(&memory).unwrap_err();
        let driver = e
            .driver()
            .unwrap_or_else(|| panic!("not a driver error: {e}"));
        assert!(driver.name().is_some(), "{e}");
        println!("claimed size {}: cuMemMap refused: {e}", memory.size());
        memory.release().unwrap();
    }
    send_byte(&socket, b'D');
}

// ---------------------------------------------------------------------------------------------------

/// What `import` checks itself, before the driver's import: a device ordinal that names no device
/// here, and a granularity other than the device's. No child is needed: nothing reaches the driver's
/// import.
#[test]
fn import_checks_device_and_granularity_first() {
    let _serial = serial();
    let Some((device, _ctx)) = shareable_gpu_or_skip("import_checks_device_and_granularity_first")
    else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let memory = ShareableAllocation::<PosixFd>::new(device, 2 * g).unwrap();
    let count = Device::count().unwrap();
    let (fd, _) = memory.export().unwrap().into_parts();
    let wrong_device =
        ExportedAllocation::from_parts(fd, ExportInfo::new(2 * g, count, g).unwrap());
    assert_eq!(
        wrong_device.import().unwrap_err(),
        Error::NoSuchDevice {
            ordinal: count,
            count
        }
    );
    let (fd, _) = wrong_device.into_parts();
    let wrong_granularity = ExportedAllocation::from_parts(
        fd,
        ExportInfo::new(2 * g, device.ordinal(), 2 * g).unwrap(),
    );
    assert!(matches!(
        wrong_granularity.import(),
        Err(Error::InvalidMessage { .. })
    ));
}

/// A descriptor that is not an exported allocation (a pipe) is refused by the driver's import with a
/// named error.
#[test]
fn import_of_a_foreign_descriptor_is_refused() {
    let _serial = serial();
    let Some((device, _ctx)) = shareable_gpu_or_skip("import_of_a_foreign_descriptor_is_refused")
    else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let (_read, write) = std::io::pipe().unwrap();
    let foreign = ExportedAllocation::from_parts(
        write.into(),
        ExportInfo::new(g, device.ordinal(), g).unwrap(),
    );
    let e = foreign.import().unwrap_err();
    let driver = e
        .driver()
        .unwrap_or_else(|| panic!("not a driver error: {e}"));
    assert!(driver.name().is_some(), "{e}");
    println!("a pipe as an exported allocation: {e}");
}

/// Fabric handles: refused with a named error where the device or the process cannot have them
/// (before any allocation where the machine has no IMEX channel); created where one exists.
#[test]
fn fabric_memory_is_detected_and_refused_with_a_reason() {
    let _serial = serial();
    let Some((device, _ctx)) =
        common::gpu_or_skip("fabric_memory_is_detected_and_refused_with_a_reason")
    else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let supported = device.supports_fabric_handles().unwrap();
    match ShareableAllocation::<Fabric>::new(device, g) {
        Err(Error::Unsupported { attribute, .. }) => {
            assert!(!supported);
            assert_eq!(attribute, 128);
        }
        Err(e @ Error::NoImexChannel { .. }) => {
            assert!(supported);
            assert_eq!(cuda_vmm::device::imex_channel(), None);
            println!("fabric memory refused before any allocation: {e}");
        }
        Err(e @ Error::Refused { error, .. }) => {
            assert!(supported);
            assert_eq!(error, DriverError::NOT_PERMITTED);
            println!("fabric memory refused: {e}");
        }
        Ok(memory) => {
            assert!(supported);
            println!("fabric memory created: this process has an IMEX channel");
            memory.release().unwrap();
        }
        Err(e) => panic!("fabric memory: unexpected error {e}"),
    }
}

/// `pidfd_getfd`, the alternative to a socket: a duplicate of the exporter's descriptor, taken by
/// process id and descriptor number (here from this process itself, which the kernel allows wherever
/// it allows `pidfd_getfd` at all), imports and maps like the original and sees its bytes. Where the
/// kernel refuses (ptrace restrictions), the refusal is a named `Error::Os`, and the test says so.
/// A process that does not exist is a named error too.
#[cfg(target_os = "linux")]
#[test]
fn a_descriptor_taken_with_pidfd_getfd_imports_the_same_memory() {
    use std::os::fd::AsRawFd;
    const TEST: &str = "a_descriptor_taken_with_pidfd_getfd_imports_the_same_memory";
    let _serial = serial();
    let Some((device, ctx)) = shareable_gpu_or_skip(TEST) else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let memory = ShareableAllocation::<PosixFd>::new(device, g).unwrap();
    let exported = memory.export().unwrap();
    let input = pattern(g, 31);
    let mut reservation = VirtualReservation::new(g, 0).unwrap();
    let mut region = reservation.region();
    let mut mapping = region.map(&memory).unwrap();
    mapping
        .grant(&ctx, ReadWrite)
        .unwrap()
        .slice_mut::<u32>()
        .unwrap()
        .copy_from_host(&input)
        .unwrap();

    let taken = match ExportedAllocation::take_from_process(
        std::process::id(),
        exported.as_fd().as_raw_fd(),
        exported.info(),
    ) {
        Ok(taken) => taken,
        Err(Error::Os { what, errno }) => {
            common::skip(&format!(
                "SKIPPED {TEST}: the kernel refused {what} (errno {errno}); use a socket"
            ));
            return;
        }
        Err(e) => panic!("pidfd_getfd: {e}"),
    };
    let imported = taken.import().unwrap();
    let mut other = VirtualReservation::new(g, 0).unwrap();
    let mut other_region = other.region();
    let mut other_mapping = other_region.map(&imported).unwrap();
    let access = other_mapping.grant(&ctx, ReadWrite).unwrap();
    assert_eq!(access.slice::<u32>().unwrap().to_vec().unwrap(), input);

    // No such process: a named refusal, before anything is imported.
    let e = ExportedAllocation::take_from_process(i32::MAX as u32, 3, exported.info()).unwrap_err();
    assert!(matches!(e, Error::Os { .. }), "{e}");
}
