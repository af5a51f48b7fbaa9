//! `OwnedHostMapping`, the owned host mapping: returned from a constructor and kept in a struct
//! field, moved to another thread and shared by reference, written by the CPU, read by the device
//! (a copy engine) and written back by it (the `add_one` kernel), the bytes checked on both sides;
//! nothing leaked over 400 rounds.
//!
//! Each test covers every host location the device supports: `Location::Host` (CUDA 13.0 drivers)
//! and `Location::HostNuma` on the node nearest the device. The tests measure free memory and run
//! one at a time.

mod common;

use cuda_vmm::host::{HostAllocation, OwnedHostMapping};
use cuda_vmm::{
    Context, Device, DeviceBuffer, Error, Granularity, ReadOnly, ReadWrite, allocation_granularity,
};

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Host memory of `size` bytes at the location `kind` names (`"host"` or `"host NUMA"`).
fn allocate(kind: &str, device: Device, size: usize) -> HostAllocation {
    match kind {
        "host" => HostAllocation::new(device, size).unwrap(),
        _ => HostAllocation::near(device, size).unwrap(),
    }
}

/// The host locations `device` supports, after saying which it does not.
fn kinds(test: &str, device: Device) -> Vec<&'static str> {
    let mut kinds = Vec::new();
    if device.supports_host_memory().unwrap() {
        kinds.push("host");
    } else {
        common::skip(&format!(
            "SKIPPED {test} (Location::Host part): {device:?} does not support it"
        ));
    }
    if device.supports_host_numa_memory().unwrap() {
        kinds.push("host NUMA");
    } else {
        common::skip(&format!(
            "SKIPPED {test} (Location::HostNuma part): {device:?} does not support it"
        ));
    }
    kinds
}

/// What an engine keeps: a staging area the CPU fills and the device reads, in a field.
struct Engine {
    context: Context,
    staging: OwnedHostMapping,
}

impl Engine {
    /// The mapping is made here and returned inside the struct: it borrows nothing.
    fn new(kind: &str, device: Device, size: usize) -> cuda_vmm::Result<Engine> {
        let memory = allocate(kind, device, size);
        Ok(Engine {
            context: Context::new(device)?,
            staging: OwnedHostMapping::new(memory, &[device], ReadWrite)?,
        })
    }
}

