//! The owned layer against a real driver: `VirtualBuffer` grown a thousand times, pages mapped and
//! released in the middle, faults injected, owned by many threads, striped over every GPU; owned
//! mappings kept in `Vec`s and struct fields, and raced for by many threads. Every test skips visibly
//! without a GPU (the striped one also with fewer than two).
//!
//! The tests measure free device memory to the byte, so they take one lock each, from before their
//! first context to after their last, as `tests/leaks.rs` does.

mod common;

use common::{gpu_or_skip, gpus_or_skip, pattern};
use cuda_vmm::{
    Context, Device, DriverError, Error, Granularity, PhysicalAllocation, ReadOnly, ReadWrite,
    VirtualBuffer, align_size, allocation_granularity, owned::GrantedMapping, owned::OwnedMapping,
    owned::PageInfo, owned::SharedPage, owned::SharedReservation, owned::Unmapped,
};

// The driver's own symbols with integer results, for what the safe API must not do: a mapping the
// buffer does not know of, inside its reservation, so that its `cuMemMap` is refused; a write into
// read-only pages; a read of a mapping whose revocable grant has ended.
unsafe extern "C" {
    fn cuMemMap(ptr: u64, size: usize, offset: usize, handle: u64, flags: u64) -> u32;
    fn cuMemUnmap(ptr: u64, size: usize) -> u32;
    fn cuMemsetD8_v2(dst: u64, value: u8, count: usize) -> u32;
    fn cuMemcpyDtoH_v2(dst: *mut core::ffi::c_void, src: u64, bytes: usize) -> u32;
}

/// The tests of this file measure free memory; they must not run at the same time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn granularity(device: Device) -> usize {
    allocation_granularity(device, Granularity::Minimum).unwrap()
}

/// Writes the pattern of `seed` into the `bytes` bytes at `offset`.
fn fill(buffer: &mut VirtualBuffer, offset: usize, bytes: usize, seed: u32) {
    buffer
        .slice_bytes_mut::<u32>(offset..offset + bytes)
        .unwrap()
        .copy_from_host(&pattern(bytes / 4, seed))
        .unwrap();
}

/// Asserts that the `bytes` bytes at `offset` hold the pattern of `seed`.
fn holds<M: cuda_vmm::vmm::AccessMode>(
    buffer: &VirtualBuffer<M>,
    offset: usize,
    bytes: usize,
    seed: u32,
    what: &str,
) {
    let got = buffer
        .slice_bytes::<u32>(offset..offset + bytes)
        .unwrap()
        .to_vec()
        .unwrap();
    assert!(
        got == pattern(bytes / 4, seed),
        "{what}: the bytes at {offset}..{} changed",
        offset + bytes
    );
}

/// Maps, writes, reads and releases one page on `device`: the first calls of a process may set up
/// driver bookkeeping that stays for the process's lifetime, so tests measure free memory after this.
fn warm_up(device: Device) {
    let g = granularity(device);
    let mut buffer = VirtualBuffer::new(g, &[device], ReadWrite).unwrap();
    buffer.grow(device, g).unwrap();
    fill(&mut buffer, 0, SAMPLE, 0);
    holds(&buffer, 0, SAMPLE, 0, "the warm-up page");
    buffer.free().unwrap();
}

/// The bytes at the start of a page that the long-running tests write and check.
const SAMPLE: usize = 64 << 10;

fn free_memory(ctx: &Context) -> usize {
    ctx.memory_info().unwrap().0
}

/// 1 000 growths of one buffer: its base and every page's address never change, and every byte
/// written before a growth is still there after it. Each growth checks the first and the previous
/// page in full, and every hundredth growth (and the last) reads every page, through one view that
/// spans them all (adjacent allocations are one address range to a copy).
#[test]
fn a_thousand_growths_keep_the_address_and_the_bytes() {
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("a_thousand_growths_keep_the_address_and_the_bytes")
    else {
        return;
    };
    let g = granularity(device);
    let words = g / 4;
    let growths = 1000;
    warm_up(device);
    let free_before = free_memory(&ctx);
    let mut buffer = VirtualBuffer::new(1024 * g, &[device], ReadWrite).unwrap();
    let base = buffer.base();
    // What the buffer must hold: page `n` holds the pattern of seed `n`.
    let mut expected: Vec<u32> = Vec::with_capacity(growths * words);
    let page_of = |expected: &[u32], n: usize| expected[n * words..(n + 1) * words].to_vec();
    let read = |buffer: &VirtualBuffer, n: usize| {
        buffer
            .slice_bytes::<u32>(n * g..(n + 1) * g)
            .unwrap()
            .to_vec()
            .unwrap()
    };
    for n in 0..growths {
        let offset = buffer.grow(device, g).unwrap();
        assert_eq!(offset, n * g, "growth {n} maps right after the last page");
        assert_eq!(buffer.base(), base, "growth {n} moved the base");
        let view = buffer.slice_bytes::<u8>(offset..offset + g).unwrap();
        assert_eq!(view.as_raw_ptr(), base + offset as u64);
        expected.extend(pattern(words, n as u32));
        buffer
            .slice_bytes_mut::<u32>(offset..offset + g)
            .unwrap()
            .copy_from_host(&expected[n * words..])
            .unwrap();
        assert!(
            read(&buffer, 0) == page_of(&expected, 0),
            "growth {n}: first page"
        );
        if n > 0 {
            assert!(
                read(&buffer, n - 1) == page_of(&expected, n - 1),
                "growth {n}: previous page"
            );
        }
        if n % 100 == 99 || n + 1 == growths {
            let all = buffer
                .slice_bytes::<u32>(..(n + 1) * g)
                .unwrap()
                .to_vec()
                .unwrap();
            if all != expected {
                let first = all.iter().zip(&expected).position(|(a, e)| a != e);
                panic!("growth {n}: word {first:?} changed");
            }
        }
    }
    assert_eq!(buffer.end(), growths * g);
    assert_eq!(buffer.mapped_bytes(), growths * g);
    let stats = buffer.stats();
    assert_eq!(stats.pages_mapped, growths as u64);
    assert_eq!(stats.map_calls, growths as u64);
    assert_eq!(
        stats.set_access_calls, growths as u64,
        "one grant per page, however often it was viewed"
    );
    buffer.free().unwrap();
    assert_eq!(
        free_memory(&ctx),
        free_before,
        "the memory is back to the byte"
    );
}

