//! Memory shared between processes: allocations created exportable (`requestedHandleTypes`),
//! `cuMemExportToShareableHandle` to a POSIX file descriptor, the descriptor passed to another process
//! (over a Unix socket with `SCM_RIGHTS`, or taken with `pidfd_getfd`), and
//! `cuMemImportFromShareableHandle` there; beyond one machine, fabric handles ([`FabricHandle`], 64
//! bytes within an IMEX domain) and dma-buf file descriptors of a buffer's range for network
//! adapters ([`DmaBufExport`], made by
//! [`VirtualBuffer::export_dma_buf`](crate::VirtualBuffer::export_dma_buf)).
//!
//! Which handle types an allocation can be exported as is part of its type: only a
//! [`ShareableAllocation<PosixFd>`] has [`export`](ShareableAllocation::export), so exporting a plain
//! [`PhysicalAllocation`] (or a [`HostAllocation`](crate::host::HostAllocation)) does not compile.
//!
//! The importing process gets a [`PhysicalAllocation`] that maps like any other. An imported handle does
//! not know its size (measured), so the size travels with the descriptor, in an [`ExportInfo`];
//! everything received is checked before any driver call sees it.
//!
//! # Lifetimes across processes
//! The exporter's allocation, the descriptor (in either process) and the importer's allocation are
//! three references to one piece of physical memory: it is freed when the last of them, and the last
//! mapping of it in any process, is gone. They may end in any order; a mapping never dangles, since
//! each process's mappings borrow that process's own allocation.
//!
//! # Example
//! ```no_run
//! use cuda_vmm::Device;
//! use cuda_vmm::ipc::{ExportedAllocation, PosixFd, ShareableAllocation};
//!
//! # fn main() -> Result<(), cuda_vmm::Error> {
//! # let size = 2 << 20;
//! # let (socket, peer) = std::os::unix::net::UnixStream::pair().unwrap();
//! // Exporting process
//! let memory = ShareableAllocation::<PosixFd>::new(Device::get(0)?, size)?;
//! memory.export()?.send(&socket)?; // cuMemExportToShareableHandle, sendmsg with SCM_RIGHTS
//! // Importing process
//! let received = ExportedAllocation::receive(&peer)?; // recvmsg; checked before any driver call
//! let imported = received.import()?; // cuMemImportFromShareableHandle: a PhysicalAllocation
//! # Ok(())
//! # }
//! ```
//!
//! `import` checks the device ordinal and granularity against this process's driver, and after the
//! import the driver's own answer for where the memory lives (two processes with different
//! `CUDA_VISIBLE_DEVICES` get an [`Error::DeviceMismatch`], not a
//! wrong device). A size that lies is left to `cuMemMap` in the importer, which refuses a partial
//! mapping (801) and an oversized one (`tests/ipc.rs`).

use core::ffi::{c_int, c_void};
use core::fmt;
use core::marker::PhantomData;
use core::ops::Deref;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::device::Device;
use crate::error::{DriverError, DriverResult, Error, Result, check};
use crate::sys;
use crate::vmm::physical::{
    AllocationOptions, HandleKinds, Location, PhysicalAllocation, check_multiple,
};

// The wire format of an `ExportInfo` (`to_bytes`, `from_bytes`) and its checks.
mod message;
mod reader;
// The Unix transport of an `ExportedAllocation`: `SCM_RIGHTS` over a socket, `pidfd_getfd`.
mod unix;
// A whole `VirtualBuffer`'s pages in one message: `BufferInfo`'s wire format and `ExportedBuffer`.
mod buffer;
// dma-buf file descriptors of a `VirtualBuffer`'s range, for network adapters.
mod dmabuf;
// Fabric handles: 64 bytes shared within an IMEX domain, their wire format and import.
mod fabric;

pub use buffer::{BufferInfo, BufferPiece, ExportedBuffer};
pub(crate) use dmabuf::export_range;
pub use dmabuf::{DmaBufChunk, DmaBufExport, DmaBufLayout};
pub use fabric::FabricHandle;

