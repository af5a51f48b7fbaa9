//! Rule: page-locked host memory gives the host no `&mut [T]`; a `PinnedBuffer` is written through its own methods.
//! Prevents: cudarc's `memcpy_dtoh`, which takes every `&mut [T]` for pageable memory, returning while its DMA still writes the buffer, read by the host meanwhile.
//! Expected: E0596 (`PinnedBuffer` is not `DerefMut`).

use cuda_vmm::{Context, Device, Error, PinnedBuffer};

fn main() -> Result<(), Error> {
    let context = Context::new(Device::get(0)?)?;
    let mut buffer = PinnedBuffer::<u32>::zeroed(&context, 1024)?;
    let host: &mut [u32] = &mut buffer; // <- error[E0596]: a library could hand it to a copy that outlives the call
    host.fill(1);
    Ok(())
}
