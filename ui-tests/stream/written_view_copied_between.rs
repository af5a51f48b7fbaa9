//! Rule: device memory a queued write writes is no source of the synchronous copies between views (`copy_between`).
//! Prevents: a cuMemcpyDtoD (or a staged copy) outside the scope's streams reading bytes the queued memset is still writing.
//! Expected: E0308 (a `DeviceInFlight` is not a `&DeviceSlice`).

use cuda_vmm::{Context, Device, DeviceBuffer, Error, peer::Route, Stream};

fn main() -> Result<(), Error> {
    let context = Context::new(Device::get(0)?)?;
    let mut buffer = DeviceBuffer::<u32>::zeroed(&context, 1024)?;
    let mut other = DeviceBuffer::<u32>::zeroed(&context, 1024)?;
    let mut view = buffer.as_mut_slice();
    let stream = Stream::new(&context)?;

    cuda_vmm::scope(|s| {
        let written = s.on(&stream).memset(&mut view, 7)?;
        cuda_vmm::copy_between(&mut other.as_mut_slice(), &written, Route::Auto)?; // <- error[E0308]: the queued memset may still be writing the source
        Ok(())
    })
}
