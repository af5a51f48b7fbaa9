//! Rule: a view of a `VirtualBuffer` cannot outlive the buffer.
//! Prevents: copies through a view after the buffer's drop unmapped, released and freed everything.
//! Expected: E0505 (move out of `buffer` while the view borrows it).

use cuda_vmm::{Device, Error, ReadWrite, VirtualBuffer};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let page = 2 << 20;
    let buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    buffer.grow(device, page)?;
    let view = buffer.slice_bytes::<u32>(..page)?;

    drop(buffer); // <- error[E0505]: `view` still borrows `buffer`
    println!("{:?}", view.to_vec()?);
    Ok(())
}
