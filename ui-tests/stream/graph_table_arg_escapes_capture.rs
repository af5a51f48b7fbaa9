//! Rule: a graph table's kernel argument lives only inside the closure of the capture that uploads it.
//! Prevents: a kernel reading the table's addresses outside the graph, or before its upload, when they name retired pages.
//! Expected: E0521 (the borrowed argument escapes the closure).

use cuda_vmm::stream::{Graph, GraphTable, TableArg};
use cuda_vmm::{Context, Device, Error, Stream};

fn main() -> Result<(), Error> {
    let context = Context::new(Device::get(0)?)?;
    let mut table = GraphTable::<u32>::new(&context, 8, 1024, 2)?;
    let mut stream = Stream::new(&context)?;
    let mut kept: Option<&TableArg> = None;
    let _graph = Graph::capture_with_table(&mut stream, &mut table, |_, t| {
        kept = Some(t); // <- error[E0521]: `t` escapes the closure
        Ok(())
    })?;
    Ok(())
}
