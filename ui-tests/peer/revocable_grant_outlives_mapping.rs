//! Rule: a revocable grant cannot outlive its mapping: the mapping cannot be unmapped while the grant lives.
//! Prevents: the grant's revoking cuMemSetAccess on a range already unmapped (and views of it).
//! Expected: E0505 (move out of `mapping` while borrowed).

use cuda_vmm::{Context, Device, Error, Granularity, PhysicalAllocation, ReadWrite, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut mapping = reservation.region().map(&memory)?;
    let contexts = [&context];
    let grant = mapping.grant_revocable(&contexts, ReadWrite)?;

    mapping.unmap()?; // <- error[E0505]: `grant` still borrows `mapping`
    grant.revoke()?;
    Ok(())
}
