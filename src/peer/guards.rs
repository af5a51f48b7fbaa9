//! The bookkeeping behind overlapping [`PeerAccess`](crate::PeerAccess) guards: live guards per
//! direction and the two-step end of the last one, free of driver calls (and so unit-tested against
//! a model).

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

/// A `(from, to)` direction, by device ordinal. Every context of this crate is its device's primary
/// context, so a device names its context.
pub(super) type Pair = (i32, i32);

/// One direction with live guards, or whose last guard is waiting for its context before the disable.
#[derive(Debug)]
struct Direction<H> {
    /// Live guards. 0 while the last guard to end waits for its `from` context: the direction is then
    /// closing, still enabled, and a guard made meanwhile joins it.
    live: usize,
    /// The generation of the latest guard added (see [`GuardCounts::add`]).
    generation: u64,
    /// What the direction holds on to, made by its first guard.
    hold: H,
}

/// The claim of a direction's last guard on ending it, taken by [`GuardCounts::begin_end`] before its
/// wait and redeemed by [`GuardCounts::finish_end`] after it. Neither `Clone` nor `Copy`: one claim
/// per end.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a closing direction stays enabled until its claim is redeemed by `finish_end`"]
pub(super) struct Closing {
    pair: Pair,
    /// The direction's generation when its last guard ended.
    generation: u64,
}

/// Live guards per direction, each with what it holds: the bookkeeping behind overlapping guards, free
/// of driver calls.
///
/// Ending a guard takes two steps, so that the lock around the counts need not be held while the last
/// guard of a direction waits for its work: [`begin_end`](GuardCounts::begin_end) counts the guard
/// out and, for the last one, keeps the direction (closing, with no live guard) and hands back a
/// [`Closing`] claim; after the wait, [`finish_end`](GuardCounts::finish_end) hands back the hold (the
/// direction is to be disabled now) only where no guard of the direction was added since the claim
/// was taken. Every add moves the direction to a new generation, and the claim names the generation
/// it saw; a guard added while the last one waited therefore makes that waiter's claim stale,
/// whether the new guard still lives (the disable would pull access from under it) or has ended in
/// turn (its own work was queued after the stale waiter's wait began, so only its own end, which
/// waits after that work, may disable). Such a later guard joins the closing direction and inherits
/// its hold; the disable is its end's, or that of the last of its own successors. Generations are
/// numbered across all directions and enablements, so a claim can never match a later enablement of
/// its direction either: exactly one end disables each enablement.
#[derive(Debug)]
pub(super) struct GuardCounts<H> {
    directions: BTreeMap<Pair, Direction<H>>,
    /// Guards ever added, of any direction: the generation of the latest one.
    adds: u64,
}

impl<H> GuardCounts<H> {
    pub(super) const fn new() -> GuardCounts<H> {
        GuardCounts {
            directions: BTreeMap::new(),
            adds: 0,
        }
    }

    /// Whether `pair` is enabled: it has a live guard, or its last guard is still waiting to disable.
    #[cfg(test)]
    fn is_enabled(&self, pair: Pair) -> bool {
        self.directions.contains_key(&pair)
    }

    /// The live guards of `pair`.
    #[cfg(test)]
    fn live(&self, pair: Pair) -> usize {
        self.directions
            .get(&pair)
            .map_or(0, |direction| direction.live)
    }

    /// Records a new guard of `pair` and returns the direction's hold: the one it has where it is
    /// enabled already (closing ones included: the new guard joins the access still enabled, and
    /// inherits the end of it), else one made by `hold` (where that fails, nothing is recorded).
    pub(super) fn add<E>(
        &mut self,
        pair: Pair,
        hold: impl FnOnce() -> Result<H, E>,
    ) -> Result<&mut H, E> {
        // Cannot wrap in practice (one per guard made, 2^64 of them); wrapping rather than panicking.
        let generation = self.adds.wrapping_add(1);
        let direction = match self.directions.entry(pair) {
            Entry::Occupied(entry) => entry.into_mut(),
            Entry::Vacant(entry) => entry.insert(Direction {
                live: 0,
                generation,
                hold: hold()?,
            }),
        };
        self.adds = generation;
        direction.generation = generation;
        // A count of live guards cannot overflow: each guard is a value in memory.
        direction.live += 1;
        Ok(&mut direction.hold)
    }

