//! Rule: a view lent to work queued on a cudarc stream keeps its mapping until the scope has waited for that stream.
//! Prevents: cuMemUnmap while cudarc's queued memset still writes the range: a fault, and a sticky error.
//! Expected: E0505 (move out of `mapping` while `access`, and the view lent to the scope, borrow it).

use cuda_vmm::{Context, Device, Granularity, PhysicalAllocation, ReadWrite, VirtualReservation};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut mapping = reservation.region().map(&memory)?;
    let mut access = mapping.grant(&context, ReadWrite)?;
    let mut view = access.slice_mut::<u32>()?;
    let stream = cudarc::driver::CudaContext::new(0)?.new_stream()?;

    cuda_vmm::interop::cudarc::scope(&stream, |s| -> Result<(), Box<dyn std::error::Error>> {
        stream.memset_zeros(&mut s.lend_mut(&mut view)?)?;
        mapping.unmap()?; // <- error[E0505]: cudarc's queued memset still uses the mapping
        Ok(())
    })
}
