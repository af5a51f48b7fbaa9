//! Every wait of the crate under stream capture, against a real driver: a wait the driver refuses at
//! once with a capture-family error (900-908), which is not sticky, must not let the call return
//! while the work it waited for still runs.
//!
//! Each test reproduces one trigger that made a scope, a guard or a synchronous copy come back
//! early from safe code: the scope's own cudarc stream left capturing (by `begin_capture`, or by
//! the `?` of a call that failed inside a capture); another thread capturing in
//! `CU_STREAM_CAPTURE_MODE_GLOBAL` before the wait or while it waits (`cuda_vmm::scope`, a
//! synchronous device copy, the staged `copy_between_with`, the end of a `RevocableAccess`); host
//! NUMA memory that the CPU takes back after a cudarc scope; and a capture the scope cannot end,
//! where the process must abort. None of them asserts whether the call returned `Ok` or `Err` (that
//! is printed): each asserts what the early return broke, with work long enough (a kernel that
//! spins for [`SPIN`]) that an early return shows. When the call returns, the work it waited for
//! has finished (an event recorded after it has completed, the time of the work has passed); memory
//! unmapped or revoked right after leaves the context healthy; and memory the work wrote holds its
//! final bytes and does not change any more.
//!
//! Every capture is begun with cudarc's safe API, so the tests need feature `cudarc`; without it
//! the file holds one test that says so. Every test skips visibly without a GPU. The tests take one
//! lock, from before their first context to after their last: a context left with a sticky error
//! must not reach the next test (its contexts are released when it ends, which resets the context).

mod common;

use std::sync::{Mutex, MutexGuard, PoisonError};

static SERIAL: Mutex<()> = Mutex::new(());

/// The serialisation lock (see the file's documentation); taken before any context of a test, so it
/// is released after them.
fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Without feature `cudarc` nothing here can begin a capture from safe code: says so where it is
/// seen.
#[cfg(not(feature = "cudarc"))]
#[test]
fn the_capture_triggers_need_feature_cudarc() {
    let _serial = serial();
    common::skip(
        "SKIPPED the_capture_triggers_need_feature_cudarc: every trigger of tests/waits.rs begins \
         its capture with cudarc; run them with `--features cudarc`",
    );
}

#[cfg(feature = "cudarc")]
use std::{
    error::Error as StdError,
    sync::{Arc, Barrier},
    thread,
    time::{Duration, Instant},
};

#[cfg(feature = "cudarc")]
use common::{gpu_or_skip, pattern, skip};
#[cfg(feature = "cudarc")]
use cuda_vmm::{
    Context, Device, DeviceBuffer, Event, Granularity, Module, PhysicalAllocation, PinnedBuffer,
    ReadOnly, ReadWrite, Stream, VirtualBuffer, VirtualReservation, allocation_granularity,
    host::HostAllocation, interop::cudarc::scope, peer::CopyPath, peer::Route,
    peer::STAGING_CHUNK_BYTES, peer::Staging, peer::copy_between_with,
};
#[cfg(feature = "cudarc")]
use cudarc::driver::{
    CudaContext, CudaFunction, CudaGraph, CudaStream, DriverError, LaunchConfig, PushKernelArg,
    sys::{CUgraphInstantiate_flags, CUstreamCaptureMode},
};

#[cfg(feature = "cudarc")]
type TestResult<T = ()> = Result<T, Box<dyn StdError>>;

/// `spin_add_one(u32 *dst, const u32 *src, u32 n, u64 ns)`: every thread waits `ns` nanoseconds of
/// the global timer, then `dst[i] = src[i] + 1` for `i < n`. With `n` 0 it touches no memory: work
/// of a known duration, ahead of the work a test lends memory to. Loaded as PTX (no NVRTC needed).
#[cfg(feature = "cudarc")]
const SPIN_PTX: &str = include_str!("../examples/kernels/spin_add_one.ptx");
/// One wave of blocks on any GPU (the kernel strides over `n`), so a launch takes about its `ns`.
#[cfg(feature = "cudarc")]
const GRID: (u32, u32, u32) = (64, 1, 1);
#[cfg(feature = "cudarc")]
const BLOCK: (u32, u32, u32) = (256, 1, 1);
/// How long the queued work runs: a call that came back early returns well before it.
#[cfg(feature = "cudarc")]
const SPIN: Duration = Duration::from_millis(600);
/// How long another thread holds its capture: shorter than [`SPIN`], so a call that waits as it must
/// returns after the capture has ended, and the checks right after it run without one.
#[cfg(feature = "cudarc")]
const HOLD: Duration = Duration::from_millis(300);
/// How much longer than the work would have run the tests go on watching what it wrote.
#[cfg(feature = "cudarc")]
const SETTLE: Duration = Duration::from_millis(300);
/// The lent view of the cudarc-scope triggers, as in the issue: cudarc's memset of it takes a few
/// milliseconds on an H200, behind the [`SPIN`] kernel.
#[cfg(feature = "cudarc")]
const BIG: usize = 16 << 30;
/// Each side of the synchronous copies.
#[cfg(feature = "cudarc")]
const COPY: usize = 4 << 30;
/// What the sources of the copies are filled with, byte by byte.
#[cfg(feature = "cudarc")]
const FILL: u8 = 0xa5;
/// [`FILL`] as every `u32` of a filled range holds it.
#[cfg(feature = "cudarc")]
const FILL_WORD: u32 = u32::from_ne_bytes([FILL; 4]);
/// The address a spin-only launch passes for its two pointers, which it never dereferences.
#[cfg(feature = "cudarc")]
const NO_ADDRESS: u64 = 0;
/// The abort test's child: its role, in this environment variable.
#[cfg(all(feature = "cudarc", unix))]
const CHILD: &str = "CUDA_VMM_WAITS_CHILD";