mod sealed {
    pub trait Sealed {}
}

/// A kind of shareable handle an allocation can be exported as: [`PosixFd`], or [`Fabric`]. Sealed:
/// each kind needs its own export and import code.
pub trait HandleKind: sealed::Sealed + Copy + fmt::Debug + Send + Sync + 'static {
    /// The `CUmemAllocationHandleType` bit.
    #[doc(hidden)]
    const RAW: u32;
    /// The device attribute that says whether the device supports the kind.
    #[doc(hidden)]
    const ATTRIBUTE: i32;
    /// The kind's name, for errors.
    #[doc(hidden)]
    const WHAT: &'static str;
    /// Why the driver refused to create memory of this kind, for the refusals that have a known cause.
    #[doc(hidden)]
    fn refusal(error: DriverError) -> Option<&'static str>;
    /// Whether `device` supports the kind (its attribute [`HandleKind::ATTRIBUTE`]).
    #[doc(hidden)]
    fn supported(device: Device) -> Result<bool>;
}

/// Shareable as a POSIX file descriptor (`CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`), between processes
/// of one machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PosixFd;

/// Shareable as a fabric handle (`CU_MEM_HANDLE_TYPE_FABRIC`), within an IMEX domain (processes on one
/// or several machines linked by `NVLink`): [`ShareableAllocation<Fabric>::export`] gives a
/// [`FabricHandle`] (64 bytes, no descriptor), which [`FabricHandle::import`] imports. The driver
/// creates and imports such memory only for a process with an IMEX channel; where the machine has
/// none ([`imex_channel`](crate::device::imex_channel)), [`ShareableAllocation::new`] and
/// [`FabricHandle::import`] return [`Error::NoImexChannel`] before any allocation, and where the
/// process cannot open the channel the driver's refusal is [`Error::Refused`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Fabric;

impl sealed::Sealed for PosixFd {}
impl sealed::Sealed for Fabric {}

impl HandleKind for PosixFd {
    const RAW: u32 = sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    const ATTRIBUTE: i32 = sys::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED;
    const WHAT: &'static str = "memory shareable as a POSIX file descriptor";
    fn refusal(_: DriverError) -> Option<&'static str> {
        None
    }
    fn supported(device: Device) -> Result<bool> {
        device.supports_posix_fd_handles()
    }
}

impl HandleKind for Fabric {
    const RAW: u32 = sys::CU_MEM_HANDLE_TYPE_FABRIC;
    const ATTRIBUTE: i32 = sys::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED;
    const WHAT: &'static str = "fabric-shareable memory";
    fn refusal(error: DriverError) -> Option<&'static str> {
        (error == DriverError::NOT_PERMITTED).then_some(
            "the process has no IMEX channel (the driver's nvidia-caps-imex-channels device and a \
             channel file the user can open)",
        )
    }
    fn supported(device: Device) -> Result<bool> {
        device.supports_fabric_handles()
    }
}

/// Device memory that can be exported to other processes as a handle of kind `K`: a
/// [`PhysicalAllocation`] created with `requestedHandleTypes` set, released on drop.
///
/// It dereferences to the [`PhysicalAllocation`], so it maps like any other
/// (`region.map(&shareable)`), and every mapping borrows it: it cannot be released while mapped. Only
/// this type can be exported; a plain allocation has no `export`:
///
/// ```compile_fail,E0599
/// # use cuda_vmm::{Device, PhysicalAllocation};
/// # fn main() -> Result<(), cuda_vmm::Error> {
/// let device = Device::get(0)?;
/// let memory = PhysicalAllocation::new(device, 2 << 20)?;
/// let exported = memory.export()?; // no method `export`: the memory was not created shareable
/// # Ok(())
/// # }
/// ```
///
/// Host memory is never shareable here: the driver refuses a handle type for
/// [`Location::Host`], and a [`HostAllocation`](crate::host::HostAllocation), whose
/// bytes the CPU borrows as Rust slices, must not be written by another process meanwhile.
pub struct ShareableAllocation<K: HandleKind = PosixFd> {
    memory: PhysicalAllocation,
    device: Device,
    /// The handle kind, at the type level only (`K` is `Send + Sync + Copy`, so this changes no auto
    /// trait).
    _kind: PhantomData<K>,
}

