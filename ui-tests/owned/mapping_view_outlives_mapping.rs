//! Rule: a view of an `OwnedMapping` cannot outlive the mapping, though the mapping has no lifetime.
//! Prevents: copies through a view after cuMemUnmap and cuMemRelease of the owned memory (use after unmap).
//! Expected: E0505 (move out of `mapping` while the view borrows it).

use cuda_vmm::{Context, Device, Error, PhysicalAllocation, ReadWrite, owned::SharedReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let page = 2 << 20;
    let reservation = SharedReservation::new(4 * page, 0)?;
    let mut mapping = reservation.map(0, PhysicalAllocation::new(device, page)?)?;
    let mut access = mapping.grant(&context, ReadWrite)?;
    let view = access.slice_mut::<u32>()?;

    mapping.unmap()?; // <- error[E0505]: `view` still borrows `mapping`
    println!("{:?}", view.to_vec()?);
    Ok(())
}
