//! Rule: the view a queued write hands back cannot be turned back into a host-readable `DeviceSlice` (`ScopedRead::lend` takes a token only the crate can make).
//! Prevents: `written.lend()` and a host read of what it gives: a synchronous cuMemcpyDtoH reading bytes the queued copy is still writing.
//! Expected: E0061 (`lend` takes the crate's token, which user code cannot name or make).

use cuda_vmm::{Context, Device, DeviceBuffer, Error, PinnedBuffer, stream::ScopedRead, Stream};

fn main() -> Result<(), Error> {
    let context = Context::new(Device::get(0)?)?;
    let mut buffer = DeviceBuffer::<u32>::zeroed(&context, 1024)?;
    let mut view = buffer.as_mut_slice();
    let input = PinnedBuffer::from_slice(&context, &[1u32; 1024])?;
    let stream = Stream::new(&context)?;

    cuda_vmm::scope(|s| {
        let written = s.on(&stream).copy_from_host(&mut view, &input)?;
        let lent = written.lend(); drop(lent); // <- error[E0061]: the queued copy may still be writing these bytes
        Ok(())
    })
}
