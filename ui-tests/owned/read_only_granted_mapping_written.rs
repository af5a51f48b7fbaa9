//! Rule: a `GrantedMapping` whose kept grant is `ReadOnly` gives no writable view.
//! Prevents: writes into a `PROT_READ` mapping, which the driver refuses on the stream or as a copy error.
//! Expected: E0599 (no `slice_mut` for `GrantedMapping<ReadOnly>`).

use cuda_vmm::owned::SharedReservation;
use cuda_vmm::{Device, Error, PhysicalAllocation, ReadOnly};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let reservation = SharedReservation::new(2 << 20, 0)?;
    let mut page = reservation.map(0, PhysicalAllocation::new(device, 2 << 20)?)?.keep_grant(&[device], ReadOnly)?;

    page.slice_mut::<u32>()?.copy_from_host(&[0; 1024])?; // <- error[E0599]: read-only grant
    Ok(())
}
