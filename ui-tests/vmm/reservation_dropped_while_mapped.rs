//! Rule: a reservation cannot be dropped while a mapping in it lives.
//! Prevents: cuMemAddressFree of a mapped range (it fails and the range leaks).
//! Expected: E0505 (move out of `reservation` while borrowed).

use cuda_vmm::{Device, Error, Granularity, PhysicalAllocation, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mapping = reservation.region().map(&memory)?;

    drop(reservation); // <- error[E0505]: `reservation` is borrowed by `mapping`
    mapping.unmap()?;
    Ok(())
}
