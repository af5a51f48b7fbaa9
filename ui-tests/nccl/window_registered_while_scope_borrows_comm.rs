//! Rule: a window is registered only with exclusive use of its communicator.
//! Prevents: ncclCommWindowRegister (collective) interleaved with this rank's queued collectives: ranks out of step, a hang or a null window.
//! Expected: E0502 (`comm` borrowed mutably while the scope borrows it).

use cuda_vmm::interop::nccl::Comm;
use cuda_vmm::owned::GrantedMapping;

fn register_during_scope(mut comm: Comm, memory: &mut GrantedMapping) -> Result<(), cuda_vmm::Error> {
    comm.scope(|_s| -> Result<(), cuda_vmm::Error> {
        let _window = comm.register_window(memory, ..)?; // <- error[E0502]: collective, mid-scope
        Ok(())
    })
}

fn main() {
    let _ = register_during_scope;
}
