//! Stream-ordered work under `cuda_vmm::scope` against a real driver: queued work has finished when
//! the scope returns, also when the closure panics; events order work across two GPUs; queued copies,
//! memsets and typed launches give the results of their synchronous counterparts; the run-time
//! checks refuse before the driver; and 10 000 rounds of streams, events and pinned buffers leak
//! nothing. Every test skips visibly without a GPU (the two-GPU parts with fewer than two). The tests
//! take one lock, from before their first context to after their last, since one of them measures
//! free memory.

mod common;

use std::ffi::CString;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use common::{gpu_or_skip, gpus_or_skip, pattern};
use cuda_vmm::{
    Context, DeviceBuffer, Error, Event, Granularity, Module, PhysicalAllocation, PinnedBuffer,
    ReadWrite, Stream, VirtualReservation, allocation_granularity, peer::can_access_peer,
};

/// `spin_add_one(u32 *dst, const u32 *src, u32 n, u64 ns)`: waits `ns` nanoseconds, then
/// `dst[i] = src[i] + 1`.
const SPIN_PTX: &str = include_str!("../examples/kernels/spin_add_one.ptx");
/// One wave of blocks on any GPU this runs on (the kernel strides over `n`), so a launch takes about
/// its `ns` plus the copy.
const GRID: (u32, u32, u32) = (64, 1, 1);
const BLOCK: (u32, u32, u32) = (256, 1, 1);
/// How long the queued kernels of the ordering tests run: long enough that a scope that did not
/// wait, or a consumer that did not wait for its event, would see the old bytes.
const SPIN: Duration = Duration::from_millis(200);

fn spin_module(ctx: &Context) -> Module {
    Module::load_ptx(ctx, &CString::new(SPIN_PTX).expect("PTX has no NUL byte")).unwrap()
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap()
}

fn plus(data: &[u32], k: u32) -> Vec<u32> {
    data.iter().map(|x| x.wrapping_add(k)).collect()
}

static SERIAL: Mutex<()> = Mutex::new(());

/// The serialisation lock (see the file's documentation); declared before any context of a test, so
/// it is released after them.
fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Upload, a kernel still running 200 ms after the host queued it, download: when `scope` returns,
/// the last event has completed, at least 200 ms have passed, the mapping unmaps at once, and the
/// downloaded bytes are the kernel's.
#[test]
fn queued_work_finishes_before_the_scope_returns() {
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("queued_work_finishes_before_the_scope_returns") else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let n = g / 8;
    let memory = PhysicalAllocation::new(device, g).unwrap();
    let mut reservation = VirtualReservation::new(g, 0).unwrap();
    let mut region = reservation.region();
    let mut mapping = region.map(&memory).unwrap();
    let mut access = mapping.grant(&ctx, ReadWrite).unwrap();
    let (mut input, mut output) = access.slice_mut::<u32>().unwrap().split_at_mut(n).unwrap();
    let data = pattern(n, 11);
    let host_in = PinnedBuffer::from_slice(&ctx, &data).unwrap();
    let mut host_out = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let module = spin_module(&ctx);
    let kernel = module.function(c"spin_add_one").unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let done = Event::new(&ctx).unwrap();
    let n32 = u32::try_from(n).unwrap();

    let start = Instant::now();
    cuda_vmm::scope(|s| {
        let q = s.on(&stream);
        let uploaded = q.copy_from_host(&mut input, &host_in)?;
        // SAFETY: `spin_add_one(u32 *dst, const u32 *src, u32 n, u64 ns)` takes these four, in this
        // order; it writes the `n` values of `output` and reads the `n` of `uploaded`.
        let (written, (), (), ()) = unsafe {
            q.launch(
                &kernel,
                GRID,
                BLOCK,
                (&mut output, uploaded, n32, nanos(SPIN)),
            )
        }?;
        q.copy_to_host(&mut host_out, written)?;
        q.record(&done)?;
        Ok(())
    })
    .unwrap();
    let elapsed = start.elapsed();

    assert!(
        done.is_complete().unwrap(),
        "the last queued operation had not completed when the scope returned"
    );
    assert!(
        elapsed >= SPIN,
        "the scope returned after {elapsed:?}, before the {SPIN:?} kernel could have finished"
    );
    // Nothing uses the mapping any more: unmapped right away (the views and the grant are not used
    // after the scope, so their borrows have ended).
    mapping.unmap().unwrap();
    assert!(
        host_out[..] == plus(&data, 1)[..],
        "the download holds the kernel's results"
    );
}

