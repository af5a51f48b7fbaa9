//! The bookkeeping of mapped byte ranges shared by the owned layer: where a new mapping goes, which
//! ranges a view or an unmap covers, which are evicted. Pure integer arithmetic over sorted,
//! disjoint ranges, so that it is property-tested without a driver (and under Miri). A
//! [`VirtualBuffer`](super::VirtualBuffer)'s page table (`buffer/table.rs`) and a
//! [`SharedReservation`](super::SharedReservation)'s record of its mappings both read their ranges
//! through [`Span`].

use core::ops::Range;

use crate::error::Error;
use crate::stream::StreamId;
use crate::vmm::physical::check_multiple;

/// The bytes a page covers, `[start, end)`, and whether it is granted: what the bookkeeping below
/// reads of a page (so that it can be tested without a driver).
pub(super) trait Span {
    fn start(&self) -> usize;
    fn end(&self) -> usize;
    fn granted(&self) -> bool;
    /// Retired: released once the work queued before the retire has finished, and neither viewed nor
    /// overlapped by a new page meanwhile.
    fn retired(&self) -> bool {
        false
    }
    /// Evicted: the range's bytes are in host memory until a restore maps it again (its page may
    /// still be mapped, retired, until the work queued before the eviction has finished). No view,
    /// lend or new page reaches it. An evicted range holds no page to unmap or to cut in two.
    fn evicted(&self) -> bool {
        false
    }
    /// Whether a page is mapped here: false only for an evicted range whose page was released, and
    /// for a range of a buffer's reserve (whose page is not the buffer's yet).
    fn mapped(&self) -> bool {
        true
    }
    /// Reserved ahead of need: a page a buffer's reserve holds (or is making) there, which no view,
    /// lend or export reaches until a map of the buffer takes it.
    fn reserved(&self) -> bool {
        false
    }
    /// The count of pages mapped before this one, when it was mapped: a view made at an earlier
    /// count never covers it.
    fn epoch(&self) -> u64 {
        0
    }
}

/// What a retired page's bytes are, in errors.
pub(super) const RETIRED: &str =
    "are retired: released once the work queued before the retire has finished";

/// What the bytes of a page in a buffer's reserve are, in errors.
pub(super) const RESERVED: &str = "are a page of the buffer's reserve, made ahead of need: not \
     mapped by the buffer until map_page or grow takes it";

/// What an evicted range's bytes are, in errors.
pub(super) const EVICTED: &str =
    "are evicted: their bytes are in host memory until VirtualBuffer::restore maps them again";

/// Refuses `[start, end)` where it shares a byte with an evicted range of `spans` (sorted,
/// disjoint), naming the first such range. An empty range shares none.
pub(super) fn check_not_evicted<S: Span>(
    spans: &[S],
    start: usize,
    end: usize,
) -> Result<(), Error> {
    if start >= end {
        return Ok(());
    }
    let first = spans.partition_point(|s| s.end() <= start);
    let overlapping = spans.get(first..).unwrap_or_default();
    match overlapping
        .iter()
        .take_while(|s| s.start() < end)
        .find(|s| s.evicted())
    {
        Some(span) => Err(Error::PageRange {
            start: span.start(),
            end: span.end(),
            problem: EVICTED,
        }),
        None => Ok(()),
    }
}

/// Where a new page `[offset, end)` goes in `pages` (sorted, disjoint, `offset < end`); the mapped
/// page it would overlap is an error.
pub(super) fn insertion_point<S: Span>(
    pages: &[S],
    offset: usize,
    end: usize,
) -> Result<usize, Error> {
    let index = pages.partition_point(|p| p.start() < offset);
    let before = index.checked_sub(1).and_then(|i| pages.get(i));
    for page in [before, pages.get(index)].into_iter().flatten() {
        if page.start() < end && page.end() > offset {
            return Err(Error::PageRange {
                start: page.start(),
                end: page.end(),
                problem: if page.evicted() {
                    EVICTED
                } else if page.reserved() {
                    RESERVED
                } else if page.retired() {
                    RETIRED
                } else {
                    "are mapped already"
                },
            });
        }
    }
    Ok(index)
}