impl<K: HandleKind> fmt::Debug for ShareableAllocation<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShareableAllocation")
            .field("kind", &K::WHAT)
            .field("device", &self.device)
            .field("memory", &self.memory)
            .finish()
    }
}

impl<K: HandleKind> ShareableAllocation<K> {
    /// `cuMemCreate` — allocate `size` bytes of pinned memory on `device`, exportable as `K`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] where the device attribute of the kind
    /// ([`Device::supports_posix_fd_handles`], [`Device::supports_fabric_handles`]) is 0, checked first;
    /// for fabric memory [`Error::NoImexChannel`] where the machine has no IMEX channel (checked
    /// before any allocation), and [`Error::Refused`] where the process cannot use it (the driver's
    /// `CUDA_ERROR_NOT_PERMITTED`); otherwise as [`PhysicalAllocation::new`].
    #[doc(alias = "cuMemCreate")]
    pub fn new(device: Device, size: usize) -> Result<ShareableAllocation<K>, Error> {
        if !K::supported(device)? {
            return Err(Error::Unsupported {
                what: K::WHAT,
                device: device.as_raw(),
                attribute: K::ATTRIBUTE,
            });
        }
        let options = AllocationOptions::device(device).with_handle_types(K::RAW);
        match PhysicalAllocation::with_options(size, options) {
            Ok(memory) => Ok(ShareableAllocation {
                memory,
                device,
                _kind: PhantomData,
            }),
            Err(Error::Driver(error)) => Err(match K::refusal(error) {
                Some(why) => Error::Refused {
                    what: K::WHAT,
                    why,
                    error,
                },
                None => Error::Driver(error),
            }),
            Err(e) => Err(e),
        }
    }

    /// The device whose memory this is.
    #[must_use]
    pub fn device(&self) -> Device {
        self.device
    }

    /// `cuMemRelease` — release this process's handle and report the driver's answer, which `drop`
    /// ignores. Memory another process imported stays allocated until that process releases it too.
    ///
    /// # Errors
    /// The driver's error, if any.
    #[doc(alias = "cuMemRelease")]
    pub fn release(self) -> Result<()> {
        self.memory.release()
    }

    /// The allocation itself, still shareable as `K` (its options keep the handle kind), for the
    /// owners that take a [`PhysicalAllocation`] by value: an owned mapping
    /// ([`SharedReservation::map`](crate::owned::SharedReservation::map)) or a shared page of a
    /// buffer ([`SharedPage::from_allocation`](crate::owned::SharedPage::from_allocation), then
    /// [`VirtualBuffer::map_shared`](crate::VirtualBuffer::map_shared)). No driver call.
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::ipc::{PosixFd, ShareableAllocation};
    /// use cuda_vmm::owned::SharedReservation;
    /// use cuda_vmm::Device;
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let memory = ShareableAllocation::<PosixFd>::new(Device::get(0)?, 2 << 20)?;
    /// let exported = memory.export()?; // before it moves into the mapping
    /// let mapping = SharedReservation::new(2 << 20, 0)?.map(0, memory.into_allocation())?;
    /// # drop((exported, mapping));
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn into_allocation(self) -> PhysicalAllocation {
        self.memory
    }

