//! Rule: a read-only grant gives only read-only views.
//! Prevents: a copy into memory granted CU_MEM_ACCESS_FLAGS_PROT_READ (the device faults).
//! Expected: E0599 (no method `slice_mut` on `Access<'_, ReadOnly>`).

use cuda_vmm::{Context, Device, Error, Granularity, PhysicalAllocation, ReadOnly, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut mapping = reservation.region().map(&memory)?;
    let mut access = mapping.grant(&context, ReadOnly)?;

    let mut view = access.slice_mut::<u32>()?; // <- error[E0599]: only a `ReadWrite` grant has `slice_mut`
    view.copy_from_host(&vec![0; view.len()])?;
    Ok(())
}
