//! Rule: peer access cannot be disabled while a view made with its guard lives: `disable` consumes the guard.
//! Prevents: writes from the peer device into another device's memory after cuCtxDisablePeerAccess.
//! Expected: E0505 (move out of `guard` while borrowed).

use cuda_vmm::{Context, Device, DeviceBuffer, Error, PeerAccess};

fn main() -> Result<(), Error> {
    let ctx0 = Context::new(Device::get(0)?)?;
    let ctx1 = Context::new(Device::get(1)?)?;
    let Some(link) = cuda_vmm::peer::can_access_peer(ctx0.device(), ctx1.device())? else { return Ok(()) };
    let mut buffer = DeviceBuffer::<u32>::zeroed(&ctx1, 4)?;
    let guard = PeerAccess::enable(&ctx0, &ctx1, link)?;
    let mut view = buffer.peer_slice_mut(&guard)?;

    guard.disable()?; // <- error[E0505]: `view` still borrows `guard`
    view.copy_from_host(&[1, 2, 3, 4])?;
    Ok(())
}