#[cfg(feature = "cudarc")]
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap()
}

/// The first GPU with both libraries' handles: this crate's context and cudarc's (one primary
/// context), and the spin kernel loaded through cudarc.
#[cfg(feature = "cudarc")]
struct Gpu {
    device: Device,
    ctx: Context,
    cu: Arc<CudaContext>,
    spin: CudaFunction,
}

/// The first GPU, or `None` after printing why the test is skipped.
#[cfg(feature = "cudarc")]
fn cudarc_gpu_or_skip(test: &str) -> Option<Gpu> {
    let (device, ctx) = gpu_or_skip(test)?;
    let cu = CudaContext::new(device.ordinal())
        .unwrap_or_else(|e| panic!("{test}: cudarc's context: {e}"));
    let spin = cu
        .load_module(cudarc::nvrtc::Ptx::from_src(SPIN_PTX))
        .and_then(|module| module.load_function("spin_add_one"))
        .unwrap_or_else(|e| panic!("{test}: loading spin_add_one through cudarc: {e}"));
    Some(Gpu {
        device,
        ctx,
        cu,
        spin,
    })
}

/// Queues `spin_add_one` with `n` 0 on `stream` (a cudarc stream): `how_long` of work that touches
/// no memory.
#[cfg(feature = "cudarc")]
fn spin_on(
    stream: &Arc<CudaStream>,
    spin: &CudaFunction,
    how_long: Duration,
) -> Result<(), DriverError> {
    let (n, ns) = (0u32, nanos(how_long));
    let config = LaunchConfig {
        grid_dim: GRID,
        block_dim: BLOCK,
        shared_mem_bytes: 0,
    };
    // SAFETY: `spin_add_one(u32 *dst, const u32 *src, u32 n, u64 ns)` takes these four, in this
    // order; with `n` 0 it dereferences neither pointer, so it touches no memory at all.
    unsafe {
        stream
            .launch_builder(spin)
            .arg(&NO_ADDRESS)
            .arg(&NO_ADDRESS)
            .arg(&n)
            .arg(&ns)
            .launch(config)
    }?;
    Ok(())
}

/// When the other thread of [`while_another_thread_captures`] begins its capture.
#[cfg(feature = "cudarc")]
#[derive(Clone, Copy, Debug)]
enum CaptureStart {
    /// Before this thread's call: the call's wait meets a capture under way.
    BeforeTheCall,
    /// This long after this thread begins its call: the capture begins while the call waits.
    DuringTheCall(Duration),
}

/// Runs `call` on this thread while another thread captures `capturing` (a cudarc stream used for
/// nothing else) in `CU_STREAM_CAPTURE_MODE_GLOBAL`, under which the driver refuses this thread's
/// unsafe calls, waits among them, at once with error 900. The other thread begins the capture as
/// `start` says, holds it for `hold`, ends it and drops the graph; this returns `call`'s value once
/// that thread is done (after asserting that the capture was begun: without it the test would prove
/// nothing).
#[cfg(feature = "cudarc")]
fn while_another_thread_captures<R>(
    test: &str,
    capturing: &Arc<CudaStream>,
    start: CaptureStart,
    hold: Duration,
    call: impl FnOnce() -> R,
) -> R {
    let meet = Barrier::new(2);
    let (value, begun, ended) = thread::scope(|t| {
        let capturer = t.spawn(|| {
            let begin_global =
                || capturing.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL);
            // The barrier is met in any case, so that a failed begin cannot leave this thread
            // waiting for ever.
            let begun = match start {
                CaptureStart::BeforeTheCall => {
                    let begun = begin_global();
                    meet.wait();
                    begun
                }
                CaptureStart::DuringTheCall(delay) => {
                    meet.wait();
                    thread::sleep(delay);
                    begin_global()
                }
            };
            thread::sleep(hold);
            let ended = describe_graph(capturing.end_capture(CUgraphInstantiate_flags(0)));
            (begun, ended)
        });
        meet.wait();
        let value = call();
        let (begun, ended) = capturer.join().expect("the capturing thread panicked");
        (value, begun, ended)
    });
    println!("{test}: the other thread's GLOBAL capture ({start:?}): begun {begun:?}; {ended}");
    assert_eq!(
        begun,
        Ok(()),
        "{test}: the other thread could not begin its capture"
    );
    value
}

/// What `end_capture` handed back, in words; a graph is dropped, never launched.
#[cfg(feature = "cudarc")]
fn describe_graph(graph: Result<Option<CudaGraph>, DriverError>) -> String {
    match graph {
        Ok(Some(graph)) => {
            drop(graph);
            "end_capture made a graph (dropped, not launched)".to_owned()
        }
        Ok(None) => "end_capture made no graph".to_owned(),
        Err(e) => format!("end_capture failed: {e:?}"),
    }
}