    /// `memory` as shareable memory, where it was created (or imported) exportable as `K` and is
    /// device memory; otherwise `memory` back, unchanged. No driver call.
    ///
    /// # Errors
    /// `memory`, where its options lack the handle kind or it is not device memory.
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::ipc::{PosixFd, ShareableAllocation};
    /// use cuda_vmm::{Device, PhysicalAllocation};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let plain = PhysicalAllocation::new(Device::get(0)?, 2 << 20)?;
    /// assert!(ShareableAllocation::<PosixFd>::from_allocation(plain).is_err()); // not exportable
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_allocation(
        memory: PhysicalAllocation,
    ) -> Result<ShareableAllocation<K>, PhysicalAllocation> {
        let kinds = memory.options().handle_kinds();
        match memory.location() {
            Location::Device(device) if kinds.contains(HandleKinds::from_raw(K::RAW)) => {
                Ok(ShareableAllocation {
                    memory,
                    device,
                    _kind: PhantomData,
                })
            }
            _ => Err(memory),
        }
    }
}

impl<K: HandleKind> Deref for ShareableAllocation<K> {
    type Target = PhysicalAllocation;
    fn deref(&self) -> &PhysicalAllocation {
        &self.memory
    }
}

impl ShareableAllocation<PosixFd> {
    /// `cuMemExportToShareableHandle` — export the memory as a new POSIX file descriptor, with what an
    /// importer needs to know ([`ExportInfo`]: size, device, granularity).
    ///
    /// The descriptor is a reference to the memory of its own: the memory stays allocated while it is
    /// open, in this process or any other that received it, even after this allocation is released.
    /// Close it (drop the [`ExportedAllocation`]) once it has been sent or imported.
    ///
    /// # Errors
    /// The driver's error, if any (for example `CUDA_ERROR_INVALID_VALUE` where the process cannot open
    /// another file descriptor).
    #[doc(alias = "cuMemExportToShareableHandle")]
    pub fn export(&self) -> Result<ExportedAllocation, Error> {
        let fd = export_fd(&self.memory)?;
        let info = ExportInfo::new(
            self.memory.size(),
            self.device.ordinal(),
            self.memory.granularity(),
        )?;
        Ok(ExportedAllocation { fd, info })
    }
}

/// `cuMemExportToShareableHandle` of `memory` as a new POSIX file descriptor, owned by the caller.
/// The driver refuses memory created without the POSIX handle type.
pub(crate) fn export_fd(memory: &PhysicalAllocation) -> Result<OwnedFd, Error> {
    let mut fd: c_int = -1;
    // SAFETY: for a POSIX file descriptor, the driver writes one `int` through `shareable`: `fd` is
    // a live, writable `c_int`. The handle is `memory`'s, alive for the call; flags must be 0.
    check(unsafe {
        sys::cuMemExportToShareableHandle(
            (&raw mut fd).cast::<c_void>(),
            memory.as_raw(),
            sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    })?;
    if fd < 0 {
        return Err(Error::InvalidMessage {
            what: "the driver exported no file descriptor",
        });
    }
    // SAFETY: the driver has just opened `fd` for this export and handed it to the caller: it is
    // open, and nothing else in this process owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// What an importer needs besides the file descriptor: the allocation's size (which an imported handle
/// does not know), the exporter's device ordinal and the allocation granularity.
///
/// Made only by [`ExportInfo::new`] and [`ExportInfo::from_bytes`], which check it: a non-zero size
/// that is a multiple of a non-zero granularity, and a device ordinal the driver can represent.
/// [`to_bytes`](ExportInfo::to_bytes) and `from_bytes` are the wire format of
/// [`ExportedAllocation::send`], for handles passed some other way (such as `pidfd_getfd`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExportInfo {
    size: usize,
    granularity: usize,
    device: u32,
}

impl ExportInfo {
    /// A checked description of a shared allocation.
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for a zero size or granularity; [`Error::NotAligned`] where the size is not
    /// a multiple of the granularity; [`Error::InvalidArgument`] for a device ordinal above
    /// `i32::MAX`.
    pub fn new(
        size: usize,
        device_ordinal: usize,
        granularity: usize,
    ) -> Result<ExportInfo, Error> {
        if size == 0 {
            return Err(Error::ZeroSize {
                what: "shared allocation size",
            });
        }
        if granularity == 0 {
            return Err(Error::ZeroSize {
                what: "granularity",
            });
        }
        check_multiple("shared allocation size", size, granularity)?;
        let device = u32::try_from(device_ordinal)
            .ok()
            .filter(|&d| i32::try_from(d).is_ok())
            .ok_or(Error::InvalidArgument {
                what: "device ordinal",
            })?;
        Ok(ExportInfo {
            size,
            granularity,
            device,
        })
    }

    /// The allocation's size in bytes.
    #[must_use]
    pub fn size(&self) -> usize {
        self.size
    }

    /// The exporter's device ordinal. The importer's driver must number the devices the same way
    /// (the same `CUDA_VISIBLE_DEVICES`); [`ExportedAllocation::import`] checks it.
    #[must_use]
    pub fn device_ordinal(&self) -> usize {
        self.device as usize
    }

    /// The minimum allocation granularity the exporter used.
    #[must_use]
    pub fn granularity(&self) -> usize {
        self.granularity
    }
}

/// An exported allocation: a POSIX file descriptor (a std [`OwnedFd`], closed on drop) and the
/// [`ExportInfo`] an importer needs. Made by [`ShareableAllocation::export`], received by
/// [`ExportedAllocation::receive`] (or taken with [`ExportedAllocation::take_from_process`]),
/// imported with [`ExportedAllocation::import`].
///
/// Closing the descriptor does not release anything that was imported from it: an imported
/// allocation is a reference to the memory of its own.
pub struct ExportedAllocation {
    fd: OwnedFd,
    info: ExportInfo,
}

impl fmt::Debug for ExportedAllocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportedAllocation")
            .field("fd", &self.fd.as_raw_fd())
            .field("info", &self.info)
            .finish()
    }
}

