//! Rule: a view lent to queued work cannot be used again until the scope has waited for that work.
//! Prevents: a synchronous write racing the queued copy into the same memory (the legacy stream does not wait for a non-blocking one).
//! Expected: E0499 (a second mutable borrow of `view` while the queued copy holds the first).

use cuda_vmm::{Context, Device, DeviceBuffer, Error, PinnedBuffer, Stream};

fn main() -> Result<(), Error> {
    let context = Context::new(Device::get(0)?)?;
    let mut buffer = DeviceBuffer::<u32>::zeroed(&context, 1024)?;
    let mut view = buffer.as_mut_slice();
    let input = PinnedBuffer::from_slice(&context, &[1u32; 1024])?;
    let stream = Stream::new(&context)?;

    cuda_vmm::scope(|s| {
        s.on(&stream).copy_from_host(&mut view, &input)?;
        view.copy_from_host(&[2; 1024])?; // <- error[E0499]: the queued copy still borrows `view`
        Ok(())
    })
}
