//! Rule: a view of a `VirtualBuffer` cannot be kept across an unmap of the buffer's pages.
//! Prevents: copies through a view after cuMemUnmap and cuMemRelease of the page it reads (use after unmap).
//! Expected: E0502 (`buffer` borrowed mutably by `unmap` while the view borrows it).

use cuda_vmm::{Device, Error, ReadWrite, VirtualBuffer};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let page = 2 << 20;
    let mut buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    buffer.grow(device, page)?;
    buffer.grow(device, page)?;
    let view = buffer.slice_bytes::<u32>(page..2 * page)?;

    buffer.unmap(page..2 * page)?; // <- error[E0502]: `view` still borrows `buffer`
    println!("{:?}", view.to_vec()?);
    Ok(())
}
