//! What the driver does with waits and synchronous copies under stream capture, checked through raw
//! driver calls: the facts that the crate's one wait (`src/wait.rs`) is built on. Each test prints
//! every code it reads, so a driver that behaves otherwise shows what changed.
//!
//! The tests take one lock: a capture of one test must not refuse the calls of another.

mod common;

use core::ffi::c_void;
use core::ptr;
use std::sync::{Barrier, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use common::code_name as name;
use common::{exchange_capture_mode as exchange_mode, raw_bind as bind};
use cuda_vmm::{Context, DeviceBuffer, Event, Stream};

const GLOBAL: u32 = 0;
const RELAXED: u32 = 2;
const STATUS_NONE: u32 = 0;
const CAPTURE_UNSUPPORTED: u32 = 900;

// The driver's own symbols with integer results: no driver value lands in a Rust enum.
unsafe extern "C" {
    fn cuCtxSynchronize() -> u32;
    fn cuStreamSynchronize(stream: *mut c_void) -> u32;
    fn cuStreamBeginCapture_v2(stream: *mut c_void, mode: u32) -> u32;
    fn cuStreamEndCapture(stream: *mut c_void, graph: *mut *mut c_void) -> u32;
    fn cuStreamIsCapturing(stream: *mut c_void, status: *mut u32) -> u32;
    fn cuGraphDestroy(graph: *mut c_void) -> u32;
    fn cuMemsetD8Async(dst: u64, value: u8, count: usize, stream: *mut c_void) -> u32;
    fn cuMemcpyDtoD_v2(dst: u64, src: u64, bytes: usize) -> u32;
    fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, bytes: usize) -> u32;
    fn cuEventRecord(event: *mut c_void, stream: *mut c_void) -> u32;
    fn cuStreamWaitEvent(stream: *mut c_void, event: *mut c_void, flags: u32) -> u32;
}

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

fn status(stream: &Stream) -> (u32, u32) {
    let mut status = 99;
    // SAFETY: a live stream of the current context; `status` is writable.
    let code = unsafe { cuStreamIsCapturing(stream.as_raw().cast(), &raw mut status) };
    (code, status)
}

/// Queues a memset of all of `buffer` on `stream`, long enough (gigabytes) to be still running when
/// the host goes on.
fn queue_long_memset(buffer: &mut DeviceBuffer<u8>, stream: &Stream, byte: u8) {
    // SAFETY: the buffer's own memory, in the current context, which outlives the memset (the
    // tests wait before the buffer is dropped).
    let code = unsafe {
        cuMemsetD8Async(
            buffer.as_mut_slice().as_raw_ptr(),
            byte,
            buffer.len(),
            stream.as_raw().cast(),
        )
    };
    assert_eq!(code, 0, "cuMemsetD8Async: {}", name(code));
}

/// Thread B captures in GLOBAL mode (CUDA's default) on a stream of its own for `hold`, while this
/// thread runs `during` after B's capture has begun; returns `during`'s value.
fn while_another_thread_captures<R>(
    ctx: &Context,
    hold: Duration,
    during: impl FnOnce() -> R,
) -> R {
    let begun = Barrier::new(2);
    std::thread::scope(|t| {
        t.spawn(|| {
            bind(ctx);
            let stream = Stream::new(ctx).unwrap();
            // SAFETY: a live stream of the current context, not capturing.
            let code = unsafe { cuStreamBeginCapture_v2(stream.as_raw().cast(), GLOBAL) };
            assert_eq!(code, 0, "cuStreamBeginCapture: {}", name(code));
            begun.wait();
            std::thread::sleep(hold);
            let mut graph = ptr::null_mut();
            // SAFETY: the capture begun above, on this thread.
            let code = unsafe { cuStreamEndCapture(stream.as_raw().cast(), &raw mut graph) };
            println!("capturing thread: cuStreamEndCapture {}", name(code));
            if !graph.is_null() {
                // SAFETY: the graph just made, destroyed once.
                unsafe { cuGraphDestroy(graph) };
            }
        });
        begun.wait();
        during()
    })
}

