//! The description of an exported buffer ([`BufferInfo`], [`BufferPiece`]) and its wire format,
//! read and checked here with no driver call, so that it is property-tested (and fuzzed) without a
//! GPU.

use crate::error::Error;
use crate::ipc::reader::Reader;
use crate::sys;
use crate::vmm::physical::check_multiple;

/// The first bytes of an encoded [`BufferInfo`].
const MAGIC: [u8; 8] = *b"CUVMMBUF";
/// The version of the encoding.
const VERSION: u32 = 1;
/// The bytes of the header: magic, version, handle type, budget, piece count, reserved.
const HEADER_LEN: usize = 32;
/// The bytes of one piece: offset, size, granularity, device ordinal, reserved.
const PIECE_LEN: usize = 32;

/// One page of an exported buffer: where it lies in the buffer, its size, the device whose memory it
/// is and the exporter's allocation granularity.
///
/// Made only by [`BufferPiece::new`] (and by [`BufferInfo::from_bytes`], which calls it), which
/// checks it.
///
/// # Examples
/// ```
/// use cuda_vmm::ipc::BufferPiece;
///
/// let piece = BufferPiece::new(4 << 20, 2 << 20, 0, 2 << 20)?;
/// assert_eq!(piece.end(), 6 << 20);
/// assert!(BufferPiece::new(1 << 20, 2 << 20, 0, 2 << 20).is_err()); // offset not aligned
/// # Ok::<(), cuda_vmm::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferPiece {
    offset: usize,
    size: usize,
    granularity: usize,
    device: u32,
}

impl BufferPiece {
    /// A checked piece: a non-zero size, a non-zero granularity, size and offset multiples of it, an
    /// end that fits `usize` and a device ordinal the driver can represent.
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for a zero size or granularity; [`Error::NotAligned`] for a size or offset
    /// that is not a multiple of the granularity; [`Error::Overflow`] where `offset + size` does not
    /// fit; [`Error::InvalidArgument`] for a device ordinal above `i32::MAX`.
    ///
    /// # Examples
    /// ```
    /// # use cuda_vmm::ipc::BufferPiece;
    /// assert_eq!(BufferPiece::new(0, 2 << 20, 1, 2 << 20)?.device_ordinal(), 1);
    /// # Ok::<(), cuda_vmm::Error>(())
    /// ```
    pub fn new(
        offset: usize,
        size: usize,
        device_ordinal: usize,
        granularity: usize,
    ) -> Result<BufferPiece, Error> {
        if size == 0 {
            return Err(Error::ZeroSize {
                what: "exported page size",
            });
        }
        if granularity == 0 {
            return Err(Error::ZeroSize {
                what: "granularity",
            });
        }
        check_multiple("exported page size", size, granularity)?;
        check_multiple("exported page offset", offset, granularity)?;
        offset.checked_add(size).ok_or(Error::Overflow {
            what: "exported page offset + size",
        })?;
        let device = u32::try_from(device_ordinal)
            .ok()
            .filter(|&d| i32::try_from(d).is_ok())
            .ok_or(Error::InvalidArgument {
                what: "device ordinal",
            })?;
        Ok(BufferPiece {
            offset,
            size,
            granularity,
            device,
        })
    }

    /// The page's first byte, counted from the buffer's base.
    #[must_use]
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The page's size in bytes.
    #[must_use]
    pub fn size(&self) -> usize {
        self.size
    }

    /// The end of the page (exclusive), counted from the buffer's base; it fits `usize` (checked).
    #[must_use]
    pub fn end(&self) -> usize {
        self.offset.saturating_add(self.size)
    }

    /// The exporter's device ordinal of the page's memory.
    #[must_use]
    pub fn device_ordinal(&self) -> usize {
        self.device as usize
    }

    /// The exporter's minimum allocation granularity for the page.
    #[must_use]
    pub fn granularity(&self) -> usize {
        self.granularity
    }
}

