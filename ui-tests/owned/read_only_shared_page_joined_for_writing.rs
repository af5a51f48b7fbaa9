//! Rule: a writable joined view spans `ReadWrite` mappings only: a read-only mapping of a `SharedPage` cannot be joined into one.
//! Prevents: a copy or kernel writing across a page boundary into a `PROT_READ` mapping of the shared prefix.
//! Expected: E0308 (a `GrantedMapping<ReadOnly>` where `slice_joined_mut` takes `GrantedMapping<ReadWrite>`).

use cuda_vmm::owned::{GrantedMapping, SharedPage, SharedReservation};
use cuda_vmm::{Device, Error, PhysicalAllocation, ReadOnly, ReadWrite};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let page = 2 << 20;
    let prefix = SharedPage::new(device, page)?;
    let reservation = SharedReservation::new(2 * page, 0)?;
    let mut own = reservation.map(0, PhysicalAllocation::new(device, page)?)?.keep_grant(&[device], ReadWrite)?;
    let mut shared = reservation.map_shared(page, &prefix)?.keep_grant(&[device], ReadOnly)?;

    let mut view = GrantedMapping::slice_joined_mut::<u8>([&mut own, &mut shared])?; // <- error[E0308]: `shared` is read-only
    view.copy_from_host(&vec![1; 2 * page])?;
    Ok(())
}
