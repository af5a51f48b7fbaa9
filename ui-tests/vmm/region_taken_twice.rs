//! Rule: a reservation gives out one region at a time; more come only from splitting it.
//! Prevents: cuMemMap over a range that is already mapped (two overlapping mappings).
//! Expected: E0499 (second mutable borrow of `reservation`).

use cuda_vmm::{Device, Error, Granularity, PhysicalAllocation, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let weights = PhysicalAllocation::new(device, size)?;
    let scratch = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(2 * size, 0)?;

    let mut first = reservation.region();
    let mut second = reservation.region(); // <- error[E0499]: both regions start at the reservation's base
    let weights_mapping = first.map(&weights)?;
    let scratch_mapping = second.map(&scratch)?;
    weights_mapping.unmap()?;
    scratch_mapping.unmap()?;
    Ok(())
}