/// What an importer of a whole buffer needs besides the descriptors: the buffer's address budget and
/// its pages ([`BufferPiece`]s), in address order.
///
/// Made only by [`BufferInfo::new`] and [`BufferInfo::from_bytes`], which check it: a non-zero
/// budget, from one to [`BufferInfo::MAX_PIECES`] pieces, each checked, sorted by offset, none
/// overlapping the next, every one inside the budget.
///
/// # Examples
/// ```
/// use cuda_vmm::ipc::{BufferInfo, BufferPiece};
///
/// let g = 2 << 20;
/// let info = BufferInfo::new(8 * g, vec![BufferPiece::new(0, g, 0, g)?, BufferPiece::new(4 * g, 2 * g, 0, g)?])?;
/// assert_eq!(BufferInfo::from_bytes(&info.to_bytes())?, info);
/// assert!(BufferInfo::new(8 * g, vec![BufferPiece::new(0, 2 * g, 0, g)?, BufferPiece::new(g, g, 0, g)?]).is_err()); // overlap
/// # Ok::<(), cuda_vmm::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BufferInfo {
    budget: usize,
    pieces: Vec<BufferPiece>,
}

impl BufferInfo {
    /// The most pieces one buffer message carries: Linux's limit on the descriptors of one
    /// `SCM_RIGHTS` message (`SCM_MAX_FD`).
    pub const MAX_PIECES: usize = 253;

    /// The longest encoding: the header and [`BufferInfo::MAX_PIECES`] pieces.
    pub const MAX_ENCODED_LEN: usize = HEADER_LEN + BufferInfo::MAX_PIECES * PIECE_LEN;

    /// A checked description of an exported buffer.
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for a zero budget or no piece; [`Error::InvalidArgument`] for more than
    /// [`BufferInfo::MAX_PIECES`]; [`Error::OutOfBounds`] for a piece that ends past the budget;
    /// [`Error::PageRange`] for pieces out of order or overlapping (the error names the bytes).
    ///
    /// # Examples
    /// ```
    /// # use cuda_vmm::ipc::{BufferInfo, BufferPiece};
    /// let g = 2 << 20;
    /// assert!(BufferInfo::new(g, vec![BufferPiece::new(0, 2 * g, 0, g)?]).is_err()); // past the budget
    /// # Ok::<(), cuda_vmm::Error>(())
    /// ```
    pub fn new(budget: usize, pieces: Vec<BufferPiece>) -> Result<BufferInfo, Error> {
        if budget == 0 {
            return Err(Error::ZeroSize {
                what: "exported buffer budget",
            });
        }
        if pieces.is_empty() {
            return Err(Error::ZeroSize {
                what: "pages of an exported buffer",
            });
        }
        if pieces.len() > BufferInfo::MAX_PIECES {
            return Err(Error::InvalidArgument {
                what: "more pages than one message carries descriptors for (253)",
            });
        }
        let mut reached = 0usize;
        for piece in &pieces {
            if piece.end() > budget {
                return Err(Error::OutOfBounds {
                    what: "exported buffer budget",
                    start: piece.offset,
                    end: piece.end(),
                    len: budget,
                });
            }
            if piece.offset < reached {
                return Err(Error::PageRange {
                    start: piece.offset,
                    end: piece.end(),
                    problem: "overlap or precede the page before them in the exported buffer",
                });
            }
            reached = piece.end();
        }
        Ok(BufferInfo { budget, pieces })
    }

    /// The exporter's address budget: the importer reserves as much.
    #[must_use]
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// The pages, in address order.
    #[must_use]
    pub fn pieces(&self) -> &[BufferPiece] {
        &self.pieces
    }

    /// The bytes of every page together (at most the budget: the pieces are disjoint and inside it).
    #[must_use]
    pub fn total_bytes(&self) -> usize {
        self.pieces
            .iter()
            .fold(0usize, |sum, p| sum.saturating_add(p.size))
    }

