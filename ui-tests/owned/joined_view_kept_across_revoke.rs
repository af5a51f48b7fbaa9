//! Rule: a joined view borrows every mapping it spans, so none of them is revoked (or unmapped) while it lives.
//! Prevents: a copy across a range whose middle mapping's access cuMemSetAccess just revoked (a fault, or a copy error).
//! Expected: E0505 (`b` moved into `revoke` while the joined view borrows it).

use cuda_vmm::owned::{GrantedMapping, SharedReservation};
use cuda_vmm::{Device, Error, PhysicalAllocation, ReadWrite};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let page = 2 << 20;
    let reservation = SharedReservation::new(3 * page, 0)?;
    let mut a = reservation.map(0, PhysicalAllocation::new(device, page)?)?.keep_grant(&[device], ReadWrite)?;
    let mut b = reservation.map(page, PhysicalAllocation::new(device, page)?)?.keep_grant(&[device], ReadWrite)?;
    let mut c = reservation.map(2 * page, PhysicalAllocation::new(device, page)?)?.keep_grant(&[device], ReadWrite)?;
    let mut view = GrantedMapping::slice_joined_mut::<u8>([&mut a, &mut b, &mut c])?;

    let b = b.revoke()?; // <- error[E0505]: `view` still spans `b`
    view.copy_from_host(&vec![1; 3 * page])?;
    drop(b);
    Ok(())
}