/// Sleeps until `since + how_long` (at once where that has passed).
#[cfg(feature = "cudarc")]
fn sleep_until(since: Instant, how_long: Duration) {
    thread::sleep(how_long.saturating_sub(since.elapsed()));
}

/// Sets every byte of `buffer`, whose pages are all mapped, to `byte`, on a stream of this crate.
#[cfg(feature = "cudarc")]
fn fill(ctx: &Context, buffer: &mut VirtualBuffer, byte: u8) {
    let stream = Stream::new(ctx).unwrap();
    let mut view = buffer.slice_bytes_mut::<u32>(..).unwrap();
    cuda_vmm::scope(|s| {
        s.on(&stream).memset(&mut view, byte)?;
        Ok(())
    })
    .unwrap();
}

/// The last `page` bytes of `buffer`'s mapped range, read with a synchronous copy.
#[cfg(feature = "cudarc")]
fn last_page(buffer: &VirtualBuffer, page: usize) -> Result<Vec<u32>, cuda_vmm::Error> {
    buffer.slice_bytes::<u32>(buffer.end() - page..)?.to_vec()
}

/// How a closure inside `interop::cudarc::scope` leaves a capture of the scope's stream open.
#[cfg(feature = "cudarc")]
#[derive(Clone, Copy, Debug)]
enum Leave {
    /// Trigger 1: cudarc's `begin_capture` in this mode, then `Ok`.
    OpenCapture(CUstreamCaptureMode),
    /// Trigger 2: `begin_capture`, then the `?` of `Scope::launch_builder`, which this crate refuses
    /// on a capturing stream: the closure returns its error with the capture still active.
    RefusedLaunch,
    /// Trigger 2: `begin_capture`, then the `?` of cudarc's `synchronize`, which the driver refuses
    /// inside a capture (900), invalidating it: the stream stays in an invalidated capture.
    RefusedSynchronize,
}

/// Triggers 1 and 2, one round per entry of `leaves`: inside `interop::cudarc::scope`, a [`SPIN`]
/// kernel and then cudarc's `memset_zeros` of a lent 16 GiB view of a `VirtualBuffer` are queued on
/// the scope's stream, an event is recorded after them, and the closure leaves the stream capturing
/// as the entry says. Asserts, right after the scope: the event has completed and [`SPIN`] has
/// passed; the page unmaps (`shrink`); cudarc's `end_capture` hands back no graph; the context is
/// healthy (no `CUDA_ERROR_ILLEGAL_ADDRESS` of a memset into unmapped memory); and a page mapped
/// again at the same address keeps what is written into it (no late memset zeroes it).
#[cfg(feature = "cudarc")]
fn lent_memset_left_capturing(test: &str, leaves: &[Leave]) {
    let Some(gpu) = cudarc_gpu_or_skip(test) else {
        return;
    };
    let stream = gpu.cu.new_stream().unwrap();
    let done = gpu.cu.new_event(None).unwrap();
    let mut buffer = VirtualBuffer::new(BIG, &[gpu.device], ReadWrite).unwrap();
    for &leave in leaves {
        buffer.grow(gpu.device, BIG).unwrap();
        let mut view = buffer.slice_bytes_mut::<u32>(..).unwrap();
        let started = Instant::now();
        let result = scope(&stream, |s| -> TestResult {
            let mut lent = s.lend_mut(&mut view)?;
            spin_on(&stream, &gpu.spin, SPIN)?;
            stream.memset_zeros(&mut lent)?;
            done.record(&stream)?;
            let thread_local = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
            match leave {
                Leave::OpenCapture(mode) => stream.begin_capture(mode)?,
                Leave::RefusedLaunch => {
                    stream.begin_capture(thread_local)?;
                    let _builder = s.launch_builder(&gpu.spin)?;
                }
                Leave::RefusedSynchronize => {
                    stream.begin_capture(thread_local)?;
                    stream.synchronize()?;
                }
            }
            Ok(())
        });
        // Observed in the order (the unmap first), asserted once everything is seen.
        let elapsed = started.elapsed();
        let complete = done.try_is_complete();
        let shrunk = buffer.shrink();
        let status = stream.capture_status();
        let graph = stream.end_capture(CUgraphInstantiate_flags(0));
        let graph_made = matches!(graph, Ok(Some(_)));
        let graph = describe_graph(graph);
        let healthy = gpu.ctx.synchronize();
        println!(
            "{test} ({leave:?}): the scope returned {result:?} after {elapsed:?}; the event after \
             the memset: {complete:?}; shrink: {shrunk:?}; the capture status then: {status:?}; \
             {graph}; the context: {healthy:?}"
        );
        assert!(
            matches!(complete, Ok(true)),
            "{leave:?}: the memset had not finished when the scope returned ({complete:?})"
        );
        assert!(
            elapsed >= SPIN,
            "{leave:?}: the scope returned after {elapsed:?}, before the {SPIN:?} kernel ahead of \
             the memset could have finished"
        );
        assert!(
            matches!(shrunk, Ok(Some(_))),
            "{leave:?}: the page did not unmap after the scope: {shrunk:?}"
        );
        assert!(
            !graph_made,
            "{leave:?}: cudarc's end_capture handed back a graph after the scope"
        );
        assert_eq!(
            healthy,
            Ok(()),
            "{leave:?}: the context is not healthy after the unmap"
        );
        // A page mapped again at the same address: nothing queued before the scope's end writes it
        // any more (a late memset would zero the pattern).
        let page = allocation_granularity(gpu.device, Granularity::Minimum).unwrap();
        let offset = buffer.grow(gpu.device, page).unwrap();
        assert_eq!(offset, 0, "the new page is at the old view's address");
        let pattern = vec![0xA5A5_A5A5u32; page / 4];
        let mut again = buffer.slice_bytes_mut::<u32>(..page).unwrap();
        again.copy_from_host(&pattern).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            again.to_vec().unwrap() == pattern,
            "{leave:?}: the page mapped again at the address changed after the scope"
        );
        buffer.shrink().unwrap();
    }
}

