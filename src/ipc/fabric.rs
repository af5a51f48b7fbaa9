//! Fabric handles: memory shared within an IMEX domain (processes on one or several machines linked
//! by `NVLink`, such as the trays of a multi-node `NVLink` rack) as 64 opaque bytes, with no file
//! descriptor to pass. [`ShareableAllocation<Fabric>::export`] makes a [`FabricHandle`]: the bytes
//! and what an importer needs besides (the size, which an imported handle does not know, and the
//! granularity). Its wire format ([`FabricHandle::to_bytes`], [`FabricHandle::from_bytes`]) is read
//! and checked here with no driver call, so that it is property-tested and fuzzed without a GPU.
//!
//! The driver makes fabric-shareable memory only for a process with an IMEX channel: where the
//! machine has none ([`imex_channel`](crate::device::imex_channel)), creation and import are
//! refused with [`Error::NoImexChannel`] before any allocation or import.

use core::ffi::c_void;
use core::fmt;

use super::reader::{Reader, encode};
use super::{Fabric, ShareableAllocation, properties};
use crate::device::Device;
use crate::error::{Error, check};
use crate::sys;
use crate::vmm::physical::{
    AllocationOptions, HandleKinds, PhysicalAllocation, check_fabric, check_multiple,
};

/// The first bytes of an encoded [`FabricHandle`].
const MAGIC: [u8; 8] = *b"CUVMMFAB";
/// The version of the encoding.
const VERSION: u32 = 1;
/// `CU_IPC_HANDLE_SIZE`: the bytes of a `CUmemFabricHandle`.
const HANDLE_BYTES: usize = 64;

/// An exported fabric handle: the 64 bytes of `CUmemFabricHandle` and what an importer needs
/// besides, the allocation's size and the exporter's minimum granularity for fabric-shareable
/// memory. Made by [`ShareableAllocation<Fabric>::export`], sent as
/// [`to_bytes`](FabricHandle::to_bytes) through any channel (no descriptor travels), read with
/// [`from_bytes`](FabricHandle::from_bytes), which checks it, and imported with
/// [`import`](FabricHandle::import).
///
/// Its `Debug` does not print the handle's bytes: within the IMEX domain they open the memory.
///
/// # Examples
/// ```
/// use cuda_vmm::ipc::FabricHandle;
///
/// let handle = FabricHandle::from_parts([7; 64], 4 << 20, 2 << 20)?;
/// let wire = handle.to_bytes(); // what the engine's own channel carries
/// assert_eq!(FabricHandle::from_bytes(&wire)?, handle);
/// assert!(FabricHandle::from_parts([7; 64], 3 << 20, 2 << 20).is_err()); // not whole granules
/// # Ok::<(), cuda_vmm::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct FabricHandle {
    handle: [u8; HANDLE_BYTES],
    size: usize,
    granularity: usize,
}

impl fmt::Debug for FabricHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FabricHandle")
            .field("size", &self.size)
            .field("granularity", &self.granularity)
            .finish_non_exhaustive()
    }
}

impl FabricHandle {
    /// The length of [`to_bytes`](FabricHandle::to_bytes): magic (8 bytes), version, handle type
    /// (4 each), size, granularity, reserved (8 each), the handle (64), little-endian.
    pub const ENCODED_LEN: usize = 104;

    /// A checked fabric handle from its parts, received some other way: the handle's 64 bytes, the
    /// allocation's size and the exporter's minimum granularity.
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for a zero size or granularity; [`Error::NotAligned`] where the size is
    /// not a multiple of the granularity.
    pub fn from_parts(
        handle: [u8; HANDLE_BYTES],
        size: usize,
        granularity: usize,
    ) -> Result<FabricHandle, Error> {
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
        Ok(FabricHandle {
            handle,
            size,
            granularity,
        })
    }

    /// The 64 bytes of the `CUmemFabricHandle`, for an engine that carries them in its own format.
    #[must_use]
    pub fn raw_handle(&self) -> &[u8; HANDLE_BYTES] {
        &self.handle
    }

    /// The allocation's size in bytes.
    #[must_use]
    pub fn size(&self) -> usize {
        self.size
    }

    /// The exporter's minimum granularity for fabric-shareable memory.
    #[must_use]
    pub fn granularity(&self) -> usize {
        self.granularity
    }

