//! Rule: an unmapped mapping cannot be used: `unmap` consumes it.
//! Prevents: cuMemSetAccess on an unmapped range, and views of it that fault.
//! Expected: E0382 (borrow of moved value `mapping`).

use cuda_vmm::{Context, Device, Error, Granularity, PhysicalAllocation, ReadWrite, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut mapping = reservation.region().map(&memory)?;

    mapping.unmap()?;
    let access = mapping.grant(&context, ReadWrite)?; // <- error[E0382]: `mapping` was consumed by `unmap`
    println!("{:?}", access.slice::<u32>()?.to_vec()?);
    Ok(())
}