/// Pages unmapped and released in the middle: the other pages keep their addresses and bytes, the
/// holes refuse views (naming the hole), new pages of other sizes fill them, and the released memory
/// shows in `cuMemGetInfo` to the byte.
#[test]
fn pages_in_the_middle_are_released_and_mapped_again() {
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("pages_in_the_middle_are_released_and_mapped_again")
    else {
        return;
    };
    let g = granularity(device);
    let mut buffer = VirtualBuffer::new(16 * g, &[device], ReadWrite).unwrap();
    let base = buffer.base();
    for page in 0..8 {
        buffer.grow(device, g).unwrap();
        fill(&mut buffer, page * g, g, page as u32);
    }
    let free_full = free_memory(&ctx);

    // Pages 2, 3 and 4 in one call, page 6 alone.
    assert_eq!(buffer.unmap(2 * g..5 * g).unwrap(), 3);
    assert_eq!(buffer.unmap(6 * g..7 * g).unwrap(), 1);
    assert_eq!(
        free_memory(&ctx) - free_full,
        4 * g,
        "the four pages' memory is released"
    );
    for page in [0, 1, 5, 7] {
        holds(&buffer, page * g, g, page as u32, "a page beside the holes");
        let view = buffer.slice_bytes::<u8>(page * g..(page + 1) * g).unwrap();
        assert_eq!(view.as_raw_ptr(), base + (page * g) as u64, "page {page}");
    }
    assert_eq!(
        buffer.slice_bytes::<u8>(g..6 * g).unwrap_err(),
        Error::PageRange {
            start: 2 * g,
            end: 5 * g,
            problem: "are not mapped"
        }
    );
    let offsets: Vec<usize> = buffer.pages().map(|p| p.offset).collect();
    assert_eq!(offsets, [0, g, 5 * g, 7 * g]);

    // The holes take new pages: one of three granules, one of one.
    buffer.map_page(2 * g, device, 3 * g).unwrap();
    buffer.map_page(6 * g, device, g).unwrap();
    assert_eq!(
        free_memory(&ctx),
        free_full,
        "the same bytes are in use again"
    );
    fill(&mut buffer, 2 * g, 3 * g, 100);
    fill(&mut buffer, 6 * g, g, 101);
    for page in [0, 1, 5, 7] {
        holds(
            &buffer,
            page * g,
            g,
            page as u32,
            "a page beside the new ones",
        );
    }
    holds(&buffer, 2 * g, 3 * g, 100, "the three-granule page");
    // A view across all six pages, of two sizes, reads in one copy.
    let whole = buffer
        .slice_bytes::<u32>(..8 * g)
        .unwrap()
        .to_vec()
        .unwrap();
    assert_eq!(whole.len(), 8 * g / 4);
    assert!(whole[..g / 4] == pattern(g / 4, 0));
    assert!(whole[2 * g / 4..5 * g / 4] == pattern(3 * g / 4, 100));
    assert!(whole[7 * g / 4..] == pattern(g / 4, 7));
    assert_eq!(buffer.base(), base);
    let sizes: Vec<usize> = buffer.pages().map(|p| p.size).collect();
    assert_eq!(sizes, [g, g, 3 * g, g, g, g]);
    let stats = buffer.stats();
    assert_eq!(stats.set_access_calls, stats.pages_mapped);
    assert_eq!(stats.pages_mapped, 10);
    assert_eq!(stats.pages_released, 4);
}

/// The buffer's state as a caller sees it: pages, end, mapped bytes.
fn shape(buffer: &VirtualBuffer) -> (Vec<PageInfo>, usize, usize) {
    (
        buffer.pages().collect(),
        buffer.end(),
        buffer.mapped_bytes(),
    )
}

