//! Access grants: the typed result of `cuMemSetAccess`, the only source of views of mapped memory.

use core::fmt;
use core::marker::PhantomData;

use bytemuck::Pod;

use crate::device::{Context, Device};
use crate::error::{DriverResult, Error, Result, check, first_error};
use crate::sys;
use crate::view::{DeviceSlice, DeviceSliceMut, Reach};

mod sealed {
    pub trait Sealed {}
}

/// The protection a grant gives: [`ReadWrite`] or [`ReadOnly`]. Sealed: the driver has no other mode a
/// view could use.
///
/// A mode protects the address range of one mapping, not the physical memory behind it: another
/// mapping of the same allocation (an alias) is granted on its own, in its own mode (see
/// [`ReadOnly`]).
pub trait AccessMode: sealed::Sealed + Copy + fmt::Debug + Send + Sync + 'static {
    /// The `CUmemAccess_flags` value.
    #[doc(hidden)]
    const FLAGS: u32;
    /// The mode's name, for `Debug`.
    #[doc(hidden)]
    const NAME: &'static str;
}

/// Read and write access (`CU_MEM_ACCESS_FLAGS_PROT_READWRITE`): views may be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ReadWrite;

/// Read-only access (`CU_MEM_ACCESS_FLAGS_PROT_READ`): views have no write methods.
///
/// Read-only protects an address range, not bytes. The same physical allocation may also be mapped
/// at another address (an alias: [`Region::map`](crate::vmm::Region::map) borrows the allocation shared)
/// and granted [`ReadWrite`] there; writes through that alias, or by a kernel given its address,
/// change what a read-only view of this range reads. A read-only view promises that nothing writes
/// *through it*, not that its bytes stay the same; where they must, keep the allocation mapped only
/// once, or order the writes yourself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ReadOnly;

impl sealed::Sealed for ReadWrite {}
impl sealed::Sealed for ReadOnly {}
impl AccessMode for ReadWrite {
    const FLAGS: u32 = sys::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    const NAME: &'static str = "ReadWrite";
}
impl AccessMode for ReadOnly {
    const FLAGS: u32 = sys::CU_MEM_ACCESS_FLAGS_PROT_READ;
    const NAME: &'static str = "ReadOnly";
}

/// The contexts a grant was made for: one (the common case, without a slice to keep alive) or several.
#[derive(Clone, Copy)]
pub(crate) enum Contexts<'map> {
    One(&'map Context),
    /// A non-empty list (made only by [`Contexts::many`]) and its first context.
    Many {
        first: &'map Context,
        all: &'map [&'map Context],
    },
}

impl<'map> Contexts<'map> {
    /// The contexts of `all`; `None` for an empty list.
    pub(crate) fn many(all: &'map [&'map Context]) -> Option<Contexts<'map>> {
        all.first().map(|&first| Contexts::Many { first, all })
    }

    pub(crate) fn iter(self) -> impl Iterator<Item = &'map Context> {
        let (one, many): (Option<&'map Context>, &'map [&'map Context]) = match self {
            Contexts::One(c) => (Some(c), &[]),
            Contexts::Many { all, .. } => (None, all),
        };
        one.into_iter().chain(many.iter().copied())
    }

    /// The devices besides a view's own that reach the granted memory: every granted device.
    fn reach(self) -> Reach<'map> {
        match self {
            Contexts::One(_) => Reach::NONE,
            Contexts::Many { all, .. } => Reach::Borrowed(all),
        }
    }

    fn first(self) -> &'map Context {
        match self {
            Contexts::One(c) | Contexts::Many { first: c, .. } => c,
        }
    }
}

