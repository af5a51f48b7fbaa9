//! Graphs against a real driver: a replay gives what the same work queued op by op gives; 10 000
//! replays count 10 000 and leak nothing, nor do 1 000 captures; a replay after a growth of other
//! pages of the buffer it reads; kernel arguments changed between scopes; what a capture refuses;
//! a capture that neither refuses nor is invalidated by another thread's waits; and a graph parked
//! across an eviction, refused while the range is evicted and replayed after the restore, and one
//! dropped after its module was unloaded; and a graph writing a claimed page replayed while the
//! buffer grows (`claim_bytes_mut`); one graph replayed from 8 threads at once. Every test skips
//! visibly without a GPU. The tests take one lock, since some measure free memory.

mod common;

use std::ffi::CString;
use std::sync::{Barrier, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::Duration;

use common::{COUNT_PTX, add_one_ptx, gpu_or_skip, pattern};
use cuda_vmm::stream::{Graph, ParkedGraph};
use cuda_vmm::{
    Context, DeviceBuffer, Error, Granularity, Module, PinnedBuffer, ReadWrite, Stream,
    VirtualBuffer, allocation_granularity,
};

const SPIN_PTX: &str = include_str!("../examples/kernels/spin_add_one.ptx");

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

fn load(ctx: &Context, ptx: &str) -> Module {
    Module::load_ptx(ctx, &CString::new(ptx).unwrap()).unwrap()
}

fn free_memory(ctx: &Context) -> usize {
    ctx.memory_info().unwrap().0
}

fn blocks(n: usize) -> (u32, u32, u32) {
    (u32::try_from(n.div_ceil(256)).unwrap(), 1, 1)
}

/// Upload, kernel, device copy and memset, captured and replayed, against the same operations queued
/// in a scope on other buffers: the bytes are equal, and are what the operations compute.
#[test]
fn a_replay_gives_what_queued_work_gives() {
    let _serial = serial();
    let Some((_, ctx)) = gpu_or_skip("a_replay_gives_what_queued_work_gives") else {
        return;
    };
    let n = 1 << 16;
    let module = Module::load_ptx(&ctx, &add_one_ptx()).unwrap();
    let add_one = module.function(c"add_one").unwrap();
    let data = pattern(n, 17);
    let input = PinnedBuffer::from_slice(&ctx, &data).unwrap();
    let mut stream = Stream::new(&ctx).unwrap();
    let n32 = u32::try_from(n).unwrap();
    let mut run = |graph: bool| -> [Vec<u32>; 4] {
        let mut uploaded = DeviceBuffer::<u32>::zeroed(&ctx, n).unwrap();
        let mut added = DeviceBuffer::<u32>::zeroed(&ctx, n).unwrap();
        let mut copied = DeviceBuffer::<u32>::zeroed(&ctx, n).unwrap();
        let mut set = DeviceBuffer::<u32>::from_host(&ctx, &data).unwrap();
        {
            let (mut xs, mut ys) = (uploaded.as_mut_slice(), added.as_mut_slice());
            let (mut ws, mut ms) = (copied.as_mut_slice(), set.as_mut_slice());
            if graph {
                let g = Graph::capture(&mut stream, |c| {
                    let up = c.copy_from_host(&mut xs, &input)?;
                    // SAFETY: add_one(u32*, const u32*, u32), `n` values of each.
                    let ((sum, (), ()), _node) =
                        unsafe { c.launch(&add_one, blocks(n), (256, 1, 1), (&mut ys, up, n32))? };
                    c.copy_from_device(&mut ws, sum)?;
                    c.memset(&mut ms, 0xab)?;
                    Ok(())
                })
                .unwrap();
                assert_eq!(g.kernels(), 1);
                cuda_vmm::scope(|s| s.on(&stream).launch_graph(&g)).unwrap();
            } else {
                cuda_vmm::scope(|s| {
                    let q = s.on(&stream);
                    let up = q.copy_from_host(&mut xs, &input)?;
                    // SAFETY: as above.
                    let (sum, (), ()) =
                        unsafe { q.launch(&add_one, blocks(n), (256, 1, 1), (&mut ys, up, n32))? };
                    q.copy_from_device(&mut ws, sum)?;
                    q.memset(&mut ms, 0xab)?;
                    Ok(())
                })
                .unwrap();
            }
        }
        [uploaded, added, copied, set].map(|b| b.as_slice().to_vec().unwrap())
    };
    let replayed = run(true);
    let queued = run(false);
    assert_eq!(replayed, queued, "a replay and the queued work differ");
    let plus: Vec<u32> = data.iter().map(|v| v.wrapping_add(1)).collect();
    assert_eq!(replayed[0], data);
    assert_eq!(replayed[1], plus);
    assert_eq!(replayed[2], plus);
    assert!(replayed[3].iter().all(|&v| v == 0xabab_abab));
}

/// Ten thousand replays of a graph that counts, in a hundred scopes: the counter reads 10 000. A
/// thousand captures and drops, and the replays, leave free memory where it was.
#[test]
fn ten_thousand_replays_count_and_leak_nothing() {
    let _serial = serial();
    let Some((_, ctx)) = gpu_or_skip("ten_thousand_replays_count_and_leak_nothing") else {
        return;
    };
    let module = load(&ctx, COUNT_PTX);
    let count = module.function(c"count").unwrap();
    let mut stream = Stream::new(&ctx).unwrap();
    let mut counter = DeviceBuffer::<u32>::zeroed(&ctx, 1).unwrap();
    let mut cycle = |counter: &mut DeviceBuffer<u32>| {
        let mut view = counter.as_mut_slice();
        let graph = Graph::capture(&mut stream, |c| {
            // SAFETY: count(u32*), one value.
            unsafe { c.launch(&count, (1, 1, 1), (1, 1, 1), (&mut view,))? };
            Ok(())
        })
        .unwrap();
        drop(graph);
    };
    cycle(&mut counter); // warm-up
    let free_before = free_memory(&ctx);
    for _ in 0..1000 {
        cycle(&mut counter);
    }
    {
        let mut view = counter.as_mut_slice();
        let graph = Graph::capture(&mut stream, |c| {
            // SAFETY: as above.
            unsafe { c.launch(&count, (1, 1, 1), (1, 1, 1), (&mut view,))? };
            Ok(())
        })
        .unwrap();
        for _ in 0..100 {
            cuda_vmm::scope(|s| {
                let q = s.on(&stream);
                for _ in 0..100 {
                    q.launch_graph(&graph)?;
                }
                Ok(())
            })
            .unwrap();
        }
    }
    assert_eq!(
        counter.as_slice().to_vec().unwrap(),
        vec![10_000],
        "replays counted"
    );
    let free_after = free_memory(&ctx);
    println!("1000 captures, 10000 replays: free before {free_before}, after {free_after}");
    assert_eq!(
        free_after,
        free_before,
        "leaked {} bytes",
        free_before.abs_diff(free_after)
    );
}

/// A graph reads the first page of a `VirtualBuffer`; 63 pages are mapped after it while the graph
/// lives (`grow` takes `&self`), and the replay after them reads the same bytes: no captured address
/// moved. The new pages are readable meanwhile.
#[test]
fn a_replay_after_growth_of_other_pages() {
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("a_replay_after_growth_of_other_pages") else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let mut buffer = VirtualBuffer::new(64 * g, &[device], ReadWrite).unwrap();
    buffer.grow(device, g).unwrap();
    let data = pattern(g / 4, 3);
    buffer
        .slice_bytes_mut::<u32>(..g)
        .unwrap()
        .copy_from_host(&data)
        .unwrap();
    let mut out = DeviceBuffer::<u32>::zeroed(&ctx, g / 4).unwrap();
    let mut stream = Stream::new(&ctx).unwrap();
    {
        let mut out_view = out.as_mut_slice();
        let first = buffer.slice_bytes::<u32>(..g).unwrap();
        let graph = Graph::capture(&mut stream, |c| {
            c.copy_from_device(&mut out_view, first).map(drop)
        })
        .unwrap();
        cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph)).unwrap();
        let base = buffer.base();
        for _ in 1..64 {
            buffer.grow(device, g).unwrap();
        }
        assert_eq!(buffer.base(), base);
        assert_eq!(buffer.pages().len(), 64);
        let last = buffer
            .slice_bytes::<u32>(63 * g..)
            .unwrap()
            .to_vec()
            .unwrap();
        assert_eq!(last.len(), g / 4);
        cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph)).unwrap();
        drop(graph);
    }
    assert_eq!(out.as_slice().to_vec().unwrap(), data);
    buffer.free().unwrap();
}

