//! The reserve's transitions, on a table whose pages hold a stand-in for memory: the fills up to
//! the bound, the maps that take a page of the reserve, the trim, and the retired pages released
//! through `Releasing` or recycled in place.

use super::super::{Fill, Page, Table};
use super::{refusal, table};
use crate::error::Error;
use crate::owned::pages::{EVICTED, RESERVED, RETIRED};

/// A table of `budget` bytes whose reserve holds at most `bound` pages of `size` bytes.
fn reserving(pages: Vec<(usize, usize, Page<()>)>, bound: usize, size: usize) -> Table<()> {
    let mut t = table(pages);
    t.start_reserve(bound, size, 64);
    t
}

#[test]
fn the_reserve_fills_the_next_vacant_slots_after_the_cursor_up_to_its_bound() {
    let mut t = reserving(
        vec![
            (0, 4, Page::Live(())),
            (8, 4, Page::Evicted),
            (16, 4, Page::Live(())),
        ],
        3,
        4,
    );
    assert_eq!(t.next_fill(), Some((20, 4)), "at the end of the last page");
    t.moved_cursor(4); // a page mapped at 0..4 last
    assert_eq!(
        t.next_fill(),
        Some((4, 4)),
        "right after the last page mapped"
    );
    assert_eq!(
        t.next_fill(),
        Some((12, 4)),
        "past the evicted range and the page"
    );
    assert_eq!(t.next_fill(), None, "the bound: three pages held");
    assert_eq!(t.stats().reserve_peak_pages, 3);
    assert!(t.worker_busy());
    assert!(t.filling_in(14, 18) && !t.filling_in(24, 28));
    for offset in [4, 12, 20] {
        t.filled(offset, Fill::Ready(()));
    }
    assert!(!t.worker_busy());
    let stats = t.stats();
    assert_eq!((stats.reserve_created, stats.reserve_pages), (3, 3));
    assert_eq!(stats.reserve_bytes, 12);
    assert_eq!(t.end(), 20, "the reserve's pages are not the buffer's");
    assert_eq!(t.page_count(), 2);
    assert_eq!(t.mapped_bytes(), 8);
    assert_eq!(t.next_fill(), None, "still at the bound");
}

#[test]
fn a_fill_is_pending_only_where_next_fill_would_mark_a_slot() {
    // Room under the bound and a vacant slot: pending, and what `next_fill` then marks.
    let mut t = reserving(vec![(0, 4, Page::Live(()))], 1, 4);
    assert!(t.fill_pending());
    assert_eq!(t.next_fill(), Some((4, 4)));
    assert!(!t.fill_pending(), "the bound: one page held");
    t.filled(4, Fill::Ready(()));
    assert!(!t.fill_pending());
    assert!(t.take_ready(4, 8, |()| true));
    assert!(t.fill_pending(), "taken: room again");
    // Under the bound, but every slot holds a page: nothing to fill, so no wake.
    let mut full = reserving(vec![(0, 56, Page::Live(()))], 3, 4);
    assert_eq!(full.next_fill(), Some((56, 4)));
    assert_eq!(full.next_fill(), Some((60, 4)));
    assert!(
        !full.fill_pending(),
        "no vacant slot, two pages under a bound of three"
    );
    assert_eq!(full.next_fill(), None);
    // Stopped, or keeping a fault: nothing pending.
    full.filled(56, Fill::Refused(Error::ZeroSize { what: "a stand-in" }));
    assert!(!full.fill_pending(), "a fault is kept until a map takes it");
    assert!(full.take_fault().is_some());
    assert!(full.fill_pending(), "the hole the refused fill left");
    full.stop_reserve();
    assert!(!full.fill_pending());
}

