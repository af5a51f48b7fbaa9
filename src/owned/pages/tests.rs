//! The unit and property tests of the range bookkeeping (`pages.rs`), without a driver.

use super::*;

mod claims {
    use super::{Claims, LENT_FOR_WRITING, REUSED, WRITTEN};
    use crate::error::Error;
    use proptest::prelude::*;

    /// The write claims' ranges, in order.
    fn writes(claims: &Claims<u8>) -> Vec<(usize, usize)> {
        claims.writes.iter().map(|w| (w.start, w.end)).collect()
    }

    fn problem(result: Result<(), Error>) -> Option<(usize, usize, &'static str)> {
        match result {
            Ok(()) => None,
            Err(Error::PageRange {
                start,
                end,
                problem,
            }) => Some((start, end, problem)),
            Err(e) => panic!("unexpected {e}"),
        }
    }

    #[test]
    fn writes_are_exclusive_and_reads_shared() {
        let mut claims = Claims::<u8>::default();
        assert_eq!(problem(claims.write(0, 10)), None);
        assert_eq!(
            problem(claims.write(10, 20)),
            None,
            "adjacent writes share no byte"
        );
        assert_eq!(
            problem(claims.write(5, 15)),
            Some((5, 10, "are lent for writing")),
            "the first claim it meets, and only the shared bytes"
        );
        assert_eq!(
            problem(claims.read(15, 25)),
            Some((15, 20, LENT_FOR_WRITING))
        );
        assert_eq!(problem(claims.read(20, 30)), None);
        assert_eq!(problem(claims.read(20, 30)), None, "a range read twice");
        assert_eq!(problem(claims.read(40, 50)), None);
        assert_eq!(problem(claims.read(30, 40)), None, "merges the three");
        assert_eq!(claims.reads, vec![(20, 50)]);
        assert_eq!(
            problem(claims.write(45, 60)),
            Some((45, 50, "are lent for reading"))
        );
        assert_eq!(
            problem(claims.write(7, 7)),
            None,
            "an empty range claims nothing"
        );
    }

    #[test]
    fn write_chunks_claims_each_chunk_as_its_own_write_or_none() {
        let mut claims = Claims::<u8>::default();
        assert_eq!(problem(claims.write(20, 24)), None);
        assert_eq!(problem(claims.write_chunks(0, 10, 4)), None);
        assert_eq!(
            writes(&claims),
            vec![(0, 4), (4, 8), (8, 10), (20, 24)],
            "in address order, the last chunk shorter"
        );
        // Over a claim: nothing is claimed, the shared bytes named.
        assert_eq!(
            problem(claims.write_chunks(12, 30, 2)),
            Some((20, 24, "are lent for writing"))
        );
        assert_eq!(writes(&claims).len(), 4);
        // Each chunk is a claim of its own: lent, read back and retired alone.
        assert_eq!(problem(claims.wrote(4, 8, 1)), None);
        assert_eq!(
            problem(claims.wrote(2, 6, 1)),
            Some((
                2,
                6,
                "are no longer lent for writing: read back (`ScopedBuffer::read_back`) or retired since"
            )),
            "a lend across two chunks is no one chunk's"
        );
        assert_eq!(claims.read_back(4, 8).ok(), Some(vec![1]));
        claims.forget(0, 4);
        assert_eq!(writes(&claims), vec![(4, 8), (8, 10), (20, 24)]);
        // A chunk of zero, an empty range: nothing.
        assert_eq!(problem(claims.write_chunks(30, 40, 0)), None);
        assert_eq!(problem(claims.write_chunks(30, 30, 4)), None);
        assert_eq!(writes(&claims).len(), 3);
    }

