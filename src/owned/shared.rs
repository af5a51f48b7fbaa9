//! [`SharedPage`]: one physical allocation shared by handles and mappings, released with the last of
//! them; and [`Unmapped`], what an [`OwnedMapping`](super::OwnedMapping)'s unmap gives back.

use core::fmt;
use std::sync::Arc;

use crate::device::Device;
use crate::error::Error;
use crate::vmm::physical::{Location, PhysicalAllocation};

/// One physical allocation, reference-counted: every clone of the handle and every mapping of it
/// ([`SharedReservation::map_shared`](super::SharedReservation::map_shared)) holds a share (an
/// [`Arc`]), and `cuMemRelease` runs when the last of them is dropped.
///
/// It is what a mapping of its own cannot be: the same bytes at several addresses, each address a
/// mapping with its own grant and mode. A prompt's prefix, written once, can be mapped read-only
/// into the reservation of every sequence that shares it, beside the pages each sequence writes.
///
/// The handle itself has no address and gives no view; only a mapping does, granted. Two mappings of
/// one page are two address ranges over the same bytes (an alias): a read-only grant protects one
/// range, not the bytes, and a write through a writable mapping is seen through every other. Device
/// bytes are never Rust memory, so two writers of one page race on the device at worst, not in
/// Rust.
///
/// # Examples
/// ```no_run
/// use cuda_vmm::owned::{SharedPage, SharedReservation};
/// use cuda_vmm::{Device, ReadOnly, ReadWrite};
///
/// # fn main() -> cuda_vmm::Result<()> {
/// let device = Device::get(0)?;
/// let page = cuda_vmm::allocation_granularity(device, cuda_vmm::Granularity::Minimum)?;
/// let prefix = SharedPage::new(device, page)?; // cuMemCreate, once
/// let writer = SharedReservation::new(page, 0)?;
/// let mut written = writer.map_shared(0, &prefix)?.keep_grant(&[device], ReadWrite)?;
/// written.slice_mut::<u8>()?.copy_from_host(&vec![7; page])?;
///
/// let reader = SharedReservation::new(page, 0)?;
/// let read = reader.map_shared(0, &prefix)?.keep_grant(&[device], ReadOnly)?;
/// assert_eq!(read.slice::<u8>()?.to_vec()?, vec![7; page]); // the same bytes, another address
/// drop((prefix, written)); // the memory stays: `read` holds a share of it
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SharedPage {
    /// Released (its `Drop` calls `cuMemRelease`) when the last share is dropped: every mapping of
    /// the page holds one, so no mapping is alive then, unless one was leaked with `mem::forget`,
    /// which leaks its share too.
    memory: Arc<PhysicalAllocation>,
}

impl fmt::Debug for SharedPage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedPage")
            .field("memory", &*self.memory)
            .field("shares", &self.share_count())
            .finish()
    }
}

impl SharedPage {
    /// `cuMemCreate` — allocate `size` bytes of pinned memory on `device`, to be shared; as
    /// [`PhysicalAllocation::new`].
    ///
    /// # Errors
    /// As [`PhysicalAllocation::new`].
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::{Device, owned::SharedPage, vmm::Location};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let page = SharedPage::new(device, 2 << 20)?;
    /// assert_eq!(page.location(), Location::Device(device));
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuMemCreate")]
    pub fn new(device: Device, size: usize) -> Result<SharedPage, Error> {
        Ok(SharedPage::from_allocation(PhysicalAllocation::new(
            device, size,
        )?))
    }

