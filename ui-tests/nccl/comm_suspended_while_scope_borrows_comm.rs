//! Rule: a communicator is suspended (and resumed) only with exclusive use of it (`&mut Comm`): no scope of it is open meanwhile.
//! Prevents: ncclCommSuspend releasing the communicator's buffers under collectives this rank queued and has not waited for.
//! Expected: E0502 (`comm` borrowed mutably while the scope borrows it).

use cuda_vmm::interop::nccl::Comm;

fn suspend_during_scope(mut comm: Comm) -> Result<(), cuda_vmm::Error> {
    comm.scope(|_s| -> Result<(), cuda_vmm::Error> {
        comm.suspend()?; // <- error[E0502]: the scope's collectives may still run
        Ok(())
    })
}

fn main() {
    let _ = suspend_during_scope;
}
