//! The retires of a [`VirtualBuffer`](super::VirtualBuffer) still waiting for the GPU: each one a
//! [`Ticket`] (which its pages carry in the page table), the events recorded after the work it
//! waits for, and host memory that work reads. The page table asks which have finished and
//! releases their pages; nothing here touches a page.
//!
//! The events are shared (`Arc`), so that the reserve's worker can query them without the table's
//! lock: it takes clones under the lock ([`Retires::queries`]), queries them without it
//! ([`finished`]), and takes the retires found finished under the lock again
//! ([`Retires::take`]). A clone keeps its event alive, and an event is kept for a later retire
//! only while no clone of it is held, so no event is recorded again while a query of the old
//! record may still read it.

use std::sync::Arc;

use crate::device::Context;
use crate::error::{Error, first_error};
use crate::stream::{Event, PinnedBuffer, Stream, StreamId};

/// The number of one retire: its pages carry it, and are released once every event recorded for it
/// has completed. Tickets are given in increasing order: a later retire's is greater.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Ticket(u64);

/// Calls its argument with each stream a retire orders its release after; the first error, every
/// stream tried.
pub(super) type EachStream<'a> =
    &'a dyn Fn(&mut dyn FnMut(&Stream) -> Result<(), Error>) -> Result<(), Error>;

/// Events kept for later retires, at most.
const SPARE_EVENTS: usize = 64;

/// One retire whose events have not all been seen complete: its ticket, an event recorded after the
/// work it waits for on each stream that work may run on (with the stream it was recorded on, where
/// known), and host memory that work reads (the source of a stream-ordered restore's copies), freed
/// with it.
struct Retiring {
    ticket: Ticket,
    events: Vec<Arc<Event>>,
    /// The stream each event of `events` was recorded on, in the same order; empty where the
    /// streams are not known (each event is then queried).
    streams: Vec<StreamId>,
    host: Option<PinnedBuffer<u8>>,
    /// A retire at the scope's end ([`defer`](Retires::defer)): no event, and not finished until
    /// [`scope_ended`](Retires::scope_ended).
    until_scope_end: bool,
}

/// The retires waiting for their events, oldest first, and the events of finished ones, kept for
/// the next.
#[derive(Default)]
pub(super) struct Retires {
    waiting: Vec<Retiring>,
    /// Each held here alone (no clone of it lives): clones are made only of the events of retires
    /// that wait, and only under the table's lock, as this list is changed.
    spare_events: Vec<Arc<Event>>,
    /// The last ticket given.
    tickets: u64,
    /// How many retires of `waiting` wait for the scope's end.
    deferred: usize,
}

impl Retires {
    /// Whether no retire waits for events: none, or only retires at the scope's end, which no
    /// query can finish (the worker of a reserve sleeps long then, and is woken at the end).
    pub(super) fn is_empty(&self) -> bool {
        self.waiting.len() <= self.deferred
    }

    /// The retire `ticket` finishes once the scope whose handle made it has ended: its pages were
    /// lent only to work queued on the scope's streams, which the scope's wait outlasts. No event.
    pub(super) fn defer(&mut self, ticket: Ticket) {
        self.waiting.push(Retiring {
            ticket,
            events: Vec::new(),
            streams: Vec::new(),
            host: None,
            until_scope_end: true,
        });
        self.deferred = self.deferred.saturating_add(1);
    }

    /// The scope that made every retire at the scope's end has ended (the buffer is borrowed
    /// exclusively again, which its scoped handle ruled out until the scope's wait had returned):
    /// they are finished from now on. Whether there were any.
    #[inline]
    pub(super) fn scope_ended(&mut self) -> bool {
        if self.deferred == 0 {
            return false;
        }
        for retire in &mut self.waiting {
            retire.until_scope_end = false;
        }
        self.deferred = 0;
        true
    }

    /// The last ticket given (`Ticket(0)` before the first): every retire made so far has it or
    /// an earlier one, every later retire a greater one.
    pub(super) fn last(&self) -> Ticket {
        Ticket(self.tickets)
    }

    /// A new ticket, for the pages of the next retire.
    pub(super) fn ticket(&mut self) -> Ticket {
        self.tickets = self.tickets.wrapping_add(1);
        Ticket(self.tickets)
    }