    /// Ends one guard of `pair`. For the last one, the direction's hold and the claim to redeem with
    /// [`finish_end`](GuardCounts::finish_end) once its work has been waited for; the direction stays
    /// enabled (closing) until then. `None` where other guards still live, or where `pair` has no live
    /// guard at all.
    pub(super) fn begin_end(&mut self, pair: Pair) -> Option<(Closing, &H)> {
        let direction = self.directions.get_mut(&pair)?;
        if direction.live == 0 {
            return None;
        }
        direction.live -= 1;
        let closing = Closing {
            pair,
            generation: direction.generation,
        };
        (direction.live == 0).then_some((closing, &direction.hold))
    }

    /// Redeems the claim of a last guard: the direction's hold, removed, where no guard of it was added
    /// since [`begin_end`](GuardCounts::begin_end) (the direction is to be disabled now); `None` where
    /// one was, so the disable is left to that later guard (or to the last of its successors).
    #[allow(
        clippy::needless_pass_by_value,
        reason = "the claim is used up: one `finish_end` per `begin_end`"
    )]
    pub(super) fn finish_end(&mut self, closing: Closing) -> Option<H> {
        let Entry::Occupied(entry) = self.directions.entry(closing.pair) else {
            return None;
        };
        let direction = entry.get();
        if direction.live != 0 || direction.generation != closing.generation {
            return None;
        }
        Some(entry.remove().hold)
    }
}

#[cfg(test)]
mod tests {
    use super::{Closing, GuardCounts, Pair};
    use proptest::prelude::*;
    use proptest::test_runner::TestCaseError;
    use std::collections::{HashMap, HashSet};

    /// The directions the model test uses: few, so that its operations often meet on one.
    const PAIRS: [Pair; 4] = [(0, 0), (0, 1), (1, 0), (1, 1)];

    /// What the model knows of one enablement of a direction: from the guard that made its hold to
    /// the end that hands it back.
    #[derive(Debug)]
    struct Enablement {
        /// Guards that have not begun to end.
        live: usize,
        /// The hold its first guard made.
        hold: usize,
        /// The latest end that left the direction without a live guard (it then waits).
        latest_waiter: Option<usize>,
    }

    /// Finishes the end `id` (a last guard's, after its wait) and checks it against the model: the
    /// hold comes back (the driver disable) exactly where no guard of the direction lives and no end
    /// that began after this one left it without guards, and once per enablement.
    fn finish(
        counts: &mut GuardCounts<usize>,
        model: &mut HashMap<Pair, Enablement>,
        disabled: &mut HashSet<usize>,
        (closing, pair, id): (Closing, Pair, usize),
    ) -> Result<(), TestCaseError> {
        let expected = model
            .get(&pair)
            .filter(|m| m.live == 0 && m.latest_waiter == Some(id))
            .map(|m| m.hold);
        let ended = counts.finish_end(closing);
        prop_assert_eq!(
            ended,
            expected,
            "disabled exactly without guards and later waiters"
        );
        if let Some(hold) = ended {
            prop_assert!(
                model.get(&pair).is_some_and(|m| m.live == 0),
                "never while a guard lives"
            );
            prop_assert!(disabled.insert(hold), "once per enablement");
            model.remove(&pair);
        }
        Ok(())
    }

