//! Rule: a captured graph does not outlive a view it captured (it borrows every view for its whole life).
//! Prevents: cuGraphLaunch of a graph whose captured memset writes memory that cuMemFree has released (an illegal address).
//! Expected: E0597 (`buffer` dropped at the end of its block while the graph still borrows it).

use cuda_vmm::{Context, Device, DeviceBuffer, Error, Stream, stream::Graph};

fn main() -> Result<(), Error> {
    let context = Context::new(Device::get(0)?)?;
    let mut stream = Stream::new(&context)?;
    let graph;
    {
        let mut buffer = DeviceBuffer::<u32>::zeroed(&context, 256)?;
        let view = buffer.as_mut_slice(); // <- error[E0597]: `buffer` does not live as long as the graph
        graph = Graph::capture(&mut stream, move |c| c.memset(view, 0).map(drop))?;
    }
    cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph))
}