    /// `cuEventRecord` on each stream `each` names, after the work queued so far: the retire
    /// `ticket` finishes once every event has completed. Each record is counted in `recorded`. A
    /// refused record, or a capture begun meanwhile, waits for every stream here instead (the one
    /// wait), and returns the record's error.
    pub(super) fn record(
        &mut self,
        ticket: Ticket,
        each: EachStream<'_>,
        recorded: &mut u64,
    ) -> Result<(), Error> {
        let mut events = Vec::new();
        let mut streams = Vec::new();
        let spare = &mut self.spare_events;
        let result = each(&mut |stream| {
            let event = match spare.iter().position(|e| e.device() == stream.device()) {
                Some(index) => spare.swap_remove(index),
                None => Arc::new(Event::new(stream.context())?),
            };
            *recorded = recorded.saturating_add(1);
            stream.record(&event)?;
            events.push(event);
            streams.push(stream.id());
            Ok(())
        });
        // A record refused, or a capture begun meanwhile (which may have taken the record as a
        // node): the events prove nothing, so every stream is waited for here, by the one wait,
        // which returns only once the work has finished (or aborts).
        let mut captured = false;
        let _ = each(&mut |stream| {
            captured |= stream.is_capturing().unwrap_or(true);
            Ok(())
        });
        if result.is_err() || captured {
            let _ = each(&mut |stream| stream.synchronize());
            events.clear();
            streams.clear();
        }
        self.waiting.push(Retiring {
            ticket,
            events,
            streams,
            host: None,
            until_scope_end: false,
        });
        result
    }

    /// Keeps `host` until `done` has completed (the source of a stream-ordered restore's copies,
    /// `done` recorded after them): a retire of no page, freed once finished or at the drop.
    pub(super) fn keep_until(&mut self, done: Event, host: PinnedBuffer<u8>) {
        let ticket = self.ticket();
        self.waiting.push(Retiring {
            ticket,
            events: vec![Arc::new(done)],
            streams: Vec::new(),
            host: Some(host),
            until_scope_end: false,
        });
    }

    /// A spare event of `context`'s device, or a new one.
    pub(super) fn spare_event(&mut self, context: &Context) -> Result<Event, Error> {
        let device = context.device();
        let spare = match self.spare_events.iter().position(|e| e.device() == device) {
            Some(index) => Arc::try_unwrap(self.spare_events.swap_remove(index)).ok(),
            None => None,
        };
        // A spare event is held here alone, so it unwraps; were it not, a new one is made.
        spare.map_or_else(|| Event::new(context), Ok)
    }

    /// `cuEventQuery` — takes every retire whose events have all completed (a retire at the
    /// scope's end once the scope has ended): their tickets, oldest first, whose pages the work no
    /// longer uses. Their host memory is freed and their events kept
    /// for later retires. An event whose query fails is not known complete: its retire waits for
    /// the drop.
    ///
    /// One query per stream that still runs, not one per event: once an event of a stream is seen
    /// incomplete, the later retires' events of that stream are not queried in this pass (each
    /// was recorded after it, so it cannot have completed first), and their retires wait for the
    /// next pass. Skipping a query only ever leaves a retire waiting, never takes one: the
    /// ordering is a saving, not a proof anything rests on.
    pub(super) fn take_finished(&mut self) -> Vec<Ticket> {
        let done = finished_of(
            self.awaiting_events()
                .map(|r| (r.ticket, r.events.as_slice(), r.streams.as_slice())),
        );
        self.take(&done)
    }

    /// The retires that wait for their events, oldest first (not those at the scope's end).
    fn awaiting_events(&self) -> impl Iterator<Item = &Retiring> {
        self.waiting.iter().filter(|r| !r.until_scope_end)
    }

    /// The events of every retire that waits for them, cloned, oldest first (none for a retire at
    /// the scope's end): what [`finished`] queries without the table's lock.
    pub(super) fn queries(&self) -> Vec<Query> {
        if self.is_empty() {
            return Vec::new();
        }
        self.awaiting_events()
            .map(|r| Query {
                ticket: r.ticket,
                events: r.events.clone(),
                streams: r.streams.clone(),
            })
            .collect()
    }

