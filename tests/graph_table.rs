//! Graph tables (`GraphTable`, `Graph::capture_with_table`, `ScopedGraph::set_read`/`set_write`)
//! against a real driver: a decode step captured once and replayed every step while the cache
//! grows, its table's entries set from lent views between the replays and its outputs checked; a
//! page a queued replay reaches through the table, retired under it, released only after the
//! replay, and the next replay refused naming the page until its entry is cleared; the refusals of
//! every new rule, before any driver call where they are run-time facts (a wrong length, an index
//! past the capacity, another stream, a graph with a table replayed or rebound outside a scope,
//! the host `depth` replays ahead); 10 000 rounds of entries, replays, retires and refusals that
//! leak nothing; 16 threads replaying their own table graphs in one scope while the buffer grows
//! and retires. The kernel is `examples/kernels/decode_step.ptx`.
//! Every test skips visibly without a GPU. The tests take one lock, since some measure free memory.

mod common;

use std::ffi::CString;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use common::{gpu_or_skip, pattern};
use cuda_vmm::stream::{Graph, GraphTable, ParkedGraph};
use cuda_vmm::{
    Context, Device, Error, Event, Granularity, Module, PinnedBuffer, ReadWrite, Stream,
    VirtualBuffer, allocation_granularity,
};

/// `decode_step(const u64 *table, u32 seqs, u32 hist, u32 len, u64 ns)`: with one sequence, entry
/// 0 is the block it appends to, 1 the new token, 2 the output block, 3.. the history; the output
/// is the new token plus every non-null history block, wrapping.
const STEP_PTX: &str = include_str!("../examples/kernels/decode_step.ptx");
const GRID: (u32, u32, u32) = (8, 1, 1);
const BLOCK: (u32, u32, u32) = (256, 1, 1);
/// The `u32`s of one block, and the history entries of the one sequence.
const LEN: usize = 1024;
const HIST: usize = 8;
const OUT: usize = 2;
const HISTORY: usize = 3;
/// How long the replay that stands for a long decode step runs: long enough that a release that did
/// not wait for it shows.
const SPIN: Duration = Duration::from_millis(300);

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

fn granularity(device: Device) -> usize {
    allocation_granularity(device, Granularity::Minimum).unwrap()
}

fn free_memory(ctx: &Context) -> usize {
    ctx.memory_info().unwrap().0
}

/// The bytes a `PageRange` refusal names, `None` for anything else.
fn page_range<T>(result: &Result<T, Error>) -> Option<(usize, usize)> {
    match result {
        Err(Error::PageRange { start, end, .. }) => Some((*start, *end)),
        _ => None,
    }
}

/// Whether `result` is a `PageRange` refusal naming bytes of the page at `page` (of `g` bytes).
fn names_page<T>(result: &Result<T, Error>, page: usize, g: usize) -> bool {
    page_range(result).is_some_and(|(start, end)| start >= page && start < end && end <= page + g)
}

/// The element-wise wrapping sum of `blocks`.
fn sum(blocks: &[Vec<u32>]) -> Vec<u32> {
    let mut out = vec![0u32; LEN];
    for block in blocks {
        for (o, v) in out.iter_mut().zip(block) {
            *o = o.wrapping_add(*v);
        }
    }
    out
}

/// The module, a table of `depth` staging buffers, and the one-sequence decode step captured over
/// it (spinning `spin` first), parked.
fn step_graph(
    ctx: &Context,
    depth: usize,
    spin: Duration,
) -> (Module, GraphTable<u32>, ParkedGraph) {
    let module = Module::load_ptx(ctx, &CString::new(STEP_PTX).unwrap()).unwrap();
    let mut table = GraphTable::<u32>::new(ctx, HISTORY + HIST, LEN, depth).unwrap();
    let mut capturing = Stream::new(ctx).unwrap();
    let ns = u64::try_from(spin.as_nanos()).unwrap();
    let parked = {
        let step = module.function(c"decode_step").unwrap();
        Graph::capture_with_table(&mut capturing, &mut table, |c, t| {
            // SAFETY: decode_step(const u64*, u32, u32, u32, u64); through non-null entries only,
            // writing entries 0 and 2, which the tests set for writing.
            unsafe { c.launch(&step, GRID, BLOCK, (t, 1u32, HIST as u32, LEN as u32, ns))? };
            Ok(())
        })
        .unwrap()
        .park()
    };
    (module, table, parked)
}

