//! Rule: a graph that writes a claimed range of a `VirtualBuffer` keeps the range's pages mapped.
//! Prevents: a replay writing through pages that cuMemUnmap and cuMemRelease took from under the graph.
//! Expected: E0502 (`cache` borrowed mutably by `unmap` while the claim, its view and the graph borrow it).

use cuda_vmm::stream::Graph;
use cuda_vmm::{Device, Error, ReadWrite, Stream, VirtualBuffer};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let page = 2 << 20;
    let mut cache = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    cache.grow(device, page)?;
    let mut stream = Stream::new(&cache.contexts()[0])?;
    let mut claim = cache.claim_bytes_mut::<u32>(..page)?;
    let view = claim.view();
    let graph = Graph::capture(&mut stream, move |c| c.memset(view, 7).map(drop))?;
    cache.grow(device, page)?; // allowed: growth touches no claimed byte

    cache.unmap(..page)?; // <- error[E0502]: the claim still borrows `cache`
    cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph))?;
    Ok(())
}
