//! Rule: the disjoint writable views of a `VirtualBuffer` borrow it exclusively together: no shrink, unmap or access change while any lives.
//! Prevents: a queued write through one of them into pages cuMemUnmap and cuMemRelease took away (use after unmap).
//! Expected: E0499 (`buffer` borrowed mutably by `shrink` while the views borrow it).

use cuda_vmm::{Device, Error, ReadWrite, VirtualBuffer};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let page = 2 << 20;
    let mut buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    buffer.grow(device, page)?;
    let [mut keys, values] = buffer.slice_bytes_disjoint_mut::<u32, 2>([0..page / 2, page / 2..page])?;

    buffer.shrink()?; // <- error[E0499]: `keys` and `values` still borrow `buffer`
    keys.copy_from_host(&vec![0; values.len()])?;
    Ok(())
}
