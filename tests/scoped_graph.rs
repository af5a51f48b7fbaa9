//! Graphs replayed over a scoped buffer's pages (`ParkedGraph::in_scope`, `ScopedGraph`) against a
//! real driver: a graph captured once replayed every step of one scope while other pages are mapped
//! and retired between the replays, with no host wait and no re-capture, its bytes and replays
//! counted; a page a queued replay reads, retired under it, released only after the replay (free
//! memory and the buffer's counts); a replay refused, naming the bytes, once its page is retired,
//! and bound again once a new page is mapped there; the claims a bound graph holds for the scope;
//! a replay on a stream that the buffer's scope does not know refused; 10 000 rounds of bindings,
//! replays, retires and refusals that leak nothing; 16 threads replaying their graphs in one scope
//! while the buffer grows and retires.
//! Every test skips visibly without a GPU. The tests take one lock, since some measure free memory.

mod common;

use std::ffi::CString;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use common::{COUNT_PTX, gpu_or_skip, pattern};
use cuda_vmm::stream::Graph;
use cuda_vmm::{
    Context, Device, DeviceBuffer, Error, Event, Granularity, Module, PinnedBuffer, ReadWrite,
    Stream, VirtualBuffer, allocation_granularity,
};

/// `spin_add_one(u32 *dst, const u32 *src, u32 n, u64 ns)`: waits `ns` nanoseconds, then
/// `dst[i] = src[i] + 1`.
const SPIN_PTX: &str = include_str!("../examples/kernels/spin_add_one.ptx");
const GRID: (u32, u32, u32) = (64, 1, 1);
const BLOCK: (u32, u32, u32) = (256, 1, 1);
/// How long the replay that stands for a long decode step runs: long enough that a release that did
/// not wait for it shows.
const SPIN: Duration = Duration::from_millis(300);

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

fn load(ctx: &Context, ptx: &str) -> Module {
    Module::load_ptx(ctx, &CString::new(ptx).unwrap()).unwrap()
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap()
}

