//! Rule: a view of a `VirtualBuffer` cannot be kept across an eviction of its pages.
//! Prevents: copies through a view after cuMemUnmap and cuMemRelease of the evicted pages (use after unmap).
//! Expected: E0502 (`buffer` borrowed mutably by `evict` while the view borrows it).

use cuda_vmm::{Device, Error, ReadWrite, VirtualBuffer};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let page = 2 << 20;
    let mut buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    buffer.grow(device, page)?;
    let view = buffer.slice_bytes::<u32>(..page)?;

    let evicted = buffer.evict(..page)?; // <- error[E0502]: `view` still borrows `buffer`
    println!("{:?}", view.to_vec()?);
    buffer.restore(evicted)?;
    Ok(())
}
