//! Rule: host memory mapped for the CPU has no other mapping (alias) while that mapping lives.
//! Prevents: a `&mut [T]` of bytes that a second mapping's device view can write meanwhile.
//! Expected: E0502 (`memory` borrowed shared while borrowed mutably).

use cuda_vmm::{Device, Error, Granularity, host::HostAllocation, ReadWrite, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let mut memory = HostAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(2 * size, 0)?;
    let (mut first, mut second) = reservation.region().split_at(size)?;
    let mut mapping = first.map_host(&mut memory)?;

    let alias = second.map(&memory)?; // <- error[E0502]: `memory` is borrowed mutably by `mapping`
    let mut cpu = mapping.grant_host(ReadWrite)?;
    cpu.as_mut_slice::<u32>()?[0] = 1;
    drop(alias);
    Ok(())
}
