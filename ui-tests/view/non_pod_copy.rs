//! Rule: only plain data (`bytemuck::Pod`) is viewed in and copied from device memory.
//! Prevents: a `String` made from arbitrary device bytes (a dangling host pointer, freed on drop).
//! Expected: E0277 (`String: Pod` is not satisfied).

use cuda_vmm::{Context, Device, Error, Granularity, PhysicalAllocation, ReadOnly, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut mapping = reservation.region().map(&memory)?;
    let access = mapping.grant(&context, ReadOnly)?;

    let names = access.slice::<String>()?; // <- error[E0277]: `String` is not plain data
    println!("{names:?}");
    Ok(())
}
