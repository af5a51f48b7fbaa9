//! What an application that already depends on cudarc writes with this crate's interop, compiled
//! beside each cudarc dependency line of the matrix (one package per line, all with this source):
//! its own cudarc types go into `interop::cudarc::scope` and come out of it, so the line builds only
//! where cargo unified one cudarc for both crates.

use std::error::Error;
use std::sync::Arc;

use cuda_vmm::DeviceSliceMut;
use cuda_vmm::interop::cudarc::scope;
use cudarc::driver::CudaStream;

/// Zeroes `view` with cudarc's own memset, queued on `stream` inside the interop's scope.
///
/// # Errors
/// The scope's refusal, or cudarc's error.
pub fn zero(
    stream: &Arc<CudaStream>,
    view: &mut DeviceSliceMut<'_, u32>,
) -> Result<(), Box<dyn Error>> {
    scope(stream, |s| -> Result<(), Box<dyn Error>> {
        let mut lent = s.lend_mut(view)?;
        stream.memset_zeros(&mut lent)?;
        Ok(())
    })
}

/// Sums `view` over every rank of `comm`, in place, inside the communicator's scope.
///
/// # Errors
/// The scope's refusal, or NCCL's error.
#[cfg(feature = "nccl")]
pub fn sum(
    comm: &cuda_vmm::interop::nccl::Comm,
    view: &mut DeviceSliceMut<'_, f32>,
) -> Result<(), cuda_vmm::Error> {
    comm.scope(|s| -> Result<(), cuda_vmm::Error> {
        let mut lent = s.lend_mut(view)?;
        s.all_reduce_in_place(&mut lent, cuda_vmm::interop::nccl::ReduceOp::Sum)
    })
}