    /// Takes the retires of `done` (found finished: every event completed) that still wait here:
    /// their tickets, oldest first. Their host memory is freed, and their events kept for later
    /// retires where no clone of them is held (else dropped: the last clone destroys the event).
    pub(super) fn take(&mut self, done: &[Ticket]) -> Vec<Ticket> {
        let mut finished = Vec::new();
        let mut index = 0usize;
        while let Some(retire) = self.waiting.get(index) {
            if retire.until_scope_end || !done.contains(&retire.ticket) {
                index = index.saturating_add(1);
                continue;
            }
            let retire = self.waiting.remove(index);
            finished.push(retire.ticket);
            // Host memory that the finished work read (a restore's source) is freed now.
            drop(retire.host);
            let room = SPARE_EVENTS.saturating_sub(self.spare_events.len());
            self.spare_events.extend(
                retire
                    .events
                    .into_iter()
                    .filter(|e| Arc::strong_count(e) == 1)
                    .take(room),
            );
        }
        finished
    }

    /// `cuEventQuery` — whether the retire `ticket` waits here and every one of its events has
    /// completed (its pages then used by no queued work), without taking it: `false` for a ticket
    /// not waiting here (its events not recorded yet, or taken already), or an event whose query
    /// fails.
    pub(super) fn is_finished(&self, ticket: Ticket) -> bool {
        self.awaiting_events().any(|retire| {
            retire.ticket == ticket
                && retire
                    .events
                    .iter()
                    .all(|event| event.is_complete().unwrap_or(false))
        })
    }

    /// Waits for the work of every retire (each event: the one wait, which returns only once it
    /// has completed, or aborts), and forgets them. Every event is tried; the first error.
    pub(super) fn wait_all(&mut self) -> Result<(), Error> {
        let waiting = core::mem::take(&mut self.waiting);
        self.deferred = 0;
        first_error(
            waiting
                .iter()
                .flat_map(|retire| retire.events.iter())
                .map(|event| event.synchronize()),
        )
    }
}

/// The events of one retire that waits, cloned under the table's lock ([`Retires::queries`]),
/// queried without it ([`finished`]).
pub(super) struct Query {
    ticket: Ticket,
    events: Vec<Arc<Event>>,
    streams: Vec<StreamId>,
}

/// `cuEventQuery` — the tickets of `queries` whose events have all completed, oldest first, with
/// the one-query-per-running-stream pass of [`Retires::take_finished`]. No lock is needed: the
/// clones keep the events alive, and an event that waits is never recorded again.
pub(super) fn finished(queries: &[Query]) -> Vec<Ticket> {
    finished_of(
        queries
            .iter()
            .map(|q| (q.ticket, q.events.as_slice(), q.streams.as_slice())),
    )
}

/// The tickets of the retires (ticket, events, their streams; oldest first) whose events have all
/// completed, querying as [`all_complete`] says.
fn finished_of<'a>(
    retires: impl Iterator<Item = (Ticket, &'a [Arc<Event>], &'a [StreamId])>,
) -> Vec<Ticket> {
    let mut running: Vec<StreamId> = Vec::new();
    retires
        .filter(|(_, events, streams)| {
            all_complete(events, streams, &mut running, |event| {
                event.is_complete().unwrap_or(false)
            })
        })
        .map(|(ticket, _, _)| ticket)
        .collect()
}

