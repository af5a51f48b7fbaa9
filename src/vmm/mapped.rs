//! One mapped range, as [`Mapping`](crate::Mapping), [`HostMapping`](crate::host::HostMapping) and
//! [`OwnedMapping`](crate::owned::OwnedMapping) hold it: its address, the one `cuMemUnmap` (consuming, and in
//! `Drop`) and the one grant path. Each public type wraps a [`MappedRange`] and adds what is its own.

use core::marker::PhantomData;
use core::mem::ManuallyDrop;
use core::ptr;

use crate::device::Context;
use crate::error::{DriverError, Error, check};
use crate::sys;
use crate::vmm::access::{Access, AccessMode, Contexts, RevocableAccess, grant_range};

/// What a [`MappedRange`] holds besides its address: the memory and the reservation, owned or
/// borrowed, which outlive the mapping (they are dropped after its unmap, as its fields).
pub(crate) trait Backing {
    /// The mapped size in bytes.
    fn size(&self) -> usize;

    /// Called once, after a successful `cuMemUnmap` of the range: the bookkeeping of an owner that
    /// records mapped ranges. Nothing, by default.
    fn unmapped(&self) {}
}

/// The backing of a range of the borrowed layer: its size, and the borrows `B` (of the reservation
/// and the memory) at the type level only. `MappedRange`'s `Drop` keeps them alive to its end.
pub(crate) struct Borrowed<B> {
    size: usize,
    _borrows: PhantomData<B>,
}

impl<B> Backing for Borrowed<B> {
    fn size(&self) -> usize {
        self.size
    }
}

/// A range mapped with `cuMemMap`, unmapped once: by [`unmap`](MappedRange::unmap), or on drop.
///
/// It hands out no address of its own to safe code; only a grant ([`Access`]) does.
pub(crate) struct MappedRange<B: Backing> {
    ptr: sys::CUdeviceptr,
    backing: B,
}

impl<B> MappedRange<Borrowed<B>> {
    /// Wraps `[ptr, ptr + size)`, which the caller has just mapped, with memory it borrows.
    pub(crate) fn borrowed(ptr: sys::CUdeviceptr, size: usize) -> MappedRange<Borrowed<B>> {
        MappedRange::from_mapped(
            ptr,
            Borrowed {
                size,
                _borrows: PhantomData,
            },
        )
    }
}

impl<B: Backing> MappedRange<B> {
    /// Wraps the range at `ptr` of `backing.size()` bytes, which the caller has just mapped.
    pub(crate) fn from_mapped(ptr: sys::CUdeviceptr, backing: B) -> MappedRange<B> {
        MappedRange { ptr, backing }
    }

    /// The first mapped address.
    pub(crate) fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// The mapped size in bytes.
    pub(crate) fn size(&self) -> usize {
        self.backing.size()
    }

    /// What the range holds.
    pub(crate) fn backing(&self) -> &B {
        &self.backing
    }

    /// `cuMemSetAccess` for the device of `context`: the one grant of every mapping type.
    pub(crate) fn grant<'map, M: AccessMode>(
        &'map mut self,
        context: &'map Context,
        mode: M,
    ) -> Result<Access<'map, M>, Error> {
        self.grant_contexts(Contexts::One(context), mode)
    }

    /// `cuMemSetAccess` for every device of `contexts`, in one driver call.
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for an empty list; otherwise as [`grant_range`].
    pub(crate) fn grant_all<'map, M: AccessMode>(
        &'map mut self,
        contexts: &'map [&'map Context],
        mode: M,
    ) -> Result<Access<'map, M>, Error> {
        let contexts = Contexts::many(contexts).ok_or(Error::ZeroSize {
            what: "list of contexts to grant",
        })?;
        self.grant_contexts(contexts, mode)
    }

    /// As [`grant_all`](MappedRange::grant_all), revoked again when the [`RevocableAccess`] ends.
    pub(crate) fn grant_revocable<'map, M: AccessMode>(
        &'map mut self,
        contexts: &'map [&'map Context],
        mode: M,
    ) -> Result<RevocableAccess<'map, M>, Error> {
        Ok(RevocableAccess::new(self.grant_all(contexts, mode)?))
    }

    fn grant_contexts<'map, M: AccessMode>(
        &'map mut self,
        contexts: Contexts<'map>,
        mode: M,
    ) -> Result<Access<'map, M>, Error> {
        // `[ptr, ptr + size)` is this mapping's whole range; the `Access` borrows the mapping
        // mutably, so it stays mapped (and no other grant is made) while the access or any view of
        // it lives.
        grant_range(self.ptr, self.size(), contexts, mode)
    }

    /// `cuMemUnmap`, once (`drop` will not run): the backing, and the driver's answer. Where the
    /// driver refuses, the range stays mapped (and, for an owner that records it, recorded).
    pub(crate) fn unmap(self) -> (B, Result<(), DriverError>) {
        let this = ManuallyDrop::new(self);
        let unmapped = this.unmap_raw();
        // SAFETY: `this` is never used or dropped again, so its backing is moved out exactly once.
        let backing = unsafe { ptr::read(&raw const this.backing) };
        (backing, unmapped)
    }

    /// `cuMemUnmap` of the whole range; on success the backing's bookkeeping learns of it.
    fn unmap_raw(&self) -> Result<(), DriverError> {
        // SAFETY: `[ptr, ptr + size)` is the range this mapping mapped, unmapped once: by `unmap`,
        // which skips `drop`, or by `drop`. The memory and the reservation are still alive (borrowed,
        // or owned by the backing, which is dropped after this). No view lives (views borrow the
        // mapping), and every copy through one finished before it returned.
        check(unsafe { sys::cuMemUnmap(self.ptr, self.size()) })?;
        self.backing.unmapped();
        Ok(())
    }
}

impl<B: Backing> Drop for MappedRange<B> {
    fn drop(&mut self) {
        // Unmapped here; then the backing's fields are dropped (for an owned mapping: its memory is
        // released and its share of the range dropped, in that order). The error is ignored: `drop`
        // cannot return it, no failure of a whole-mapping unmap is known, and a range the driver
        // refuses to unmap stays recorded, so nothing maps over it. Call `unmap` to see it.
        let _ = self.unmap_raw();
    }
}
