//! Mappings of physical memory into reserved address ranges: `cuMemMap` / `cuMemUnmap`.

use core::fmt;
use core::marker::PhantomData;
use core::mem::ManuallyDrop;

use crate::access::{Access, AccessMode, Contexts, ScopedAccess};
use crate::device::Context;
use crate::error::{Error, Result, check, first_error};
use crate::physical::PhysicalAllocation;
use crate::reservation::{Region, VirtualReservation};
use crate::sys;

/// One or more whole physical allocations mapped back to back into a [`Region`] of a
/// [`VirtualReservation`], unmapped on drop.
///
/// A mapping is not usable on its own: the driver faults on any access until `cuMemSetAccess` grants a
/// device. Hence a `Mapping` hands out neither its address nor any view (its `Debug` text shows the
/// range, for diagnostics); [`Mapping::grant`] returns an [`Access`], and only an `Access` hands out
/// views and the raw address. The numbers themselves are no secret: the reservation's
/// [`base`](VirtualReservation::base) says where the range lies. An address is an inert integer that
/// only `unsafe` code can use; the safe way in is a view, and a view needs a grant.
///
/// # Lifetimes
/// - `'va`: the mutable borrow of the reservation (through the [`Region`] the mapping was made in). The
///   reservation cannot be freed, dropped or moved while the mapping lives.
/// - `'mem`: the shared borrow of the physical allocation(s). They cannot be released, dropped or moved
///   while the mapping lives; they can be mapped again elsewhere (aliases).
///
/// # Zero cost
/// A `Mapping` is exactly the address and size the driver calls need (16 bytes on 64-bit targets); the
/// borrows are compile-time only.
pub struct Mapping<'va, 'mem> {
    ptr: sys::CUdeviceptr,
    size: usize,
    /// The reservation's range: covariant in `'va`; `Send`/`Sync` because `VirtualReservation` is both.
    _va: PhantomData<&'va VirtualReservation>,
    /// The mapped memory: covariant in `'mem`; `Send`/`Sync` because `PhysicalAllocation` is both.
    _mem: PhantomData<&'mem PhysicalAllocation>,
}

impl fmt::Debug for Mapping<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mapping")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .finish()
    }
}

impl<'va, 'mem> Mapping<'va, 'mem> {
    /// Wraps a range that [`Region::map_all`] has just mapped.
    pub(crate) fn from_mapped(ptr: sys::CUdeviceptr, size: usize) -> Mapping<'va, 'mem> {
        Mapping {
            ptr,
            size,
            _va: PhantomData,
            _mem: PhantomData,
        }
    }

    /// The mapped size in bytes: the sum of the mapped allocations' sizes.
    #[must_use]
    pub fn size(&self) -> usize {
        self.size
    }

    /// `cuMemSetAccess` — grant the device of `context` access to the whole mapping, in `mode`
    /// ([`ReadWrite`](crate::ReadWrite) or [`ReadOnly`](crate::ReadOnly)).
    ///
    /// The returned [`Access`] borrows the mapping mutably, so only one grant is in use at a time and a
    /// read-only grant cannot be widened behind its views' back. Copies made through its views run in
    /// `context`. Dropping the `Access` ends the borrow; the driver keeps the permission until the
    /// mapping is unmapped or its device's access is set again: by a later grant, by a refused later
    /// grant (which sets its devices back to no access), or by the end of a
    /// [`grant_scoped`](Mapping::grant_scoped) that names the device.
    ///
    /// # Errors
    /// The driver's error ([`Error::Driver`]). Then no `Access` exists, so nothing can use the mapping,
    /// and every listed device is set back to no access, so nothing is left half granted. Where setting
    /// a device back is refused too, the error is [`Error::CleanupFailed`] (`what`: `"grant"`): that
    /// device may keep whatever access the refused call gave it, until a later grant sets its access
    /// or the mapping is unmapped; still no `Access` exists, so safe code cannot use that access.
    /// Where access cannot be set up, unmap the mapping and take another path (for a copy between
    /// devices: [`Route::Staged`](crate::Route::Staged)).
    #[doc(alias = "cuMemSetAccess")]
    pub fn grant<'a, M: AccessMode>(
        &'a mut self,
        context: &'a Context,
        mode: M,
    ) -> Result<Access<'a, M>, Error> {
        self.grant_contexts(Contexts::One(context), mode)
    }

    /// `cuMemSetAccess` — grant every device of `contexts` access to the whole mapping, in `mode`, in one
    /// driver call. Views use the first context for copies; [`Access::slice_on`] picks another.
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for an empty list; otherwise as for [`Mapping::grant`] ([`Error::Driver`],
    /// or [`Error::CleanupFailed`] where a device could not be set back to no access).
    #[doc(alias = "cuMemSetAccess")]
    pub fn grant_all<'a, M: AccessMode>(
        &'a mut self,
        contexts: &'a [&'a Context],
        mode: M,
    ) -> Result<Access<'a, M>, Error> {
        let contexts = Contexts::many(contexts).ok_or(Error::ZeroSize {
            what: "list of contexts to grant",
        })?;
        self.grant_contexts(contexts, mode)
    }

    /// `cuMemSetAccess` — as [`grant_all`](Mapping::grant_all), revoked again when the returned
    /// [`ScopedAccess`] ends: each granted context is synchronised, then every granted device is set back
    /// to no access (`CU_MEM_ACCESS_FLAGS_PROT_NONE`).
    ///
    /// This is how a peer device is opened to a VMM mapping for a while: context peer access
    /// ([`PeerAccess`](crate::PeerAccess)) does not open VMM mappings; grants do.
    ///
    /// # Errors
    /// As [`grant_all`](Mapping::grant_all).
    #[doc(alias = "cuMemSetAccess")]
    pub fn grant_scoped<'a, M: AccessMode>(
        &'a mut self,
        contexts: &'a [&'a Context],
        mode: M,
    ) -> Result<ScopedAccess<'a, M>, Error> {
        Ok(ScopedAccess::new(self.grant_all(contexts, mode)?))
    }

    fn grant_contexts<'a, M: AccessMode>(
        &'a mut self,
        contexts: Contexts<'a>,
        mode: M,
    ) -> Result<Access<'a, M>, Error> {
        grant_range(self.ptr, self.size, contexts, mode)
    }

    /// `cuMemUnmap` — unmap, report the driver's answer (which `drop` ignores), and give the region back
    /// so that it can be mapped again.
    ///
    /// Consuming `self` makes a double unmap impossible to write; the driver would not catch one (it
    /// returns success for a range that is already unmapped).
    ///
    /// # Errors
    /// The driver's error. The range then stays mapped and is leaked until the process ends (the
    /// reservation's `cuMemAddressFree` will fail too); no driver failure of a whole-mapping unmap is
    /// known.
    #[doc(alias = "cuMemUnmap")]
    pub fn unmap(self) -> Result<Region<'va>> {
        let this = ManuallyDrop::new(self);
        // SAFETY: `[ptr, ptr + size)` is the range this mapping mapped, unmapped once: `drop` will not run.
        check(unsafe { sys::cuMemUnmap(this.ptr, this.size) })?;
        Ok(Region::from_unmapped(this.ptr, this.size))
    }
}

