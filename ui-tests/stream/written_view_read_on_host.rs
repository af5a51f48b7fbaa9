//! Rule: device memory a queued write writes is read only by work queued after it, never by the host inside the scope.
//! Prevents: a synchronous cuMemcpyDtoH on the legacy stream, which does not wait for the non-blocking one, reading bytes the queued copy is still writing.
//! Expected: E0599 (a `DeviceInFlight` has no `to_vec`).

use cuda_vmm::{Context, Device, DeviceBuffer, Error, PinnedBuffer, Stream};

fn main() -> Result<(), Error> {
    let context = Context::new(Device::get(0)?)?;
    let mut buffer = DeviceBuffer::<u32>::zeroed(&context, 1024)?;
    let mut view = buffer.as_mut_slice();
    let input = PinnedBuffer::from_slice(&context, &[1u32; 1024])?;
    let stream = Stream::new(&context)?;

    cuda_vmm::scope(|s| {
        let written = s.on(&stream).copy_from_host(&mut view, &input)?;
        println!("{:?}", written.to_vec()?); // <- error[E0599]: the queued copy may still be writing these bytes
        Ok(())
    })
}