    /// The encoding that [`from_bytes`](BufferInfo::from_bytes) reads: a 32-byte header (magic
    /// `CUVMMBUF`, version, handle type, budget, piece count, reserved) and 32 bytes per piece
    /// (offset, size, granularity, device ordinal, reserved), little-endian.
    ///
    /// # Examples
    /// ```
    /// # use cuda_vmm::ipc::{BufferInfo, BufferPiece};
    /// let g = 2 << 20;
    /// let info = BufferInfo::new(g, vec![BufferPiece::new(0, g, 0, g)?])?;
    /// assert_eq!(info.to_bytes().len(), 64);
    /// # Ok::<(), cuda_vmm::Error>(())
    /// ```
    #[must_use]
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            HEADER_LEN.saturating_add(self.pieces.len().saturating_mul(PIECE_LEN)),
        );
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.to_le_bytes());
        out.extend_from_slice(&(self.budget as u64).to_le_bytes());
        // At most `MAX_PIECES` (checked when made).
        out.extend_from_slice(&(self.pieces.len() as u32).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        for piece in &self.pieces {
            out.extend_from_slice(&(piece.offset as u64).to_le_bytes());
            out.extend_from_slice(&(piece.size as u64).to_le_bytes());
            out.extend_from_slice(&(piece.granularity as u64).to_le_bytes());
            out.extend_from_slice(&piece.device.to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
        }
        out
    }

    /// Reads and checks an encoding made by [`to_bytes`](BufferInfo::to_bytes), with no driver
    /// call: its length against its piece count, the magic, version, handle type and reserved
    /// fields, every piece ([`BufferPiece::new`]) and their order ([`BufferInfo::new`]), every value
    /// against `usize` with no overflow.
    ///
    /// # Errors
    /// [`Error::InvalidMessage`] for a wrong length, magic, version, handle type, reserved field, a
    /// piece count of 0 or above [`BufferInfo::MAX_PIECES`], or a value beyond `usize`; otherwise as
    /// [`BufferPiece::new`] and [`BufferInfo::new`].
    ///
    /// # Examples
    /// ```
    /// # use cuda_vmm::ipc::BufferInfo;
    /// assert!(BufferInfo::from_bytes(b"not a buffer").is_err());
    /// ```
    pub fn from_bytes(bytes: &[u8]) -> Result<BufferInfo, Error> {
        let bad = |what| Error::InvalidMessage { what };
        let mut reader = Reader(bytes);
        if reader.take::<8>() != Some(MAGIC) {
            return Err(bad("not an exported-buffer description (wrong magic)"));
        }
        if reader.u32() != Some(VERSION) {
            return Err(bad("unknown version of the exported-buffer description"));
        }
        if reader.u32() != Some(sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
            return Err(bad("handle type is not a POSIX file descriptor"));
        }
        let budget = reader
            .usize()
            .ok_or(bad("the budget is truncated or beyond usize"))?;
        let count = reader.u32().ok_or(bad("truncated piece count"))? as usize;
        if reader.u32() != Some(0) {
            return Err(bad("reserved field is not zero"));
        }
        if count == 0 || count > BufferInfo::MAX_PIECES {
            return Err(bad("the piece count is 0 or above 253"));
        }
        let expected = count
            .checked_mul(PIECE_LEN)
            .and_then(|n| n.checked_add(HEADER_LEN));
        if expected != Some(bytes.len()) {
            return Err(bad("the length is not that of its piece count"));
        }
        let mut pieces = Vec::with_capacity(count);
        for _ in 0..count {
            let offset = reader
                .usize()
                .ok_or(bad("a piece offset is beyond usize"))?;
            let size = reader.usize().ok_or(bad("a piece size is beyond usize"))?;
            let granularity = reader
                .usize()
                .ok_or(bad("a piece granularity is beyond usize"))?;
            let device = reader.u32().ok_or(bad("truncated device ordinal"))?;
            if reader.u32() != Some(0) {
                return Err(bad("a piece's reserved field is not zero"));
            }
            pieces.push(BufferPiece::new(
                offset,
                size,
                device as usize,
                granularity,
            )?);
        }
        BufferInfo::new(budget, pieces)
    }
}

