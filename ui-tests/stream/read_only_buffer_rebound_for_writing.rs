//! Rule: a read-only buffer is never given to a rebind for writing (`Rebind::writes` takes a `VirtualBuffer<ReadWrite>`).
//! Prevents: a replayed memset or kernel writing pages granted PROT_READ to the graph's device (a fault, and a sticky error).
//! Expected: E0308 (a `VirtualBuffer<ReadOnly>` where a `VirtualBuffer<ReadWrite>` is needed).

use cuda_vmm::{Device, Error, ReadOnly, VirtualBuffer, stream::ParkedGraph};

fn rebind(parked: ParkedGraph, device: Device) -> Result<(), Error> {
    let mut buffer = VirtualBuffer::new(2 << 20, &[device], ReadOnly)?;
    buffer.grow(device, 2 << 20)?;
    let graph = parked.rebind().writes(&mut buffer).finish()?; // <- error[E0308]: its pages are granted read-only
    drop(graph);
    Ok(())
}

fn main() {
    let _ = rebind;
}
