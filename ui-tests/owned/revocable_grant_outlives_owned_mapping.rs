//! Rule: a revocable grant cannot outlive its `OwnedMapping`: the mapping cannot be unmapped while the grant lives, though it has no lifetime.
//! Prevents: the grant's revoking cuMemSetAccess on a range already unmapped (and views of it).
//! Expected: E0505 (move out of `mapping` while borrowed).

use cuda_vmm::{Context, Device, Error, PhysicalAllocation, ReadWrite, owned::SharedReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let page = 2 << 20;
    let reservation = SharedReservation::new(page, 0)?;
    let mut mapping = reservation.map(0, PhysicalAllocation::new(device, page)?)?;
    let contexts = [&context];
    let grant = mapping.grant_revocable(&contexts, ReadWrite)?;

    mapping.unmap()?; // <- error[E0505]: `grant` still borrows `mapping`
    grant.revoke()?;
    Ok(())
}
