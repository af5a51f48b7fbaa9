//! Rule: one grant of a mapping is in use at a time; a read-only grant cannot be widened while its views live.
//! Prevents: writes, through a new read-write grant, under views that were handed out as read-only.
//! Expected: E0499 (second mutable borrow of `mapping`).

use cuda_vmm::{Context, Device, Error, Granularity, PhysicalAllocation, ReadOnly, ReadWrite, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut mapping = reservation.region().map(&memory)?;

    let reader = mapping.grant(&context, ReadOnly)?;
    let before = reader.slice::<u32>()?;
    let mut writer = mapping.grant(&context, ReadWrite)?; // <- error[E0499]: `reader` still borrows `mapping`
    writer.slice_mut::<u32>()?.copy_from_host(&vec![0; before.len()])?;
    println!("{:?}", before.to_vec()?);
    Ok(())
}
