//! Rule: host memory a queued download writes is not read (nor written) until the scope has waited for the download.
//! Prevents: reading bytes the DMA of cuMemcpyDtoHAsync is still writing: a data race on Rust memory.
//! Expected: E0502 (a shared borrow of `output` while the queued download borrows it mutably).

use cuda_vmm::{Context, Device, DeviceBuffer, Error, PinnedBuffer, Stream};

fn main() -> Result<(), Error> {
    let context = Context::new(Device::get(0)?)?;
    let buffer = DeviceBuffer::<u32>::zeroed(&context, 1024)?;
    let view = buffer.as_slice();
    let mut output = PinnedBuffer::<u32>::zeroed(&context, 1024)?;
    let stream = Stream::new(&context)?;

    cuda_vmm::scope(|s| {
        s.on(&stream).copy_to_host(&mut output, view)?;
        println!("{}", output[0]); // <- error[E0502]: the queued download may still be writing `output`
        Ok(())
    })
}
