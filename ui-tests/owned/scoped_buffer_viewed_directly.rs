//! Rule: a buffer lent to a scope (`in_scope`) gives no plain view while the scope lasts: only its scoped handle's lendables, which every lend checks again.
//! Prevents: a `DeviceSlice` of a page that the scoped handle retires, read by a copy after cuMemUnmap and cuMemRelease (use after release).
//! Expected: E0502 (`cache` borrowed mutably by `in_scope` for the whole scope, and shared by `slice_bytes`).

use cuda_vmm::{Device, Error, ReadWrite, VirtualBuffer};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let mut cache = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    cache.grow(device, 2 << 20)?;
    cuda_vmm::scope(|s| {
        let kv = cache.in_scope(s);
        let view = cache.slice_bytes::<u8>(..2 << 20)?; // <- error[E0502]: a view no retire of `kv` would see
        kv.retire(..2 << 20)?;
        println!("{:?}", view.to_vec()?);
        Ok(())
    })
}