    #[test]
    fn claim_all_claims_every_range_or_none() {
        let mut claims = Claims::<u8>::default();
        assert_eq!(problem(claims.write(0, 10)), None);
        assert_eq!(problem(claims.read(40, 50)), None);
        // The third range shares bytes with the write claim: nothing is claimed, not even the
        // first two, and the shared bytes are named.
        assert_eq!(
            problem(claims.claim_all(&[(20, 30, true), (30, 35, false), (5, 15, false)])),
            Some((5, 10, LENT_FOR_WRITING))
        );
        assert_eq!(writes(&claims), vec![(0, 10)]);
        assert_eq!(claims.reads, vec![(40, 50)]);
        // A write over a read claim is refused, a read beside it shared.
        assert_eq!(
            problem(claims.claim_all(&[(20, 30, true), (45, 60, true)])),
            Some((45, 50, "are lent for reading"))
        );
        assert_eq!(writes(&claims), vec![(0, 10)]);
        assert_eq!(
            problem(claims.claim_all(&[(20, 30, true), (30, 45, false), (60, 60, true)])),
            None
        );
        assert_eq!(writes(&claims), vec![(0, 10), (20, 30)], "no empty claim");
        assert_eq!(claims.reads, vec![(30, 50)]);
        // What it claimed for writing is exclusive, and is lent for writing as `write`'s claims.
        assert_eq!(
            problem(claims.write(25, 26)),
            Some((25, 26, "are lent for writing"))
        );
        assert_eq!(problem(claims.wrote(20, 30, 1)), None);
        assert_eq!(claims.read_back(20, 30).ok(), Some(vec![1]));
        assert_eq!(
            problem(claims.claim_all(&[(20, 30, false)])),
            Some((20, 30, WRITTEN)),
            "read back: a plain read of written bytes is refused"
        );
    }

    #[test]
    fn a_retired_range_frees_its_claims() {
        let mut claims = Claims::<u8>::default();
        claims.write(0, 10).unwrap();
        claims.write(10, 30).unwrap();
        claims.read(30, 60).unwrap();
        claims.forget(20, 40);
        assert_eq!(
            writes(&claims),
            vec![(0, 10)],
            "a write that shares a byte goes whole"
        );
        assert_eq!(claims.reads, vec![(40, 60)]);
        claims.read(10, 20).unwrap();
        claims.forget(45, 50);
        assert_eq!(
            claims.reads,
            vec![(10, 20), (40, 45), (50, 60)],
            "cut in two"
        );
        claims.clear();
        assert_eq!(problem(claims.write(0, 100)), None);
    }

    #[test]
    fn a_read_back_settles_the_writes_and_names_their_streams() {
        let mut claims = Claims::<u8>::default();
        claims.write(0, 10).unwrap();
        claims.write(10, 20).unwrap();
        claims.write(20, 30).unwrap();
        claims.wrote(0, 10, 1).unwrap();
        claims.wrote(2, 4, 2).unwrap(); // a part of a claim, on another stream after a hand-over
        claims.wrote(10, 20, 1).unwrap();
        assert_eq!(
            problem(claims.read_back(0, 25).map(drop)),
            Some((
                20,
                30,
                "are lent for writing past an end of the range: read a write back whole"
            )),
            "a write cut by the range"
        );
        assert_eq!(
            claims.read_back(0, 20).unwrap(),
            vec![2, 1],
            "each stream once, the last"
        );
        assert_eq!(
            problem(claims.wrote(0, 10, 1)),
            Some((
                0,
                10,
                "are no longer lent for writing: read back (`ScopedBuffer::read_back`) or retired since"
            )),
            "a write lend of a range read back"
        );
        assert_eq!(
            problem(claims.wrote(20, 30, 3)),
            None,
            "the one not read back"
        );
        assert_eq!(
            problem(claims.read(5, 6)),
            Some((5, 6, WRITTEN)),
            "a plain read names no stream to wait for"
        );
        assert_eq!(
            problem(claims.read(20, 21)),
            Some((20, 21, LENT_FOR_WRITING))
        );
        assert_eq!(
            problem(claims.write(19, 21)).map(|p| (p.0, p.1)),
            Some((19, 20)),
            "a write after a read back is refused"
        );
        assert_eq!(
            claims.read_back(5, 30).unwrap(),
            vec![2, 1, 3],
            "a second read back over settled writes orders after them again"
        );
        assert_eq!(claims.reads, vec![(0, 30)]);
        assert_eq!(
            claims.read_back(40, 50).unwrap(),
            Vec::<u8>::new(),
            "nothing written"
        );
        assert_eq!(problem(claims.read(45, 50)), None);
        claims.forget(0, 30);
        assert_eq!(problem(claims.write(0, 30)), None, "retired: lent again");
    }

