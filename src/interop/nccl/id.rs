//! [`UniqueId`]: the 128 bytes through which the ranks of a clique of several processes meet.

use core::fmt;
use std::io::{self, Read, Write};

use super::api::{self, ID_BYTES, RawId};
use crate::error::Error;

/// `ncclUniqueId` — what rank 0 makes ([`UniqueId::new`]) and every other rank receives before
/// [`Comm::from_rank`](super::Comm::from_rank): 128 opaque bytes (NCCL puts rank 0's bootstrap
/// address in them).
///
/// [`write_to`](UniqueId::write_to) and [`read_from`](UniqueId::read_from) pass it over a pipe, a
/// socket or any other byte stream, framed by four magic bytes so that a stream carrying something
/// else is refused.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId {
    bytes: [u8; ID_BYTES],
}

/// What [`UniqueId::write_to`] writes before the id.
const MAGIC: [u8; 4] = *b"NCID";

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The bytes hold a network address and a secret of the bootstrap: not printed.
        f.debug_struct("UniqueId").finish_non_exhaustive()
    }
}

impl UniqueId {
    /// `ncclGetUniqueId` — a new id, made on the rank that will be rank 0.
    ///
    /// # Errors
    /// [`Error::NcclUnavailable`] where NCCL cannot be loaded; [`Error::Nccl`] for its refusal (no
    /// usable network interface, for instance).
    #[doc(alias = "ncclGetUniqueId")]
    pub fn new() -> Result<UniqueId, Error> {
        let api = api::api("ncclGetUniqueId")?;
        let get = api::function(api.get_unique_id, "ncclGetUniqueId")?;
        let mut raw = RawId {
            internal: [0; ID_BYTES],
        };
        // SAFETY: `raw` is 128 writable bytes, `ncclUniqueId`'s layout (asserted in `api`).
        api::check(unsafe { get(&raw mut raw) }, "ncclGetUniqueId")?;
        Ok(UniqueId {
            bytes: raw.internal.map(|b| b.to_ne_bytes()[0]),
        })
    }

    /// The id from its 128 bytes, as [`as_bytes`](UniqueId::as_bytes) gave them on another rank.
    #[must_use]
    pub fn from_bytes(bytes: [u8; ID_BYTES]) -> UniqueId {
        UniqueId { bytes }
    }

    /// The 128 bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8; ID_BYTES] {
        &self.bytes
    }

    pub(super) fn raw(&self) -> RawId {
        RawId {
            internal: self.bytes.map(|b| core::ffi::c_char::from_ne_bytes([b])),
        }
    }

    /// Writes the id to `out` (four magic bytes, then the 128 bytes) and flushes it.
    ///
    /// # Errors
    /// [`Error::Os`] with the system's error number where writing fails (0 where it has none).
    pub fn write_to(&self, mut out: impl Write) -> Result<(), Error> {
        let mut message = [0u8; MAGIC.len() + ID_BYTES];
        let (magic, id) = message.split_at_mut(MAGIC.len());
        magic.copy_from_slice(&MAGIC);
        id.copy_from_slice(&self.bytes);
        out.write_all(&message)
            .and_then(|()| out.flush())
            .map_err(|e| os("writing the NCCL unique id", &e))
    }

    /// Reads an id that [`write_to`](UniqueId::write_to) wrote.
    ///
    /// # Errors
    /// [`Error::InvalidMessage`] where the stream ends early or does not start with the magic
    /// bytes; [`Error::Os`] where reading fails.
    pub fn read_from(mut input: impl Read) -> Result<UniqueId, Error> {
        let mut message = [0u8; MAGIC.len() + ID_BYTES];
        input.read_exact(&mut message).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                Error::InvalidMessage {
                    what: "the stream ended before the whole NCCL unique id",
                }
            } else {
                os("reading the NCCL unique id", &e)
            }
        })?;
        let (magic, id) = message.split_at(MAGIC.len());
        if magic != MAGIC {
            return Err(Error::InvalidMessage {
                what: "the stream does not carry an NCCL unique id (no magic bytes)",
            });
        }
        let mut bytes = [0u8; ID_BYTES];
        bytes.copy_from_slice(id);
        Ok(UniqueId { bytes })
    }
}

fn os(what: &'static str, error: &io::Error) -> Error {
    Error::Os {
        what,
        errno: error.raw_os_error().unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_goes_through_a_byte_stream_and_back() {
        let bytes: [u8; ID_BYTES] = core::array::from_fn(|i| i as u8);
        let id = UniqueId::from_bytes(bytes);
        let mut wire = Vec::new();
        id.write_to(&mut wire).unwrap();
        assert_eq!(wire.len(), 4 + ID_BYTES);
        assert_eq!(UniqueId::read_from(wire.as_slice()).unwrap(), id);
        assert_eq!(id.raw().internal[72].to_ne_bytes(), [72]);
    }

    #[test]
    fn a_short_or_foreign_stream_is_refused() {
        let short = [b'N', b'C', b'I', b'D', 1, 2, 3];
        assert!(matches!(
            UniqueId::read_from(&short[..]),
            Err(Error::InvalidMessage { .. })
        ));
        let foreign = [0u8; 4 + ID_BYTES];
        assert!(matches!(
            UniqueId::read_from(&foreign[..]),
            Err(Error::InvalidMessage { .. })
        ));
    }
}
