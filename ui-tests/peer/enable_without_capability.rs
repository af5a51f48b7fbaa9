//! Rule: the `PeerLink` that `PeerAccess::enable` requires comes only from `can_access_peer`; it cannot be forged.
//! Prevents: cuCtxEnablePeerAccess without having asked cuDeviceCanAccessPeer (PEER_ACCESS_UNSUPPORTED).
//! Expected: E0451 (fields of `PeerLink` are private).

use cuda_vmm::{Context, Device, Error, PeerAccess, peer::PeerLink};

fn main() -> Result<(), Error> {
    let ctx0 = Context::new(Device::get(0)?)?;
    let ctx1 = Context::new(Device::get(1)?)?;
    let link = PeerLink { from: ctx0.device(), to: ctx1.device() }; // <- error[E0451]: only `can_access_peer` makes a `PeerLink`
    let guard = PeerAccess::enable(&ctx0, &ctx1, link)?;
    guard.disable()?;
    Ok(())
}
