//! Rule: a graph replayed over a scoped buffer's pages is parked outside the scope, which borrows it until its wait.
//! Prevents: cuGraphExecDestroy of the graph, and the end of what it was given, while its replay still runs.
//! Expected: E0597 (a parked graph owned by the closure is dropped before the scope's wait).

use cuda_vmm::{Device, Error, ReadWrite, Stream, VirtualBuffer, stream::Graph};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let mut cache = VirtualBuffer::new(2 << 20, &[device], ReadWrite)?;
    cache.grow(device, 2 << 20)?;
    let mut stream = Stream::new(&cache.contexts()[0])?;
    let graph = {
        let mut kv = cache.slice_bytes_mut::<u32>(..)?;
        Graph::capture(&mut stream, |c| c.memset(&mut kv, 0).map(drop))?.park()
    };
    cuda_vmm::scope(|s| {
        let parked = graph; // moved into the closure
        let cache = cache.in_scope(s);
        let mut replayed = parked.in_scope().buffer(&cache).finish()?; // <- error[E0597]: `parked` is dropped when the closure returns, before the wait
        s.on(&stream).launch_scoped_graph(&mut replayed)
    })
}