#[test]
fn a_table_found_full_is_searched_again_only_once_a_slot_leaves_it() {
    // Every slot of the budget holds a page: found full once, and so until a slot leaves.
    let mut t = reserving(vec![(0, 56, Page::Live(()))], 3, 4);
    assert_eq!(t.next_fill(), Some((56, 4)));
    assert_eq!(t.next_fill(), Some((60, 4)));
    t.filled(56, Fill::Ready(()));
    t.filled(60, Fill::Ready(()));
    assert!(!t.fill_pending(), "full, two pages under a bound of three");
    assert!(
        t.take_ready(56, 60, |()| true),
        "a map takes one: still full"
    );
    assert!(!t.fill_pending());
    assert_eq!(t.next_fill(), None);
    // A page of the reserve given back (`take_reserve`, as a map of another size does): the slot
    // is vacant again, and found.
    assert_eq!(t.take_reserve(60, 64).len(), 1);
    assert!(t.fill_pending(), "the slot the reserve gave back");
    assert_eq!(t.next_fill(), Some((60, 4)));
    t.filled(60, Fill::Ready(()));
    assert!(!t.fill_pending(), "full again");
    // A retired page the worker released: its slot is vacant again.
    let retire = t.retire(56, 60, false, || Ok(())).unwrap().unwrap();
    assert!(t.take_ready(60, 64, |()| true));
    let taken = t.start_release(&[retire.ticket], |()| false);
    assert_eq!(taken.len(), 1, "not of the reserve's kind: released");
    assert!(!t.fill_pending(), "being released: not vacant yet");
    t.released(56, Ok(false));
    assert!(t.fill_pending(), "released: vacant");
    assert_eq!(t.next_fill(), Some((56, 4)));
    // A refused fill leaves its slot vacant (the fault kept until a map takes it).
    t.filled(56, Fill::Refused(Error::ZeroSize { what: "a stand-in" }));
    assert!(t.take_fault().is_some());
    assert!(t.fill_pending(), "the hole the refused fill left");
    // A new reserve searches afresh.
    let mut full = reserving(vec![(0, 64, Page::Live(()))], 1, 4);
    assert!(!full.fill_pending());
    full.start_reserve(1, 4, 64);
    assert!(!full.fill_pending(), "searched again, and full");
}

#[test]
fn the_reserve_wraps_round_the_budget_once_and_stops_when_asked() {
    let mut t = reserving(vec![(60, 4, Page::Live(()))], 2, 4);
    assert_eq!(
        t.next_fill(),
        Some((0, 4)),
        "wrapped: nothing after the cursor"
    );
    t.moved_cursor(8);
    assert_eq!(t.next_fill(), Some((8, 4)));
    let mut full = reserving(vec![(0, 64, Page::Live(()))], 2, 4);
    assert_eq!(full.next_fill(), None, "no vacant slot anywhere");
    t.stop_reserve();
    assert!(t.stopping() && !t.reserving());
    t.filled(0, Fill::Ready(()));
    t.filled(8, Fill::Ready(()));
    assert_eq!(t.next_fill(), None, "stopped");
    t.end_reserve();
    assert!(!t.stopping());
    assert_eq!(t.take_reserve(0, 64).len(), 2);
}

#[test]
fn a_page_of_the_reserve_is_refused_by_every_check_with_its_bytes_named() {
    let mut t = reserving(vec![(0, 4, Page::Live(()))], 2, 4);
    t.next_fill();
    t.next_fill();
    t.filled(4, Fill::Ready(()));
    for (start, end) in [(4, 8), (0, 8), (8, 12)] {
        let named = if start == 8 { (8, 12) } else { (4, 8) };
        assert_eq!(
            refusal(t.usable(start, end)),
            Some((named.0, named.1, RESERVED)),
            "a view of {start}..{end}"
        );
        let vacant = if start == 0 {
            (0, 4, "are mapped already")
        } else {
            (named.0, named.1, RESERVED)
        };
        assert_eq!(
            refusal(t.check_vacant(start, end)),
            Some(vacant),
            "a map of {start}..{end} that does not take it"
        );
        assert!(
            t.claim(start, end, true).is_err(),
            "a lend of {start}..{end}"
        );
        assert!(t.claim(start, end, false).is_err());
    }
    assert_eq!(
        t.retire(4, 12, false, || panic!("no page of the buffer to retire"))
            .map(|r| r.is_none()),
        Ok(true)
    );
    assert_eq!(t.unretired_count(), 1, "only the buffer's page is listed");
}

