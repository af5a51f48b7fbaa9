//! Rule: a mapping of a `SharedPage` kept `ReadOnly` gives no writable view, though another mapping of the page is writable.
//! Prevents: writes into a `PROT_READ` mapping, which the driver refuses on the stream or as a copy error (a fault in a kernel).
//! Expected: E0599 (no `slice_mut` for `GrantedMapping<ReadOnly>`).

use cuda_vmm::owned::{SharedPage, SharedReservation};
use cuda_vmm::{Device, Error, ReadOnly, ReadWrite};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let prefix = SharedPage::new(device, 2 << 20)?;
    let reservation = SharedReservation::new(4 << 20, 0)?;
    let writer = reservation.map_shared(0, &prefix)?.keep_grant(&[device], ReadWrite)?;
    let mut reader = reservation.map_shared(2 << 20, &prefix)?.keep_grant(&[device], ReadOnly)?;

    reader.slice_mut::<u32>()?.copy_from_host(&[0; 1024])?; // <- error[E0599]: this mapping is read-only
    drop(writer);
    Ok(())
}