fn plus_one(data: &[u32]) -> Vec<u32> {
    data.iter().map(|x| x.wrapping_add(1)).collect()
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

/// A cache of `pages` pages of `g` bytes with its first two mapped, the second holding `data`, and
/// the graph `spin_add_one(page 0, page 1, n, spin)` (plus `count(counter)` where given), captured
/// on a stream of its own and parked.
fn cache_and_graph(
    device: Device,
    ctx: &Context,
    spin: &Module,
    counter: Option<(&Module, &mut DeviceBuffer<u32>)>,
    data: &[u32],
    spin_for: Duration,
) -> (VirtualBuffer, cuda_vmm::stream::ParkedGraph) {
    let g = granularity(device);
    let n = g / 4;
    let mut cache = VirtualBuffer::new(16 * g, &[device], ReadWrite).unwrap();
    cache.grow(device, g).unwrap();
    cache.grow(device, g).unwrap();
    cache
        .slice_bytes_mut::<u32>(g..2 * g)
        .unwrap()
        .copy_from_host(data)
        .unwrap();
    let kernel = spin.function(c"spin_add_one").unwrap();
    let count = counter
        .as_ref()
        .map(|(module, _)| module.function(c"count").unwrap());
    let mut counter_view = counter.map(|(_, buffer)| buffer.as_mut_slice());
    let mut capturing = Stream::new(ctx).unwrap();
    let n32 = u32::try_from(n).unwrap();
    let parked = {
        let mut claim = cache.claim_bytes_mut::<u32>(..g).unwrap();
        let src = cache.slice_bytes::<u32>(g..2 * g).unwrap();
        let mut dst = claim.view();
        Graph::capture(&mut capturing, |c| {
            // SAFETY: spin_add_one(u32*, const u32*, u32, u64), `n` values of each view.
            unsafe { c.launch(&kernel, GRID, BLOCK, (&mut dst, src, n32, nanos(spin_for)))? };
            if let (Some(count), Some(counter)) = (&count, &mut counter_view) {
                // SAFETY: count(u32*) adds one to the first value of the view.
                unsafe { c.launch(count, (1, 1, 1), (1, 1, 1), (counter,))? };
            }
            Ok(())
        })
        .unwrap()
        .park()
    };
    (cache, parked)
}

/// One graph, captured once, replayed at every step of one scope while the cache maps a page,
/// writes it and retires it between replays: no host wait, no re-capture. Every replay ran (the
/// counter the graph bumps), the graph's bytes are the kernel's, read back after the last replay;
/// after the read back the graph's write claim has ended, so a replay is refused. Every retired page
/// is released, and the two left come back to the byte.
#[test]
fn a_scoped_graph_replays_while_other_pages_map_and_retire() {
    let _serial = serial();
    let Some((device, ctx)) =
        gpu_or_skip("a_scoped_graph_replays_while_other_pages_map_and_retire")
    else {
        return;
    };
    let g = granularity(device);
    let n = g / 4;
    let steps = 8usize;
    let spin = load(&ctx, SPIN_PTX);
    let count = load(&ctx, COUNT_PTX);
    let mut counter = DeviceBuffer::<u32>::zeroed(&ctx, 1).unwrap();
    let data = pattern(n, 41);
    let (mut cache, parked) = cache_and_graph(
        device,
        &ctx,
        &spin,
        Some((&count, &mut counter)),
        &data,
        Duration::ZERO,
    );
    let work = Stream::new(&ctx).unwrap();
    let mut out = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    cuda_vmm::scope(|s| {
        let w = s.on(&work);
        let kv = cache.in_scope(s);
        let mut graph = parked
            .in_scope()
            .buffer(&kv)
            .module(&spin)
            .module(&count)
            .writes_device(&mut counter)
            .finish()?;
        let claimed: Vec<_> = graph.claimed().collect();
        let base = kv.base();
        let g64 = g as u64;
        assert_eq!(
            claimed,
            vec![
                (base, base + g64, true),
                (base + g64, base + 2 * g64, false)
            ],
            "the page written, the page read"
        );
        for step in 0..steps {
            w.launch_scoped_graph(&mut graph)?;
            let at = kv.grow(device, g)?;
            let mut slot = kv.write::<u8>(at..at + g)?;
            w.memset(&mut slot, u8::try_from(step).unwrap())?;
            assert_eq!(kv.retire(at..at + g)?, 1);
        }
        let back = kv.read_back::<u32>(..g, w)?;
        w.copy_to_host(&mut out, back)?;
        assert_eq!(
            page_range(&w.launch_scoped_graph(&mut graph)),
            Some((0, g)),
            "read back: the graph is no longer the page's writer"
        );
        Ok(())
    })
    .unwrap();
    assert_eq!(
        counter.as_slice().to_vec().unwrap(),
        vec![u32::try_from(steps).unwrap()]
    );
    assert_eq!(out.to_vec(), plus_one(&data), "the replays' bytes");
    assert_eq!(cache.stats().pages_retired, steps as u64);
    cache.reclaim().unwrap();
    assert_eq!(cache.retired_bytes(), 0, "every retired page released");
    assert_eq!(cache.mapped_bytes(), 2 * g, "the graph's two pages");
    drop(parked);
    let free_before = free_memory(&ctx);
    cache.free().unwrap();
    assert_eq!(
        free_memory(&ctx),
        free_before + 2 * g,
        "the pages came back to the byte"
    );
}

/// A page that a queued 300 ms replay reads, retired under it: the retire returns while the replay
/// runs, nothing is released until it has finished (reclaim finds nothing, free memory does not
/// move), a second replay is refused naming the page, and then exactly the page's bytes come back.
/// The replay queued before the retire wrote what it read.
#[test]
fn a_retired_page_under_a_queued_replay_is_released_after_it() {
    let _serial = serial();
    let Some((device, ctx)) =
        gpu_or_skip("a_retired_page_under_a_queued_replay_is_released_after_it")
    else {
        return;
    };
    let g = granularity(device);
    let n = g / 4;
    let spin = load(&ctx, SPIN_PTX);
    let data = pattern(n, 7);
    let (mut cache, parked) = cache_and_graph(device, &ctx, &spin, None, &data, SPIN);
    let work = Stream::new(&ctx).unwrap();
    let done = Event::new(&ctx).unwrap();
    let mut out = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    cuda_vmm::scope(|s| {
        let w = s.on(&work);
        let kv = cache.in_scope(s);
        let mut graph = parked.in_scope().buffer(&kv).module(&spin).finish()?;
        w.launch_scoped_graph(&mut graph)?;
        w.record(&done)?;
        assert_eq!(kv.retire(g..2 * g)?, 1, "the page the replay reads");
        assert!(!done.is_complete()?, "the retire waited for the replay");
        let free_retired = free_memory(&ctx);
        assert_eq!(kv.reclaim()?, 0, "released while the replay runs");
        assert_eq!(
            free_memory(&ctx),
            free_retired,
            "memory moved under the replay"
        );
        assert_eq!(
            page_range(&w.launch_scoped_graph(&mut graph)),
            Some((g, 2 * g)),
            "a replay after the retire, naming the retired page"
        );
        assert!(!done.is_complete()?, "the refusal waited for nothing");
        done.synchronize()?; // the test's own wait, standing in for time passing
        assert_eq!(kv.reclaim()?, 1);
        assert_eq!(
            free_memory(&ctx),
            free_retired + g,
            "the page's bytes came back"
        );
        let back = kv.read_back::<u32>(..g, w)?;
        w.copy_to_host(&mut out, back)?;
        Ok(())
    })
    .unwrap();
    assert_eq!(
        out.to_vec(),
        plus_one(&data),
        "the replay before the retire"
    );
    drop(parked);
    cache.free().unwrap();
}

/// A bound graph holds its claims for the scope: its written page is lent to nothing else, its read
/// page is lent for reading only. Once its written page is retired a replay is refused naming it,
/// also after a new page is mapped there (the binding predates the page); bound again, the graph
/// replays over the new page. A second binding while the first holds the written page is refused.
#[test]
fn a_replay_after_its_page_is_retired_is_refused_naming_the_bytes() {
    let _serial = serial();
    let Some((device, ctx)) =
        gpu_or_skip("a_replay_after_its_page_is_retired_is_refused_naming_the_bytes")
    else {
        return;
    };
    let g = granularity(device);
    let n = g / 4;
    let spin = load(&ctx, SPIN_PTX);
    let data = pattern(n, 3);
    let (mut cache, parked) = cache_and_graph(device, &ctx, &spin, None, &data, Duration::ZERO);
    let work = Stream::new(&ctx).unwrap();
    let mut out = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    cuda_vmm::scope(|s| {
        let w = s.on(&work);
        let kv = cache.in_scope(s);
        let mut graph = parked.in_scope().buffer(&kv).module(&spin).finish()?;
        // The claims: the written page is the graph's alone, the read page shared with reads.
        assert_eq!(page_range(&kv.write::<u32>(0..4)), Some((0, 4)));
        assert_eq!(page_range(&kv.read::<u32>(4..8)), Some((4, 8)));
        assert!(
            kv.read::<u32>(g..g + 16).is_ok(),
            "reads share the read page"
        );
        assert_eq!(page_range(&kv.write::<u32>(g..g + 4)), Some((g, g + 4)));
        assert_eq!(
            page_range(&parked.in_scope().buffer(&kv).module(&spin).finish()),
            Some((0, g)),
            "a second binding of the written page"
        );
        w.launch_scoped_graph(&mut graph)?;

        assert_eq!(kv.retire(..g)?, 1);
        assert_eq!(page_range(&w.launch_scoped_graph(&mut graph)), Some((0, g)));
        work.synchronize()?; // the test's own wait, so that the page is released now
        assert_eq!(kv.reclaim()?, 1);
        kv.map_page(0, device, g)?;
        assert_eq!(
            page_range(&w.launch_scoped_graph(&mut graph)),
            Some((0, g)),
            "a page mapped after the binding is not the binding's"
        );
        let mut again = parked.in_scope().buffer(&kv).module(&spin).finish()?;
        w.launch_scoped_graph(&mut again)?;
        let back = kv.read_back::<u32>(..g, w)?;
        w.copy_to_host(&mut out, back)?;
        Ok(())
    })
    .unwrap();
    assert_eq!(
        out.to_vec(),
        plus_one(&data),
        "the replay over the new page"
    );
    drop(parked);
    cache.free().unwrap();
}

/// A graph bound over a buffer lent to an outer scope, inside an inner one: a replay on a stream
/// the outer scope does not know is refused before `cuGraphLaunch` (the outer scope's retires
/// record their events on its own streams only), and on a stream of both scopes it runs.
#[test]
fn a_replay_on_a_stream_outside_the_buffers_scope_is_refused() {
    let _serial = serial();
    let Some((device, ctx)) =
        gpu_or_skip("a_replay_on_a_stream_outside_the_buffers_scope_is_refused")
    else {
        return;
    };
    let g = granularity(device);
    let n = g / 4;
    let spin = load(&ctx, SPIN_PTX);
    let data = pattern(n, 11);
    let (mut cache, parked) = cache_and_graph(device, &ctx, &spin, None, &data, Duration::ZERO);
    let (work, other) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    cuda_vmm::scope(|s| {
        let kv = cache.in_scope(s);
        s.on(&work);
        cuda_vmm::scope(|inner| {
            let mut graph = parked.in_scope().buffer(&kv).module(&spin).finish()?;
            let refused = inner.on(&other).launch_scoped_graph(&mut graph);
            assert!(
                matches!(refused, Err(Error::StreamRefused { .. })),
                "{refused:?}"
            );
            inner.on(&work).launch_scoped_graph(&mut graph)
        })
    })
    .unwrap();
    assert_eq!(
        cache.slice_bytes::<u32>(..g).unwrap().to_vec().unwrap(),
        plus_one(&data),
        "the replay on the stream of both scopes"
    );
    drop(parked);
    cache.free().unwrap();
}

/// 10 000 rounds, 100 to a scope: a graph bound and replayed, its written page retired under the
/// replay, a replay and a binding refused while the page is retired (naming it), the page
/// released, a binding refused over the hole, and the page mapped again. Every retired page is
/// released, and free memory after the last scope is what it was after the first (which warmed
/// the driver up): nothing leaks on the refusals.
#[test]
fn ten_thousand_rounds_of_bindings_retires_and_refusals_leak_nothing() {
    const ROUNDS: usize = 10_000;
    const PER_SCOPE: usize = 100;
    let _serial = serial();
    let Some((device, ctx)) =
        gpu_or_skip("ten_thousand_rounds_of_bindings_retires_and_refusals_leak_nothing")
    else {
        return;
    };
    let g = granularity(device);
    let n = g / 4;
    let spin = load(&ctx, SPIN_PTX);
    let data = pattern(n, 5);
    let (mut cache, parked) = cache_and_graph(device, &ctx, &spin, None, &data, Duration::ZERO);
    let work = Stream::new(&ctx).unwrap();
    let mut free_after_first = None;
    for chunk in 0..ROUNDS / PER_SCOPE {
        cuda_vmm::scope(|s| {
            let w = s.on(&work);
            let kv = cache.in_scope(s);
            for _ in 0..PER_SCOPE {
                let mut graph = parked.in_scope().buffer(&kv).module(&spin).finish()?;
                w.launch_scoped_graph(&mut graph)?;
                assert_eq!(kv.retire(..g)?, 1);
                assert_eq!(page_range(&w.launch_scoped_graph(&mut graph)), Some((0, g)));
                let retired = parked.in_scope().buffer(&kv).module(&spin).finish();
                assert_eq!(
                    page_range(&retired),
                    Some((0, g)),
                    "a binding over the retired page"
                );
                work.synchronize()?; // the test's own wait, so that the page is released now
                assert_eq!(kv.reclaim()?, 1);
                let hole = parked.in_scope().buffer(&kv).module(&spin).finish();
                assert_eq!(page_range(&hole), Some((0, g)), "a binding over the hole");
                kv.map_page(0, device, g)?;
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
    assert_eq!(cache.mapped_bytes(), 2 * g);
    assert_eq!(Some(free_memory(&ctx)), free_after_first, "leaked");
    drop(parked);
    cache.free().unwrap();
}

/// 16 threads in one scope, each replaying its own graph (over a page it writes and a page it
/// reads) 50 times on its own stream, while the main thread grows and retires other pages of the
/// same buffer: every replay is admitted beside the others' and the retires', and each thread's
/// page, read back after its last replay, holds its kernel's bytes.
#[test]
fn sixteen_threads_replay_their_graphs_while_the_buffer_grows_and_retires() {
    const THREADS: usize = 16;
    const REPLAYS: usize = 50;
    let _serial = serial();
    let Some((device, ctx)) =
        gpu_or_skip("sixteen_threads_replay_their_graphs_while_the_buffer_grows_and_retires")
    else {
        return;
    };
    let g = granularity(device);
    let n = g / 4;
    let n32 = u32::try_from(n).unwrap();
    let spin = load(&ctx, SPIN_PTX);
    let kernel = spin.function(c"spin_add_one").unwrap();
    let mut cache = VirtualBuffer::new((2 * THREADS + 32) * g, &[device], ReadWrite).unwrap();
    let inputs: Vec<Vec<u32>> = (0..THREADS)
        .map(|i| pattern(n, 100 + u32::try_from(i).unwrap()))
        .collect();
    for input in &inputs {
        let _dst = cache.grow(device, g).unwrap();
        let src = cache.grow(device, g).unwrap();
        cache
            .slice_bytes_mut::<u32>(src..src + g)
            .unwrap()
            .copy_from_host(input)
            .unwrap();
    }
    let mut capturing = Stream::new(&ctx).unwrap();
    let parked: Vec<_> = (0..THREADS)
        .map(|i| {
            let at = 2 * i * g;
            let mut claim = cache.claim_bytes_mut::<u32>(at..at + g).unwrap();
            let src = cache.slice_bytes::<u32>(at + g..at + 2 * g).unwrap();
            let mut dst = claim.view();
            Graph::capture(&mut capturing, |c| {
                // SAFETY: spin_add_one(u32*, const u32*, u32, u64), `n` values of each view.
                unsafe { c.launch(&kernel, GRID, BLOCK, (&mut dst, src, n32, 0u64))? };
                Ok(())
            })
            .unwrap()
            .park()
        })
        .collect();
    let streams: Vec<Stream> = (0..THREADS).map(|_| Stream::new(&ctx).unwrap()).collect();
    let main = Stream::new(&ctx).unwrap();
    let mut outs: Vec<PinnedBuffer<u32>> = (0..THREADS)
        .map(|_| PinnedBuffer::zeroed(&ctx, n).unwrap())
        .collect();
    cuda_vmm::scope(|s| {
        let kv = cache.in_scope(s);
        s.on(&main);
        let mut graphs = parked
            .iter()
            .map(|p| p.in_scope().buffer(&kv).module(&spin).finish())
            .collect::<Result<Vec<_>, Error>>()?;
        std::thread::scope(|t| -> Result<(), Error> {
            let handles: Vec<_> = graphs
                .iter_mut()
                .zip(&streams)
                .zip(outs.iter_mut())
                .enumerate()
                .map(|(i, ((graph, stream), out))| {
                    let w = s.on(stream);
                    t.spawn(move || -> Result<(), Error> {
                        for _ in 0..REPLAYS {
                            w.launch_scoped_graph(graph)?;
                        }
                        let at = 2 * i * g;
                        let back = kv.read_back::<u32>(at..at + g, w)?;
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
        assert_eq!(out.to_vec(), plus_one(input));
    }
    assert_eq!(cache.stats().pages_retired, 16);
    drop(parked);
    cache.free().unwrap();
}
