//! [`ScopedGraph`]: a parked graph bound to one scope, replayed over the pages of buffers lent to
//! that scope, with every replay admitted and counted as a launch's lends are.
//!
//! The rules, and why they are sound, are [`ScopedGraph`]'s.

use core::fmt;
use core::marker::PhantomData;

use bytemuck::Pod;

use crate::device::Device;
use crate::error::Error;
use crate::module::Module;
use crate::stream::PinnedBuffer;
use crate::view::DeviceBuffer;

use super::super::lend::{Origin, Registry, Tracker, sealed};
use super::super::queue::Queue;
use super::super::scope::ScopedStream;
use super::Touch;
use super::park::{Gifts, ParkedGraph};
use super::table::Bound;

/// A buffer lent to a scope, whose page table claims ranges for a [`ScopedGraph`] and admits them
/// at each replay. The owned layer implements it; this layer never names the buffer.
pub(crate) trait Claim: Tracker {
    /// Claims every range of `ranges` (device addresses `[start, end)`, whether for writing;
    /// sharing no byte with each other) for the scope, all or none: the table's count of mapped
    /// pages now, which every admission of them carries.
    fn claim_all(&self, ranges: &[(u64, u64, bool)]) -> Result<u64, Error>;
}

/// Ranges of device addresses `[start, end)`, each with whether it is written: what a
/// [`ScopedGraph`] claims in one buffer.
type Ranges = Vec<(u64, u64, bool)>;

/// A scoped buffer given to a [`ScopedRebind`], made by the owned layer.
pub(crate) struct Lender<'scope> {
    pub(crate) pages: &'scope (dyn Claim + 'scope),
    pub(crate) streams: &'scope (dyn Registry + 'scope),
    /// The buffer's reservation, device addresses `[start, end)`.
    pub(crate) start: u64,
    pub(crate) end: u64,
    /// Whether the buffer's grants are writable.
    pub(crate) writable: bool,
}

/// A [`ParkedGraph`] being bound to a scope ([`ParkedGraph::in_scope`]): given, for the scope,
/// the scoped buffers whose pages it touches and everything else it touches, then made a
/// [`ScopedGraph`] by [`finish`](ScopedRebind::finish). See [`ScopedGraph`] for the rules.
///
/// # Lifetimes
/// `'scope` is the scope's: the parked graph and everything given are borrowed for all of it.
/// Invariant.
pub struct ScopedRebind<'scope> {
    graph: &'scope ParkedGraph,
    pub(super) gifts: Gifts<'scope>,
    lenders: Vec<Lender<'scope>>,
    /// The graph table given ([`ScopedRebind::table`]), for a graph that uploads one.
    pub(super) table: Option<Bound<'scope>>,
}

impl fmt::Debug for ScopedRebind<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedRebind")
            .field("graph", self.graph)
            .field("buffers", &self.lenders.len())
            .finish_non_exhaustive()
    }
}