/// Access to a [`Mapping`](crate::Mapping) granted to one or more devices, in mode `M`.
///
/// Made by [`Mapping::grant`](crate::Mapping::grant) and [`Mapping::grant_all`](crate::Mapping::grant_all).
/// It is the only way to a view or to the mapped address, so nothing can touch mapped memory before the
/// driver allows it. A `ReadOnly` grant gives only [`DeviceSlice`]s, which have no write methods.
///
/// # Lifetimes
/// `'map` covers both the mutable borrow of the mapping and the borrow of the granted context(s): views
/// cannot outlive the mapping, and the context their copies run in stays retained.
pub struct Access<'map, M: AccessMode> {
    ptr: sys::CUdeviceptr,
    size: usize,
    contexts: Contexts<'map>,
    /// The mode, at the type level only.
    _mode: PhantomData<M>,
}

impl<M: AccessMode> fmt::Debug for Access<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Access")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("mode", &M::NAME)
            .field(
                "devices",
                &self
                    .contexts
                    .iter()
                    .map(Context::device)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl<'map, M: AccessMode> Access<'map, M> {
    pub(crate) fn new(
        ptr: sys::CUdeviceptr,
        size: usize,
        contexts: Contexts<'map>,
        _mode: M,
    ) -> Access<'map, M> {
        Access {
            ptr,
            size,
            contexts,
            _mode: PhantomData,
        }
    }

    /// The size of the granted range in bytes.
    #[must_use]
    pub fn size(&self) -> usize {
        self.size
    }

    /// The devices the grant covers, in the order given.
    #[must_use]
    pub fn devices(&self) -> Vec<Device> {
        self.contexts.iter().map(Context::device).collect()
    }

    /// The mapped address, for driver calls and kernels this crate does not wrap.
    ///
    /// An escape hatch that owns nothing: it is a number, no constructor of this crate turns it into an
    /// owning buffer, and nothing frees it. It is valid for the devices of this grant while `self` lives.
    #[must_use]
    pub fn as_raw_ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// The whole granted range as a read-only slice of `T`, copied through the first granted context.
    ///
    /// # Errors
    /// [`Error::NotWholeElements`] where the size is not a whole number of `T`s (or `T` is zero-sized).
    pub fn slice<T: Pod>(&self) -> Result<DeviceSlice<'_, T>, Error> {
        self.slice_through(self.contexts.first())
    }

    /// As [`slice`](Access::slice), with copies made through the context of `device`, which must be one
    /// of the granted devices.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] where `device` is not granted; as [`slice`](Access::slice) otherwise.
    pub fn slice_on<T: Pod>(&self, device: Device) -> Result<DeviceSlice<'_, T>, Error> {
        self.slice_through(self.context_of(device)?)
    }

    fn context_of(&self, device: Device) -> Result<&'map Context, Error> {
        self.contexts
            .iter()
            .find(|c| c.device() == device)
            .ok_or(Error::DeviceMismatch {
                expected: self.contexts.first().device().as_raw(),
                found: device.as_raw(),
            })
    }

    fn slice_through<T: Pod>(&self, context: &'map Context) -> Result<DeviceSlice<'_, T>, Error> {
        let len = elements::<T>(self.size)?;
        // `[ptr, ptr + size)` is mapped and granted to `context`'s device, and to every device of the
        // grant, for as long as `self` is borrowed.
        Ok(DeviceSlice::from_granted(
            self.ptr,
            len,
            context,
            self.contexts.reach(),
        ))
    }
}

impl<'map> Access<'map, ReadWrite> {
    /// The whole granted range as a writable slice of `T`, copied through the first granted context.
    ///
    /// # Errors
    /// [`Error::NotWholeElements`] where the size is not a whole number of `T`s (or `T` is zero-sized).
    pub fn slice_mut<T: Pod>(&mut self) -> Result<DeviceSliceMut<'_, T>, Error> {
        let context = self.contexts.first();
        self.slice_mut_through(context)
    }

    /// As [`slice_mut`](Access::slice_mut), with copies made through the context of `device`.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] where `device` is not granted; as [`slice_mut`](Access::slice_mut)
    /// otherwise.
    pub fn slice_mut_on<T: Pod>(&mut self, device: Device) -> Result<DeviceSliceMut<'_, T>, Error> {
        let context = self.context_of(device)?;
        self.slice_mut_through(context)
    }

    fn slice_mut_through<T: Pod>(
        &mut self,
        context: &'map Context,
    ) -> Result<DeviceSliceMut<'_, T>, Error> {
        let len = elements::<T>(self.size)?;
        Ok(DeviceSliceMut::from_granted(
            self.ptr,
            len,
            context,
            self.contexts.reach(),
        ))
    }
}

