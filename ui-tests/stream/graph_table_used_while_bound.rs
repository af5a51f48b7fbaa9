//! Rule: a graph table bound to a scoped graph is held by it for the whole scope.
//! Prevents: cuMemFree of the table's device array, or a host write of its staging memory, under a queued replay.
//! Expected: E0502 (the table is used while the scoped graph borrows it exclusively).

use cuda_vmm::stream::{Graph, GraphTable};
use cuda_vmm::{Context, Device, Error, Stream};

fn main() -> Result<(), Error> {
    let context = Context::new(Device::get(0)?)?;
    let mut table = GraphTable::<u32>::new(&context, 8, 1024, 2)?;
    let mut stream = Stream::new(&context)?;
    let parked = Graph::capture_with_table(&mut stream, &mut table, |_, _| Ok(()))?.park();
    cuda_vmm::scope(|s| {
        let work = s.on(&stream);
        let mut graph = parked.in_scope().table(&mut table, work).finish()?;
        let _ = table.capacity(); // <- error[E0502]: the scoped graph holds the table until the scope's wait
        work.launch_scoped_graph(&mut graph)
    })
}
