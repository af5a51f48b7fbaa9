//! The page table's lends to a scope: admissions of a scoped buffer's views (each checked again
//! against the pages), the claims of its writes and reads, reads after writes
//! ([`read_back`](Table::read_back)) and reuses of a freed block, and the holds of the
//! [`ClaimedRange`](super::super::ClaimedRange)s of a buffer borrowed shared. No driver call, and
//! no page changes state here: part of the table's module, whose states are in `table.rs`.

use crate::error::Error;
use crate::stream::StreamId;

use super::{Table, bump};

/// What the bytes of a [`ClaimedRange`](super::ClaimedRange) are, in errors.
pub(in crate::owned::buffer) const HELD: &str = "are claimed for writing by a ClaimedRange (VirtualBuffer::claim_bytes_mut) \
                               that is still alive";

/// A range read back ([`Table::read_back`]): the count of mapped pages its lends carry, the streams
/// of the writes its read is ordered after, and the slot of the lends to wait for first (`None`
/// where nothing was written).
pub(in crate::owned::buffer) struct ReadBack {
    pub(in crate::owned::buffer) epoch: u64,
    pub(in crate::owned::buffer) streams: Vec<StreamId>,
    pub(in crate::owned::buffer) lends: Option<usize>,
}

impl<P> Table<P> {
    /// Admits a lend of the scoped view `[start, end)` made at `epoch` ([`usable`](Table::usable)
    /// then): the slot of the lend generation it counts in until its work is queued.
    pub(in crate::owned::buffer) fn admit(
        &self,
        start: usize,
        end: usize,
        epoch: u64,
    ) -> Result<usize, Error> {
        self.usable_since(start, end, epoch)?;
        Ok(self.generation % 2)
    }

    /// Admits a write lend of the scoped view `[start, end)` made at `epoch` to work on `stream`: as
    /// [`admit`](Table::admit), and the bytes still lent for writing (not read back since), whose
    /// claim remembers `stream` for the read back.
    pub(in crate::owned::buffer) fn admit_write(
        &mut self,
        start: usize,
        end: usize,
        epoch: u64,
        stream: StreamId,
    ) -> Result<usize, Error> {
        self.usable_since(start, end, epoch)?;
        self.claims.wrote(start, end, stream)?;
        Ok(self.generation % 2)
    }

    /// Reads `[start, end)` back for a scope, once it is [`usable`](Table::usable): the write
    /// claims sharing a byte are settled (no write lend follows) and the range is claimed for
    /// reading. Where a write was lent, the lend generation turns, so that the caller waits for the
    /// write lends in progress (`lends`) before it orders the read after their `streams`.
    pub(in crate::owned::buffer) fn read_back(
        &mut self,
        start: usize,
        end: usize,
    ) -> Result<ReadBack, Error> {
        self.usable(start, end)?;
        let streams = self.claims.read_back(start, end)?;
        let lends = if streams.is_empty() {
            None
        } else {
            let old = self.generation % 2;
            self.generation = self.generation.wrapping_add(1);
            Some(old)
        };
        Ok(ReadBack {
            epoch: self.epoch,
            streams,
            lends,
        })
    }

    /// Lends `[start, end)` again for writing in a scope, to work on `stream`, once it is
    /// [`usable`](Table::usable): the count turns, every handle of the range made before is refused
    /// from now on, and the range is claimed for writing anew. The lend generation turns too: the
    /// new count, which the new lend carries, and the slot of the lends to wait for before the
    /// caller orders `stream` after the work queued so far.
    pub(in crate::owned::buffer) fn reuse(
        &mut self,
        start: usize,
        end: usize,
        stream: StreamId,
    ) -> Result<(u64, usize), Error> {
        self.usable(start, end)?;
        let epoch = self.epoch.saturating_add(1);
        self.claims.reuse(start, end, epoch, stream)?;
        self.epoch = epoch;
        let lends = self.generation % 2;
        self.generation = self.generation.wrapping_add(1);
        Ok((epoch, lends))
    }

    /// Claims `[start, end)` for a scope, for writing (exclusively) or reading, once it is
    /// [`usable`](Table::usable): the count of mapped pages now, which its lends carry.
    pub(in crate::owned::buffer) fn claim(
        &mut self,
        start: usize,
        end: usize,
        write: bool,
    ) -> Result<u64, Error> {
        self.usable(start, end)?;
        if write {
            self.claims.write(start, end)?;
        } else {
            self.claims.read(start, end)?;
        }
        Ok(self.epoch)
    }

    /// Claims `[start, end)` for writing in chunks of `chunk` bytes, each its own write claim
    /// (as the claims' `write_chunks` makes them), once the range is
    /// [`usable`](Table::usable): the count of mapped pages now, which their lends carry.
    pub(in crate::owned::buffer) fn claim_chunks(
        &mut self,
        start: usize,
        end: usize,
        chunk: usize,
    ) -> Result<u64, Error> {
        self.usable(start, end)?;
        self.claims.write_chunks(start, end, chunk)?;
        Ok(self.epoch)
    }

    /// Claims every range of `ranges` (`[start, end)`, whether for writing; sharing no byte with
    /// each other) for a scope, all or none, once each is [`usable`](Table::usable): the count of
    /// mapped pages now, which their lends carry (a graph bound to the scope).
    pub(in crate::owned::buffer) fn claim_all(
        &mut self,
        ranges: &[(usize, usize, bool)],
    ) -> Result<u64, Error> {
        for &(start, end, _) in ranges {
            self.usable(start, end)?;
        }
        self.claims.claim_all(ranges)?;
        Ok(self.epoch)
    }

    /// Forgets every claim: the scope that held them has ended.
    pub(in crate::owned::buffer) fn clear_claims(&mut self) {
        self.claims.clear();
    }

    /// Holds `[start, end)` for one writer, once it is [`usable`](Table::usable) and no other
    /// hold shares a byte with it: a [`ClaimedRange`](super::ClaimedRange) is made.
    pub(in crate::owned::buffer) fn hold(&mut self, start: usize, end: usize) -> Result<(), Error> {
        self.usable(start, end)?;
        self.not_held(start, end)?;
        self.held.push((start, end));
        Ok(())
    }

    /// `Ok` where no hold shares a byte with `[start, end)`, else the first shared bytes named:
    /// what every other view made through `&self` of the buffer checks.
    pub(in crate::owned::buffer) fn not_held(&self, start: usize, end: usize) -> Result<(), Error> {
        match self.held.iter().find(|h| h.0 < end && h.1 > start) {
            Some(&(s, e)) => Err(Error::PageRange {
                start: s.max(start),
                end: e.min(end),
                problem: HELD,
            }),
            None => Ok(()),
        }
    }

    /// Lets go of the hold `[start, end)`: its claim has ended.
    pub(in crate::owned::buffer) fn release_hold(&mut self, start: usize, end: usize) {
        if let Some(i) = self.held.iter().position(|&h| h == (start, end)) {
            self.held.swap_remove(i);
        }
    }

    /// Forgets every hold: the buffer is borrowed exclusively, so no claim lives.
    pub(in crate::owned::buffer) fn forget_holds(&mut self) {
        self.held.clear();
    }

    /// An eviction in a scope has queued its copies: the claims on `[start, end)` are forgotten and
    /// its `pieces` pages count as evicted.
    pub(in crate::owned::buffer) fn evicting(&mut self, start: usize, end: usize, pieces: usize) {
        self.claims.forget(start, end);
        for _ in 0..pieces {
            bump(&mut self.stats.pages_evicted);
        }
    }
}