/// An [`Access`] that is revoked when it ends: made by
/// [`Mapping::grant_revocable`](crate::Mapping::grant_revocable). Use it as the `Access` it
/// dereferences to; its writable views come from its own [`slice_mut`](RevocableAccess::slice_mut).
///
/// When it ends (drop, or [`revoke`](RevocableAccess::revoke)), every granted context is
/// synchronised and every granted device is set back to no access (device by device, where the
/// driver refuses to do it in one call). Forgetting it (`mem::forget`) leaves the access granted
/// until the mapping is unmapped: views cannot outlive it either way, since they borrow it.
pub struct RevocableAccess<'map, M: AccessMode> {
    access: Access<'map, M>,
}

impl<M: AccessMode> fmt::Debug for RevocableAccess<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RevocableAccess")
            .field(&self.access)
            .finish()
    }
}

impl<'map, M: AccessMode> RevocableAccess<'map, M> {
    pub(crate) fn new(access: Access<'map, M>) -> RevocableAccess<'map, M> {
        RevocableAccess { access }
    }

    /// Ends the grant and reports the driver's answer, which `drop` ignores.
    ///
    /// # Errors
    /// The error of a synchronisation (work on a granted device failed) or of `cuMemSetAccess`.
    #[doc(alias = "cuMemSetAccess")]
    pub fn revoke(self) -> Result<(), Error> {
        let this = core::mem::ManuallyDrop::new(self);
        this.end()
    }

    fn end(&self) -> Result<(), Error> {
        let a = &self.access;
        // Finish all work that may touch the mapping before access goes away: every context, even
        // after one reports an (older, sticky) error. Then revoke in any case, and report the first
        // error.
        let synced = first_error(a.contexts.iter().map(Context::synchronize));
        let revoked = revoke(a.ptr, a.size, a.contexts);
        synced?;
        Ok(revoked?)
    }
}

impl<'map, M: AccessMode> core::ops::Deref for RevocableAccess<'map, M> {
    type Target = Access<'map, M>;
    fn deref(&self) -> &Access<'map, M> {
        &self.access
    }
}

// No `DerefMut`: `mem::replace` through it could swap another grant in, which would then be revoked
// in this one's place. The writable views are offered directly instead.
impl RevocableAccess<'_, ReadWrite> {
    /// As [`Access::slice_mut`].
    ///
    /// # Errors
    /// As [`Access::slice_mut`].
    pub fn slice_mut<T: Pod>(&mut self) -> Result<DeviceSliceMut<'_, T>, Error> {
        self.access.slice_mut()
    }

    /// As [`Access::slice_mut_on`].
    ///
    /// # Errors
    /// As [`Access::slice_mut_on`].
    pub fn slice_mut_on<T: Pod>(&mut self, device: Device) -> Result<DeviceSliceMut<'_, T>, Error> {
        self.access.slice_mut_on(device)
    }
}

