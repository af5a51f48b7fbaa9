//! Rule: a VMM address never becomes an owning `DeviceBuffer` (it has no constructor from an address).
//! Prevents: cuMemFree of a VMM address when the buffer drops (the mapping, not the buffer, owns it).
//! Expected: E0599 (no function `from_raw` on `DeviceBuffer`).

use cuda_vmm::{Context, Device, DeviceBuffer, Error, Granularity, PhysicalAllocation, ReadWrite, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut mapping = reservation.region().map(&memory)?;
    let access = mapping.grant(&context, ReadWrite)?;

    let buffer = DeviceBuffer::<u8>::from_raw(access.as_raw_ptr(), access.size()); // <- error[E0599]: no such constructor
    println!("{} bytes", buffer.len());
    Ok(())
}