/// One graph serves every step: its kernel's arguments change between scopes, and each replay writes
/// where its arguments say. A node of another graph is refused.
#[test]
fn kernel_arguments_change_between_scopes() {
    let _serial = serial();
    let Some((_, ctx)) = gpu_or_skip("kernel_arguments_change_between_scopes") else {
        return;
    };
    let n = 4096;
    let module = Module::load_ptx(&ctx, &add_one_ptx()).unwrap();
    let add_one = module.function(c"add_one").unwrap();
    let mut stream = Stream::new(&ctx).unwrap();
    let (one, two) = (pattern(n, 1), pattern(n, 2));
    let src_one = DeviceBuffer::from_host(&ctx, &one).unwrap();
    let src_two = DeviceBuffer::from_host(&ctx, &two).unwrap();
    let mut a = DeviceBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let mut b = DeviceBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let mut other = DeviceBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let n32 = u32::try_from(n).unwrap();
    {
        let (mut av, mut bv, mut ov) = (a.as_mut_slice(), b.as_mut_slice(), other.as_mut_slice());
        let (s1, s2) = (src_one.as_slice(), src_two.as_slice());
        let mut node = None;
        let mut graph = Graph::capture(&mut stream, |c| {
            // SAFETY: add_one(u32*, const u32*, u32), `n` values of each.
            node =
                Some(unsafe { c.launch(&add_one, blocks(n), (256, 1, 1), (&mut av, s1, n32))? }.1);
            Ok(())
        })
        .unwrap();
        let node = node.unwrap();
        cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph)).unwrap();
        // SAFETY: the same kernel's parameters, `n` values of each view.
        unsafe { graph.set_kernel_args(node, (&mut bv, s2, n32)) }.unwrap();
        cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph)).unwrap();

        let mut other_node = None;
        let stranger = Graph::capture(&mut stream, |c| {
            // SAFETY: as above.
            other_node =
                Some(unsafe { c.launch(&add_one, blocks(n), (256, 1, 1), (&mut ov, s1, n32))? }.1);
            Ok(())
        })
        .unwrap();
        // SAFETY: refused before any driver call (a node of another graph).
        let refused = unsafe { graph.set_kernel_args(other_node.unwrap(), (7u32, 8u32, 9u32)) };
        assert!(
            matches!(refused, Err(Error::InvalidArgument { .. })),
            "{refused:?}"
        );
        drop((graph, stranger));
    }
    let plus = |v: &[u32]| v.iter().map(|x| x.wrapping_add(1)).collect::<Vec<_>>();
    assert_eq!(
        a.as_slice().to_vec().unwrap(),
        plus(&one),
        "the first replay"
    );
    assert_eq!(
        b.as_slice().to_vec().unwrap(),
        plus(&two),
        "the replay with new arguments"
    );
}