/// A parked graph bound to a scope: replayed by [`ScopedStream::launch_scoped_graph`] on the
/// scope's streams, each replay admitting the ranges it touches in the scope's buffers.
///
/// A [`Graph`](super::Graph) borrows what it captured for as long as it lives, so nothing it
/// touches can leave while it lives: that rules out a buffer lent to a scope
/// ([`VirtualBuffer::in_scope`](crate::VirtualBuffer::in_scope)), whose pages are retired while the
/// scope lasts. A graph over such pages is captured once (outside the scope, over views of the
/// buffer, then [parked](super::Graph::park): it keeps the addresses only) and bound to the scope
/// with [`ParkedGraph::in_scope`]:
///
/// - **Claimed once, for the scope.** [`ScopedRebind::finish`] claims every range the graph
///   touches in each scoped buffer given, as `ScopedBuffer::write` and `read` claim theirs: the
///   ranges it writes exclusively (no other write, read or graph of the scope shares a byte), the
///   ranges it only reads shared with other reads; all of them or none, before any driver call,
///   with [`Error::PageRange`] naming the first bytes refused (a hole, a retired page, bytes lent
///   elsewhere). Everything else the graph touches (host memory, device buffers, kernels' modules)
///   is borrowed for the scope, as a [`Rebind`](super::Rebind) borrows it.
/// - **Admitted at every replay.** [`ScopedStream::launch_scoped_graph`] admits every claimed range
///   again, as a lend of a view is admitted: refused, before `cuGraphLaunch`, with the bytes named,
///   once a page of it was retired (or evicted, or mapped anew) since the graph was bound, or the
///   range was read back or reused; refused on a stream that is not the scope's
///   ([`Error::StreamRefused`]). Each admission is counted until `cuGraphLaunch` has queued the
///   replay, so a retire that runs meanwhile waits for it, then records its events on every stream
///   of the scope, after the replay.
/// - **A block table, set between replays.** A graph captured with a [`GraphTable`](super::GraphTable)
///   ([`Graph::capture_with_table`](super::Graph::capture_with_table)) reaches pages through the
///   addresses its first node uploads. Its entries are set from the scope's lends
///   ([`set_read`](ScopedGraph::set_read), [`set_write`](ScopedGraph::set_write),
///   [`clear_entry`](ScopedGraph::clear_entry)), each checked as a lend is, and every entry is
///   admitted and counted at every replay, as a claimed range is: a page the table names is
///   released only after the replays that read it.
///
/// Why no replay reaches a released page: a page is released only once every event of its retire
/// has completed; the retire marks the page under the buffer's lock (every later admission of its
/// bytes is refused), waits for the admissions counted before the mark (whose replays are queued
/// then), and records an event on every stream of the scope, the replaying one among them (a
/// replay on another stream is refused at admission). So every replay that may touch the page was
/// queued before an event the release waits for. Pages mapped or retired elsewhere in the buffer
/// disturb no claimed range, and the buffer's reservation (the addresses the graph holds) lives as
/// long as the buffer, which the scope borrows. The parked graph is borrowed for the scope, so its
/// instantiation is destroyed only after the scope's wait, and a [`ScopedGraph`] cannot leave the
/// scope (its lifetime is the scope's, invariant): no replay runs outside a scope that waits for it.
///
/// Writes are ordered as the claims order them: a range the graph writes is its alone for the
/// scope; the driver orders the replays of one graph one after the other, on any stream; a replay
/// takes the [`ScopedGraph`] by `&mut`, so replays are admitted in the order they are queued, and
/// each admission remembers its stream, so that `ScopedBuffer::read_back` orders a read after the
/// last replay (and ends the graph's claim: a replay after it is refused, not ordered).
///
/// # Lifetimes
/// `'scope` is the scope's: the parked graph, the claims and everything given are borrowed for all
/// of it, and the handle cannot leave it. Invariant.
///
/// # Examples
/// See [`ScopedRebind::buffer`].
///
/// The parked graph outlives the scope that replays it, so its instantiation is not destroyed under
/// a replay:
/// ```compile_fail,E0597
/// # use cuda_vmm::{Device, ReadWrite, Stream, VirtualBuffer, stream::Graph};
/// # fn main() -> cuda_vmm::Result<()> {
/// # let device = Device::get(0)?;
/// # let mut cache = VirtualBuffer::new(2 << 20, &[device], ReadWrite)?;
/// # cache.grow(device, 2 << 20)?;
/// # let mut stream = Stream::new(&cache.contexts()[0])?;
/// let graph = {
///     let mut kv = cache.slice_bytes_mut::<u32>(..)?;
///     Graph::capture(&mut stream, |c| c.memset(&mut kv, 0).map(drop))?.park()
/// };
/// cuda_vmm::scope(|s| {
///     let parked = graph; // moved into the closure: dropped when it ends, before the wait
///     let cache = cache.in_scope(s);
///     let mut replayed = parked.in_scope().buffer(&cache).finish()?;
///     s.on(&stream).launch_scoped_graph(&mut replayed)
/// })?;
/// # Ok(())
/// # }
/// ```
pub struct ScopedGraph<'scope> {
    graph: &'scope ParkedGraph,
    /// Per scoped buffer: where its lends come from, and the ranges claimed.
    lends: Vec<(Origin<'scope>, Ranges)>,
    /// The graph table the graph uploads, with the entries of the next replay.
    pub(super) table: Option<Bound<'scope>>,
    /// Invariant in `'scope`, as a scope's handles are. No effect on auto traits.
    _scope: PhantomData<&'scope mut &'scope ()>,
}

