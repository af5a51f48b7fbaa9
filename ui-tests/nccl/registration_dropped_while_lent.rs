//! Rule: a registration is deregistered only after the scope that used its bytes has waited.
//! Prevents: ncclCommDeregister while an all-reduce queued on the registered bytes still runs.
//! Expected: E0505 (move out of `registration` while its view is lent to the scope).

use cuda_vmm::interop::nccl::{Comm, ReduceOp};
use cuda_vmm::{Device, ReadWrite, VirtualBuffer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let stream = cudarc::driver::CudaContext::new(0)?.new_stream()?;
    let comm = Comm::from_devices(&[stream])?.remove(0);
    let mut buffer = VirtualBuffer::new(1 << 30, &[Device::get(0)?], ReadWrite)?;
    let mut registration = comm.register(&mut buffer, ..)?;
    let mut view = registration.slice_bytes_mut::<f32>(..)?;
    comm.scope(|s| -> Result<(), cuda_vmm::Error> {
        s.all_reduce_in_place(&mut s.lend_mut(&mut view)?, ReduceOp::Sum)?;
        registration.deregister()?; // <- error[E0505]: the all-reduce still uses the bytes
        Ok(())
    })?;
    Ok(())
}