/// The byte range of block `i` of the page at `page`.
fn block(page: usize, i: usize) -> core::ops::Range<usize> {
    let at = page + i * LEN * 4;
    at..at + LEN * 4
}

/// One graph, captured once, replayed every step of one scope while a page is mapped per step: the
/// step's K/V written into the new page, read back into the table's history, the output written
/// into a page mapped before the scope. Each step's output (the sum of the history so far) is read
/// back and checked; the graph is never captured again.
#[test]
fn a_graph_is_replayed_every_step_while_the_cache_grows() {
    const STEPS: usize = HIST;
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("a_graph_is_replayed_every_step_while_the_cache_grows")
    else {
        return;
    };
    let g = granularity(device);
    let (module, mut table, parked) = step_graph(&ctx, 2, Duration::ZERO);
    let mut cache = VirtualBuffer::new((STEPS + 1) * g, &[device], ReadWrite).unwrap();
    cache.grow(device, g).unwrap(); // the outputs' page
    let tokens: Vec<Vec<u32>> = (0..STEPS).map(|t| pattern(LEN, 40 + t as u32)).collect();
    let inputs: Vec<PinnedBuffer<u32>> = tokens
        .iter()
        .map(|t| PinnedBuffer::from_slice(&ctx, t).unwrap())
        .collect();
    let mut outs = PinnedBuffer::<u32>::zeroed(&ctx, STEPS * LEN).unwrap();
    let work = Stream::new(&ctx).unwrap();
    let paced = [Event::new(&ctx).unwrap(), Event::new(&ctx).unwrap()];
    let mut chunks: Vec<_> = outs.chunks_mut(LEN).unwrap().map(Some).collect();
    cuda_vmm::scope(|s| {
        let w = s.on(&work);
        let kv = cache.in_scope(s);
        let mut graph = parked
            .in_scope()
            .table(&mut table, w)
            .module(&module)
            .finish()?;
        for (step, input) in inputs.iter().enumerate() {
            if step >= 2 {
                paced[step % 2].synchronize()?; // at most two steps ahead
            }
            let page = kv.grow(device, g)?; // while the replays run
            let mut fresh = kv.write::<u32>(block(page, 0))?;
            w.copy_from_host(&mut fresh, input)?;
            graph.set_read(HISTORY + step, kv.read_back::<u32>(block(page, 0), w)?)?;
            graph.set_write(OUT, kv.write::<u32>(block(0, step))?)?;
            w.launch_scoped_graph(&mut graph)?;
            let out = kv.read_back::<u32>(block(0, step), w)?;
            w.copy_to_host(chunks[step].take().unwrap(), out)?;
            w.record(&paced[step % 2])?;
            assert_eq!(graph.table_entries(), step + 2);
        }
        assert_eq!(kv.mapped_bytes(), (STEPS + 1) * g, "a page mapped per step");
        Ok(())
    })
    .unwrap();
    for step in 0..STEPS {
        assert_eq!(
            &outs.as_slice()[step * LEN..(step + 1) * LEN],
            &sum(&tokens[..=step])[..],
            "step {step}: the sum of the history the table named"
        );
    }
    drop(parked);
    cache.free().unwrap();
}

