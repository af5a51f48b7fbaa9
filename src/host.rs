//! Host memory through VMM: physical memory located on the host (`CU_MEM_LOCATION_TYPE_HOST`,
//! `CU_MEM_LOCATION_TYPE_HOST_NUMA`), mapped once, granted to devices like device memory and to the
//! CPU, which then reads and writes it as Rust slices.
//!
//! ```text
//! HostAllocation ----(&mut)---- Region::map_host ----> HostMapping<'va, 'mem>
//!                                                        |  (&mut)          | (&mut)
//!                                                        v                  v
//!                                        grant (device): Access    grant_host (CPU): HostAccess
//!                                                        |                  |  (&mut / &)
//!                                                        v                  v
//!                                            DeviceSlice(Mut)          &mut [T] / &[T]
//! ```
//!
//! The owned layer has its counterpart: an [`OwnedHostMapping`] owns the allocation and a
//! reservation of its own, keeps its device grant (an access set and a mode) and its CPU grant, and
//! has no lifetime, so it lives in a struct field and moves between threads. Its device views borrow
//! it and its [`host_access`](OwnedHostMapping::host_access) borrows it mutably, so the same rule
//! holds: no CPU slice while a device view of the bytes exists.
//!
//! ```text
//! HostAllocation ---- OwnedHostMapping::new (owns it) ----> OwnedHostMapping<M>
//!                                                        |  (&self / &mut self)  | (&mut self)
//!                                                        v                       v
//!                                          DeviceSlice(Mut), no new grant   host_access: HostAccess
//! ```
//!
//! [`HostAccess`] says why the CPU's slices are sound. Host memory is never shareable with another
//! process here (see [`AllocationOptions`] for which options host
//! locations take).
//!
//! # Example
//! ```no_run
//! use cuda_vmm::host::HostAllocation;
//! use cuda_vmm::{Context, Device, ReadOnly, ReadWrite, VirtualReservation};
//!
//! # fn main() -> Result<(), cuda_vmm::Error> {
//! let device = Device::get(0)?;
//! let context = Context::new(device)?;
//! let mut memory = HostAllocation::near(device, 2 << 20)?;
//! let mut reservation = VirtualReservation::new(2 << 20, 0)?;
//! let mut region = reservation.region();
//! let mut mapping = region.map_host(&mut memory)?; // borrows `memory` mutably: no alias
//! mapping.grant_host(ReadWrite)?.as_mut_slice::<u32>()?.fill(7); // the CPU writes a &mut [u32]
//! let on_device = mapping.grant(&context, ReadOnly)?; // the device reads the same bytes
//! assert!(on_device.slice::<u32>()?.to_vec()?.iter().all(|&x| x == 7));
//! # Ok(())
//! # }
//! ```
//!
//! The same with the owned mapping, which a struct can keep:
//! ```no_run
//! use cuda_vmm::host::{HostAllocation, OwnedHostMapping};
//! use cuda_vmm::{Device, ReadOnly};
//!
//! # fn main() -> Result<(), cuda_vmm::Error> {
//! let device = Device::get(0)?;
//! let memory = HostAllocation::near(device, 2 << 20)?;
//! let mut host = OwnedHostMapping::new(memory, &[device], ReadOnly)?; // map, grant CPU and device
//! host.host_access().as_mut_slice::<u32>()?.fill(7); // the CPU writes a &mut [u32]
//! assert!(host.slice::<u32>()?.to_vec()?.iter().all(|&x| x == 7)); // the device reads it
//! host.free()?; // cuMemUnmap, cuMemRelease, cuMemAddressFree
//! # Ok(())
//! # }
//! ```

use core::fmt;
use core::marker::PhantomData;
use core::ops::Deref;

use bytemuck::Pod;

use crate::device::{Context, Device};
use crate::error::{DriverResult, Error, Result, check};
use crate::sys;
use crate::vmm::access::{Access, AccessMode, ReadWrite, RevocableAccess, elements};
use crate::vmm::mapping::Mapping;
use crate::vmm::physical::{AllocationOptions, Location, PhysicalAllocation};
use crate::vmm::reservation::Region;

// The owned layer's host mapping: no lifetime, its grants kept.
mod owned;

pub use owned::OwnedHostMapping;

