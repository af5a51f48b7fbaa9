//! Rule: a view of a revocable grant cannot outlive it: `revoke` consumes the grant.
//! Prevents: copies through a view after cuMemSetAccess set its devices back to no access (a fault).
//! Expected: E0505 (move out of `grant` while borrowed).

use cuda_vmm::{Context, Device, Error, Granularity, PhysicalAllocation, ReadOnly, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut mapping = reservation.region().map(&memory)?;
    let contexts = [&context];
    let grant = mapping.grant_revocable(&contexts, ReadOnly)?;
    let view = grant.slice::<u32>()?;

    grant.revoke()?; // <- error[E0505]: `view` still borrows `grant`
    println!("{:?}", view.to_vec()?);
    Ok(())
}
