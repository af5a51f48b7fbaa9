//! Rule: a view of a `VirtualBuffer` cannot be kept across a shrink of the buffer.
//! Prevents: copies through a view after cuMemUnmap and cuMemRelease of the last page (use after unmap).
//! Expected: E0502 (`buffer` borrowed mutably by `shrink` while the view borrows it).

use cuda_vmm::{Device, Error, ReadWrite, VirtualBuffer};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let page = 2 << 20;
    let mut buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    buffer.grow(device, page)?;
    let view = buffer.slice_bytes::<u32>(..page)?;

    buffer.shrink()?; // <- error[E0502]: `view` still borrows `buffer`
    println!("{:?}", view.to_vec()?);
    Ok(())
}
