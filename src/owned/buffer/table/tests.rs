//! The page table's states and the transitions that make no driver call, on a table whose pages
//! hold a stand-in for memory: retire and its ticket, the evicted marks, the claims, and what every
//! face's check then answers.

use core::iter::once;

use super::lends::HELD;
use super::{Page, Slot, Table};
use crate::error::Error;
use crate::owned::pages::{EVICTED, RETIRED, Span, pages_inside};

impl Table<()> {
    /// The pages an export would hand out: mapped, not retired.
    fn unretired_count(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.mapped() && !s.retired())
            .count()
    }

    /// Whether an unmap of `[start, end)` is refused before any driver call, as `unmap_span`
    /// refuses a retired page in its span.
    fn unmap_span_refused(&self, start: usize, end: usize) -> bool {
        pages_inside(&self.slots, start, end).map_or(true, |span| {
            self.slots
                .get(span)
                .unwrap_or_default()
                .iter()
                .any(Span::retired)
        })
    }
}

/// A table at base 0 holding `pages`: `(offset, size, page)`, in address order, each mapped at the
/// next epoch.
fn table(pages: Vec<(usize, usize, Page<()>)>) -> Table<()> {
    let mut table = Table::new(0);
    for (offset, size, page) in pages {
        let epoch = table.count_mapped();
        table.slots.push(Slot {
            offset,
            size,
            epoch,
            page,
        });
    }
    table
}

fn refusal(result: Result<(), Error>) -> Option<(usize, usize, &'static str)> {
    match result {
        Ok(()) => None,
        Err(Error::PageRange {
            start,
            end,
            problem,
        }) => Some((start, end, problem)),
        Err(other) => panic!("unexpected {other}"),
    }
}

#[test]
fn a_retire_marks_its_pages_with_one_ticket_and_turns_the_generation() {
    let mut t = table(vec![
        (0, 4, Page::Live(())),
        (4, 4, Page::Ungranted(())),
        (8, 4, Page::Live(())),
    ]);
    assert_eq!(t.admit(0, 4, 9).unwrap(), 0, "admitted in slot 0 before");
    t.claim(8, 12, true).unwrap();
    let retire = t.retire(0, 12, false, || Ok(())).unwrap().unwrap();
    assert_eq!((retire.pages, retire.lends), (3, 0));
    assert_eq!(t.stats().pages_retired, 3);
    assert_eq!(t.retired_bytes(), 12);
    assert!(
        t.slots
            .iter()
            .all(|s| s.retired_by(retire.ticket).is_some())
    );
    assert_eq!(refusal(t.usable(0, 4)), Some((0, 4, RETIRED)));
    assert_eq!(
        refusal(t.check_vacant(8, 12)),
        Some((8, 12, RETIRED)),
        "no new page over a retired one"
    );
    assert!(
        t.claim(8, 12, true).is_err(),
        "retired: not lent, its claims forgotten or not"
    );
    assert_eq!(
        t.retire(0, 4, false, || Ok(())).map(|r| r.is_some()),
        Err(Error::PageRange {
            start: 0,
            end: 4,
            problem: RETIRED
        }),
        "retired twice"
    );
    // A lend admitted now counts in the other slot.
    let mut fresh = table(vec![(0, 4, Page::Live(()))]);
    fresh.retire(8, 12, false, || Ok(())).unwrap();
    assert_eq!(
        fresh.admit(0, 4, 9).unwrap(),
        0,
        "an empty retire turns nothing"
    );
    assert_eq!(t.generation % 2, 1);
}

#[test]
fn a_retire_refused_by_its_streams_retires_nothing() {
    let mut t = table(vec![(0, 4, Page::Live(()))]);
    let refused = t.retire(0, 4, false, || {
        Err(Error::StreamCapturing { what: "a capture" })
    });
    assert!(matches!(refused, Err(Error::StreamCapturing { .. })));
    assert_eq!(t.retired_bytes(), 0);
    assert_eq!(t.generation, 0);
    assert_eq!(t.usable(0, 4), Ok(()));
    assert!(
        t.retire(4, 8, false, || panic!("asked for a range with no page"))
            .unwrap()
            .is_none()
    );
}

