//! Rule: a read-only `VirtualBuffer` has no writable view.
//! Prevents: a copy into pages granted CU_MEM_ACCESS_FLAGS_PROT_READ (the device refuses or faults).
//! Expected: E0599 (no method `slice_mut` on `VirtualBuffer<ReadOnly>`).

use cuda_vmm::{Device, Error, ReadOnly, VirtualBuffer};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let page = 2 << 20;
    let mut buffer = VirtualBuffer::new(1 << 30, &[device], ReadOnly)?;
    buffer.grow(device, page)?;

    buffer.slice_bytes_mut::<u32>(..page)?.copy_from_host(&[0; 1024])?; // <- error[E0599]: read-only pages
    Ok(())
}
