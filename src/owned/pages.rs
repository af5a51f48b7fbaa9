//! The bookkeeping of mapped byte ranges shared by the owned layer: where a new mapping goes, which
//! ranges a view or an unmap covers, which are evicted. Pure integer arithmetic over sorted,
//! disjoint ranges, so that it is property-tested without a driver (and under Miri). A
//! [`VirtualBuffer`](super::VirtualBuffer)'s page table (`buffer/table.rs`) and a
//! [`SharedReservation`](super::SharedReservation)'s record of its mappings both read their ranges
//! through [`Span`].

use core::ops::Range;

use crate::error::Error;
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
/// exclusively, and those lent for reading, merged.
#[derive(Debug, Default)]
pub(super) struct Claims {
    writes: Vec<(usize, usize)>,
    /// Sorted, disjoint, merged where they touch.
    reads: Vec<(usize, usize)>,
}

impl Claims {
    /// Claims `[start, end)` for reading: refused where a write claim shares a byte.
    pub(super) fn read(&mut self, start: usize, end: usize) -> Result<(), Error> {
        if start >= end {
            return Ok(());
        }
        shared_with(&self.writes, start, end, "are lent for writing")?;
        let first = self.reads.partition_point(|r| r.1 < start);
        let last = self.reads.partition_point(|r| r.0 <= end);
        let merged = self
            .reads
            .get(first..last)
            .unwrap_or_default()
            .iter()
            .fold((start, end), |(s, e), r| (s.min(r.0), e.max(r.1)));
        self.reads.splice(first..last.max(first), [merged]);
        Ok(())
    }

    /// Claims `[start, end)` for writing: refused where any claim shares a byte.
    pub(super) fn write(&mut self, start: usize, end: usize) -> Result<(), Error> {
        if start >= end {
            return Ok(());
        }
        shared_with(&self.writes, start, end, "are lent for writing")?;
        shared_with(&self.reads, start, end, "are lent for reading")?;
        self.writes.push((start, end));
        Ok(())
    }

    /// Forgets the claims on `[start, end)`, retired: write claims that share a byte go (their
    /// memory can no longer be lent), read claims lose those bytes.
    pub(super) fn forget(&mut self, start: usize, end: usize) {
        self.writes.retain(|w| w.1 <= start || w.0 >= end);
        let mut kept = Vec::with_capacity(self.reads.len().saturating_add(1));
        for &(s, e) in &self.reads {
            if e <= start || s >= end {
                kept.push((s, e));
                continue;
            }
            if s < start {
                kept.push((s, start));
            }
            if e > end {
                kept.push((end, e));
            }
        }
        self.reads = kept;
    }

    /// Forgets every claim (the scope that held them has ended).
    pub(super) fn clear(&mut self) {
        self.writes.clear();
        self.reads.clear();
    }
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