/// Checks that granted pages of `pages` (sorted, disjoint) cover every byte of `[start, end)`; the
/// first hole, or the first page not granted, is an error.
pub(super) fn check_covered<S: Span>(pages: &[S], start: usize, end: usize) -> Result<(), Error> {
    check_covered_at(pages, start, end, u64::MAX)
}

/// As [`check_covered`], for a view made when the count of mapped pages was `epoch`: a page retired,
/// or mapped later, is an error too.
pub(super) fn check_covered_at<S: Span>(
    pages: &[S],
    start: usize,
    end: usize,
    epoch: u64,
) -> Result<(), Error> {
    let mut at = start;
    let mut index = pages.partition_point(|p| p.end() <= start);
    while at < end {
        let hole_end = match pages.get(index) {
            Some(page) if page.start() <= at => {
                let problem = if page.evicted() {
                    Some(EVICTED)
                } else if page.reserved() {
                    Some(RESERVED)
                } else if page.retired() {
                    Some(RETIRED)
                } else if page.epoch() > epoch {
                    Some("are a page mapped after the view was made, in a range retired before")
                } else if !page.granted() {
                    Some("are mapped but not granted (undoing a failed grant failed)")
                } else {
                    None
                };
                if let Some(problem) = problem {
                    return Err(Error::PageRange {
                        start: page.start(),
                        end: page.end(),
                        problem,
                    });
                }
                at = page.end();
                index = index.saturating_add(1);
                continue;
            }
            Some(page) => page.start().min(end),
            None => end,
        };
        return Err(Error::PageRange {
            start: at,
            end: hole_end,
            problem: "are not mapped",
        });
    }
    Ok(())
}

/// The indices of the pages of `pages` (sorted, disjoint) that lie inside `[start, end)`; a page that
/// straddles either end is an error. An evicted range (which holds no page of its own) may straddle
/// an end: the indices then include it, and the caller leaves it as it is.
pub(super) fn pages_inside<S: Span>(
    pages: &[S],
    start: usize,
    end: usize,
) -> Result<Range<usize>, Error> {
    let first = pages.partition_point(|p| p.end() <= start);
    if start >= end {
        return Ok(first..first);
    }
    let last = pages.partition_point(|p| p.start() < end).max(first);
    let inside = pages.get(first..last).unwrap_or_default();
    let ends = [
        inside.iter().find(|p| p.mapped()),
        inside.iter().rev().find(|p| p.mapped()),
    ];
    for page in ends.into_iter().flatten() {
        if page.start() < start || page.end() > end {
            return Err(Error::PageRange {
                start: page.start(),
                end: page.end(),
                problem: "are one page, which the range would cut in two: unmap it whole",
            });
        }
    }
    Ok(first..last)
}

/// The byte ranges of a buffer lent to a scope, `[start, end)`: those lent for writing, each once and
/// exclusively, and those lent for reading, merged. A write claim remembers the stream of its last
/// write lend (`S`, a stream's identity; any `Copy + Eq` stand-in in the unit tests), so that a read
/// back of its bytes is ordered after that stream; once read back it is *settled*: no longer lent
/// for writing, its bytes lent for reading, and its stream kept for every later read back.
#[derive(Debug)]
pub(super) struct Claims<S = StreamId> {
    /// Sorted by address, disjoint (a write claim shares no byte with another, read back or not).
    writes: Vec<WriteClaim<S>>,
    /// Sorted, disjoint, merged where they touch.
    reads: Vec<(usize, usize)>,
    /// The ranges lent again for writing ([`reuse`](Claims::reuse)), each with the table's count
    /// when it was: a handle made at an earlier count is refused there. Sorted, disjoint (a later
    /// reuse replaces the bytes it shares), so bounded by the blocks of the buffer.
    fences: Vec<(usize, usize, u64)>,
}

impl<S> Default for Claims<S> {
    fn default() -> Self {
        Claims {
            writes: Vec::new(),
            reads: Vec::new(),
            fences: Vec::new(),
        }
    }
}

/// What bytes lent again for writing are, in errors, to a handle made before.
pub(super) const REUSED: &str = "were lent again for writing (`ScopedBuffer::reuse`) after this \
     handle was made";

/// One range lent for writing in a scope, `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WriteClaim<S> {
    start: usize,
    end: usize,
    /// The stream of the last write lend (`None` before the first).
    stream: Option<S>,
    /// Read back: no longer lent for writing; its bytes are lent for reading.
    settled: bool,
}

