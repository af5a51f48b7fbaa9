//! Rule: no second window over memory a window holds.
//! Prevents: two ncclCommWindowRegister over the same bytes, whose deregistrations would tear down a window still in use.
//! Expected: E0499 (`memory` borrowed mutably twice).

use cuda_vmm::interop::nccl::Comm;
use cuda_vmm::owned::GrantedMapping;

fn two_windows(comm: &mut Comm, memory: &mut GrantedMapping) -> Result<(), cuda_vmm::Error> {
    let first = comm.register_window(memory, ..)?;
    let second = comm.register_window(memory, ..)?; // <- error[E0499]: the first window holds the memory
    drop((first, second));
    Ok(())
}

fn main() {
    let _ = two_windows;
}
