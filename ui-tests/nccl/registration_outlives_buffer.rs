//! Rule: a registration does not outlive the buffer it registered.
//! Prevents: ncclCommDeregister after the buffer was unmapped and freed, with NCCL's collectives on a stale registration meanwhile.
//! Expected: E0597 (`buffer` dropped while the registration still borrows it).

use cuda_vmm::interop::nccl::Comm;
use cuda_vmm::{Device, ReadWrite, VirtualBuffer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let stream = cudarc::driver::CudaContext::new(0)?.new_stream()?;
    let comm = Comm::from_devices(&[stream])?.remove(0);
    let registration;
    {
        let mut buffer = VirtualBuffer::new(1 << 30, &[Device::get(0)?], ReadWrite)?;
        registration = comm.register(&mut buffer, ..)?; // <- error[E0597]: the buffer is dropped first
    }
    drop(registration);
    Ok(())
}