/// A replay that reaches a page through the table runs 300 ms; the page is retired while it is
/// queued: the retire returns at once, the page stays mapped (free memory unchanged) until the
/// replay has completed, and is released then. A replay after the retire, with the entry still
/// set, is refused naming the page; once the entry is cleared the graph replays again.
///
/// What this shows is the release after a replay queued before the retire, and the refusal after
/// it; not the counting of an admission in progress while a retire runs (a retire from another
/// thread during `launch_scoped_graph`), which the 16-thread test exercises without proving.
#[test]
fn a_table_page_retired_under_a_queued_replay_is_released_after_it() {
    let _serial = serial();
    let Some((device, ctx)) =
        gpu_or_skip("a_table_page_retired_under_a_queued_replay_is_released_after_it")
    else {
        return;
    };
    let g = granularity(device);
    let (module, mut table, parked) = step_graph(&ctx, 2, SPIN);
    let mut cache = VirtualBuffer::new(2 * g, &[device], ReadWrite).unwrap();
    cache.grow(device, g).unwrap(); // the outputs' page
    let token = pattern(LEN, 9);
    let input = PinnedBuffer::from_slice(&ctx, &token).unwrap();
    let mut out = PinnedBuffer::<u32>::zeroed(&ctx, LEN).unwrap();
    let work = Stream::new(&ctx).unwrap();
    let done = Event::new(&ctx).unwrap();
    cuda_vmm::scope(|s| {
        let w = s.on(&work);
        let kv = cache.in_scope(s);
        let mut graph = parked
            .in_scope()
            .table(&mut table, w)
            .module(&module)
            .finish()?;
        let page = kv.grow(device, g)?;
        assert_eq!(page, g);
        let mut fresh = kv.write::<u32>(block(page, 0))?;
        w.copy_from_host(&mut fresh, &input)?;
        graph.set_read(HISTORY, kv.read_back::<u32>(block(page, 0), w)?)?;
        graph.set_write(OUT, kv.write::<u32>(block(0, 0))?)?;
        // The replay spins SPIN once it starts, which is after `queued`: until then it cannot have
        // completed. A host descheduled past SPIN makes the checks of "still running" prove
        // nothing, and they are then skipped, saying so (the release checks below still run).
        let queued = Instant::now();
        w.launch_scoped_graph(&mut graph)?;
        w.record(&done)?;
        assert_eq!(kv.retire(g..2 * g)?, 1, "the page the replay reads");
        let running = !done.is_complete()?;
        let in_window = queued.elapsed() < SPIN;
        assert!(running || !in_window, "the retire waited for the replay");
        let free_retired = free_memory(&ctx);
        let reclaimed = kv.reclaim()?;
        assert!(
            reclaimed == 0 || queued.elapsed() >= SPIN,
            "released while the replay runs"
        );
        if reclaimed == 0 {
            assert_eq!(
                free_memory(&ctx),
                free_retired,
                "memory moved under the replay"
            );
        }
        assert!(
            names_page(&w.launch_scoped_graph(&mut graph), g, g),
            "a replay whose table still names the retired page"
        );
        let still = !done.is_complete()?;
        assert!(
            still || queued.elapsed() >= SPIN,
            "the refusal waited for nothing"
        );
        if queued.elapsed() >= SPIN {
            eprintln!(
                "the host was descheduled past the replay's {SPIN:?}: \"still running\" not checked"
            );
        }
        // The test's own wait, standing in for time passing: the stream's, since the retire's
        // event on `work` was recorded after `done`.
        work.synchronize()?;
        assert_eq!(reclaimed + kv.reclaim()?, 1);
        assert_eq!(
            free_memory(&ctx),
            free_retired + g,
            "the page's bytes came back"
        );
        let seen = kv.read_back::<u32>(block(0, 0), w)?;
        w.copy_to_host(&mut out, seen)?;
        graph.clear_entry(HISTORY)?;
        graph.set_write(OUT, kv.write::<u32>(block(0, 1))?)?;
        w.launch_scoped_graph(&mut graph)?; // no entry names a retired page
        Ok(())
    })
    .unwrap();
    assert_eq!(out.to_vec(), token, "the replay before the retire");
    drop(parked);
    cache.free().unwrap();
}

