//! Rule: a view of a `VirtualBuffer` cannot be kept across a change of the buffer's access set.
//! Prevents: a copy through a view whose device cuMemSetAccess just revoked (or whose context was released).
//! Expected: E0502 (`buffer` borrowed mutably by `set_access` while the view borrows it).

use cuda_vmm::{Device, Error, ReadWrite, VirtualBuffer};

fn main() -> Result<(), Error> {
    let (gpu0, gpu1) = (Device::get(0)?, Device::get(1)?);
    let page = 2 << 20;
    let mut buffer = VirtualBuffer::new(1 << 30, &[gpu0, gpu1], ReadWrite)?;
    buffer.grow(gpu0, page)?;
    let view = buffer.slice_bytes_on::<u32>(gpu1, ..page)?;

    buffer.set_access(&[gpu0])?; // <- error[E0502]: `view` still borrows `buffer`
    println!("{:?}", view.to_vec()?);
    Ok(())
}
