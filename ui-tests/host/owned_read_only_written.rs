//! Rule: an owned host mapping granted `ReadOnly` to its devices gives them no writable view.
//! Prevents: a device write to a mapping the driver granted `PROT_READ`.
//! Expected: E0599 (no method `slice_mut` on `OwnedHostMapping<ReadOnly>`).

use cuda_vmm::host::{HostAllocation, OwnedHostMapping};
use cuda_vmm::{Device, Error, Granularity, ReadOnly};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let mut host = OwnedHostMapping::new(HostAllocation::near(device, size)?, &[device], ReadOnly)?;

    let mut view = host.slice_mut::<u32>()?; // <- error[E0599]: a read-only grant has no writable view
    view.copy_from_host(&[1])?;
    Ok(())
}