/// Each new rule's refusal: an entry of another length (read, or written: refused before it is
/// lent), an index past the capacity, a retired page, a replay on another stream than the table's,
/// a graph with a table launched outside a scope, rebound without one, or bound in a scope without
/// its table, and a replay `depth` replays ahead of the table's stream (whose staging buffer a
/// queued replay still reads).
#[test]
fn every_graph_table_rule_refuses_before_any_driver_call() {
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("every_graph_table_rule_refuses_before_any_driver_call")
    else {
        return;
    };
    let g = granularity(device);
    let (module, mut table, parked) = step_graph(&ctx, 2, SPIN);
    let mut cache = VirtualBuffer::new(2 * g, &[device], ReadWrite).unwrap();
    cache.grow(device, g).unwrap();
    let (work, other) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let done = Event::new(&ctx).unwrap();
    // A table's kernel argument on a scope's stream, inside the capture's closure: refused; the
    // graph made is not launched outside a scope's binding.
    let mut lone = GraphTable::<u32>::new(&ctx, HISTORY + HIST, LEN, 1).unwrap();
    let mut capturing = Stream::new(&ctx).unwrap();
    let step = module.function(c"decode_step").unwrap();
    let unparked = cuda_vmm::scope(|s| {
        let o = s.on(&other);
        Graph::capture_with_table(&mut capturing, &mut lone, |_, t| {
            // SAFETY: refused before any driver call (the argument is not the capture's queue's).
            let refused =
                unsafe { o.launch(&step, GRID, BLOCK, (t, 1u32, HIST as u32, LEN as u32, 0u64)) };
            assert!(matches!(refused, Err(Error::StreamRefused { .. })));
            Ok(())
        })
    })
    .unwrap();
    let launched = cuda_vmm::scope(|s| s.on(&work).launch_graph(&unparked));
    assert!(matches!(launched, Err(Error::StreamRefused { .. })));
    drop(unparked);
    // Outside a scope: a graph that uploads a table is not rebound for plain replays.
    let refused = parked.rebind().module(&module).finish().unwrap_err();
    assert!(matches!(refused.error(), Error::InvalidArgument { .. }));
    let parked = refused.into_graph();
    cuda_vmm::scope(|s| {
        let (w, o) = (s.on(&work), s.on(&other));
        let kv = cache.in_scope(s);
        assert!(matches!(
            parked.in_scope().module(&module).finish(),
            Err(Error::InvalidArgument { .. })
        ));
        let mut graph = parked
            .in_scope()
            .table(&mut table, w)
            .module(&module)
            .finish()?;
        assert!(matches!(
            graph.set_read(HISTORY, kv.read::<u32>(0..LEN * 2)?),
            Err(Error::LengthMismatch { .. })
        ));
        let half = block(0, 6).start..block(0, 6).start + LEN * 2;
        assert!(matches!(
            graph.set_write(OUT, kv.write::<u32>(half)?),
            Err(Error::LengthMismatch { .. })
        ));
        assert_eq!(graph.table_entries(), 0, "a block of the wrong length set");
        assert!(matches!(
            graph.set_read(HISTORY + HIST, kv.read::<u32>(block(0, 1))?),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            graph.set_read(HISTORY, kv.read_back::<u32>(block(0, 1), o)?),
            Err(Error::StreamRefused { .. })
        ));
        let page = kv.grow(device, g)?;
        let stale = kv.read::<u32>(block(page, 0))?;
        assert_eq!(kv.retire(page..page + g)?, 1);
        assert!(names_page(&graph.set_read(HISTORY, stale), g, g));
        assert_eq!(graph.table_entries(), 0, "no refused entry was set");
        assert!(matches!(
            o.launch_scoped_graph(&mut graph),
            Err(Error::StreamRefused { .. })
        ));
        graph.set_read(HISTORY, kv.read::<u32>(block(0, 3))?)?;
        // Two replays of 300 ms queued: the third would write the staging buffer the first reads.
        // The first cannot have completed less than SPIN after it was queued.
        let queued = Instant::now();
        w.launch_scoped_graph(&mut graph)?;
        w.record(&done)?;
        w.launch_scoped_graph(&mut graph)?;
        let third = w.launch_scoped_graph(&mut graph);
        if queued.elapsed() < SPIN {
            assert!(matches!(third, Err(Error::StreamRefused { .. })));
        } else {
            eprintln!(
                "the host was descheduled past the replay's {SPIN:?}: the depth's refusal not checked"
            );
        }
        done.synchronize()?;
        w.launch_scoped_graph(&mut graph)?; // the first replay's buffer is free again
        Ok(())
    })
    .unwrap();
    drop(parked);
    cache.free().unwrap();
}

/// 10 000 rounds, 100 per scope, each binding the graph, mapping a page, writing it, setting it in
/// the table, replaying, retiring the page under the replay, a refused replay, clearing the entry
/// and replaying again: the pages, retires, refusals and tables leak nothing (free memory equal
/// after the first scope and the last, every retired page released).
#[test]
fn ten_thousand_rounds_of_table_replays_retires_and_refusals_leak_nothing() {
    const ROUNDS: usize = 10_000;
    const PER_SCOPE: usize = 100;
    let _serial = serial();
    let Some((device, ctx)) =
        gpu_or_skip("ten_thousand_rounds_of_table_replays_retires_and_refusals_leak_nothing")
    else {
        return;
    };
    let g = granularity(device);
    let (module, mut table, parked) = step_graph(&ctx, 2, Duration::ZERO);
    let mut cache = VirtualBuffer::new(2 * g, &[device], ReadWrite).unwrap();
    cache.grow(device, g).unwrap();
    let input = PinnedBuffer::from_slice(&ctx, &pattern(LEN, 3)).unwrap();
    let work = Stream::new(&ctx).unwrap();
    let mut free_after_first = None;
    for chunk in 0..ROUNDS / PER_SCOPE {
        cuda_vmm::scope(|s| {
            let w = s.on(&work);
            let kv = cache.in_scope(s);
            let mut graph = parked
                .in_scope()
                .table(&mut table, w)
                .module(&module)
                .finish()?;
            for round in 0..PER_SCOPE {
                let page = g;
                kv.map_page(page, device, g)?;
                let mut fresh = kv.write::<u32>(block(page, 0))?;
                w.copy_from_host(&mut fresh, &input)?;
                graph.set_read(HISTORY, kv.read_back::<u32>(block(page, 0), w)?)?;
                graph.set_write(OUT, kv.write::<u32>(block(0, round))?)?;
                w.launch_scoped_graph(&mut graph)?;
                assert_eq!(kv.retire(page..page + g)?, 1);
                assert!(names_page(&w.launch_scoped_graph(&mut graph), page, g));
                graph.clear_entry(HISTORY)?;
                w.launch_scoped_graph(&mut graph)?;
                work.synchronize()?; // the test's own wait: the page is released now
                assert_eq!(kv.reclaim()?, 1);
            }
            Ok(())
        })
        .unwrap();
        if chunk == 0 {
            free_after_first = Some(free_memory(&ctx));
        }
    }
    assert_eq!(cache.stats().pages_retired, ROUNDS as u64);
    assert_eq!(cache.retired_bytes(), 0);
    assert_eq!(cache.mapped_bytes(), g);
    assert_eq!(Some(free_memory(&ctx)), free_after_first, "leaked");
    drop(parked);
    cache.free().unwrap();
}

