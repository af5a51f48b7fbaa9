//! Rule: a graph is captured only on a stream that no scope holds (`Graph::capture` borrows it exclusively).
//! Prevents: a scope's memset, queued between its capture check and its enqueue, recorded into another thread's graph (replayed after the scope) while the driver writes that graph from two threads.
//! Expected: E0502 (the other thread's scope holds the stream shared).

use cuda_vmm::{Context, Device, DeviceBuffer, Error, Stream, stream::Graph};

fn main() -> Result<(), Error> {
    let context = Context::new(Device::get(0)?)?;
    let mut stream = Stream::new(&context)?;
    let mut buffer = DeviceBuffer::<u32>::zeroed(&context, 256)?;
    let mut view = buffer.as_mut_slice();
    std::thread::scope(|t| {
        let scoped = t.spawn(|| cuda_vmm::scope(|s| s.on(&stream).memset(&mut view, 0xab).map(drop)));
        let graph = Graph::capture(&mut stream, |_| Ok(())); // <- error[E0502]: the other thread's scope holds the stream
        drop(graph);
        scoped.join().map_err(|_| Error::ZeroSize { what: "thread" })?
    })
}