    #[test]
    fn a_reuse_fences_off_every_earlier_handle_and_lends_anew() {
        let mut claims = Claims::<u8>::default();
        claims.write(0, 10).unwrap();
        claims.write(10, 20).unwrap();
        claims.wrote(0, 10, 1).unwrap();
        claims.read_back(0, 10).unwrap();
        claims.read(20, 40).unwrap();
        assert_eq!(
            problem(claims.reuse(5, 15, 3, 2)),
            Some((
                0,
                10,
                "were lent for writing past an end of the range: reuse a block whole"
            )),
            "a write cut by the range, read back or not"
        );
        assert_eq!(
            problem(claims.check_fresh(0, 40, 0)),
            None,
            "refused: no change"
        );
        claims.reuse(0, 10, 3, 2).unwrap();
        claims.reuse(25, 30, 4, 2).unwrap();
        assert_eq!(
            problem(claims.check_fresh(8, 12, 2)),
            Some((8, 10, REUSED)),
            "a handle made before, over the block"
        );
        assert_eq!(problem(claims.check_fresh(0, 10, 3)), None, "the new lend");
        assert_eq!(problem(claims.check_fresh(10, 25, 0)), None, "other bytes");
        assert_eq!(
            problem(claims.check_fresh(20, 40, 3)).map(|p| (p.0, p.1)),
            Some((25, 30)),
            "a read made before the second reuse"
        );
        assert_eq!(
            problem(claims.wrote(0, 10, 2)),
            None,
            "lent for writing anew"
        );
        assert_eq!(problem(claims.read(0, 1)), Some((0, 1, LENT_FOR_WRITING)));
        assert_eq!(claims.reads, vec![(20, 25), (30, 40)]);
        claims.reuse(0, 10, 5, 1).unwrap();
        assert_eq!(
            claims.fences.len(),
            2,
            "a later reuse replaces the bytes it shares"
        );
        claims.forget(0, 40);
        assert_eq!(
            problem(claims.check_fresh(0, 40, 0)),
            None,
            "retired: nothing left"
        );
    }

    /// One step of the model test: claim for writing, claim for reading, a write lend on a stream,
    /// a read back, a retire.
    #[derive(Debug, Clone)]
    enum Op {
        Write(usize, usize),
        WriteChunks(usize, usize, usize),
        Read(usize, usize),
        Wrote(usize, usize, u8),
        ReadBack(usize, usize),
        Forget(usize, usize),
        Reuse(usize, usize, u8),
        Fresh(usize, usize, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        let range = (0usize..16, 1usize..6).prop_map(|(s, l)| (s, s + l));
        prop_oneof![
            range.clone().prop_map(|(s, e)| Op::Write(s, e)),
            (range.clone(), 1usize..4).prop_map(|((s, e), c)| Op::WriteChunks(s, e, c)),
            range.clone().prop_map(|(s, e)| Op::Read(s, e)),
            (range.clone(), 0u8..3).prop_map(|((s, e), t)| Op::Wrote(s, e, t)),
            range.clone().prop_map(|(s, e)| Op::ReadBack(s, e)),
            range.clone().prop_map(|(s, e)| Op::Forget(s, e)),
            (range.clone(), 0u8..3).prop_map(|((s, e), t)| Op::Reuse(s, e, t)),
            (range, 0u64..12).prop_map(|((s, e), epoch)| Op::Fresh(s, e, epoch)),
        ]
    }

    /// What one byte is, in a model kept byte by byte.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    enum Byte {
        #[default]
        Free,
        Read,
        /// Lent for writing by the claim numbered so, last written on the stream.
        Writing(usize, Option<u8>),
        /// Written by the claim numbered so, then read back; the stream of its last write.
        ReadBack(usize, Option<u8>),
    }

