//! [`GrantedMapping`]: an [`OwnedMapping`] that keeps its grant, so that it is stored with its access
//! and hands out views at every use without a new `cuMemSetAccess`.

use core::fmt;
use core::marker::PhantomData;

use bytemuck::Pod;

use super::buffer::{retain_distinct, with_cleanup, with_contexts};
use super::mapping::OwnedMapping;
use crate::device::{Context, Device};
use crate::error::Error;
use crate::sys;
use crate::view::{DeviceSlice, DeviceSliceMut, Reach};
use crate::vmm::access::{AccessMode, ReadWrite, elements, revoke, set_access};

/// An [`OwnedMapping`] granted once to a set of devices, in mode `M`, with the grant kept: it has no
/// lifetime, lives in a struct field or a `Vec` beside its access, and gives views of the whole
/// mapping ([`slice`](GrantedMapping::slice), and [`slice_mut`](GrantedMapping::slice_mut) for
/// [`ReadWrite`]) as often as they are asked for, with no driver call. It keeps the contexts of its
/// devices retained.
///
/// Made by [`OwnedMapping::keep_grant`]; [`revoke`](GrantedMapping::revoke) takes the access away and
/// gives the mapping back. Views borrow the granted mapping, so it cannot be revoked, unmapped or
/// dropped while one lives; a read-only one gives no writable view.
///
/// # Examples
/// ```no_run
/// use cuda_vmm::owned::{GrantedMapping, SharedReservation};
/// use cuda_vmm::{Device, PhysicalAllocation, ReadWrite};
///
/// struct Sequence {
///     page: GrantedMapping, // the mapping and its grant, stored together
/// }
///
/// # fn main() -> cuda_vmm::Result<()> {
/// let device = Device::get(0)?;
/// let reservation = SharedReservation::new(1 << 30, 0)?;
/// let memory = PhysicalAllocation::new(device, 2 << 20)?;
/// let mut sequence = Sequence {
///     page: reservation.map(0, memory)?.keep_grant(&[device], ReadWrite)?, // cuMemSetAccess, once
/// };
/// sequence.page.slice_mut::<u32>()?.copy_from_host(&vec![7; (2 << 20) / 4])?; // no new grant
/// assert!(sequence.page.slice::<u32>()?.to_vec()?.iter().all(|&x| x == 7));
/// # Ok(())
/// # }
/// ```
///
/// A view does not outlive the granted mapping:
/// ```compile_fail,E0505
/// # use cuda_vmm::owned::SharedReservation;
/// # use cuda_vmm::{Device, PhysicalAllocation, ReadWrite};
/// # fn main() -> cuda_vmm::Result<()> {
/// # let device = Device::get(0)?;
/// # let reservation = SharedReservation::new(1 << 30, 0)?;
/// let page = reservation.map(0, PhysicalAllocation::new(device, 2 << 20)?)?.keep_grant(&[device], ReadWrite)?;
/// let view = page.slice::<u32>()?;
/// drop(page); // unmaps: `view` still borrows it
/// # drop(view);
/// # Ok(())
/// # }
/// ```
pub struct GrantedMapping<M: AccessMode = ReadWrite> {
    mapping: OwnedMapping,
    /// The devices granted, one retained context each; the first is the one views copy through.
    access: Vec<Context>,
    /// The mode of the kept grant. `Send` and `Sync` (the modes are unit structs).
    _mode: PhantomData<M>,
}

impl<M: AccessMode> fmt::Debug for GrantedMapping<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrantedMapping")
            .field("mapping", &self.mapping)
            .field("devices", &self.devices())
            .field("mode", &M::NAME)
            .finish_non_exhaustive()
    }
}