impl<M: AccessMode> Drop for RevocableAccess<'_, M> {
    fn drop(&mut self) {
        // Errors are ignored: `drop` cannot return them; call `revoke` to see them.
        let _ = self.end();
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

/// The access descriptors of a grant to the devices of a list of contexts, in one mode: built
/// before the driver calls that come first (a page's `cuMemMap`), so that the loads they take (the
/// list, each context's device) are not made between two driver calls, whose work leaves the
/// host's caches cold, where nothing else would overlap their misses. One device (the common
/// case) needs no heap allocation.
pub(crate) enum Grant {
    One([sys::CUmemAccessDesc; 1]),
    /// Empty for an empty list: then nothing is granted.
    Many(Vec<sys::CUmemAccessDesc>),
}

impl Grant {
    /// The grant of every device of `contexts` in the mode `flags`.
    pub(crate) fn new(contexts: &[Context], flags: u32) -> Grant {
        match contexts {
            [one] => Grant::One([access_desc(one, flags)]),
            all => Grant::Many(all.iter().map(|c| access_desc(c, flags)).collect()),
        }
    }

    /// `cuMemSetAccess` of `[ptr, ptr + size)`, a whole mapped range, for every device of the
    /// grant; no call for an empty one.
    pub(crate) fn set(&self, ptr: sys::CUdeviceptr, size: usize) -> DriverResult<()> {
        match self {
            Grant::One(one) => set_descs(ptr, size, one),
            Grant::Many(many) => set_descs(ptr, size, many),
        }
    }
}

/// The access descriptor of the device of `context` in the mode `flags`.
fn access_desc(context: &Context, flags: u32) -> sys::CUmemAccessDesc {
    sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CU_MEM_LOCATION_TYPE_DEVICE,
            id: context.device().as_raw(),
        },
        flags,
    }
}

/// `cuMemSetAccess` of `[ptr, ptr + size)`, a whole mapped range, with `descs`; no call where
/// `descs` is empty.
fn set_descs(
    ptr: sys::CUdeviceptr,
    size: usize,
    descs: &[sys::CUmemAccessDesc],
) -> DriverResult<()> {
    if descs.is_empty() {
        return Ok(());
    }
    // SAFETY: the caller passes a whole range it has mapped; `descs` is a live, initialised array of
    // `descs.len()` access-descriptor mirrors (layout asserted in `sys`).
    check(unsafe { sys::cuMemSetAccess(ptr, size, descs.as_ptr(), descs.len()) })
}

/// `cuMemSetAccess` of `[ptr, ptr + size)`, a whole mapped range, for every device of `contexts`.
pub(crate) fn set_access(
    ptr: sys::CUdeviceptr,
    size: usize,
    contexts: Contexts<'_>,
    flags: u32,
) -> DriverResult<()> {
    // One device (the common case) needs no heap allocation.
    match contexts {
        Contexts::One(c) => set_descs(ptr, size, &[access_desc(c, flags)]),
        Contexts::Many { all, .. } => {
            let many: Vec<_> = all.iter().map(|c| access_desc(c, flags)).collect();
            set_descs(ptr, size, &many)
        }
    }
}

/// Sets every device of `contexts` back to no access to `[ptr, ptr + size)`, a whole mapped range: in
/// one call, or device by device where the driver refuses the one call, so that one device's refusal
/// leaves no other device granted.
///
/// # Errors
/// The first device's refusal, where revoking it alone failed too.
pub(crate) fn revoke(
    ptr: sys::CUdeviceptr,
    size: usize,
    contexts: Contexts<'_>,
) -> DriverResult<()> {
    match set_access(ptr, size, contexts, sys::CU_MEM_ACCESS_FLAGS_PROT_NONE) {
        Ok(()) => Ok(()),
        Err(_) => revoke_each(ptr, size, contexts),
    }
}

/// [`revoke`] device by device: every device is tried; the first refusal is returned.
fn revoke_each(ptr: sys::CUdeviceptr, size: usize, contexts: Contexts<'_>) -> DriverResult<()> {
    first_error(contexts.iter().map(|context| {
        set_access(
            ptr,
            size,
            Contexts::One(context),
            sys::CU_MEM_ACCESS_FLAGS_PROT_NONE,
        )
    }))
}