/// What a write claim's bytes are, in errors, while they are lent for writing.
pub(super) const LENT_FOR_WRITING: &str = "are lent for writing: read them back \
     (`ScopedBuffer::read_back`), which orders the read after the write, or retire them";

/// What a settled write claim's bytes are, in errors, to a plain read.
pub(super) const WRITTEN: &str = "were written in this scope: read them back \
     (`ScopedBuffer::read_back`), which orders the read after the write";

impl<S: Copy + Eq> Claims<S> {
    /// The indices of the write claims (sorted, disjoint) that share a byte with `[start, end)`.
    fn writes_over(&self, start: usize, end: usize) -> Range<usize> {
        let first = self.writes.partition_point(|w| w.end <= start);
        let last = self.writes.partition_point(|w| w.start < end).max(first);
        first..last
    }

    /// The write claims that share a byte with `[start, end)`, in address order.
    fn writes_in(&self, start: usize, end: usize) -> &[WriteClaim<S>] {
        self.writes
            .get(self.writes_over(start, end))
            .unwrap_or_default()
    }

    /// Claims `[start, end)` for reading: refused where a write claim shares a byte, settled or not
    /// (a plain read names no stream to order after the write).
    pub(super) fn read(&mut self, start: usize, end: usize) -> Result<(), Error> {
        if start >= end {
            return Ok(());
        }
        self.check_claim(start, end, false)?;
        self.add_read(start, end);
        Ok(())
    }

    /// `Ok` where `[start, end)` can be claimed, for writing (no claim shares a byte) or reading (no
    /// write claim does), else the first shared bytes named; changes nothing.
    fn check_claim(&self, start: usize, end: usize, write: bool) -> Result<(), Error> {
        if start >= end {
            return Ok(());
        }
        if let Some(w) = self.writes_in(start, end).first() {
            let problem = match (write, w.settled) {
                (true, true) => {
                    "were written and read back in this scope: retire them before writing again"
                }
                (true, false) => "are lent for writing",
                (false, true) => WRITTEN,
                (false, false) => LENT_FOR_WRITING,
            };
            return Err(shared(w, start, end, problem));
        }
        if write {
            shared_with(&self.reads, start, end, "are lent for reading")?;
        }
        Ok(())
    }

    /// Claims every range of `ranges` (`[start, end)` and whether for writing), which share no byte
    /// with each other, all or none: each is checked as [`write`](Claims::write) or
    /// [`read`](Claims::read) checks it before any is claimed. What a graph bound to a scope
    /// claims for its replays.
    pub(super) fn claim_all(&mut self, ranges: &[(usize, usize, bool)]) -> Result<(), Error> {
        for &(start, end, write) in ranges {
            self.check_claim(start, end, write)?;
        }
        for &(start, end, write) in ranges.iter().filter(|r| r.0 < r.1) {
            if write {
                self.add_write(start, end, None);
            } else {
                self.add_read(start, end);
            }
        }
        Ok(())
    }

    /// Adds `[start, end)` to the read claims, merged.
    fn add_read(&mut self, start: usize, end: usize) {
        let first = self.reads.partition_point(|r| r.1 < start);
        let last = self.reads.partition_point(|r| r.0 <= end);
        let merged = self
            .reads
            .get(first..last)
            .unwrap_or_default()
            .iter()
            .fold((start, end), |(s, e), r| (s.min(r.0), e.max(r.1)));
        self.reads.splice(first..last.max(first), [merged]);
    }

    /// Adds a write claim of `[start, end)`, which shares no byte with another, in address order.
    fn add_write(&mut self, start: usize, end: usize, stream: Option<S>) {
        let at = self.writes.partition_point(|w| w.start < start);
        self.writes.insert(
            at,
            WriteClaim {
                start,
                end,
                stream,
                settled: false,
            },
        );
    }

    /// Claims `[start, end)` for writing: refused where any claim shares a byte.
    pub(super) fn write(&mut self, start: usize, end: usize) -> Result<(), Error> {
        if start >= end {
            return Ok(());
        }
        self.check_claim(start, end, true)?;
        self.add_write(start, end, None);
        Ok(())
    }

