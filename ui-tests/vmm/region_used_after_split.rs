//! Rule: splitting a region consumes it; only the two disjoint halves remain.
//! Prevents: cuMemMap over a range that is already mapped (the whole region overlaps both halves).
//! Expected: E0382 (borrow of moved value `region`).

use cuda_vmm::{Device, Error, Granularity, PhysicalAllocation, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let weights = PhysicalAllocation::new(device, size)?;
    let scratch = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(2 * size, 0)?;

    let mut region = reservation.region();
    let (mut low, _high) = region.split_at(size)?;
    let weights_mapping = low.map(&weights)?;
    let scratch_mapping = region.map(&scratch)?; // <- error[E0382]: `region` was moved into `split_at`
    weights_mapping.unmap()?;
    scratch_mapping.unmap()?;
    Ok(())
}