#[test]
fn a_retire_forgets_the_claims_on_its_range_and_an_eviction_keeps_them_until_queued() {
    let mut t = table(vec![
        (0, 4, Page::Live(())),
        (4, 4, Page::Live(())),
        (8, 4, Page::Live(())),
    ]);
    t.claim(0, 8, true).unwrap();
    t.claim(8, 12, true).unwrap();
    t.retire(4, 8, false, || Ok(())).unwrap();
    assert!(
        t.claim(0, 4, false).is_ok(),
        "a write claim that shares a byte with the retired range goes whole"
    );
    assert!(
        t.claim(8, 12, false).is_err(),
        "8..12 is still lent for writing"
    );
    // An eviction's retire keeps the claims until its copies are queued.
    let mut e = table(vec![(0, 4, Page::Live(())), (4, 4, Page::Live(()))]);
    e.claim(0, 4, true).unwrap();
    let retire = e.retire(0, 4, true, || Ok(())).unwrap().unwrap();
    e.unretire(retire.ticket);
    assert!(
        e.claim(0, 4, false).is_err(),
        "an eviction taken back keeps the claims"
    );
    e.retire(0, 4, true, || Ok(())).unwrap();
    e.evicting(0, 4, 1);
    assert_eq!(e.stats().pages_evicted, 1);
    e.clear_claims();
    assert!(e.claim(4, 8, true).is_ok());
}

#[test]
fn an_evictions_retire_is_evicted_at_once_and_taken_back_whole() {
    let mut t = table(vec![
        (0, 4, Page::Live(())),
        (4, 4, Page::Live(())),
        (8, 4, Page::Live(())),
    ]);
    let retire = t.retire(0, 8, true, || Ok(())).unwrap().unwrap();
    assert_eq!(t.evicted_bytes(), 8, "evicted at once");
    assert_eq!(t.retired_bytes(), 8, "and retired until released");
    assert_eq!(t.mapped_bytes(), 12);
    assert_eq!(refusal(t.usable(2, 10)), Some((0, 4, EVICTED)));
    assert_eq!(refusal(t.check_vacant(4, 8)), Some((4, 8, EVICTED)));
    t.unretire(retire.ticket);
    assert_eq!((t.evicted_bytes(), t.retired_bytes()), (0, 0));
    assert_eq!(t.stats().pages_retired, 0);
    assert_eq!(t.usable(0, 12), Ok(()));
}

#[test]
fn unretire_gives_each_page_its_grant_back() {
    let mut t = table(vec![(0, 4, Page::Live(())), (4, 4, Page::Ungranted(()))]);
    let retire = t.retire(0, 8, false, || Ok(())).unwrap().unwrap();
    t.unretire(retire.ticket);
    assert!(matches!(t.slots[0].page, Page::Live(())));
    assert!(matches!(t.slots[1].page, Page::Ungranted(())));
}

#[test]
fn an_evicted_range_is_restored_only_once_its_page_is_gone() {
    let mut t = table(vec![
        (0, 4, Page::Live(())),
        (4, 4, Page::Live(())),
        (8, 4, Page::Evicted),
    ]);
    let retire = t.retire(4, 8, true, || Ok(())).unwrap().unwrap();
    assert_eq!(t.check_still_evicted([4..8, 8..12]), Ok(()));
    assert_eq!(
        t.check_still_evicted(once(0..4)),
        Err(Error::PageRange {
            start: 0,
            end: 4,
            problem: "are not evicted (the handle was restored already?)"
        })
    );
    assert_eq!(
        refusal(t.check_still_evicted(once(8..10))),
        Some((8, 10, "are not evicted (the handle was restored already?)")),
        "a piece is a whole evicted range"
    );
    assert_eq!(t.check_restorable(once(8..12)), Ok(()));
    assert_eq!(
        refusal(t.check_restorable([8..12, 4..8])),
        Some((4, 8, RETIRED)),
        "its retired page is still there"
    );
    t.unretire(retire.ticket);
    assert_eq!(
        refusal(t.check_restorable(once(4..8))),
        Some((4, 8, "are mapped already"))
    );
}

