//! Rule: a mapping whose memory queued work uses cannot be unmapped until the scope has waited for that work.
//! Prevents: cuMemUnmap while a queued memset (or copy, or kernel) still writes the range: a fault, and a sticky error.
//! Expected: E0505 (move out of `mapping` while `access`, and the view lent to the scope, borrow it).

use cuda_vmm::{Context, Device, Error, Granularity, PhysicalAllocation, ReadWrite, Stream, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut mapping = reservation.region().map(&memory)?;
    let mut access = mapping.grant(&context, ReadWrite)?;
    let mut view = access.slice_mut::<u32>()?;
    let stream = Stream::new(&context)?;

    cuda_vmm::scope(|s| {
        s.on(&stream).memset(&mut view, 0)?;
        mapping.unmap()?; // <- error[E0505]: the queued memset still uses the mapping
        Ok(())
    })
}
