//! Rule: a read-only view lent to cudarc is only read: it is no `DevicePtrMut`, so no cudarc copy, memset or library call writes it.
//! Prevents: cuMemcpyHtoDAsync into a PROT_READ mapping, which fails on the stream, not at the call.
//! Expected: E0277 (`Lent<'_, u32>` is not `DevicePtrMut<u32>`).

use cuda_vmm::{Context, Device, Granularity, PhysicalAllocation, ReadOnly, VirtualReservation};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut mapping = reservation.region().map(&memory)?;
    let access = mapping.grant(&context, ReadOnly)?;
    let view = access.slice::<u32>()?;
    let stream = cudarc::driver::CudaContext::new(0)?.new_stream()?;
    let host = vec![0u32; view.len()];

    cuda_vmm::interop::cudarc::scope(&stream, |s| -> Result<(), Box<dyn std::error::Error>> {
        let mut lent = s.lend(view)?;
        stream.memcpy_htod(&host, &mut lent)?; // <- error[E0277]: a read-only view is not a copy destination
        Ok(())
    })
}
