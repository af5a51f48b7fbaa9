//! Rule: a view cannot outlive the mapping it views.
//! Prevents: copies through a view after cuMemUnmap (use after unmap).
//! Expected: E0505 (move out of `mapping` while borrowed).

use cuda_vmm::{Context, Device, Error, Granularity, PhysicalAllocation, ReadOnly, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut mapping = reservation.region().map(&memory)?;
    let access = mapping.grant(&context, ReadOnly)?;
    let view = access.slice::<u32>()?;

    mapping.unmap()?; // <- error[E0505]: `view` still borrows `mapping`
    println!("{:?}", view.to_vec()?);
    Ok(())
}
