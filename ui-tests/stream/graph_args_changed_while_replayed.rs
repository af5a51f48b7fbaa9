//! Rule: a graph's kernel arguments change only between scopes, never while a replay of it may run.
//! Prevents: cuGraphExecKernelNodeSetParams racing a cuGraphLaunch still in flight (the replay reads arguments half old, half new).
//! Expected: E0502 (`graph` borrowed by the scope's replay and mutably by `set_kernel_args`).

use cuda_vmm::{Context, Device, DeviceBuffer, Error, Module, Stream, stream::Graph};

fn main() -> Result<(), Error> {
    let context = Context::new(Device::get(0)?)?;
    let module = Module::load_ptx(&context, c"")?;
    let kernel = module.function(c"fill")?;
    let mut stream = Stream::new(&context)?;
    let mut buffer = DeviceBuffer::<u32>::zeroed(&context, 256)?;
    let mut view = buffer.as_mut_slice();
    let mut node = None;
    let mut graph = Graph::capture(&mut stream, |c| {
        node = Some(unsafe { c.launch(&kernel, (1, 1, 1), (256, 1, 1), (&mut view, 1u32))? }.1);
        Ok(())
    })?;
    cuda_vmm::scope(|s| {
        s.on(&stream).launch_graph(&graph)?;
        if let Some(node) = node {
            unsafe { graph.set_kernel_args(node, (7u32, 2u32))? }; // <- error[E0502]: the replay may still read the arguments
        }
        Ok(())
    })
}
