//! Rule: a dma-buf export of a `VirtualBuffer`'s range borrows the buffer: its pages are not evicted while it lives.
//! Prevents: the evicted pages' cuMemUnmap and cuMemRelease while a network adapter writes them through the dma-buf descriptors.
//! Expected: E0502 (`buffer` borrowed mutably by `evict` while the export borrows it).

use cuda_vmm::{Device, Error, ReadWrite, VirtualBuffer, ipc::DmaBufLayout};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let page = 2 << 20;
    let mut buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    buffer.grow(device, page)?;
    let export = buffer.export_dma_buf(..page, DmaBufLayout::PerPage)?;

    let evicted = buffer.evict(..page)?; // <- error[E0502]: `export` still borrows `buffer`
    println!("{:?}", export.chunks());
    buffer.restore(evicted)?;
    Ok(())
}
