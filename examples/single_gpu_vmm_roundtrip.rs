//! The single-GPU VMM round trip, on every device of the machine in turn: query the granularity,
//! allocate physical memory, reserve a virtual range, map one into the other, grant the device
//! read-write access, copy a byte pattern in and out and compare, then tear down explicitly.
//!
//! Each step is a type: a `Mapping` hands out no address until `grant` returns an `Access`, views borrow the
//! `Access`, and teardown compiles only in the driver's order (unmap, then free the reservation, then
//! release the memory). The explicit `unmap`, `free` and `release` report the driver's answer, which
//! the `Drop` implementations would ignore.
//!
//! Run with `./with-libcuda cargo run --example single_gpu_vmm_roundtrip`.

// Each example is its own crate, and this one uses only part of the shared module: not
// `exit_code_with_cause`, `two_or_more_devices_or_none`, `check`, `verify`, `pattern` or `AddOne`.
#[allow(dead_code)]
mod common;

use std::process::ExitCode;

use common::{ExampleResult, devices_or_none, verify_debug};
use cuda_vmm::{
    Context, Device, Granularity, PhysicalAllocation, ReadWrite, VirtualReservation, align_size,
    allocation_granularity,
};

fn main() -> ExitCode {
    common::exit_code("single_gpu_vmm_roundtrip", run())
}

fn run() -> ExampleResult {
    println!("single_gpu_vmm_roundtrip: the VMM lifecycle on each device");
    let Some(devices) = devices_or_none("there is no VMM round trip to run")? else {
        return Ok(());
    };
    let mut done = 0usize;
    for &device in &devices {
        if roundtrip(device)? {
            done += 1;
        }
    }
    println!(
        "\nsingle_gpu_vmm_roundtrip: round trip verified on {done} of {} device(s)",
        devices.len()
    );
    Ok(())
}

/// The round trip on one device. `Ok(false)` where the device has no VMM support.
fn roundtrip(device: Device) -> ExampleResult<bool> {
    let gpu = device.ordinal();
    println!("\nGPU {gpu}: {}", device.name()?);
    if !device.supports_vmm()? {
        println!(
            "  no VMM support (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0): skipped"
        );
        return Ok(false);
    }
    let context = Context::new(device)?;

    let granularity = allocation_granularity(device, Granularity::Minimum)?;
    let size = align_size(4096, granularity)?;
    println!("  1. granularity: {granularity} B; 4096 B rounds up to {size} B");

    let physical = PhysicalAllocation::new(device, size)?;
    println!("  2. PhysicalAllocation::new (cuMemCreate): {size} B on GPU {gpu}");

    let mut reservation = VirtualReservation::new(size, 0)?;
    println!(
        "  3. VirtualReservation::new (cuMemAddressReserve): {} B at {:#x}",
        reservation.size(),
        reservation.base()
    );

    // The mapping borrows the reservation (through the region) and the physical memory: neither can be
    // freed, released or moved while it lives.
    let mut mapping = reservation.region().map(&physical)?;
    println!(
        "  4. Region::map (cuMemMap): {} B mapped; not usable yet: a Mapping hands out no address or view",
        mapping.size()
    );

    {
        // The grant is the only way to a view or an address.
        let mut access = mapping.grant(&context, ReadWrite)?;
        println!(
            "  5. Mapping::grant (cuMemSetAccess): GPU {gpu} may read and write {:#x}",
            access.as_raw_ptr()
        );

        // The chapter's u8 pattern, over the whole mapping.
        let input: Vec<u8> = (0..size)
            .map(|i| (i as u8).wrapping_mul(3).wrapping_add(7))
            .collect();
        access.slice_mut::<u8>()?.copy_from_host(&input)?;
        let output = access.slice::<u8>()?.to_vec()?;
        verify_debug(
            &format!(
                "  6. copied {size} B in (cuMemcpyHtoD) and out (cuMemcpyDtoH) through the mapping"
            ),
            &output,
            &input,
        )?;
        // Every copy has finished when it returns, so nothing is in flight when the grant ends here.
    }

    let region = mapping.unmap()?;
    println!(
        "  7. Mapping::unmap (cuMemUnmap): reported success; {} B at {:#x} can be mapped again",
        region.len(),
        region.start()
    );
    reservation.free()?;
    println!("  8. VirtualReservation::free (cuMemAddressFree): reported success");
    physical.release()?;
    println!("  9. PhysicalAllocation::release (cuMemRelease): reported success");
    Ok(true)
}