#[test]
fn a_map_of_a_ready_page_takes_it_with_no_driver_call_and_only_of_its_range() {
    let mut t = reserving(vec![(0, 4, Page::Live(()))], 2, 4);
    t.next_fill();
    t.filled(4, Fill::Ready(()));
    assert!(!t.take_ready(4, 12, |()| true), "another size");
    assert!(!t.take_ready(0, 4, |()| true), "a page of the buffer");
    assert!(!t.take_ready(4, 8, |()| false), "another device");
    let epoch = t.epoch;
    assert!(t.take_ready(4, 8, |()| true));
    assert_eq!(t.usable(0, 8), Ok(()), "live now");
    assert_eq!(t.epoch, epoch + 1, "counted as a page mapped");
    let stats = t.stats();
    assert_eq!((stats.pages_mapped, stats.reserve_taken), (1, 1));
    assert_eq!(stats.reserve_pages, 0);
    assert_eq!(t.end(), 8);
    assert_eq!(t.next_fill(), Some((8, 4)), "the cursor moved to its end");
}

#[test]
fn a_refused_fill_leaves_a_hole_and_a_fault_until_a_map_takes_it() {
    let mut t = reserving(Vec::new(), 2, 4);
    assert_eq!(t.next_fill(), Some((0, 4)));
    t.filled(0, Fill::Refused(Error::ZeroSize { what: "a stand-in" }));
    assert_eq!(t.stats().reserve_faults, 1);
    assert_eq!(t.check_vacant(0, 4), Ok(()), "no page lost, no range kept");
    assert_eq!(t.next_fill(), None, "no refill while the fault waits");
    assert_eq!(t.take_fault(), Some(Error::ZeroSize { what: "a stand-in" }));
    assert_eq!(t.take_fault(), None, "returned once");
    assert_eq!(t.next_fill(), Some((0, 4)), "and the refills start again");
    t.filled(0, Fill::Ungranted((), Error::ZeroSize { what: "grant" }));
    assert_eq!(
        t.page_count(),
        1,
        "an ungranted page is the buffer's, as a map's"
    );
    assert_eq!(
        refusal(t.usable(0, 4)),
        Some((
            0,
            4,
            "are mapped but not granted (undoing a failed grant failed)"
        ))
    );
}

#[test]
fn take_reserve_gives_back_the_ready_pages_it_touches_only() {
    let mut t = reserving(Vec::new(), 3, 4);
    for _ in 0..3 {
        t.next_fill();
    }
    t.filled(0, Fill::Ready(()));
    t.filled(4, Fill::Ready(()));
    let taken = t.take_reserve(2, 6);
    assert_eq!(
        taken.iter().map(|&(o, s, ())| (o, s)).collect::<Vec<_>>(),
        vec![(0, 4), (4, 4)]
    );
    assert!(t.filling_in(8, 12), "a fill under way is the worker's");
    assert_eq!(t.stats().reserve_released, 2);
    assert_eq!(t.check_vacant(0, 8), Ok(()));
}

#[test]
fn a_finished_retire_is_released_by_the_worker_through_releasing() {
    let mut t = reserving(
        vec![
            (0, 4, Page::Live(())),
            (4, 4, Page::Live(())),
            (8, 4, Page::Live(())),
        ],
        1,
        4,
    );
    let plain = t.retire(0, 4, false, || Ok(())).unwrap().unwrap();
    let evicting = t.retire(4, 8, true, || Ok(())).unwrap().unwrap();
    let refused = t.retire(8, 12, false, || Ok(())).unwrap().unwrap();
    // Behind the cursor (12): none is recycled in place, whatever its memory.
    let taken = t.start_release(&[plain.ticket, evicting.ticket, refused.ticket], |()| true);
    assert_eq!(taken.len(), 3);
    assert!(t.worker_busy());
    assert_eq!(refusal(t.usable(0, 4)), Some((0, 4, RETIRED)));
    assert_eq!(refusal(t.check_vacant(0, 4)), Some((0, 4, RETIRED)));
    assert_eq!(t.mapped_bytes(), 12, "still mapped until released");
    assert!(
        t.unmap_span_refused(0, 12),
        "an unmap refuses a page being released"
    );
    t.released(0, Ok(false));
    t.released(4, Ok(true));
    t.released(8, Err(()));
    assert!(!t.worker_busy());
    assert_eq!(t.check_vacant(0, 4), Ok(()));
    assert_eq!(refusal(t.check_vacant(4, 8)), Some((4, 8, EVICTED)));
    assert_eq!(
        refusal(t.check_vacant(8, 12)),
        Some((8, 12, RETIRED)),
        "refused by the driver: retired again, for the drop"
    );
    let stats = t.stats();
    assert_eq!((stats.pages_released, stats.released_in_background), (1, 1));
    assert_eq!(stats.reserve_recycled, 1, "its memory kept for the reserve");
    assert_eq!(stats.reserve_recycled_in_place, 0);
}