/// Trigger 1: the closure of `interop::cudarc::scope` begins a capture of the scope's own stream
/// (cudarc's safe `begin_capture`, in each of the three modes) after cudarc's memset of a lent
/// 16 GiB view, and returns. The scope's wait is refused at once (900), and the old scope returned
/// while the memset ran, so the unmap after it made the memset fault. Proves that the scope returns
/// only once the memset has finished, that the unmap after it leaves the context healthy, and that
/// cudarc's `end_capture` after the scope hands back no graph.
#[cfg(feature = "cudarc")]
#[test]
fn a_cudarc_scope_whose_stream_begins_a_capture_waits_for_the_lent_work() {
    let _serial = serial();
    lent_memset_left_capturing(
        "a_cudarc_scope_whose_stream_begins_a_capture_waits_for_the_lent_work",
        &[
            Leave::OpenCapture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL),
            Leave::OpenCapture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
            Leave::OpenCapture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED),
        ],
    );
}

/// Trigger 2: as trigger 1, with the closure left by the `?` of a call that fails between
/// `begin_capture` and `end_capture`: a launch builder this crate refuses (the capture stays
/// active), and cudarc's `synchronize`, which the driver refuses (the capture is invalidated).
/// Proves the same: the memset has finished when the scope returns, the unmap after it is harmless,
/// and `end_capture` hands back no graph.
#[cfg(feature = "cudarc")]
#[test]
fn a_cudarc_scope_left_by_a_failed_call_inside_a_capture_waits_for_the_lent_work() {
    let _serial = serial();
    lent_memset_left_capturing(
        "a_cudarc_scope_left_by_a_failed_call_inside_a_capture_waits_for_the_lent_work",
        &[Leave::RefusedLaunch, Leave::RefusedSynchronize],
    );
}

/// Triggers 3 and the late capture: inside `cuda_vmm::scope`, a [`SPIN`] kernel writes a device
/// buffer, a download copies it into a `PinnedBuffer` and an event is recorded, while another thread
/// captures in GLOBAL mode (begun as `start` says, held for `hold`). Asserts, right after the scope:
/// the event has completed and [`SPIN`] has passed; then that the host buffer holds the kernel's
/// results and is not written any more (read right after the scope and again once the work would
/// have finished, equal); and that the context is healthy.
#[cfg(feature = "cudarc")]
fn download_while_another_thread_captures(test: &str, start: CaptureStart, hold: Duration) {
    let Some(gpu) = cudarc_gpu_or_skip(test) else {
        return;
    };
    let ctx = &gpu.ctx;
    let n = 1 << 20;
    let n32 = u32::try_from(n).unwrap();
    let data = pattern(n, 17);
    let expected: Vec<u32> = data.iter().map(|x| x.wrapping_add(1)).collect();
    let input = DeviceBuffer::from_host(ctx, &data).unwrap();
    let mut output = DeviceBuffer::<u32>::zeroed(ctx, n).unwrap();
    let mut output_view = output.as_mut_slice();
    let mut host = PinnedBuffer::<u32>::zeroed(ctx, n).unwrap();
    let ptx = std::ffi::CString::new(SPIN_PTX).unwrap();
    let module = Module::load_ptx(ctx, &ptx).unwrap();
    let kernel = module.function(c"spin_add_one").unwrap();
    let stream = Stream::new(ctx).unwrap();
    let done = Event::new(ctx).unwrap();
    let capturing = gpu.cu.new_stream().unwrap();

    let (result, started, elapsed, complete, right_after) =
        while_another_thread_captures(test, &capturing, start, hold, || {
            let started = Instant::now();
            let result = cuda_vmm::scope(|s| {
                let q = s.on(&stream);
                // SAFETY: `spin_add_one(u32 *dst, const u32 *src, u32 n, u64 ns)` takes these four,
                // in this order; it writes the `n` values of `output_view` and reads the `n` of
                // `input`.
                let (written, (), (), ()) = unsafe {
                    q.launch(
                        &kernel,
                        GRID,
                        BLOCK,
                        (&mut output_view, input.as_slice(), n32, nanos(SPIN)),
                    )
                }?;
                q.copy_to_host(&mut host, written)?;
                q.record(&done)?;
                Ok(())
            });
            let elapsed = started.elapsed();
            let complete = done.is_complete();
            (result, started, elapsed, complete, host.to_vec())
        });
    sleep_until(started, SPIN + SETTLE);
    let later = host.to_vec();
    let healthy = ctx.synchronize();
    println!(
        "{test}: the scope returned {result:?} after {elapsed:?}; the event after the download: \
         {complete:?}; the context: {healthy:?}"
    );
    assert_eq!(
        complete,
        Ok(true),
        "the download had not finished when the scope returned"
    );
    assert!(
        elapsed >= SPIN,
        "the scope returned after {elapsed:?}, before the {SPIN:?} kernel could have finished"
    );
    assert!(
        later == right_after,
        "the pinned buffer changed after the scope had returned"
    );
    assert!(
        right_after == expected,
        "the pinned buffer does not hold the kernel's results"
    );
    assert_eq!(healthy, Ok(()), "the context is not healthy");
}

