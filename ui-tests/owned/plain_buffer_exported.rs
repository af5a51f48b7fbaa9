//! Rule: only an `ExportableBuffer` (every page it creates exportable as a POSIX fd) is exported; a plain `VirtualBuffer` has no `export`.
//! Prevents: cuMemExportToShareableHandle of pages created without requestedHandleTypes (refused by the driver for each page).
//! Expected: E0599 (no method `export` on `VirtualBuffer`).

use cuda_vmm::{Device, Error, ReadWrite, VirtualBuffer};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    buffer.grow(device, 2 << 20)?;

    let exported = buffer.export()?; // <- error[E0599]: no method named `export`
    drop(exported);
    Ok(())
}