impl AsFd for ExportedAllocation {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl ExportedAllocation {
    /// An exported allocation from a descriptor and its description, received some other way.
    ///
    /// Nothing is checked against the driver here; [`import`](ExportedAllocation::import) does that,
    /// and a descriptor that is not an exported CUDA allocation is refused by the driver there.
    #[must_use]
    pub fn from_parts(fd: OwnedFd, info: ExportInfo) -> ExportedAllocation {
        ExportedAllocation { fd, info }
    }

    /// The descriptor and the description.
    #[must_use]
    pub fn into_parts(self) -> (OwnedFd, ExportInfo) {
        (self.fd, self.info)
    }

    /// What an importer needs besides the descriptor.
    #[must_use]
    pub fn info(&self) -> ExportInfo {
        self.info
    }

    /// `cuMemImportFromShareableHandle` — import the memory into this process, as a
    /// [`PhysicalAllocation`] of the exporter's size that maps like any other and is released on drop.
    ///
    /// Checked first: that the device ordinal names a device here and that its minimum granularity is
    /// the exporter's. Checked after the import, against the driver's own answer
    /// (`cuMemGetAllocationPropertiesFromHandle`): that the memory lives on that device. The size
    /// cannot be checked (the driver does not say): a size smaller than the memory makes
    /// [`Region::map`](crate::vmm::Region::map) fail with `CUDA_ERROR_NOT_SUPPORTED` (801), as any partial
    /// mapping does (measured on device memory); a larger size is expected to be refused by the
    /// driver's `cuMemMap` too (`tests/ipc.rs` checks both on a GPU).
    ///
    /// The descriptor stays open: close it (drop `self`) whenever convenient; the imported allocation
    /// does not depend on it.
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`] where the ordinal names no device here;
    /// [`Error::InvalidMessage`] where the granularity differs or the memory is not device memory;
    /// [`Error::DeviceMismatch`] where the driver places the memory on another device than the
    /// description (devices numbered differently in the two processes); the driver's error otherwise,
    /// such as `CUDA_ERROR_INVALID_VALUE` for a descriptor that is not an exported allocation.
    #[doc(alias = "cuMemImportFromShareableHandle")]
    pub fn import(&self) -> Result<PhysicalAllocation, Error> {
        let info = self.info;
        import_fd(
            self.fd.as_fd(),
            info.size,
            info.device_ordinal(),
            info.granularity,
        )
    }
}

/// Checks a description of shared memory against this process's driver before any import: that
/// `device_ordinal` names a device here, that its minimum granularity for POSIX-shareable memory is
/// `granularity`, and that `size` is a multiple of it. The device and the options of the import.
pub(crate) fn check_importable(
    size: usize,
    device_ordinal: usize,
    granularity: usize,
) -> Result<(Device, AllocationOptions), Error> {
    let device = Device::get(device_ordinal)?;
    let options = AllocationOptions::device(device)
        .with_handle_types(sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    let here = options.minimum_granularity_cached()?;
    if here != granularity {
        return Err(Error::InvalidMessage {
            what: "the exporter's granularity differs from the device's here",
        });
    }
    check_multiple("shared allocation size", size, here)?;
    Ok((device, options))
}

/// `cuMemImportFromShareableHandle` of `fd`, described as `size` bytes of the device
/// `device_ordinal` at `granularity` (checked by `check_importable` first); after the import, the
/// driver's answer for where the memory lives is checked against the description.
pub(crate) fn import_fd(
    fd: BorrowedFd<'_>,
    size: usize,
    device_ordinal: usize,
    granularity: usize,
) -> Result<PhysicalAllocation, Error> {
    let (device, _exportable_there) = check_importable(size, device_ordinal, granularity)?;
    // An open descriptor is never negative.
    let raw = usize::try_from(fd.as_raw_fd()).map_err(|_| Error::InvalidArgument {
        what: "file descriptor",
    })?;
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: `handle` is writable for the call. For a POSIX file descriptor the driver takes the
    // descriptor's value itself in the pointer argument (it dereferences nothing); the descriptor
    // is open, borrowed for the whole call.
    check(unsafe {
        sys::cuMemImportFromShareableHandle(
            &raw mut handle,
            core::ptr::without_provenance_mut::<c_void>(raw),
            sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        )
    })?;
    // Owned from here on: every error below releases it.
    // Recorded without a shareable handle kind: the exporter shares the memory, and this process
    // does not export it again (the driver refused the export of a buffer holding imported pages
    // with CUDA_ERROR_INVALID_VALUE on an H200), so every export refuses it before any driver call.
    let memory = PhysicalAllocation::from_imported(
        handle,
        size,
        granularity,
        AllocationOptions::device(device),
    );
    let location = properties(&memory)?.location;
    if location.type_ != sys::CU_MEM_LOCATION_TYPE_DEVICE {
        return Err(Error::InvalidMessage {
            what: "the shared memory is not device memory",
        });
    }
    if location.id != device.as_raw() {
        return Err(Error::DeviceMismatch {
            expected: device.as_raw(),
            found: location.id,
        });
    }
    Ok(memory)
}

/// `cuMemGetAllocationPropertiesFromHandle` — the driver's description of `memory`.
fn properties(memory: &PhysicalAllocation) -> DriverResult<sys::CUmemAllocationProp> {
    let mut prop = sys::CUmemAllocationProp {
        type_: 0,
        requestedHandleTypes: 0,
        location: sys::CUmemLocation { type_: 0, id: 0 },
        win32HandleMetaData: core::ptr::null_mut(),
        allocFlags: 0,
    };
    // SAFETY: `prop` is a live, writable mirror of `CUmemAllocationProp` (layout asserted in `sys`, every
    // field an integer or pointer, so any value the driver writes is valid); the handle is alive.
    check(unsafe { sys::cuMemGetAllocationPropertiesFromHandle(&raw mut prop, memory.as_raw()) })?;
    Ok(prop)
}