/// How many `T`s fill `bytes` exactly.
///
/// A zero-sized `T` is refused twice. At compile time, by a `const` assertion evaluated where a view
/// of that `T` is compiled to machine code ([`Access::slice`] and friends); `cargo check` does not
/// evaluate it:
///
/// ```compile_fail,E0080
/// # use cuda_vmm::{Context, Device, PhysicalAllocation, ReadOnly, VirtualReservation};
/// # fn main() -> Result<(), cuda_vmm::Error> {
/// # let device = Device::get(0)?;
/// # let context = Context::new(device)?;
/// # let memory = PhysicalAllocation::new(device, 2 << 20)?;
/// # let mut reservation = VirtualReservation::new(2 << 20, 0)?;
/// # let mut region = reservation.region();
/// # let mut mapping = region.map(&memory)?;
/// let access = mapping.grant(&context, ReadOnly)?;
/// let units = access.slice::<()>()?; // does not build
/// # Ok(())
/// # }
/// ```
///
/// And at run time by [`element_count`], the check that holds wherever the assertion is not
/// evaluated.
pub(crate) fn elements<T>(bytes: usize) -> Result<usize, Error> {
    const {
        assert!(
            size_of::<T>() != 0,
            "a view of a zero-sized type: it would cover no memory"
        );
    }
    element_count(bytes, size_of::<T>())
}

/// How many elements of `element_size` bytes fill `bytes` exactly; the run-time half of [`elements`],
/// without its compile-time assertion, so that a zero `element_size` can be tested.
///
/// # Errors
/// [`Error::NotWholeElements`] where `bytes` is not a whole number of elements, and for a zero
/// `element_size`.
fn element_count(bytes: usize, element_size: usize) -> Result<usize, Error> {
    if element_size == 0 || !bytes.is_multiple_of(element_size) {
        return Err(Error::NotWholeElements {
            bytes,
            element_size,
        });
    }
    Ok(bytes / element_size)
}

/// Retains the primary context of each device, once per device, in order: an owned type's kept
/// access set.
///
/// # Errors
/// [`Error::ZeroSize`] for an empty list; the driver's error of a retain.
pub(crate) fn retain_distinct(devices: &[Device]) -> Result<Vec<Context>, Error> {
    if devices.is_empty() {
        return Err(Error::ZeroSize { what: "access set" });
    }
    let mut contexts: Vec<Context> = Vec::with_capacity(devices.len());
    for &device in devices {
        if contexts.iter().all(|c| c.device() != device) {
            contexts.push(Context::new(device)?);
        }
    }
    Ok(contexts)
}

/// Calls `f` with the contexts as the grant helpers take them (one without a heap allocation). An
/// empty list grants nothing and calls nothing (a kept access set is never empty: the owned types
/// refuse one).
pub(crate) fn with_contexts(
    contexts: &[Context],
    f: impl FnOnce(Contexts<'_>) -> DriverResult<()>,
) -> DriverResult<()> {
    if let [one] = contexts {
        return f(Contexts::One(one));
    }
    let refs: Vec<&Context> = contexts.iter().collect();
    Contexts::many(&refs).map_or(Ok(()), f)
}

#[cfg(test)]
mod tests {
    use super::{element_count, elements};
    use crate::error::Error;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn elements_is_exact_division(bytes in any::<usize>()) {
            prop_assert_eq!(elements::<u8>(bytes), Ok(bytes));
            let r = elements::<[u8; 12]>(bytes);
            prop_assert_eq!(r.is_ok(), bytes % 12 == 0);
            if let Ok(n) = r {
                prop_assert_eq!(n * 12, bytes);
            }
        }
    }

    #[test]
    fn zero_sized_elements_are_refused() {
        // `elements::<()>` does not build (its const assertion); the run-time check behind it:
        for bytes in [0, 1, 4096, usize::MAX] {
            assert_eq!(
                element_count(bytes, 0),
                Err(Error::NotWholeElements {
                    bytes,
                    element_size: 0
                })
            );
        }
    }
}