impl OwnedMapping {
    /// `cuMemSetAccess` — grant every device of `devices` access to the whole mapping, in `mode`, in
    /// one call, and keep the grant: the [`GrantedMapping`] stores the access with the mapping.
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for an empty device list (before any driver call); the driver's error
    /// where the contexts cannot be retained or the grant is refused (the devices granted so far are
    /// set back to no access first; [`Error::CleanupFailed`] where that fails too). The mapping is
    /// unmapped and its memory released on every error, as when it is dropped.
    #[doc(alias = "cuMemSetAccess")]
    pub fn keep_grant<M: AccessMode>(
        self,
        devices: &[Device],
        mode: M,
    ) -> Result<GrantedMapping<M>, Error> {
        let _ = mode;
        let access = retain_distinct(devices)?;
        let (ptr, size) = (self.ptr(), self.size());
        let granted = with_contexts(&access, |contexts| {
            set_access(ptr, size, contexts, M::FLAGS)
        });
        if let Err(error) = granted {
            // Part of the set may have been granted: every device is set back to no access.
            let cleanup = with_contexts(&access, |contexts| revoke(ptr, size, contexts));
            return Err(with_cleanup(error, cleanup, "grant"));
        }
        Ok(GrantedMapping {
            mapping: self,
            access,
            _mode: PhantomData,
        })
    }
}

impl<M: AccessMode> GrantedMapping<M> {
    /// The mapping.
    #[must_use]
    pub fn mapping(&self) -> &OwnedMapping {
        &self.mapping
    }

    /// The devices granted, the first being the one views copy through.
    #[must_use]
    pub fn devices(&self) -> Vec<Device> {
        self.access.iter().map(Context::device).collect()
    }

    /// A read-only view of the whole mapping as `T`s, copied through the first device's context;
    /// no driver call.
    ///
    /// # Errors
    /// [`Error::NotWholeElements`] where the mapping is not a whole number of `T`s, or `T` is
    /// zero-sized.
    pub fn slice<T: Pod>(&self) -> Result<DeviceSlice<'_, T>, Error> {
        let (ptr, len, context) = self.parts::<T>()?;
        // The whole mapping is granted to every device of `access` (by `keep_grant`), and stays
        // mapped and granted while `self` is borrowed: revoking and unmapping consume `self`.
        Ok(DeviceSlice::from_granted(
            ptr,
            len,
            context,
            Reach::Owned(&self.access),
        ))
    }

    /// `cuMemSetAccess` with no access for every device granted; gives the mapping back.
    ///
    /// # Errors
    /// The driver's error (the devices are then set back device by device, and the first refusal
    /// returned); the mapping is unmapped and its memory released then.
    #[doc(alias = "cuMemSetAccess")]
    pub fn revoke(self) -> Result<OwnedMapping, Error> {
        let GrantedMapping {
            mapping, access, ..
        } = self;
        let (ptr, size) = (mapping.ptr(), mapping.size());
        with_contexts(&access, |contexts| revoke(ptr, size, contexts))?;
        Ok(mapping)
    }

    fn parts<T>(&self) -> Result<(sys::CUdeviceptr, usize, &Context), Error> {
        let len = elements::<T>(self.mapping.size())?;
        let context = self
            .access
            .first()
            .ok_or(Error::ZeroSize { what: "access set" })?;
        Ok((self.mapping.ptr(), len, context))
    }
}

impl GrantedMapping<ReadWrite> {
    /// A writable view of the whole mapping as `T`s, copied through the first device's context; no
    /// driver call. Only a [`ReadWrite`] grant has one; it borrows the granted mapping exclusively.
    ///
    /// # Errors
    /// As [`slice`](GrantedMapping::slice).
    pub fn slice_mut<T: Pod>(&mut self) -> Result<DeviceSliceMut<'_, T>, Error> {
        let (ptr, len, context) = self.parts::<T>()?;
        // As for `slice`; the grant is read-write, and the view is exclusive while `self` is
        // borrowed mutably.
        Ok(DeviceSliceMut::from_granted(
            ptr,
            len,
            context,
            Reach::Owned(&self.access),
        ))
    }
}