/// A capture refuses memory that can leave while a scope lasts (a scoped buffer's views, a
/// rewritable slot) before any call; the refusal ends the capture, and the stream works normally
/// after it.
#[test]
fn a_capture_refuses_what_can_leave_its_scope() {
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("a_capture_refuses_what_can_leave_its_scope") else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let mut cache = VirtualBuffer::new(4 * g, &[device], ReadWrite).unwrap();
    cache.grow(device, g).unwrap();
    let (work, mut capturing) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut plain = DeviceBuffer::<u32>::zeroed(&ctx, 256).unwrap();
    let mut plain_view = plain.as_mut_slice();
    cuda_vmm::scope(|s| {
        let w = s.on(&work);
        let kv = cache.in_scope(s);
        let mut slot = kv.write::<u32>(0..1024)?;
        let read = kv.read::<u32>(1024..2048)?;
        let mut ring = w.rewritable(&mut plain_view)?;
        let refused = Graph::capture(&mut capturing, |c| c.memset(&mut slot, 0).map(drop));
        assert!(
            matches!(refused, Err(Error::StreamRefused { .. })),
            "a scoped buffer's slot: {refused:?}"
        );
        let refused = Graph::capture(&mut capturing, |c| c.memset(&mut ring, 0).map(drop));
        assert!(
            matches!(refused, Err(Error::StreamRefused { .. })),
            "a rewritable: {refused:?}"
        );
        let mut other = DeviceBuffer::<u32>::zeroed(&ctx, 256)?;
        let mut other_view = other.as_mut_slice();
        let refused = Graph::capture(&mut capturing, |c| {
            c.copy_from_device(&mut other_view, read).map(drop)
        });
        assert!(
            matches!(refused, Err(Error::StreamRefused { .. })),
            "a scoped buffer's read: {refused:?}"
        );
        w.memset(&mut slot, 1)?; // still lent, and not disturbed
        Ok(())
    })
    .unwrap();
    // The stream whose captures were refused works normally.
    let mut check = DeviceBuffer::<u32>::zeroed(&ctx, 256).unwrap();
    let mut check_view = check.as_mut_slice();
    cuda_vmm::scope(|s| s.on(&capturing).memset(&mut check_view, 0x01).map(drop)).unwrap();
    assert!(
        check
            .as_slice()
            .to_vec()
            .unwrap()
            .iter()
            .all(|&v| v == 0x0101_0101)
    );
    cache.free().unwrap();
}

