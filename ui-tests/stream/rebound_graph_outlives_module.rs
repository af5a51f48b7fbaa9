//! Rule: a rebound graph borrows the module of its kernels, so the module is not unloaded while it lives.
//! Prevents: cuGraphLaunch of a kernel node whose module cuModuleUnload has unloaded.
//! Expected: E0505 (`module` moved into `drop` while the rebound graph borrows it).

use cuda_vmm::{Error, Module, stream::ParkedGraph};

fn rebind(parked: ParkedGraph, module: Module) -> Result<(), Error> {
    let graph = parked.rebind().module(&module).finish()?;
    drop(module); // <- error[E0505]: the graph's kernels are this module's
    drop(graph);
    Ok(())
}

fn main() {
    let _ = rebind;
}
