//! The descriptor decoders, on arbitrary bytes: `BufferInfo::from_bytes` (a whole exported buffer),
//! `ExportInfo::from_bytes` (one exported allocation) and `FabricHandle::from_bytes` (a fabric
//! handle and its description). Each gives a checked description or an `Error`, never a panic;
//! what is accepted keeps every promise of its type (pieces non-empty, aligned to their
//! granularity, sorted, disjoint, inside the budget; a size that is a non-zero multiple of a
//! non-zero granularity) and encodes back to the same bytes.

#![no_main]

use cuda_vmm::ipc::{BufferInfo, ExportInfo, FabricHandle};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(info) = BufferInfo::from_bytes(bytes) {
        assert_eq!(
            info.to_bytes(),
            bytes,
            "an accepted buffer description re-encodes"
        );
        assert!(!info.pieces().is_empty() && info.pieces().len() <= BufferInfo::MAX_PIECES);
        let mut reached = 0usize;
        for piece in info.pieces() {
            assert!(piece.size() > 0 && piece.granularity() > 0);
            assert_eq!(piece.size() % piece.granularity(), 0);
            assert_eq!(piece.offset() % piece.granularity(), 0);
            assert!(piece.offset() >= reached, "sorted and disjoint");
            assert!(piece.end() <= info.budget() && piece.end() > piece.offset());
            assert!(i32::try_from(piece.device_ordinal()).is_ok());
            reached = piece.end();
        }
        assert!(info.total_bytes() <= info.budget());
    }
    if let Ok(info) = ExportInfo::from_bytes(bytes) {
        assert_eq!(
            &info.to_bytes()[..],
            bytes,
            "an accepted allocation description re-encodes"
        );
        assert!(info.size() > 0 && info.granularity() > 0);
        assert_eq!(info.size() % info.granularity(), 0);
    }
    if let Ok(handle) = FabricHandle::from_bytes(bytes) {
        assert_eq!(
            &handle.to_bytes()[..],
            bytes,
            "an accepted fabric handle re-encodes"
        );
        assert!(handle.size() > 0 && handle.granularity() > 0);
        assert_eq!(handle.size() % handle.granularity(), 0);
        assert_eq!(&bytes[bytes.len() - 64..], handle.raw_handle());
    }
});