    proptest! {
        /// Against a byte-by-byte model: a write claim's bytes are never lent for reading (nor
        /// written by another claim) until read back or retired; a read back of a range names every
        /// stream that last wrote a byte of it, is refused only where a write reaches past its
        /// ends, and no write lend follows it.
        #[test]
        fn claims_match_a_byte_model(ops in proptest::collection::vec(op(), 0..24)) {
            let mut claims = Claims::<u8>::default();
            let mut model = [Byte::Free; 24];
            // The count at which each byte was last reused (0: never, or retired since).
            let mut fenced = [0u64; 24];
            let mut epoch = 0u64;
            let mut next = 0usize;
            for op in ops {
                match op {
                    Op::Write(s, e) => {
                        let free = model[s..e].iter().all(|b| *b == Byte::Free);
                        prop_assert_eq!(claims.write(s, e).is_ok(), free, "{:?}", op);
                        if free {
                            model[s..e].fill(Byte::Writing(next, None));
                            next += 1;
                        }
                    }
                    Op::WriteChunks(s, e, c) => {
                        let free = model[s..e].iter().all(|b| *b == Byte::Free);
                        prop_assert_eq!(claims.write_chunks(s, e, c).is_ok(), free, "{:?}", op);
                        if free {
                            for chunk in model[s..e].chunks_mut(c) {
                                chunk.fill(Byte::Writing(next, None));
                                next += 1;
                            }
                        }
                    }
                    Op::Read(s, e) => {
                        let ok = model[s..e].iter().all(|b| matches!(b, Byte::Free | Byte::Read));
                        prop_assert_eq!(claims.read(s, e).is_ok(), ok, "{:?}", op);
                        if ok {
                            model[s..e].fill(Byte::Read);
                        }
                    }
                    Op::Wrote(s, e, t) => {
                        let claim = match model[s] {
                            Byte::Writing(c, _) => Some(c),
                            _ => None,
                        };
                        let ok = claim.is_some()
                            && model[s..e].iter().all(|b| matches!(b, Byte::Writing(c, _) if Some(*c) == claim));
                        prop_assert_eq!(claims.wrote(s, e, t).is_ok(), ok, "{:?}", op);
                        if let (true, Some(c)) = (ok, claim) {
                            for b in &mut model {
                                if let Byte::Writing(n, stream) = b && *n == c {
                                    *stream = Some(t);
                                }
                            }
                        }
                    }
                    Op::ReadBack(s, e) => {
                        let inside: Vec<usize> = model[s..e]
                            .iter()
                            .filter_map(|b| match b { Byte::Writing(c, _) => Some(*c), _ => None })
                            .collect();
                        let cut = model.iter().enumerate().any(|(i, b)| {
                            matches!(b, Byte::Writing(c, _) if inside.contains(c)) && !(s..e).contains(&i)
                        });
                        let result = claims.read_back(s, e);
                        prop_assert_eq!(result.is_ok(), !cut, "{:?}", op);
                        if let Ok(mut streams) = result {
                            let mut expected: Vec<u8> = Vec::new();
                            for b in &model[s..e] {
                                if let Byte::Writing(_, Some(t)) | Byte::ReadBack(_, Some(t)) = b
                                    && !expected.contains(t)
                                {
                                    expected.push(*t);
                                }
                            }
                            streams.sort_unstable();
                            expected.sort_unstable();
                            prop_assert_eq!(streams, expected, "{:?}", op);
                            for b in &mut model {
                                if let Byte::Writing(c, stream) = *b && inside.contains(&c) {
                                    *b = Byte::ReadBack(c, stream);
                                }
                            }
                            for b in &mut model[s..e] {
                                if *b == Byte::Free {
                                    *b = Byte::Read;
                                }
                            }
                        }
                    }
                    Op::Forget(s, e) => {
                        claims.forget(s, e);
                        let gone: Vec<usize> = model[s..e]
                            .iter()
                            .filter_map(|b| match b {
                                Byte::Writing(c, _) | Byte::ReadBack(c, _) => Some(*c),
                                _ => None,
                            })
                            .collect();
                        for b in &mut model {
                            match *b {
                                Byte::Writing(c, _) if gone.contains(&c) => *b = Byte::Free,
                                // Read back: its bytes stay lent for reading.
                                Byte::ReadBack(c, _) if gone.contains(&c) => *b = Byte::Read,
                                _ => {}
                            }
                        }
                        model[s..e].fill(Byte::Free);
                        fenced[s..e].fill(0);
                    }
                    Op::Reuse(s, e, t) => {
                        let owner = |b: &Byte| match b {
                            Byte::Writing(c, _) | Byte::ReadBack(c, _) => Some(*c),
                            _ => None,
                        };
                        let cut = model.iter().enumerate().any(|(i, b)| {
                            owner(b).is_some_and(|c| model[s..e].iter().any(|x| owner(x) == Some(c)))
                                && !(s..e).contains(&i)
                        });
                        epoch += 1;
                        prop_assert_eq!(claims.reuse(s, e, epoch, t).is_ok(), !cut, "{:?}", op);
                        if !cut {
                            model[s..e].fill(Byte::Writing(next, Some(t)));
                            next += 1;
                            fenced[s..e].fill(epoch);
                        }
                    }
                    Op::Fresh(s, e, at) => {
                        let stale = fenced[s..e].iter().any(|&f| f > at);
                        prop_assert_eq!(claims.check_fresh(s, e, at).is_err(), stale, "{:?}", op);
                    }
                }
            }
        }
    }
}

