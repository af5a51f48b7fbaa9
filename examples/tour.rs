//! A guided tour of the crate on whatever GPUs this machine has: the single-GPU VMM lifecycle, step by
//! step, with every result checked, then the machine's topology (the same tables as
//! `examples/topology.rs`). Without a GPU it says what it checked and that no device was found.
//!
//! Run with `./with-libcuda cargo run --example tour`.

// Each example is its own crate, and this one uses only part of the shared module: not `exit_code`,
// `devices_or_none` or `two_or_more_devices_or_none` (the tour finds its devices itself, with its own
// messages), `verify`, `verify_debug`, `pattern` or `AddOne`.
#[allow(dead_code)]
mod common;
#[path = "common/topology.rs"]
mod topology;

use std::process::ExitCode;

use common::{ExampleResult, check};
use cuda_vmm::{
    Context, Device, Granularity, PhysicalAllocation, ReadOnly, ReadWrite, VirtualReservation,
    align_size, allocation_granularity,
};

fn main() -> ExitCode {
    common::exit_code_with_cause("tour", tour())
}

fn tour() -> ExampleResult {
    println!("cuda-vmm tour");
    match cuda_vmm::device::driver_version() {
        Ok(v) => println!(
            "  driver library loaded: CUDA driver API {}.{}",
            v / 1000,
            v % 1000 / 10
        ),
        Err(e) => println!("  driver library loaded, but cuDriverGetVersion failed: {e}"),
    }
    match cuda_vmm::init() {
        Ok(()) => {}
        Err(e) if e.is_no_gpu() => {
            println!("  cuInit: {e}");
            println!(
                "no CUDA device found: nothing to tour on this machine (checked: the driver library"
            );
            println!(
                "loads and answers; cuInit reports no usable GPU). Run this on a machine with an NVIDIA GPU."
            );
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    }
    let devices = Device::all()?;
    println!("  {} device(s):", devices.len());
    for d in &devices {
        let (major, minor) = d.compute_capability()?;
        println!(
            "    {d:?} {} (sm_{major}{minor}), {} GiB, VMM supported: {}",
            d.name()?,
            d.total_memory()? >> 30,
            d.supports_vmm()?
        );
    }
    let Some(&device) = devices.first() else {
        println!("no CUDA device found: the driver initialised but lists none.");
        return Ok(());
    };
    single_gpu_lifecycle(device)?;

    println!("\ntopology");
    topology::print(&devices)?;
    println!("\ntour complete");
    Ok(())
}

fn single_gpu_lifecycle(device: Device) -> ExampleResult {
    println!("\nsingle-GPU VMM lifecycle on {device:?}");
    let context = Context::new(device)?;
    let (free_at_start, _) = context.memory_info()?;

    let granularity = allocation_granularity(device, Granularity::Minimum)?;
    let recommended = allocation_granularity(device, Granularity::Recommended)?;
    let size = align_size(4096, granularity)?;
    println!(
        "  1. granularity: minimum {granularity} B, recommended {recommended} B; 4096 B rounds up to {size} B"
    );

    let memory = PhysicalAllocation::new(device, size)?;
    println!("  2. cuMemCreate: {size} B of physical memory");

    let mut reservation = VirtualReservation::new(2 * size, 0)?;
    println!(
        "  3. cuMemAddressReserve: {} B at {:#x}",
        reservation.size(),
        reservation.base()
    );

    let (mut first, mut second) = reservation.region().split_at(size)?;
    let mut writable = first.map(&memory)?;
    let mut alias = second.map(&memory)?;
    println!(
        "  4. cuMemMap: the same memory at two addresses (two disjoint regions of one reservation)"
    );

    let mut rw = writable.grant(&context, ReadWrite)?;
    let ro = alias.grant(&context, ReadOnly)?;
    println!(
        "  5. cuMemSetAccess: {:#x} read-write, {:#x} read-only, for {device:?}",
        rw.as_raw_ptr(),
        ro.as_raw_ptr()
    );

    let input: Vec<u32> = (0..1024u32).map(|i| i * 3 + 7).collect();
    rw.slice_mut::<u32>()?
        .slice_mut(..input.len())?
        .copy_from_host(&input)?;
    let output = ro.slice::<u32>()?.slice(..input.len())?.to_vec()?;
    check(
        output == input,
        "  6. wrote 4 KiB through the read-write address, read it back through the read-only alias",
    )?;

    let region = writable.unmap()?;
    println!(
        "  7. cuMemUnmap: {:#x} is free again ({} B region returned)",
        region.start(),
        region.len()
    );
    drop(alias);
    reservation.free()?;
    memory.release()?;
    println!("  8. cuMemAddressFree, cuMemRelease: reported success");

    let (free_at_end, _) = context.memory_info()?;
    check(
        free_at_end == free_at_start,
        "  9. cuMemGetInfo: free device memory is back to the byte",
    )
}