/// Arguments refused before any driver call, on the buffer `fault_round` sets up: pages at
/// `[0, 4g)` and `[8g, 10g)`, the rest of the `budget` unmapped.
fn refused_arguments(buffer: &mut VirtualBuffer, g: usize, budget: usize) {
    let device = buffer.devices()[0];
    // A page of 2^50 bytes does not fit the budget: refused before any driver call.
    assert!(matches!(
        buffer.grow(device, 1 << 50),
        Err(Error::OutOfBounds { .. })
    ));
    // Sizes and offsets that are zero or not whole granules.
    assert!(matches!(
        buffer.map_page(4 * g, device, 0),
        Err(Error::ZeroSize { .. })
    ));
    assert!(matches!(
        buffer.map_page(4 * g, device, g + 1),
        Err(Error::NotAligned { .. })
    ));
    assert!(matches!(
        buffer.map_page(4 * g + g / 2, device, g),
        Err(Error::NotAligned { .. })
    ));
    // Over mapped pages: the error names the page in the way.
    assert_eq!(
        buffer.map_page(3 * g, device, 2 * g).unwrap_err(),
        Error::PageRange {
            start: 3 * g,
            end: 4 * g,
            problem: "are mapped already"
        }
    );
    assert!(matches!(
        buffer.map_page(9 * g, device, g),
        Err(Error::PageRange { start, end, .. }) if (start, end) == (8 * g, 10 * g)
    ));
    // An unmap that would cut a page, views over a hole, of misplaced elements, past the budget (a
    // view of a zero-sized type does not build: `elements` asserts it at compile time).
    assert!(matches!(
        buffer.unmap(8 * g..9 * g),
        Err(Error::PageRange { start, end, .. }) if (start, end) == (8 * g, 10 * g)
    ));
    assert!(matches!(
        buffer.slice_bytes::<u8>(3 * g..9 * g),
        Err(Error::PageRange { start, end, .. }) if (start, end) == (4 * g, 8 * g)
    ));
    assert!(matches!(
        buffer.slice_bytes::<u32>(2..6),
        Err(Error::NotWholeElements { .. })
    ));
    assert!(matches!(
        buffer.slice_bytes_mut::<u8>(..=budget),
        Err(Error::OutOfBounds { .. })
    ));
}

/// One round of faults on a buffer with data in it; each fault leaves the buffer as it was (pages,
/// bytes, driver-call counts), then the round grows, shrinks, maps and unmaps for real.
fn fault_round(ctx: &Context, g: usize, huge: usize, round: u32) {
    // The first `SAMPLE` bytes of each page are written and checked: enough to see a page replaced
    // or unmapped, at a fraction of the cost of whole pages over hundreds of rounds.
    let device = ctx.device();
    let budget = huge + 16 * g;
    let mut buffer = VirtualBuffer::new(budget, &[device], ReadWrite).unwrap();
    for page in 0..4 {
        buffer.grow(device, g).unwrap();
        fill(&mut buffer, page * g, SAMPLE, round + page as u32);
    }
    buffer.map_page(8 * g, device, 2 * g).unwrap();
    fill(&mut buffer, 8 * g, SAMPLE, round + 8);
    let before = shape(&buffer);
    let stats = buffer.stats();
    let unchanged = |buffer: &VirtualBuffer, what: &str| {
        assert_eq!(shape(buffer), before, "{what} changed the pages");
        assert_eq!(buffer.stats(), stats, "{what} made a driver call on a page");
    };

    // Out of memory halfway through a grow: `cuMemCreate` refuses a page larger than the device.
    let e = buffer.grow(device, huge).unwrap_err();
    assert_eq!(e.driver(), Some(DriverError::OUT_OF_MEMORY), "{e}");
    unchanged(&buffer, "an out-of-memory grow");
    refused_arguments(&mut buffer, g, budget);
    unchanged(&buffer, "a refused argument");

    // `cuMemMap` refused after `cuMemCreate` succeeded: a stray mapping the buffer does not know of
    // sits in the hole. The page's memory is released again and the buffer is as it was.
    let stray = PhysicalAllocation::new(device, g).unwrap();
    let stray_at = buffer.base() + (5 * g) as u64;
    // SAFETY: `[stray_at, stray_at + g)` lies in the buffer's reservation, in a hole it has not
    // mapped; `stray` is alive; the range is unmapped again below, before the buffer uses it.
    assert_eq!(unsafe { cuMemMap(stray_at, g, 0, stray.as_raw(), 0) }, 0);
    let e = buffer.map_page(4 * g, device, 2 * g).unwrap_err();
    assert_eq!(e.driver(), Some(DriverError::INVALID_VALUE), "{e}");
    assert_eq!(
        shape(&buffer),
        before,
        "a refused cuMemMap changed the pages"
    );
    assert_eq!(buffer.stats().map_calls, stats.map_calls + 1);
    assert_eq!(buffer.stats().set_access_calls, stats.set_access_calls);
    // The map puts its page in the table before its calls, and takes it out again here: every
    // count but the refused call's is as it was.
    let refused = |maps: u64| {
        let mut counted = stats;
        counted.map_calls += maps;
        counted
    };
    assert_eq!(
        buffer.stats(),
        refused(1),
        "a refused cuMemMap left a count"
    );
    // The same refusal for a shared page: the share the mapping took is dropped again.
    let shared = SharedPage::new(device, g).unwrap();
    let e = buffer.map_shared(5 * g, &shared).unwrap_err();
    assert_eq!(e.driver(), Some(DriverError::INVALID_VALUE), "{e}");
    assert_eq!(shared.share_count(), 1, "a refused map kept its share");
    assert_eq!(
        shape(&buffer),
        before,
        "a refused shared map changed the pages"
    );
    assert_eq!(
        buffer.stats(),
        refused(2),
        "a refused shared map left a count"
    );
    drop(shared);
    // SAFETY: the stray mapping made above, unmapped once.
    assert_eq!(unsafe { cuMemUnmap(stray_at, g) }, 0);
    drop(stray);

    for page in 0..4 {
        holds(
            &buffer,
            page * g,
            SAMPLE,
            round + page as u32,
            "after the faults",
        );
    }
    holds(&buffer, 8 * g, SAMPLE, round + 8, "after the faults");

    // Real work: unmap the middle, map a larger page there, shrink, grow again.
    assert_eq!(buffer.unmap(8 * g..).unwrap(), 1);
    buffer.map_page(4 * g, device, 4 * g).unwrap();
    fill(&mut buffer, 4 * g, SAMPLE, round + 4);
    assert_eq!(buffer.shrink().unwrap().map(|p| p.size), Some(4 * g));
    buffer.unmap(g..2 * g).unwrap();
    buffer.grow(device, 2 * g).unwrap();
    holds(
        &buffer,
        0,
        SAMPLE,
        round,
        "the first page at the end of the round",
    );
    holds(
        &buffer,
        2 * g,
        SAMPLE,
        round + 2,
        "page 2 at the end of the round",
    );
    let stats = buffer.stats();
    assert_eq!(stats.set_access_calls, stats.pages_mapped);
    if round.is_multiple_of(2) {
        buffer.free().unwrap();
    } // else dropped: the same teardown, errors ignored.
}