    /// Claims `[start, end)` for writing as consecutive write claims of `chunk` bytes each (the
    /// last shorter where `chunk` does not divide the range), all or none: refused where any claim
    /// shares a byte with the range, as [`write`](Claims::write) refuses each. The chunks are then
    /// claims as `write` makes them, each lent, read back and retired on its own; one check and
    /// one insertion for all of them. A `chunk` of zero claims nothing.
    pub(super) fn write_chunks(
        &mut self,
        start: usize,
        end: usize,
        chunk: usize,
    ) -> Result<(), Error> {
        if start >= end || chunk == 0 {
            return Ok(());
        }
        self.check_claim(start, end, true)?;
        let at = self.writes.partition_point(|w| w.start < start);
        let claims = (start..end).step_by(chunk).map(|from| WriteClaim {
            start: from,
            end: from.saturating_add(chunk).min(end),
            stream: None,
            settled: false,
        });
        self.writes.splice(at..at, claims);
        Ok(())
    }

    /// A write lend of `[start, end)` to work on `stream`: `Ok` where a write claim, not read back,
    /// holds every byte of it, which then remembers `stream`. A range read back or retired since it
    /// was lent is refused, naming it.
    pub(super) fn wrote(&mut self, start: usize, end: usize, stream: S) -> Result<(), Error> {
        if start >= end {
            return Ok(());
        }
        let at = self.writes.partition_point(|w| w.end <= start);
        match self.writes.get_mut(at) {
            Some(claim) if !claim.settled && claim.start <= start && claim.end >= end => {
                claim.stream = Some(stream);
                Ok(())
            }
            _ => Err(Error::PageRange {
                start,
                end,
                problem: "are no longer lent for writing: read back (`ScopedBuffer::read_back`) \
                          or retired since",
            }),
        }
    }

    /// Reads `[start, end)` back: every write claim sharing a byte with it is settled (refused
    /// where one reaches past either end of the range, before any change), the range is claimed for
    /// reading, and the streams of the last write lends of every write claim sharing a byte,
    /// settled before or now, are returned, each once: the streams the read is ordered after.
    pub(super) fn read_back(&mut self, start: usize, end: usize) -> Result<Vec<S>, Error> {
        if start >= end {
            return Ok(Vec::new());
        }
        if let Some(w) = self
            .writes_in(start, end)
            .iter()
            .find(|w| !w.settled && (w.start < start || w.end > end))
        {
            return Err(Error::PageRange {
                start: w.start,
                end: w.end,
                problem: "are lent for writing past an end of the range: read a write back whole",
            });
        }
        let mut streams = Vec::new();
        let over = self.writes_over(start, end);
        for w in self.writes.get_mut(over).into_iter().flatten() {
            w.settled = true;
            if let Some(stream) = w.stream
                && !streams.contains(&stream)
            {
                streams.push(stream);
            }
        }
        self.add_read(start, end);
        Ok(streams)
    }

    /// Lends `[start, end)` again for writing, to work on `stream`, at the table's count `epoch`
    /// (later than every handle's so far): every claim on it is forgotten, every handle of its
    /// bytes made before is refused from now on ([`check_fresh`](Claims::check_fresh)), and it is
    /// claimed for writing. Refused, before any change, where a write claim (read back or not)
    /// reaches past either end.
    pub(super) fn reuse(
        &mut self,
        start: usize,
        end: usize,
        epoch: u64,
        stream: S,
    ) -> Result<(), Error> {
        if start >= end {
            return Ok(());
        }
        if let Some(w) = self
            .writes_in(start, end)
            .iter()
            .find(|w| w.start < start || w.end > end)
        {
            return Err(Error::PageRange {
                start: w.start,
                end: w.end,
                problem: "were lent for writing past an end of the range: reuse a block whole",
            });
        }
        self.forget(start, end);
        let at = self.fences.partition_point(|f| f.0 < start);
        self.fences.insert(at, (start, end, epoch));
        self.add_write(start, end, Some(stream));
        Ok(())
    }

