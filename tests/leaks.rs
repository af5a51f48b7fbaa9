//! Exact leak accounting: VMM memory is accounted to the byte in `cuMemGetInfo`, so every lifecycle,
//! including the failing ones, must leave the free memory exactly where it was. One test per process:
//! concurrent tests would move the free-memory figure.

mod common;

use cuda_vmm::{
    Context, DeviceBuffer, Error, Granularity, PhysicalAllocation, ReadOnly, ReadWrite,
    VirtualReservation, align_size, allocation_granularity,
};

fn lifecycle(ctx: &Context, g: usize, round: u32) -> Result<(), Error> {
    let device = ctx.device();
    let a = PhysicalAllocation::new(device, g)?;
    let b = PhysicalAllocation::new(device, g)?;
    let mut reservation = VirtualReservation::new(3 * g, 0)?;
    let (mut left, mut right) = reservation.region().split_at(g)?;
    let mut both = right.map_all(&[&a, &b])?;
    let mut alias = left.map(&a)?;
    let mut rw = both.grant(ctx, ReadWrite)?;
    let data = common::pattern(64, round);
    rw.slice_mut::<u32>()?
        .slice_mut(..64)?
        .copy_from_host(&data)?;
    let ro = alias.grant(ctx, ReadOnly)?;
    assert_eq!(ro.slice::<u32>()?.slice(..64)?.to_vec()?, data);
    let buffer = DeviceBuffer::from_host(ctx, &data)?;
    assert_eq!(buffer.as_slice().to_vec()?, data);
    Ok(())
}

#[test]
fn lifecycles_and_failures_leak_nothing() {
    let Some((device, ctx)) = common::gpu_or_skip("lifecycles_and_failures_leak_nothing") else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    // Warm up: the first calls may set up driver bookkeeping that stays for the process's lifetime.
    lifecycle(&ctx, g, 0).unwrap();
    let (free_before, total) = ctx.memory_info().unwrap();

    let rounds = 1000;
    for round in 1..=rounds {
        lifecycle(&ctx, g, round).unwrap();
        // Failures in the middle of a lifecycle must unwind cleanly too.
        let huge = align_size(1 << 50, g).unwrap();
        assert!(PhysicalAllocation::new(device, huge).is_err());
        let memory = PhysicalAllocation::new(device, g).unwrap();
        let mut small = VirtualReservation::new(g, 0).unwrap();
        let mut region = small.region();
        region.skip(g / 2).unwrap();
        assert!(region.map(&memory).is_err());
    }
    let (free_after, _) = ctx.memory_info().unwrap();
    println!("{rounds} rounds: free before {free_before}, after {free_after} of {total}");
    assert_eq!(
        free_after,
        free_before,
        "device memory leaked: {} bytes",
        free_before.abs_diff(free_after)
    );

    // The accounting is tight enough to see one allocation.
    let memory = PhysicalAllocation::new(device, 4 * g).unwrap();
    let (free_held, _) = ctx.memory_info().unwrap();
    drop(memory);
    let (free_released, _) = ctx.memory_info().unwrap();
    assert_eq!(free_released - free_held, 4 * g);
}