/// 16 threads in one scope, each replaying its own table graph 50 times on its own stream over a
/// page of the shared buffer (its input block in the history, its output block written), while the
/// main thread grows and retires other pages of the same buffer: each thread's output, read back
/// after its last replay, is its input.
#[test]
fn sixteen_threads_replay_their_table_graphs_while_the_buffer_grows_and_retires() {
    const THREADS: usize = 16;
    const REPLAYS: usize = 50;
    let _serial = serial();
    let Some((device, ctx)) =
        gpu_or_skip("sixteen_threads_replay_their_table_graphs_while_the_buffer_grows_and_retires")
    else {
        return;
    };
    let g = granularity(device);
    let mut cache = VirtualBuffer::new((THREADS + 32) * g, &[device], ReadWrite).unwrap();
    let inputs: Vec<Vec<u32>> = (0..THREADS).map(|i| pattern(LEN, 100 + i as u32)).collect();
    for input in &inputs {
        let at = cache.grow(device, g).unwrap();
        cache
            .slice_bytes_mut::<u32>(block(at, 0))
            .unwrap()
            .copy_from_host(input)
            .unwrap();
    }
    let mut engines: Vec<_> = (0..THREADS)
        .map(|_| step_graph(&ctx, 2, Duration::ZERO))
        .collect();
    let streams: Vec<Stream> = (0..THREADS).map(|_| Stream::new(&ctx).unwrap()).collect();
    let main = Stream::new(&ctx).unwrap();
    let mut outs: Vec<PinnedBuffer<u32>> = (0..THREADS)
        .map(|_| PinnedBuffer::zeroed(&ctx, LEN).unwrap())
        .collect();
    cuda_vmm::scope(|s| {
        let kv = cache.in_scope(s);
        s.on(&main);
        std::thread::scope(|t| -> Result<(), Error> {
            let handles: Vec<_> = engines
                .iter_mut()
                .zip(&streams)
                .zip(outs.iter_mut())
                .enumerate()
                .map(|(i, (((module, table, parked), stream), out))| {
                    let w = s.on(stream);
                    t.spawn(move || -> Result<(), Error> {
                        let mut graph =
                            parked.in_scope().table(table, w).module(module).finish()?;
                        let at = i * g;
                        graph.set_read(HISTORY, kv.read::<u32>(block(at, 0))?)?;
                        graph.set_write(OUT, kv.write::<u32>(block(at, 1))?)?;
                        for _ in 0..REPLAYS {
                            w.synchronize()?; // the thread's own pace: one replay ahead
                            w.launch_scoped_graph(&mut graph)?;
                        }
                        let back = kv.read_back::<u32>(block(at, 1), w)?;
                        w.copy_to_host(out, back)?;
                        Ok(())
                    })
                })
                .collect();
            for _ in 0..16 {
                let at = kv.grow(device, g)?;
                assert_eq!(kv.retire(at..at + g)?, 1);
            }
            for handle in handles {
                handle.join().unwrap()?;
            }
            Ok(())
        })
    })
    .unwrap();
    for (out, input) in outs.iter().zip(&inputs) {
        assert_eq!(&out.to_vec(), input);
    }
    assert_eq!(cache.stats().pages_retired, 16);
    drop(engines);
    cache.free().unwrap();
}
