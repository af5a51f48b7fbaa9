//! Rule: the CPU borrows host memory mutably only while no device view of the same mapping exists.
//! Prevents: a device write racing a Rust `&mut [T]` of the same bytes (undefined behaviour).
//! Expected: E0499 (`mapping` borrowed mutably twice).

use cuda_vmm::{Context, Device, Error, Granularity, host::HostAllocation, ReadWrite, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let mut memory = HostAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut region = reservation.region();
    let mut mapping = region.map_host(&mut memory)?;
    let mut on_device = mapping.grant(&context, ReadWrite)?;
    let mut view = on_device.slice_mut::<u32>()?;

    let mut cpu = mapping.grant_host(ReadWrite)?; // <- error[E0499]: `mapping` is borrowed by `on_device`
    let slice = cpu.as_mut_slice::<u32>()?;
    view.copy_from_host(slice)?;
    Ok(())
}