impl fmt::Debug for ScopedGraph<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedGraph")
            .field("graph", self.graph)
            .field(
                "ranges",
                &self.lends.iter().map(|l| l.1.len()).sum::<usize>(),
            )
            .finish_non_exhaustive()
    }
}

impl ParkedGraph {
    /// Start binding the parked graph to a scope, borrowed for all of it: see [`ScopedGraph`]. No
    /// driver call. The parked graph stays parked: bind it again (after a page it touches was
    /// retired and mapped anew, say) or, after the scope, rebind it.
    #[must_use = "a scoped graph is made by `finish`"]
    pub fn in_scope(&self) -> ScopedRebind<'_> {
        ScopedRebind {
            graph: self,
            gifts: Gifts::default(),
            lenders: Vec::new(),
            table: None,
        }
    }
}

impl<'scope> ScopedRebind<'scope> {
    /// The device the graph runs on.
    #[must_use]
    pub fn device(&self) -> Device {
        self.graph.device()
    }

    /// Gives a scoped buffer (the owned layer's `ScopedRebind::buffer`).
    pub(crate) fn lender(mut self, lender: Lender<'scope>) -> ScopedRebind<'scope> {
        self.gifts
            .scoped(lender.start, lender.end, lender.writable, true);
        self.lenders.push(lender);
        self
    }

    /// Gives the reservation of a scoped buffer whose access set does not name the graph's device:
    /// any range the graph touches there is refused by [`finish`](ScopedRebind::finish).
    pub(crate) fn unreachable(mut self, start: u64, end: u64) -> ScopedRebind<'scope> {
        self.gifts.scoped(start, end, false, false);
        self
    }

    /// As [`Rebind::reads_device`](super::Rebind::reads_device), for the scope.
    #[must_use = "the scoped graph is made by `finish`"]
    pub fn reads_device<T: Pod>(mut self, buffer: &'scope DeviceBuffer<T>) -> ScopedRebind<'scope> {
        self.gifts.device_span(buffer, false);
        self
    }

    /// As [`Rebind::writes_device`](super::Rebind::writes_device), for the scope.
    #[must_use = "the scoped graph is made by `finish`"]
    pub fn writes_device<T: Pod>(
        mut self,
        buffer: &'scope mut DeviceBuffer<T>,
    ) -> ScopedRebind<'scope> {
        let buffer: &'scope DeviceBuffer<T> = buffer;
        self.gifts.device_span(buffer, true);
        self
    }

    /// As [`Rebind::reads_host`](super::Rebind::reads_host), for the scope.
    #[must_use = "the scoped graph is made by `finish`"]
    pub fn reads_host<T: Pod>(mut self, buffer: &'scope PinnedBuffer<T>) -> ScopedRebind<'scope> {
        self.gifts.host_span(buffer, false);
        self
    }

    /// As [`Rebind::writes_host`](super::Rebind::writes_host), for the scope: the host reads it
    /// once the scope has returned.
    #[must_use = "the scoped graph is made by `finish`"]
    pub fn writes_host<T: Pod>(
        mut self,
        buffer: &'scope mut PinnedBuffer<T>,
    ) -> ScopedRebind<'scope> {
        let buffer: &'scope PinnedBuffer<T> = buffer;
        self.gifts.host_span(buffer, true);
        self
    }