/// Free memory is back to the byte after many rounds of grows, shrinks, maps and unmaps with faults
/// injected: out of memory halfway through a grow, a refused `cuMemMap`, and every refused argument.
#[test]
fn faults_leave_the_buffer_as_it_was_and_leak_nothing() {
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("faults_leave_the_buffer_as_it_was_and_leak_nothing")
    else {
        return;
    };
    let g = granularity(device);
    let (_, total) = ctx.memory_info().unwrap();
    // Larger than the device's memory, so `cuMemCreate` refuses it; the budget makes room for it, so
    // that the refusal comes from the driver and not from the budget check. A budget is address
    // space only.
    let huge = align_size(total + g, g).unwrap();
    // Warm up: the first calls may set up driver bookkeeping that stays for the process's lifetime.
    fault_round(&ctx, g, huge, 0);
    let free_before = free_memory(&ctx);
    // Each round makes 23 structural calls on its buffer (grows, maps, unmaps, a shrink, the
    // refused ones) besides its construction and teardown: 440 rounds are over 10 000 operations.
    let rounds = 440;
    for round in 1..=rounds {
        fault_round(&ctx, g, huge, round);
    }
    let free_after = free_memory(&ctx);
    println!("{rounds} rounds with faults: free before {free_before}, after {free_after}");
    assert_eq!(
        free_after,
        free_before,
        "leaked {} bytes",
        free_before.abs_diff(free_after)
    );
}

/// With an access set that never changes, `cuMemSetAccess` is called once per page mapped, however
/// many views are made; changing the set costs one call per page and phase.
#[test]
fn grants_equal_pages_mapped() {
    let _serial = serial();
    let Some((device, _ctx)) = gpu_or_skip("grants_equal_pages_mapped") else {
        return;
    };
    let g = granularity(device);
    let mut buffer = VirtualBuffer::new(128 * g, &[device], ReadWrite).unwrap();
    for _ in 0..32 {
        buffer.grow(device, g).unwrap();
    }
    for page in (64..128).step_by(2) {
        buffer.map_page(page * g, device, g).unwrap();
    }
    for n in 0..1000 {
        let page = n % 32;
        let view = buffer.slice_bytes::<u32>(page * g..(page + 1) * g).unwrap();
        assert_eq!(view.len(), g / 4);
        if n % 100 == 0 {
            fill(&mut buffer, page * g, g, n as u32);
            holds(&buffer, page * g, g, n as u32, "a viewed page");
        }
    }
    let stats = buffer.stats();
    println!("{stats:?}");
    assert_eq!(stats.pages_mapped, 64);
    assert_eq!(stats.map_calls, 64);
    assert_eq!(stats.set_access_calls, 64, "grants == pages mapped");
    assert_eq!(stats.unmap_calls, 0);

    buffer.unmap(64 * g..).unwrap();
    let stats = buffer.stats();
    assert_eq!((stats.unmap_calls, stats.pages_released), (32, 32));
    // The same set again: one grant per page, nothing to revoke.
    buffer.set_access(&[device]).unwrap();
    assert_eq!(buffer.stats().set_access_calls, 64 + 32);
    assert_eq!(buffer.devices(), [device]);
}

