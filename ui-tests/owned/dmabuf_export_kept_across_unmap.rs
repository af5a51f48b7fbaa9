//! Rule: a dma-buf export of a `VirtualBuffer`'s range borrows the buffer: its pages are not unmapped while it lives.
//! Prevents: cuMemUnmap and cuMemRelease of pages a network adapter reaches through the exported dma-buf descriptors.
//! Expected: E0502 (`buffer` borrowed mutably by `unmap` while the export borrows it).

use cuda_vmm::{Device, Error, ReadWrite, VirtualBuffer, ipc::DmaBufLayout};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let page = 2 << 20;
    let mut buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    buffer.grow(device, page)?;
    let export = buffer.export_dma_buf(..page, DmaBufLayout::PerPage)?;

    buffer.unmap(..page)?; // <- error[E0502]: `export` still borrows `buffer`
    println!("{:?}", export.chunks());
    Ok(())
}
