//! Rule: a physical allocation cannot be released while a mapping of it lives.
//! Prevents: cuMemRelease of memory still mapped (the mapping would outlive its backing).
//! Expected: E0505 (move out of `memory` while borrowed).

use cuda_vmm::{Device, Error, Granularity, PhysicalAllocation, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mapping = reservation.region().map(&memory)?;

    memory.release()?; // <- error[E0505]: `memory` is borrowed by `mapping`
    mapping.unmap()?;
    Ok(())
}