    /// As [`Rebind::module`](super::Rebind::module), for the scope.
    #[must_use = "the scoped graph is made by `finish`"]
    pub fn module(mut self, module: &'scope Module) -> ScopedRebind<'scope> {
        self.gifts.module(module);
        self
    }

    /// The [`ScopedGraph`]: every range the graph touches covered by what was given (as
    /// [`Rebind::finish`](super::Rebind::finish) checks it), then the ranges in each scoped buffer
    /// claimed for the scope, all of a buffer's or none. No driver call.
    ///
    /// # Errors
    /// As [`Rebind::finish`](super::Rebind::finish) for what is not covered (a range of a scoped
    /// buffer written by the graph but granted read-only, or outside the graph's device's reach:
    /// [`Error::GraphRange`]); [`Error::PageRange`] naming the first bytes of a scoped buffer that
    /// are not on a live page, or are lent elsewhere in the scope (for writing; or, for a range the
    /// graph writes, for reading). A buffer claimed before another's refusal keeps its claims for
    /// the scope.
    pub fn finish(self) -> Result<ScopedGraph<'scope>, Error> {
        let inner = &self.graph.inner;
        self.gifts.check(inner)?;
        if let Some(bound) = &self.table
            && inner.table.as_ref().map(|t| t.table) != Some(bound.id())
        {
            return Err(Error::InvalidArgument {
                what: "a graph table given to a graph that does not upload it",
            });
        }
        let mut lends = Vec::with_capacity(self.lenders.len());
        for lender in &self.lenders {
            let ranges = claimed_ranges(inner.touches(), lender.start, lender.end);
            if ranges.is_empty() {
                continue;
            }
            let epoch = lender.pages.claim_all(&ranges)?;
            let origin = Origin {
                pages: lender.pages,
                streams: lender.streams,
                epoch,
            };
            lends.push((origin, ranges));
        }
        Ok(ScopedGraph {
            graph: self.graph,
            lends,
            table: self.table,
            _scope: PhantomData,
        })
    }
}

impl ScopedGraph<'_> {
    /// The device the graph runs on.
    #[must_use]
    pub fn device(&self) -> Device {
        self.graph.device()
    }

    /// The ranges claimed in the scope's buffers, device addresses `[start, end)`, and whether
    /// each is written: what every replay admits.
    pub fn claimed(&self) -> impl Iterator<Item = (u64, u64, bool)> + '_ {
        self.lends
            .iter()
            .flat_map(|(_, ranges)| ranges.iter().copied())
    }
}

impl<'scope> ScopedStream<'scope> {
    /// `cuGraphLaunch` — replay `graph` on this stream, which the scope waits for: every range it
    /// touches in the scope's buffers is admitted first, as a lend of a view is, and counted until
    /// the replay is queued, so a retire orders its release after it (see [`ScopedGraph`]).
    ///
    /// The graph is taken by `&mut`, so its replays are admitted and queued one at a time: the
    /// stream the last admission of a written range remembers (which a read back of it is ordered
    /// after) is the last replay's, and the driver orders every earlier replay of the graph, on any
    /// stream, before that one.
    ///
    /// # Errors
    /// Before any driver call: [`Error::DeviceMismatch`] for a graph of another device;
    /// [`Error::StreamRefused`] where this stream is not a stream of the buffers' scope;
    /// [`Error::PageRange`] naming the first bytes of a claimed range whose page was retired,
    /// evicted or mapped anew since the graph was bound, or that was read back or reused.
    /// [`Error::StreamCapturing`] where this stream is capturing; the driver's error otherwise.
    ///
    /// # Examples
    /// See [`ScopedRebind::buffer`].
    #[doc(alias = "cuGraphLaunch")]
    pub fn launch_scoped_graph(&self, graph: &mut ScopedGraph<'scope>) -> Result<(), Error> {
        if graph.device() != self.device() {
            return Err(Error::DeviceMismatch {
                expected: self.device().as_raw(),
                found: graph.device().as_raw(),
            });
        }
        let stream = self.id();
        if let Some(table) = &graph.table {
            table.check_stream(stream)?;
        }
        // Each admission is counted until the replay is queued (dropped below), or given up.
        let mut counted = sealed::Counted(None, Vec::new());
        for (origin, ranges) in &graph.lends {
            for &(start, end, written) in ranges {
                let bytes =
                    usize::try_from(end.saturating_sub(start)).map_err(|_| Error::Overflow {
                        what: "graph range",
                    })?;
                let slot = origin.admit_bytes(start, bytes, stream, written)?;
                counted.1.push((origin.pages, slot));
            }
        }
        if let Some(table) = &graph.table {
            table.admit(stream, &mut counted)?;
        }
        Queue::admit(self)?;
        // SAFETY: the parked graph's instantiation, of this stream's device (checked above), whose
        // context is current (`Queue::admit` bound it). Its work touches only (a) the
        // memory, host and device, and kernels' modules given for `'scope` and checked to cover
        // every range outside the scoped buffers (`finish`), borrowed until the scope has waited for
        // this stream, and (b) ranges of scoped buffers, claimed for the scope and admitted just
        // now: on live pages mapped before the graph was bound, not read back or reused since, and
        // counted until this call has queued the replay, so a retire of them waits for it and
        // records its events on this stream (a stream of their scope, checked) after it. The
        // instantiation is borrowed for `'scope` too, so it is destroyed only after the wait.
        // With a graph table (c), the entries its upload writes are admitted and counted as (b),
        // and the staging buffer it reads is written only once no queued replay reads it.
        let launched = match &mut graph.table {
            // SAFETY: as above; the table's entries were admitted for this replay, on its stream.
            Some(table) => unsafe { table.launch(&graph.graph.inner) },
            // SAFETY: as above.
            None => unsafe { graph.graph.inner.launch(self.as_raw()) },
        };
        drop(counted);
        launched
    }
}

