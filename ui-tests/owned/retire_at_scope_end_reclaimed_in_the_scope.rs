//! Rule: a page retired at the scope's end (`ScopedBuffer::retire_at_scope_end`) is released only after the scope: the calls that finish such a retire take the buffer exclusively, which the scoped handle holds until the scope's wait has returned.
//! Prevents: cuMemUnmap and cuMemRelease of the retired page under the kernel queued before the retire, which no event orders the release after (use after release).
//! Expected: E0499 (`cache` borrowed mutably by `in_scope` for the whole scope, and again by `reclaim`).

use cuda_vmm::{Device, Error, ReadWrite, Stream, VirtualBuffer};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let mut cache = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    cache.grow(device, 2 << 20)?;
    let stream = Stream::new(&cache.contexts()[0])?;
    cuda_vmm::scope(|s| {
        let (work, kv) = (s.on(&stream), cache.in_scope(s));
        let mut slot = kv.write::<u8>(..2 << 20)?;
        work.memset(&mut slot, 0)?;
        kv.retire_at_scope_end(..2 << 20)?;
        cache.reclaim()?; // <- error[E0499]: the release under the queued memset
        kv.reclaim()?;
        Ok(())
    })
}
