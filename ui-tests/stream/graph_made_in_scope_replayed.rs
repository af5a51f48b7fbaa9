//! Rule: a graph replayed in a scope lives until the scope has waited for the replay (it is borrowed for the scope).
//! Prevents: cuGraphExecDestroy of a graph, and the end of its borrows, while its replay still runs.
//! Expected: E0597 (a graph made inside the closure is dropped before the scope's wait).

use cuda_vmm::{Context, Device, DeviceBuffer, Error, Stream, stream::Graph};

fn main() -> Result<(), Error> {
    let context = Context::new(Device::get(0)?)?;
    let mut stream = Stream::new(&context)?;
    let mut buffer = DeviceBuffer::<u32>::zeroed(&context, 256)?;
    let mut view = buffer.as_mut_slice();
    cuda_vmm::scope(|s| {
        let graph = Graph::capture(&mut stream, |c| c.memset(&mut view, 0).map(drop))?;
        s.on(&stream).launch_graph(&graph)?; // <- error[E0597]: `graph` is dropped when the closure returns, before the wait
        Ok(())
    })
}