/// A panic inside the scope, with a 200 ms kernel and its download queued: the panic reaches the
/// caller only after the scope has waited, so the download is complete when it is caught.
#[test]
fn a_panic_inside_the_scope_still_waits() {
    let _serial = serial();
    let Some((_, ctx)) = gpu_or_skip("a_panic_inside_the_scope_still_waits") else {
        return;
    };
    let n = 1 << 16;
    let data = pattern(n, 3);
    let input = DeviceBuffer::from_host(&ctx, &data).unwrap();
    let mut output = DeviceBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let mut output_view = output.as_mut_slice();
    let mut host_out = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let module = spin_module(&ctx);
    let kernel = module.function(c"spin_add_one").unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let n32 = u32::try_from(n).unwrap();

    let start = Instant::now();
    let caught = catch_unwind(AssertUnwindSafe(|| {
        cuda_vmm::scope::<_, ()>(|s| {
            let q = s.on(&stream);
            // SAFETY: as in `queued_work_finishes_before_the_scope_returns`.
            let (written, (), (), ()) = unsafe {
                q.launch(
                    &kernel,
                    GRID,
                    BLOCK,
                    (&mut output_view, input.as_slice(), n32, nanos(SPIN)),
                )
            }?;
            q.copy_to_host(&mut host_out, written)?;
            panic!("a panic while the queued kernel runs (deliberate)");
        })
    }));
    let elapsed = start.elapsed();

    assert!(caught.is_err(), "the panic reached the caller");
    assert!(
        elapsed >= SPIN,
        "the panic left the scope after {elapsed:?}, before the {SPIN:?} kernel could have finished"
    );
    assert!(
        host_out[..] == plus(&data, 1)[..],
        "the queued download had completed when the panic was caught"
    );
}

