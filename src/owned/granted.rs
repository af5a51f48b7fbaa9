//! [`GrantedMapping`]: an [`OwnedMapping`] that keeps its grant, so that it is stored with its access
//! and hands out views at every use without a new `cuMemSetAccess`: of one mapping, or of several
//! that lie back to back in one reservation (a joined view).

use core::fmt;
use core::marker::PhantomData;

use bytemuck::Pod;

use super::mapping::OwnedMapping;
use crate::device::{Context, Device};
use crate::error::{Error, with_cleanup};
use crate::sys;
use crate::view::{DeviceSlice, DeviceSliceMut, Reach};
use crate::vmm::access::{AccessMode, ReadWrite, elements, revoke, set_access};
use crate::vmm::access::{retain_distinct, with_contexts};

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

/// The joined views: one view over several granted mappings that lie back to back.
impl<M: AccessMode> GrantedMapping<M> {
    /// A read-only view of several granted mappings as one range of `T`s: `mappings` in address
    /// order, each right after the one before in the same [`SharedReservation`](super::SharedReservation),
    /// all granted to the same set of devices (in mode `M`, so in one mode); copied through the
    /// first device of the first mapping's access set. No driver call: a copy through the view
    /// crosses the mappings' boundaries as one address range. The view borrows every mapping it
    /// spans, so none of them can be revoked, unmapped or dropped while it lives.
    ///
    /// `mappings` is anything that yields the mappings: `[&a, &b, &c]`, `&pages[2..5]`,
    /// `pages.iter()`.
    ///
    /// # Errors
    /// Before any driver call: [`Error::ZeroSize`] for no mappings; [`Error::PageRange`] naming the
    /// bytes, counted from the reservation's base, of a mapping in another reservation than the
    /// first, of a gap between two mappings, of a mapping that is not right after the one before it
    /// (out of order, or the same one twice), or of a mapping granted to other devices than the
    /// first; [`Error::NotWholeElements`] where the joined size is not a whole number of `T`s.
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::owned::{GrantedMapping, SharedReservation};
    /// use cuda_vmm::{Device, PhysicalAllocation, ReadOnly};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let page = 2 << 20;
    /// let reservation = SharedReservation::new(4 * page, 0)?;
    /// let pages = (0..3)
    ///     .map(|i| {
    ///         let memory = PhysicalAllocation::new(device, page)?;
    ///         reservation.map(i * page, memory)?.keep_grant(&[device], ReadOnly)
    ///     })
    ///     .collect::<cuda_vmm::Result<Vec<GrantedMapping<ReadOnly>>>>()?;
    /// let all = GrantedMapping::slice_joined::<u32>(&pages)?; // 6 MiB, one view
    /// assert_eq!(all.len(), 3 * page / 4);
    /// let two = GrantedMapping::slice_joined::<u32>([&pages[1], &pages[2]])?;
    /// assert!(GrantedMapping::slice_joined::<u32>([&pages[0], &pages[2]]).is_err()); // a gap
    /// # drop(two);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// No mapping it spans is revoked while it lives:
    /// ```compile_fail,E0505
    /// # use cuda_vmm::owned::{GrantedMapping, SharedReservation};
    /// # use cuda_vmm::{Device, PhysicalAllocation, ReadOnly};
    /// # fn main() -> cuda_vmm::Result<()> {
    /// # let device = Device::get(0)?;
    /// # let page = 2 << 20;
    /// # let reservation = SharedReservation::new(2 * page, 0)?;
    /// let a = reservation.map(0, PhysicalAllocation::new(device, page)?)?.keep_grant(&[device], ReadOnly)?;
    /// let b = reservation.map(page, PhysicalAllocation::new(device, page)?)?.keep_grant(&[device], ReadOnly)?;
    /// let view = GrantedMapping::slice_joined::<u32>([&a, &b])?;
    /// b.revoke()?; // `view` still reads `b`
    /// view.to_vec()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn slice_joined<'map, T: Pod>(
        mappings: impl IntoIterator<Item = &'map GrantedMapping<M>>,
    ) -> Result<DeviceSlice<'map, T>, Error>
    where
        M: 'map,
    {
        let (ptr, len, first) = joined::<M, T>(&mappings.into_iter().collect::<Vec<_>>())?;
        let context = first
            .access
            .first()
            .ok_or(Error::ZeroSize { what: "access set" })?;
        // `joined` checked that the mappings cover `[ptr, ptr + len * size_of::<T>())` back to
        // back, each granted (by `keep_grant`) to every device of the first one's access set; all
        // stay mapped and granted for `'map`, for which they are borrowed (revoking and unmapping
        // consume them).
        Ok(DeviceSlice::from_granted(
            ptr,
            len,
            context,
            Reach::Owned(&first.access),
        ))
    }
}