/// Trigger 3: another thread begins a GLOBAL capture of a cudarc stream of its own, then
/// `cuda_vmm::scope` waits on a kernel and a download into a `PinnedBuffer`. The old scope's wait was
/// refused at once (900), and the host read the buffer while the download still wrote it. Proves
/// that the scope returns only once the download has finished, and that the buffer, read right
/// after, holds the kernel's results and is not written any more.
#[cfg(feature = "cudarc")]
#[test]
fn a_scope_waits_while_another_thread_captures_globally() {
    let _serial = serial();
    download_while_another_thread_captures(
        "a_scope_waits_while_another_thread_captures_globally",
        CaptureStart::BeforeTheCall,
        HOLD,
    );
}

/// A capture that starts while the scope already waits: another thread begins its GLOBAL capture
/// 50 ms after this thread set out to queue a [`SPIN`] kernel and a download in `cuda_vmm::scope`
/// (queued within a millisecond, so the scope is waiting by then), and holds it for 200 ms. Proves as trigger 3 that the scope returns only once the download has
/// finished, and that the pinned buffer is not written after it.
#[cfg(feature = "cudarc")]
#[test]
fn a_capture_beginning_during_the_wait_does_not_end_it_early() {
    let _serial = serial();
    download_while_another_thread_captures(
        "a_capture_beginning_during_the_wait_does_not_end_it_early",
        CaptureStart::DuringTheCall(Duration::from_millis(50)),
        Duration::from_millis(200),
    );
}

/// The two [`COPY`]-byte buffers of the copy tests, each one page: the source filled with
/// [`FILL`], the destination with zeros; and the page size.
#[cfg(feature = "cudarc")]
fn source_and_destination(gpu: &Gpu) -> (VirtualBuffer, VirtualBuffer, usize) {
    let device = gpu.device;
    let page = allocation_granularity(device, Granularity::Minimum).unwrap();
    let mut src = VirtualBuffer::new(COPY, &[device], ReadWrite).unwrap();
    src.grow(device, COPY).unwrap();
    let mut dst = VirtualBuffer::new(COPY, &[device], ReadWrite).unwrap();
    dst.grow(device, COPY).unwrap();
    fill(&gpu.ctx, &mut src, FILL);
    fill(&gpu.ctx, &mut dst, 0);
    (src, dst, page)
}

/// Trigger 4: a synchronous `DeviceSliceMut::copy_from_device` of 4 GiB while another thread
/// captures in GLOBAL mode. The copy runs on the legacy default stream, queued behind a [`SPIN`]
/// kernel launched there (through cudarc) just before; the old copy's wait was refused at once
/// (900), yet the copy ran afterwards into its destination. Proves that the copy returns only once
/// the kernel ahead of it has finished (its event has completed, [`SPIN`] has passed), that the last
/// 2 MiB page of the destination holds the source's bytes right after, and that they do not change
/// later; and that the context is healthy.
#[cfg(feature = "cudarc")]
#[test]
fn a_synchronous_device_copy_waits_while_another_thread_captures_globally() {
    const TEST: &str = "a_synchronous_device_copy_waits_while_another_thread_captures_globally";
    let _serial = serial();
    let Some(gpu) = cudarc_gpu_or_skip(TEST) else {
        return;
    };
    let ctx = &gpu.ctx;
    let (src, mut dst, page) = source_and_destination(&gpu);
    // Made before the kernel: cudarc's first stream of a context synchronises the context.
    let capturing = gpu.cu.new_stream().unwrap();
    let legacy = gpu.cu.default_stream();
    let launched = Instant::now(); // before the launch: the kernel cannot have begun earlier
    spin_on(&legacy, &gpu.spin, SPIN).unwrap();
    let spun = legacy.record_event(None).unwrap();

    let (copied, elapsed, spun_complete, right_after) =
        while_another_thread_captures(TEST, &capturing, CaptureStart::BeforeTheCall, HOLD, || {
            let source = src.slice_bytes::<u32>(..).unwrap();
            let copied = dst
                .slice_bytes_mut::<u32>(..)
                .unwrap()
                .copy_from_device(&source);
            let elapsed = launched.elapsed();
            let spun_complete = spun.try_is_complete();
            (copied, elapsed, spun_complete, last_page(&dst, page))
        });
    sleep_until(launched, SPIN + SETTLE);
    let later = last_page(&dst, page);
    let healthy = ctx.synchronize();
    println!(
        "{TEST}: the copy returned {copied:?} {elapsed:?} after the kernel ahead of it was \
         launched; that kernel's event: {spun_complete:?}; the context: {healthy:?}"
    );
    assert!(
        matches!(spun_complete, Ok(true)),
        "the kernel queued ahead of the copy had not finished when it returned ({spun_complete:?})"
    );
    assert!(
        elapsed >= SPIN,
        "the copy returned {elapsed:?} after the {SPIN:?} kernel ahead of it was launched"
    );
    let right_after = right_after.expect("reading the destination right after the copy");
    assert!(
        right_after.iter().all(|&x| x == FILL_WORD),
        "the last page of the destination does not hold the source's bytes right after the copy"
    );
    assert!(
        later.expect("reading the destination again") == right_after,
        "the destination changed after the copy had returned"
    );
    assert_eq!(healthy, Ok(()), "the context is not healthy");
}

