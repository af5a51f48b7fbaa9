//! Rule: only plain data (`bytemuck::Pod`) is viewed in and copied from device memory.
//! Prevents: a `bool` made from an arbitrary device byte (any byte but 0 or 1 is undefined behaviour).
//! Expected: E0277 (`bool: Pod` is not satisfied).

use cuda_vmm::{Context, Device, Error, Granularity, PhysicalAllocation, ReadOnly, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut mapping = reservation.region().map(&memory)?;
    let access = mapping.grant(&context, ReadOnly)?;

    let flags = access.slice::<bool>()?; // <- error[E0277]: a byte of 2 would be an invalid `bool`
    println!("{flags:?}");
    Ok(())
}