/// The ranges a graph touching `touches` claims in a buffer reserved at device addresses
/// `[start, end)`: the device bytes it writes there, merged where they overlap or touch, claimed
/// for writing; the bytes it only reads, merged, claimed for reading. Sorted, disjoint. Touches
/// reaching past the reservation are not the buffer's (the rebind's check refuses them).
///
/// Written ranges that touch become one claim, so that a replay admits as few ranges as the
/// graph's memory allows (each admission takes the buffer's lock): a graph that writes 64 adjacent
/// blocks admits one range. Such a claim is read back or reused whole, as one `write` would be.
fn claimed_ranges<'a>(touches: impl Iterator<Item = &'a Touch>, start: u64, end: u64) -> Ranges {
    let mut written = Vec::new();
    let mut read = Vec::new();
    for touch in touches {
        if touch.host || touch.start >= touch.end || touch.start < start || touch.end > end {
            continue;
        }
        let into = if touch.written {
            &mut written
        } else {
            &mut read
        };
        into.push((touch.start, touch.end));
    }
    let written = merged(written);
    let mut ranges: Ranges = written.iter().map(|&(s, e)| (s, e, true)).collect();
    for (s, e) in merged(read) {
        // The bytes of `[s, e)` that no written range holds.
        let mut at = s;
        for &(ws, we) in written.iter().filter(|w| w.0 < e && w.1 > s) {
            if ws > at {
                ranges.push((at, ws, false));
            }
            at = at.max(we);
        }
        if at < e {
            ranges.push((at, e, false));
        }
    }
    ranges.sort_unstable_by_key(|r| r.0);
    ranges
}

/// `ranges` sorted and merged where they overlap or touch.
fn merged(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (s, e) in ranges {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{Touch, claimed_ranges};

    fn device(start: u64, end: u64, written: bool) -> Touch {
        Touch {
            start,
            end,
            written,
            host: false,
        }
    }

    #[test]
    fn writes_are_merged_and_reads_keep_only_the_bytes_no_write_holds() {
        let touches = [
            device(100, 200, false), // read around a written range
            device(120, 140, true),
            device(140, 150, true), // touches the write before: merged
            device(180, 190, true),
            device(300, 310, false),
            device(305, 320, false), // overlaps the read before: merged
            device(500, 600, true),  // past the reservation: not the buffer's
            device(50, 90, false),   // before it
            device(400, 400, true),  // empty
            Touch {
                start: 200,
                end: 260,
                written: true,
                host: true, // host memory is never the buffer's
            },
        ];
        let ranges = claimed_ranges(touches.iter(), 100, 500);
        assert_eq!(
            ranges,
            vec![
                (100, 120, false),
                (120, 150, true),
                (150, 180, false),
                (180, 190, true),
                (190, 200, false),
                (300, 320, false),
            ]
        );
    }

    #[test]
    fn a_range_read_and_written_is_claimed_for_writing_once() {
        let touches = [
            device(0, 64, true),
            device(0, 64, false),
            device(16, 32, false),
        ];
        assert_eq!(claimed_ranges(touches.iter(), 0, 64), vec![(0, 64, true)]);
        assert_eq!(claimed_ranges(touches.iter(), 64, 128), vec![]);
    }
}
