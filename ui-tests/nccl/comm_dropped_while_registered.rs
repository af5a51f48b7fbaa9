//! Rule: a registration does not outlive its communicator.
//! Prevents: ncclCommDeregister on a destroyed communicator (a use after free inside NCCL).
//! Expected: E0505 (move out of `comm` while the registration borrows it).

use cuda_vmm::interop::nccl::Comm;
use cuda_vmm::{Device, ReadWrite, VirtualBuffer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let stream = cudarc::driver::CudaContext::new(0)?.new_stream()?;
    let comm = Comm::from_devices(&[stream])?.remove(0);
    let mut buffer = VirtualBuffer::new(1 << 30, &[Device::get(0)?], ReadWrite)?;
    let registration = comm.register(&mut buffer, ..)?;
    drop(comm); // <- error[E0505]: the registration still uses the communicator
    drop(registration);
    Ok(())
}