/// Host memory for VMM: a [`PhysicalAllocation`] located in host memory, released on drop.
///
/// Map it with [`Region::map_host`], which borrows it mutably, and grant the CPU access with
/// [`HostMapping::grant_host`] to read and write it as slices; grant devices access with
/// [`HostMapping::grant`] as for device memory. It dereferences to the [`PhysicalAllocation`], so
/// [`Region::map`] maps it too, as device-only memory (no CPU grant is offered there).
///
/// Never shareable with another process: the driver refuses a shareable handle for
/// [`Location::Host`], and another process writing bytes this one borrows as a slice would be
/// undefined behaviour. Created only after the device's attribute says the device supports it.
pub struct HostAllocation {
    memory: PhysicalAllocation,
}

impl fmt::Debug for HostAllocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HostAllocation").field(&self.memory).finish()
    }
}

impl HostAllocation {
    /// `cuMemCreate` — allocate `size` bytes of host memory on no particular NUMA node
    /// ([`Location::Host`]), for use by `device`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] where `device` does not support it ([`Device::supports_host_memory`]:
    /// CUDA 13.0 drivers and later), checked first; otherwise as [`PhysicalAllocation::new`].
    #[doc(alias = "cuMemCreate")]
    pub fn new(device: Device, size: usize) -> Result<HostAllocation, Error> {
        if !device.supports_host_memory()? {
            return Err(Error::Unsupported {
                what: "VMM memory located on the host",
                device: device.as_raw(),
                attribute: sys::CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            });
        }
        HostAllocation::create(size, AllocationOptions::host())
    }

    /// `cuMemCreate` — allocate `size` bytes of host memory on NUMA node `node`
    /// ([`Location::HostNuma`]; node 0 where the system has no NUMA), for use by `device`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] where `device` does not support it
    /// ([`Device::supports_host_numa_memory`]), checked first; the driver's error for a node it does
    /// not know; otherwise as [`PhysicalAllocation::new`].
    #[doc(alias = "cuMemCreate")]
    pub fn on_numa_node(device: Device, node: u16, size: usize) -> Result<HostAllocation, Error> {
        if !device.supports_host_numa_memory()? {
            return Err(Error::Unsupported {
                what: "VMM memory located on a host NUMA node",
                device: device.as_raw(),
                attribute: sys::CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            });
        }
        HostAllocation::create(size, AllocationOptions::host_numa(node))
    }

    /// `cuMemCreate` — as [`on_numa_node`](HostAllocation::on_numa_node), on the NUMA node closest to
    /// `device` ([`Device::host_numa_node`]), or node 0 where the system has no NUMA.
    ///
    /// # Errors
    /// As [`on_numa_node`](HostAllocation::on_numa_node).
    #[doc(alias = "cuMemCreate")]
    pub fn near(device: Device, size: usize) -> Result<HostAllocation, Error> {
        let node = device.host_numa_node()?.unwrap_or(0);
        HostAllocation::on_numa_node(device, node, size)
    }

    fn create(size: usize, options: AllocationOptions) -> Result<HostAllocation, Error> {
        Ok(HostAllocation {
            memory: PhysicalAllocation::with_options(size, options)?,
        })
    }

    /// `cuMemRelease` — release the allocation and report the driver's answer, which `drop` ignores.
    ///
    /// # Errors
    /// The driver's error, if any.
    #[doc(alias = "cuMemRelease")]
    pub fn release(self) -> Result<()> {
        self.memory.release()
    }
}

impl Deref for HostAllocation {
    type Target = PhysicalAllocation;
    fn deref(&self) -> &PhysicalAllocation {
        &self.memory
    }
}

impl<'va> Region<'va> {
    /// `cuMemMap` — map the whole of `memory` at the start of the region, as its only mapping, and
    /// shrink the region by its size.
    ///
    /// Borrowing `memory` mutably for as long as the mapping lives is what lets the CPU grant hand out
    /// `&mut [T]`: no other mapping of the same bytes (an alias) can exist meanwhile.
    ///
    /// # Errors
    /// As [`Region::map`].
    #[doc(alias = "cuMemMap")]
    pub fn map_host<'mem>(
        &mut self,
        memory: &'mem mut HostAllocation,
    ) -> Result<HostMapping<'va, 'mem>, Error> {
        let memory: &'mem HostAllocation = memory;
        let mapping = self.map(&memory.memory)?;
        Ok(HostMapping {
            mapping,
            location: memory.location(),
            _memory: PhantomData,
        })
    }
}

