//! Rule: a mapping cannot outlive the scope of the reservation it was made in.
//! Prevents: cuMemAddressFree of a mapped range when the reservation goes out of scope (it fails and the range leaks).
//! Expected: E0515 (return a value referencing the local `reservation`).

use cuda_vmm::{Device, Error, Granularity, Mapping, PhysicalAllocation, VirtualReservation};

/// Reserves an address range and maps `memory` into it.
fn map_anywhere(memory: &PhysicalAllocation) -> Result<Mapping<'_, '_>, Error> {
    let mut reservation = VirtualReservation::new(memory.size(), 0)?;
    let mapping = reservation.region().map(memory)?;
    Ok(mapping) // <- error[E0515]: `reservation` is freed when this function returns
}

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    map_anywhere(&memory)?.unmap()?;
    Ok(())
}