    /// Shares `memory`, an allocation of any location (`cuMemRelease` runs when the last share is
    /// dropped); no driver call.
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::{PhysicalAllocation, owned::SharedPage, vmm::AllocationOptions};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let memory = PhysicalAllocation::with_options(2 << 20, AllocationOptions::host_numa(0))?;
    /// let page = SharedPage::from_allocation(memory);
    /// assert_eq!(page.share_count(), 1);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn from_allocation(memory: PhysicalAllocation) -> SharedPage {
        SharedPage {
            memory: Arc::new(memory),
        }
    }

    /// The page's size in bytes.
    ///
    /// # Examples
    /// ```no_run
    /// # use cuda_vmm::{Device, owned::SharedPage};
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let page = SharedPage::new(Device::get(0)?, 2 << 20)?;
    /// assert_eq!(page.size(), 2 << 20);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn size(&self) -> usize {
        self.memory.size()
    }

    /// The minimum granularity of the page's location: offsets it is mapped at must be multiples of
    /// it.
    ///
    /// # Examples
    /// ```no_run
    /// # use cuda_vmm::{Device, owned::SharedPage};
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let page = SharedPage::new(Device::get(0)?, 2 << 20)?;
    /// assert_eq!(page.size() % page.granularity(), 0);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn granularity(&self) -> usize {
        self.memory.granularity()
    }

    /// Where the memory lives.
    ///
    /// # Examples
    /// ```no_run
    /// # use cuda_vmm::{Device, owned::SharedPage, vmm::Location};
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// assert_eq!(SharedPage::new(device, 2 << 20)?.location(), Location::Device(device));
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn location(&self) -> Location {
        self.memory.location()
    }

    /// The device whose memory this is; `None` for host memory.
    ///
    /// # Examples
    /// ```no_run
    /// # use cuda_vmm::{Device, owned::SharedPage};
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// assert_eq!(SharedPage::new(device, 2 << 20)?.device(), Some(device));
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn device(&self) -> Option<Device> {
        match self.location() {
            Location::Device(device) => Some(device),
            _ => None,
        }
    }

    /// How many handles and mappings share the page, this handle included: a snapshot, which other
    /// threads may change at once (by cloning or dropping a handle, or mapping or unmapping the
    /// page). The memory is released when the count would reach zero.
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::{Device, owned::SharedPage, owned::SharedReservation};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let page = SharedPage::new(Device::get(0)?, 2 << 20)?;
    /// let reservation = SharedReservation::new(4 << 20, 0)?;
    /// let mapping = reservation.map_shared(0, &page)?;
    /// let again = page.clone();
    /// assert_eq!(page.share_count(), 3); // two handles and one mapping
    /// drop((mapping, again));
    /// assert_eq!(page.share_count(), 1);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn share_count(&self) -> usize {
        Arc::strong_count(&self.memory)
    }

    /// The allocation, for the owners in this crate that map it; it stays valid while `self` lives.
    pub(crate) fn allocation(&self) -> &PhysicalAllocation {
        &self.memory
    }

    /// `cuMemRelease` — drop this share, and release the memory if it was the last one: `Ok(true)`
    /// where it was released, `Ok(false)` where other handles or mappings still share it (it is
    /// released when the last of them is dropped). `drop` ignores the driver's answer; this reports
    /// it.
    ///
    /// # Errors
    /// The driver's error, if any.
    ///
    /// # Examples
    /// ```no_run
    /// # use cuda_vmm::{Device, owned::SharedPage};
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let page = SharedPage::new(Device::get(0)?, 2 << 20)?;
    /// let other = page.clone();
    /// assert!(!page.release()?); // `other` still shares it
    /// assert!(other.release()?); // the last share: cuMemRelease
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuMemRelease")]
    pub fn release(self) -> Result<bool, Error> {
        match Arc::try_unwrap(self.memory) {
            Ok(memory) => {
                memory.release()?;
                Ok(true)
            }
            Err(_) => Ok(false),
        }
    }

    /// The allocation itself, where this is the last share of it (no other handle and no mapping
    /// holds one); otherwise the page back, unchanged. No driver call.
    ///
    /// # Errors
    /// `self`, where other handles or mappings still share the page.
    ///
    /// # Examples
    /// ```no_run
    /// # use cuda_vmm::{Device, PhysicalAllocation, owned::SharedPage};
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let page = SharedPage::new(Device::get(0)?, 2 << 20)?;
    /// let other = page.clone();
    /// let page = page.into_allocation().unwrap_err(); // `other` shares it
    /// drop(other);
    /// let memory: PhysicalAllocation = page.into_allocation().unwrap();
    /// # Ok(())
    /// # }
    /// ```
    pub fn into_allocation(self) -> Result<PhysicalAllocation, SharedPage> {
        Arc::try_unwrap(self.memory).map_err(|memory| SharedPage { memory })
    }

    /// Drops this share: the allocation where it was the last, `None` where other shares keep
    /// the page. One atomic decrement, where [`into_allocation`](SharedPage::into_allocation)
    /// tries to take the last share first and hands back a share that is not.
    pub(crate) fn drop_share(self) -> Option<PhysicalAllocation> {
        Arc::into_inner(self.memory)
    }
}

/// What [`OwnedMapping::unmap`](super::OwnedMapping::unmap) gives back: the memory the mapping
/// owned, or its share of a [`SharedPage`]. Either can be mapped again.
///
/// # Examples
/// ```no_run
/// use cuda_vmm::owned::{SharedReservation, Unmapped};
/// use cuda_vmm::{Device, PhysicalAllocation};
///
/// # fn main() -> cuda_vmm::Result<()> {
/// let device = Device::get(0)?;
/// let reservation = SharedReservation::new(4 << 20, 0)?;
/// let mapping = reservation.map(0, PhysicalAllocation::new(device, 2 << 20)?)?;
/// match mapping.unmap()? {
///     Unmapped::Owned(memory) => drop(reservation.map(2 << 20, memory)?),
///     Unmapped::Shared(page) => drop(reservation.map_shared(2 << 20, &page)?),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub enum Unmapped {
    /// The memory of a mapping made by [`SharedReservation::map`](super::SharedReservation::map).
    Owned(PhysicalAllocation),
    /// The share of a mapping made by
    /// [`SharedReservation::map_shared`](super::SharedReservation::map_shared).
    Shared(SharedPage),
}

impl Unmapped {
    /// The allocation, owned or shared.
    ///
    /// # Examples
    /// ```no_run
    /// # use cuda_vmm::owned::SharedReservation;
    /// # use cuda_vmm::{Device, PhysicalAllocation};
    /// # fn main() -> cuda_vmm::Result<()> {
    /// # let device = Device::get(0)?;
    /// # let reservation = SharedReservation::new(2 << 20, 0)?;
    /// let mapping = reservation.map(0, PhysicalAllocation::new(device, 2 << 20)?)?;
    /// assert_eq!(mapping.unmap()?.memory().size(), 2 << 20);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn memory(&self) -> &PhysicalAllocation {
        match self {
            Unmapped::Owned(memory) => memory,
            Unmapped::Shared(page) => page.allocation(),
        }
    }
}
