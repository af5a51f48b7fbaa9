//! Rule: an `Evicted` handle is restored once (`restore` takes it by value).
//! Prevents: a second cuMemMap of new pages over the pages the first restore mapped.
//! Expected: E0382 (use of the moved `evicted`).

use cuda_vmm::{Device, Error, ReadWrite, VirtualBuffer};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let page = 2 << 20;
    let mut buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    buffer.grow(device, page)?;
    let evicted = buffer.evict(..page)?;
    buffer.restore(evicted)?;

    buffer.restore(evicted)?; // <- error[E0382]: `evicted` was moved by the first restore
    Ok(())
}