/// A producer on GPU 0 (a 200 ms kernel), a consumer on GPU 1 that waits for the producer's event:
/// through pinned host memory on any two GPUs, and over the link, reading VMM memory of GPU 0 granted
/// to both, where GPU 1 can reach GPU 0. Without the wait the consumer would read the bytes from
/// before the producer, and the results would be off by one.
#[test]
fn events_order_work_across_two_gpus() {
    let _serial = serial();
    let Some(gpus) = gpus_or_skip("events_order_work_across_two_gpus", 2) else {
        return;
    };
    let [(d0, c0), (d1, c1), ..] = &gpus[..] else {
        unreachable!("gpus_or_skip returned at least two devices");
    };
    let n = 1 << 18;
    let n32 = u32::try_from(n).unwrap();
    let data = pattern(n, 29);
    let expected = plus(&data, 2);
    let (m0, m1) = (spin_module(c0), spin_module(c1));
    let (k0, k1) = (
        m0.function(c"spin_add_one").unwrap(),
        m1.function(c"spin_add_one").unwrap(),
    );
    let (stream0, stream1) = (Stream::new(c0).unwrap(), Stream::new(c1).unwrap());
    let handed_over = Event::new(c0).unwrap();

    // Through pinned host memory: GPU 0 computes and downloads, GPU 1 uploads once the download is
    // done, computes and downloads.
    let src0 = DeviceBuffer::from_host(c0, &data).unwrap();
    let mut mid0 = DeviceBuffer::<u32>::zeroed(c0, n).unwrap();
    let mut in1 = DeviceBuffer::<u32>::zeroed(c1, n).unwrap();
    let mut out1 = DeviceBuffer::<u32>::zeroed(c1, n).unwrap();
    let (mut mid0_view, mut in1_view, mut out1_view) =
        (mid0.as_mut_slice(), in1.as_mut_slice(), out1.as_mut_slice());
    let mut hop = PinnedBuffer::<u32>::zeroed(c0, n).unwrap();
    let mut result = PinnedBuffer::<u32>::zeroed(c1, n).unwrap();
    cuda_vmm::scope(|s| {
        let (p, c) = (s.on(&stream0), s.on(&stream1));
        // SAFETY: `spin_add_one(u32 *dst, const u32 *src, u32 n, u64 ns)` takes these four, in this
        // order; it writes the `n` values of the first view and reads the `n` of the second (so
        // for every launch of this test).
        let (produced, (), (), ()) = unsafe {
            p.launch(
                &k0,
                GRID,
                BLOCK,
                (&mut mid0_view, src0.as_slice(), n32, nanos(SPIN)),
            )
        }?;
        let on_host = p.copy_to_host(&mut hop, produced)?;
        p.record(&handed_over)?;
        c.wait(&handed_over)?;
        let arrived = c.copy_from_host(&mut in1_view, on_host)?;
        // SAFETY: as above.
        let (consumed, (), (), ()) =
            unsafe { c.launch(&k1, GRID, BLOCK, (&mut out1_view, arrived, n32, 0u64)) }?;
        c.copy_to_host(&mut result, consumed)?;
        Ok(())
    })
    .unwrap();
    assert!(
        result[..] == expected[..],
        "GPU 1 consumed what GPU 0 produced (through host memory)"
    );

    // Over the link: GPU 1's kernel reads GPU 0's VMM memory directly.
    if can_access_peer(*d1, *d0).unwrap().is_none() {
        common::skip(&format!(
            "SKIPPED events_order_work_across_two_gpus (over the link): GPU {} cannot access GPU {}",
            d1.ordinal(),
            d0.ordinal()
        ));
        return;
    }
    let g = allocation_granularity(*d0, Granularity::Minimum).unwrap();
    let size = cuda_vmm::align_size(n * 4, g).unwrap();
    let memory = PhysicalAllocation::new(*d0, size).unwrap();
    let mut reservation = VirtualReservation::new(size, 0).unwrap();
    let mut region = reservation.region();
    let mut mapping = region.map(&memory).unwrap();
    let both = [c0, c1];
    let mut shared = mapping.grant_all(&both, ReadWrite).unwrap();
    let mut slot = shared.slice_mut::<u32>().unwrap();
    let mut slot = slot.slice_mut(..n).unwrap();
    let mut out1_view = out1.as_mut_slice();
    let mut result = PinnedBuffer::<u32>::zeroed(c1, n).unwrap();
    cuda_vmm::scope(|s| {
        let (p, c) = (s.on(&stream0), s.on(&stream1));
        // SAFETY: as above; the second launch reads `produced`, VMM memory of GPU 0 granted to GPU 1.
        let (produced, (), (), ()) = unsafe {
            p.launch(
                &k0,
                GRID,
                BLOCK,
                (&mut slot, src0.as_slice(), n32, nanos(SPIN)),
            )
        }?;
        p.record(&handed_over)?;
        c.wait(&handed_over)?;
        // SAFETY: as above.
        let (consumed, (), (), ()) =
            unsafe { c.launch(&k1, GRID, BLOCK, (&mut out1_view, produced, n32, 0u64)) }?;
        c.copy_to_host(&mut result, consumed)?;
        Ok(())
    })
    .unwrap();
    assert!(
        result[..] == expected[..],
        "GPU 1 consumed what GPU 0 produced (over the link)"
    );
}

