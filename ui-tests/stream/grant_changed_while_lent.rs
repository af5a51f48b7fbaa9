//! Rule: the access of a mapping whose memory queued work uses cannot be changed until the scope has waited for that work.
//! Prevents: cuMemSetAccess narrowing a grant (here to read-only) under a queued write: a fault, and a sticky error.
//! Expected: E0499 (a second mutable borrow of `mapping` while `access`, and the view lent to the scope, hold the first).

use cuda_vmm::{Context, Device, Error, Granularity, PhysicalAllocation, ReadOnly, ReadWrite, Stream, VirtualReservation};

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
        mapping.grant(&context, ReadOnly)?; // <- error[E0499]: the queued memset still writes through the grant
        Ok(())
    })
}