/// While this thread captures (and waits inside its closure), another thread runs a scope whose
/// kernel takes 200 ms: its wait neither fails nor ends early (its results are right), and the
/// capture is not invalidated (its graph replays). A wait of the capturing thread itself on another
/// stream holds too.
#[test]
fn a_capture_and_another_threads_waits_hold_each_other() {
    let _serial = serial();
    let Some((_, ctx)) = gpu_or_skip("a_capture_and_another_threads_waits_hold_each_other") else {
        return;
    };
    let n = 1 << 14;
    let spin = load(&ctx, SPIN_PTX);
    let kernel = spin.function(c"spin_add_one").unwrap();
    let add = Module::load_ptx(&ctx, &add_one_ptx()).unwrap();
    let add_one = add.function(c"add_one").unwrap();
    let data = pattern(n, 5);
    let input = DeviceBuffer::from_host(&ctx, &data).unwrap();
    let (mut out_thread, mut out_graph) = (
        DeviceBuffer::<u32>::zeroed(&ctx, n).unwrap(),
        DeviceBuffer::<u32>::zeroed(&ctx, n).unwrap(),
    );
    let mut side = DeviceBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let (mut capturing, other, own) = (
        Stream::new(&ctx).unwrap(),
        Stream::new(&ctx).unwrap(),
        Stream::new(&ctx).unwrap(),
    );
    let n32 = u32::try_from(n).unwrap();
    let meet = Barrier::new(2);
    {
        let (src, mut thread_view, mut graph_view, mut side_view) = (
            input.as_slice(),
            out_thread.as_mut_slice(),
            out_graph.as_mut_slice(),
            side.as_mut_slice(),
        );
        let graph = thread::scope(|t| {
            let waiter = t.spawn(|| {
                meet.wait(); // the capture is under way
                cuda_vmm::scope(|s| {
                    // SAFETY: spin_add_one(u32*, const u32*, u32, u64), `n` values of each.
                    unsafe {
                        s.on(&other).launch(
                            &kernel,
                            (64, 1, 1),
                            (256, 1, 1),
                            (&mut thread_view, src, n32, 200_000_000u64),
                        )?
                    };
                    Ok(())
                })
            });
            let graph = Graph::capture(&mut capturing, |c| {
                meet.wait();
                // SAFETY: add_one(u32*, const u32*, u32), `n` values of each.
                unsafe {
                    c.launch(
                        &add_one,
                        blocks(n),
                        (256, 1, 1),
                        (&mut graph_view, src, n32),
                    )?
                };
                // This thread's own wait, on a stream that is not capturing.
                cuda_vmm::scope(|s| s.on(&own).memset(&mut side_view, 0x02).map(drop))?;
                thread::sleep(Duration::from_millis(300)); // the other thread waits meanwhile
                Ok(())
            });
            let outcome = waiter.join().expect("the waiting thread panicked");
            assert!(outcome.is_ok(), "the other thread's scope: {outcome:?}");
            graph
        })
        .expect("the capture was invalidated or refused");
        cuda_vmm::scope(|s| s.on(&capturing).launch_graph(&graph)).unwrap();
    }
    let plus: Vec<u32> = data.iter().map(|v| v.wrapping_add(1)).collect();
    assert_eq!(
        out_thread.as_slice().to_vec().unwrap(),
        plus,
        "the other thread's kernel"
    );
    assert_eq!(
        out_graph.as_slice().to_vec().unwrap(),
        plus,
        "the graph's kernel"
    );
    assert!(
        side.as_slice()
            .to_vec()
            .unwrap()
            .iter()
            .all(|&v| v == 0x0202_0202)
    );
}