/// One round trip: the CPU writes `seed`'s pattern through a `&mut [u32]`; the device reads it (a
/// copy engine, into device memory) and checks it; the device adds one in place (the `add_one`
/// kernel on the view's address, where `kernel`, else a copy back from device memory); the CPU
/// reads the result through a `&[u32]`.
fn round_trip(engine: &mut Engine, seed: u32, n_check: usize, kernel: bool) {
    let size = engine.staging.size();
    let data = common::pattern(n_check, seed);
    let plus_one: Vec<u32> = data.iter().map(|x| x.wrapping_add(1)).collect();
    {
        let mut cpu = engine.staging.host_access();
        let slice = cpu.as_mut_slice::<u32>().unwrap();
        assert_eq!(slice.len(), size / 4);
        slice[..n_check].copy_from_slice(&data);
    }
    let ctx = &engine.context;
    let mut buffer = DeviceBuffer::<u32>::zeroed(ctx, n_check).unwrap();
    {
        let view = engine.staging.slice::<u32>().unwrap();
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
    {
        let mut view = engine.staging.slice_mut::<u32>().unwrap();
        if kernel {
            let ptr = view.as_raw_ptr();
            // SAFETY: `ptr` is `n_check` (no more than the mapping holds) u32s of host memory
            // mapped and granted to `ctx`'s device while `view` lives; nothing else uses it until
            // the launch returns (it waits for the kernel).
            unsafe { common::add_one(ctx, ptr, ptr, n_check) }.unwrap();
        } else {
            buffer.as_mut_slice().copy_from_host(&plus_one).unwrap();
            view.slice_mut(..n_check)
                .unwrap()
                .copy_from_device(&buffer.as_slice())
                .unwrap();
        }
    }
    let cpu = engine.staging.host_access();
    assert_eq!(
        &cpu.as_slice::<u32>().unwrap()[..n_check],
        &plus_one[..],
        "the device's writes, read by the CPU"
    );
}

#[test]
fn returned_from_a_constructor_and_kept_in_a_struct() {
    const TEST: &str = "returned_from_a_constructor_and_kept_in_a_struct";
    let _serial = serial();
    let Some((device, _ctx)) = common::gpu_or_skip(TEST) else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    for kind in kinds(TEST, device) {
        let mut engine = Engine::new(kind, device, 2 * g).unwrap();
        println!("{kind}: {:?}", engine.staging);
        assert_eq!(engine.staging.size(), 2 * g);
        assert_eq!(engine.staging.devices(), vec![device]);
        round_trip(&mut engine, 1, 2 * g / 4, true);
        round_trip(&mut engine, 2, 2 * g / 4, false);
        engine.staging.free().unwrap();
    }
}

#[test]
fn moved_to_another_thread_and_shared_by_reference() {
    const TEST: &str = "moved_to_another_thread_and_shared_by_reference";
    let _serial = serial();
    let Some((device, _ctx)) = common::gpu_or_skip(TEST) else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    for kind in kinds(TEST, device) {
        let mut engine = Engine::new(kind, device, g).unwrap();
        round_trip(&mut engine, 3, 64, false);
        // Moved to another thread, used there, and moved back.
        let mut engine = std::thread::spawn(move || {
            round_trip(&mut engine, 4, g / 4, true);
            engine
        })
        .join()
        .unwrap();
        round_trip(&mut engine, 5, 64, false);
        // A read-only mapping shared by two threads at once: both read the CPU's bytes.
        let mut memory = allocate(kind, device, g);
        let data = common::pattern(g / 4, 6);
        {
            // The same allocation, filled through the borrowed layer first.
            let mut reservation = cuda_vmm::VirtualReservation::new(g, 0).unwrap();
            let mut region = reservation.region();
            let mut mapping = region.map_host(&mut memory).unwrap();
            let mut cpu = mapping.grant_host(ReadWrite).unwrap();
            cpu.as_mut_slice::<u32>().unwrap().copy_from_slice(&data);
        }
        let shared = OwnedHostMapping::new(memory, &[device], ReadOnly).unwrap();
        std::thread::scope(|s| {
            let readers: Vec<_> = (0..2)
                .map(|_| s.spawn(|| shared.slice::<u32>().unwrap().to_vec().unwrap()))
                .collect();
            for reader in readers {
                assert_eq!(reader.join().unwrap(), data, "a thread read the bytes");
            }
        });
        drop(shared);
        drop(engine);
    }
}

#[test]
fn an_empty_device_list_is_refused() {
    const TEST: &str = "an_empty_device_list_is_refused";
    let _serial = serial();
    let Some((device, _ctx)) = common::gpu_or_skip(TEST) else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    for kind in kinds(TEST, device) {
        let memory = allocate(kind, device, g);
        assert_eq!(
            OwnedHostMapping::new(memory, &[], ReadWrite).unwrap_err(),
            Error::ZeroSize { what: "access set" }
        );
        // A device named twice counts once.
        let twice =
            OwnedHostMapping::new(allocate(kind, device, g), &[device, device], ReadOnly).unwrap();
        assert_eq!(twice.devices(), vec![device]);
    }
}

#[test]
fn owned_host_round_trips_leak_nothing_over_400_rounds() {
    const TEST: &str = "owned_host_round_trips_leak_nothing_over_400_rounds";
    let _serial = serial();
    let Some((device, ctx)) = common::gpu_or_skip(TEST) else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let kinds = kinds(TEST, device);
    if kinds.is_empty() {
        return;
    }
    // Warm up: the first round sets up driver bookkeeping (modules, pools) kept for the process.
    for kind in &kinds {
        let mut engine = Engine::new(kind, device, g).unwrap();
        round_trip(&mut engine, 0, 64, true);
    }
    let (free_before, _) = ctx.memory_info().unwrap();
    let host_before = mem_available();
    let rounds = 400u32;
    for round in 0..rounds {
        let kind = kinds[round as usize % kinds.len()];
        let mut engine = Engine::new(kind, device, g).unwrap();
        round_trip(&mut engine, round, 64, round % 3 == 0);
        if round % 2 == 0 {
            engine.staging.free().unwrap();
        } // otherwise dropped: unmapped, released and freed by `Drop`
    }
    let (free_after, _) = ctx.memory_info().unwrap();
    assert_eq!(free_after, free_before, "device memory leaked");
    // Host memory is not in `cuMemGetInfo`. A leak of one 2 MiB allocation per round would take
    // 800 MiB of host memory (400 MiB where only `free` or only `Drop` leaked); allow 256 MiB of
    // noise from the rest of the machine.
    let host_after = mem_available();
    let fell = host_before.saturating_sub(host_after);
    assert!(
        fell < 256 << 20,
        "host memory available fell by {fell} bytes over {rounds} rounds"
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
