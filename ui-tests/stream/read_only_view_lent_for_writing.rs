//! Rule: queued work writes only through writable views, which a read-only grant never gives.
//! Prevents: cuMemsetD8Async into a PROT_READ mapping, which fails on the stream, not at the call.
//! Expected: E0277 (a read-only `DeviceSlice` is not a `ScopedWrite`).

use cuda_vmm::{Context, Device, Error, Granularity, PhysicalAllocation, ReadOnly, Stream, VirtualReservation};

fn main() -> Result<(), Error> {
    let device = Device::get(0)?;
    let context = Context::new(device)?;
    let size = cuda_vmm::allocation_granularity(device, Granularity::Minimum)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut mapping = reservation.region().map(&memory)?;
    let access = mapping.grant(&context, ReadOnly)?;
    let view = access.slice::<u32>()?;
    let stream = Stream::new(&context)?;

    cuda_vmm::scope(|s| {
        s.on(&stream).memset(view, 0)?; // <- error[E0277]: a read-only view cannot be lent for writing
        Ok(())
    })
}
