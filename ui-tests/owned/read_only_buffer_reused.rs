//! Rule: a read-only `VirtualBuffer` lent to a scope lends no range again for writing (`ScopedBuffer::reuse` is a method of the `ReadWrite` handle only).
//! Prevents: a copy or kernel writing pages granted CU_MEM_ACCESS_FLAGS_PROT_READ (the device refuses or faults).
//! Expected: E0599 (no method `reuse` on `ScopedBuffer<ReadOnly>`).

use cuda_vmm::{Context, Device, Error, ReadOnly, Stream, VirtualBuffer};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let stream = Stream::new(&context)?;
    let mut cache = VirtualBuffer::new(1 << 30, &[device], ReadOnly)?;
    cache.grow(device, 2 << 20)?;
    cuda_vmm::scope(|s| {
        let kv = cache.in_scope(s);
        let block = kv.reuse::<u32>(..4096, s.on(&stream))?; // <- error[E0599]: read-only pages
        println!("{block:?}");
        Ok(())
    })
}
