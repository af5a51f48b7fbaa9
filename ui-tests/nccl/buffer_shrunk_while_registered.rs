//! Rule: a registered buffer does not shrink while the registration lives.
//! Prevents: cuMemUnmap and cuMemRelease of the last registered page under NCCL's registration.
//! Expected: E0499 (`buffer` borrowed mutably again while the registration borrows it).

use cuda_vmm::interop::nccl::Comm;
use cuda_vmm::{Device, ReadWrite, VirtualBuffer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let stream = cudarc::driver::CudaContext::new(0)?.new_stream()?;
    let comm = Comm::from_devices(&[stream])?.remove(0);
    let mut buffer = VirtualBuffer::new(1 << 30, &[Device::get(0)?], ReadWrite)?;
    let registration = comm.register(&mut buffer, ..)?;
    buffer.shrink()?; // <- error[E0499]: the last page is registered
    drop(registration);
    Ok(())
}
