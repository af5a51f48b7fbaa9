//! Rule: a dma-buf export of a `VirtualBuffer`'s range borrows the buffer: its pages are not retired while it lives.
//! Prevents: cuMemUnmap and cuMemRelease of the retired pages (once the stream passes the retire) while a network adapter reaches them through the dma-buf descriptors.
//! Expected: E0502 (`buffer` borrowed mutably by `retire_after` while the export borrows it).

use cuda_vmm::{Context, Device, Error, ReadWrite, Stream, VirtualBuffer, ipc::DmaBufLayout};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let stream = Stream::new(&Context::new(device)?)?;
    let page = 2 << 20;
    let mut buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    buffer.grow(device, page)?;
    let export = buffer.export_dma_buf(..page, DmaBufLayout::PerPage)?;

    buffer.retire_after(&stream, ..page)?; // <- error[E0502]: `export` still borrows `buffer`
    println!("{:?}", export.chunks());
    Ok(())
}
