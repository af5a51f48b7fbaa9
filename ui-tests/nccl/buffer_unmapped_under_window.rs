//! Rule: a buffer's pages under a window are not unmapped, shrunk or regranted while the window lives.
//! Prevents: cuMemUnmap of pages NCCL registered as a window and exported to the other ranks, which keep writing them.
//! Expected: E0499 (`buffer` borrowed mutably again while the window borrows it).

use cuda_vmm::interop::nccl::Comm;
use cuda_vmm::owned::PageOptions;
use cuda_vmm::{Device, ReadWrite, VirtualBuffer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let stream = cudarc::driver::CudaContext::new(0)?.new_stream()?;
    let mut comm = Comm::from_devices(&[stream])?.remove(0);
    let device = Device::get(0)?;
    let mut buffer = VirtualBuffer::with_options(1 << 30, &[device], ReadWrite, PageOptions::posix_fd())?;
    buffer.grow(device, 2 << 20)?;
    let window = comm.register_window(&mut buffer, ..2 << 20)?;
    buffer.unmap(..)?; // <- error[E0499]: the other ranks still write the pages
    drop(window);
    Ok(())
}
