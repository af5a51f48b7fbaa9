//! Rule: the access a direct copy between devices relies on lives as long as the view that carries it.
//! Prevents: a copy over the peer link after the grant that opened the source to the destination was revoked.
//! Expected: E0505 (move out of `grant` while borrowed).

use cuda_vmm::{Context, Device, DeviceBuffer, Error, PhysicalAllocation, ReadWrite, peer::Route, VirtualReservation};

fn main() -> Result<(), Error> {
    let (gpu0, gpu1) = (Context::new(Device::get(0)?)?, Context::new(Device::get(1)?)?);
    let size = 2 << 20;
    let memory = PhysicalAllocation::new(gpu0.device(), size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut region = reservation.region();
    let mut mapping = region.map(&memory)?;
    let both = [&gpu0, &gpu1];
    let grant = mapping.grant_revocable(&both, ReadWrite)?;
    let src = grant.slice::<u8>()?; // reachable from GPU 1 while `grant` lives
    let mut dst = DeviceBuffer::<u8>::zeroed(&gpu1, size)?;

    grant.revoke()?; // <- error[E0505]: `src` still borrows `grant`
    cuda_vmm::copy_between(&mut dst.as_mut_slice(), &src, Route::Direct)?;
    Ok(())
}