    proptest! {
        /// Against a model, with ends that wait (begin, then finish later) interleaved with adds and
        /// other ends: a direction is enabled exactly from its first guard until one end disables it;
        /// its hold is made by the first guard only, shared by every guard until then (guards made
        /// while the last one waits included) and handed back (the driver disable) by exactly one end:
        /// the one that, when its wait is over, finds no live guard and no end that began waiting after
        /// it. A failed hold records nothing.
        #[test]
        fn guard_counts_follow_the_model(
            ops in proptest::collection::vec((0..PAIRS.len(), 0u8..5, 0usize..64), 0..128)
        ) {
            let mut counts: GuardCounts<usize> = GuardCounts::new();
            let mut model: HashMap<Pair, Enablement> = HashMap::new();
            // Ends that have begun and wait: the claim, its direction and the end's number.
            let mut waiting: Vec<(Closing, Pair, usize)> = Vec::new();
            let mut disabled: HashSet<usize> = HashSet::new();
            let (mut holds_made, mut ends) = (0usize, 0usize);
            for (pair, op, pick) in ops {
                let pair = PAIRS[pair];
                let live = model.get(&pair).map_or(0, |m| m.live);
                match op {
                    // A guard is made.
                    0 => {
                        let hold = *counts.add(pair, || -> Result<usize, ()> {
                            holds_made += 1;
                            Ok(holds_made)
                        }).unwrap();
                        let m = model.entry(pair).or_insert(Enablement {
                            live: 0,
                            hold: holds_made,
                            latest_waiter: None,
                        });
                        m.live += 1;
                        prop_assert_eq!(hold, m.hold, "one hold per enablement");
                    }
                    // A guard whose hold cannot be made: asked for only where the direction is not
                    // enabled (closing counts as enabled: the new guard joins).
                    1 => {
                        let joined = counts.add(pair, || Err::<usize, &str>("no hold")).is_ok();
                        prop_assert_eq!(joined, model.contains_key(&pair));
                        if joined {
                            model.get_mut(&pair).unwrap().live += 1;
                        }
                    }
                    // A guard ends; the last one waits (its end finishes later).
                    2 | 4 => {
                        let began = counts.begin_end(pair).map(|(closing, &hold)| (closing, hold));
                        prop_assert_eq!(began.is_some(), live == 1, "the last guard waits");
                        if live > 0 {
                            model.get_mut(&pair).unwrap().live -= 1;
                        }
                        if let Some((closing, hold)) = began {
                            let m = model.get_mut(&pair).unwrap();
                            prop_assert_eq!(hold, m.hold);
                            ends += 1;
                            m.latest_waiter = Some(ends);
                            if op == 2 {
                                waiting.push((closing, pair, ends));
                            } else {
                                // Finished at once, as an end with nothing to wait for does.
                                finish(&mut counts, &mut model, &mut disabled, (closing, pair, ends))?;
                            }
                        }
                    }
                    // A waiting end (any of them) finishes its wait.
                    _ => {
                        if !waiting.is_empty() {
                            let end = waiting.remove(pick % waiting.len());
                            finish(&mut counts, &mut model, &mut disabled, end)?;
                        }
                    }
                }
                for pair in PAIRS {
                    prop_assert_eq!(counts.is_enabled(pair), model.contains_key(&pair));
                    prop_assert_eq!(counts.live(pair), model.get(&pair).map_or(0, |m| m.live));
                }
            }
            // Every wait ends: then exactly the directions with live guards are enabled, and every
            // other enablement was disabled, once.
            for end in waiting {
                finish(&mut counts, &mut model, &mut disabled, end)?;
            }
            for pair in PAIRS {
                let live = model.get(&pair).map_or(0, |m| m.live);
                prop_assert_eq!(counts.is_enabled(pair), live > 0, "no enablement is left unended");
            }
            prop_assert_eq!(disabled.len() + model.len(), holds_made);
        }
    }

