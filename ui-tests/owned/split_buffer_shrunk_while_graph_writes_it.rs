//! Rule: a buffer split into its growth and its views (`split_growth`) grows while a graph writes through a view, but is not shrunk (or unmapped) while the split lives.
//! Prevents: cuMemUnmap and cuMemRelease of a page that the next cuGraphLaunch writes (an illegal address, and a sticky error).
//! Expected: E0499 (`buffer` borrowed mutably by the split, and again by `shrink`).

use cuda_vmm::{Context, Device, Error, PinnedBuffer, ReadWrite, Stream, VirtualBuffer, stream::Graph};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let page = 2 << 20;
    let mut buffer = VirtualBuffer::new(4 * page, &[device], ReadWrite)?;
    buffer.grow(device, page)?;
    let input = PinnedBuffer::from_slice(&context, &vec![1u32; page / 4])?;
    let mut stream = Stream::new(&context)?;
    let (growth, mut views) = buffer.split_growth();
    let mut first = views.slice_bytes_mut::<u32>(..page)?;
    let graph = Graph::capture(&mut stream, |c| c.copy_from_host(&mut first, &input).map(drop))?;
    growth.grow(device, page)?; // another page: no captured address moves
    buffer.shrink()?; // <- error[E0499]: the graph writes the first page at every replay
    cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph))
}
