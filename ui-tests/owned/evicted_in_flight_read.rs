//! Rule: the bytes of an eviction in flight (`ScopedBuffer::evict`) are not read before its copies have completed.
//! Prevents: a host read of pinned memory that cuMemcpyDtoHAsync is still writing (a data race on Rust memory).
//! Expected: E0599 (`EvictedInFlight` has no `host_bytes`: only the `Evicted` of its `wait` has).

use cuda_vmm::{Context, Device, Error, ReadWrite, Stream, VirtualBuffer};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let stream = Stream::new(&Context::new(device)?)?;
    let mut cache = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    cache.grow(device, 2 << 20)?;
    cuda_vmm::scope(|s| {
        let asleep = cache.in_scope(s).evict(s.on(&stream), ..)?;

        let first = asleep.host_bytes()[0]; // <- error[E0599]: the copy may still be writing the bytes
        assert_eq!(first, 0);
        Ok(())
    })
}
