//! Rule: only memory created shareable (a `ShareableAllocation<PosixFd>`) can be exported.
//! Prevents: cuMemExportToShareableHandle of memory created without requestedHandleTypes (refused at run time, or a handle of the wrong kind).
//! Expected: E0599 (no method `export` on `PhysicalAllocation`).

use cuda_vmm::{Device, Error, Granularity, PhysicalAllocation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;

    let exported = memory.export()?; // <- error[E0599]: no method named `export`
    drop(exported);
    Ok(())
}