/// Two GPUs: a graph captured on GPU 0 copies GPU 1's memory over a grant (a buffer page of GPU 1
/// granted to both), and its replay gives the bytes.
#[test]
fn a_graph_on_gpu0_reads_gpu1_memory_over_a_grant() {
    let _serial = serial();
    let Some(gpus) = common::gpus_or_skip("a_graph_on_gpu0_reads_gpu1_memory_over_a_grant", 2)
    else {
        return;
    };
    let ((d0, ctx0), (d1, _)) = (&gpus[0], &gpus[1]);
    let g = allocation_granularity(*d1, Granularity::Minimum).unwrap();
    let mut buffer = VirtualBuffer::new(g, &[*d0, *d1], ReadWrite).unwrap();
    buffer.map_page(0, *d1, g).unwrap();
    let data = pattern(g / 4, 12);
    buffer
        .slice_bytes_mut::<u32>(..)
        .unwrap()
        .copy_from_host(&data)
        .unwrap();
    let mut out = DeviceBuffer::<u32>::zeroed(ctx0, g / 4).unwrap();
    let mut stream = Stream::new(ctx0).unwrap();
    {
        let mut out_view = out.as_mut_slice();
        let remote = buffer.slice_bytes_on::<u32>(*d0, ..).unwrap();
        assert!(remote.reachable_from(*d0));
        let graph = Graph::capture(&mut stream, |c| {
            c.copy_from_device(&mut out_view, remote).map(drop)
        })
        .unwrap();
        cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph)).unwrap();
    }
    assert_eq!(out.as_slice().to_vec().unwrap(), data);
    buffer.free().unwrap();
}

/// Replay after restore. A graph whose kernel reads one `VirtualBuffer` range (`weights`) and
/// writes another (`out`), and whose download writes pinned host memory, is replayed, parked, and
/// the read range evicted: free memory rises by exactly its bytes, and a rebind is refused with
/// `Error::PageRange` naming them. Rebinds are refused too for memory not given, for a written range
/// given for reading only, for the host memory not given, and without the kernel's module. After
/// the restore (free memory back to the byte) the rebound graph replays, and its results equal the
/// same work queued op by op, before and after.
#[test]
fn a_parked_graph_is_refused_while_evicted_and_replays_after_restore() {
    let _serial = serial();
    let Some((device, ctx)) =
        gpu_or_skip("a_parked_graph_is_refused_while_evicted_and_replays_after_restore")
    else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let n = g / 4;
    let n32 = u32::try_from(n).unwrap();
    let module = Module::load_ptx(&ctx, &add_one_ptx()).unwrap();
    let add_one = module.function(c"add_one").unwrap();
    let mut stream = Stream::new(&ctx).unwrap();
    let data = pattern(n, 21);
    let plus: Vec<u32> = data.iter().map(|v| v.wrapping_add(1)).collect();
    let mut weights = VirtualBuffer::new(2 * g, &[device], ReadWrite).unwrap();
    weights.grow(device, g).unwrap();
    let mut first = weights.slice_bytes_mut::<u32>(..g).unwrap();
    first.copy_from_host(&data).unwrap();
    let mut out = VirtualBuffer::new(g, &[device], ReadWrite).unwrap();
    out.grow(device, g).unwrap();
    let mut host = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let zeros = vec![0u32; n];

    // The same work queued op by op, into other memory: what every replay must give.
    let (queued, queued_host) =
        queued_add_one(&stream, &add_one, &weights.slice_bytes(..g).unwrap());
    assert_eq!(queued.as_slice().to_vec().unwrap(), plus, "the queued work");
    assert_eq!(queued_host.to_vec(), plus, "the queued download");

    let parked = {
        let src = weights.slice_bytes::<u32>(..g).unwrap();
        let mut dst = out.slice_bytes_mut::<u32>(..).unwrap();
        let host_view = host.as_pinned_mut();
        let graph = Graph::capture(&mut stream, |c| {
            // SAFETY: as above.
            let ((sum, (), ()), _) =
                unsafe { c.launch(&add_one, blocks(n), (256, 1, 1), (&mut dst, src, n32))? };
            c.copy_to_host(host_view, sum)?;
            Ok(())
        })
        .unwrap();
        cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph)).unwrap();
        graph.park()
    };
    assert_eq!(parked.kernels(), 1);
    assert_eq!(out.slice_bytes::<u32>(..).unwrap().to_vec().unwrap(), plus);
    assert_eq!(host.to_vec(), plus, "the first replay's download");
    // Cleared, so that the replay after the restore is seen to write them again.
    let mut out_view = out.slice_bytes_mut::<u32>(..).unwrap();
    out_view.copy_from_host(&zeros).unwrap();
    host.copy_from_slice(&zeros).unwrap();

    let free_mapped = free_memory(&ctx);
    let evicted = weights.evict(..g).unwrap();
    let free_evicted = free_memory(&ctx);
    assert_eq!(
        free_evicted - free_mapped,
        g,
        "free memory rises by exactly the evicted bytes"
    );

    // While the range is evicted: refused, naming the evicted bytes, and the graph comes back.
    let refused = parked
        .rebind()
        .reads(&weights)
        .writes(&mut out)
        .writes_host(&mut host)
        .module(&module)
        .finish()
        .unwrap_err();
    assert!(
        matches!(refused.error(), Error::PageRange { start: 0, end, .. } if *end == g),
        "an evicted range: {refused}"
    );
    let parked = refused.into_graph();

    weights.restore(evicted).unwrap();
    assert_eq!(
        free_memory(&ctx),
        free_mapped,
        "the restore maps exactly the evicted bytes again"
    );

    let parked = refused_rebinds(parked, &weights, &mut out, &mut host, &module);
    // Nothing ran meanwhile: the cleared bytes are still clear.
    assert_eq!(out.slice_bytes::<u32>(..).unwrap().to_vec().unwrap(), zeros);

    {
        let graph = parked
            .rebind()
            .reads(&weights)
            .writes(&mut out)
            .writes_host(&mut host)
            .module(&module)
            .finish()
            .unwrap();
        cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph)).unwrap();
    }
    assert_eq!(
        out.slice_bytes::<u32>(..).unwrap().to_vec().unwrap(),
        queued.as_slice().to_vec().unwrap(),
        "the replay after the restore and the queued work differ"
    );
    assert_eq!(
        host.to_vec(),
        queued_host.to_vec(),
        "the download after the restore"
    );
    weights.free().unwrap();
    out.free().unwrap();
}