    #[test]
    fn overlapping_guards_disable_once() {
        let mut counts: GuardCounts<&str> = GuardCounts::new();
        counts.add((1, 2), || Ok::<_, ()>("first")).unwrap();
        let second = counts.add((1, 2), || Ok::<_, ()>("second")).unwrap();
        assert_eq!(
            *second, "first",
            "the second guard shares the first one's hold"
        );
        counts.add((2, 1), || Ok::<_, ()>("other")).unwrap();
        assert!(
            counts.begin_end((1, 2)).is_none(),
            "a guard of 1 -> 2 is still live"
        );
        assert!(counts.is_enabled((1, 2)));
        let (closing, hold) = counts.begin_end((1, 2)).unwrap();
        assert_eq!(*hold, "first", "the last guard of 1 -> 2 ended");
        assert!(
            counts.is_enabled((1, 2)),
            "enabled while the last guard waits"
        );
        assert_eq!(
            counts.finish_end(closing),
            Some("first"),
            "and disabled after"
        );
        assert!(!counts.is_enabled((1, 2)));
        assert!(
            counts.is_enabled((2, 1)),
            "the other direction is untouched"
        );
        assert!(counts.begin_end((1, 2)).is_none(), "nothing to end");
        assert!(
            counts.add((3, 4), || Err::<&str, _>("refused")).is_err(),
            "a hold that cannot be made records no guard"
        );
        assert!(!counts.is_enabled((3, 4)));
    }

    /// The ABA case: the last guard E1 waits; a guard G of the same direction is made and ends (so it
    /// is the last again, and waits too) before E1's wait is over. E1 must not disable (its wait may
    /// have begun before G's work was queued); G's end, whose wait began after it, does.
    #[test]
    fn a_guard_made_during_the_last_ones_wait_takes_over_the_disable() {
        let mut counts: GuardCounts<&str> = GuardCounts::new();
        counts.add((1, 2), || Ok::<_, ()>("first")).unwrap();
        let (e1, _) = counts.begin_end((1, 2)).unwrap();
        let g = counts
            .add((1, 2), || Err::<&str, _>("the direction is still enabled"))
            .unwrap();
        assert_eq!(
            *g, "first",
            "G joins the closing direction and shares its hold"
        );
        let (g_end, _) = counts.begin_end((1, 2)).unwrap();
        assert_eq!(
            counts.finish_end(e1),
            None,
            "E1 comes back: G's work may postdate its wait"
        );
        assert!(counts.is_enabled((1, 2)), "still enabled for G's wait");
        assert_eq!(counts.finish_end(g_end), Some("first"), "G's end disables");
        assert!(!counts.is_enabled((1, 2)));

        // G still live when E1's wait is over: E1 leaves it enabled, and G's end waits and disables.
        counts.add((1, 2), || Ok::<_, ()>("second")).unwrap();
        let (e1, _) = counts.begin_end((1, 2)).unwrap();
        counts.add((1, 2), || Err::<&str, _>("joins")).unwrap();
        assert_eq!(counts.finish_end(e1), None, "never while a guard lives");
        assert_eq!(counts.live((1, 2)), 1);
        let (g_end, _) = counts.begin_end((1, 2)).unwrap();
        assert_eq!(counts.finish_end(g_end), Some("second"));
    }

    /// A wait that is over after a later end disabled its direction, and after a new enablement of it
    /// began and is waiting in turn, disables nothing: generations never repeat.
    #[test]
    fn a_stale_wait_never_ends_a_later_enablement() {
        let mut counts: GuardCounts<&str> = GuardCounts::new();
        counts.add((1, 2), || Ok::<_, ()>("first")).unwrap();
        let (e1, _) = counts.begin_end((1, 2)).unwrap();
        counts.add((1, 2), || Err::<&str, _>("joins")).unwrap();
        let (g_end, _) = counts.begin_end((1, 2)).unwrap();
        assert_eq!(
            counts.finish_end(g_end),
            Some("first"),
            "G's wait was over first"
        );
        counts.add((1, 2), || Ok::<_, ()>("second")).unwrap();
        let (h_end, _) = counts.begin_end((1, 2)).unwrap();
        assert_eq!(
            counts.finish_end(e1),
            None,
            "E1's enablement has ended already"
        );
        assert!(
            counts.is_enabled((1, 2)),
            "the new one waits for its own end"
        );
        assert_eq!(counts.finish_end(h_end), Some("second"));
        assert!(!counts.is_enabled((1, 2)));
    }
}
