//! Rule: a view of a mapping of a `SharedPage` does not outlive the mapping, though other shares keep the memory.
//! Prevents: copies through the view's address after cuMemUnmap of its range (the page's other mappings stay, this address does not).
//! Expected: E0505 (`reader` moved into `drop` while the view borrows it).

use cuda_vmm::owned::{SharedPage, SharedReservation};
use cuda_vmm::{Device, Error, ReadOnly};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let prefix = SharedPage::new(device, 2 << 20)?;
    let reservation = SharedReservation::new(2 << 20, 0)?;
    let reader = reservation.map_shared(0, &prefix)?.keep_grant(&[device], ReadOnly)?;
    let view = reader.slice::<u32>()?;

    drop(reader); // <- error[E0505]: `view` still borrows `reader`
    println!("{:?}", view.to_vec()?);
    drop(prefix);
    Ok(())
}