/// `add_one` of `src` queued op by op in a scope on `stream`, into new device memory, and that
/// downloaded into new pinned memory.
fn queued_add_one(
    stream: &Stream,
    add_one: &cuda_vmm::module::Function<'_>,
    src: &cuda_vmm::DeviceSlice<'_, u32>,
) -> (DeviceBuffer<u32>, PinnedBuffer<u32>) {
    let ctx = Context::new(stream.device()).unwrap();
    let n = src.len();
    let mut queued = DeviceBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let mut queued_host = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let mut dst = queued.as_mut_slice();
    cuda_vmm::scope(|s| {
        let q = s.on(stream);
        // SAFETY: add_one(u32*, const u32*, u32), `n` values of each.
        let (sum, (), ()) = unsafe {
            q.launch(
                add_one,
                blocks(n),
                (256, 1, 1),
                (&mut dst, src, u32::try_from(n).unwrap()),
            )?
        };
        q.copy_to_host(&mut queued_host, sum)?;
        Ok(())
    })
    .unwrap();
    (queued, queued_host)
}

/// Rebinds of `parked` (whose kernel reads `weights`' first page and writes all of `out`, and whose
/// download writes `host`) each missing one thing: memory not given, a written range given for
/// reading only, host memory not given, a module not given. Each is refused, naming what is
/// missing, and gives the graph back.
fn refused_rebinds(
    parked: ParkedGraph,
    weights: &VirtualBuffer,
    out: &mut VirtualBuffer,
    host: &mut PinnedBuffer<u32>,
    module: &Module,
) -> ParkedGraph {
    let g64 = u64::try_from(out.budget()).unwrap();
    let (wb, ob) = (weights.base(), out.base());
    let refused = parked
        .rebind()
        .writes(out)
        .writes_host(host)
        .module(module)
        .finish()
        .unwrap_err();
    assert!(
        matches!(refused.error(), Error::GraphRange { start, end, host: false, .. }
            if *start == wb && *end == wb + g64),
        "the read range not given: {refused}"
    );
    let refused = refused
        .into_graph()
        .rebind()
        .reads(weights)
        .reads(out)
        .writes_host(host)
        .module(module)
        .finish()
        .unwrap_err();
    assert!(
        matches!(refused.error(), Error::GraphRange { start, end, host: false, problem }
            if *start == ob && *end == ob + g64 && problem.contains("reading only")),
        "the written range given for reading: {refused}"
    );
    let refused = refused
        .into_graph()
        .rebind()
        .reads(weights)
        .writes(out)
        .module(module)
        .finish()
        .unwrap_err();
    assert!(
        matches!(refused.error(), Error::GraphRange { host: true, .. }),
        "the host memory not given: {refused}"
    );
    let refused = refused
        .into_graph()
        .rebind()
        .reads(weights)
        .writes(out)
        .writes_host(host)
        .finish()
        .unwrap_err();
    assert!(
        matches!(refused.error(), Error::InvalidArgument { .. }),
        "the module not given: {refused}"
    );
    refused.into_graph()
}