/// Every page the reserve took in (made, or recycled in place) is taken, given back, or held.
pub(super) fn balanced(t: &Table<()>) -> bool {
    let s = t.stats();
    s.reserve_created + s.reserve_recycled_in_place
        == s.reserve_taken + s.reserve_released + s.reserve_pages
}

/// A table of 4-byte pages at 0, 4, 8 and 12, with a reserve of `bound` pages of 4 bytes whose
/// cursor is 4 (the fills start there): the pages `retired` (each its own retire), their retires
/// finished and handed to `start_release` with `fits`. The pages it took to release.
fn finish(t: &mut Table<()>, retired: &[usize], fits: bool) -> Vec<usize> {
    let tickets: Vec<_> = retired
        .iter()
        .map(|&at| {
            t.retire(at, at + 4, false, || Ok(()))
                .unwrap()
                .unwrap()
                .ticket
        })
        .collect();
    let taken = t.start_release(&tickets, |()| fits);
    taken.iter().map(|&(offset, _, ())| offset).collect()
}

fn four_pages(bound: usize) -> Table<()> {
    let mut t = reserving(
        (0..4).map(|i| (4 * i, 4, Page::Live(()))).collect(),
        bound,
        4,
    );
    t.moved_cursor(4);
    t
}

#[test]
fn a_finished_retire_ahead_of_the_cursor_is_recycled_in_place_with_no_driver_call() {
    let mut t = four_pages(2);
    let released = finish(&mut t, &[4, 8, 12], true);
    assert_eq!(
        released,
        vec![12],
        "4 and 8 lie in the bound's 2 pages after the cursor, 12 not"
    );
    assert!(t.worker_busy(), "12 is the worker's to unmap");
    let stats = t.stats();
    assert_eq!(stats.reserve_recycled_in_place, 2);
    assert_eq!((stats.reserve_pages, stats.reserve_bytes), (2, 8));
    assert_eq!(stats.reserve_peak_pages, 2);
    assert_eq!(
        stats.reserve_created, 0,
        "nothing made: no cuMemMap, no cuMemSetAccess"
    );
    assert!(balanced(&t));
    // A page of the reserve now: no page of the buffer, refused by every check, not retired.
    assert_eq!(t.retired_bytes(), 4, "only 12, being released");
    assert_eq!(t.page_count(), 2, "0 and 12");
    assert_eq!(refusal(t.usable(4, 8)), Some((4, 8, RESERVED)));
    assert_eq!(refusal(t.check_vacant(8, 12)), Some((8, 12, RESERVED)));
    assert!(t.claim(4, 8, false).is_err());
    // A map of exactly its range takes it, as any page of the reserve: live again, a new epoch.
    assert!(!t.take_ready(4, 12, |()| true), "another size");
    let epoch = t.epoch;
    assert!(t.take_ready(4, 8, |()| true));
    assert_eq!(t.usable(0, 8), Ok(()));
    assert_eq!(
        t.slots.iter().find(|s| s.offset == 4).map(|s| s.epoch),
        Some(epoch + 1)
    );
    let stats = t.stats();
    assert_eq!((stats.reserve_taken, stats.reserve_pages), (1, 1));
    assert!(balanced(&t));
    t.released(12, Ok(false));
    // The trim gives the one left back, as a page the worker made.
    let given = t.take_reserve(0, 64);
    assert_eq!(
        given.iter().map(|&(o, s, ())| (o, s)).collect::<Vec<_>>(),
        vec![(8, 4)]
    );
    let stats = t.stats();
    assert_eq!((stats.reserve_pages, stats.reserve_released), (0, 1));
    assert!(balanced(&t));
    assert_eq!(t.check_vacant(8, 12), Ok(()), "a hole again");
    assert_eq!(
        stats.pages_mapped + 4,
        stats.pages_released
            + stats.reserve_recycled
            + stats.reserve_recycled_in_place
            + t.page_count() as u64,
        "every page mapped (four at the start, one taken) is mapped, released or recycled"
    );
}

