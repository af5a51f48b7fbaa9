//! Rule: only what outlives the scope can be lent to queued work: the closure's own values are dropped before the scope waits.
//! Prevents: cuMemFreeHost of a buffer (dropped as the closure returns) while the queued cuMemcpyDtoHAsync still writes it.
//! Expected: E0597 (`output` does not live as long as the scope).

use cuda_vmm::{Context, Device, DeviceBuffer, Error, PinnedBuffer, Stream};

fn main() -> Result<(), Error> {
    let context = Context::new(Device::get(0)?)?;
    let buffer = DeviceBuffer::<u32>::zeroed(&context, 1024)?;
    let stream = Stream::new(&context)?;

    cuda_vmm::scope(|s| {
        let mut output = PinnedBuffer::<u32>::zeroed(&context, 1024)?;
        s.on(&stream).copy_to_host(&mut output, buffer.as_slice())?; // <- error[E0597]: `output` is dropped before the wait
        Ok(())
    })
}