    /// The encoding that [`from_bytes`](FabricHandle::from_bytes) reads.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; FabricHandle::ENCODED_LEN] {
        encode(&[
            &MAGIC,
            &VERSION.to_le_bytes(),
            &sys::CU_MEM_HANDLE_TYPE_FABRIC.to_le_bytes(),
            &(self.size as u64).to_le_bytes(),
            &(self.granularity as u64).to_le_bytes(),
            &0u64.to_le_bytes(),
            &self.handle,
        ])
    }

    /// Reads and checks an encoding made by [`to_bytes`](FabricHandle::to_bytes): nothing of it
    /// reaches the driver unchecked.
    ///
    /// # Errors
    /// [`Error::InvalidMessage`] for a wrong length, magic, version, handle type (a POSIX file
    /// descriptor's description is not a fabric handle) or reserved field;
    /// [`Error::Overflow`] for a size or granularity beyond `usize`; otherwise as
    /// [`from_parts`](FabricHandle::from_parts).
    pub fn from_bytes(bytes: &[u8]) -> Result<FabricHandle, Error> {
        let bad = |what| Error::InvalidMessage { what };
        let Some((fields, handle)) = bytes
            .split_last_chunk::<HANDLE_BYTES>()
            .filter(|_| bytes.len() == FabricHandle::ENCODED_LEN)
        else {
            return Err(bad("not the length of a fabric handle description"));
        };
        let mut reader = Reader(fields);
        if reader.take::<8>() != Some(MAGIC) {
            return Err(bad("not a fabric handle description (wrong magic)"));
        }
        if reader.u32() != Some(VERSION) {
            return Err(bad("unknown version of the fabric handle description"));
        }
        if reader.u32() != Some(sys::CU_MEM_HANDLE_TYPE_FABRIC) {
            return Err(bad("handle type is not a fabric handle"));
        }
        let too_large = Error::Overflow {
            what: "shared allocation size",
        };
        let size = reader.usize().ok_or(too_large.clone())?;
        let granularity = reader.usize().ok_or(too_large)?;
        if reader.u64() != Some(0) {
            return Err(bad("reserved field is not zero"));
        }
        FabricHandle::from_parts(*handle, size, granularity)
    }

    /// `cuMemImportFromShareableHandle` — import the memory into this process for `device`, as a
    /// [`PhysicalAllocation`] of the exporter's size that maps like any other and is released on
    /// drop. The memory may be another machine's (within the IMEX domain); the allocation reports
    /// `device`, through whose granularity it was checked, as its location.
    ///
    /// Checked before the import: that `device` supports fabric handles and the machine has an
    /// IMEX channel (no driver call but an attribute query), then that `device`'s minimum
    /// granularity for fabric-shareable memory is the exporter's. Checked after it, against the
    /// driver's own answer (`cuMemGetAllocationPropertiesFromHandle`): that the memory is device
    /// memory. As for a POSIX descriptor, the size cannot be checked (the driver does not say); a
    /// size that lies is refused by `cuMemMap` (a mapping always covers one whole allocation).
    ///
    /// # Errors
    /// [`Error::Unsupported`] where `device` has no fabric handles; [`Error::NoImexChannel`] where
    /// the machine has no IMEX channel; [`Error::InvalidMessage`] where the granularity differs or
    /// the memory is not device memory; the driver's error otherwise (`CUDA_ERROR_NOT_PERMITTED`
    /// for a process that cannot open the channel, `CUDA_ERROR_INVALID_VALUE` for bytes that are
    /// no fabric handle of the domain).
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::Device;
    /// use cuda_vmm::ipc::{Fabric, FabricHandle, ShareableAllocation};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// // Exporting process (an IMEX channel is needed on both sides)
    /// let memory = ShareableAllocation::<Fabric>::new(Device::get(0)?, 2 << 20)?;
    /// let wire = memory.export()?.to_bytes(); // 104 bytes, through the engine's own channel
    /// // Importing process, on this machine or another of the IMEX domain
    /// let imported = FabricHandle::from_bytes(&wire)?.import(Device::get(0)?)?;
    /// # drop(imported);
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuMemImportFromShareableHandle")]
    pub fn import(&self, device: Device) -> Result<PhysicalAllocation, Error> {
        check_fabric(device)?;
        let options = AllocationOptions::device(device).with_handle_kinds(HandleKinds::FABRIC);
        if options.minimum_granularity_cached()? != self.granularity {
            return Err(Error::InvalidMessage {
                what: "the exporter's granularity differs from the device's here",
            });
        }
        check_multiple("shared allocation size", self.size, self.granularity)?;
        let mut shared = sys::CUmemFabricHandle { data: self.handle };
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `handle` is writable for the call; for a fabric handle the driver reads the
        // `CUmemFabricHandle` (64 bytes, layout asserted in `sys`) the pointer points to, a live
        // local copy for the call.
        check(unsafe {
            sys::cuMemImportFromShareableHandle(
                &raw mut handle,
                (&raw mut shared).cast::<c_void>(),
                sys::CU_MEM_HANDLE_TYPE_FABRIC,
            )
        })?;
        // Owned from here on: every error below releases it. Recorded with no shareable handle
        // kind: this process does not export imported memory again.
        let memory = PhysicalAllocation::from_imported(
            handle,
            self.size,
            self.granularity,
            AllocationOptions::device(device),
        );
        if properties(&memory)?.location.type_ != sys::CU_MEM_LOCATION_TYPE_DEVICE {
            return Err(Error::InvalidMessage {
                what: "the shared memory is not device memory",
            });
        }
        Ok(memory)
    }
}