#[test]
fn the_bound_counts_pages_recycled_in_place_and_being_filled() {
    let mut t = four_pages(2);
    assert_eq!(
        t.next_fill(),
        Some((16, 4)),
        "one slot filling: one page of room left"
    );
    let released = finish(&mut t, &[4, 8], true);
    assert_eq!(released, vec![8], "no room for the second");
    let stats = t.stats();
    assert_eq!(
        (stats.reserve_recycled_in_place, stats.reserve_peak_pages),
        (1, 2)
    );
    assert_eq!(t.next_fill(), None, "at the bound");
    t.filled(16, Fill::Ready(()));
    t.released(8, Ok(false));
    assert_eq!(t.stats().reserve_pages, 2);
    assert!(balanced(&t));
    // Full: a later finished retire in the window is released.
    assert_eq!(finish(&mut t, &[12], true), vec![12]);
    assert_eq!(t.stats().reserve_peak_pages, 2, "never past the bound");
}

#[test]
fn a_page_not_of_the_reserves_kind_or_place_is_released_not_recycled() {
    // Another device, a shared page, other options: the worker's `fits` says no.
    let mut t = four_pages(3);
    assert_eq!(
        finish(&mut t, &[4], false),
        vec![4],
        "not the reserve's kind"
    );
    // Another size.
    let mut t = reserving(vec![(0, 4, Page::Live(())), (4, 8, Page::Live(()))], 3, 4);
    t.moved_cursor(4);
    let ticket = t.retire(4, 12, false, || Ok(())).unwrap().unwrap().ticket;
    assert_eq!(
        t.start_release(&[ticket], |()| true).len(),
        1,
        "8 bytes, not 4"
    );
    // Retired ungranted: not granted to the access set.
    let mut t = four_pages(3);
    t.slots[1].page = Page::Ungranted(());
    assert_eq!(finish(&mut t, &[4], true), vec![4], "ungranted");
    // Retired by an eviction: its range is evicted once the page is gone.
    let mut t = four_pages(3);
    let ticket = t.retire(4, 8, true, || Ok(())).unwrap().unwrap().ticket;
    assert_eq!(t.start_release(&[ticket], |()| true).len(), 1, "evicted");
    t.released(4, Ok(false));
    assert_eq!(refusal(t.check_vacant(4, 8)), Some((4, 8, EVICTED)));
    // Behind the cursor, out of the bound's pages after it.
    let mut t = four_pages(1);
    assert_eq!(
        finish(&mut t, &[8], true),
        vec![8],
        "the window is 4..8 only"
    );
    // No reserve running: stopped, or never started.
    let mut t = four_pages(3);
    t.stop_reserve();
    assert_eq!(finish(&mut t, &[4], true), vec![4], "stopped");
    let mut t = table((0..4).map(|i| (4 * i, 4, Page::Live(()))).collect());
    assert_eq!(finish(&mut t, &[4], true), vec![4], "no reserve");
    assert_eq!(t.stats().reserve_recycled_in_place, 0);
}

#[test]
fn a_page_retired_before_an_access_change_is_never_recycled_in_place() {
    let mut t = four_pages(3);
    let old = t.retire(4, 8, false, || Ok(())).unwrap().unwrap().ticket;
    t.access_changing();
    // The reserve is started again after the change, as `set_access` does.
    t.start_reserve(3, 4, 64);
    t.moved_cursor(4);
    let new = t.retire(8, 12, false, || Ok(())).unwrap().unwrap().ticket;
    let taken = t.start_release(&[old, new], |()| true);
    assert_eq!(
        taken.iter().map(|&(o, _, ())| o).collect::<Vec<_>>(),
        vec![4],
        "granted the old set: released"
    );
    assert_eq!(
        t.stats().reserve_recycled_in_place,
        1,
        "8, retired after the change"
    );
    assert!(t.take_ready(8, 12, |()| true));
}