/// Whether every event of a retire (`events`, recorded on `streams` in the same order, or on
/// streams not known where `streams` is shorter) has completed, by `complete` (`cuEventQuery`;
/// a failed query counts as incomplete): none recorded on a stream of `running` (the streams
/// seen running in this pass: not complete, without a query) is queried, and the stream of the
/// first event seen incomplete is added to `running`. Generic over the event so that the skipping
/// is unit-tested without a device.
fn all_complete<E>(
    events: &[E],
    streams: &[StreamId],
    running: &mut Vec<StreamId>,
    mut complete: impl FnMut(&E) -> bool,
) -> bool {
    for (index, event) in events.iter().enumerate() {
        let stream = streams.get(index).copied();
        if stream.is_some_and(|stream| running.contains(&stream)) {
            return false;
        }
        if !complete(event) {
            if let Some(stream) = stream {
                running.push(stream);
            }
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::cell::Cell;

    fn stream(n: usize) -> StreamId {
        StreamId::new(core::ptr::null_mut(), core::ptr::without_provenance_mut(n))
    }

    /// A retire's events as (name, complete), and their streams.
    type Fake<'a> = (&'a [(u32, bool)], &'a [StreamId]);

    /// One pass over `retires`: whether each is done, and the names queried, in order.
    fn pass(retires: &[Fake<'_>]) -> (Vec<bool>, Vec<u32>) {
        let queried = core::cell::RefCell::new(Vec::new());
        let mut running = Vec::new();
        let done = retires
            .iter()
            .map(|(events, streams)| {
                all_complete(events, streams, &mut running, |&(name, complete)| {
                    queried.borrow_mut().push(name);
                    complete
                })
            })
            .collect();
        (done, queried.into_inner())
    }

    #[test]
    fn a_retire_at_the_scope_end_finishes_only_once_the_scope_has_ended() {
        let mut retires = Retires::default();
        let (first, second) = (retires.ticket(), retires.ticket());
        retires.defer(first);
        retires.defer(second);
        assert!(retires.is_empty(), "no retire waits for an event");
        assert!(!retires.is_finished(first), "not before the end");
        assert!(retires.take_finished().is_empty(), "not before the end");
        assert!(retires.scope_ended());
        assert!(!retires.scope_ended(), "once");
        assert!(retires.is_finished(second));
        assert_eq!(retires.take_finished(), [first, second]);
        assert!(retires.is_empty());
        // A later scope's retire waits for that scope's end in turn.
        let third = retires.ticket();
        retires.defer(third);
        assert!(retires.take_finished().is_empty());
        assert!(retires.wait_all().is_ok(), "the drop: nothing to wait for");
        assert!(!retires.scope_ended(), "the drop forgot it");
    }

    #[test]
    fn the_workers_queries_take_only_the_retires_still_waiting_oldest_first() {
        let mut retires = Retires::default();
        let (first, second, third) = (retires.ticket(), retires.ticket(), retires.ticket());
        for ticket in [first, second, third] {
            retires.defer(ticket);
        }
        // Before the scope's end nothing is queried, and nothing is taken, also when named.
        assert!(retires.queries().is_empty());
        assert!(retires.take(&[first]).is_empty());
        assert!(retires.scope_ended());
        let queries = retires.queries();
        assert_eq!(
            finished(&queries),
            [first, second, third],
            "no event: finished"
        );
        // Taken oldest first, whatever the order named; a ticket taken meanwhile is not again.
        assert_eq!(retires.take(&[third, first]), [first, third]);
        assert!(retires.take(&[first]).is_empty());
        assert_eq!(retires.take_finished(), [second]);
        assert!(retires.is_empty());
        // A later scope's retire named by a stale query is not taken before its scope's end.
        let fourth = retires.ticket();
        retires.defer(fourth);
        assert!(retires.take(&[fourth]).is_empty());
    }

    #[test]
    fn a_stream_seen_running_is_not_queried_again_in_the_pass() {
        let (a, b) = (stream(1), stream(2));
        // Retire 1 finished on a; retire 2 still runs on a; retire 3 on a is later: not queried.
        let (done, queried) = pass(&[
            (&[(1, true)], &[a]),
            (&[(2, false)], &[a]),
            (&[(3, true)], &[a]),
        ]);
        assert_eq!(done, [true, false, false]);
        assert_eq!(queried, [1, 2]);
        // Another stream is still queried: its events are not ordered after a's.
        let (done, queried) = pass(&[(&[(1, false)], &[a]), (&[(2, true)], &[b])]);
        assert_eq!(done, [false, true]);
        assert_eq!(queried, [1, 2]);
    }

    #[test]
    fn a_retire_over_two_streams_waits_for_both_and_stops_at_the_first_running() {
        let (a, b) = (stream(1), stream(2));
        let (done, queried) = pass(&[
            (&[(1, true), (2, false)], &[a, b]),
            // a is not known running (its event completed): queried; b is: this retire waits.
            (&[(3, true), (4, true)], &[a, b]),
            (&[(5, true)], &[a]),
        ]);
        assert_eq!(done, [false, false, true]);
        assert_eq!(queried, [1, 2, 3, 5]);
    }

    #[test]
    fn events_of_streams_not_known_are_each_queried() {
        let a = stream(1);
        // A retire kept for host memory (`keep_until`) names no stream: an incomplete event of it
        // marks no stream running, and a later retire on `a` is still queried.
        let (done, queried) = pass(&[(&[(1, false)], &[]), (&[(2, true)], &[a])]);
        assert_eq!(done, [false, true]);
        assert_eq!(queried, [1, 2]);
        // A skip never takes a retire: with every event incomplete, none is done.
        let calls = Cell::new(0);
        let mut running = Vec::new();
        for _ in 0..3 {
            assert!(!all_complete(&[(); 2], &[a, a], &mut running, |()| {
                calls.set(calls.get() + 1);
                false
            }));
        }
        assert_eq!(calls.get(), 1);
    }
}