/// `cuMemSetAccess` of `[ptr, ptr + size)`, a whole mapped range that the caller keeps mapped and
/// borrowed exclusively while the `Access` lives, for every device of `contexts` in `mode`: the [`Access`] of both
/// layers' grants.
///
/// # Errors
/// The driver's refusal, after every device was set back to no access (device by device: whatever
/// part of the call the driver applied is taken back); [`Error::CleanupFailed`] (`what`: `"grant"`)
/// where a device cannot be set back, since whether the refused call had granted it cannot be told.
pub(crate) fn grant_range<M: AccessMode>(
    ptr: sys::CUdeviceptr,
    size: usize,
    contexts: Contexts<'_>,
    mode: M,
) -> Result<Access<'_, M>, Error> {
    if let Err(error) = set_access(ptr, size, contexts, M::FLAGS) {
        return Err(match revoke_each(ptr, size, contexts) {
            Ok(()) => Error::Driver(error),
            Err(cleanup) => Error::CleanupFailed {
                error,
                cleanup,
                what: "grant",
            },
        });
    }
    Ok(Access::new(ptr, size, contexts, mode))
}

/// `cuMemSetAccess` of `[ptr, ptr + size)`, a whole mapped range, for every device of `contexts`.
pub(crate) fn set_access(
    ptr: sys::CUdeviceptr,
    size: usize,
    contexts: Contexts<'_>,
    flags: u32,
) -> Result<()> {
    let desc = |c: &Context| sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CU_MEM_LOCATION_TYPE_DEVICE,
            id: c.device().as_raw(),
        },
        flags,
    };
    // One device (the common case) needs no heap allocation.
    let one: [sys::CUmemAccessDesc; 1];
    let many: Vec<sys::CUmemAccessDesc>;
    let descs: &[sys::CUmemAccessDesc] = match contexts {
        Contexts::One(c) => {
            one = [desc(c)];
            &one
        }
        Contexts::Many { all, .. } => {
            many = all.iter().map(|c| desc(c)).collect();
            &many
        }
    };
    // SAFETY: the caller passes a whole range it has mapped; `descs` is a live, initialised array of
    // `descs.len()` access-descriptor mirrors (layout asserted in `sys`).
    check(unsafe { sys::cuMemSetAccess(ptr, size, descs.as_ptr(), descs.len()) })
}

/// Sets every device of `contexts` back to no access to `[ptr, ptr + size)`, a whole mapped range: in
/// one call, or device by device where the driver refuses the one call, so that one device's refusal
/// leaves no other device granted.
///
/// # Errors
/// The first device's refusal, where revoking it alone failed too.
pub(crate) fn revoke(ptr: sys::CUdeviceptr, size: usize, contexts: Contexts<'_>) -> Result<()> {
    match set_access(ptr, size, contexts, sys::CU_MEM_ACCESS_FLAGS_PROT_NONE) {
        Ok(()) => Ok(()),
        Err(_) => revoke_each(ptr, size, contexts),
    }
}

/// [`revoke`] device by device: every device is tried; the first refusal is returned.
fn revoke_each(ptr: sys::CUdeviceptr, size: usize, contexts: Contexts<'_>) -> Result<()> {
    first_error(contexts.iter().map(|context| {
        set_access(
            ptr,
            size,
            Contexts::One(context),
            sys::CU_MEM_ACCESS_FLAGS_PROT_NONE,
        )
    }))
}

impl Drop for Mapping<'_, '_> {
    fn drop(&mut self) {
        // SAFETY: `[ptr, ptr + size)` is the range this mapping mapped; it is unmapped only here (or in
        // `unmap`, which skips this). The allocation and reservation are still alive (borrowed).
        let code = unsafe { sys::cuMemUnmap(self.ptr, self.size) };
        // The error is ignored: `drop` cannot return it and no failure of a whole-mapping unmap is known.
        // Call `unmap` to see it.
        let _ = code;
    }
}
