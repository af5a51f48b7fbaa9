//! Peer views of a [`DeviceBuffer`]: its memory read and written by another device's context,
//! under a [`PeerAccess`] guard that opens it. In the peer layer, above the views, so that the view
//! module never names a guard.

use bytemuck::Pod;

use super::PeerAccess;
use crate::error::Error;
use crate::view::{DeviceBuffer, DeviceSlice, DeviceSliceMut, Reach};

impl<T: Pod> DeviceBuffer<T> {
    /// A read-only view of the whole buffer for the *peer* context of `access`: copies (and kernels given
    /// its address) run on the accessing device and read this buffer's memory directly.
    ///
    /// The view borrows the guard, so peer access cannot be disabled while the view lives.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] where `access` does not open this buffer's context (`access.to()`), so
    /// a guard of the other direction is refused.
    pub fn peer_slice<'g>(
        &'g self,
        access: &'g PeerAccess<'_>,
    ) -> Result<DeviceSlice<'g, T>, Error> {
        self.check_peer(access)?;
        let own = self.as_slice();
        // The guard, borrowed for `'g`, opens this memory to `access.from()`'s device; the owner's own
        // device reaches it in any case.
        Ok(DeviceSlice::from_granted(
            own.as_raw_ptr(),
            own.len(),
            access.from(),
            Reach::Owned(core::slice::from_ref(self.context())),
        ))
    }

    /// A writable view of the whole buffer for the peer context of `access`; see
    /// [`peer_slice`](DeviceBuffer::peer_slice).
    ///
    /// # Errors
    /// As [`peer_slice`](DeviceBuffer::peer_slice).
    pub fn peer_slice_mut<'g>(
        &'g mut self,
        access: &'g PeerAccess<'_>,
    ) -> Result<DeviceSliceMut<'g, T>, Error> {
        self.check_peer(access)?;
        // The exclusive borrow, held for `'g`, seen as shared: the caller's buffer stays borrowed
        // mutably for as long as the view lives, so the view is its only one.
        let this: &'g DeviceBuffer<T> = self;
        let own = this.as_slice();
        Ok(DeviceSliceMut::from_granted(
            own.as_raw_ptr(),
            own.len(),
            access.from(),
            Reach::Owned(core::slice::from_ref(this.context())),
        ))
    }

    fn check_peer(&self, access: &PeerAccess<'_>) -> Result<(), Error> {
        let (expected, found) = (self.context().device(), access.to().device());
        if expected == found {
            Ok(())
        } else {
            Err(Error::DeviceMismatch {
                expected: expected.as_raw(),
                found: found.as_raw(),
            })
        }
    }
}
