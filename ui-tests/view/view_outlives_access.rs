//! Rule: a view cannot outlive the access grant it came from.
//! Prevents: copies through a view after its mapping is unmapped or its context released (use after unmap).
//! Expected: E0597 (`access` does not live long enough).

use cuda_vmm::{Context, Device, Error, Granularity, PhysicalAllocation, ReadOnly, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut mapping = reservation.region().map(&memory)?;

    let view = {
        let access = mapping.grant(&context, ReadOnly)?;
        access.slice::<u32>()? // <- error[E0597]: `access` is dropped at the end of the block
    };
    println!("{:?}", view.to_vec()?);
    Ok(())
}