impl GrantedMapping<ReadWrite> {
    /// A writable view of several granted mappings as one range of `T`s, as
    /// [`slice_joined`](GrantedMapping::slice_joined): `mappings` back to back in one reservation,
    /// all [`ReadWrite`] and granted to the same set of devices. It borrows every mapping it spans
    /// exclusively. No driver call.
    ///
    /// `mappings` is anything that yields them mutably: `[&mut a, &mut b]`, `&mut pages[2..5]`,
    /// `pages.iter_mut()`.
    ///
    /// # Errors
    /// As [`slice_joined`](GrantedMapping::slice_joined).
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::owned::{GrantedMapping, SharedReservation};
    /// use cuda_vmm::{Device, PhysicalAllocation, ReadWrite};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let page = 2 << 20;
    /// let reservation = SharedReservation::new(2 * page, 0)?;
    /// let mut a = reservation.map(0, PhysicalAllocation::new(device, page)?)?.keep_grant(&[device], ReadWrite)?;
    /// let mut b = reservation.map(page, PhysicalAllocation::new(device, page)?)?.keep_grant(&[device], ReadWrite)?;
    /// let mut both = GrantedMapping::slice_joined_mut::<u8>([&mut a, &mut b])?;
    /// both.copy_from_host(&vec![3; 2 * page])?; // one copy across the boundary
    /// assert_eq!(b.slice::<u8>()?.to_vec()?, vec![3; page]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn slice_joined_mut<'map, T: Pod>(
        mappings: impl IntoIterator<Item = &'map mut GrantedMapping<ReadWrite>>,
    ) -> Result<DeviceSliceMut<'map, T>, Error> {
        // Each exclusive borrow is given up for a shared one of the same `'map`: the caller's
        // mappings stay borrowed exclusively for `'map`, and this function reads them only.
        let shared: Vec<&'map GrantedMapping<ReadWrite>> = mappings
            .into_iter()
            .map(|m| -> &'map GrantedMapping<ReadWrite> { m })
            .collect();
        let (ptr, len, first) = joined::<ReadWrite, T>(&shared)?;
        let context = first
            .access
            .first()
            .ok_or(Error::ZeroSize { what: "access set" })?;
        // As for `slice_joined`; every mapping is granted read-write, and borrowed exclusively by
        // the caller for `'map`, so the view is the only access to the joined range meanwhile.
        Ok(DeviceSliceMut::from_granted(
            ptr,
            len,
            context,
            Reach::Owned(&first.access),
        ))
    }
}

/// The first address and the length in `T`s of the range that `mappings` cover back to back, and
/// the first mapping (whose access set the view carries), or the refusal of [`check_joined`].
fn joined<'map, M: AccessMode, T>(
    mappings: &[&'map GrantedMapping<M>],
) -> Result<(sys::CUdeviceptr, usize, &'map GrantedMapping<M>), Error> {
    let first = *mappings.first().ok_or(Error::ZeroSize {
        what: "list of mappings to join",
    })?;
    let parts: Vec<Part> = mappings
        .iter()
        .map(|m| Part {
            start: m.mapping.offset(),
            end: m.mapping.offset().saturating_add(m.mapping.size()),
            same_reservation: m.mapping.reservation().same_as(first.mapping.reservation()),
            same_access: same_devices(&m.access, &first.access),
        })
        .collect();
    let (start, end) = check_joined(&parts)?;
    let len = elements::<T>(end.saturating_sub(start))?;
    Ok((first.mapping.ptr(), len, first))
}

