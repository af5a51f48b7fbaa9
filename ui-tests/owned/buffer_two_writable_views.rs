//! Rule: a `VirtualBuffer` hands out one writable view at a time (split it for disjoint parts).
//! Prevents: two writers of one range whose copies race on the device.
//! Expected: E0499 (`buffer` borrowed mutably twice).

use cuda_vmm::{Device, Error, ReadWrite, VirtualBuffer};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let page = 2 << 20;
    let mut buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    buffer.grow(device, page)?;
    let mut first = buffer.slice_bytes_mut::<u32>(..page)?;

    let mut second = buffer.slice_bytes_mut::<u32>(..page)?; // <- error[E0499]: `first` still borrows `buffer`
    first.copy_from_host(&vec![1; first.len()])?;
    second.copy_from_host(&vec![2; second.len()])?;
    Ok(())
}
