//! Rule: a view of a `GrantedMapping` (an owned mapping with its grant kept) does not outlive it.
//! Prevents: copies through the view after cuMemUnmap and cuMemRelease of the mapping (use after unmap).
//! Expected: E0505 (`page` moved into `drop` while the view borrows it).

use cuda_vmm::owned::SharedReservation;
use cuda_vmm::{Device, Error, PhysicalAllocation, ReadWrite};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let reservation = SharedReservation::new(2 << 20, 0)?;
    let page = reservation.map(0, PhysicalAllocation::new(device, 2 << 20)?)?.keep_grant(&[device], ReadWrite)?;
    let view = page.slice::<u32>()?;

    drop(page); // <- error[E0505]: `view` still borrows `page`
    println!("{:?}", view.to_vec()?);
    Ok(())
}