/// A read-only buffer grants its pages read-only: views read, and the driver refuses a write made
/// around the types (a raw `cuMemsetD8`, which the driver refuses without a sticky error; checked
/// here).
#[test]
fn read_only_buffer_reads_and_the_driver_refuses_writes() {
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("read_only_buffer_reads_and_the_driver_refuses_writes")
    else {
        return;
    };
    let g = granularity(device);
    let buffer = VirtualBuffer::new(4 * g, &[device], ReadOnly).unwrap();
    buffer.grow(device, g).unwrap();
    let view = buffer.slice_bytes::<u8>(..g).unwrap();
    assert_eq!(view.to_vec().unwrap().len(), g);
    ctx.bind_to_thread().unwrap();
    // SAFETY: `g` bytes of mapped device memory, alive for the call (the view borrows the buffer);
    // the page is read-only, which is what is being tested: the driver refuses the write.
    let code = unsafe { cuMemsetD8_v2(view.as_raw_ptr(), 7, g) };
    assert_eq!(
        code,
        DriverError::INVALID_VALUE.code(),
        "a write into a read-only page: {}",
        common::code_name(code)
    );
    // The refusal is not sticky: the context still works.
    assert_eq!(view.to_vec().unwrap().len(), g);
}

/// 16 threads each own buffers: made, grown, written, shrunk and mapped in the middle on their own
/// thread, and returned to the main thread (owned, `'static`, `Send`), which reads them and drops
/// them. Free memory is back to the byte.
#[test]
fn sixteen_threads_own_buffers() {
    const THREADS: usize = 16;
    const ROUNDS: u32 = 20;
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("sixteen_threads_own_buffers") else {
        return;
    };
    let g = granularity(device);
    warm_up(device);
    let free_before = free_memory(&ctx);
    let threads: Vec<std::thread::JoinHandle<(VirtualBuffer, VirtualBuffer)>> = (0..THREADS)
        .map(|t| {
            std::thread::spawn(move || {
                let seed = (t as u32) << 16;
                let mut kept = VirtualBuffer::new(64 * g, &[device], ReadWrite).unwrap();
                let mut churn = VirtualBuffer::new(8 * g, &[device], ReadWrite).unwrap();
                for round in 0..ROUNDS {
                    let offset = kept.grow(device, g).unwrap();
                    fill(&mut kept, offset, g, seed | round);
                    churn.map_page(2 * g, device, 2 * g).unwrap();
                    churn.map_page(0, device, g).unwrap();
                    fill(&mut churn, 2 * g, SAMPLE, seed | round);
                    holds(&churn, 2 * g, SAMPLE, seed | round, "a churned page");
                    churn.unmap(..).unwrap();
                    holds(&kept, 0, SAMPLE, seed, "the first kept page");
                }
                churn.grow(device, g).unwrap();
                fill(&mut churn, 0, g, seed | 0xffff);
                (kept, churn)
            })
        })
        .collect();
    let buffers: Vec<(VirtualBuffer, VirtualBuffer)> =
        threads.into_iter().map(|h| h.join().unwrap()).collect();
    for (t, (kept, churn)) in buffers.iter().enumerate() {
        let seed = (t as u32) << 16;
        for round in 0..ROUNDS {
            holds(
                kept,
                round as usize * g,
                g,
                seed | round,
                "a kept page, read on the main thread",
            );
        }
        holds(churn, 0, g, seed | 0xffff, "the churn buffer's last page");
        assert_eq!(kept.stats().set_access_calls, u64::from(ROUNDS));
        assert_eq!(churn.stats().set_access_calls, 2 * u64::from(ROUNDS) + 1);
    }
    drop(buffers);
    assert_eq!(
        free_memory(&ctx),
        free_before,
        "the threads' memory is back"
    );
}

/// The layout of CUDA's vectorAddMMAP sample, returned from a function: one address range striped
/// over every device's memory, `pages_per_device` pages of each in turn, granted to every device.
fn striped(devices: &[Device], pages_per_device: usize) -> Result<VirtualBuffer, Error> {
    let g = devices
        .iter()
        .map(|&d| allocation_granularity(d, Granularity::Minimum))
        .try_fold(1, |max, g| g.map(|g| max.max(g)))?;
    let pages = devices.len() * pages_per_device;
    let buffer = VirtualBuffer::new(pages * g, devices, ReadWrite)?;
    for page in 0..pages {
        buffer.grow(devices[page % devices.len()], g)?;
    }
    Ok(buffer)
}

/// A buffer striped over every GPU (two or more): one view spans the pages of all devices; every
/// device reads what another wrote, copies run directly between devices (the access set opens every
/// page to every device), and a narrower access set closes the others out. Run twice, the second time
/// between two readings of every device's free memory, which must agree to the byte.
#[test]
fn striped_over_every_gpu() {
    let _serial = serial();
    let Some(gpus) = gpus_or_skip("striped_over_every_gpu", 2) else {
        return;
    };
    let devices: Vec<Device> = gpus.iter().map(|(d, _)| *d).collect();
    let free = || -> Vec<usize> { gpus.iter().map(|(_, c)| free_memory(c)).collect() };
    striped_round(&devices);
    let free_before = free();
    striped_round(&devices);
    assert_eq!(free(), free_before, "every device's memory is back");
}