/// Trigger 5: `copy_between_with(.., Route::Staged, ..)` of 4 GiB while another thread captures in
/// GLOBAL mode, its `Staging` dropped (the pinned memory freed) right after it returns. The old
/// copy's waits were refused at once (900), and the staging memory was freed with chunks possibly
/// in flight. Proves that when the copy returns no chunk is in flight: the first and last pages of
/// the destination, read right after, do not change later; where it returned `Ok`, they hold the
/// source's bytes; and the context is healthy.
#[cfg(feature = "cudarc")]
#[test]
fn a_staged_copy_waits_while_another_thread_captures_globally() {
    const TEST: &str = "a_staged_copy_waits_while_another_thread_captures_globally";
    let _serial = serial();
    let Some(gpu) = cudarc_gpu_or_skip(TEST) else {
        return;
    };
    let ctx = &gpu.ctx;
    let (src, mut dst, page) = source_and_destination(&gpu);
    let staging = Staging::new(ctx, STAGING_CHUNK_BYTES).unwrap();
    let capturing = gpu.cu.new_stream().unwrap();
    // The first and the last page of the destination, read with synchronous copies.
    let ends = |dst: &VirtualBuffer| -> Result<(Vec<u32>, Vec<u32>), cuda_vmm::Error> {
        Ok((
            dst.slice_bytes::<u32>(..page)?.to_vec()?,
            last_page(dst, page)?,
        ))
    };

    let (copied, elapsed, right_after) =
        while_another_thread_captures(TEST, &capturing, CaptureStart::BeforeTheCall, HOLD, || {
            let mut staging = staging;
            let started = Instant::now();
            let copied = copy_between_with(
                &mut dst.slice_bytes_mut::<u32>(..).unwrap(),
                &src.slice_bytes::<u32>(..).unwrap(),
                Route::Staged,
                &mut staging,
            );
            let elapsed = started.elapsed();
            drop(staging); // the pinned chunks are freed right after the copy returned
            (copied, elapsed, ends(&dst))
        });
    thread::sleep(SETTLE);
    let later = ends(&dst);
    let healthy = ctx.synchronize();
    println!(
        "{TEST}: the staged copy returned {copied:?} after {elapsed:?}; the context: {healthy:?}"
    );
    let right_after = right_after.expect("reading the destination right after the copy");
    assert!(
        later.expect("reading the destination again") == right_after,
        "the destination changed after the staged copy had returned"
    );
    if let Ok(path) = copied {
        assert_eq!(path, CopyPath::Staged);
        let (first, last) = &right_after;
        assert!(
            first.iter().chain(last).all(|&x| x == FILL_WORD),
            "the staged copy returned Ok, but the destination does not hold the source's bytes"
        );
    }
    assert_eq!(healthy, Ok(()), "the context is not healthy");
}

/// Trigger 6: host NUMA memory (a `HostAllocation` mapped with `map_host`) granted to the device;
/// inside `interop::cudarc::scope`, a [`SPIN`] kernel and then cudarc's memset of the lent host
/// view are queued, and the closure ends the scope by beginning a capture of its stream. Then the
/// device's grant goes, the CPU is granted the mapping and fills its `&mut [u8]` with a pattern,
/// and waits until the memset would have run. The old scope returned at once, and the device then
/// overwrote the CPU's live `&mut [u8]`. Proves that the memset has finished when the scope returns
/// (its event has completed, [`SPIN`] has passed), that cudarc's `end_capture` hands back no graph,
/// and that the CPU's pattern stays intact.
#[cfg(feature = "cudarc")]
#[test]
fn host_numa_memory_is_not_written_after_a_cudarc_scope_ended_by_a_capture() {
    const TEST: &str = "host_numa_memory_is_not_written_after_a_cudarc_scope_ended_by_a_capture";
    const PATTERN: u8 = 0xcd;
    let _serial = serial();
    let Some(gpu) = cudarc_gpu_or_skip(TEST) else {
        return;
    };
    if !gpu.device.supports_host_numa_memory().unwrap() {
        skip(&format!(
            "SKIPPED {TEST}: {:?} does not support VMM memory on a host NUMA node",
            gpu.device
        ));
        return;
    }
    let size = 2 * allocation_granularity(gpu.device, Granularity::Minimum).unwrap();
    let mut memory = HostAllocation::near(gpu.device, size).unwrap();
    let mut reservation = VirtualReservation::new(size, 0).unwrap();
    let mut region = reservation.region();
    let mut mapping = region.map_host(&mut memory).unwrap();
    let stream = gpu.cu.new_stream().unwrap();
    let done = gpu.cu.new_event(None).unwrap();

    let started = Instant::now();
    let (result, elapsed, complete, graph_made, graph) = {
        let mut on_device = mapping.grant(&gpu.ctx, ReadWrite).unwrap();
        let mut view = on_device.slice_mut::<u8>().unwrap();
        let result = scope(&stream, |s| -> TestResult {
            let mut lent = s.lend_mut(&mut view)?;
            spin_on(&stream, &gpu.spin, SPIN)?;
            stream.memset_zeros(&mut lent)?;
            done.record(&stream)?;
            stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
            Ok(())
        });
        let elapsed = started.elapsed();
        let complete = done.try_is_complete();
        let graph = stream.end_capture(CUgraphInstantiate_flags(0));
        let graph_made = matches!(graph, Ok(Some(_)));
        (result, elapsed, complete, graph_made, describe_graph(graph))
    }; // the device's grant and view end here
    let mut cpu = mapping.grant_host(ReadWrite).unwrap();
    let bytes = cpu.as_mut_slice::<u8>().unwrap();
    bytes.fill(PATTERN);
    sleep_until(started, SPIN + SETTLE);
    // Through `black_box`, so that the compiler reads the bytes again rather than assume that a
    // `&mut [u8]` still holds what it was filled with (which is what this checks).
    let bytes = std::hint::black_box(bytes);
    let overwritten = bytes.iter().filter(|&&b| b != PATTERN).count();
    let healthy = gpu.ctx.synchronize();
    println!(
        "{TEST}: the scope returned {result:?} after {elapsed:?}; the event after the memset: \
         {complete:?}; {graph}; {overwritten} of the CPU's {size} bytes overwritten; the context: \
         {healthy:?}"
    );
    assert!(
        matches!(complete, Ok(true)),
        "the memset had not finished when the scope returned ({complete:?})"
    );
    assert!(
        elapsed >= SPIN,
        "the scope returned after {elapsed:?}, before the {SPIN:?} kernel could have finished"
    );
    assert!(
        !graph_made,
        "cudarc's end_capture handed back a graph after the scope"
    );
    assert_eq!(
        overwritten, 0,
        "the device wrote the CPU's &mut [u8] after the scope had returned"
    );
    assert_eq!(healthy, Ok(()), "the context is not healthy");
}