/// Every queued operation gives the bytes of its synchronous counterpart: uploads from pageable and
/// pinned memory, a memset, device-to-device, a download, and an upload from what a download on the
/// same stream wrote; on a new stream and on the legacy default stream.
#[test]
fn queued_copies_give_the_synchronous_results() {
    let _serial = serial();
    let Some((_, ctx)) = gpu_or_skip("queued_copies_give_the_synchronous_results") else {
        return;
    };
    let n = 100_003;
    let data = pattern(n, 41);
    let pinned = PinnedBuffer::from_slice(&ctx, &data).unwrap();
    for stream in [
        Stream::new(&ctx).unwrap(),
        Stream::legacy_default(&ctx).unwrap(),
    ] {
        let mut uploaded = DeviceBuffer::<u32>::zeroed(&ctx, n).unwrap();
        let mut copied = DeviceBuffer::<u32>::zeroed(&ctx, n).unwrap();
        let mut relayed = DeviceBuffer::<u32>::zeroed(&ctx, n).unwrap();
        let mut halves = DeviceBuffer::<u32>::zeroed(&ctx, n).unwrap();
        let (mut uploaded_view, mut copied_view, mut relayed_view, mut halves_view) = (
            uploaded.as_mut_slice(),
            copied.as_mut_slice(),
            relayed.as_mut_slice(),
            halves.as_mut_slice(),
        );
        let mut hop = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
        let mut back = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
        cuda_vmm::scope(|s| {
            let q = s.on(&stream);
            let from_pageable = q.copy_from_host(&mut uploaded_view, &data[..])?;
            let on_device = q.copy_from_device(&mut copied_view, from_pageable)?;
            let on_host = q.copy_to_host(&mut hop, on_device)?;
            q.copy_from_host(&mut relayed_view, on_host)?;
            // Halves: a memset of the first, an upload from pinned memory into the second.
            let (first, second) = halves_view.slice_mut(..).unwrap().split_at_mut(n / 2)?;
            q.memset(first, 0xab)?;
            let from_pinned = q.copy_from_host(second, &pinned[n / 2..])?;
            q.copy_to_host(back.slice_mut(n / 2..)?, from_pinned)?;
            Ok(())
        })
        .unwrap();
        let what = format!("{stream:?}");
        assert_eq!(
            uploaded.as_slice().to_vec().unwrap(),
            data,
            "{what}: upload"
        );
        assert_eq!(
            copied.as_slice().to_vec().unwrap(),
            data,
            "{what}: device copy"
        );
        assert!(hop[..] == data[..], "{what}: download");
        assert_eq!(
            relayed.as_slice().to_vec().unwrap(),
            data,
            "{what}: upload of a download"
        );
        let halves = halves.as_slice().to_vec().unwrap();
        assert!(
            halves[..n / 2].iter().all(|&x| x == 0xabab_abab),
            "{what}: memset"
        );
        assert!(
            halves[n / 2..] == data[n / 2..],
            "{what}: upload from pinned"
        );
        assert!(back[n / 2..] == data[n / 2..], "{what}: download of a part");
        assert!(back[..n / 2].iter().all(|&x| x == 0), "{what}: untouched");
    }
}

/// Timed events around a 200 ms kernel read at least that; events without timing are refused by the
/// driver; completion is reported without waiting.
#[test]
fn timed_events_measure_queued_work() {
    let _serial = serial();
    let Some((_, ctx)) = gpu_or_skip("timed_events_measure_queued_work") else {
        return;
    };
    let spin = SPIN;
    let n = 4096;
    let input = DeviceBuffer::from_host(&ctx, &pattern(n, 1)).unwrap();
    let mut output = DeviceBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let mut output_view = output.as_mut_slice();
    let module = spin_module(&ctx);
    let kernel = module.function(c"spin_add_one").unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let (start, end) = (Event::timed(&ctx).unwrap(), Event::timed(&ctx).unwrap());
    let untimed = Event::new(&ctx).unwrap();
    assert!(start.is_timed() && !untimed.is_timed());
    assert!(
        end.is_complete().unwrap(),
        "an event never recorded counts as complete"
    );
    cuda_vmm::scope(|s| {
        let q = s.on(&stream);
        q.record(&start)?;
        q.record(&untimed)?;
        // SAFETY: as in `queued_work_finishes_before_the_scope_returns`.
        unsafe {
            q.launch(
                &kernel,
                GRID,
                BLOCK,
                (&mut output_view, input.as_slice(), 4096u32, nanos(spin)),
            )
        }?;
        q.record(&end)?;
        // Queued behind a 200 ms kernel: not complete yet (the host is far quicker than that).
        assert!(!end.is_complete()?, "the end event completed at once");
        Ok(())
    })
    .unwrap();
    let ms = start.elapsed_ms(&end).unwrap();
    println!("event-timed: {ms} ms for a {spin:?} kernel");
    assert!(
        f64::from(ms) >= spin.as_secs_f64() * 1e3 * 0.99,
        "{ms} ms between the events around a {spin:?} kernel"
    );
    // An event without timing is refused before the driver, in either place.
    assert_eq!(untimed.elapsed_ms(&end), Err(Error::NotTimed));
    assert_eq!(end.elapsed_ms(&untimed), Err(Error::NotTimed));
}

