//! Memory in motion against a real driver: a `VirtualBuffer` lent to a scope (`ScopedBuffer`) grows
//! while a kernel runs on its other pages, retires pages behind running work without a host wait
//! (their memory is released only once that work has finished, on every stream of the scope), and
//! refuses every later lend of a retired page; a retire at the scope's end is released only after
//! the scope; a `Rewritable` slot is written again and again in one
//! scope; 16 threads grow, write and retire in one scope; a range is evicted behind running work
//! and restored at the same address in one scope; and thousands of rounds with faults injected leave
//! free memory where it was, to the byte. Every test skips visibly without a GPU.
//! The tests take one lock, since they measure free memory.

mod common;

use std::ffi::CString;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use common::{gpu_or_skip, pattern};
use cuda_vmm::owned::SharedPage;
use cuda_vmm::{
    Context, Device, DriverError, Error, Event, Granularity, Module, PinnedBuffer, ReadWrite,
    Stream, VirtualBuffer, align_size, allocation_granularity,
};

/// `spin_add_one(u32 *dst, const u32 *src, u32 n, u64 ns)`: waits `ns` nanoseconds, then
/// `dst[i] = src[i] + 1`.
const SPIN_PTX: &str = include_str!("../examples/kernels/spin_add_one.ptx");
const GRID: (u32, u32, u32) = (64, 1, 1);
const BLOCK: (u32, u32, u32) = (256, 1, 1);
/// How long the kernels that stand for a decode step run: long enough that a call which waited
/// for them, or a release that did not, shows.
const SPIN: Duration = Duration::from_millis(300);

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

