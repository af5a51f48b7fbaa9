//! Rule: a peer-access guard cannot outlive either of the contexts it joins.
//! Prevents: the guard's synchronise and cuCtxDisablePeerAccess on a primary context already released.
//! Expected: E0505 (move out of `ctx1` while borrowed).

use cuda_vmm::{Context, Device, Error, PeerAccess};

fn main() -> Result<(), Error> {
    let ctx0 = Context::new(Device::get(0)?)?;
    let ctx1 = Context::new(Device::get(1)?)?;
    let Some(link) = cuda_vmm::peer::can_access_peer(ctx0.device(), ctx1.device())? else { return Ok(()) };
    let guard = PeerAccess::enable(&ctx0, &ctx1, link)?;

    drop(ctx1); // <- error[E0505]: `guard` still borrows `ctx1`
    guard.disable()?;
    Ok(())
}