/// `RevocableAccess::end` (the grant of `Mapping::grant_revocable`, revoked and dropped) while
/// another thread captures in GLOBAL mode. A [`SPIN`] kernel, launched through cudarc with the
/// grant's raw address, adds one to every value of the granted memory; the grant then ends, which
/// synchronises the context before revoking the access. The old synchronisation was refused at once
/// (900), and the access was revoked under the kernel. Proves that the grant ends only once the
/// kernel has finished (its event has completed, [`SPIN`] has passed), that the context is healthy
/// (the kernel did not touch revoked memory), and that the memory holds the kernel's results.
#[cfg(feature = "cudarc")]
#[test]
fn a_revocable_grant_ends_only_after_the_work_while_another_thread_captures_globally() {
    const TEST: &str =
        "a_revocable_grant_ends_only_after_the_work_while_another_thread_captures_globally";
    let _serial = serial();
    let Some(gpu) = cudarc_gpu_or_skip(TEST) else {
        return;
    };
    let ctx = &gpu.ctx;
    let g = allocation_granularity(gpu.device, Granularity::Minimum).unwrap();
    let n = g / 4;
    let n32 = u32::try_from(n).unwrap();
    let data = pattern(n, 23);
    let expected: Vec<u32> = data.iter().map(|x| x.wrapping_add(1)).collect();
    let memory = PhysicalAllocation::new(gpu.device, g).unwrap();
    let mut reservation = VirtualReservation::new(g, 0).unwrap();
    let mut region = reservation.region();
    let mut mapping = region.map(&memory).unwrap();
    let stream = gpu.cu.new_stream().unwrap();
    let capturing = gpu.cu.new_stream().unwrap();
    let config = LaunchConfig {
        grid_dim: GRID,
        block_dim: BLOCK,
        shared_mem_bytes: 0,
    };
    let contexts = [ctx];
    for revoke in [true, false] {
        let how = if revoke { "revoke" } else { "drop" };
        let mut grant = mapping.grant_revocable(&contexts, ReadWrite).unwrap();
        grant
            .slice_mut::<u32>()
            .unwrap()
            .copy_from_host(&data)
            .unwrap();
        let (ptr, ns) = (grant.as_raw_ptr(), nanos(SPIN));
        let launched = Instant::now(); // before the launch: the kernel cannot have begun earlier
        // SAFETY: `spin_add_one(u32 *dst, const u32 *src, u32 n, u64 ns)` takes these four, in this
        // order; it reads and writes the `n` values at `ptr` in place (`dst[i] = dst[i] + 1`, each
        // value by one thread), the whole granted range. The range stays mapped for the whole test,
        // and granted to this device until the grant ends, which synchronises the context before it
        // revokes the access (what this test checks); nothing else uses the memory meanwhile.
        unsafe {
            stream
                .launch_builder(&gpu.spin)
                .arg(&ptr)
                .arg(&ptr)
                .arg(&n32)
                .arg(&ns)
                .launch(config)
        }
        .unwrap();
        let done = stream.record_event(None).unwrap();

        let (ended, elapsed, complete) = while_another_thread_captures(
            TEST,
            &capturing,
            CaptureStart::BeforeTheCall,
            HOLD,
            || {
                let ended = if revoke {
                    grant.revoke()
                } else {
                    drop(grant);
                    Ok(())
                };
                (ended, launched.elapsed(), done.try_is_complete())
            },
        );
        let healthy = ctx.synchronize();
        println!(
            "{TEST} ({how}): the grant ended with {ended:?} {elapsed:?} after the kernel was \
             launched; its event: {complete:?}; the context: {healthy:?}"
        );
        assert!(
            matches!(complete, Ok(true)),
            "{how}: the kernel had not finished when the grant ended ({complete:?})"
        );
        assert!(
            elapsed >= SPIN,
            "{how}: the grant ended {elapsed:?} after the {SPIN:?} kernel was launched"
        );
        assert_eq!(healthy, Ok(()), "{how}: the context is not healthy");
        let after = mapping
            .grant(ctx, ReadOnly)
            .unwrap()
            .slice::<u32>()
            .unwrap()
            .to_vec()
            .unwrap();
        assert!(
            after == expected,
            "{how}: the memory does not hold the kernel's results"
        );
    }
}