#[test]
fn the_table_ends_at_its_last_page_or_evicted_range() {
    let t = table(vec![(0, 4, Page::Live(())), (8, 4, Page::Evicted)]);
    assert_eq!(t.end(), 12);
    assert_eq!(
        (t.page_count(), t.mapped_bytes(), t.evicted_bytes()),
        (1, 4, 4)
    );
    assert_eq!(
        refusal(t.usable(0, 8)),
        Some((4, 8, "are not mapped")),
        "a hole before the evicted range"
    );
    assert_eq!(
        refusal(t.usable(0, 12)),
        Some((8, 12, EVICTED)),
        "evicted first"
    );
    assert_eq!(table(vec![]).end(), 0);
}

#[test]
fn a_lend_is_admitted_only_over_pages_mapped_before_it() {
    let mut t = table(vec![(0, 4, Page::Live(()))]);
    let epoch = t.claim(0, 4, false).unwrap();
    let later = t.count_mapped();
    t.slots.push(Slot {
        offset: 4,
        size: 4,
        epoch: later,
        page: Page::Live(()),
    });
    assert_eq!(t.admit(0, 4, epoch), Ok(0));
    assert!(
        refusal(t.admit(0, 8, epoch).map(drop)).is_some_and(|r| r.0 == 4),
        "the page mapped after the lend was made"
    );
    assert_eq!(t.admit(0, 8, later), Ok(0));
}

#[test]
fn a_hold_is_exclusive_named_when_shared_and_let_go_once() {
    let mut t = table(vec![(0, 4, Page::Live(())), (4, 4, Page::Live(()))]);
    t.hold(0, 4).unwrap();
    assert_eq!(refusal(t.not_held(2, 6)), Some((2, 4, HELD)));
    assert_eq!(
        refusal(t.hold(3, 8)),
        Some((3, 4, HELD)),
        "a second hold shares 3..4"
    );
    assert_eq!(t.not_held(4, 8), Ok(()));
    t.hold(4, 8).unwrap();
    t.release_hold(0, 4);
    assert_eq!(t.not_held(0, 4), Ok(()), "let go");
    assert_eq!(refusal(t.not_held(0, 8)), Some((4, 8, HELD)));
    t.forget_holds();
    assert_eq!(t.not_held(0, 8), Ok(()));
    // Only usable bytes are held: a retired page, or a hole, is refused as for a view.
    t.retire(0, 4, false, || Ok(())).unwrap();
    assert_eq!(refusal(t.hold(0, 4)), Some((0, 4, RETIRED)));
    assert!(t.hold(6, 12).is_err(), "8..12 is a hole");
    assert_eq!(t.not_held(0, 12), Ok(()), "a refused hold holds nothing");
}

mod model;
mod reserve;

mod one_pass {
    use proptest::prelude::*;

    use super::{Page, Table, table};
    use crate::owned::pages::{check_covered_at, check_not_evicted};

    /// A table from `parts`: each a gap before the page (0 or 1 unit), its size (1 to 3 units) and
    /// its state (0 live, 1 ungranted, 2 evicted, 3 retired, 4 retired by an eviction).
    fn build(parts: &[(usize, usize, u8)]) -> Table<()> {
        let mut offset = 0;
        let mut pages = Vec::new();
        let mut retired = Vec::new();
        for &(gap, size, state) in parts {
            offset += gap;
            let page = match state {
                1 => Page::Ungranted(()),
                2 => Page::Evicted,
                _ => Page::Live(()),
            };
            if state >= 3 {
                retired.push((offset, offset + size, state == 4));
            }
            pages.push((offset, size, page));
            offset += size;
        }
        let mut t = table(pages);
        for (start, end, evicted) in retired {
            t.retire(start, end, evicted, || Ok(())).unwrap();
        }
        t
    }

