//! Rule: a cudarc kernel launched on a stream of `cuda_vmm::scope` (`ScopedStream::launch_cudarc`) is borrowed until the scope's wait: one loaded inside the closure cannot be launched.
//! Prevents: cuModuleUnload of the kernel's module (its `CudaFunction` dropped) while the queued launch has not run.
//! Expected: E0597 (`kernel` dropped at the end of the closure while the launch borrows it for the scope).

use cuda_vmm::{Context, Device, Error, Stream};
use cudarc::driver::{CudaContext, LaunchConfig};
use cudarc::nvrtc::Ptx;

fn main() -> Result<(), Error> {
    let context = Context::new(Device::get(0)?)?;
    let stream = Stream::new(&context)?;
    let cudarc = CudaContext::new(0).unwrap();
    cuda_vmm::scope(|s| {
        let kernel = cudarc.load_module(Ptx::from_src("")).unwrap().load_function("k").unwrap();
        let config = LaunchConfig::for_num_elems(1);
        // SAFETY: `k` takes one u32.
        unsafe { s.on(&stream).launch_cudarc(&kernel, config, (1u32,))? }; // <- error[E0597]: unloaded before the wait
        Ok(())
    })
}
