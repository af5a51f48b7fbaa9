//! [`Reader`]: the little-endian fields of a description another process sent, read from the front
//! of a byte slice without indexing, and [`encode`], which lays a description's fields out. The one
//! reader and writer of the POSIX-fd, buffer and fabric descriptions.

/// The `fields` one after another in `N` bytes, the rest zero: a description's encoding. A field
/// that would run past the end is left out, with every field after it (the callers' fields fill
/// `N` exactly: their tests read every field back).
pub(super) fn encode<const N: usize>(fields: &[&[u8]]) -> [u8; N] {
    let mut out = [0u8; N];
    let mut rest: &mut [u8] = &mut out;
    for field in fields {
        let Some((head, tail)) = rest.split_at_mut_checked(field.len()) else {
            break;
        };
        head.copy_from_slice(field);
        rest = tail;
    }
    out
}

/// Little-endian fields read from the front of a byte slice, without indexing: each read is `None`
/// once the bytes run out.
pub(super) struct Reader<'a>(pub(super) &'a [u8]);

impl Reader<'_> {
    pub(super) fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }

    pub(super) fn u32(&mut self) -> Option<u32> {
        self.take::<4>().map(u32::from_le_bytes)
    }

    pub(super) fn u64(&mut self) -> Option<u64> {
        self.take::<8>().map(u64::from_le_bytes)
    }

    /// A `u64` field that must fit `usize`.
    pub(super) fn usize(&mut self) -> Option<usize> {
        self.u64().and_then(|v| usize::try_from(v).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::{Reader, encode};

    #[test]
    fn fields_are_laid_out_in_order_and_none_runs_past_the_end() {
        assert_eq!(
            encode::<6>(&[&[1, 2], &[3], &[4, 5, 6]]),
            [1, 2, 3, 4, 5, 6]
        );
        assert_eq!(encode::<4>(&[&[1], &[2, 3, 4, 5], &[6]]), [1, 0, 0, 0]);
        assert_eq!(encode::<3>(&[&[7]]), [7, 0, 0]);
    }

    #[test]
    fn fields_are_read_in_order_until_the_bytes_run_out() {
        let bytes = [1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 9];
        let mut reader = Reader(&bytes);
        assert_eq!(reader.u32(), Some(1));
        assert_eq!(reader.usize(), Some(2));
        assert_eq!(reader.u32(), None, "one byte left");
        assert_eq!(reader.take::<1>(), Some([9]));
        assert_eq!(reader.u64(), None);
    }
}
