//! Rule: a view lent to a cudarc scope does not leave it (`'scope` is invariant), so nothing can queue work with it after the scope's wait.
//! Prevents: a cudarc copy queued after the scope has waited, on memory that may be unmapped meanwhile.
//! Expected: E0521 (borrowed data escapes the closure).

use cuda_vmm::{Context, Device, Granularity, PhysicalAllocation, ReadWrite, VirtualReservation};
use cuda_vmm::interop::cudarc::Lent;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut mapping = reservation.region().map(&memory)?;
    let access = mapping.grant(&context, ReadWrite)?;
    let view = access.slice::<u32>()?;
    let stream = cudarc::driver::CudaContext::new(0)?.new_stream()?;
    let mut kept: Option<Lent<'_, u32>> = None;

    cuda_vmm::interop::cudarc::scope(&stream, |s| -> Result<(), Box<dyn std::error::Error>> {
        kept = Some(s.lend(view)?); // <- error[E0521]: the lent view would outlive the scope
        Ok(())
    })?;
    let mut host = vec![0u32; view.len()];
    stream.memcpy_dtoh(&kept.unwrap(), &mut host)?;
    Ok(())
}