    /// `Ok` where no byte of `[start, end)` was lent again for writing after a handle made at
    /// `epoch`; else the first such bytes, named.
    pub(super) fn check_fresh(&self, start: usize, end: usize, epoch: u64) -> Result<(), Error> {
        let first = self.fences.partition_point(|f| f.1 <= start);
        let fences = self.fences.get(first..).unwrap_or_default();
        match fences
            .iter()
            .take_while(|f| f.0 < end)
            .find(|f| f.1 > start && f.2 > epoch)
        {
            Some(f) => Err(Error::PageRange {
                start: f.0.max(start),
                end: f.1.min(end),
                problem: REUSED,
            }),
            None => Ok(()),
        }
    }

    /// Forgets the claims on `[start, end)`, retired: write claims that share a byte go (their
    /// memory can no longer be lent), read claims and reuses lose those bytes.
    pub(super) fn forget(&mut self, start: usize, end: usize) {
        let over = self.writes_over(start, end);
        self.writes.drain(over);
        cut(
            &mut self.reads,
            start,
            end,
            |&(s, e)| (s, e),
            |_, s, e| (s, e),
        );
        cut(
            &mut self.fences,
            start,
            end,
            |f| (f.0, f.1),
            |f, s, e| (s, e, f.2),
        );
    }

    /// Forgets every claim (the scope that held them has ended).
    pub(super) fn clear(&mut self) {
        self.writes.clear();
        self.reads.clear();
        self.fences.clear();
    }
}

/// The error naming the bytes `[start, end)` shares with the write claim `w`.
fn shared<S>(w: &WriteClaim<S>, start: usize, end: usize, problem: &'static str) -> Error {
    Error::PageRange {
        start: w.start.max(start),
        end: w.end.min(end),
        problem,
    }
}

/// Takes the bytes `[start, end)` out of `ranges` (sorted, disjoint; `bounds` gives each one's
/// `[start, end)`): a range cut by it keeps its parts outside, remade by `part`. Only the ranges
/// that share a byte with it are touched.
fn cut<R>(
    ranges: &mut Vec<R>,
    start: usize,
    end: usize,
    bounds: impl Fn(&R) -> (usize, usize),
    part: impl Fn(&R, usize, usize) -> R,
) {
    let first = ranges.partition_point(|r| bounds(r).1 <= start);
    let last = ranges.partition_point(|r| bounds(r).0 < end).max(first);
    let inside = ranges.get(first..last).unwrap_or_default();
    let mut kept = Vec::with_capacity(2);
    if let Some(r) = inside.first()
        && bounds(r).0 < start
    {
        kept.push(part(r, bounds(r).0, start));
    }
    if let Some(r) = inside.last()
        && bounds(r).1 > end
    {
        kept.push(part(r, end, bounds(r).1));
    }
    ranges.splice(first..last, kept);
}

/// `Err` naming the bytes `[start, end)` shares with one of `claims`.
fn shared_with(
    claims: &[(usize, usize)],
    start: usize,
    end: usize,
    problem: &'static str,
) -> Result<(), Error> {
    match claims.iter().find(|c| c.0 < end && c.1 > start) {
        Some(c) => Err(Error::PageRange {
            start: c.0.max(start),
            end: c.1.min(end),
            problem,
        }),
        None => Ok(()),
    }
}

/// Checks a new mapping of `size` bytes at byte `offset` of a reserved range of `len` bytes at `base`,
/// before any driver call: a non-zero size, and size, offset and address multiples of the memory's
/// `granularity`, inside the range (`what` names the range in the error). The mapping's end.
pub(super) fn check_new_range(
    (base, len, what): (u64, usize, &'static str),
    offset: usize,
    size: usize,
    granularity: usize,
) -> Result<usize, Error> {
    if size == 0 {
        return Err(Error::ZeroSize {
            what: "mapping size",
        });
    }
    check_multiple("mapping size", size, granularity)?;
    check_multiple("mapping offset", offset, granularity)?;
    let end = offset.checked_add(size).ok_or(Error::Overflow {
        what: "mapping offset + size",
    })?;
    if end > len {
        return Err(Error::OutOfBounds {
            what,
            start: offset,
            end,
            len,
        });
    }
    // The range is aligned as its owner asked; memory of another device may need more.
    let address = usize::try_from(base)
        .ok()
        .and_then(|base| base.checked_add(offset))
        .ok_or(Error::Overflow {
            what: "mapping address",
        })?;
    check_multiple("mapping address", address, granularity)?;
    Ok(end)
}

#[cfg(test)]
mod tests;
