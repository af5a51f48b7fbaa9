//! Rule: a view cannot outlive the buffer it views.
//! Prevents: copies through a view after cuMemFree (use after free).
//! Expected: E0505 (move out of `buffer` while borrowed).

use cuda_vmm::{Context, Device, DeviceBuffer, Error};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let buffer = DeviceBuffer::from_host(&context, &[1u32, 2, 3, 4])?;
    let view = buffer.as_slice();

    buffer.free()?; // <- error[E0505]: `view` still borrows `buffer`
    println!("{:?}", view.to_vec()?);
    Ok(())
}