/// What a scoped stream refuses, it refuses before the driver (lengths, empty grids), and the scope,
/// its stream and the context keep working afterwards.
#[test]
fn checks_come_before_the_driver() {
    let _serial = serial();
    let Some((_, ctx)) = gpu_or_skip("checks_come_before_the_driver") else {
        return;
    };
    let n = 1024;
    let mut buffer = DeviceBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let mut view = buffer.as_mut_slice();
    let source = DeviceBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let short = vec![1u32; n - 1];
    let module = spin_module(&ctx);
    let kernel = module.function(c"spin_add_one").unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let mut back = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    cuda_vmm::scope(|s| {
        let q = s.on(&stream);
        let (first, rest) = view.slice_mut(..).unwrap().split_at_mut(n - 1)?;
        assert_eq!(
            q.copy_from_host(rest, &short[..]).unwrap_err(),
            Error::LengthMismatch {
                expected: 1,
                found: n - 1
            }
        );
        // SAFETY: the arguments match `spin_add_one(u32 *dst, const u32 *src, u32 n, u64 ns)`, and
        // with `n` 0 the kernel touches no memory; the launch is refused before the driver anyway
        // (an empty grid).
        let refused = unsafe {
            q.launch(
                &kernel,
                (0, 1, 1),
                BLOCK,
                (first, source.as_slice(), 0u32, 0u64),
            )
        };
        assert!(
            matches!(refused, Err(Error::ZeroSize { .. })),
            "{refused:?}"
        );
        Ok(())
    })
    .unwrap();
    // The stream and context still work.
    cuda_vmm::scope(|s| {
        let q = s.on(&stream);
        let filled = q.memset(&mut view, 1)?;
        q.copy_to_host(&mut back, filled)?;
        Ok(())
    })
    .unwrap();
    assert!(back.iter().all(|&x| x == 0x0101_0101));
}

/// A stream of GPU 1 refuses, before the driver, a view GPU 1 cannot reach, a kernel of GPU 0 and an
/// event of GPU 0 to record; it waits for GPU 0's event. Skips visibly with one GPU.
#[test]
fn another_devices_views_kernels_and_events_are_refused() {
    let _serial = serial();
    let Some(gpus) = gpus_or_skip("another_devices_views_kernels_and_events_are_refused", 2) else {
        return;
    };
    let [(d0, c0), (d1, c1), ..] = &gpus[..] else {
        unreachable!("gpus_or_skip returned at least two devices");
    };
    let (r0, r1) = (d0.as_raw(), d1.as_raw());
    let n = 1024;
    let mut buffer = DeviceBuffer::<u32>::zeroed(c0, n).unwrap();
    let source = DeviceBuffer::<u32>::zeroed(c0, n).unwrap();
    let module = spin_module(c0);
    let kernel = module.function(c"spin_add_one").unwrap();
    let stream1 = Stream::new(c1).unwrap();
    let event0 = Event::timed(c0).unwrap();
    let event1 = Event::timed(c1).unwrap();
    let mut view = buffer.as_mut_slice();
    cuda_vmm::scope(|s| {
        let q = s.on(&stream1);
        // A plain buffer of GPU 0: GPU 1 has no access to it.
        assert_eq!(
            q.memset(&mut view, 0).unwrap_err(),
            Error::NoPeerAccess {
                device: r1,
                owner: r0
            }
        );
        Ok(())
    })
    .unwrap();
    let mut view = buffer.as_mut_slice();
    cuda_vmm::scope(|s| {
        let q = s.on(&stream1);
        // SAFETY: the arguments match `spin_add_one(u32 *dst, const u32 *src, u32 n, u64 ns)`, and
        // with `n` 0 the kernel touches no memory; refused before the driver anyway (a kernel of
        // GPU 0 on a stream of GPU 1).
        let refused = unsafe {
            q.launch(
                &kernel,
                GRID,
                BLOCK,
                (&mut view, source.as_slice(), 0u32, 0u64),
            )
        };
        assert_eq!(
            refused.unwrap_err(),
            Error::DeviceMismatch {
                expected: r1,
                found: r0
            }
        );
        assert_eq!(
            q.record(&event0).unwrap_err(),
            Error::DeviceMismatch {
                expected: r1,
                found: r0
            }
        );
        // Waiting for another device's event is what events are for.
        q.wait(&event0)?;
        Ok(())
    })
    .unwrap();
    assert_eq!(
        event0.elapsed_ms(&event1).unwrap_err(),
        Error::DeviceMismatch {
            expected: r0,
            found: r1
        }
    );
}

