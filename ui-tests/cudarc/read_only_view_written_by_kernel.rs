//! Rule: a read-only view lent to cudarc is passed to a kernel only as a read-only argument (`&lent`), never as a written one (`&mut lent`).
//! Prevents: a kernel storing into a PROT_READ mapping: a fault, and a sticky error.
//! Expected: E0277 (`LaunchArgs` is not `PushKernelArg<&mut Lent<'_, u32>>`).

use cuda_vmm::{Context, Device, Granularity, PhysicalAllocation, ReadOnly, VirtualReservation};
use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};

fn fill(function: &CudaFunction) -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut mapping = reservation.region().map(&memory)?;
    let access = mapping.grant(&context, ReadOnly)?;
    let view = access.slice::<u32>()?;
    let stream = cudarc::driver::CudaContext::new(0)?.new_stream()?;

    cuda_vmm::interop::cudarc::scope(&stream, |s| -> Result<(), Box<dyn std::error::Error>> {
        let mut lent = s.lend(view)?;
        let mut launch = s.launch_builder(function)?;
        launch.arg(&mut lent); // <- error[E0277]: a read-only view is no written kernel argument
        unsafe { launch.launch(LaunchConfig::for_num_elems(1)) }?;
        Ok(())
    })
}

fn main() {}