/// Whether `bytes`, the start of a message on a stream socket, is a well-formed header of a
/// message longer than `bytes`: then the rest is read on. Anything else is decoded as it is (and
/// refused where malformed), so a malformed message never makes `receive` wait for more.
pub(super) fn wants_more(bytes: &[u8]) -> bool {
    let mut reader = Reader(bytes);
    let header = reader.take::<8>() == Some(MAGIC)
        && reader.u32() == Some(VERSION)
        && reader.u32() == Some(sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if !header {
        return false;
    }
    if reader.take::<8>().is_none() {
        return true; // the budget and count have not come yet
    }
    let Some(count) = reader.u32().map(|c| c as usize) else {
        return true;
    };
    if count == 0 || count > BufferInfo::MAX_PIECES {
        return false;
    }
    HEADER_LEN.saturating_add(count.saturating_mul(PIECE_LEN)) > bytes.len()
}

#[cfg(test)]
mod tests {
    use super::{BufferInfo, BufferPiece, HEADER_LEN, MAGIC, PIECE_LEN, wants_more};
    use crate::error::Error;
    use proptest::prelude::*;

    const G: usize = 2 << 20;

    fn five() -> BufferInfo {
        let pieces = [(0, 1), (1, 2), (3, 1), (6, 1), (7, 3)]
            .iter()
            .map(|&(at, pages)| BufferPiece::new(at * G, pages * G, 0, G).unwrap())
            .collect();
        BufferInfo::new(16 * G, pieces).unwrap()
    }

    #[test]
    fn encoding_round_trips() {
        let info = five();
        let bytes = info.to_bytes();
        assert_eq!(bytes.len(), HEADER_LEN + 5 * PIECE_LEN);
        assert_eq!(bytes[..8], MAGIC);
        assert_eq!(BufferInfo::from_bytes(&bytes), Ok(info.clone()));
        assert_eq!(info.total_bytes(), 8 * G);
        assert!(!wants_more(&bytes));
        assert!(wants_more(&bytes[..40]));
        assert!(wants_more(&bytes[..20]));
        assert!(!wants_more(b"CUVMMBUX"));
    }

    #[test]
    fn each_field_is_checked() {
        let good = five().to_bytes();
        let spoil = |at: usize, value: u8| {
            let mut bytes = good.clone();
            bytes[at] = value;
            BufferInfo::from_bytes(&bytes)
        };
        let invalid = |r: Result<BufferInfo, Error>| matches!(r, Err(Error::InvalidMessage { .. }));
        assert!(invalid(spoil(0, b'X')), "magic");
        assert!(invalid(spoil(8, 2)), "version");
        assert!(invalid(spoil(12, 8)), "handle type");
        assert!(invalid(spoil(24, 6)), "count vs length");
        assert!(invalid(spoil(24, 0)), "zero count");
        assert!(invalid(spoil(28, 1)), "reserved");
        assert!(invalid(spoil(HEADER_LEN + 28, 1)), "a piece's reserved");
        assert!(invalid(BufferInfo::from_bytes(&good[..good.len() - 1])));
        let mut longer = good.clone();
        longer.push(0);
        assert!(invalid(BufferInfo::from_bytes(&longer)));
        // Piece 1 (offset 1G) moved onto piece 0: out of order.
        assert!(matches!(
            spoil(HEADER_LEN + PIECE_LEN + 2, 0),
            Err(Error::PageRange { .. })
        ));
        // A size that is not a multiple of the granularity.
        assert!(matches!(
            spoil(HEADER_LEN + 8, 1),
            Err(Error::NotAligned { .. })
        ));
        // A zero size.
        let mut zero = good.clone();
        zero[HEADER_LEN + 8..HEADER_LEN + 16].fill(0);
        assert!(matches!(
            BufferInfo::from_bytes(&zero),
            Err(Error::ZeroSize { .. })
        ));
        // The last piece past the budget.
        // A budget of 8 pages (byte 19 of 2 << 24 is 2), under the last piece's end at 10 pages.
        assert!(matches!(spoil(19, 1), Err(Error::OutOfBounds { .. })));
        // An offset near u64::MAX: beyond usize on no platform here, so it overflows offset + size.
        let mut huge = good.clone();
        let last = HEADER_LEN + 4 * PIECE_LEN;
        huge[last..last + 8].copy_from_slice(&(u64::MAX - (G as u64) + 1).to_le_bytes());
        assert!(BufferInfo::from_bytes(&huge).is_err());
    }

    #[test]
    fn made_descriptions_are_checked() {
        assert!(BufferInfo::new(0, vec![]).is_err());
        assert!(BufferInfo::new(G, vec![]).is_err());
        let one = BufferPiece::new(0, G, 0, G).unwrap();
        assert!(BufferInfo::new(G * 300, vec![one; 254]).is_err());
        assert!(BufferPiece::new(usize::MAX - G + 1, G, 0, G).is_err());
        assert!(BufferPiece::new(0, G, 1 << 31, G).is_err());
        assert!(BufferPiece::new(0, G, 0, 0).is_err());
    }

    /// A well-formed encoding of up to 6 pieces, each field then possibly spoiled.
    fn encodings() -> impl Strategy<Value = Vec<u8>> {
        (
            proptest::collection::vec((0u64..4, 1u64..4, 0u32..3), 1..6),
            0u64..40,
            proptest::collection::vec((any::<usize>(), any::<u8>()), 0..3),
            0usize..3,
        )
            .prop_map(|(parts, budget, flips, cut)| {
                let g = 1u64 << 21;
                let mut out = Vec::new();
                out.extend_from_slice(&MAGIC);
                out.extend_from_slice(&1u32.to_le_bytes());
                out.extend_from_slice(&1u32.to_le_bytes());
                out.extend_from_slice(&(budget * g).to_le_bytes());
                out.extend_from_slice(&(parts.len() as u32).to_le_bytes());
                out.extend_from_slice(&0u32.to_le_bytes());
                let mut at = 0;
                for (gap, pages, device) in parts {
                    at += gap;
                    out.extend_from_slice(&(at * g).to_le_bytes());
                    out.extend_from_slice(&(pages * g).to_le_bytes());
                    out.extend_from_slice(&g.to_le_bytes());
                    out.extend_from_slice(&device.to_le_bytes());
                    out.extend_from_slice(&0u32.to_le_bytes());
                    at += pages;
                }
                let len = out.len();
                for (at, byte) in flips {
                    out[at % len] ^= byte;
                }
                out.truncate(len - cut.min(len));
                out
            })
    }

    proptest! {
        /// Any bytes at all: a checked description or an error, never a panic; whatever is accepted
        /// encodes back to the same bytes and keeps every promise of `BufferInfo`.
        #[test]
        fn any_bytes_are_parsed_or_refused(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(info) = BufferInfo::from_bytes(&bytes) {
                prop_assert_eq!(info.to_bytes(), bytes);
            }
        }

        /// Near-valid encodings: accepted ones are sorted, disjoint, aligned and inside the budget,
        /// and encode back to the same bytes.
        #[test]
        fn near_valid_encodings_keep_the_promises(bytes in encodings()) {
            if let Ok(info) = BufferInfo::from_bytes(&bytes) {
                prop_assert_eq!(&info.to_bytes(), &bytes);
                let mut reached = 0;
                for p in info.pieces() {
                    prop_assert!(p.size() > 0 && p.granularity() > 0);
                    prop_assert_eq!(p.size() % p.granularity(), 0);
                    prop_assert_eq!(p.offset() % p.granularity(), 0);
                    prop_assert!(p.offset() >= reached && p.end() <= info.budget());
                    reached = p.end();
                }
                prop_assert!(info.total_bytes() <= info.budget());
            }
        }
    }
}
