//! Rule: a physical allocation cannot be moved while a mapping of it lives.
//! Prevents: a mapping whose backing can be released through its new owner (cuMemRelease while mapped).
//! Expected: E0505 (move out of `memory` while borrowed).

use cuda_vmm::{Device, Error, Granularity, PhysicalAllocation, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mapping = reservation.region().map(&memory)?;

    let mut pool = Vec::new();
    pool.push(memory); // <- error[E0505]: `memory` is borrowed by `mapping`
    mapping.unmap()?;
    Ok(())
}