/// The abort: in a child process, inside `interop::cudarc::scope` on a cudarc stream S, a view is
/// lent to cudarc's memset on S; then another stream A begins a capture, an event recorded on A is
/// waited for on S (S joins A's capture), and the closure returns with A's capture open. The scope
/// cannot end a capture S did not begin, and nothing proves the memset finished, so it must neither
/// return nor hang: the child must abort after about ten seconds. Proves, from the parent, that
/// the child was killed by `SIGABRT`, that its stderr says `cuda-vmm: aborting:`, and that it took
/// at least nine seconds.
#[cfg(all(feature = "cudarc", unix))]
#[test]
fn a_capture_the_scope_cannot_end_aborts_the_process() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};

    const TEST: &str = "a_capture_the_scope_cannot_end_aborts_the_process";
    /// Far past the ten seconds of the abort: a child still running then is killed, and fails.
    const LIMIT: Duration = Duration::from_secs(90);
    /// The signal `abort()` raises, on Linux.
    const SIGABRT: i32 = 6;
    let _serial = serial();
    if let Ok(role) = std::env::var(CHILD) {
        assert_eq!(role, "abort", "{TEST}: an unknown child role");
        return abort_child(TEST);
    }
    if gpu_or_skip(TEST).is_none() {
        return;
    }
    let started = Instant::now();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "abort")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{TEST}: spawning the child: {e}"));
    let read_all = |mut pipe: Box<dyn Read + Send>| {
        let mut text = String::new();
        pipe.read_to_string(&mut text).map(|_| text)
    };
    let (stdout, stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let (status, stdout, stderr) = thread::scope(|t| {
        let stdout = t.spawn(|| read_all(Box::new(stdout)));
        let stderr = t.spawn(|| read_all(Box::new(stderr)));
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > LIMIT {
                child.kill().unwrap();
                break child.wait().unwrap();
            }
            thread::sleep(Duration::from_millis(50));
        };
        (status, stdout.join().unwrap(), stderr.join().unwrap())
    });
    let elapsed = started.elapsed();
    let (stdout, stderr) = (stdout.unwrap(), stderr.unwrap());
    println!(
        "{TEST}: the child ended with {status:?} after {elapsed:?}\n--- its stdout:\n{stdout}\n--- \
         its stderr:\n{stderr}"
    );
    assert_eq!(
        status.signal(),
        Some(SIGABRT),
        "the child was not killed by SIGABRT: {status:?}"
    );
    assert!(
        stderr.contains("cuda-vmm: aborting:"),
        "the child's stderr does not say `cuda-vmm: aborting:`"
    );
    assert!(
        elapsed >= Duration::from_secs(9),
        "the child aborted after {elapsed:?}, before the scope could have waited ten seconds"
    );
}

/// The child of [`a_capture_the_scope_cannot_end_aborts_the_process`]; it is expected to abort
/// inside the scope, and says so where it does not.
#[cfg(all(feature = "cudarc", unix))]
fn abort_child(test: &str) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

    // The abort is deliberate: no core dump of a process with gigabytes of address space reserved.
    let core = getrlimit(Resource::Core);
    setrlimit(
        Resource::Core,
        Rlimit {
            current: Some(0),
            maximum: core.maximum,
        },
    )
    .expect("lowering the child's core size limit");
    let gpu = cudarc_gpu_or_skip(test).expect("the child sees the parent's GPU");
    let (origin, scoped) = (gpu.cu.new_stream().unwrap(), gpu.cu.new_stream().unwrap());
    let page = allocation_granularity(gpu.device, Granularity::Minimum).unwrap();
    let mut buffer = VirtualBuffer::new(page, &[gpu.device], ReadWrite).unwrap();
    buffer.grow(gpu.device, page).unwrap();
    let mut view = buffer.slice_bytes_mut::<u32>(..).unwrap();
    let fork = gpu.cu.new_event(None).unwrap();
    println!("{test} (child): entering the scope");
    let started = Instant::now();
    let result = scope(&scoped, |s| -> TestResult {
        let mut lent = s.lend_mut(&mut view)?;
        scoped.memset_zeros(&mut lent)?;
        origin.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        fork.record(&origin)?; // a node of the capture
        scoped.wait(&fork)?; // `scoped` waits for it: it joins `origin`'s capture
        Ok(())
    });
    println!(
        "{test} (child): the scope returned {result:?} after {:?}, without aborting",
        started.elapsed()
    );
}