    proptest! {
        /// The one pass answers as the two checks it stands for, on every table, range and epoch,
        /// and `usable_since` then gives their error.
        #[test]
        fn the_one_pass_answers_as_the_two_checks(
            parts in proptest::collection::vec((0usize..2, 1usize..4, 0u8..5), 0..10),
            start in 0usize..30,
            len in 0usize..12,
            epoch in 0u64..12,
        ) {
            let t = build(&parts);
            let end = start + len;
            let slow = check_not_evicted(&t.slots, start, end)
                .and_then(|()| check_covered_at(&t.slots, start, end, epoch));
            prop_assert_eq!(t.live_run(start, end, epoch), slow.is_ok());
            prop_assert_eq!(t.usable_since(start, end, epoch), slow);
            let slow_now = check_not_evicted(&t.slots, start, end)
                .and_then(|()| check_covered_at(&t.slots, start, end, u64::MAX));
            prop_assert_eq!(t.usable(start, end), slow_now);
        }
    }
}

/// Two streams, told apart by their handles, for the read-back tests.
fn streams() -> (crate::stream::StreamId, crate::stream::StreamId) {
    let context = core::ptr::null_mut();
    (
        crate::stream::StreamId::new(context, core::ptr::without_provenance_mut(1)),
        crate::stream::StreamId::new(context, core::ptr::without_provenance_mut(2)),
    )
}

#[test]
fn a_read_back_names_the_writers_streams_and_ends_the_write_lends() {
    let (a, b) = streams();
    let mut t = table(vec![(0, 4, Page::Live(())), (4, 4, Page::Live(()))]);
    let epoch = t.claim(0, 2, true).unwrap();
    t.claim(2, 4, true).unwrap();
    t.admit_write(0, 2, epoch, a).unwrap();
    t.admit_write(2, 4, epoch, b).unwrap();
    let generation = t.generation;
    let read_back = t.read_back(0, 8).unwrap();
    assert_eq!(read_back.streams, vec![a, b]);
    assert_eq!(
        read_back.lends,
        Some(generation % 2),
        "the slot to wait for"
    );
    assert_eq!(
        t.generation,
        generation.wrapping_add(1),
        "the generation turned"
    );
    assert!(
        t.admit_write(0, 2, epoch, a).is_err(),
        "a write lend after the read back"
    );
    assert_eq!(refusal(t.admit(0, 8, read_back.epoch).map(drop)), None);
    let nothing = t.read_back(4, 8).unwrap();
    assert!(
        nothing.streams.is_empty() && nothing.lends.is_none(),
        "no write: no wait"
    );
    assert!(t.read_back(6, 10).is_err(), "past the last page");
}

#[test]
fn a_reuse_fences_off_the_handles_made_before() {
    let (a, _) = streams();
    let mut t = table(vec![(0, 8, Page::Live(()))]);
    let before = t.claim(0, 4, true).unwrap();
    t.read_back(0, 4).unwrap();
    let (after, _) = t.reuse(0, 4, a).unwrap();
    assert!(after > before, "the count turned");
    assert_eq!(
        refusal(t.admit(0, 4, before).map(drop)).map(|r| (r.0, r.1)),
        Some((0, 4)),
        "a handle made before the reuse"
    );
    assert_eq!(
        refusal(t.admit(4, 8, before).map(drop)),
        None,
        "other bytes"
    );
    assert_eq!(
        refusal(t.admit_write(0, 4, after, a).map(drop)),
        None,
        "the new lend"
    );
    t.retire(0, 8, false, || Ok(())).unwrap();
    assert_eq!(
        refusal(t.admit(0, 4, after).map(drop)).map(|r| r.2),
        Some(RETIRED),
        "retired: the page refuses, whatever the fence"
    );
}
