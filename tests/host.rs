//! Host memory through VMM: the CPU writes through a Rust slice, the device reads it and writes back
//! (copies and a kernel), and the CPU reads the device's bytes; leak-free over 10 000 rounds; the
//! locations the driver refuses give named errors.
//!
//! Each test covers every host location the device supports: `Location::Host` (CUDA 13.0 drivers)
//! and `Location::HostNuma` on the node nearest the device. The tests measure free memory and run one
//! at a time.

mod common;

use cuda_vmm::{
    Context, Device, DeviceBuffer, DriverError, Error, Granularity, ReadOnly, ReadWrite,
    VirtualReservation, allocation_granularity, host::HostAllocation,
};

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Every kind of host allocation `device` supports, `size` bytes each, labelled; empty (after saying
/// so) where it supports none.
fn host_allocations(
    test: &str,
    device: Device,
    size: usize,
) -> Vec<(&'static str, HostAllocation)> {
    let mut all = Vec::new();
    if device.supports_host_memory().unwrap() {
        all.push(("host", HostAllocation::new(device, size).unwrap()));
    } else {
        common::skip(&format!(
            "SKIPPED {test} (Location::Host part): {device:?} does not support it"
        ));
    }
    if device.supports_host_numa_memory().unwrap() {
        all.push(("host NUMA", HostAllocation::near(device, size).unwrap()));
    } else {
        common::skip(&format!(
            "SKIPPED {test} (Location::HostNuma part): {device:?} does not support it"
        ));
    }
    all
}

/// One round trip through `memory`: the CPU writes `seed`'s pattern through a `&mut [u32]`; the device
/// reads it (a copy engine, into device memory) and writes it back plus one (with the `add_one`
/// kernel in place where `kernel`, else with a copy engine from device memory); the CPU reads the
/// result through a `&[u32]` of a read-only grant.
fn round_trip(ctx: &Context, memory: &mut HostAllocation, seed: u32, n_check: usize, kernel: bool) {
    let size = memory.size();
    let mut reservation = VirtualReservation::new(size, 0).unwrap();
    let mut region = reservation.region();
    let mut mapping = region.map_host(memory).unwrap();
    let data = common::pattern(n_check, seed);
    let plus_one: Vec<u32> = data.iter().map(|x| x.wrapping_add(1)).collect();
    {
        let mut cpu = mapping.grant_host(ReadWrite).unwrap();
        let slice = cpu.as_mut_slice::<u32>().unwrap();
        assert_eq!(slice.len(), size / 4);
        slice[..n_check].copy_from_slice(&data);
    }
    {
        let mut device = mapping.grant(ctx, ReadWrite).unwrap();
        let mut buffer = DeviceBuffer::<u32>::zeroed(ctx, n_check).unwrap();
        {
            let view = device.slice::<u32>().unwrap();
            buffer
                .as_mut_slice()
                .copy_from_device(&view.slice(..n_check).unwrap())
                .unwrap();
        }
        assert_eq!(
            buffer.as_slice().to_vec().unwrap(),
            data,
            "the device read the CPU's bytes"
        );
        if kernel {
            let ptr = device.as_raw_ptr();
            // SAFETY: `ptr` is `n_check` (no more than the mapping holds) u32s of host memory mapped
            // and granted to `ctx`'s device while `device` lives; nothing else uses it until the
            // launch returns (it waits for the kernel).
            unsafe { common::add_one(ctx, ptr, ptr, n_check) }.unwrap();
        } else {
            buffer.as_mut_slice().copy_from_host(&plus_one).unwrap();
            let mut view = device.slice_mut::<u32>().unwrap();
            view.slice_mut(..n_check)
                .unwrap()
                .copy_from_device(&buffer.as_slice())
                .unwrap();
        }
    }
    let cpu = mapping.grant_host(ReadOnly).unwrap();
    let slice = cpu.as_slice::<u32>().unwrap();
    assert_eq!(
        &slice[..n_check],
        &plus_one[..],
        "the device's writes, read by the CPU"
    );
}

#[test]
fn cpu_writes_device_reads_and_writes_back() {
    const TEST: &str = "cpu_writes_device_reads_and_writes_back";
    let _serial = serial();
    let Some((device, ctx)) = common::gpu_or_skip(TEST) else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    for (label, mut memory) in host_allocations(TEST, device, 2 * g) {
        println!("{label}: {memory:?}");
        round_trip(&ctx, &mut memory, 1, 2 * g / 4, true);
        round_trip(&ctx, &mut memory, 1, 2 * g / 4, false);
        // Mapped again (the first mapping is gone), the bytes are still there.
        {
            let mut reservation = VirtualReservation::new(2 * g, 0).unwrap();
            let mut region = reservation.region();
            let mut mapping = region.map_host(&mut memory).unwrap();
            let cpu = mapping.grant_host(ReadOnly).unwrap();
            let expected: Vec<u32> = common::pattern(4, 1)
                .iter()
                .map(|x| x.wrapping_add(1))
                .collect();
            assert_eq!(cpu.as_slice::<u32>().unwrap()[..4], expected[..]);
        }
        // Host memory also maps as plain device memory, with `Region::map` (no CPU grant there).
        let mut plain = VirtualReservation::new(2 * g, 0).unwrap();
        let mut plain_region = plain.region();
        let mut plain_mapping = plain_region.map(&memory).unwrap();
        let access = plain_mapping.grant(&ctx, ReadOnly).unwrap();
        assert_eq!(access.slice::<u32>().unwrap().len(), 2 * g / 4);
    }
}

#[test]
fn host_round_trips_leak_nothing_over_10_000_rounds() {
    const TEST: &str = "host_round_trips_leak_nothing_over_10_000_rounds";
    let _serial = serial();
    let Some((device, ctx)) = common::gpu_or_skip(TEST) else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let kinds = host_allocations(TEST, device, g);
    // Warm up: the first round sets up driver bookkeeping (modules, pools) kept for the process.
    for (_, mut memory) in kinds {
        round_trip(&ctx, &mut memory, 0, 64, false);
    }
    let (free_before, _) = ctx.memory_info().unwrap();
    let host_before = mem_available();
    let rounds = 10_000u32;
    for round in 0..rounds {
        let mut memory = if device.supports_host_memory().unwrap() && round % 2 == 0 {
            HostAllocation::new(device, g).unwrap()
        } else if device.supports_host_numa_memory().unwrap() {
            HostAllocation::near(device, g).unwrap()
        } else {
            return;
        };
        round_trip(&ctx, &mut memory, round, 64, false);
        memory.release().unwrap();
    }
    let (free_after, _) = ctx.memory_info().unwrap();
    assert_eq!(free_after, free_before, "device memory leaked");
    // Host memory is not in `cuMemGetInfo`. A leak of one 2 MiB allocation per round would take
    // 20 GiB of host memory; allow 1 GiB of noise from the rest of the machine.
    let host_after = mem_available();
    let drop = host_before.saturating_sub(host_after);
    assert!(
        drop < 1 << 30,
        "host memory available fell by {drop} bytes over {rounds} rounds"
    );
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
fn mem_available() -> usize {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("MemAvailable:"))
        .unwrap();
    let kib: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// A NUMA node no machine has is refused with a named error; the location the driver refuses for
/// `cuMemCreate` (`HOST_NUMA_CURRENT`, which the crate therefore does not offer) is recorded with a
/// raw call.
#[test]
fn unsupported_locations_give_named_errors() {
    const TEST: &str = "unsupported_locations_give_named_errors";
    let _serial = serial();
    let Some((device, _ctx)) = common::gpu_or_skip(TEST) else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    match HostAllocation::on_numa_node(device, u16::MAX, g) {
        Err(Error::Unsupported { attribute, .. }) => {
            assert!(!device.supports_host_numa_memory().unwrap());
            assert_eq!(attribute, 141);
        }
        Err(e) => {
            let driver = e
                .driver()
                .unwrap_or_else(|| panic!("not a driver error: {e}"));
            assert!(driver.name().is_some(), "{e}");
            println!("NUMA node 65535: {e}");
        }
        Ok(memory) => panic!("NUMA node 65535 was accepted: {memory:?}"),
    }
    if !device.supports_host_memory().unwrap() {
        assert!(matches!(
            HostAllocation::new(device, g),
            Err(Error::Unsupported { attribute: 145, .. })
        ));
    }
    // Raw: `cuMemCreate` with `CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT` (4).
    let prop = raw::Prop {
        type_: 1,
        handle_types: 0,
        location: raw::Location { type_: 4, id: 0 },
        win32: core::ptr::null_mut(),
        flags: 0,
    };
    let mut handle = 0u64;
    // SAFETY: `handle` is writable and `prop` a complete `CUmemAllocationProp`, both alive for the call.
    let code = unsafe { raw::cuMemCreate(&raw mut handle, g, &raw const prop, 0) };
    println!(
        "cuMemCreate(HOST_NUMA_CURRENT): {}",
        common::code_name(code)
    );
    if code == 0 {
        // SAFETY: the handle was just created and is released once.
        assert_eq!(unsafe { raw::cuMemRelease(handle) }, 0);
        panic!("the driver now accepts HOST_NUMA_CURRENT: the crate could offer it");
    }
    assert_eq!(
        DriverError::from_raw(code),
        Some(DriverError::INVALID_VALUE)
    );
}

/// What `HostMapping::grant_host` relies on, recorded with raw calls: an access descriptor of type
/// `HOST_NUMA` gives the CPU the mapping's address, for memory of either host location; the answer
/// to a descriptor of type `HOST` is printed.
#[test]
fn cpu_access_descriptors_driver_facts() {
    const TEST: &str = "cpu_access_descriptors_driver_facts";
    let _serial = serial();
    let Some((device, _ctx)) = common::gpu_or_skip(TEST) else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let numa = device.host_numa_node().unwrap().unwrap_or(0);
    let mut locations = Vec::new();
    if device.supports_host_memory().unwrap() {
        locations.push(("HOST", raw::Location { type_: 2, id: 0 }));
    }
    if device.supports_host_numa_memory().unwrap() {
        locations.push((
            "HOST_NUMA",
            raw::Location {
                type_: 3,
                id: i32::from(numa),
            },
        ));
    }
    for (label, location) in locations {
        let prop = raw::Prop {
            type_: 1,
            handle_types: 0,
            location,
            win32: core::ptr::null_mut(),
            flags: 0,
        };
        let (mut handle, mut ptr) = (0u64, 0u64);
        // SAFETY: raw calls on resources made here, in the documented order, each undone below; the
        // CPU touches the range only after the driver granted it access.
        unsafe {
            assert_eq!(raw::cuMemCreate(&raw mut handle, g, &raw const prop, 0), 0);
            assert_eq!(raw::cuMemAddressReserve(&raw mut ptr, g, 0, 0, 0), 0);
            assert_eq!(raw::cuMemMap(ptr, g, 0, handle, 0), 0);
            let host_type = raw::AccessDesc {
                location: raw::Location { type_: 2, id: 0 },
                flags: 3,
            };
            let code = raw::cuMemSetAccess(ptr, g, &raw const host_type, 1);
            println!(
                "{label} memory, access descriptor of type HOST: {}",
                common::code_name(code)
            );
            let numa_type = raw::AccessDesc {
                location: raw::Location {
                    type_: 3,
                    id: i32::from(numa),
                },
                flags: 3,
            };
            let code = raw::cuMemSetAccess(ptr, g, &raw const numa_type, 1);
            assert_eq!(
                code,
                0,
                "{label}: HOST_NUMA descriptor: {}",
                common::code_name(code)
            );
            let cpu = core::ptr::with_exposed_provenance_mut::<u32>(ptr as usize);
            cpu.write_volatile(0x1234_5678);
            assert_eq!(cpu.read_volatile(), 0x1234_5678);
            assert_eq!(raw::cuMemUnmap(ptr, g), 0);
            assert_eq!(raw::cuMemAddressFree(ptr, g), 0);
            assert_eq!(raw::cuMemRelease(handle), 0);
        }
    }
}

/// The driver's own symbols with integer results, for what the safe API does not (or must not) offer.
#[path = "common/raw_vmm.rs"]
mod raw;
