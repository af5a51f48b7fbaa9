//! Rule: a peer view cannot outlive the `PeerAccess` guard it was made with.
//! Prevents: a copy from the peer device into another device's memory after cuCtxDisablePeerAccess.
//! Expected: E0505 (move out of `guard` while borrowed).

use cuda_vmm::{Context, Device, DeviceBuffer, Error, PeerAccess};

fn main() -> Result<(), Error> {
    let ctx0 = Context::new(Device::get(0)?)?;
    let ctx1 = Context::new(Device::get(1)?)?;
    let Some(link) = cuda_vmm::peer::can_access_peer(ctx0.device(), ctx1.device())? else { return Ok(()) };
    let buffer = DeviceBuffer::from_host(&ctx1, &[1u32, 2, 3, 4])?;
    let guard = PeerAccess::enable(&ctx0, &ctx1, link)?;
    let view = buffer.peer_slice(&guard)?;

    drop(guard); // <- error[E0505]: `view` still borrows `guard`
    println!("{:?}", view.to_vec()?);
    Ok(())
}