/// Another thread's GLOBAL capture refuses this thread's waits while this thread is in GLOBAL mode
/// (and the refusal invalidates that capture), and refuses none of them in RELAXED mode, where the wait really waits
/// (an event recorded after a long memset has completed when it returns). `cuCtxSynchronize` is
/// the exception: refused in RELAXED mode too while any stream of the context captures, it waits
/// once the capture has ended.
#[test]
fn relaxed_mode_is_not_refused_by_another_threads_capture() {
    let _serial = serial();
    let Some((_device, ctx)) =
        common::gpu_or_skip("relaxed_mode_is_not_refused_by_another_threads_capture")
    else {
        return;
    };
    let mut big = DeviceBuffer::<u8>::zeroed(&ctx, 8 << 30).unwrap();
    let small = DeviceBuffer::<u8>::zeroed(&ctx, 1 << 20).unwrap();
    let mut small_dst = DeviceBuffer::<u8>::zeroed(&ctx, 1 << 20).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let done = Event::new(&ctx).unwrap();

    while_another_thread_captures(&ctx, Duration::from_millis(400), || {
        bind(&ctx);
        // GLOBAL (the default): refused at once.
        queue_long_memset(&mut big, &stream, 1);
        // SAFETY: a live stream of the current context.
        let global = unsafe { cuStreamSynchronize(stream.as_raw().cast()) };
        println!("GLOBAL mode: cuStreamSynchronize {}", name(global));
        assert_eq!(global, CAPTURE_UNSUPPORTED);
        // A synchronous copy to pageable host memory: printed only (a copy between device buffers
        // is not refused at all; the crate does not depend on either answer).
        let mut host = vec![0u8; 1 << 20];
        // SAFETY: `host` is writable for 1 MiB; `small` is 1 MiB of the current context.
        let copy = unsafe {
            cuMemcpyDtoH_v2(
                host.as_mut_ptr().cast(),
                small.as_slice().as_raw_ptr(),
                1 << 20,
            )
        };
        println!("GLOBAL mode: cuMemcpyDtoH {}", name(copy));

        let previous = exchange_mode(RELAXED);
        assert_eq!(previous, GLOBAL);
        // RELAXED: the stream wait waits.
        queue_long_memset(&mut big, &stream, 2);
        // SAFETY: a live event and stream of the current context.
        let code = unsafe { cuEventRecord(done.as_raw().cast(), stream.as_raw().cast()) };
        assert_eq!(code, 0);
        // SAFETY: as above.
        let relaxed = unsafe { cuStreamSynchronize(stream.as_raw().cast()) };
        println!("RELAXED mode: cuStreamSynchronize {}", name(relaxed));
        assert_eq!(relaxed, 0);
        assert!(
            done.is_complete().unwrap(),
            "the relaxed wait returned early"
        );
        // RELAXED: the synchronous copy runs.
        // SAFETY: as above.
        let copy = unsafe {
            cuMemcpyDtoD_v2(
                small_dst.as_mut_slice().as_raw_ptr(),
                small.as_slice().as_raw_ptr(),
                1 << 20,
            )
        };
        println!("RELAXED mode: cuMemcpyDtoD {}", name(copy));
        assert_eq!(copy, 0);
        // SAFETY: as for the GLOBAL-mode copy above.
        let copy = unsafe {
            cuMemcpyDtoH_v2(
                host.as_mut_ptr().cast(),
                small.as_slice().as_raw_ptr(),
                1 << 20,
            )
        };
        println!("RELAXED mode: cuMemcpyDtoH {}", name(copy));
        assert_eq!(copy, 0);
        // RELAXED: the context's wait.
        queue_long_memset(&mut big, &stream, 3);
        // SAFETY: as above.
        let code = unsafe { cuEventRecord(done.as_raw().cast(), stream.as_raw().cast()) };
        assert_eq!(code, 0);
        let start = Instant::now();
        // SAFETY: no arguments; a context is current.
        let context = unsafe { cuCtxSynchronize() };
        println!(
            "RELAXED mode: cuCtxSynchronize {} after {:?}, the memset {}",
            name(context),
            start.elapsed(),
            if done.is_complete().unwrap() {
                "complete"
            } else {
                "still running"
            }
        );
        // Refused at once, in RELAXED mode too, while any stream of the context captures: the
        // crate's context waits wait such a capture out (src/wait.rs).
        assert_eq!(
            context, CAPTURE_UNSUPPORTED,
            "cuCtxSynchronize in RELAXED mode under another thread's capture"
        );
        exchange_mode(previous);
    });
    // The capture has ended: the context's wait waits.
    bind(&ctx);
    let previous = exchange_mode(RELAXED);
    // SAFETY: no arguments; a context is current.
    let context = unsafe { cuCtxSynchronize() };
    println!(
        "RELAXED mode, no capture: cuCtxSynchronize {}",
        name(context)
    );
    assert_eq!(context, 0);
    assert!(done.is_complete().unwrap());
    exchange_mode(previous);
    ctx.synchronize().unwrap();
}

