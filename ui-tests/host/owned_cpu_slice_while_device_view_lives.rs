//! Rule: an owned host mapping gives the CPU a slice only while no device view of it exists.
//! Prevents: a device copy reading bytes a Rust `&mut [T]` writes meanwhile (undefined behaviour).
//! Expected: E0502 (`host` borrowed mutably while a view borrows it).

use cuda_vmm::host::{HostAllocation, OwnedHostMapping};
use cuda_vmm::{Device, Error, Granularity, ReadWrite};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let mut host = OwnedHostMapping::new(HostAllocation::near(device, size)?, &[device], ReadWrite)?;
    let view = host.slice::<u32>()?;

    let mut cpu = host.host_access(); // <- error[E0502]: `host` is borrowed by `view`
    cpu.as_mut_slice::<u32>()?.fill(1);
    view.to_vec()?;
    Ok(())
}
