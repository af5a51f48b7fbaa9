//! Rule: a mapping has no views; only the `Access` that `grant` returns has.
//! Prevents: copies to or from a mapping before cuMemSetAccess (the device faults on any access).
//! Expected: E0599 (no method `slice` on `Mapping`).

use cuda_vmm::{Device, Error, Granularity, PhysicalAllocation, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mapping = reservation.region().map(&memory)?;

    let view = mapping.slice::<u32>()?; // <- error[E0599]: grant access first
    println!("{:?}", view.to_vec()?);
    Ok(())
}