/// Whether two access sets (each of distinct devices) name the same devices, in any order.
fn same_devices(a: &[Context], b: &[Context]) -> bool {
    a.len() == b.len() && a.iter().all(|c| b.iter().any(|d| d.device() == c.device()))
}

/// What [`check_joined`] reads of one mapping: its bytes from the reservation's base, and whether
/// its reservation and its access set are the first mapping's.
#[derive(Clone, Copy)]
struct Part {
    start: usize,
    end: usize,
    same_reservation: bool,
    same_access: bool,
}

/// The bytes `[start, end)` that `parts` cover, where each lies right after the one before in the
/// first one's reservation, with its access set; otherwise the first part that does not, as an
/// error naming its bytes (or the gap's).
fn check_joined(parts: &[Part]) -> Result<(usize, usize), Error> {
    let first = parts.first().ok_or(Error::ZeroSize {
        what: "list of mappings to join",
    })?;
    let mut end = first.end;
    for part in parts.iter().skip(1) {
        let refused = |problem| Error::PageRange {
            start: part.start,
            end: part.end,
            problem,
        };
        if !part.same_reservation {
            return Err(refused(
                "are in another reservation than the first mapping joined",
            ));
        }
        if part.start > end {
            return Err(Error::PageRange {
                start: end,
                end: part.start,
                problem: "lie between two mappings joined, in neither (a gap)",
            });
        }
        if part.start < end {
            return Err(refused(
                "are not right after the mapping joined before them (out of order, or joined twice)",
            ));
        }
        if !part.same_access {
            return Err(refused(
                "are granted to other devices than the first mapping joined",
            ));
        }
        end = part.end;
    }
    Ok((first.start, end))
}

#[cfg(test)]
mod tests {
    use super::{Part, check_joined};
    use crate::error::Error;

    fn part(start: usize, end: usize) -> Part {
        Part {
            start,
            end,
            same_reservation: true,
            same_access: true,
        }
    }

    #[test]
    fn back_to_back_mappings_join() {
        assert_eq!(check_joined(&[part(4, 6)]), Ok((4, 6)));
        assert_eq!(
            check_joined(&[part(2, 4), part(4, 6), part(6, 10)]),
            Ok((2, 10))
        );
    }

    #[test]
    fn refusals_name_the_bytes() {
        assert_eq!(
            check_joined(&[]),
            Err(Error::ZeroSize {
                what: "list of mappings to join"
            })
        );
        let gap = check_joined(&[part(0, 2), part(2, 4), part(6, 8)]);
        assert!(
            matches!(gap, Err(Error::PageRange { start: 4, end: 6, problem }) if problem.contains("gap")),
            "{gap:?}"
        );
        let backwards = check_joined(&[part(2, 4), part(0, 2)]);
        assert!(
            matches!(backwards, Err(Error::PageRange { start: 0, end: 2, problem }) if problem.contains("out of order")),
            "{backwards:?}"
        );
        let twice = check_joined(&[part(0, 2), part(0, 2)]);
        assert!(
            matches!(twice, Err(Error::PageRange { start: 0, end: 2, problem }) if problem.contains("twice")),
            "{twice:?}"
        );
        let elsewhere = Part {
            same_reservation: false,
            ..part(2, 4)
        };
        let other = check_joined(&[part(0, 2), elsewhere]);
        assert!(
            matches!(other, Err(Error::PageRange { start: 2, end: 4, problem }) if problem.contains("reservation")),
            "{other:?}"
        );
        let narrower = Part {
            same_access: false,
            ..part(2, 4)
        };
        let access = check_joined(&[part(0, 2), narrower]);
        assert!(
            matches!(access, Err(Error::PageRange { start: 2, end: 4, problem }) if problem.contains("other devices")),
            "{access:?}"
        );
    }
}