/// The resident set of this process in bytes (`VmRSS` of `/proc/self/status`).
fn resident_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS in /proc/self/status");
    let kib: usize = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in kB");
    kib * 1024
}

/// 10 000 rounds of a stream, two events and two pinned buffers, used in a scope and dropped: device
/// memory is back to the byte, and the process has not kept the pinned memory (which a leak would
/// show as 320 MiB more resident memory).
#[test]
fn streams_events_and_pinned_buffers_leak_nothing() {
    let _serial = serial();
    let Some((_, ctx)) = gpu_or_skip("streams_events_and_pinned_buffers_leak_nothing") else {
        return;
    };
    let n = 4096;
    let mut device = DeviceBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let mut round = |i: u32| -> Result<(), Error> {
        let stream = Stream::new(&ctx)?;
        let (start, end) = (Event::timed(&ctx)?, Event::timed(&ctx)?);
        let untimed = Event::new(&ctx)?;
        let host = PinnedBuffer::from_slice(&ctx, &pattern(n, i))?;
        let mut back = PinnedBuffer::<u32>::zeroed(&ctx, n)?;
        let mut view = device.as_mut_slice();
        cuda_vmm::scope(|s| {
            let q = s.on(&stream);
            q.record(&start)?;
            let written = q.copy_from_host(&mut view, &host)?;
            q.copy_to_host(&mut back, written)?;
            q.record(&end)?;
            Ok(())
        })?;
        assert!(back[..] == host[..], "round {i}");
        assert!(
            start.elapsed_ms(&end)? >= 0.0,
            "round {i}: end before start"
        );
        assert_eq!(start.elapsed_ms(&untimed), Err(Error::NotTimed));
        Ok(())
    };
    // Warm-up: the first stream and event of a context may set up driver bookkeeping that stays.
    round(0).unwrap();
    let (free_before, total) = ctx.memory_info().unwrap();
    let resident_before = resident_bytes();

    let rounds = 10_000;
    for i in 1..=rounds {
        round(i).unwrap();
    }
    let (free_after, _) = ctx.memory_info().unwrap();
    let resident_after = resident_bytes();
    println!(
        "{rounds} rounds: free before {free_before}, after {free_after} of {total}; resident \
         before {resident_before}, after {resident_after}"
    );
    assert_eq!(
        free_after,
        free_before,
        "device memory leaked: {} bytes",
        free_before.abs_diff(free_after)
    );
    let leak_if_pinned_leaked = 2 * n * 4 * usize::try_from(rounds).unwrap();
    assert!(
        resident_after.saturating_sub(resident_before) < leak_if_pinned_leaked / 4,
        "resident memory grew by {} bytes over the rounds",
        resident_after.saturating_sub(resident_before)
    );
}
