//! Rule: a mapping is unmapped exactly once: `unmap` consumes it.
//! Prevents: a second cuMemUnmap of the range, which the driver does not catch.
//! Expected: E0382 (use of moved value `mapping`).

use cuda_vmm::{Device, Error, Granularity, PhysicalAllocation, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mapping = reservation.region().map(&memory)?;

    mapping.unmap()?;
    mapping.unmap()?; // <- error[E0382]: `mapping` was consumed by the first `unmap`
    Ok(())
}
