//! Rule: an `OwnedMapping` is unmapped once: `unmap` consumes it.
//! Prevents: a second cuMemUnmap of the range, which the driver does not catch (it may unmap another mapping's range).
//! Expected: E0382 (use of moved value `mapping`).

use cuda_vmm::{Device, Error, PhysicalAllocation, owned::SharedReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let page = 2 << 20;
    let reservation = SharedReservation::new(4 * page, 0)?;
    let mapping = reservation.map(0, PhysicalAllocation::new(device, page)?)?;

    let memory = mapping.unmap()?;
    mapping.unmap()?; // <- error[E0382]: `mapping` was consumed by the first unmap
    drop(memory);
    Ok(())
}
