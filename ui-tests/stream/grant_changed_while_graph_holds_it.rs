//! Rule: a buffer whose pages a graph captured keeps its access set while the graph lives.
//! Prevents: cuMemSetAccess revoking the device a replayed copy reads through (a fault under cuGraphLaunch).
//! Expected: E0502 (`buffer` borrowed shared by the captured view and mutably by `set_access`).

use cuda_vmm::{Context, Device, DeviceBuffer, Error, Granularity, ReadWrite, Stream, VirtualBuffer, stream::Graph};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let page = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let mut buffer = VirtualBuffer::new(page, &[device], ReadWrite)?;
    buffer.grow(device, page)?;
    let mut out = DeviceBuffer::<u32>::zeroed(&context, page / 4)?;
    let mut out_view = out.as_mut_slice();
    let mut stream = Stream::new(&context)?;
    let source = buffer.slice_bytes::<u32>(..)?;
    let graph = Graph::capture(&mut stream, |c| c.copy_from_device(&mut out_view, source).map(drop))?;
    buffer.set_access(&[device])?; // <- error[E0502]: the graph reads through the buffer's grants
    cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph))
}