fn striped_round(devices: &[Device]) {
    let pages_per_device = 4;
    let mut src = striped(devices, pages_per_device).unwrap();
    let mut dst = striped(devices, pages_per_device).unwrap();
    let bytes = src.end();
    let page = bytes / (devices.len() * pages_per_device);
    let owners: Vec<Device> = src.pages().map(|p| p.device).collect();
    for (i, owner) in owners.iter().enumerate() {
        assert_eq!(*owner, devices[i % devices.len()], "page {i} is striped");
    }
    assert_eq!(src.devices(), devices);

    // Written in one copy through the first device, over the pages of every device.
    let data = pattern(bytes / 4, 0x5719);
    src.slice_bytes_mut::<u32>(..)
        .unwrap()
        .copy_from_host(&data)
        .unwrap();
    for &device in devices {
        let view = src.slice_bytes_on::<u32>(device, ..).unwrap();
        assert_eq!(view.device(), device);
        assert!(devices.iter().all(|&d| view.reachable_from(d)));
        assert!(
            view.to_vec().unwrap() == data,
            "read through device {device:?}"
        );
    }
    // A direct copy in the last device's context, between two striped buffers.
    let last = devices[devices.len() - 1];
    dst.slice_bytes_mut_on::<u32>(last, ..)
        .unwrap()
        .copy_from_device(&src.slice_bytes_on::<u32>(last, ..).unwrap())
        .unwrap();
    assert!(dst.slice_bytes::<u32>(..).unwrap().to_vec().unwrap() == data);
    // Between views of two devices: the source's access set opens it to the destination's device.
    let path = cuda_vmm::copy_between(
        &mut dst.slice_bytes_mut_on::<u32>(devices[0], ..page).unwrap(),
        &src.slice_bytes_on::<u32>(devices[1], page..2 * page)
            .unwrap(),
        cuda_vmm::peer::Route::Direct,
    )
    .unwrap();
    assert_eq!(path, cuda_vmm::peer::CopyPath::Direct);
    assert!(
        dst.slice_bytes::<u32>(..page).unwrap().to_vec().unwrap() == data[page / 4..2 * page / 4],
        "the second page of the source, now first in the destination"
    );

    // Only the first device from now on: one grant and one revoke per page.
    let calls = src.stats().set_access_calls;
    src.set_access(&devices[..1]).unwrap();
    let pages = (devices.len() * pages_per_device) as u64;
    assert_eq!(src.stats().set_access_calls, calls + 2 * pages);
    assert_eq!(src.devices(), [devices[0]]);
    assert!(matches!(
        src.slice_bytes_on::<u32>(devices[1], ..),
        Err(Error::DeviceMismatch { .. })
    ));
    let view = src.slice_bytes::<u32>(..).unwrap();
    assert!(!view.reachable_from(devices[1]));
    assert!(
        view.to_vec().unwrap() == data,
        "still readable by the first device"
    );
    src.free().unwrap();
    dst.free().unwrap();
}

/// An engine's state: memory kept in fields, no lifetimes.
struct Engine {
    weights: OwnedMapping,
    scratch: Vec<OwnedMapping>,
}

/// Reads the engine's weights (which hold the pattern of `seed`) on this thread, in a context of its
/// own, drops the scratch mappings and hands the weights back.
fn engine_on_another_thread(mut engine: Engine, seed: u32) -> OwnedMapping {
    let device = match engine.weights.memory().location() {
        cuda_vmm::vmm::Location::Device(device) => device,
        other => panic!("weights in {other:?}"),
    };
    let ctx = Context::new(device).unwrap();
    let words = engine.weights.size() / 4;
    let access = engine.weights.grant(&ctx, ReadOnly).unwrap();
    let got = access.slice::<u32>().unwrap().to_vec().unwrap();
    assert!(
        got == pattern(words, seed),
        "the weights, read on another thread"
    );
    engine.scratch.clear();
    engine.weights
}

/// The whole of `mapping` as `u32`s, read through a new read-only grant to `ctx`.
fn read_through_new_grant(mapping: &mut OwnedMapping, ctx: &Context) -> Vec<u32> {
    let access = mapping.grant(ctx, ReadOnly).unwrap();
    access.slice::<u32>().unwrap().to_vec().unwrap()
}

