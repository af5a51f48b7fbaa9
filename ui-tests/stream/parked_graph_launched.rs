//! Rule: a parked graph is not launched: it borrows nothing, so only a rebind (which checks every range it touches) gives a graph to launch.
//! Prevents: cuGraphLaunch of a graph whose captured range is evicted (unmapped and released): an illegal address, and a sticky error.
//! Expected: E0308 (`launch_graph` takes a `Graph`, and a `ParkedGraph` is none).

use cuda_vmm::{Context, Device, Error, ReadWrite, Stream, VirtualBuffer, stream::Graph};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let mut stream = Stream::new(&context)?;
    let mut buffer = VirtualBuffer::new(2 << 20, &[device], ReadWrite)?;
    buffer.grow(device, 2 << 20)?;
    let mut view = buffer.slice_bytes_mut::<u32>(..)?;
    let parked = Graph::capture(&mut stream, |c| c.memset(&mut view, 0).map(drop))?.park();
    let evicted = buffer.evict(..)?;
    cuda_vmm::scope(|s| s.on(&stream).launch_graph(&parked))?; // <- error[E0308]: the range is evicted
    buffer.restore(evicted)?;
    Ok(())
}
