//! Rule: a growable buffer whose pages a graph captured is not shrunk (or unmapped) while the graph lives; growing it is fine.
//! Prevents: cuMemUnmap and cuMemRelease of a page that the next cuGraphLaunch reads (an illegal address, and a sticky error).
//! Expected: E0502 (`buffer` borrowed shared by the captured view and mutably by `shrink`).

use cuda_vmm::{Context, Device, DeviceBuffer, Error, Granularity, ReadWrite, Stream, VirtualBuffer, stream::Graph};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let page = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let mut buffer = VirtualBuffer::new(4 * page, &[device], ReadWrite)?;
    buffer.grow(device, page)?;
    let mut out = DeviceBuffer::<u32>::zeroed(&context, page / 4)?;
    let mut out_view = out.as_mut_slice();
    let mut stream = Stream::new(&context)?;
    let source = buffer.slice_bytes::<u32>(..page)?;
    let graph = Graph::capture(&mut stream, |c| c.copy_from_device(&mut out_view, source).map(drop))?;
    buffer.grow(device, page)?; // other pages: no captured address moves
    buffer.shrink()?; // <- error[E0502]: the graph reads the first page at every replay
    cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph))
}
