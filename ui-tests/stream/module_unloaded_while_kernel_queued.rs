//! Rule: the module of a queued kernel stays loaded until the scope has waited for the kernel.
//! Prevents: cuModuleUnload while its kernel is queued or running.
//! Expected: E0505 (move out of `module` while the queued launch borrows its kernel).

use cuda_vmm::{Context, Device, DeviceBuffer, Error, Module, Stream};

fn main() -> Result<(), Error> {
    let context = Context::new(Device::get(0)?)?;
    let mut buffer = DeviceBuffer::<u32>::zeroed(&context, 1024)?;
    let mut view = buffer.as_mut_slice();
    let module = Module::load_ptx(&context, c".version 7.0\n.target sm_52\n.address_size 64\n.visible .entry k(.param .u64 p) { ret; }\n")?;
    let kernel = module.function(c"k")?;
    let stream = Stream::new(&context)?;

    cuda_vmm::scope(|s| {
        // Unsafe for the kernel's unchecked signature only; the borrows are checked as always.
        unsafe { s.on(&stream).launch(&kernel, (1, 1, 1), (1, 1, 1), (&mut view,)) }?;
        drop(module); // <- error[E0505]: the queued kernel belongs to `module`
        Ok(())
    })
}