/// The only mapping of a [`HostAllocation`], unmapped on drop: granted to devices as any
/// [`Mapping`], and to the CPU with [`grant_host`](HostMapping::grant_host).
///
/// # Lifetimes
/// - `'va`: the mutable borrow of the reservation, as for [`Mapping`].
/// - `'mem`: the **mutable** borrow of the host allocation: it cannot be mapped again, released,
///   dropped or moved while the mapping lives.
pub struct HostMapping<'va, 'mem> {
    mapping: Mapping<'va, 'mem>,
    location: Location,
    /// The exclusive borrow of the allocation: covariant in `'mem`; `Send`/`Sync` as
    /// `&mut HostAllocation` (both).
    _memory: PhantomData<&'mem mut HostAllocation>,
}

impl fmt::Debug for HostMapping<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostMapping")
            .field("ptr", &format_args!("{:#x}", self.mapping.range().ptr()))
            .field("size", &self.mapping.size())
            .field("location", &self.location)
            .finish()
    }
}

impl<'va> HostMapping<'va, '_> {
    /// The mapped size in bytes.
    #[must_use]
    pub fn size(&self) -> usize {
        self.mapping.size()
    }

    /// `cuMemSetAccess` — grant the device of `context` access, as [`Mapping::grant`]. The returned
    /// [`Access`] borrows the mapping mutably: no CPU grant exists while it lives.
    ///
    /// # Errors
    /// As [`Mapping::grant`].
    #[doc(alias = "cuMemSetAccess")]
    pub fn grant<'map, M: AccessMode>(
        &'map mut self,
        context: &'map Context,
        mode: M,
    ) -> Result<Access<'map, M>, Error> {
        self.mapping.grant(context, mode)
    }

    /// `cuMemSetAccess` — grant every device of `contexts` access, as [`Mapping::grant_all`].
    ///
    /// # Errors
    /// As [`Mapping::grant_all`].
    #[doc(alias = "cuMemSetAccess")]
    pub fn grant_all<'map, M: AccessMode>(
        &'map mut self,
        contexts: &'map [&'map Context],
        mode: M,
    ) -> Result<Access<'map, M>, Error> {
        self.mapping.grant_all(contexts, mode)
    }

    /// `cuMemSetAccess` — grant every device of `contexts` access until the returned grant ends, as
    /// [`Mapping::grant_revocable`].
    ///
    /// # Errors
    /// As [`Mapping::grant_revocable`].
    #[doc(alias = "cuMemSetAccess")]
    pub fn grant_revocable<'map, M: AccessMode>(
        &'map mut self,
        contexts: &'map [&'map Context],
        mode: M,
    ) -> Result<RevocableAccess<'map, M>, Error> {
        self.mapping.grant_revocable(contexts, mode)
    }

    /// `cuMemSetAccess` with a host location (`CU_MEM_LOCATION_TYPE_HOST_NUMA`) — grant the CPU access
    /// to the whole mapping, in `mode`: the mapping's address is then the CPU's address of the same
    /// bytes (one unified address space).
    ///
    /// The returned [`HostAccess`] borrows the mapping mutably, so no device grant, and no device
    /// view, of the mapping exists while it lives. The driver keeps the CPU's permission until the
    /// mapping is unmapped or the CPU's access is set again; only a `HostAccess` reaches it from safe
    /// code.
    ///
    /// # Errors
    /// The driver's error ([`Error::Driver`]); the CPU's access is then unchanged.
    #[doc(alias = "cuMemSetAccess")]
    pub fn grant_host<M: AccessMode>(&mut self, mode: M) -> Result<HostAccess<'_, M>, Error> {
        let _ = mode;
        let (ptr, size) = (self.mapping.range().ptr(), self.mapping.size());
        // `[ptr, ptr + size)` is this mapping's whole range, mapped while `self` lives.
        set_cpu_access(ptr, size, self.location, M::FLAGS)?;
        Ok(HostAccess::new(ptr, size))
    }

    /// `cuMemUnmap` — unmap, as [`Mapping::unmap`], and give the region back.
    ///
    /// # Errors
    /// As [`Mapping::unmap`].
    #[doc(alias = "cuMemUnmap")]
    pub fn unmap(self) -> Result<Region<'va>> {
        self.mapping.unmap()
    }
}

