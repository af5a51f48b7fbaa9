//! Rule: a registered buffer's pages are not unmapped while the registration lives.
//! Prevents: cuMemUnmap of pages NCCL holds registered (and may have exported to peers): faults or silent corruption in later collectives.
//! Expected: E0499 (`buffer` borrowed mutably again while the registration borrows it).

use cuda_vmm::interop::nccl::Comm;
use cuda_vmm::{Device, ReadWrite, VirtualBuffer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let stream = cudarc::driver::CudaContext::new(0)?.new_stream()?;
    let comm = Comm::from_devices(&[stream])?.remove(0);
    let mut buffer = VirtualBuffer::new(1 << 30, &[Device::get(0)?], ReadWrite)?;
    let registration = comm.register(&mut buffer, ..)?;
    buffer.unmap(..)?; // <- error[E0499]: NCCL still holds the pages
    drop(registration);
    Ok(())
}
