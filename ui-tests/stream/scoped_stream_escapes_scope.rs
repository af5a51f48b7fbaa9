//! Rule: a scoped stream cannot leave its scope, so no work is queued on it after the scope has waited.
//! Prevents: a copy queued after the wait, borrowing memory that may be freed while the DMA runs.
//! Expected: E0521 (borrowed data escapes outside of the closure).

use cuda_vmm::{Context, Device, Error, Stream};

fn main() -> Result<(), Error> {
    let context = Context::new(Device::get(0)?)?;
    let stream = Stream::new(&context)?;
    let mut escaped = None;

    cuda_vmm::scope(|s| {
        escaped = Some(s.on(&stream)); // <- error[E0521]: `s` is only valid inside the closure
        Ok(())
    })?;
    drop(escaped);
    Ok(())
}