mod retired {
    use super::{RETIRED, Span, check_covered_at, insertion_point};
    use crate::error::Error;

    /// `[start, end)`, retired, epoch.
    struct R(usize, usize, bool, u64);

    impl Span for R {
        fn start(&self) -> usize {
            self.0
        }
        fn end(&self) -> usize {
            self.1
        }
        fn granted(&self) -> bool {
            true
        }
        fn retired(&self) -> bool {
            self.2
        }
        fn epoch(&self) -> u64 {
            self.3
        }
    }

    fn refusal(result: Result<(), Error>) -> Option<(usize, usize, &'static str)> {
        match result {
            Err(Error::PageRange {
                start,
                end,
                problem,
            }) => Some((start, end, problem)),
            Ok(()) => None,
            Err(e) => panic!("unexpected {e}"),
        }
    }

    #[test]
    fn retired_and_later_pages_give_no_view_and_take_no_page() {
        let pages = [R(0, 4, false, 1), R(4, 8, true, 2), R(8, 12, false, 5)];
        assert_eq!(refusal(check_covered_at(&pages, 0, 4, 1)), None);
        assert_eq!(
            refusal(check_covered_at(&pages, 2, 6, 9)),
            Some((4, 8, RETIRED))
        );
        let later = refusal(check_covered_at(&pages, 8, 12, 4)).map(|r| (r.0, r.1));
        assert_eq!(
            later,
            Some((8, 12)),
            "mapped at epoch 5, after a view of epoch 4"
        );
        assert_eq!(refusal(check_covered_at(&pages, 8, 12, 5)), None);
        match insertion_point(&pages, 4, 8) {
            Err(Error::PageRange { problem, .. }) => assert_eq!(problem, RETIRED),
            other => panic!("a retired range took a page: {other:?}"),
        }
    }
}

mod arithmetic {
    use super::{Span, check_covered, check_new_range, insertion_point, pages_inside};
    use crate::error::Error;
    use proptest::prelude::*;

    /// A page of the model: `[start, end)` in units, and whether it is granted.
    #[derive(Debug, Clone, Copy)]
    struct P(usize, usize, bool);

    impl Span for P {
        fn start(&self) -> usize {
            self.0
        }
        fn end(&self) -> usize {
            self.1
        }
        fn granted(&self) -> bool {
            self.2
        }
    }

    /// Sorted, disjoint pages from (gap, length, granted) triples.
    fn layout(parts: &[(usize, usize, bool)]) -> Vec<P> {
        let mut at = 0;
        parts
            .iter()
            .map(|&(gap, len, granted)| {
                let start = at + gap;
                at = start + len;
                P(start, at, granted)
            })
            .collect()
    }

    fn parts() -> impl Strategy<Value = Vec<(usize, usize, bool)>> {
        proptest::collection::vec((0usize..3, 1usize..4, proptest::bool::weighted(0.9)), 0..8)
    }

    fn covering(pages: &[P], unit: usize) -> Option<&P> {
        pages.iter().find(|p| p.0 <= unit && unit < p.1)
    }

