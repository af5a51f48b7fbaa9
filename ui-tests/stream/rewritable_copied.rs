//! Rule: a rewritable slot is one writer: it is neither `Copy` nor `Clone`, so two writes through it are ordered on its stream.
//! Prevents: two copies of a slot lent to writes on two streams at once, unordered (bytes of either write, or a mix).
//! Expected: E0382 (`slot` moved into `other`, then used).

use cuda_vmm::{Context, Device, DeviceBuffer, Error, PinnedBuffer, Stream};

fn main() -> Result<(), Error> {
    let context = Context::new(Device::get(0)?)?;
    let mut buffer = DeviceBuffer::<u32>::zeroed(&context, 1024)?;
    let mut view = buffer.as_mut_slice();
    let input = PinnedBuffer::from_slice(&context, &[1u32; 1024])?;
    let (one, two) = (Stream::new(&context)?, Stream::new(&context)?);
    cuda_vmm::scope(|s| {
        let mut slot = s.on(&one).rewritable(&mut view)?;
        let mut other = slot;
        s.on(&two).copy_from_host(&mut other, &input)?;
        s.on(&one).copy_from_host(&mut slot, &input)?; // <- error[E0382]: `slot` was moved into `other`
        Ok(())
    })
}
