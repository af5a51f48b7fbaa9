//! Rule: a `DeviceSlice` is read-only; only a `DeviceSliceMut` has write methods.
//! Prevents: a copy into memory granted CU_MEM_ACCESS_FLAGS_PROT_READ (the device faults).
//! Expected: E0599 (no method `copy_from_host` on `DeviceSlice`).

use cuda_vmm::{Context, Device, Error, Granularity, PhysicalAllocation, ReadOnly, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut mapping = reservation.region().map(&memory)?;
    let access = mapping.grant(&context, ReadOnly)?;

    let view = access.slice::<u32>()?;
    view.copy_from_host(&vec![0; view.len()])?; // <- error[E0599]: a `DeviceSlice` cannot be written
    Ok(())
}