/// `cuMemSetAccess` with a host location (`CU_MEM_LOCATION_TYPE_HOST_NUMA`) for the CPU, in `flags`,
/// over `[ptr, ptr + size)`: the whole range of a mapping of host memory at `location`, which the
/// caller keeps mapped. The one CPU grant of [`HostMapping`] and [`OwnedHostMapping`].
pub(crate) fn set_cpu_access(
    ptr: sys::CUdeviceptr,
    size: usize,
    location: Location,
    flags: u32,
) -> DriverResult<()> {
    let id = match location {
        Location::HostNuma(node) => i32::from(node),
        // The driver ignores the id of a host-NUMA access descriptor.
        _ => 0,
    };
    let desc = sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CU_MEM_LOCATION_TYPE_HOST_NUMA,
            id,
        },
        flags,
    };
    // SAFETY: the caller passes a whole range it has mapped and keeps mapped for the call; `desc` is
    // one live, initialised access-descriptor mirror (layout asserted in `sys`).
    check(unsafe { sys::cuMemSetAccess(ptr, size, &raw const desc, 1) })
}

/// The CPU's access to a [`HostMapping`] or an [`OwnedHostMapping`], in mode `M`: the mapped bytes as
/// Rust slices.
///
/// Made by [`HostMapping::grant_host`] and [`OwnedHostMapping::host_access`]. `as_slice` borrows it
/// shared, `as_mut_slice` (only for [`ReadWrite`]) mutably, so the borrow rules of Rust hold for the
/// bytes: many readers or one writer, and no slice outlives the grant. While it lives no device grant
/// of a [`HostMapping`], and no device view of either mapping, exists.
///
/// # Why the slices are sound
/// A `&mut [T]` promises that nothing else reads or writes those bytes while it lives; a `&[T]` that
/// nothing writes them. Device memory never held that promise (it is not Rust memory, and aliases may
/// reach it); host memory that the CPU borrows as a slice must. Every path to the same bytes is closed
/// by a borrow:
/// - **The same mapping, from a device.** Both grants borrow the [`HostMapping`] mutably: while a
///   [`HostAccess`] (the CPU grant) lives, no device [`Access`], and so no device view, of the mapping
///   exists, and a slice borrows the `HostAccess`. Device work made through safe code has finished when
///   its view's borrow ends (every copy and launch of this crate waits), so none runs meanwhile. The
///   device keeps the permission a grant gave it; only `unsafe` code holding a raw address could use it.
/// - **The same owned mapping, from a device.** An [`OwnedHostMapping`] keeps its device grant, but
///   hands out device views only from a borrow of itself, and its `HostAccess` borrows it mutably: no
///   device view of it exists while the `HostAccess` lives.
/// - **Another mapping of the same memory (an alias).** [`Region::map_host`] borrows the
///   [`HostAllocation`] mutably for as long as the mapping lives, so it is the allocation's only mapping:
///   `region.map(&memory)` (a shared borrow) does not compile meanwhile. An [`OwnedHostMapping`] owns
///   its allocation and lends it to no one. A mapping forgotten with `mem::forget` stays mapped in the
///   driver, but no view of it can be made any more.
/// - **Another process.** A `HostAllocation` has no `export`; memory shareable with other processes is
///   a [`ShareableAllocation`](crate::ipc::ShareableAllocation), which gives no CPU slices.
///
/// The bytes are plain data (`T: Pod`), so whatever the driver or a device left there is a valid `T`.
///
/// A CPU grant while a device view of the same mapping lives does not compile:
///
/// ```compile_fail,E0499
/// # use cuda_vmm::{Context, Device, host::HostAllocation, ReadWrite, VirtualReservation};
/// # fn main() -> Result<(), cuda_vmm::Error> {
/// # let device = Device::get(0)?;
/// # let context = Context::new(device)?;
/// # let mut memory = HostAllocation::near(device, 2 << 20)?;
/// # let mut reservation = VirtualReservation::new(2 << 20, 0)?;
/// # let mut region = reservation.region();
/// let mut mapping = region.map_host(&mut memory)?;
/// let mut on_device = mapping.grant(&context, ReadWrite)?;
/// let mut view = on_device.slice_mut::<u32>()?;
/// let mut cpu = mapping.grant_host(ReadWrite)?; // a device view of the mapping lives
/// view.copy_from_host(cpu.as_mut_slice::<u32>()?)?;
/// # Ok(())
/// # }
/// ```
///
/// # Lifetimes
/// `'map` is the mutable borrow of the host mapping.
pub struct HostAccess<'map, M: AccessMode> {
    ptr: sys::CUdeviceptr,
    size: usize,
    /// The exclusive borrow of the mapped bytes for `'map`: covariant; `Send`/`Sync` as `&mut [u8]`.
    _mapping: PhantomData<&'map mut [u8]>,
    /// The mode, at the type level only.
    _mode: PhantomData<M>,
}