impl ShareableAllocation<Fabric> {
    /// `cuMemExportToShareableHandle` — export the memory as a fabric handle: 64 bytes that any
    /// process of the IMEX domain imports ([`FabricHandle::import`]), with the size and granularity
    /// it needs ([`FabricHandle`]). No descriptor is opened: the bytes are the whole export.
    ///
    /// # Errors
    /// The driver's error, if any.
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::Device;
    /// use cuda_vmm::ipc::{Fabric, ShareableAllocation};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let memory = ShareableAllocation::<Fabric>::new(Device::get(0)?, 2 << 20)?;
    /// let handle = memory.export()?;
    /// assert_eq!(handle.size(), 2 << 20);
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuMemExportToShareableHandle")]
    pub fn export(&self) -> Result<FabricHandle, Error> {
        let mut shared = sys::CUmemFabricHandle {
            data: [0; HANDLE_BYTES],
        };
        // SAFETY: for a fabric handle the driver writes one `CUmemFabricHandle` through the
        // pointer: `shared` is a live, writable one. The handle is `self`'s, alive for the call,
        // created with the fabric handle type (the type's promise); flags must be 0.
        check(unsafe {
            sys::cuMemExportToShareableHandle(
                (&raw mut shared).cast::<c_void>(),
                self.memory.as_raw(),
                sys::CU_MEM_HANDLE_TYPE_FABRIC,
                0,
            )
        })?;
        FabricHandle::from_parts(shared.data, self.memory.size(), self.memory.granularity())
    }
}

#[cfg(test)]
mod tests {
    use super::{FabricHandle, MAGIC};
    use crate::error::Error;
    use proptest::prelude::*;

    fn handle() -> FabricHandle {
        FabricHandle::from_parts(core::array::from_fn(|i| i as u8), 6 << 20, 2 << 20).unwrap()
    }

    #[test]
    fn encoding_round_trips() {
        let h = handle();
        let bytes = h.to_bytes();
        assert_eq!(bytes[..8], MAGIC);
        assert_eq!(
            bytes[40..],
            *h.raw_handle(),
            "the handle is the last 64 bytes"
        );
        assert_eq!(FabricHandle::from_bytes(&bytes), Ok(h.clone()));
        assert_eq!((h.size(), h.granularity()), (6 << 20, 2 << 20));
        assert!(
            !format!("{h:?}").contains("[0, 1, 2"),
            "the handle's bytes are not printed"
        );
    }

    #[test]
    fn descriptions_are_checked() {
        assert!(matches!(
            FabricHandle::from_parts([0; 64], 0, 2 << 20),
            Err(Error::ZeroSize { .. })
        ));
        assert!(matches!(
            FabricHandle::from_parts([0; 64], 2 << 20, 0),
            Err(Error::ZeroSize { .. })
        ));
        let good = handle().to_bytes();
        for (at, what) in [
            (0, "magic"),
            (8, "version"),
            (12, "handle type"),
            (32, "reserved"),
        ] {
            let mut bytes = good;
            bytes[at] ^= 0x40;
            assert!(
                matches!(
                    FabricHandle::from_bytes(&bytes),
                    Err(Error::InvalidMessage { .. })
                ),
                "{what}"
            );
        }
        // A POSIX-fd handle type (1) is not a fabric handle.
        let mut posix = good;
        posix[12..16].copy_from_slice(&1u32.to_le_bytes());
        assert!(matches!(
            FabricHandle::from_bytes(&posix),
            Err(Error::InvalidMessage { .. })
        ));
        assert!(matches!(
            FabricHandle::from_bytes(&good[..103]),
            Err(Error::InvalidMessage { .. })
        ));
        let mut longer = good.to_vec();
        longer.push(0);
        assert!(matches!(
            FabricHandle::from_bytes(&longer),
            Err(Error::InvalidMessage { .. })
        ));
        let mut unaligned = good;
        unaligned[16] = 1;
        assert!(matches!(
            FabricHandle::from_bytes(&unaligned),
            Err(Error::NotAligned { .. })
        ));
        let mut huge = good;
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(FabricHandle::from_bytes(&huge).is_err());
    }

    proptest! {
        /// Any bytes at all: a checked handle or an error, never a panic; whatever is accepted
        /// encodes back to the same bytes.
        #[test]
        fn any_bytes_are_parsed_or_refused(bytes in proptest::collection::vec(any::<u8>(), 0..112), keep_header in any::<bool>()) {
            let mut bytes = bytes;
            if keep_header && bytes.len() >= 16 {
                bytes[..8].copy_from_slice(&MAGIC);
                bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
                bytes[12..16].copy_from_slice(&8u32.to_le_bytes());
            }
            if let Ok(h) = FabricHandle::from_bytes(&bytes) {
                prop_assert!(h.size() > 0 && h.size() % h.granularity() == 0);
                prop_assert_eq!(&h.to_bytes()[..], &bytes[..]);
            }
        }
    }
}