/// Owned mappings live in a `Vec` and in struct fields, outlive the reservation handle they were made
/// from, never overlap (checked at run time, naming the mapping in the way), give their memory back
/// on `unmap` to be mapped again, and free memory comes back to the byte.
#[test]
fn owned_mappings_live_in_vecs_and_never_overlap() {
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("owned_mappings_live_in_vecs_and_never_overlap") else {
        return;
    };
    let g = granularity(device);
    warm_up(device);
    let free_before = free_memory(&ctx);
    let memory = |size: usize| PhysicalAllocation::new(device, size).unwrap();

    let reservation = SharedReservation::new(16 * g, 0).unwrap();
    let base = reservation.base();
    // Every other granule.
    let mut mappings: Vec<OwnedMapping> = (0..8)
        .map(|i| reservation.map(2 * i * g, memory(g)).unwrap())
        .collect();
    // Refused before any driver call: over a mapping (named), across one, unaligned, past the end.
    assert_eq!(
        reservation.map(2 * g, memory(g)).unwrap_err(),
        Error::PageRange {
            start: 2 * g,
            end: 3 * g,
            problem: "are mapped already"
        }
    );
    assert!(matches!(
        reservation.map(g, memory(2 * g)),
        Err(Error::PageRange { start, end, .. }) if (start, end) == (2 * g, 3 * g)
    ));
    assert!(matches!(
        reservation.map(g / 2, memory(g)),
        Err(Error::NotAligned { .. })
    ));
    assert!(matches!(
        reservation.map(16 * g, memory(g)),
        Err(Error::OutOfBounds { .. })
    ));
    // The holes take mappings of their own.
    for i in 0..8 {
        mappings.push(reservation.map((2 * i + 1) * g, memory(g)).unwrap());
    }
    let all: Vec<core::ops::Range<usize>> = (0..16).map(|i| i * g..(i + 1) * g).collect();
    assert_eq!(reservation.mapped(), all);
    for mapping in &mut mappings {
        let seed = (mapping.offset() / g) as u32;
        let mut access = mapping.grant(&ctx, ReadWrite).unwrap();
        assert_eq!(access.as_raw_ptr(), base + (seed as usize * g) as u64);
        access
            .slice_mut::<u32>()
            .unwrap()
            .copy_from_host(&pattern(g / 4, seed))
            .unwrap();
    }
    // The mappings keep the range reserved without the handle.
    drop(reservation);
    let handle = mappings[0].reservation().clone();

    // Drop a third of them, from the middle of the `Vec`: their ranges are free again.
    mappings.retain(|m| (m.offset() / g) % 3 != 1);
    assert_eq!(handle.mapped().len(), mappings.len());
    for mapping in &mut mappings {
        let seed = (mapping.offset() / g) as u32;
        let access = mapping.grant(&ctx, ReadOnly).unwrap();
        let got = access.slice::<u32>().unwrap().to_vec().unwrap();
        assert!(got == pattern(g / 4, seed), "mapping at granule {seed}");
    }
    // `unmap` gives the memory back; mapped again in a freed range, it still holds its bytes.
    let moved = mappings.pop().unwrap();
    let seed = (moved.offset() / g) as u32;
    let Unmapped::Owned(kept_memory) = moved.unmap().unwrap() else {
        panic!("a mapping made by `map` gives its own memory back");
    };
    let mut again = handle.map(g, kept_memory).unwrap();
    assert!(
        read_through_new_grant(&mut again, &ctx) == pattern(g / 4, seed),
        "the memory moved with its bytes"
    );

    // Struct fields, and another thread: an owned mapping is `'static` and `Send`.
    let engine = Engine {
        weights: again,
        scratch: mappings.drain(..3).collect(),
    };
    let weights = std::thread::spawn(move || engine_on_another_thread(engine, seed))
        .join()
        .unwrap();
    drop((weights, mappings));
    assert!(handle.mapped().is_empty());
    assert!(handle.free().unwrap(), "the last share frees the range");
    assert_eq!(
        free_memory(&ctx),
        free_before,
        "the memory is back to the byte"
    );
}

/// A revocable grant of an owned mapping: written and read through its views, closed again when it
/// ends (by `revoke` or by drop), after which the mapping is granted anew and still holds its
/// bytes. Free memory is back to the byte.
#[test]
fn owned_mapping_revocable_grant_ends_and_the_mapping_is_granted_again() {
    let _serial = serial();
    let Some((device, ctx)) =
        gpu_or_skip("owned_mapping_revocable_grant_ends_and_the_mapping_is_granted_again")
    else {
        return;
    };
    let g = granularity(device);
    let words = g / 4;
    warm_up(device);
    let free_before = free_memory(&ctx);
    let reservation = SharedReservation::new(g, 0).unwrap();
    let memory = PhysicalAllocation::new(device, g).unwrap();
    let mut mapping = reservation.map(0, memory).unwrap();

    // Refused before any driver call: an empty list.
    assert!(matches!(
        mapping.grant_revocable(&[], ReadWrite),
        Err(Error::ZeroSize { .. })
    ));
    let contexts = [&ctx];
    let mut scoped = mapping.grant_revocable(&contexts, ReadWrite).unwrap();
    assert_eq!(scoped.devices(), [device]);
    assert_eq!(scoped.size(), g);
    let ptr = scoped.as_raw_ptr();
    assert_eq!(ptr, reservation.base());
    scoped
        .slice_mut::<u32>()
        .unwrap()
        .copy_from_host(&pattern(words, 11))
        .unwrap();
    let got = scoped.slice::<u32>().unwrap().to_vec().unwrap();
    assert!(
        got == pattern(words, 11),
        "read through the revocable grant"
    );
    scoped.revoke().unwrap();

    // The grant has ended: the driver refuses a raw read of the mapping (not a sticky error,
    // measured in `tests/driver_facts.rs`).
    ctx.bind_to_thread().unwrap();
    let mut host = vec![0u8; 64];
    // SAFETY: `host` is writable for 64 bytes; the source is mapped (the mapping lives), its grant
    // revoked: the driver refuses or fails the copy, and cannot write elsewhere.
    let code = unsafe { cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), ptr, host.len()) };
    assert_ne!(
        code,
        0,
        "a read after the revocable grant ended: {}",
        common::code_name(code)
    );

    // A new grant works, and the bytes are still there; a revocable grant ended by its drop too.
    assert!(
        read_through_new_grant(&mut mapping, &ctx) == pattern(words, 11),
        "read through a new grant"
    );
    drop(mapping.grant_revocable(&contexts, ReadOnly).unwrap());
    assert!(
        read_through_new_grant(&mut mapping, &ctx) == pattern(words, 11),
        "read after a dropped revocable grant"
    );

    let memory = mapping.unmap().unwrap();
    assert!(reservation.mapped().is_empty());
    drop((memory, reservation));
    assert_eq!(
        free_memory(&ctx),
        free_before,
        "the memory is back to the byte"
    );
}