impl<M: AccessMode> HostAccess<'_, M> {
    /// The CPU's access to `[ptr, ptr + size)`, which the caller has granted to the CPU in mode `M`
    /// and keeps mapped, granted and free of device views and aliases for as long as the borrow
    /// the result is given lives.
    fn new(ptr: sys::CUdeviceptr, size: usize) -> Self {
        HostAccess {
            ptr,
            size,
            _mapping: PhantomData,
            _mode: PhantomData,
        }
    }
}

impl<M: AccessMode> fmt::Debug for HostAccess<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostAccess")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("mode", &M::NAME)
            .finish()
    }
}

impl<M: AccessMode> HostAccess<'_, M> {
    /// The size of the granted range in bytes.
    #[must_use]
    pub fn size(&self) -> usize {
        self.size
    }

    /// The CPU's (and every granted device's) address of the first byte: an escape hatch that owns
    /// nothing. Valid for the CPU while `self` lives.
    #[must_use]
    pub fn as_raw_ptr(&self) -> u64 {
        self.ptr
    }

    /// The whole range as `len` values of `T`: the address and length a slice of it has.
    fn parts<T>(&self) -> Result<(usize, usize), Error> {
        let len = elements::<T>(self.size)?;
        let addr = usize::try_from(self.ptr).map_err(|_| Error::Overflow {
            what: "host mapping address",
        })?;
        if !addr.is_multiple_of(align_of::<T>()) {
            return Err(Error::NotAligned {
                what: "host mapping address",
                value: addr,
                granularity: align_of::<T>(),
            });
        }
        if isize::try_from(self.size).is_err() {
            return Err(Error::Overflow {
                what: "host slice size",
            });
        }
        Ok((addr, len))
    }

    /// The whole range as a slice of `T`, for as long as `self` is borrowed.
    ///
    /// # Errors
    /// [`Error::NotWholeElements`] where the size is not a whole number of `T`s; [`Error::NotAligned`]
    /// where the address is not aligned for `T` (it is a multiple of the allocation granularity, 2 MiB
    /// on an H200).
    pub fn as_slice<T: Pod>(&self) -> Result<&[T], Error> {
        let (addr, len) = self.parts::<T>()?;
        // SAFETY: `[addr, addr + len * size_of::<T>())` is host memory mapped at this address and
        // readable by the CPU (granted in `grant_host`, or kept granted by an `OwnedHostMapping`) for
        // as long as `self` lives, which borrows the mapping mutably: it is neither unmapped nor
        // granted again meanwhile. Nothing writes it while the slice lives: the allocation has no
        // other mapping (`map_host` borrowed it mutably; an `OwnedHostMapping` owns it and lends it
        // to no one) and is never shared with another process, no device view of this mapping
        // exists (device grants and an owned mapping's views borrow the mapping, which `self`
        // borrows mutably), and the only CPU writer would be a `&mut [T]`, which borrows `self`
        // mutably. The address is aligned for `T` and the size fits
        // `isize` (checked in `parts`); any bytes are a valid `T` (`Pod`). The pointer is made from
        // the address the driver exposed to this process (a foreign allocation).
        Ok(unsafe {
            core::slice::from_raw_parts(core::ptr::with_exposed_provenance::<T>(addr), len)
        })
    }
}

impl HostAccess<'_, ReadWrite> {
    /// The whole range as a mutable slice of `T`, for as long as `self` is borrowed mutably.
    ///
    /// # Errors
    /// As [`as_slice`](HostAccess::as_slice).
    pub fn as_mut_slice<T: Pod>(&mut self) -> Result<&mut [T], Error> {
        let (addr, len) = self.parts::<T>()?;
        // SAFETY: as in `as_slice`, and the CPU may write (a `ReadWrite` grant). Nothing else reads or
        // writes the bytes while the slice lives: it borrows `self` mutably, so no other slice of this
        // grant exists, and no device view or alias mapping exists (see `as_slice`).
        Ok(unsafe {
            core::slice::from_raw_parts_mut(core::ptr::with_exposed_provenance_mut::<T>(addr), len)
        })
    }
}
