//! The reserve of a `VirtualBuffer` against a real driver: pages made ahead of need by a worker
//! thread are memory the buffer holds, never more than its bound (also with 16 threads mapping and
//! retiring at once), never reachable by a view, given back by `trim` and the drop with free device
//! memory exact to the byte; a refill the worker fails surfaces as the error of the next grow, with
//! no page lost; retired pages are released (or their memory recycled into the reserve, or the
//! page recycled in place with no driver call at all) by the worker, with no call of the caller,
//! and each once where a map races the worker for it. Free memory is compared, so the tests here
//! take a lock, and nothing else runs in this process.

mod common;

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use cuda_vmm::ipc::DmaBufLayout;
use cuda_vmm::owned::{BufferStats, PageOptions, ReserveOptions};
use cuda_vmm::{
    Context, Device, DriverError, Error, Granularity, ReadWrite, Stream, VirtualBuffer,
    allocation_granularity,
};

static SERIAL: Mutex<()> = Mutex::new(());

/// The threads, their rounds each and the reserve's bound of the concurrent test.
const THREADS: usize = 16;
const ROUNDS: usize = 25;
const BOUND: usize = 3;

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What every test here starts with: the lock that runs them one at a time (held first, also by
/// a test that then skips), GPU 0 and its context, and its minimum granularity (a page). `None`
/// where there is no device: the test skips, visibly.
fn gpu(test: &str) -> Option<(MutexGuard<'static, ()>, Device, Context, usize)> {
    let serial = serial();
    let (device, ctx) = common::gpu_or_skip(test)?;
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    Some((serial, device, ctx, g))
}

/// Polls `buffer`'s counts until `done` holds (the worker runs on its own time), for at most ten
/// seconds: the counts then.
fn wait_for(
    buffer: &VirtualBuffer,
    what: &str,
    done: impl Fn(&BufferStats) -> bool,
) -> BufferStats {
    let start = Instant::now();
    loop {
        let stats = buffer.stats();
        if done(&stats) {
            return stats;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "waited 10 s for {what}: {stats:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn free(ctx: &Context) -> usize {
    ctx.memory_info().unwrap().0
}

/// Every page the reserve took in (made by the worker, or a retired page recycled in place) is
/// taken, given back, or still held.
fn balanced(stats: &BufferStats) -> bool {
    stats.reserve_created + stats.reserve_recycled_in_place
        == stats.reserve_taken + stats.reserve_released + stats.reserve_pages
}

/// The VMM calls made on the buffer so far: `cuMemMap`, `cuMemUnmap`, `cuMemSetAccess`.
fn vmm_calls(stats: &BufferStats) -> (u64, u64, u64) {
    (stats.map_calls, stats.unmap_calls, stats.set_access_calls)
}

/// Every page retired so far has been taken by the worker: released, its memory mapped again, or
/// recycled in place.
fn retires_taken(stats: &BufferStats) -> bool {
    stats.pages_retired
        == stats.released_in_background + stats.reserve_recycled + stats.reserve_recycled_in_place
}

#[test]
fn trim_gives_back_free_memory_exact_to_the_byte() {
    let Some((_serial, device, ctx, g)) = gpu("trim_gives_back_free_memory_exact_to_the_byte")
    else {
        return;
    };
    let free_start = free(&ctx);
    let mut kv = VirtualBuffer::new(64 * g, &[device], ReadWrite).unwrap();
    kv.grow(device, g).unwrap();
    let before = free(&ctx);
    kv.reserve_ahead(ReserveOptions::new(device, g, 4)).unwrap();
    let stats = wait_for(&kv, "4 pages ahead", |s| s.reserve_pages == 4);
    assert_eq!(stats.reserve_bytes, 4 * g as u64);
    assert_eq!(
        before - free(&ctx),
        4 * g,
        "the reserve is memory the buffer holds"
    );
    assert_eq!(kv.mapped_bytes(), g, "and not the buffer's pages");
    assert_eq!(kv.pages().len(), 1);
    assert_eq!(kv.end(), g);
    assert_eq!(kv.trim().unwrap(), 4);
    assert_eq!(free(&ctx), before, "trim gave back every byte");
    let stats = kv.stats();
    assert_eq!((stats.reserve_pages, stats.reserve_released), (0, 4));
    assert!(balanced(&stats), "{stats:?}");
    assert!(stats.reserve_peak_pages <= 4);
    // Once more, given back by the drop.
    kv.reserve_ahead(ReserveOptions::new(device, g, 3)).unwrap();
    wait_for(&kv, "3 pages ahead", |s| s.reserve_pages == 3);
    drop(kv);
    assert_eq!(free(&ctx), free_start, "the drop gave back every byte");
}

#[test]
fn a_ready_page_is_unreachable_by_views_and_a_map_takes_it_with_no_driver_call() {
    let test = "a_ready_page_is_unreachable_by_views_and_a_map_takes_it_with_no_driver_call";
    let Some((_serial, device, ctx, g)) = gpu(test) else {
        return;
    };
    let stream = Stream::new(&ctx).unwrap();
    let mut kv = VirtualBuffer::new(8 * g, &[device], ReadWrite).unwrap();
    kv.reserve_ahead(ReserveOptions::new(device, g, 2)).unwrap();
    wait_for(&kv, "2 pages ahead", |s| s.reserve_pages == 2);
    let refused = |result: Result<(), Error>, what: &str| match result {
        Err(Error::PageRange {
            start,
            end,
            problem,
        }) => {
            assert_eq!((start, end), (0, g), "{what}: the bytes named");
            assert!(problem.contains("reserve"), "{what}: {problem}");
        }
        other => panic!("{what}: a page of the reserve reached: {other:?}"),
    };
    refused(kv.slice_bytes::<u8>(..g).map(drop), "slice_bytes");
    refused(kv.slice_bytes_mut::<u8>(..g).map(drop), "slice_bytes_mut");
    assert_eq!(
        kv.retire_after(&stream, ..g).unwrap(),
        0,
        "no page of the buffer to retire"
    );
    cuda_vmm::scope(|s| {
        let scoped = kv.in_scope(s);
        refused(scoped.read::<u8>(..g).map(drop), "read");
        refused(scoped.write::<u8>(..g).map(drop), "write");
        Ok(())
    })
    .unwrap();
    let calls = kv.stats().map_calls;
    assert_eq!(kv.grow(device, g).unwrap(), 0);
    let stats = kv.stats();
    assert_eq!(stats.reserve_taken, 1);
    assert!(
        stats.map_calls <= calls + 1,
        "the grow made no map of its own (the worker may refill meanwhile)"
    );
    kv.slice_bytes_mut::<u32>(..g)
        .unwrap()
        .copy_from_host(&vec![7; g / 4])
        .unwrap();
    assert!(
        kv.slice_bytes::<u32>(..g)
            .unwrap()
            .to_vec()
            .unwrap()
            .iter()
            .all(|&v| v == 7)
    );
    // A map of another size over pages of the reserve gives them back first.
    wait_for(&kv, "refilled", |s| s.reserve_pages == 2);
    kv.map_page(g, device, 2 * g).unwrap();
    let stats = kv.stats();
    assert_eq!(stats.reserve_released, 2, "{stats:?}");
    assert!(balanced(&stats), "{stats:?}");
    assert_eq!(kv.mapped_bytes(), 3 * g);
}

#[test]
fn an_injected_refill_fault_surfaces_at_the_next_grow_and_loses_no_page() {
    let test = "an_injected_refill_fault_surfaces_at_the_next_grow_and_loses_no_page";
    let Some((_serial, device, ctx, g)) = gpu(test) else {
        return;
    };
    let free_start = free(&ctx);
    let mut kv = VirtualBuffer::new(16 * g, &[device], ReadWrite).unwrap();
    kv.reserve_ahead(ReserveOptions::new(device, g, 2).with_failing_create(3))
        .unwrap();
    wait_for(&kv, "2 pages ahead", |s| s.reserve_pages == 2);
    assert_eq!(kv.grow(device, g).unwrap(), 0, "taken");
    wait_for(&kv, "the third fill refused", |s| s.reserve_faults == 1);
    assert_eq!(
        kv.grow(device, g).unwrap(),
        g,
        "taken: made before the fault"
    );
    let fault = kv.grow(device, g).unwrap_err();
    assert_eq!(fault.driver(), Some(DriverError::OUT_OF_MEMORY), "{fault}");
    assert_eq!(kv.end(), 2 * g, "the refused grow mapped nothing");
    assert_eq!(kv.grow(device, g).unwrap(), 2 * g, "the next grow maps");
    let stats = kv.stats();
    assert_eq!(stats.pages_mapped, 3);
    assert_eq!(stats.reserve_faults, 1);
    assert!(balanced(&stats), "{stats:?}");
    assert_eq!(kv.mapped_bytes(), 3 * g);
    assert_eq!(kv.unmap(..).unwrap(), 3);
    let stats = kv.stats();
    assert_eq!(stats.pages_released, stats.pages_mapped, "{stats:?}");
    drop(kv);
    assert_eq!(free(&ctx), free_start, "no page lost");
}

#[test]
fn the_worker_releases_retired_pages_with_no_call_of_the_caller() {
    let test = "the_worker_releases_retired_pages_with_no_call_of_the_caller";
    let Some((_serial, device, ctx, g)) = gpu(test) else {
        return;
    };
    let stream = Stream::new(&ctx).unwrap();
    let mut kv = VirtualBuffer::new(16 * g, &[device], ReadWrite).unwrap();
    kv.reserve_ahead(ReserveOptions::new(device, g, 1)).unwrap();
    kv.grow(device, g).unwrap();
    kv.grow(device, g).unwrap();
    wait_for(&kv, "refilled", |s| s.reserve_pages == 1);
    let before = free(&ctx);
    assert_eq!(kv.retire_after(&stream, ..2 * g).unwrap(), 2);
    let stats = wait_for(&kv, "the retired pages released", |s| {
        s.released_in_background == 2
    });
    assert_eq!(stats.pages_released, 2);
    assert_eq!(kv.retired_bytes(), 0);
    assert_eq!(kv.mapped_bytes(), 0);
    assert_eq!(free(&ctx) - before, 2 * g, "their memory is free");
}

/// Four pages taken from a reserve of eight and retired at once, behind no work, while the
/// reserve has room for them: the counts once every retired page has been handled.
fn retire_with_room(
    kv: &mut VirtualBuffer,
    stream: &Stream,
    device: Device,
    g: usize,
) -> BufferStats {
    retire_with_room_after(kv, stream, device, g, |_| ())
}

/// As [`retire_with_room`], with `between` done to the buffer after the four pages are taken and
/// before they are retired.
fn retire_with_room_after(
    kv: &mut VirtualBuffer,
    stream: &Stream,
    device: Device,
    g: usize,
    between: impl FnOnce(&VirtualBuffer),
) -> BufferStats {
    kv.reserve_ahead(ReserveOptions::new(device, g, 8)).unwrap();
    wait_for(kv, "eight pages ahead", |s| s.reserve_pages == 8);
    for _ in 0..4 {
        kv.grow(device, g).unwrap();
    }
    between(kv);
    assert_eq!(kv.retire_after(stream, ..4 * g).unwrap(), 4);
    let start = Instant::now();
    while kv.retired_bytes() > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "waited 10 s for the retired pages"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    kv.stats()
}

/// The memory of an exportable buffer's retired pages is released, never made a page of the
/// reserve again: a process that imported a handle of it may still map it, and would see (and
/// write) the bytes of the next page made of it. The same retires on a plain buffer recycle some
/// of their memory (so the scenario reaches the recycling path); on an exportable one, none.
#[test]
fn memory_made_exportable_is_released_never_recycled() {
    let test = "memory_made_exportable_is_released_never_recycled";
    let Some((_serial, device, ctx, g)) = gpu(test) else {
        return;
    };
    let stream = Stream::new(&ctx).unwrap();
    let mut plain = VirtualBuffer::new(16 * g, &[device], ReadWrite).unwrap();
    let plain_stats = retire_with_room(&mut plain, &stream, device, g);
    println!("plain buffer: {plain_stats:?}");
    assert!(
        plain_stats.reserve_recycled > 0,
        "the scenario recycled nothing on a plain buffer: {plain_stats:?}"
    );
    plain.free().unwrap();
    let mut exportable =
        cuda_vmm::owned::ExportableBuffer::new(16 * g, &[device], ReadWrite).unwrap();
    let stats = retire_with_room(&mut exportable, &stream, device, g);
    println!("exportable buffer: {stats:?}");
    assert_eq!(
        stats.reserve_recycled, 0,
        "exportable memory used again: {stats:?}"
    );
    assert_eq!(stats.pages_released, 4);
    exportable.free().unwrap();
}

/// The memory of pages a dma-buf was exported of is released, never made a page of the reserve
/// again: a network adapter's registration of the descriptor may keep the memory after the buffer
/// lets it go. The same retires on the same kind of buffer with nothing exported recycle some of
/// their memory (so the scenario reaches the recycling path); after an export, none. Skips where
/// the device exports no dma-buf.
#[test]
fn pages_exported_as_a_dma_buf_are_released_never_recycled() {
    let test = "pages_exported_as_a_dma_buf_are_released_never_recycled";
    let Some((_serial, device, ctx, g)) = gpu(test) else {
        return;
    };
    let caps = device.capabilities().unwrap();
    if !caps.dma_buf {
        common::skip(&format!(
            "{test}: the device exports no dma-buf (attribute 124)"
        ));
        return;
    }
    let stream = Stream::new(&ctx).unwrap();
    let options = PageOptions::new().with_rdma(caps.gpu_direct_rdma_with_vmm);
    let mut plain = VirtualBuffer::with_options(16 * g, &[device], ReadWrite, options).unwrap();
    let plain_stats = retire_with_room(&mut plain, &stream, device, g);
    println!("nothing exported: {plain_stats:?}");
    assert!(
        plain_stats.reserve_recycled > 0,
        "the scenario recycled nothing: {plain_stats:?}"
    );
    plain.free().unwrap();
    let mut kv = VirtualBuffer::with_options(16 * g, &[device], ReadWrite, options).unwrap();
    let stats = retire_with_room_after(&mut kv, &stream, device, g, |kv| {
        drop(kv.export_dma_buf(..4 * g, DmaBufLayout::PerPage).unwrap());
    });
    println!("exported as dma-bufs: {stats:?}");
    assert_eq!(
        stats.reserve_recycled, 0,
        "exported memory used again: {stats:?}"
    );
    assert_eq!(stats.pages_released, 4);
    kv.free().unwrap();
}

#[test]
fn the_bound_holds_under_16_threads_mapping_and_retiring() {
    let test = "the_bound_holds_under_16_threads_mapping_and_retiring";
    let Some((_serial, device, ctx, g)) = gpu(test) else {
        return;
    };
    let stream = Stream::new(&ctx).unwrap();
    let free_start = free(&ctx);
    let mut kv = VirtualBuffer::new(2 * THREADS * ROUNDS * g, &[device], ReadWrite).unwrap();
    kv.reserve_ahead(ReserveOptions::new(device, g, BOUND))
        .unwrap();
    cuda_vmm::scope(|s| {
        let work = s.on(&stream);
        let kv = kv.in_scope(s);
        std::thread::scope(|t| {
            for thread in 0..THREADS {
                t.spawn(move || {
                    for round in 0..ROUNDS {
                        let at = kv.grow(device, g).unwrap();
                        if round.is_multiple_of(2) {
                            // A page touched by queued work, then retired behind it.
                            let mut slot = kv.write::<u32>(at..at + 1024).unwrap();
                            work.memset(&mut slot, thread as u8).unwrap();
                        }
                        kv.retire(at..at + g).unwrap();
                        let stats = kv.stats();
                        assert!(
                            stats.reserve_pages <= BOUND as u64,
                            "thread {thread}, round {round}: {stats:?}"
                        );
                    }
                });
            }
        });
        Ok(())
    })
    .unwrap();
    let stats = kv.stats();
    assert!(stats.reserve_peak_pages <= BOUND as u64, "{stats:?}");
    assert_eq!(stats.pages_mapped, (THREADS * ROUNDS) as u64);
    assert_eq!(stats.pages_retired, (THREADS * ROUNDS) as u64);
    assert!(
        stats.reserve_taken > 0,
        "no grow used the reserve: {stats:?}"
    );
    assert!(balanced(&stats), "{stats:?}");
    kv.trim().unwrap();
    kv.reclaim().unwrap();
    let stats = kv.stats();
    assert_eq!(
        stats.pages_released + stats.reserve_recycled + stats.reserve_recycled_in_place,
        stats.pages_mapped,
        "every page released or recycled: {stats:?}"
    );
    assert!(
        stats.released_in_background + stats.reserve_recycled + stats.reserve_recycled_in_place > 0,
        "the worker released none: {stats:?}"
    );
    assert_eq!(kv.mapped_bytes(), 0);
    drop(kv);
    assert_eq!(free(&ctx), free_start, "free memory exact after the drop");
}

/// The slots of the ring test: the reserve's bound covers them all.
const RING: usize = 6;

/// `rounds` rounds of the ring test on `kv` (a budget of [`RING`] pages of `g` bytes, a reserve
/// holding them all): each maps the next slot, checks the bytes a ring before are still there,
/// writes and reads back, and retires the page before, waiting until the worker has taken it.
/// The counts after the round that comes back to slot 0 (the warm-up).
fn ring_rounds(kv: &mut VirtualBuffer, stream: &Stream, g: usize, rounds: usize) -> BufferStats {
    let device = kv.devices()[0];
    let words = g / 4;
    let mut warm = None;
    for round in 0..rounds {
        let page = (round % RING) * g;
        kv.map_page(page, device, g).unwrap();
        let stale = kv
            .slice_bytes::<u32>(page..page + g)
            .unwrap()
            .to_vec()
            .unwrap();
        if round >= RING {
            assert!(
                stale.iter().all(|&v| v == (round - RING) as u32),
                "round {round}: the page at {page} is not the one written a ring before"
            );
        }
        kv.slice_bytes_mut::<u32>(page..page + g)
            .unwrap()
            .copy_from_host(&vec![round as u32; words])
            .unwrap();
        let back = kv
            .slice_bytes::<u32>(page..page + g)
            .unwrap()
            .to_vec()
            .unwrap();
        assert!(
            back.iter().all(|&v| v == round as u32),
            "round {round}: read back wrong"
        );
        if round > 0 {
            let old = ((round - 1) % RING) * g;
            assert_eq!(kv.retire_after(stream, old..old + g).unwrap(), 1);
            wait_for(kv, "the retired page taken by the worker", retires_taken);
        }
        if round == RING {
            warm = Some(kv.stats());
        }
    }
    warm.unwrap()
}

/// A loop that maps a page at the next slot of a ring (`map_page`), writes it and reads it back,
/// then retires the page before, as a decode loop does: once the reserve holds every slot, each
/// retired page is recycled in place when its work has finished, and the next map that comes
/// round to its slot takes it. From then on no VMM call is made by anyone (the counts of
/// `cuMemMap`, `cuMemUnmap`, `cuMemSetAccess` stop), the bytes read back before each write are the
/// ones written a ring before (the same memory, still mapped there), those written read back
/// right, and `trim` and the drop give every byte back.
#[test]
fn a_ring_of_maps_and_retires_recycles_in_place_with_no_driver_call() {
    let test = "a_ring_of_maps_and_retires_recycles_in_place_with_no_driver_call";
    let Some((_serial, device, ctx, g)) = gpu(test) else {
        return;
    };
    let stream = Stream::new(&ctx).unwrap();
    let free_start = free(&ctx);
    let mut kv = VirtualBuffer::new(RING * g, &[device], ReadWrite).unwrap();
    let before = free(&ctx);
    kv.reserve_ahead(ReserveOptions::new(device, g, RING))
        .unwrap();
    wait_for(&kv, "every slot made ahead", |s| {
        s.reserve_pages == RING as u64
    });
    let rounds = 4 * RING;
    let warm = ring_rounds(&mut kv, &stream, g, rounds);
    let stats = kv.stats();
    println!("after warm-up {warm:?}\nat the end {stats:?}");
    assert_eq!(
        stats.reserve_taken, rounds as u64,
        "every map took a page of the reserve"
    );
    assert_eq!(
        vmm_calls(&stats),
        vmm_calls(&warm),
        "a VMM call after the warm-up"
    );
    assert_eq!(
        stats.reserve_created, RING as u64,
        "no page made after the first fill"
    );
    assert_eq!(
        stats.reserve_recycled_in_place - warm.reserve_recycled_in_place,
        (rounds - 1 - RING) as u64,
        "every retire after the warm-up recycled in place"
    );
    assert_eq!(
        stats.released_in_background + stats.reserve_recycled,
        0,
        "{stats:?}"
    );
    assert!(stats.reserve_peak_pages <= RING as u64, "{stats:?}");
    assert!(balanced(&stats), "{stats:?}");
    // The last page, retired: recycled in place too, then every page given back by the trim.
    let last = ((rounds - 1) % RING) * g;
    kv.retire_after(&stream, last..last + g).unwrap();
    wait_for(&kv, "the last retire taken", retires_taken);
    assert_eq!(kv.mapped_bytes(), 0);
    assert_eq!(kv.trim().unwrap(), RING);
    let stats = kv.stats();
    assert!(balanced(&stats), "{stats:?}");
    assert_eq!(
        stats.pages_mapped,
        stats.pages_released + stats.reserve_recycled + stats.reserve_recycled_in_place,
        "{stats:?}"
    );
    assert_eq!(free(&ctx), before, "trim gave back every byte");
    // Once more, given back by the drop.
    kv.reserve_ahead(ReserveOptions::new(device, g, RING))
        .unwrap();
    kv.grow(device, g).unwrap();
    kv.retire_after(&stream, ..g).unwrap();
    wait_for(&kv, "the retire taken", retires_taken);
    drop(kv);
    assert_eq!(free(&ctx), free_start, "the drop gave back every byte");
}

/// A page retired before an access change keeps the old set's grants: the reserve started after
/// the change never recycles it in place (its worker unmaps it), while a page retired after the
/// change, at the same place, is.
#[test]
fn a_page_retired_before_an_access_change_is_not_recycled_in_place() {
    let test = "a_page_retired_before_an_access_change_is_not_recycled_in_place";
    let Some((_serial, device, ctx, g)) = gpu(test) else {
        return;
    };
    let stream = Stream::new(&ctx).unwrap();
    let free_start = free(&ctx);
    let mut kv = VirtualBuffer::new(4 * g, &[device], ReadWrite).unwrap();
    kv.grow(device, g).unwrap();
    // No reserve runs: the retired page waits, retired, for the next call that reclaims.
    assert_eq!(kv.retire_after(&stream, ..g).unwrap(), 1);
    stream.synchronize().unwrap();
    kv.set_access(&[device]).unwrap();
    // The window of a reserve of 4 pages covers the whole budget: only the access change keeps
    // the page out of it.
    kv.reserve_ahead(ReserveOptions::new(device, g, 4)).unwrap();
    let stats = wait_for(&kv, "the retired page taken by the worker", retires_taken);
    assert_eq!(
        stats.reserve_recycled_in_place, 0,
        "recycled with the old grants: {stats:?}"
    );
    assert_eq!(
        stats.released_in_background + stats.reserve_recycled,
        1,
        "{stats:?}"
    );
    wait_for(&kv, "the reserve full", |s| s.reserve_pages == 4);
    // After the change: a page mapped, retired, and recycled in place.
    let at = kv.grow(device, g).unwrap();
    kv.retire_after(&stream, at..at + g).unwrap();
    let stats = wait_for(&kv, "the second retire taken", retires_taken);
    assert_eq!(stats.reserve_recycled_in_place, 1, "{stats:?}");
    assert!(balanced(&stats), "{stats:?}");
    drop(kv);
    assert_eq!(free(&ctx), free_start, "the drop gave back every byte");
}

/// A map of a page's range right after its retire has finished takes the page where it is, with
/// no VMM call, whether the worker recycled it in place first or the map finds it still retired
/// (the map then takes it itself): a hundred rounds, which see both as the threads run. Without
/// the map's own take, a map that comes before the worker would be refused (the page retired).
#[test]
fn a_map_right_after_a_retire_of_its_range_takes_the_page_in_place() {
    let test = "a_map_right_after_a_retire_of_its_range_takes_the_page_in_place";
    let Some((_serial, device, ctx, g)) = gpu(test) else {
        return;
    };
    let stream = Stream::new(&ctx).unwrap();
    let free_start = free(&ctx);
    let mut kv = VirtualBuffer::new(4 * g, &[device], ReadWrite).unwrap();
    kv.reserve_ahead(ReserveOptions::new(device, g, 4)).unwrap();
    assert_eq!(kv.grow(device, g).unwrap(), 0);
    let before = wait_for(&kv, "the other slots made ahead", |s| s.reserve_pages == 3);
    let rounds = 100u32;
    for round in 0..rounds {
        kv.slice_bytes_mut::<u32>(..g)
            .unwrap()
            .copy_from_host(&vec![round; g / 4])
            .unwrap();
        assert_eq!(kv.retire_after(&stream, ..g).unwrap(), 1);
        stream.synchronize().unwrap();
        kv.map_page(0, device, g)
            .unwrap_or_else(|e| panic!("round {round}: the map was refused: {e}"));
        let back = kv.slice_bytes::<u32>(..g).unwrap().to_vec().unwrap();
        assert!(
            back.iter().all(|&v| v == round),
            "round {round}: not the same page"
        );
    }
    let stats = kv.stats();
    println!("{stats:?}");
    assert_eq!(
        vmm_calls(&stats),
        vmm_calls(&before),
        "a VMM call: {stats:?}"
    );
    assert_eq!(
        stats.reserve_recycled_in_place - before.reserve_recycled_in_place,
        u64::from(rounds)
    );
    assert_eq!(
        stats.reserve_taken - before.reserve_taken,
        u64::from(rounds)
    );
    assert!(balanced(&stats), "{stats:?}");
    drop(kv);
    assert_eq!(free(&ctx), free_start, "the drop gave back every byte");
}

/// A scope's loop that writes a page on a stream, retires it behind that write, and maps the same
/// range at once, again and again: each map is refused while the retire's work runs, and tried
/// again until the page is taken in place, either by the map itself (a `cuEventQuery` under the
/// lock) or from the reserve, where the worker recycled it first (its queries run without the
/// lock, on clones of the same events). However the two meet, each retired page is taken once:
/// every map takes the same memory (no VMM call after the first fill, the bytes of the last
/// write still there), the counts balance, and the drop gives back every byte.
#[test]
fn maps_racing_the_workers_queries_take_each_retired_page_once() {
    let test = "maps_racing_the_workers_queries_take_each_retired_page_once";
    let Some((_serial, device, ctx, g)) = gpu(test) else {
        return;
    };
    let stream = Stream::new(&ctx).unwrap();
    let free_start = free(&ctx);
    let mut kv = VirtualBuffer::new(g, &[device], ReadWrite).unwrap();
    kv.reserve_ahead(ReserveOptions::new(device, g, 1)).unwrap();
    wait_for(&kv, "the page made ahead", |s| s.reserve_pages == 1);
    assert_eq!(kv.grow(device, g).unwrap(), 0);
    let before = kv.stats();
    let rounds = 2000u32;
    let mut refused = 0u64;
    cuda_vmm::scope(|s| {
        let work = s.on(&stream);
        let kv = kv.in_scope(s);
        for round in 0..rounds {
            let mut page = kv.write::<u32>(..g)?;
            work.memset(&mut page, round as u8)?;
            assert_eq!(kv.retire(..g)?, 1, "round {round}");
            let start = Instant::now();
            loop {
                match kv.map_page(0, device, g) {
                    Ok(()) => break,
                    Err(Error::PageRange { .. }) => refused += 1,
                    Err(e) => panic!("round {round}: the map failed: {e}"),
                }
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "round {round}: the retired page was never taken"
                );
            }
        }
        Ok(())
    })
    .unwrap();
    let stats = kv.stats();
    println!("{rounds} rounds, {refused} maps refused while a retire's work ran; {stats:?}");
    assert_eq!(
        vmm_calls(&stats),
        vmm_calls(&before),
        "a VMM call: {stats:?}"
    );
    assert_eq!(
        stats.reserve_recycled_in_place - before.reserve_recycled_in_place,
        u64::from(rounds),
        "every retired page taken in place once: {stats:?}"
    );
    assert_eq!(stats.pages_mapped - before.pages_mapped, u64::from(rounds));
    assert!(balanced(&stats), "{stats:?}");
    let last = (rounds - 1) as u8;
    let bytes = kv.slice_bytes::<u32>(..g).unwrap().to_vec().unwrap();
    assert!(
        bytes.iter().all(|&v| v == u32::from_ne_bytes([last; 4])),
        "the page mapped last is not the memory written last"
    );
    drop(kv);
    assert_eq!(free(&ctx), free_start, "the drop gave back every byte");
}

unsafe extern "C" {
    fn cuStreamBeginCapture_v2(stream: *mut core::ffi::c_void, mode: u32) -> u32;
    fn cuStreamEndCapture(
        stream: *mut core::ffi::c_void,
        graph: *mut *mut core::ffi::c_void,
    ) -> u32;
    fn cuGraphDestroy(graph: *mut core::ffi::c_void) -> u32;
}

/// While another thread captures a stream in GLOBAL mode (CUDA's default, which refuses every
/// thread's potentially unsafe calls in GLOBAL mode and is invalidated by them), the worker
/// creates, maps and grants a reserve of four pages: none of its calls is refused (no fault), and
/// the capture ends valid, with a graph. The calling thread is RELAXED meanwhile, so that only the
/// worker's calls are under test.
#[test]
fn the_workers_calls_leave_another_threads_global_capture_valid() {
    const GLOBAL: u32 = 0;
    const RELAXED: u32 = 2;
    let Some((_serial, device, ctx, g)) =
        gpu("the_workers_calls_leave_another_threads_global_capture_valid")
    else {
        return;
    };
    let mut kv = VirtualBuffer::new(8 * g, &[device], ReadWrite).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let raw = stream.as_raw() as usize;
    let (began_tx, began_rx) = std::sync::mpsc::channel::<u32>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let capturer = std::thread::spawn(move || {
        common::raw_bind(&ctx);
        // SAFETY: a live stream of the current context; GLOBAL mode; nothing is queued on it.
        let began = unsafe { cuStreamBeginCapture_v2(raw as *mut _, GLOBAL) };
        began_tx.send(began).unwrap();
        done_rx.recv().unwrap();
        let mut graph = core::ptr::null_mut();
        // SAFETY: the capture begun above, on this thread; `graph` is writable.
        let ended = unsafe { cuStreamEndCapture(raw as *mut _, &raw mut graph) };
        if !graph.is_null() {
            // SAFETY: the graph the capture gave, destroyed once.
            unsafe { cuGraphDestroy(graph) };
        }
        (ended, !graph.is_null())
    });
    assert_eq!(began_rx.recv().unwrap(), 0, "the capture began");
    let previous = common::exchange_capture_mode(RELAXED);
    let started = kv.reserve_ahead(ReserveOptions::new(device, g, 4));
    let stats = started.as_ref().map(|()| {
        wait_for(&kv, "4 pages ahead, or a fault", |s| {
            s.reserve_pages == 4 || s.reserve_faults > 0
        })
    });
    done_tx.send(()).unwrap();
    let (ended, graph) = capturer.join().unwrap();
    common::exchange_capture_mode(previous);
    println!(
        "a reserve filled during another thread's GLOBAL capture: {stats:?}; the capture ended \
         with {} and a graph: {graph}",
        common::code_name(ended)
    );
    let stats = stats.unwrap();
    assert_eq!(stats.reserve_faults, 0, "a worker's call was refused");
    assert_eq!((ended, graph), (0, true), "the capture was invalidated");
    assert_eq!(kv.trim().unwrap(), 4);
    kv.free().unwrap();
    drop(stream);
}
