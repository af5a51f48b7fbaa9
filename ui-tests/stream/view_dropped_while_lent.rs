//! Rule: a view lent to queued work is given up until the scope has waited for that work: it cannot be dropped (nor used) meanwhile.
//! Prevents: ending the borrow that keeps the memory's owner alive, so a cuMemFree or cuMemUnmap could run under the queued memset.
//! Expected: E0382 (use of `view` after it was moved into the queued memset, which keeps it until the wait).

use cuda_vmm::{Context, Device, DeviceBuffer, Error, Stream};

fn main() -> Result<(), Error> {
    let context = Context::new(Device::get(0)?)?;
    let mut buffer = DeviceBuffer::<u32>::zeroed(&context, 1024)?;
    let view = buffer.as_mut_slice();
    let stream = Stream::new(&context)?;

    cuda_vmm::scope(|s| {
        s.on(&stream).memset(view, 0)?;
        drop(view); // <- error[E0382]: the queued memset holds `view` until the scope waits
        Ok(())
    })
}