/// 16 threads race to map the same 32 offsets of one shared reservation: the run-time bookkeeping
/// lets exactly one mapping take each range, and the losers' memory is released.
/// Ten sequences, each a struct holding its page of one `SharedReservation` with the page's kept
/// grant (`GrantedMapping`): written, then read back twice through new views at later uses, with no
/// new grant; an empty device list is refused before any driver call; `revoke` gives the mapping
/// back, whose raw read the driver then refuses (and a new grant reads its bytes); and free memory
/// is back to the byte.
#[test]
fn granted_mappings_keep_their_access_in_a_struct() {
    struct Sequence {
        page: GrantedMapping,
        seed: u32,
    }
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("granted_mappings_keep_their_access_in_a_struct") else {
        return;
    };
    let g = granularity(device);
    let words = g / 4;
    warm_up(device);
    let free_before = free_memory(&ctx);
    {
        let reservation = SharedReservation::new(10 * g, 0).unwrap();
        let mut sequences: Vec<Sequence> = (0..10u32)
            .map(|i| {
                let memory = PhysicalAllocation::new(device, g).unwrap();
                let mapping = reservation.map(i as usize * g, memory).unwrap();
                Sequence {
                    page: mapping.keep_grant(&[device], ReadWrite).unwrap(),
                    seed: 100 + i,
                }
            })
            .collect();
        for sequence in &mut sequences {
            assert_eq!(sequence.page.devices(), [device]);
            sequence
                .page
                .slice_mut::<u32>()
                .unwrap()
                .copy_from_host(&pattern(words, sequence.seed))
                .unwrap();
        }
        for _ in 0..2 {
            for sequence in &sequences {
                let got = sequence.page.slice::<u32>().unwrap().to_vec().unwrap();
                assert!(
                    got == pattern(words, sequence.seed),
                    "page {} kept its bytes",
                    sequence.seed
                );
            }
        }

        // Refused before any driver call: an empty device list (the mapping is unmapped then).
        let memory = PhysicalAllocation::new(device, g).unwrap();
        let spare = SharedReservation::new(g, 0).unwrap();
        assert!(matches!(
            spare.map(0, memory).unwrap().keep_grant(&[], ReadOnly),
            Err(Error::ZeroSize { .. })
        ));

        // `revoke` gives the mapping back, without access: a raw read of it is refused.
        let Sequence { page, seed } = sequences.pop().unwrap();
        let ptr = page.mapping().reservation().base() + page.mapping().offset() as u64;
        let mut mapping: OwnedMapping = page.revoke().unwrap();
        let mut host = vec![0u32; 16];
        // SAFETY: `host` is writable for 64 bytes; `ptr` is the start of the mapping, alive
        // (owned by `mapping`) and ungranted, which the driver must refuse to read.
        let code = unsafe { cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), ptr, 64) };
        assert_ne!(code, 0, "a revoked mapping is not read");
        assert_eq!(
            read_through_new_grant(&mut mapping, &ctx),
            pattern(words, seed)
        );
        drop(mapping);
        drop(sequences);
    }
    assert_eq!(
        free_memory(&ctx),
        free_before,
        "every page released, to the byte"
    );
}

#[test]
fn threads_racing_for_one_range_get_one_mapping_each() {
    const THREADS: usize = 16;
    const RANGES: usize = 32;
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("threads_racing_for_one_range_get_one_mapping_each")
    else {
        return;
    };
    let g = granularity(device);
    warm_up(device);
    let free_before = free_memory(&ctx);
    let reservation = SharedReservation::new(RANGES * g, 0).unwrap();
    let won: Vec<Vec<OwnedMapping>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let reservation = reservation.clone();
                s.spawn(move || {
                    let mut won = Vec::new();
                    for i in 0..RANGES {
                        let range = (i + t) % RANGES;
                        let memory = PhysicalAllocation::new(device, g).unwrap();
                        match reservation.map(range * g, memory) {
                            Ok(mapping) => won.push(mapping),
                            Err(Error::PageRange { .. }) => {}
                            Err(e) => panic!("thread {t}, range {range}: {e}"),
                        }
                    }
                    won
                })
            })
            .collect();
        threads.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut offsets: Vec<usize> = won.iter().flatten().map(OwnedMapping::offset).collect();
    offsets.sort_unstable();
    let expected: Vec<usize> = (0..RANGES).map(|i| i * g).collect();
    assert_eq!(offsets, expected, "exactly one mapping per range");
    drop(won);
    assert!(reservation.mapped().is_empty());
    drop(reservation);
    assert_eq!(
        free_memory(&ctx),
        free_before,
        "the losers' memory was released"
    );
}