/// A parked graph and its memory's access set: where the buffer it writes is regranted to another
/// device only, the rebind is refused (its device would fault); granted again, it is rebound and
/// replays. Two GPUs.
#[test]
fn a_rebind_is_refused_where_the_graphs_device_lost_its_grant() {
    let _serial = serial();
    let Some(gpus) = common::gpus_or_skip(
        "a_rebind_is_refused_where_the_graphs_device_lost_its_grant",
        2,
    ) else {
        return;
    };
    let ((d0, ctx0), (d1, _)) = (&gpus[0], &gpus[1]);
    let g = allocation_granularity(*d0, Granularity::Minimum).unwrap();
    let mut buffer = VirtualBuffer::new(g, &[*d0, *d1], ReadWrite).unwrap();
    buffer.map_page(0, *d1, g).unwrap();
    let mut stream = Stream::new(ctx0).unwrap();
    let parked = {
        let mut view = buffer.slice_bytes_mut_on::<u32>(*d0, ..).unwrap();
        Graph::capture(&mut stream, |c| c.memset(&mut view, 0x5a).map(drop))
            .unwrap()
            .park()
    };
    buffer.set_access(&[*d1]).unwrap();
    let refused = parked.rebind().writes(&mut buffer).finish().unwrap_err();
    assert!(
        matches!(refused.error(), Error::GraphRange { host: false, .. }),
        "the graph's device left the access set: {refused}"
    );
    buffer.set_access(&[*d0, *d1]).unwrap();
    {
        let graph = refused
            .into_graph()
            .rebind()
            .writes(&mut buffer)
            .finish()
            .unwrap();
        cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph)).unwrap();
    }
    assert!(
        buffer
            .slice_bytes::<u32>(..)
            .unwrap()
            .to_vec()
            .unwrap()
            .iter()
            .all(|&v| v == 0x5a5a_5a5a)
    );
    buffer.free().unwrap();
}

/// A parked graph holds no borrow of the module its kernel came from, so the module can be unloaded
/// first (`cuModuleUnload` while an instantiated graph still has a node of its kernel): dropping the
/// parked graph afterwards (`cuGraphExecDestroy`, `cuGraphDestroy`) must leave the context healthy,
/// and a rebind with a module loaded again from the same PTX is refused (another module).
#[test]
fn a_parked_graph_outlives_its_module() {
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("a_parked_graph_outlives_its_module") else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let n = g / 4;
    let n32 = u32::try_from(n).unwrap();
    let mut stream = Stream::new(&ctx).unwrap();
    let data = pattern(n, 5);
    let plus: Vec<u32> = data.iter().map(|v| v.wrapping_add(1)).collect();
    let mut src = VirtualBuffer::new(g, &[device], ReadWrite).unwrap();
    src.grow(device, g).unwrap();
    src.slice_bytes_mut::<u32>(..)
        .unwrap()
        .copy_from_host(&data)
        .unwrap();
    let mut out = VirtualBuffer::new(g, &[device], ReadWrite).unwrap();
    out.grow(device, g).unwrap();
    let module = Module::load_ptx(&ctx, &add_one_ptx()).unwrap();
    let parked = {
        let add_one = module.function(c"add_one").unwrap();
        let from = src.slice_bytes::<u32>(..).unwrap();
        let mut dst = out.slice_bytes_mut::<u32>(..).unwrap();
        let graph = Graph::capture(&mut stream, |c| {
            // SAFETY: add_one(u32* dst, const u32* src, u32 n) touches `n` values of each.
            unsafe { c.launch(&add_one, blocks(n), (256, 1, 1), (&mut dst, from, n32))? };
            Ok(())
        })
        .unwrap();
        cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph)).unwrap();
        graph.park()
    };
    assert_eq!(out.slice_bytes::<u32>(..).unwrap().to_vec().unwrap(), plus);
    drop(module);
    // The same PTX loaded again is another module: the parked graph's kernel is not in it.
    let again = Module::load_ptx(&ctx, &add_one_ptx()).unwrap();
    let refused = parked
        .rebind()
        .reads(&src)
        .writes(&mut out)
        .module(&again)
        .finish()
        .unwrap_err();
    assert!(
        matches!(refused.error(), Error::InvalidArgument { .. }),
        "{:?}",
        refused.error()
    );
    drop(refused); // the parked graph is destroyed here, after its module was unloaded
    // The context still runs work: a kernel of the new module, a download and a wait.
    let add_one = again.function(c"add_one").unwrap();
    let mut dst = out.slice_bytes_mut::<u32>(..).unwrap();
    let from = src.slice_bytes::<u32>(..).unwrap();
    let mut back = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    cuda_vmm::scope(|s| {
        let q = s.on(&stream);
        // SAFETY: as above.
        let (sum, (), ()) =
            unsafe { q.launch(&add_one, blocks(n), (256, 1, 1), (&mut dst, &from, n32))? };
        q.copy_to_host(&mut back, sum)?;
        Ok(())
    })
    .unwrap();
    assert_eq!(
        back.to_vec(),
        plus,
        "a launch after the parked graph's drop"
    );
    ctx.synchronize().unwrap();
}

