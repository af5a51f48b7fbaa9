//! Rule: a mapping does not give out its address; only the `Access` that `grant` returns does.
//! Prevents: kernels or raw driver calls using a mapped address before cuMemSetAccess (the device faults).
//! Expected: E0599 (no method `as_raw_ptr` on `Mapping`).

use cuda_vmm::{Device, Error, Granularity, PhysicalAllocation, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mapping = reservation.region().map(&memory)?;

    let address = mapping.as_raw_ptr(); // <- error[E0599]: grant access first
    println!("kernel argument: {address:#x}");
    Ok(())
}
