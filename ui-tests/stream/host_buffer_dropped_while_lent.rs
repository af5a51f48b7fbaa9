//! Rule: host memory lent to a queued copy is not dropped (here by assigning a new buffer) until the scope has waited for the copy.
//! Prevents: cuMemFreeHost of the buffer before the queued cuMemcpyHtoDAsync has read it: the DMA reads freed memory.
//! Expected: E0506 (assignment to `input`, which drops the old buffer, while the queued copy borrows it).

use cuda_vmm::{Context, Device, DeviceBuffer, Error, PinnedBuffer, Stream};

fn main() -> Result<(), Error> {
    let context = Context::new(Device::get(0)?)?;
    let mut buffer = DeviceBuffer::<u32>::zeroed(&context, 1024)?;
    let mut view = buffer.as_mut_slice();
    let mut input = PinnedBuffer::from_slice(&context, &[1u32; 1024])?;
    let stream = Stream::new(&context)?;

    cuda_vmm::scope(|s| {
        s.on(&stream).copy_from_host(&mut view, &input)?;
        input = PinnedBuffer::zeroed(&context, 1024)?; // <- error[E0506]: drops the buffer the queued copy reads
        Ok(())
    })?;
    println!("{}", input[0]);
    Ok(())
}