/// A graph that writes a page of a `VirtualBuffer` through the view of a claimed range
/// (`VirtualBuffer::claim_bytes_mut`) is replayed while the buffer grows: the claim borrows the
/// buffer shared, so `grow` and `map_page` stay available; each replay counts once in the captured
/// page, and every page mapped meanwhile is there when the graph is gone.
#[test]
fn a_graph_writing_a_page_is_replayed_while_the_buffer_grows() {
    const REPLAYS: u32 = 8;
    let _serial = serial();
    let Some((device, ctx)) =
        gpu_or_skip("a_graph_writing_a_page_is_replayed_while_the_buffer_grows")
    else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let module = load(&ctx, COUNT_PTX);
    let count = module.function(c"count").unwrap();
    let mut stream = Stream::new(&ctx).unwrap();
    let mut cache = VirtualBuffer::new((REPLAYS as usize + 3) * g, &[device], ReadWrite).unwrap();
    cache.grow(device, g).unwrap();
    cache
        .slice_bytes_mut::<u32>(..4)
        .unwrap()
        .copy_from_host(&[0])
        .unwrap();
    {
        let mut claim = cache.claim_bytes_mut::<u32>(..4).unwrap();
        let mut counter = claim.view();
        let graph = Graph::capture(&mut stream, |c| {
            // SAFETY: count(u32*), one value.
            unsafe { c.launch(&count, (1, 1, 1), (1, 1, 1), (&mut counter,))? };
            Ok(())
        })
        .unwrap();
        for replay in 1..REPLAYS as usize {
            let at = cache.grow(device, g).unwrap(); // while the graph lives
            assert_eq!(at, replay * g);
            cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph)).unwrap();
        }
        cache.map_page(cache.end() + g, device, g).unwrap(); // past a hole
        cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph)).unwrap();
        drop(graph);
        assert_eq!(cache.pages().len(), 1 + REPLAYS as usize);
    }
    assert_eq!(
        cache.slice_bytes::<u32>(..4).unwrap().to_vec().unwrap(),
        vec![REPLAYS],
        "each replay counted once in the captured page"
    );
    cache.free().unwrap();
}

/// One graph replayed from 8 threads of one scope at once, 1 000 times each: the driver's graph
/// objects are not internally synchronized, so the crate queues one thread's `cuGraphLaunch` at a
/// time; every replay runs, and the counter the graph bumps counts them all.
#[test]
fn one_graph_replayed_from_eight_threads_at_once_counts_every_replay() {
    const THREADS: usize = 8;
    const REPLAYS: usize = 1000;
    let _serial = serial();
    let Some((_, ctx)) =
        gpu_or_skip("one_graph_replayed_from_eight_threads_at_once_counts_every_replay")
    else {
        return;
    };
    let module = load(&ctx, COUNT_PTX);
    let count = module.function(c"count").unwrap();
    let mut counter = DeviceBuffer::<u32>::zeroed(&ctx, 1).unwrap();
    let mut capturing = Stream::new(&ctx).unwrap();
    let streams: Vec<Stream> = (0..THREADS).map(|_| Stream::new(&ctx).unwrap()).collect();
    {
        let mut view = counter.as_mut_slice();
        let graph = Graph::capture(&mut capturing, |c| {
            // SAFETY: count(u32*) adds one to the first value of the view.
            unsafe { c.launch(&count, (1, 1, 1), (1, 1, 1), (&mut view,))? };
            Ok(())
        })
        .unwrap();
        cuda_vmm::scope(|s| {
            thread::scope(|t| {
                let handles: Vec<_> = streams
                    .iter()
                    .map(|stream| {
                        let (work, graph) = (s.on(stream), &graph);
                        t.spawn(move || -> Result<(), Error> {
                            for _ in 0..REPLAYS {
                                work.launch_graph(graph)?;
                            }
                            Ok(())
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .try_for_each(|handle| handle.join().unwrap())
            })
        })
        .unwrap();
    }
    let replays = u32::try_from(THREADS * REPLAYS).unwrap();
    assert_eq!(counter.as_slice().to_vec().unwrap(), vec![replays]);
}