/// A wait on a stream that is itself capturing is refused in every mode, and invalidates the
/// capture; the thread that began it ends it (no graph), and the stream then waits normally for the
/// work queued before the capture. A stream that joined another stream's capture cannot end it:
/// only the origin can.
#[test]
fn a_capturing_stream_is_ended_by_its_origin_only() {
    let _serial = serial();
    let Some((_device, ctx)) =
        common::gpu_or_skip("a_capturing_stream_is_ended_by_its_origin_only")
    else {
        return;
    };
    let mut big = DeviceBuffer::<u8>::zeroed(&ctx, 8 << 30).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let origin = Stream::new(&ctx).unwrap();
    let done = Event::new(&ctx).unwrap();
    let forked = Event::new(&ctx).unwrap();
    bind(&ctx);
    let previous = exchange_mode(RELAXED);

    // The stream's own capture.
    queue_long_memset(&mut big, &stream, 1);
    // SAFETY: a live event and stream of the current context.
    let code = unsafe { cuEventRecord(done.as_raw().cast(), stream.as_raw().cast()) };
    assert_eq!(code, 0);
    // SAFETY: a live stream, not capturing.
    let code = unsafe { cuStreamBeginCapture_v2(stream.as_raw().cast(), GLOBAL) };
    assert_eq!(code, 0);
    // SAFETY: a live stream.
    let refused = unsafe { cuStreamSynchronize(stream.as_raw().cast()) };
    let after = status(&stream);
    println!(
        "own capture: cuStreamSynchronize {}, then capture status {after:?}",
        name(refused)
    );
    assert_eq!(refused, CAPTURE_UNSUPPORTED);
    assert_eq!(after.0, 0);
    assert_ne!(
        after.1, STATUS_NONE,
        "still capturing after the refused wait"
    );
    let mut graph = ptr::null_mut();
    // SAFETY: the capture begun above, on this thread.
    let ended = unsafe { cuStreamEndCapture(stream.as_raw().cast(), &raw mut graph) };
    println!(
        "own capture: cuStreamEndCapture {}, graph {}",
        name(ended),
        if graph.is_null() { "none" } else { "made" }
    );
    if !graph.is_null() {
        // SAFETY: the graph just made.
        unsafe { cuGraphDestroy(graph) };
    }
    assert_eq!(status(&stream), (0, STATUS_NONE));
    // SAFETY: a live stream, not capturing.
    assert_eq!(unsafe { cuStreamSynchronize(stream.as_raw().cast()) }, 0);
    assert!(done.is_complete().unwrap());

    // A joined capture: `origin` begins, `stream` waits for an event recorded in it.
    queue_long_memset(&mut big, &stream, 2);
    // SAFETY: live handles of the current context.
    unsafe {
        assert_eq!(
            cuEventRecord(done.as_raw().cast(), stream.as_raw().cast()),
            0
        );
        assert_eq!(cuStreamBeginCapture_v2(origin.as_raw().cast(), GLOBAL), 0);
        assert_eq!(
            cuEventRecord(forked.as_raw().cast(), origin.as_raw().cast()),
            0
        );
        assert_eq!(
            cuStreamWaitEvent(stream.as_raw().cast(), forked.as_raw().cast(), 0),
            0
        );
    }
    let joined = status(&stream);
    let mut graph = ptr::null_mut();
    // SAFETY: a live stream, capturing (joined).
    let not_ours = unsafe { cuStreamEndCapture(stream.as_raw().cast(), &raw mut graph) };
    println!(
        "joined capture: status {joined:?}, cuStreamEndCapture on the joined stream {}, then status {:?}",
        name(not_ours),
        status(&stream)
    );
    assert_ne!(joined.1, STATUS_NONE);
    assert_ne!(not_ours, 0);
    assert!(graph.is_null());
    assert_ne!(
        status(&stream).1,
        STATUS_NONE,
        "a joined stream cannot end the capture"
    );
    // SAFETY: the capture begun above on `origin`, on this thread.
    let origin_end = unsafe { cuStreamEndCapture(origin.as_raw().cast(), &raw mut graph) };
    println!(
        "joined capture: cuStreamEndCapture on the origin {}, then the joined stream's status {:?}",
        name(origin_end),
        status(&stream)
    );
    if !graph.is_null() {
        // SAFETY: the graph just made.
        unsafe { cuGraphDestroy(graph) };
    }
    assert_eq!(status(&stream).1, STATUS_NONE);
    // SAFETY: a live stream, not capturing.
    assert_eq!(unsafe { cuStreamSynchronize(stream.as_raw().cast()) }, 0);
    assert!(done.is_complete().unwrap());
    exchange_mode(previous);
}
