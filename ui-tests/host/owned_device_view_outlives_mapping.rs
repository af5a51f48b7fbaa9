//! Rule: a device view of an owned host mapping does not outlive it, though the mapping has no lifetime.
//! Prevents: copies through a view after `cuMemUnmap`, `cuMemRelease` and `cuMemAddressFree`.
//! Expected: E0505 (move out of `host` while borrowed).

use cuda_vmm::host::{HostAllocation, OwnedHostMapping};
use cuda_vmm::{Device, Error, Granularity, ReadOnly};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let host = OwnedHostMapping::new(HostAllocation::near(device, size)?, &[device], ReadOnly)?;
    let view = host.slice::<u32>()?;

    host.free()?; // <- error[E0505]: `host` is borrowed by `view`
    view.to_vec()?;
    Ok(())
}
