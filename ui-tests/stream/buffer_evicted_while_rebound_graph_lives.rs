//! Rule: a rebound graph borrows the buffers it was given, so their ranges are not evicted (nor unmapped, shrunk or regranted) while it lives.
//! Prevents: cuMemUnmap and cuMemRelease of a page that the next cuGraphLaunch of the rebound graph writes (an illegal address).
//! Expected: E0499 (`buffer` borrowed mutably by the rebind, for the graph's life, and again by `evict`).

use cuda_vmm::{Context, Device, Error, ReadWrite, Stream, VirtualBuffer, stream::Graph};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let mut stream = Stream::new(&context)?;
    let mut buffer = VirtualBuffer::new(2 << 20, &[device], ReadWrite)?;
    buffer.grow(device, 2 << 20)?;
    let mut view = buffer.slice_bytes_mut::<u32>(..)?;
    let parked = Graph::capture(&mut stream, |c| c.memset(&mut view, 0).map(drop))?.park();
    let graph = parked.rebind().writes(&mut buffer).finish()?;
    let evicted = buffer.evict(..)?; // <- error[E0499]: the graph writes these pages at every replay
    cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph))?;
    buffer.restore(evicted)?;
    Ok(())
}
