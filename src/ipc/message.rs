//! The wire format of an [`ExportInfo`]: what
//! [`ExportedAllocation::send`](super::ExportedAllocation::send) sends beside the descriptor, and how
//! a received one is read and checked before any driver call sees it.

use super::ExportInfo;
use super::reader::{Reader, encode};
use crate::error::Error;
use crate::sys;

/// The first bytes of an encoded [`ExportInfo`].
const MAGIC: [u8; 8] = *b"CUVMMIPC";
/// The version of the encoding.
const VERSION: u32 = 1;

impl ExportInfo {
    /// The length of [`to_bytes`](ExportInfo::to_bytes): magic (8 bytes), version, handle type (4
    /// each), size, granularity (8 each), device ordinal, reserved (4 each), little-endian.
    pub const ENCODED_LEN: usize = 40;

    /// The encoding that [`from_bytes`](ExportInfo::from_bytes) reads.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; ExportInfo::ENCODED_LEN] {
        encode(&[
            &MAGIC,
            &VERSION.to_le_bytes(),
            &sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.to_le_bytes(),
            &(self.size as u64).to_le_bytes(),
            &(self.granularity as u64).to_le_bytes(),
            &self.device.to_le_bytes(),
            &0u32.to_le_bytes(),
        ])
    }

    /// Reads and checks an encoding made by [`to_bytes`](ExportInfo::to_bytes): nothing of it reaches
    /// the driver unchecked.
    ///
    /// # Errors
    /// [`Error::InvalidMessage`] for a wrong length, magic, version, handle type or reserved field;
    /// otherwise as [`ExportInfo::new`] (also for a size or granularity beyond `usize`).
    pub fn from_bytes(bytes: &[u8]) -> Result<ExportInfo, Error> {
        let bad = |what| Error::InvalidMessage { what };
        if bytes.len() != ExportInfo::ENCODED_LEN {
            return Err(bad("not the length of a shared-allocation description"));
        }
        let mut reader = Reader(bytes);
        if reader.take::<8>() != Some(MAGIC) {
            return Err(bad("not a shared-allocation description (wrong magic)"));
        }
        if reader.u32() != Some(VERSION) {
            return Err(bad("unknown version of the shared-allocation description"));
        }
        if reader.u32() != Some(sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
            return Err(bad("handle type is not a POSIX file descriptor"));
        }
        let too_large = Error::Overflow {
            what: "shared allocation size",
        };
        let size = reader.usize().ok_or(too_large.clone())?;
        let granularity = reader.usize().ok_or(too_large)?;
        let device = reader.u32().ok_or(bad("truncated device ordinal"))?;
        if reader.u32() != Some(0) {
            return Err(bad("reserved field is not zero"));
        }
        ExportInfo::new(size, device as usize, granularity)
    }
}

#[cfg(test)]
mod tests {
    use super::{ExportInfo, MAGIC};
    use crate::error::Error;
    use proptest::prelude::*;

    #[test]
    fn encoding_round_trips() {
        let info = ExportInfo::new(6 << 20, 1, 2 << 20).unwrap();
        let bytes = info.to_bytes();
        assert_eq!(bytes[..8], MAGIC);
        assert_eq!(ExportInfo::from_bytes(&bytes), Ok(info));
        assert_eq!(info.size(), 6 << 20);
        assert_eq!(info.device_ordinal(), 1);
        assert_eq!(info.granularity(), 2 << 20);
    }

    #[test]
    fn descriptions_are_checked() {
        assert!(matches!(
            ExportInfo::new(0, 0, 2 << 20),
            Err(Error::ZeroSize { .. })
        ));
        assert!(matches!(
            ExportInfo::new(2 << 20, 0, 0),
            Err(Error::ZeroSize { .. })
        ));
        assert!(matches!(
            ExportInfo::new(3 << 20, 0, 2 << 20),
            Err(Error::NotAligned { .. })
        ));
        assert!(matches!(
            ExportInfo::new(2 << 20, 1 << 31, 2 << 20),
            Err(Error::InvalidArgument { .. })
        ));
        let good = ExportInfo::new(2 << 20, 0, 2 << 20).unwrap().to_bytes();
        // Each field spoiled in turn.
        for (at, what) in [
            (0, "magic"),
            (8, "version"),
            (12, "handle type"),
            (36, "reserved"),
        ] {
            let mut bytes = good;
            bytes[at] ^= 0x40;
            assert!(
                matches!(
                    ExportInfo::from_bytes(&bytes),
                    Err(Error::InvalidMessage { .. })
                ),
                "{what}"
            );
        }
        assert!(matches!(
            ExportInfo::from_bytes(&good[..39]),
            Err(Error::InvalidMessage { .. })
        ));
        let mut unaligned = good;
        unaligned[16] = 1;
        assert!(matches!(
            ExportInfo::from_bytes(&unaligned),
            Err(Error::NotAligned { .. })
        ));
    }

    proptest! {
        /// Any bytes at all: a checked description or an error, never a panic; and whatever is
        /// accepted encodes back to the same bytes.
        #[test]
        fn any_bytes_are_parsed_or_refused(bytes in proptest::collection::vec(any::<u8>(), 0..48), keep_header in any::<bool>()) {
            let mut bytes = bytes;
            if keep_header && bytes.len() >= 16 {
                bytes[..8].copy_from_slice(&MAGIC);
                bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
                bytes[12..16].copy_from_slice(&1u32.to_le_bytes());
            }
            if let Ok(info) = ExportInfo::from_bytes(&bytes) {
                prop_assert!(info.size() > 0 && info.size() % info.granularity() == 0);
                prop_assert_eq!(&info.to_bytes()[..], &bytes[..]);
            }
        }
    }
}
