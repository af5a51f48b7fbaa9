//! Rule: a block table lent to a scope (`BlockTable::in_scope`) outlives the scope's wait: it is borrowed for the whole scope, so one made inside the closure cannot be lent.
//! Prevents: cuMemFreeHost of the staging memory under the queued upload's DMA, and cuMemFree of the device array a queued kernel reads (use after free).
//! Expected: E0597 (`table` dropped at the end of the closure while `in_scope` borrows it for the scope).

use cuda_vmm::stream::BlockTable;
use cuda_vmm::{Context, Device, DeviceSlice, Error, Stream};

fn main() -> Result<(), Error> {
    let context = Context::new(Device::get(0)?)?;
    let stream = Stream::new(&context)?;
    cuda_vmm::scope(|s| {
        let mut table = BlockTable::<u32>::new(&context, 64, 1024, 2)?;
        let mut lent = table.in_scope(s.on(&stream)); // <- error[E0597]: freed before the scope's wait
        lent.upload(Vec::<DeviceSlice<'_, u32>>::new())?;
        Ok(())
    })
}