fn spin_module(ctx: &Context) -> Module {
    Module::load_ptx(ctx, &CString::new(SPIN_PTX).expect("PTX has no NUL byte")).unwrap()
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

fn is_page_range<T>(result: &Result<T, Error>) -> bool {
    matches!(result, Err(Error::PageRange { .. }))
}

/// A page is mapped, lent and written on another stream while a 300 ms kernel runs on the buffer's
/// first page: the grow returns while the kernel runs (its event is not complete), the new page's
/// copy finishes before the kernel does, and both results are right.
#[test]
fn a_page_is_mapped_while_a_long_kernel_runs_on_other_pages() {
    let _serial = serial();
    let Some((device, ctx)) =
        gpu_or_skip("a_page_is_mapped_while_a_long_kernel_runs_on_other_pages")
    else {
        return;
    };
    let g = granularity(device);
    let n = g / 8; // half a page of u32s
    let mut cache = VirtualBuffer::new(16 * g, &[device], ReadWrite).unwrap();
    cache.grow(device, g).unwrap();
    let module = spin_module(&ctx);
    let kernel = module.function(c"spin_add_one").unwrap();
    let data = pattern(n, 3);
    let fresh_data = pattern(n, 9);
    let host_in = PinnedBuffer::from_slice(&ctx, &data).unwrap();
    let fresh_in = PinnedBuffer::from_slice(&ctx, &fresh_data).unwrap();
    let mut host_out = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let mut fresh_out = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let (work, side) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let (kernel_done, side_done) = (Event::new(&ctx).unwrap(), Event::new(&ctx).unwrap());
    let n32 = u32::try_from(n).unwrap();

    let mut grew_in = Duration::ZERO;
    cuda_vmm::scope(|s| {
        let (w, side) = (s.on(&work), s.on(&side));
        let kv = cache.in_scope(s);
        let mut src = kv.write::<u32>(0..g / 2)?;
        let mut dst = kv.write::<u32>(g / 2..g)?;
        let uploaded = w.copy_from_host(&mut src, &host_in)?;
        // SAFETY: `spin_add_one(u32*, const u32*, u32, u64)`, `n` values of each view.
        let (out, (), (), ()) =
            unsafe { w.launch(&kernel, GRID, BLOCK, (&mut dst, uploaded, n32, nanos(SPIN)))? };
        w.record(&kernel_done)?;
        w.copy_to_host(&mut host_out, out)?;

        let start = Instant::now();
        let at = kv.grow(device, g)?;
        grew_in = start.elapsed();
        assert!(
            !kernel_done.is_complete()?,
            "the grow waited for the kernel"
        );
        assert_eq!(at, g);
        let mut fresh = kv.write::<u32>(at..at + g / 2)?;
        let wrote = side.copy_from_host(&mut fresh, &fresh_in)?;
        side.copy_to_host(&mut fresh_out, wrote)?;
        side.record(&side_done)?;
        side_done.synchronize()?;
        assert!(
            !kernel_done.is_complete()?,
            "the new page's copy did not finish while the kernel ran"
        );
        Ok(())
    })
    .unwrap();
    println!("grow while a {SPIN:?} kernel runs: returned in {grew_in:?}");
    assert_eq!(host_out.to_vec(), plus_one(&data));
    assert_eq!(fresh_out.to_vec(), fresh_data);
    assert_eq!(cache.pages().len(), 2);
    cache.free().unwrap();
}

/// A 64 MiB page retired behind a 300 ms kernel: the retire returns while the kernel runs, no
/// memory is released until it has finished (reclaim finds nothing, free memory does not move), and
/// then exactly the page's bytes come back. Every lend of the retired page is refused meanwhile,
/// also through the `DeviceInFlight` of the kernel's write, and no page is mapped over it; after
/// the release a new page there is not reachable through the old handles either. The download
/// queued before the retire read the kernel's bytes.
#[test]
fn a_retired_range_is_released_only_after_its_kernel() {
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("a_retired_range_is_released_only_after_its_kernel")
    else {
        return;
    };
    let g = granularity(device);
    let big = align_size(64 << 20, g).unwrap();
    let n = g / 4;
    let module = spin_module(&ctx);
    let kernel = module.function(c"spin_add_one").unwrap();
    let data = pattern(n, 5);
    let host_in = PinnedBuffer::from_slice(&ctx, &data).unwrap();
    let mut host_out = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let mut refused_out = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let mut later_out = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let work = Stream::new(&ctx).unwrap();
    let done = Event::new(&ctx).unwrap();
    let n32 = u32::try_from(n).unwrap();
    warm_up(&ctx);
    let free_at_start = free_memory(&ctx);
    let mut cache = VirtualBuffer::new(4 * big, &[device], ReadWrite).unwrap();
    cache.grow(device, big).unwrap();
    cache.grow(device, big).unwrap();

    let mut retire_took = Duration::ZERO;
    let mut released = 0usize;
    cuda_vmm::scope(|s| {
        let w = s.on(&work);
        let kv = cache.in_scope(s);
        let mut src = kv.write::<u32>(0..g)?;
        let mut dst = kv.write::<u32>(big..big + g)?;
        let uploaded = w.copy_from_host(&mut src, &host_in)?;
        // SAFETY: as above.
        let (out, (), (), ()) =
            unsafe { w.launch(&kernel, GRID, BLOCK, (&mut dst, uploaded, n32, nanos(SPIN)))? };
        w.copy_to_host(&mut host_out, out)?;
        w.record(&done)?;

        let start = Instant::now();
        assert_eq!(kv.retire(big..2 * big)?, 1);
        retire_took = start.elapsed();
        assert!(!done.is_complete()?, "the retire waited for the kernel");
        assert_eq!(kv.retired_bytes(), big);
        let free_retired = free_memory(&ctx);
        assert_eq!(kv.reclaim()?, 0, "released while the kernel runs");
        assert_eq!(
            free_memory(&ctx),
            free_retired,
            "memory moved while the kernel runs"
        );

        // Refused: a new lend of the retired page, by each handle that names it.
        assert!(
            is_page_range(&w.memset(&mut dst, 0)),
            "a write after the retire"
        );
        assert!(
            is_page_range(&w.copy_to_host(&mut refused_out, out)),
            "a read through the written handle"
        );
        assert!(is_page_range(&kv.read::<u32>(big..big + 4)), "a new view");
        assert!(
            is_page_range(&kv.write::<u32>(big..big + 4)),
            "a new writable view"
        );
        assert!(
            is_page_range(&kv.map_page(big, device, big)),
            "a page over it"
        );
        assert!(is_page_range(&kv.retire(big..2 * big)), "a second retire");
        assert!(!done.is_complete()?, "the checks waited");

        done.synchronize()?; // the test's own wait, standing in for time passing
        released = kv.reclaim()?;
        assert_eq!(
            free_memory(&ctx),
            free_retired + big,
            "the page's bytes came back"
        );

        // A page mapped in the released range is not reached through the old handles.
        kv.map_page(big, device, big)?;
        assert!(
            is_page_range(&w.copy_to_host(&mut later_out, out)),
            "an old handle over a new page"
        );
        // The untouched first page is still lent as before.
        w.memset(&mut src, 0)?;
        Ok(())
    })
    .unwrap();
    println!(
        "retire behind a {SPIN:?} kernel: returned in {retire_took:?}, released {released} page after it"
    );
    assert_eq!(released, 1);
    assert_eq!(
        host_out.to_vec(),
        plus_one(&data),
        "the download queued before the retire"
    );
    assert_eq!(cache.stats().pages_retired, 1);
    cache.free().unwrap();
    assert_eq!(free_memory(&ctx), free_at_start, "leaked");
}

/// A retire at the scope's end (`ScopedBuffer::retire_at_scope_end`) behind a 300 ms kernel:
/// it records no event, the page is refused to every lend and map at once, and it is released
/// neither while the kernel runs nor after it within the scope (not even after the test's own
/// wait), only once the scope has ended, by the buffer's next `reclaim`. With a reserve, the next
/// scope's map of the same range takes the page (no cuMemMap), and free memory is back to the byte
/// after the trim.
#[test]
fn a_retire_at_the_scope_end_is_released_only_after_the_scope() {
    let _serial = serial();
    let Some((device, ctx)) =
        gpu_or_skip("a_retire_at_the_scope_end_is_released_only_after_the_scope")
    else {
        return;
    };
    let g = granularity(device);
    let n = g / 4;
    let module = spin_module(&ctx);
    let kernel = module.function(c"spin_add_one").unwrap();
    let data = pattern(n, 9);
    let host_in = PinnedBuffer::from_slice(&ctx, &data).unwrap();
    let mut host_out = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let work = Stream::new(&ctx).unwrap();
    let done = Event::new(&ctx).unwrap();
    let n32 = u32::try_from(n).unwrap();
    warm_up(&ctx);
    let free_at_start = free_memory(&ctx);
    let mut cache = VirtualBuffer::new(4 * g, &[device], ReadWrite).unwrap();
    cache.grow(device, g).unwrap();
    cache.grow(device, g).unwrap();
    let events_before = cache.stats().events_recorded;

    cuda_vmm::scope(|s| {
        let w = s.on(&work);
        let kv = cache.in_scope(s);
        let mut src = kv.write::<u32>(0..g)?;
        let mut dst = kv.write::<u32>(g..2 * g)?;
        let uploaded = w.copy_from_host(&mut src, &host_in)?;
        // SAFETY: `spin_add_one(u32*, const u32*, u32, u64)` takes these four, in this order; it
        // writes `n` values of `dst` and reads `n` of `uploaded`, which hold `n` each.
        let (out, (), (), ()) =
            unsafe { w.launch(&kernel, GRID, BLOCK, (&mut dst, uploaded, n32, nanos(SPIN)))? };
        w.copy_to_host(&mut host_out, out)?;
        w.record(&done)?;
        assert_eq!(kv.retire_at_scope_end(g..2 * g)?, 1);
        let running = !done.is_complete()?;
        assert_eq!(kv.retired_bytes(), g);
        assert!(
            is_page_range(&w.memset(&mut dst, 0)),
            "a write after the retire"
        );
        assert!(is_page_range(&kv.read::<u32>(g..g + 4)), "a new view");
        assert!(is_page_range(&kv.map_page(g, device, g)), "a page over it");
        assert!(is_page_range(&kv.retire(g..2 * g)), "a second retire");
        assert!(
            is_page_range(&kv.retire_at_scope_end(g..2 * g)),
            "a second retire at the end"
        );
        let free_retired = free_memory(&ctx);
        assert_eq!(kv.reclaim()?, 0, "released while the kernel runs");
        done.synchronize()?;
        assert_eq!(kv.reclaim()?, 0, "released before the scope's end");
        assert_eq!(free_memory(&ctx), free_retired, "memory moved in the scope");
        if !running {
            eprintln!(
                "the kernel had finished when the retire returned: the 300 ms window was missed"
            );
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(
        cache.stats().events_recorded,
        events_before,
        "an event was recorded"
    );
    assert_eq!(
        host_out.to_vec(),
        plus_one(&data),
        "the work queued before the retire"
    );
    let free_after_scope = free_memory(&ctx);
    assert_eq!(cache.reclaim().unwrap(), 1, "the scope has ended: released");
    assert_eq!(
        free_memory(&ctx),
        free_after_scope + g,
        "the page's bytes came back"
    );
    cache.free().unwrap();

    assert_eq!(free_memory(&ctx), free_at_start, "leaked");
}

/// Retires at the scope's end with a reserve, as a decode loop with one scope per batch runs them:
/// a ring of three pages, a reserve of two, two pages mapped, written, read back and retired at
/// the end in each of eight scopes. Every value is right, no event is recorded, retired pages come
/// back through the reserve in place (recycled by the worker once the scope has ended, or taken
/// by the map itself), and free memory is back to the byte after the trim.
#[test]
fn retires_at_the_scope_end_are_recycled_by_the_reserve() {
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("retires_at_the_scope_end_are_recycled_by_the_reserve")
    else {
        return;
    };
    let g = granularity(device);
    let n = g / 4;
    let work = Stream::new(&ctx).unwrap();
    warm_up(&ctx);
    let free_at_start = free_memory(&ctx);
    let mut cache = VirtualBuffer::new(3 * g, &[device], ReadWrite).unwrap();
    cache
        .reserve_ahead(cuda_vmm::owned::ReserveOptions::new(device, g, 2))
        .unwrap();
    let mut slot = 0usize;
    for round in 0..8u32 {
        let data = [pattern(n, 40 + 2 * round), pattern(n, 41 + 2 * round)];
        let inputs = data
            .each_ref()
            .map(|d| PinnedBuffer::from_slice(&ctx, d).unwrap());
        let mut outputs = [(); 2].map(|()| PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap());
        let before = cache.stats();
        cuda_vmm::scope(|s| {
            let w = s.on(&work);
            let kv = cache.in_scope(s);
            let pages = [slot % 3 * g, (slot + 1) % 3 * g];
            for ((&page, input), output) in pages.iter().zip(&inputs).zip(&mut outputs) {
                kv.map_page(page, device, g)?;
                let mut lent = kv.write::<u32>(page..page + g)?;
                w.copy_from_host(&mut lent, input)?;
                let back = kv.read_back::<u32>(page..page + g, w)?;
                w.copy_to_host(output, back)?;
            }
            for page in pages {
                assert_eq!(kv.retire_at_scope_end(page..page + g)?, 1);
            }
            Ok(())
        })
        .unwrap();
        slot += 2;
        assert_eq!(outputs[0].to_vec(), data[0], "round {round}");
        assert_eq!(outputs[1].to_vec(), data[1], "round {round}");
        assert_eq!(
            cache.stats().events_recorded,
            before.events_recorded,
            "round {round}: an event was recorded"
        );
    }
    let stats = cache.stats();
    assert!(
        stats.reserve_recycled_in_place > 0,
        "no retired page came back in place: {stats:?}"
    );
    println!("eight scopes, sixteen retires at the end: {stats:?}");
    cache.trim().unwrap();
    cache.free().unwrap();
    assert_eq!(free_memory(&ctx), free_at_start, "leaked");
}

/// A retire orders its release after every stream of the scope, not only the one the caller used
/// last: a kernel on a second stream reads the page, and nothing is released until it has finished.
#[test]
fn a_retire_waits_for_every_stream_of_the_scope() {
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("a_retire_waits_for_every_stream_of_the_scope") else {
        return;
    };
    let g = granularity(device);
    let n = g / 8;
    let module = spin_module(&ctx);
    let kernel = module.function(c"spin_add_one").unwrap();
    let data = pattern(n, 21);
    let host_in = PinnedBuffer::from_slice(&ctx, &data).unwrap();
    let mut host_out = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let (work, reader) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let (uploaded_event, read_done) = (Event::new(&ctx).unwrap(), Event::new(&ctx).unwrap());
    let mut cache = VirtualBuffer::new(8 * g, &[device], ReadWrite).unwrap();
    cache.grow(device, g).unwrap(); // read by the kernel, retired
    cache.grow(device, g).unwrap(); // written by it
    let n32 = u32::try_from(n).unwrap();

    cuda_vmm::scope(|s| {
        let (w, r) = (s.on(&work), s.on(&reader));
        let kv = cache.in_scope(s);
        let mut src = kv.write::<u32>(0..g / 2)?;
        let mut dst = kv.write::<u32>(g..g + g / 2)?;
        let uploaded = w.copy_from_host(&mut src, &host_in)?;
        w.record(&uploaded_event)?;
        r.wait(&uploaded_event)?;
        // SAFETY: as above.
        let (out, (), (), ()) =
            unsafe { r.launch(&kernel, GRID, BLOCK, (&mut dst, uploaded, n32, nanos(SPIN)))? };
        r.copy_to_host(&mut host_out, out)?;
        r.record(&read_done)?;
        // Retired from the host while `work` is idle and `reader` still reads the page.
        assert_eq!(kv.retire(0..g)?, 1);
        thread::sleep(Duration::from_millis(50));
        assert!(
            !read_done.is_complete()?,
            "the kernel ended too soon for this test"
        );
        assert_eq!(
            kv.reclaim()?,
            0,
            "released while another stream's kernel reads it"
        );
        read_done.synchronize()?;
        assert_eq!(kv.reclaim()?, 1);
        Ok(())
    })
    .unwrap();
    assert_eq!(host_out.to_vec(), plus_one(&data));
    assert_eq!(cache.pages().len(), 1);
    cache.free().unwrap();
}

/// A ring of two slots serves a hundred batches in one scope: each `Rewritable` is written again
/// after its last write on its stream, and each batch's download reads its own batch. A write on
/// another stream is refused until `hand_over` orders it behind an event; then it is right too.
#[test]
fn two_slots_serve_a_hundred_batches_in_one_scope() {
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("two_slots_serve_a_hundred_batches_in_one_scope") else {
        return;
    };
    let g = granularity(device);
    let n = g / 8;
    let batches: Vec<Vec<u32>> = (0..100).map(|b| pattern(n, 1000 + b)).collect();
    let pinned: Vec<PinnedBuffer<u32>> = batches
        .iter()
        .map(|b| PinnedBuffer::from_slice(&ctx, b).unwrap())
        .collect();
    let mut outputs = PinnedBuffer::<u32>::zeroed(&ctx, 100 * n).unwrap();
    let mut handed_out = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let (work, other) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let handover = Event::new(&ctx).unwrap();
    let mut cache = VirtualBuffer::new(4 * g, &[device], ReadWrite).unwrap();
    cache.grow(device, g).unwrap();

    cuda_vmm::scope(|s| {
        let (w, o) = (s.on(&work), s.on(&other));
        let kv = cache.in_scope(s);
        let mut ring = [kv.write::<u32>(0..g / 2)?, kv.write::<u32>(g / 2..g)?];
        for (i, (batch, out)) in pinned.iter().zip(outputs.chunks_mut(n)?).enumerate() {
            let written = w.copy_from_host(&mut ring[i % 2], batch)?;
            w.copy_to_host(out, written)?;
        }
        let [first, _] = &mut ring;
        let refused = o.copy_from_host(&mut *first, &pinned[0]);
        assert!(
            matches!(refused, Err(Error::StreamRefused { .. })),
            "a write on another stream without an event: {refused:?}"
        );
        // No second writer of the slot: a Rewritable is not made rewritable again (that handle,
        // bound to no stream, would write the slot on `other` unordered after `work`).
        let again = o.rewritable(&mut *first);
        assert!(
            matches!(again, Err(Error::StreamRefused { .. })),
            "a second Rewritable of one slot: {again:?}"
        );
        first.hand_over(w, o, &handover)?;
        let written = o.copy_from_host(&mut *first, &pinned[7])?;
        o.copy_to_host(&mut handed_out, written)?;
        Ok(())
    })
    .unwrap();
    for (i, batch) in batches.iter().enumerate() {
        assert_eq!(&outputs[i * n..(i + 1) * n], &batch[..], "batch {i}");
    }
    assert_eq!(handed_out.to_vec(), batches[7]);
    cache.free().unwrap();
}

/// The run-time claims of a scope: writes are exclusive and name the shared bytes, reads share, a
/// read of written bytes is refused, and a view of a scoped buffer is not lent to a stream outside
/// the scope.
#[test]
fn scoped_views_are_checked_before_the_driver() {
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("scoped_views_are_checked_before_the_driver") else {
        return;
    };
    let g = granularity(device);
    let mut cache = VirtualBuffer::new(4 * g, &[device], ReadWrite).unwrap();
    cache.grow(device, 2 * g).unwrap();
    let (work, stranger) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut host = PinnedBuffer::<u32>::zeroed(&ctx, 1024).unwrap();
    let stats = cache.stats();
    cuda_vmm::scope(|s| {
        let w = s.on(&work);
        let kv = cache.in_scope(s);
        let _a = kv.write::<u32>(0..g)?;
        match kv.write::<u32>(g - 4096..g + 4096) {
            Err(Error::PageRange { start, end, .. }) => assert_eq!((start, end), (g - 4096, g)),
            other => panic!("an overlapping write: {other:?}"),
        }
        let read = kv.read::<u32>(g..g + 4096)?;
        let _again = kv.read::<u32>(g..g + 8192)?;
        match kv.write::<u32>(g + 4096..g + 12288) {
            Err(Error::PageRange { start, end, .. }) => {
                assert_eq!((start, end), (g + 4096, g + 8192));
            }
            other => panic!("a write over read bytes: {other:?}"),
        }
        assert!(
            is_page_range(&kv.read::<u32>(0..4)),
            "a read of written bytes"
        );
        assert!(is_page_range(&kv.read::<u32>(3 * g..3 * g + 4)), "a hole");
        assert!(matches!(
            kv.read::<u32>(2..6),
            Err(Error::NotWholeElements { .. })
        ));
        // A stream the scope does not know: refused before any work is queued.
        let outsider = {
            let inner = cuda_vmm::scope(|inner| {
                let refused = inner.on(&stranger).copy_to_host(&mut host, read);
                Ok(matches!(refused, Err(Error::StreamRefused { .. })))
            });
            inner?
        };
        assert!(outsider, "a view lent to a stream of another scope");
        w.copy_to_host(&mut host, read)?;
        Ok(())
    })
    .unwrap();
    assert_eq!(
        cache.stats().map_calls,
        stats.map_calls,
        "a refused view made a driver call"
    );
    cache.free().unwrap();
}

/// Sixteen threads share one scoped buffer in one scope: each grows its pages, writes and reads
/// them on its own stream and retires them, twenty rounds each. Every byte is right, and free
/// memory is back to the byte at the end.
#[test]
fn sixteen_threads_grow_and_retire_in_one_scope() {
    const THREADS: usize = 16;
    const ROUNDS: usize = 20;
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("sixteen_threads_grow_and_retire_in_one_scope") else {
        return;
    };
    let g = granularity(device);
    let n = g / 4;
    let inputs: Vec<PinnedBuffer<u32>> = (0..THREADS * ROUNDS)
        .map(|i| PinnedBuffer::from_slice(&ctx, &pattern(n, 7 * i as u32)).unwrap())
        .collect();
    let mut outputs: Vec<PinnedBuffer<u32>> = (0..THREADS * ROUNDS)
        .map(|_| PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap())
        .collect();
    let streams: Vec<Stream> = (0..THREADS).map(|_| Stream::new(&ctx).unwrap()).collect();
    warm_up(&ctx);
    let free_before = free_memory(&ctx);
    let mut cache = VirtualBuffer::new(THREADS * ROUNDS * g, &[device], ReadWrite).unwrap();

    cuda_vmm::scope(|s| {
        let kv = cache.in_scope(s);
        let mut chunks: Vec<&mut [PinnedBuffer<u32>]> = outputs.chunks_mut(ROUNDS).collect();
        thread::scope(|t| {
            let workers: Vec<_> = chunks
                .drain(..)
                .zip(inputs.chunks(ROUNDS))
                .zip(&streams)
                .map(|((outs, ins), stream)| {
                    t.spawn(move || -> Result<(), Error> {
                        let on = s.on(stream);
                        for (out, input) in outs.iter_mut().zip(ins) {
                            let at = kv.grow(device, g)?;
                            let mut page = kv.write::<u32>(at..at + g)?;
                            let written = on.copy_from_host(&mut page, input)?;
                            on.copy_to_host(&mut *out, written)?;
                            assert_eq!(kv.retire(at..at + g)?, 1);
                        }
                        Ok(())
                    })
                })
                .collect();
            workers
                .into_iter()
                .try_for_each(|w| w.join().expect("a worker panicked"))
        })
    })
    .unwrap();
    for (i, (out, input)) in outputs.iter().zip(&inputs).enumerate() {
        assert_eq!(
            out.to_vec(),
            input.to_vec(),
            "thread {} round {}",
            i / ROUNDS,
            i % ROUNDS
        );
    }
    let stats = cache.stats();
    assert_eq!(stats.pages_retired as usize, THREADS * ROUNDS);
    cache.reclaim().unwrap();
    assert_eq!(cache.retired_bytes(), 0, "every retire's work has finished");
    cache.free().unwrap();
    assert_eq!(free_memory(&ctx), free_before, "leaked");
}

/// Maps, retires and releases one page: the first calls of a process may set up driver bookkeeping
/// that stays for the process's lifetime, so tests measure free memory after this.
fn warm_up(ctx: &Context) {
    let device = ctx.device();
    let g = granularity(device);
    let stream = Stream::new(ctx).unwrap();
    let mut buffer = VirtualBuffer::new(g, &[device], ReadWrite).unwrap();
    buffer.grow(device, g).unwrap();
    buffer.retire_after(&stream, ..).unwrap();
    stream.synchronize().unwrap();
    buffer.reclaim().unwrap();
    buffer.free().unwrap();
}

/// One round of the new operations with faults injected: grows (one out of memory), a shared page
/// mapped at two offsets, claims refused, a write, retires inside a scope and after a raw stream,
/// lends refused after a retire, reclaims, and a drop or a free with retires pending.
fn fault_round(
    ctx: &Context,
    g: usize,
    huge: usize,
    round: u32,
    work: &Stream,
    host: &mut PinnedBuffer<u32>,
) {
    let device = ctx.device();
    let mut cache = VirtualBuffer::new(huge + 8 * g, &[device], ReadWrite).unwrap();
    let prefix = SharedPage::new(device, g).unwrap();
    cache.grow(device, g).unwrap();
    let e = cache.grow(device, huge).unwrap_err();
    assert_eq!(e.driver(), Some(DriverError::OUT_OF_MEMORY), "{e}");
    cache.map_shared(2 * g, &prefix).unwrap();
    cache.map_shared(3 * g, &prefix).unwrap();
    assert!(
        is_page_range(&cache.map_shared(3 * g, &prefix)),
        "a shared page over a mapped one"
    );
    let data = pattern(host.len(), round);
    host.copy_from_slice(&data).unwrap();
    let mut back = vec![0u32; host.len()];
    cuda_vmm::scope(|s| {
        let w = s.on(work);
        let kv = cache.in_scope(s);
        let mut slot = kv.write::<u32>(0..host.len() * 4)?;
        assert!(
            is_page_range(&kv.write::<u32>(0..4)),
            "an overlapping claim"
        );
        let written = w.copy_from_host(&mut slot, &host[..])?;
        w.copy_from_device(
            &mut kv.write::<u32>(2 * g..2 * g + host.len() * 4)?,
            written,
        )?;
        assert_eq!(kv.retire(2 * g..3 * g)?, 1);
        assert!(
            is_page_range(&kv.read::<u8>(2 * g..=2 * g)),
            "a view of a retired page"
        );
        Ok(())
    })
    .unwrap();
    // The prefix page's other mapping reads what the scope wrote through the first.
    cache
        .slice_bytes::<u32>(3 * g..3 * g + back.len() * 4)
        .unwrap()
        .copy_to_host(&mut back)
        .unwrap();
    assert_eq!(
        back, data,
        "round {round}: the shared page's second mapping"
    );
    assert_eq!(cache.retire_after(work, 3 * g..4 * g).unwrap(), 1);
    if round.is_multiple_of(3) {
        work.synchronize().unwrap();
        cache.reclaim().unwrap();
        assert_eq!(
            cache.retired_bytes(),
            0,
            "round {round}: a finished retire kept its page"
        );
    }
    drop(prefix);
    if round.is_multiple_of(2) {
        cache.free().unwrap();
    } // else dropped, retires pending or not: the same teardown, errors ignored.
}

/// 10 000 rounds of the new operations, with faults injected (well over 100 000 calls), leave free
/// memory where it was to the byte.
#[test]
fn rounds_with_faults_leak_nothing() {
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("rounds_with_faults_leak_nothing") else {
        return;
    };
    let g = granularity(device);
    let (_, total) = ctx.memory_info().unwrap();
    let huge = align_size(total + g, g).unwrap();
    let work = Stream::new(&ctx).unwrap();
    let mut host = PinnedBuffer::<u32>::zeroed(&ctx, 4096).unwrap();
    fault_round(&ctx, g, huge, 0, &work, &mut host);
    let free_before = free_memory(&ctx);
    // Each round makes at least 17 calls of the new operations (grows, shared maps, claims, lends,
    // retires, reclaims, refusals) besides construction and teardown.
    let rounds = 10_000;
    let started = std::time::Instant::now();
    for round in 1..=rounds {
        fault_round(&ctx, g, huge, round, &work, &mut host);
    }
    work.synchronize().unwrap();
    let free_after = free_memory(&ctx);
    println!(
        "{rounds} rounds with faults in {:.1} s: free before {free_before}, after {free_after}",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        free_after,
        free_before,
        "leaked {} bytes",
        free_before.abs_diff(free_after)
    );
}

/// Lends of two views of one buffer in one operation (a copy between two of its ranges) race retires
/// of other pages on other threads: a retire waits for the lends admitted before it without holding
/// the page table's lock, so neither side waits for the other forever. A watchdog ends the process
/// if the threads have not finished in a minute.
#[test]
fn two_view_lends_race_retires_without_deadlock() {
    const COPIERS: usize = 4;
    const RETIRERS: usize = 4;
    const ROUNDS: usize = 300;
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("two_view_lends_race_retires_without_deadlock") else {
        return;
    };
    let g = granularity(device);
    let chunk = 4096;
    let mut cache = VirtualBuffer::new((1 + RETIRERS * ROUNDS) * g, &[device], ReadWrite).unwrap();
    cache.grow(device, g).unwrap();
    let streams: Vec<Stream> = (0..COPIERS + RETIRERS)
        .map(|_| Stream::new(&ctx).unwrap())
        .collect();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watchdog = {
        let done = std::sync::Arc::clone(&done);
        thread::spawn(move || {
            let start = Instant::now();
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                if start.elapsed() > Duration::from_mins(1) {
                    eprintln!("two_view_lends_race_retires_without_deadlock: no progress in 60 s");
                    std::process::exit(3);
                }
                thread::sleep(Duration::from_millis(50));
            }
        })
    };
    cuda_vmm::scope(|s| {
        let kv = cache.in_scope(s);
        let source = kv.read::<u32>(0..chunk)?;
        thread::scope(|t| {
            let mut workers = Vec::new();
            for (i, stream) in streams.iter().enumerate() {
                workers.push(t.spawn(move || -> Result<(), Error> {
                    let on = s.on(stream);
                    if i < COPIERS {
                        let at = (i + 1) * chunk;
                        let mut target = kv.write::<u32>(at..at + chunk)?;
                        for _ in 0..ROUNDS {
                            on.copy_from_device(&mut target, source)?;
                        }
                    } else {
                        for _ in 0..ROUNDS {
                            let at = kv.grow(device, g)?;
                            on.memset(&mut kv.write::<u8>(at..at + 64)?, 1)?;
                            assert_eq!(kv.retire(at..at + g)?, 1);
                        }
                    }
                    Ok(())
                }));
            }
            workers
                .into_iter()
                .try_for_each(|w| w.join().expect("a worker panicked"))
        })
    })
    .unwrap();
    done.store(true, std::sync::atomic::Ordering::Release);
    watchdog.join().unwrap();
    assert_eq!(cache.stats().pages_retired as usize, RETIRERS * ROUNDS);
    cache.free().unwrap();
}

/// Two GPUs: a buffer granted to both, a page of each; a kernel on GPU 1 reads GPU 0's page and
/// writes its own while a kernel on GPU 0 runs too; a page of GPU 1 is mapped meanwhile and written
/// from GPU 0; GPU 0's page is retired behind GPU 1's kernel, and released only after it.
#[test]
fn a_retire_behind_work_on_the_other_gpu() {
    let _serial = serial();
    let Some(gpus) = common::gpus_or_skip("a_retire_behind_work_on_the_other_gpu", 2) else {
        return;
    };
    let ((d0, ctx0), (d1, ctx1)) = (&gpus[0], &gpus[1]);
    let (d0, d1) = (*d0, *d1);
    let g = granularity(d0).max(granularity(d1));
    let n = g / 8;
    let (spin0, spin1) = (spin_module(ctx0), spin_module(ctx1));
    let (k0, k1) = (
        spin0.function(c"spin_add_one").unwrap(),
        spin1.function(c"spin_add_one").unwrap(),
    );
    let data = pattern(n, 8);
    let host_in = PinnedBuffer::from_slice(ctx0, &data).unwrap();
    let fresh_in = PinnedBuffer::from_slice(ctx0, &pattern(n, 9)).unwrap();
    let mut out1 = PinnedBuffer::<u32>::zeroed(ctx1, n).unwrap();
    let mut out0 = PinnedBuffer::<u32>::zeroed(ctx0, n).unwrap();
    let mut fresh_out = PinnedBuffer::<u32>::zeroed(ctx0, n).unwrap();
    let (s0, s1) = (Stream::new(ctx0).unwrap(), Stream::new(ctx1).unwrap());
    let (uploaded, gpu1_done) = (Event::new(ctx0).unwrap(), Event::new(ctx1).unwrap());
    let n32 = u32::try_from(n).unwrap();
    let mut cache = VirtualBuffer::new(8 * g, &[d0, d1], ReadWrite).unwrap();
    cache.map_page(0, d0, g).unwrap(); // GPU 0's page
    cache.map_page(g, d1, g).unwrap(); // GPU 1's page
    cuda_vmm::scope(|s| {
        let (q0, q1) = (s.on(&s0), s.on(&s1));
        let kv = cache.in_scope(s);
        let mut a = kv.write::<u32>(0..g / 2)?;
        let mut a_half = kv.write_on::<u32>(d0, g / 2..g)?;
        let mut b = kv.write_on::<u32>(d1, g..g + g / 2)?;
        let up = q0.copy_from_host(&mut a, &host_in)?;
        q0.record(&uploaded)?;
        q1.wait(&uploaded)?;
        // SAFETY: spin_add_one(u32*, const u32*, u32, u64), `n` values of each view.
        let (on1, (), (), ()) = unsafe {
            q1.launch(
                &k1,
                (64, 1, 1),
                (256, 1, 1),
                (&mut b, up, n32, 300_000_000u64),
            )?
        };
        // SAFETY: as above.
        let (on0, (), (), ()) = unsafe {
            q0.launch(
                &k0,
                (64, 1, 1),
                (256, 1, 1),
                (&mut a_half, up, n32, 100_000_000u64),
            )?
        };
        q1.copy_to_host(&mut out1, on1)?;
        q1.record(&gpu1_done)?;
        q0.copy_to_host(&mut out0, on0)?;
        // A page of GPU 1, mapped while both kernels run, written and read from GPU 0.
        let at = kv.grow(d1, g)?;
        let mut fresh = kv.write_on::<u32>(d0, at..at + g / 2)?;
        let wrote = q0.copy_from_host(&mut fresh, &fresh_in)?;
        q0.copy_to_host(&mut fresh_out, wrote)?;
        // GPU 0's page is read by GPU 1's kernel: retired behind it.
        assert_eq!(kv.retire(0..g)?, 1);
        assert!(
            !gpu1_done.is_complete()?,
            "GPU 1's kernel ended too soon for this test"
        );
        assert_eq!(kv.reclaim()?, 0, "released while GPU 1's kernel reads it");
        gpu1_done.synchronize()?;
        s0.synchronize()?;
        assert_eq!(kv.reclaim()?, 1);
        Ok(())
    })
    .unwrap();
    assert_eq!(
        out1.to_vec(),
        plus_one(&data),
        "GPU 1's kernel over GPU 0's page"
    );
    assert_eq!(out0.to_vec(), plus_one(&data), "GPU 0's kernel");
    assert_eq!(
        fresh_out.to_vec(),
        pattern(n, 9),
        "GPU 1's new page, from GPU 0"
    );
    cache.free().unwrap();
}

/// Two GPUs: a prefix page of GPU 1's memory shared by a buffer of GPU 0 (read-only) and one of
/// both GPUs (read-write, its writer): every mapping reads the bytes written once, from either GPU.
#[test]
fn a_prefix_page_shared_across_two_gpus() {
    let _serial = serial();
    let Some(gpus) = common::gpus_or_skip("a_prefix_page_shared_across_two_gpus", 2) else {
        return;
    };
    let (d0, d1) = (gpus[0].0, gpus[1].0);
    let g = granularity(d0).max(granularity(d1));
    let prefix = SharedPage::new(d1, g).unwrap();
    let mut writer = VirtualBuffer::new(g, &[d1, d0], ReadWrite).unwrap();
    writer.map_shared(0, &prefix).unwrap();
    let reader = VirtualBuffer::new(2 * g, &[d0], cuda_vmm::ReadOnly).unwrap();
    reader.map_shared(0, &prefix).unwrap();
    reader.map_shared(g, &prefix).unwrap();
    let data = pattern(g / 4, 77);
    writer
        .slice_bytes_mut::<u32>(..)
        .unwrap()
        .copy_from_host(&data)
        .unwrap();
    assert_eq!(
        writer
            .slice_bytes_on::<u32>(d0, ..)
            .unwrap()
            .to_vec()
            .unwrap(),
        data
    );
    assert_eq!(
        reader.slice_bytes::<u32>(..g).unwrap().to_vec().unwrap(),
        data
    );
    assert_eq!(
        reader.slice_bytes::<u32>(g..).unwrap().to_vec().unwrap(),
        data
    );
    assert_eq!(prefix.share_count(), 4);
    drop((writer, reader));
    assert_eq!(prefix.share_count(), 1);
}

/// Whether `result` is the refusal of an evicted range, naming exactly `range`.
fn names_evicted<T>(result: &Result<T, Error>, range: std::ops::Range<usize>) -> bool {
    matches!(
        result,
        Err(Error::PageRange { start, end, problem })
            if (*start, *end) == (range.start, range.end) && problem.contains("evicted")
    )
}

/// A 64 MiB page evicted inside a scope, behind a 300 ms kernel that writes it, while a 900 ms
/// kernel runs on another stream of the scope: the eviction returns at once (the kernel's event and
/// the copy's not complete); every lend, view, page, retire and eviction of the range is refused at
/// once, naming the evicted bytes; free memory does not move while either kernel runs (a restore is
/// refused then: the old page is not released), and rises by exactly the page's bytes once both
/// have finished. The evicted bytes are the kernel's; after a stream-ordered restore they are the
/// same at the same address, read by queued work and by the host after the scope, and old handles
/// do not reach the new page.
#[test]
#[allow(clippy::too_many_lines)] // one timeline against two running kernels, read in order
fn a_range_evicted_in_a_scope_is_released_only_after_every_stream() {
    let _serial = serial();
    let Some((device, ctx)) =
        gpu_or_skip("a_range_evicted_in_a_scope_is_released_only_after_every_stream")
    else {
        return;
    };
    let g = granularity(device);
    let big = align_size(64 << 20, g).unwrap();
    let n = g / 4;
    let module = spin_module(&ctx);
    let kernel = module.function(c"spin_add_one").unwrap();
    let data = pattern(n, 31);
    let host_in = PinnedBuffer::from_slice(&ctx, &data).unwrap();
    let mut refused_out = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let mut restored_out = PinnedBuffer::<u32>::zeroed(&ctx, big / 4).unwrap();
    let (work, side) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let (uploaded, written, side_done) = (
        Event::new(&ctx).unwrap(),
        Event::new(&ctx).unwrap(),
        Event::new(&ctx).unwrap(),
    );
    let n32 = u32::try_from(n).unwrap();
    warm_up(&ctx);
    let free_at_start = free_memory(&ctx);
    let mut cache = VirtualBuffer::new(4 * big, &[device], ReadWrite).unwrap();
    cache.grow(device, big).unwrap(); // the kernels' source, and the side kernel's output
    cache.grow(device, big).unwrap(); // written by the first kernel, evicted
    let before = pattern(big / 4, 32);
    cache
        .slice_bytes_mut::<u32>(big..2 * big)
        .unwrap()
        .copy_from_host(&before)
        .unwrap();
    let mut expected = plus_one(&data);
    expected.extend_from_slice(&before[n..]);
    let base = cache.base();

    let mut took = Duration::ZERO;
    cuda_vmm::scope(|s| {
        let (w, sd) = (s.on(&work), s.on(&side));
        let kv = cache.in_scope(s);
        let mut src = kv.write::<u32>(0..g)?;
        let mut side_dst = kv.write::<u32>(g..2 * g)?;
        let mut dst = kv.write::<u32>(big..big + g)?;
        let up = w.copy_from_host(&mut src, &host_in)?;
        w.record(&uploaded)?;
        sd.wait(&uploaded)?;
        // SAFETY: spin_add_one(u32*, const u32*, u32, u64), `n` values of each view.
        unsafe { sd.launch(&kernel, GRID, BLOCK, (&mut side_dst, up, n32, nanos(3 * SPIN)))? };
        sd.record(&side_done)?;
        // SAFETY: as above.
        let (out, (), (), ()) =
            unsafe { w.launch(&kernel, GRID, BLOCK, (&mut dst, up, n32, nanos(SPIN)))? };
        w.record(&written)?;

        let start = Instant::now();
        let asleep = kv.evict(w, big..2 * big)?;
        took = start.elapsed();
        assert!(!written.is_complete()?, "the eviction waited for the kernel");
        assert!(
            !asleep.is_complete()?,
            "the copy ran before the kernel that writes its bytes"
        );
        assert_eq!(
            asleep.ranges().map(|r| (r.start, r.end)).collect::<Vec<_>>(),
            [(big, 2 * big)]
        );
        assert_eq!((kv.evicted_bytes(), kv.retired_bytes()), (big, big));
        let free_evicting = free_memory(&ctx);
        assert_eq!(kv.reclaim()?, 0, "released while the kernels run");

        // Refused at once, naming the evicted bytes: new views, every old handle, a page over it.
        let evicted_range = big..2 * big;
        assert!(
            names_evicted(&kv.read::<u32>(big..big + 4), evicted_range.clone()),
            "a new view"
        );
        assert!(
            names_evicted(
                &kv.write::<u32>(2 * big - 4..2 * big),
                evicted_range.clone()
            ),
            "a new writable view"
        );
        assert!(
            names_evicted(&w.memset(&mut dst, 0), evicted_range.clone()),
            "a write through the slot lent before"
        );
        assert!(
            names_evicted(&w.copy_to_host(&mut refused_out, out), evicted_range.clone()),
            "a read through the kernel's written handle"
        );
        assert!(
            names_evicted(&kv.map_page(big, device, big), evicted_range.clone()),
            "a page over it"
        );
        assert!(is_page_range(&kv.evict(w, big..2 * big)), "a second eviction");
        assert!(is_page_range(&kv.retire(big..2 * big)), "a retire");
        assert!(!written.is_complete()?, "the checks waited");

        let evicted = asleep.wait()?; // the test's wait: the kernel and the copy only
        assert!(
            !side_done.is_complete()?,
            "the side kernel ended too soon for this test"
        );
        assert_eq!(
            evicted.host_bytes(),
            bytemuck::cast_slice::<u32, u8>(&expected),
            "the evicted bytes are the kernel's"
        );
        assert_eq!(
            kv.reclaim()?,
            0,
            "released while the side stream's kernel runs"
        );
        assert_eq!(
            free_memory(&ctx),
            free_evicting,
            "memory moved while a kernel of the scope runs"
        );
        // A restore now would map over the page still mapped: refused, the handle back.
        let refused = kv.restore(w, evicted).unwrap_err();
        assert!(
            matches!(refused.error(), Error::PageRange { start, end, .. } if (*start, *end) == (big, 2 * big)),
            "{}",
            refused.error()
        );
        let evicted = refused.into_evicted();

        side_done.synchronize()?;
        w.synchronize()?;
        assert_eq!(kv.reclaim()?, 1);
        assert_eq!(
            free_memory(&ctx),
            free_evicting + big,
            "free memory rises by exactly the evicted bytes"
        );
        assert_eq!((kv.evicted_bytes(), kv.retired_bytes()), (big, 0));

        kv.restore(w, evicted)?;
        assert_eq!(
            free_memory(&ctx),
            free_evicting,
            "the restore maps the page again"
        );
        assert_eq!(kv.evicted_bytes(), 0);
        assert!(
            is_page_range(&w.memset(&mut dst, 0)),
            "an old handle over the restored page"
        );
        let back = kv.read::<u32>(big..2 * big)?;
        w.copy_to_host(&mut restored_out, back)?; // after the restore's copy, on its stream
        Ok(())
    })
    .unwrap();
    println!("eviction behind a {SPIN:?} kernel: returned in {took:?}");
    assert_eq!(restored_out.to_vec(), expected, "read by queued work");
    assert_eq!(cache.base(), base, "the address is unchanged");
    assert_eq!(
        cache
            .slice_bytes::<u32>(big..2 * big)
            .unwrap()
            .to_vec()
            .unwrap(),
        expected,
        "read by the host after the scope"
    );
    let pages: Vec<(usize, usize)> = cache.pages().map(|p| (p.offset, p.size)).collect();
    assert_eq!(pages, [(0, big), (big, big)]);
    let stats = cache.stats();
    assert_eq!((stats.pages_evicted, stats.pages_restored), (1, 1));
    cache.free().unwrap();
    assert_eq!(free_memory(&ctx), free_at_start, "leaked");
}

/// One round of evictions and restores inside a scope, with faults injected: a hole, a shared page
/// and a page cut in two refused; a stream of another scope refused; a handle of another buffer
/// refused; every third round, the handle dropped while its copy may run (the range stays
/// evicted); otherwise the range restored on the scope's stream and read back by queued work.
fn scoped_evict_round(
    ctx: &Context,
    g: usize,
    round: u32,
    (work, stranger): (&Stream, &Stream),
    out: &mut PinnedBuffer<u32>,
) {
    let device = ctx.device();
    let prefix = SharedPage::new(device, g).unwrap();
    let mut cache = VirtualBuffer::new(8 * g, &[device], ReadWrite).unwrap();
    let mut other = VirtualBuffer::new(g, &[device], ReadWrite).unwrap();
    cache.grow(device, 2 * g).unwrap();
    cache.grow(device, g).unwrap();
    cache.map_shared(4 * g, &prefix).unwrap(); // a hole at 3g..4g
    other.grow(device, g).unwrap();
    let data = pattern(3 * g / 4, round);
    cache
        .slice_bytes_mut::<u32>(..3 * g)
        .unwrap()
        .copy_from_host(&data)
        .unwrap();
    let foreign = other.evict(..).unwrap();
    let dropped_in_flight = round.is_multiple_of(3);
    cuda_vmm::scope(|s| {
        let w = s.on(work);
        let kv = cache.in_scope(s);
        assert!(is_page_range(&kv.evict(w, 3 * g..4 * g)), "a hole");
        assert!(is_page_range(&kv.evict(w, 4 * g..5 * g)), "a shared page");
        assert!(is_page_range(&kv.evict(w, g..3 * g)), "a page cut in two");
        let outsider = cuda_vmm::scope(|inner| {
            Ok(matches!(
                kv.evict(inner.on(stranger), 2 * g..3 * g),
                Err(Error::StreamRefused { .. })
            ))
        })?;
        assert!(outsider, "an eviction on a stream of another scope");
        let wrong = kv.restore(w, foreign).unwrap_err();
        assert!(matches!(wrong.error(), Error::InvalidArgument { .. }));
        drop(wrong);
        let asleep = kv.evict(w, ..2 * g)?;
        if dropped_in_flight {
            drop(asleep); // waits for the copy before freeing the bytes
            return Ok(());
        }
        let evicted = asleep.wait()?;
        w.synchronize()?;
        assert_eq!(kv.reclaim()?, 1);
        kv.restore(w, evicted)?;
        let back = kv.read::<u32>(..3 * g)?;
        w.copy_to_host(&mut *out, back)?;
        Ok(())
    })
    .unwrap();
    if dropped_in_flight {
        assert_eq!(cache.evicted_bytes(), 2 * g, "round {round}");
    } else {
        assert_eq!(out.to_vec(), data, "round {round}");
    }
    drop(prefix);
    if round.is_multiple_of(2) {
        cache.free().unwrap();
    } // else dropped, with the retire of a dropped eviction pending or not.
}

/// Three hundred rounds of evictions and restores inside scopes, with faults injected (over 3 000
/// calls), leave free memory where it was, to the byte.
#[test]
fn scoped_evict_restore_rounds_with_faults_leak_nothing() {
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("scoped_evict_restore_rounds_with_faults_leak_nothing")
    else {
        return;
    };
    let g = granularity(device);
    let (work, stranger) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut out = PinnedBuffer::<u32>::zeroed(&ctx, 3 * g / 4).unwrap();
    warm_up(&ctx);
    scoped_evict_round(&ctx, g, 1, (&work, &stranger), &mut out);
    let free_before = free_memory(&ctx);
    let rounds = 300;
    for round in 1..=rounds {
        scoped_evict_round(&ctx, g, round, (&work, &stranger), &mut out);
    }
    work.synchronize().unwrap();
    let free_after = free_memory(&ctx);
    println!(
        "{rounds} scoped eviction rounds with faults: free before {free_before}, after {free_after}"
    );
    assert_eq!(
        free_after,
        free_before,
        "leaked {} bytes",
        free_before.abs_diff(free_after)
    );
}
