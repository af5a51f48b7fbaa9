//! Rule: a dma-buf export of a `VirtualBuffer`'s range borrows the buffer: it is not shrunk while the export lives.
//! Prevents: cuMemUnmap and cuMemRelease of the last page while a network adapter reaches it through its dma-buf descriptor.
//! Expected: E0502 (`buffer` borrowed mutably by `shrink` while the export borrows it).

use cuda_vmm::{Device, Error, ReadWrite, VirtualBuffer, ipc::DmaBufLayout};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let page = 2 << 20;
    let mut buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    buffer.grow(device, page)?;
    let export = buffer.export_dma_buf(.., DmaBufLayout::PerRun)?;

    buffer.shrink()?; // <- error[E0502]: `export` still borrows `buffer`
    println!("{:?}", export.range());
    Ok(())
}
