//! Rule: bytes read back inside a scope (`ScopedBuffer::read_back`) give the host nothing before the scope's wait: the view is a `DeviceInFlight`, lent only to queued work.
//! Prevents: a host read of bytes the queued writes (and the wait the read back queued) have not finished: stale bytes, or a copy racing the writer's kernel.
//! Expected: E0599 (`DeviceInFlight` has no `to_vec`).

use cuda_vmm::{Context, Device, Error, PinnedBuffer, ReadWrite, Stream, VirtualBuffer};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let stream = Stream::new(&context)?;
    let token = PinnedBuffer::from_slice(&context, &[1u32; 1024])?;
    let mut cache = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    cache.grow(device, 2 << 20)?;
    cuda_vmm::scope(|s| {
        let work = s.on(&stream);
        let kv = cache.in_scope(s);
        let mut slot = kv.write::<u32>(..4096)?;
        work.copy_from_host(&mut slot, &token)?;
        let history = kv.read_back::<u32>(..4096, work)?;
        let bytes = history.to_vec()?; // <- error[E0599]: the copy may not have run yet
        println!("{bytes:?}");
        Ok(())
    })
}
