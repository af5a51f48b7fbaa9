//! Rule: a growable buffer whose pages queued work uses cannot shrink (or unmap) until the scope has waited for that work.
//! Prevents: cuMemUnmap and cuMemRelease of a page while a queued memset (or copy, or kernel) still writes it: a fault, and a sticky error.
//! Expected: E0499 (`buffer` borrowed mutably by the lent view and again by `shrink`).

use cuda_vmm::{Context, Device, Error, Granularity, ReadWrite, Stream, VirtualBuffer};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let page = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let mut buffer = VirtualBuffer::new(4 * page, &[device], ReadWrite)?;
    buffer.grow(device, page)?;
    let mut view = buffer.slice_bytes_mut::<u32>(0..page)?;
    let stream = Stream::new(&context)?;

    cuda_vmm::scope(|s| {
        s.on(&stream).memset(&mut view, 0)?;
        buffer.shrink()?; // <- error[E0499]: the queued memset still writes the last page
        Ok(())
    })
}
