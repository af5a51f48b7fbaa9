//! Rule: a CPU slice of an owned host mapping does not outlive it.
//! Prevents: CPU reads and writes of host memory after `cuMemUnmap` and `cuMemRelease`.
//! Expected: E0505 (move out of `host` while borrowed).

use cuda_vmm::host::{HostAllocation, OwnedHostMapping};
use cuda_vmm::{Device, Error, Granularity, ReadWrite};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let mut host = OwnedHostMapping::new(HostAllocation::near(device, size)?, &[device], ReadWrite)?;
    let mut cpu = host.host_access();
    let slice = cpu.as_mut_slice::<u32>()?;

    drop(host); // <- error[E0505]: `host` is borrowed by `slice`
    slice[0] = 1;
    Ok(())
}