#[test]
fn the_window_wraps_round_the_budget_as_the_fills_do() {
    // Cursor at 60 of 64: the next two fills would be 60 and 0.
    let mut t = reserving(vec![(0, 4, Page::Live(())), (4, 4, Page::Live(()))], 2, 4);
    t.moved_cursor(60);
    assert_eq!(
        finish(&mut t, &[0, 4], true),
        vec![4],
        "0 is the second slot, 4 the third"
    );
    let mut past = reserving(vec![(0, 4, Page::Live(()))], 1, 4);
    past.moved_cursor(64);
    assert_eq!(
        finish(&mut past, &[0], true),
        Vec::<usize>::new(),
        "a cursor at the budget's end fills 0 next"
    );
}

#[test]
fn a_map_takes_a_finished_retired_page_in_place_before_the_worker_does() {
    let mut t = four_pages(3);
    let retire = t.retire(8, 12, false, || Ok(())).unwrap().unwrap();
    assert!(
        !t.take_retired(8, 12, |()| true, |_, _| false),
        "its retire not finished"
    );
    assert!(
        !t.take_retired(8, 16, |()| true, |_, _| panic!("not asked: another range")),
        "another range"
    );
    assert!(
        !t.take_retired(8, 12, |()| false, |_, _| panic!("not asked: does not fit")),
        "not the map's device or options"
    );
    assert_eq!(refusal(t.usable(8, 12)), Some((8, 12, RETIRED)));
    let epoch = t.epoch;
    assert!(t.take_retired(8, 12, |()| true, |_, ticket| ticket == retire.ticket));
    assert_eq!(t.usable(8, 12), Ok(()), "live again, where it was");
    assert_eq!(
        t.slots.iter().find(|s| s.offset == 8).map(|s| s.epoch),
        Some(epoch + 1),
        "at a new epoch: no lend made before reaches it"
    );
    let stats = t.stats();
    assert_eq!(
        (
            stats.reserve_recycled_in_place,
            stats.reserve_taken,
            stats.pages_mapped
        ),
        (1, 1, 1)
    );
    assert_eq!(stats.reserve_pages, 0);
    assert!(balanced(&t));
    assert_eq!(t.retired_bytes(), 0);
    // The worker finds the retire finished later: its page is the buffer's again, left alone.
    assert!(t.start_release(&[retire.ticket], |()| true).is_empty());
    assert_eq!(t.usable(8, 12), Ok(()));
    assert_eq!(t.stats().reserve_recycled_in_place, 1);
}

#[test]
fn a_map_leaves_a_retired_page_the_reserve_could_not_hold() {
    let unasked = |_: &_, _| -> bool { panic!("the retire is not asked about") };
    // Retired by an eviction.
    let mut t = four_pages(3);
    t.retire(4, 8, true, || Ok(())).unwrap();
    assert!(!t.take_retired(4, 8, |()| true, unasked), "evicted");
    // Retired ungranted.
    let mut t = four_pages(3);
    t.slots[1].page = Page::Ungranted(());
    t.retire(4, 8, false, || Ok(())).unwrap();
    assert!(!t.take_retired(4, 8, |()| true, unasked), "ungranted");
    // Retired before an access change.
    let mut t = four_pages(3);
    t.retire(4, 8, false, || Ok(())).unwrap();
    t.access_changing();
    assert!(!t.take_retired(4, 8, |()| true, unasked), "the old grants");
    // Another size than the reserve's.
    let mut t = reserving(vec![(0, 8, Page::Live(()))], 3, 4);
    t.retire(0, 8, false, || Ok(())).unwrap();
    assert!(!t.take_retired(0, 8, |()| true, unasked), "8 bytes, not 4");
    // No reserve running.
    let mut t = four_pages(3);
    t.stop_reserve();
    t.retire(4, 8, false, || Ok(())).unwrap();
    assert!(!t.take_retired(4, 8, |()| true, unasked), "stopped");
    assert_eq!(refusal(t.check_vacant(4, 8)), Some((4, 8, RETIRED)));
    assert_eq!(t.stats().reserve_recycled_in_place, 0);
}