    proptest! {
        /// A new page is accepted exactly where it overlaps no page, and goes where the order stays
        /// sorted; a refusal names a page it overlaps.
        #[test]
        fn insertion_point_accepts_exactly_the_free_ranges(parts in parts(), offset in 0usize..40, len in 1usize..6) {
            let pages = layout(&parts);
            let end = offset + len;
            let free = pages.iter().all(|p| p.1 <= offset || p.0 >= end);
            match insertion_point(&pages, offset, end) {
                Ok(index) => {
                    prop_assert!(free);
                    prop_assert!(pages[..index].iter().all(|p| p.1 <= offset));
                    prop_assert!(pages[index..].iter().all(|p| p.0 >= end));
                }
                Err(Error::PageRange { start, end: page_end, .. }) => {
                    prop_assert!(!free);
                    prop_assert!(pages.iter().any(|p| p.0 == start && p.1 == page_end));
                    prop_assert!(start < end && page_end > offset, "the named page overlaps");
                }
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
        }

        /// A view's range is accepted exactly where granted pages cover every byte of it; a refusal
        /// names a hole inside the range or a page that is not granted.
        #[test]
        fn check_covered_accepts_exactly_the_granted_runs(parts in parts(), start in 0usize..40, len in 0usize..20) {
            let pages = layout(&parts);
            let end = start + len;
            let covered = (start..end).all(|u| covering(&pages, u).is_some_and(|p| p.2));
            match check_covered(&pages, start, end) {
                Ok(()) => prop_assert!(covered),
                Err(Error::PageRange { start: s, end: e, problem }) => {
                    prop_assert!(!covered);
                    prop_assert!(s < e);
                    if problem == "are not mapped" {
                        prop_assert!(start <= s && e <= end);
                        prop_assert!((s..e).all(|u| covering(&pages, u).is_none()), "a hole");
                    } else {
                        prop_assert!(pages.iter().any(|p| (p.0, p.1, p.2) == (s, e, false)));
                    }
                }
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
        }

        /// An unmap is accepted exactly where no page straddles an end of the range, and takes exactly
        /// the pages inside it.
        #[test]
        fn pages_inside_takes_exactly_the_pages_inside(parts in parts(), start in 0usize..40, len in 0usize..20) {
            let pages = layout(&parts);
            let end = start + len;
            let cut = len > 0 && pages.iter().any(|p| p.0 < end && p.1 > start && (p.0 < start || p.1 > end));
            match pages_inside(&pages, start, end) {
                Ok(span) => {
                    prop_assert!(!cut);
                    let inside: Vec<usize> = (0..pages.len())
                        .filter(|&i| len > 0 && pages[i].0 >= start && pages[i].1 <= end)
                        .collect();
                    prop_assert_eq!(span.clone().collect::<Vec<_>>(), inside);
                    prop_assert!(span.end <= pages.len());
                }
                Err(Error::PageRange { start: s, end: e, .. }) => {
                    prop_assert!(cut);
                    prop_assert!(pages.iter().any(|p| p.0 == s && p.1 == e));
                }
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
        }
    }

    #[test]
    fn new_ranges_are_checked_before_the_driver() {
        let g = 2 << 20;
        let range = (64 * g as u64, 8 * g, "reservation");
        assert_eq!(check_new_range(range, 2 * g, 3 * g, g), Ok(5 * g));
        assert_eq!(check_new_range(range, 5 * g, 3 * g, g), Ok(8 * g));
        assert!(matches!(
            check_new_range(range, 0, 0, g),
            Err(Error::ZeroSize { .. })
        ));
        assert!(matches!(
            check_new_range(range, 0, g + 1, g),
            Err(Error::NotAligned {
                what: "mapping size",
                ..
            })
        ));
        assert!(matches!(
            check_new_range(range, g / 2, g, g),
            Err(Error::NotAligned {
                what: "mapping offset",
                ..
            })
        ));
        assert_eq!(
            check_new_range(range, 6 * g, 3 * g, g),
            Err(Error::OutOfBounds {
                what: "reservation",
                start: 6 * g,
                end: 9 * g,
                len: 8 * g
            })
        );
        assert!(matches!(
            check_new_range(range, usize::MAX - g + 1, g, g),
            Err(Error::Overflow { .. })
        ));
        // A base aligned for one granularity but not for a larger one.
        let odd_base = (g as u64, 8 * g, "reservation");
        assert!(matches!(
            check_new_range(odd_base, 2 * g, 2 * g, 2 * g),
            Err(Error::NotAligned {
                what: "mapping address",
                ..
            })
        ));
    }

    #[test]
    fn hole_and_overlap_errors_name_the_bytes() {
        let pages = [P(0, 2, true), P(4, 6, true), P(6, 8, false)];
        assert_eq!(
            check_covered(&pages, 1, 5),
            Err(Error::PageRange {
                start: 2,
                end: 4,
                problem: "are not mapped"
            })
        );
        assert!(check_covered(&pages, 4, 6).is_ok());
        assert!(matches!(
            check_covered(&pages, 5, 7),
            Err(Error::PageRange {
                start: 6,
                end: 8,
                ..
            })
        ));
        assert!(matches!(
            insertion_point(&pages, 1, 3),
            Err(Error::PageRange {
                start: 0,
                end: 2,
                ..
            })
        ));
        assert_eq!(insertion_point(&pages, 2, 4), Ok(1));
        assert_eq!(pages_inside(&pages, 2, 8), Ok(1..3));
        assert!(matches!(
            pages_inside(&pages, 5, 8),
            Err(Error::PageRange {
                start: 4,
                end: 6,
                ..
            })
        ));
        assert_eq!(
            pages_inside(&pages, 1, 1),
            Ok(0..0),
            "an empty range cuts nothing"
        );
    }
}

/// A buffer's page table keeps its evicted ranges in the same sorted list as its pages. Before, it
/// kept them in a list of their own, checked first (`check_not_evicted` over that list, then the
/// page checks over the pages alone). These tests hold the one list to the two lists' answers, for
/// every mix of live, ungranted, retired and evicted ranges.
mod one_list {
    use super::{
        EVICTED, Span, check_covered_at, check_not_evicted, insertion_point, pages_inside,
    };
    use crate::error::Error;
    use proptest::prelude::*;

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Kind {
        Live,
        Ungranted,
        Retired,
        /// Retired by an eviction in a scope: still mapped, and evicted.
        RetiredEvicted,
        /// Evicted, its page released.
        Evicted,
    }

    #[derive(Debug, Clone, Copy)]
    struct Slot(usize, usize, Kind, u64);

    impl Span for Slot {
        fn start(&self) -> usize {
            self.0
        }
        fn end(&self) -> usize {
            self.1
        }
        fn granted(&self) -> bool {
            self.2 != Kind::Ungranted
        }
        fn retired(&self) -> bool {
            matches!(self.2, Kind::Retired | Kind::RetiredEvicted)
        }
        fn evicted(&self) -> bool {
            matches!(self.2, Kind::RetiredEvicted | Kind::Evicted)
        }
        fn mapped(&self) -> bool {
            self.2 != Kind::Evicted
        }
        fn epoch(&self) -> u64 {
            self.3
        }
    }

    /// A page as the two-list table saw it: every `Span` answer but `evicted` and `mapped`.
    #[derive(Debug, Clone, Copy)]
    struct Page(Slot);

    impl Span for Page {
        fn start(&self) -> usize {
            self.0.0
        }
        fn end(&self) -> usize {
            self.0.1
        }
        fn granted(&self) -> bool {
            self.0.granted()
        }
        fn retired(&self) -> bool {
            self.0.retired()
        }
        fn epoch(&self) -> u64 {
            self.0.3
        }
    }

    /// The two lists of the table before: its pages, and its evicted ranges.
    fn two_lists(slots: &[Slot]) -> (Vec<Page>, Vec<(usize, usize)>) {
        let pages = slots
            .iter()
            .filter(|s| s.mapped())
            .map(|&s| Page(s))
            .collect();
        let evicted = slots
            .iter()
            .filter(|s| s.evicted())
            .map(|s| (s.0, s.1))
            .collect();
        (pages, evicted)
    }

    /// The evicted-range check of the two-list table, as it was written.
    fn old_check_not_evicted(
        evicted: &[(usize, usize)],
        start: usize,
        end: usize,
    ) -> Result<(), Error> {
        if start >= end {
            return Ok(());
        }
        let index = evicted.partition_point(|e| e.1 <= start);
        match evicted.get(index) {
            Some(&(s, e)) if s < end => Err(Error::PageRange {
                start: s,
                end: e,
                problem: EVICTED,
            }),
            _ => Ok(()),
        }
    }

    /// 2048, or `PROPTEST_CASES` where it is set.
    fn cases() -> u32 {
        std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|cases| cases.parse().ok())
            .unwrap_or(2048)
    }

    fn slots() -> impl Strategy<Value = Vec<Slot>> {
        let kind = prop_oneof![
            4 => Just(Kind::Live),
            1 => Just(Kind::Ungranted),
            2 => Just(Kind::Retired),
            1 => Just(Kind::RetiredEvicted),
            2 => Just(Kind::Evicted),
        ];
        proptest::collection::vec((0usize..3, 1usize..4, kind, 0u64..6), 0..10).prop_map(|parts| {
            let mut at = 0;
            parts
                .into_iter()
                .map(|(gap, len, kind, epoch)| {
                    let start = at + gap;
                    at = start + len;
                    Slot(start, at, kind, epoch)
                })
                .collect()
        })
    }

    /// The evicted range a check meets is named, whatever else is mapped around it (it was
    /// `evicted_ranges_are_refused_by_name` over the old list of evicted ranges).
    #[test]
    fn evicted_ranges_are_refused_by_name() {
        let slots = [
            Slot(0, 4, Kind::Live, 1),
            Slot(4, 8, Kind::Evicted, 2),
            Slot(8, 12, Kind::Live, 3),
            Slot(12, 16, Kind::RetiredEvicted, 4),
        ];
        let evicted = |start, end| {
            Err(Error::PageRange {
                start,
                end,
                problem: EVICTED,
            })
        };
        assert_eq!(check_not_evicted(&slots, 0, 4), Ok(()));
        assert_eq!(check_not_evicted(&slots, 8, 12), Ok(()));
        assert_eq!(check_not_evicted(&slots, 6, 7), evicted(4, 8));
        assert_eq!(check_not_evicted(&slots, 9, 20), evicted(12, 16));
        assert_eq!(
            check_not_evicted(&slots, 2, 20),
            evicted(4, 8),
            "the first one"
        );
        assert_eq!(check_not_evicted(&slots, 5, 5), Ok(()), "an empty range");
        assert_eq!(check_not_evicted::<Slot>(&[], 0, 100), Ok(()));
    }

    proptest! {
        // Pure arithmetic, fast: enough cases that every kind meets every end of a range, unless
        // PROPTEST_CASES asks for fewer (under Miri).
        #![proptest_config(ProptestConfig::with_cases(cases()))]

        /// A view's or a lend's check gives the two lists' answer: the evicted range first, then
        /// the first hole, retired, later or ungranted page.
        #[test]
        fn a_view_is_refused_as_before(slots in slots(), start in 0usize..40, len in 0usize..12, epoch in 0u64..7) {
            let (pages, evicted) = two_lists(&slots);
            let end = start + len;
            let one = check_not_evicted(&slots, start, end)
                .and_then(|()| check_covered_at(&slots, start, end, epoch));
            let two = old_check_not_evicted(&evicted, start, end)
                .and_then(|()| check_covered_at(&pages, start, end, epoch));
            prop_assert_eq!(one, two);
        }

        /// A new page is refused as before (an evicted range first, then the page it overlaps), and
        /// goes where it went: after the same pages.
        #[test]
        fn a_new_page_goes_where_it_went(slots in slots(), offset in 0usize..40, len in 1usize..6) {
            let (pages, evicted) = two_lists(&slots);
            let end = offset + len;
            let one = check_not_evicted(&slots, offset, end)
                .and_then(|()| insertion_point(&slots, offset, end));
            let two = old_check_not_evicted(&evicted, offset, end)
                .and_then(|()| insertion_point(&pages, offset, end));
            match (one, two) {
                (Ok(index), Ok(page_index)) => {
                    let before = slots[..index].iter().filter(|s| s.mapped()).count();
                    prop_assert_eq!(before, page_index);
                    prop_assert!(slots[..index].iter().all(|s| s.1 <= offset));
                    prop_assert!(slots[index..].iter().all(|s| s.0 >= end));
                }
                (one, two) => prop_assert_eq!(one, two),
            }
        }

        /// An unmap, a retire or an eviction takes the same pages as before, and refuses the same
        /// cut page; the evicted ranges it spans, which hold no page, are only passed over.
        #[test]
        fn a_range_takes_the_same_pages(slots in slots(), start in 0usize..40, len in 0usize..20) {
            let (pages, _) = two_lists(&slots);
            let end = start + len;
            match (pages_inside(&slots, start, end), pages_inside(&pages, start, end)) {
                (Ok(one), Ok(two)) => {
                    let taken: Vec<(usize, usize)> = slots[one]
                        .iter()
                        .filter(|s| s.mapped())
                        .map(|s| (s.0, s.1))
                        .collect();
                    let before: Vec<(usize, usize)> = pages[two].iter().map(|p| (p.0.0, p.0.1)).collect();
                    prop_assert_eq!(taken, before);
                }
                (one, two) => prop_assert_eq!(one.map(drop), two.map(drop)),
            }
        }
    }
}
