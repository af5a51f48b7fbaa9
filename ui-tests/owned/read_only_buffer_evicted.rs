//! Rule: only a `ReadWrite` `VirtualBuffer` evicts (a restore writes the bytes back through the buffer's own grant).
//! Prevents: a cuMemcpyHtoD of the restored bytes into pages granted PROT_READ, refused halfway through a restore.
//! Expected: E0599 (no method `evict` on `VirtualBuffer<ReadOnly>`).

use cuda_vmm::{Device, Error, ReadOnly, VirtualBuffer};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let page = 2 << 20;
    let mut buffer = VirtualBuffer::new(1 << 30, &[device], ReadOnly)?;
    buffer.grow(device, page)?;

    let evicted = buffer.evict(..page)?; // <- error[E0599]: no `evict` for a read-only buffer
    drop(evicted);
    Ok(())
}
