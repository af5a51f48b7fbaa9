//! Rule: an `OwnedMapping` kept in a struct field has one grant in use at a time, as a borrowed one.
//! Prevents: a read-only grant widened (cuMemSetAccess again) under the views of the first grant.
//! Expected: E0499 (`engine.mapping` borrowed mutably twice).

use cuda_vmm::{Context, Device, Error, owned::OwnedMapping, PhysicalAllocation, ReadOnly, ReadWrite, owned::SharedReservation};

struct Engine {
    mapping: OwnedMapping,
}

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let page = 2 << 20;
    let reservation = SharedReservation::new(page, 0)?;
    let mut engine = Engine { mapping: reservation.map(0, PhysicalAllocation::new(device, page)?)? };
    let read_only = engine.mapping.grant(&context, ReadOnly)?;
    let view = read_only.slice::<u32>()?;

    let mut writable = engine.mapping.grant(&context, ReadWrite)?; // <- error[E0499]: `view` still borrows the first grant
    writable.slice_mut::<u32>()?.copy_from_host(&vec![0; view.len()])?;
    Ok(())
}
