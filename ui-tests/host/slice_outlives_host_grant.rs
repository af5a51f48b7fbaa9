//! Rule: a CPU slice of host memory does not outlive the CPU grant it came from.
//! Prevents: CPU reads and writes of a range whose grant has ended (and may be unmapped next).
//! Expected: E0505 (move out of `cpu` while borrowed).

use cuda_vmm::{Device, Error, Granularity, host::HostAllocation, ReadWrite, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let mut memory = HostAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut region = reservation.region();
    let mut mapping = region.map_host(&mut memory)?;
    let mut cpu = mapping.grant_host(ReadWrite)?;
    let slice = cpu.as_mut_slice::<u32>()?;

    drop(cpu); // <- error[E0505]: `cpu` is borrowed by `slice`
    slice[0] = 1;
    Ok(())
}
