//! Rule: a view of a scoped grant cannot outlive it: `revoke` consumes the grant.
//! Prevents: copies through a view after cuMemSetAccess set its devices back to no access (a fault).
//! Expected: E0505 (move out of `scoped` while borrowed).

use cuda_vmm::{Context, Device, Error, Granularity, PhysicalAllocation, ReadOnly, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut mapping = reservation.region().map(&memory)?;
    let contexts = [&context];
    let scoped = mapping.grant_scoped(&contexts, ReadOnly)?;
    let view = scoped.slice::<u32>()?;

    scoped.revoke()?; // <- error[E0505]: `view` still borrows `scoped`
    println!("{:?}", view.to_vec()?);
    Ok(())
}
