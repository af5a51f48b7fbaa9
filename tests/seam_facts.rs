//! What the driver does where other code queues work on a stream the crate lends memory to: a
//! stream pulled into another stream's capture by an event wait, an event recorded inside such a
//! capture, a capture of the per-thread default stream in the way of a legacy-stream wait, work
//! another thread queues onto a stream this thread captures, and what the checks the crate builds
//! on them cost. Raw driver calls only, each code printed, so that a driver that behaves otherwise
//! shows what changed; the crate's rules in `src/wait.rs`, `src/interop/cudarc.rs` and
//! `src/stream/graph.rs` rest on these answers.
//!
//! The tests take one lock: a capture of one test must not refuse the calls of another.

mod common;

use core::ffi::c_void;
use core::ptr;
use std::sync::{Barrier, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use common::code_name as name;
use common::{exchange_capture_mode as exchange_mode, raw_bind as bind};
use cuda_vmm::{DeviceBuffer, Event, Stream};

const GLOBAL: u32 = 0;
const THREAD_LOCAL: u32 = 1;
const RELAXED: u32 = 2;
const STATUS_NONE: u32 = 0;
const STATUS_ACTIVE: u32 = 1;
const STATUS_INVALIDATED: u32 = 2;
const INVALID_VALUE: u32 = 1;
const CAPTURE_UNSUPPORTED: u32 = 900;
const CAPTURE_INVALIDATED: u32 = 901;
const CAPTURE_IMPLICIT: u32 = 906;
const CAPTURED_EVENT: u32 = 907;
const CAPTURE_WRONG_THREAD: u32 = 908;
const PER_THREAD: usize = 0x2;
const LEGACY: usize = 0x1;

// The driver's own symbols with integer results: no driver value lands in a Rust enum.
unsafe extern "C" {
    fn cuCtxSynchronize() -> u32;
    fn cuStreamSynchronize(stream: *mut c_void) -> u32;
    fn cuStreamQuery(stream: *mut c_void) -> u32;
    fn cuStreamBeginCapture_v2(stream: *mut c_void, mode: u32) -> u32;
    fn cuStreamEndCapture(stream: *mut c_void, graph: *mut *mut c_void) -> u32;
    fn cuStreamIsCapturing(stream: *mut c_void, status: *mut u32) -> u32;
    fn cuStreamGetCaptureInfo_v2(
        stream: *mut c_void,
        status: *mut u32,
        id: *mut u64,
        graph: *mut *mut c_void,
        deps: *mut *const *mut c_void,
        count: *mut usize,
    ) -> u32;
    fn cuGraphDestroy(graph: *mut c_void) -> u32;
    fn cuGraphGetNodes(graph: *mut c_void, nodes: *mut *mut c_void, count: *mut usize) -> u32;
    fn cuGraphInstantiateWithFlags(exec: *mut *mut c_void, graph: *mut c_void, flags: u64) -> u32;
    fn cuGraphExecDestroy(exec: *mut c_void) -> u32;
    fn cuMemsetD8Async(dst: u64, value: u8, count: usize, stream: *mut c_void) -> u32;
    fn cuEventRecord(event: *mut c_void, stream: *mut c_void) -> u32;
    fn cuEventQuery(event: *mut c_void) -> u32;
    fn cuStreamWaitEvent(stream: *mut c_void, event: *mut c_void, flags: u32) -> u32;
    fn cuThreadExchangeStreamCaptureMode(mode: *mut u32) -> u32;
    fn cuStreamCreate(stream: *mut *mut c_void, flags: u32) -> u32;
    fn cuStreamDestroy_v2(stream: *mut c_void) -> u32;
}

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

fn raw(stream: &Stream) -> *mut c_void {
    stream.as_raw().cast()
}

fn ev(event: &Event) -> *mut c_void {
    event.as_raw().cast()
}

/// `cuStreamIsCapturing` of a raw stream handle: (code, status).
fn status_raw(stream: *mut c_void) -> (u32, u32) {
    let mut status = 99;
    // SAFETY: a live stream (or a special handle) of the current context; `status` is writable.
    let code = unsafe { cuStreamIsCapturing(stream, &raw mut status) };
    (code, status)
}

/// `cuStreamEndCapture`: the code, and the number of nodes of the graph it gave (destroyed here).
fn end(stream: *mut c_void) -> (u32, Option<usize>) {
    let mut graph = ptr::null_mut();
    // SAFETY: a live stream of the current context; `graph` is writable.
    let code = unsafe { cuStreamEndCapture(stream, &raw mut graph) };
    let nodes = (!graph.is_null()).then(|| {
        let mut count = 0usize;
        // SAFETY: the graph just made; a null node array asks for the count only.
        let code = unsafe { cuGraphGetNodes(graph, ptr::null_mut(), &raw mut count) };
        assert_eq!(code, 0);
        // SAFETY: the graph just made, destroyed once.
        unsafe { cuGraphDestroy(graph) };
        count
    });
    (code, nodes)
}

fn memset(buffer: &mut DeviceBuffer<u8>, stream: *mut c_void, byte: u8) -> u32 {
    // SAFETY: the buffer's own memory, in the current context; the tests wait (or end the
    // capture that holds the memset, destroying its graph) before the buffer is dropped.
    unsafe {
        cuMemsetD8Async(
            buffer.as_mut_slice().as_raw_ptr(),
            byte,
            buffer.len(),
            stream,
        )
    }
}

/// A stream pulled into another stream's capture by waiting for an event recorded in it (what
/// cudarc's event tracking does when a `CudaSlice` was last written inside a capture): work queued
/// on it afterwards is captured, not run. An event recorded on it then is a captured event. Asked
/// while the capture is active, `cuEventQuery` of that event is refused, and the capture is
/// invalidated (no graph at its end); asked after the capture ended with a graph, it says what the
/// crate can still learn of a capture it did not see.
#[test]
#[allow(clippy::too_many_lines)] // one sequence of driver calls, each answer printed in order
fn an_event_recorded_in_a_joined_capture() {
    let _serial = serial();
    let Some((_device, ctx)) = common::gpu_or_skip("an_event_recorded_in_a_joined_capture") else {
        return;
    };
    let mut buffer = DeviceBuffer::<u8>::zeroed(&ctx, 1 << 20).unwrap();
    let (s, x) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let (fork, join, probe) = (
        Event::new(&ctx).unwrap(),
        Event::new(&ctx).unwrap(),
        Event::new(&ctx).unwrap(),
    );
    bind(&ctx);
    for (mode, mode_name) in [
        (GLOBAL, "GLOBAL"),
        (THREAD_LOCAL, "THREAD_LOCAL"),
        (RELAXED, "RELAXED"),
    ] {
        for query_during in [true, false] {
            // SAFETY: live handles of the current context throughout.
            unsafe {
                assert_eq!(cuStreamBeginCapture_v2(raw(&x), mode), 0);
                assert_eq!(cuEventRecord(ev(&fork), raw(&x)), 0);
                let pulled = cuStreamWaitEvent(raw(&s), ev(&fork), 0);
                let joined = status_raw(raw(&s));
                let queued = memset(&mut buffer, raw(&s), 1);
                let recorded = cuEventRecord(ev(&probe), raw(&s));
                let during = query_during.then(|| cuEventQuery(ev(&probe)));
                let origin = status_raw(raw(&x));
                let join_recorded = cuEventRecord(ev(&join), raw(&s));
                let rejoined = cuStreamWaitEvent(raw(&x), ev(&join), 0);
                let mut graph = ptr::null_mut();
                let ended = cuStreamEndCapture(raw(&x), &raw mut graph);
                let mut nodes = 0usize;
                let mut exec = ptr::null_mut();
                let instantiated = if graph.is_null() {
                    None
                } else {
                    assert_eq!(cuGraphGetNodes(graph, ptr::null_mut(), &raw mut nodes), 0);
                    Some(cuGraphInstantiateWithFlags(&raw mut exec, graph, 0))
                };
                let after_end = cuEventQuery(ev(&probe));
                if !exec.is_null() {
                    cuGraphExecDestroy(exec);
                }
                if !graph.is_null() {
                    cuGraphDestroy(graph);
                }
                let after_destroy = cuEventQuery(ev(&probe));
                let wait_after = cuStreamWaitEvent(raw(&x), ev(&probe), 0);
                let x_after = status_raw(raw(&x));
                let s_status = status_raw(raw(&s));
                let later = cuEventRecord(ev(&probe), raw(&s));
                let synced = cuStreamSynchronize(raw(&s));
                let rerecorded = cuEventQuery(ev(&probe));
                println!(
                    "{mode_name} capture, query during it {query_during}: wait on the captured event \
                     {}, joined status {joined:?}, memset {}, record {}, query during {:?}, origin \
                     status then {origin:?}, record for the rejoin {}, rejoin {}, end {} ({} nodes, \
                     instantiate {:?}), query after the end {}, after the graph's destruction {}, \
                     a wait for it then {} (that stream's status {x_after:?}), joined stream then {s_status:?}, a record then {} and a wait {}, a query after \
                     that {}",
                    name(pulled),
                    name(queued),
                    name(recorded),
                    during.map(name),
                    name(join_recorded),
                    name(rejoined),
                    name(ended),
                    nodes,
                    instantiated.map(name),
                    name(after_end),
                    name(after_destroy),
                    name(wait_after),
                    name(later),
                    name(synced),
                    name(rerecorded),
                );
                // What `src/interop/cudarc.rs` (the probe) rests on.
                assert_eq!(
                    (pulled, joined, queued, recorded),
                    (0, (0, STATUS_ACTIVE), 0, 0),
                    "the wait pulled the stream into the capture, whose work and record are taken"
                );
                if query_during {
                    assert_eq!(during, Some(CAPTURED_EVENT), "a captured event is refused");
                    assert_eq!(
                        origin,
                        (0, STATUS_INVALIDATED),
                        "the query invalidated the capture"
                    );
                    assert_eq!((ended, nodes), (CAPTURE_INVALIDATED, 0), "no graph");
                } else {
                    assert_eq!(origin, (0, STATUS_ACTIVE));
                    assert_eq!(ended, 0, "the capture made its graph");
                    assert!(nodes > 0, "the captured memset is in it");
                    assert_eq!(instantiated, Some(0));
                }
                assert_eq!(
                    (after_end, after_destroy),
                    (INVALID_VALUE, INVALID_VALUE),
                    "an event last recorded in an ended capture answers INVALID_VALUE"
                );
                assert_eq!(
                    (later, synced, rerecorded),
                    (0, 0, 0),
                    "until recorded again"
                );
            }
        }
    }
}

/// A wait of a stream that joined another stream's capture is refused in every mode; whether the
/// refusal invalidates the capture (so that no graph holds what was queued after the join).
#[test]
fn a_wait_of_a_joined_stream() {
    let _serial = serial();
    let Some((_device, ctx)) = common::gpu_or_skip("a_wait_of_a_joined_stream") else {
        return;
    };
    let mut buffer = DeviceBuffer::<u8>::zeroed(&ctx, 1 << 20).unwrap();
    let (s, x) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let (fork, join) = (Event::new(&ctx).unwrap(), Event::new(&ctx).unwrap());
    bind(&ctx);
    for (thread_mode, thread_mode_name) in [(GLOBAL, "GLOBAL"), (RELAXED, "RELAXED")] {
        let previous = exchange_mode(thread_mode);
        // SAFETY: live handles of the current context.
        unsafe {
            assert_eq!(cuStreamBeginCapture_v2(raw(&x), THREAD_LOCAL), 0);
            assert_eq!(cuEventRecord(ev(&fork), raw(&x)), 0);
            assert_eq!(cuStreamWaitEvent(raw(&s), ev(&fork), 0), 0);
            assert_eq!(memset(&mut buffer, raw(&s), 2), 0);
            let refused = cuStreamSynchronize(raw(&s));
            let query = cuStreamQuery(raw(&s));
            let origin = status_raw(raw(&x));
            let joined = status_raw(raw(&s));
            let join_recorded = cuEventRecord(ev(&join), raw(&s));
            let rejoined = cuStreamWaitEvent(raw(&x), ev(&join), 0);
            let (ended, nodes) = end(raw(&x));
            println!(
                "thread mode {thread_mode_name}: cuStreamSynchronize of the joined stream {}, \
                 cuStreamQuery {}, origin status {origin:?}, joined status {joined:?}, record for \
                 the rejoin {}, rejoin {}, origin's end {} (graph: {nodes:?} nodes), joined stream \
                 then {:?}",
                name(refused),
                name(query),
                name(join_recorded),
                name(rejoined),
                name(ended),
                status_raw(raw(&s)),
            );
            assert_eq!(
                (refused, origin, ended, nodes),
                (
                    CAPTURE_UNSUPPORTED,
                    (0, STATUS_INVALIDATED),
                    CAPTURE_INVALIDATED,
                    None
                ),
                "a wait of a joined stream is refused and invalidates the capture"
            );
            assert_eq!(
                status_raw(raw(&s)),
                (0, STATUS_NONE),
                "the origin's end frees it"
            );
        }
        exchange_mode(previous);
        // SAFETY: a live stream, no longer capturing.
        assert_eq!(unsafe { cuStreamSynchronize(raw(&s)) }, 0);
    }
}

/// The legacy default stream cannot join a capture: what waiting on it for a captured event
/// answers.
#[test]
fn the_legacy_stream_waits_for_a_captured_event() {
    let _serial = serial();
    let Some((_device, ctx)) = common::gpu_or_skip("the_legacy_stream_waits_for_a_captured_event")
    else {
        return;
    };
    let x = Stream::new(&ctx).unwrap();
    let fork = Event::new(&ctx).unwrap();
    bind(&ctx);
    // SAFETY: live handles of the current context; the null stream is the legacy default stream.
    unsafe {
        assert_eq!(cuStreamBeginCapture_v2(raw(&x), THREAD_LOCAL), 0);
        assert_eq!(cuEventRecord(ev(&fork), raw(&x)), 0);
        let waited = cuStreamWaitEvent(ptr::null_mut(), ev(&fork), 0);
        let legacy = status_raw(ptr::null_mut());
        let (ended, nodes) = end(raw(&x));
        println!(
            "legacy stream: cuStreamWaitEvent on a captured event {}, its status then {legacy:?}; \
             the origin's end {} ({nodes:?} nodes)",
            name(waited),
            name(ended)
        );
        assert_eq!(
            waited, CAPTURE_IMPLICIT,
            "the legacy stream joins no capture"
        );
        assert_eq!(cuCtxSynchronize(), 0);
    }
}

/// A capture of this thread's per-thread default stream refuses a wait of the legacy default
/// stream (an implicit dependency); this thread ends that capture itself, and the wait then waits.
#[test]
fn a_per_thread_capture_in_the_way_of_a_legacy_wait() {
    let _serial = serial();
    let Some((_device, ctx)) =
        common::gpu_or_skip("a_per_thread_capture_in_the_way_of_a_legacy_wait")
    else {
        return;
    };
    let mut buffer = DeviceBuffer::<u8>::zeroed(&ctx, 1 << 30).unwrap();
    let other = Stream::new(&ctx).unwrap();
    let done = Event::new(&ctx).unwrap();
    bind(&ctx);
    let per_thread = PER_THREAD as *mut c_void;
    for (mode, mode_name) in [
        (GLOBAL, "GLOBAL"),
        (THREAD_LOCAL, "THREAD_LOCAL"),
        (RELAXED, "RELAXED"),
    ] {
        let previous = exchange_mode(RELAXED);
        // SAFETY: live handles of the current context; the null stream is the legacy default
        // stream, 0x2 this thread's per-thread default stream.
        unsafe {
            assert_eq!(memset(&mut buffer, ptr::null_mut(), 3), 0);
            assert_eq!(cuEventRecord(ev(&done), ptr::null_mut()), 0);
            assert_eq!(cuStreamBeginCapture_v2(per_thread, mode), 0);
            let legacy = cuStreamSynchronize(ptr::null_mut());
            let nonblocking = cuStreamSynchronize(raw(&other));
            let context = cuCtxSynchronize();
            let captured = status_raw(per_thread);
            let (ended, nodes) = end(per_thread);
            let again = cuStreamSynchronize(ptr::null_mut());
            println!(
                "per-thread stream capturing ({mode_name}), this thread RELAXED: legacy wait {}, \
                 a non-blocking stream's wait {}, context wait {}, per-thread status {captured:?}, \
                 its end from this thread {} ({nodes:?} nodes), legacy wait then {}, the legacy \
                 memset then {}",
                name(legacy),
                name(nonblocking),
                name(context),
                name(ended),
                name(again),
                name(cuEventQuery(ev(&done))),
            );
            assert_eq!(
                (legacy, nonblocking, context),
                (CAPTURE_IMPLICIT, 0, CAPTURE_UNSUPPORTED),
                "{mode_name}: the per-thread capture refuses the legacy and the context waits only"
            );
            assert_eq!(
                status_raw(per_thread),
                (0, STATUS_NONE),
                "this thread ended it"
            );
            assert_eq!(again, 0);
        }
        exchange_mode(previous);
    }
}

/// A query of the legacy default stream (`CU_STREAM_LEGACY`) while a blocking stream of the same
/// context captures: refused with `CAPTURE_IMPLICIT` (906), from the capturing thread and from
/// another (in `RELAXED` and in `GLOBAL` mode), in every mode of the capture, and the capture is
/// left as it was (it ends with its graph). A capture of
/// a non-blocking stream is not seen there (`CUDA_SUCCESS`, no capture). The per-thread default
/// stream counts as blocking. What `Comm::register`'s capture check rests on.
#[test]
fn a_legacy_query_sees_the_captures_of_blocking_streams_only() {
    let _serial = serial();
    let Some((_device, ctx)) =
        common::gpu_or_skip("a_legacy_query_sees_the_captures_of_blocking_streams_only")
    else {
        return;
    };
    let mut buffer = DeviceBuffer::<u8>::zeroed(&ctx, 1 << 20).unwrap();
    let nonblocking = Stream::new(&ctx).unwrap();
    bind(&ctx);
    let mut blocking = ptr::null_mut();
    // SAFETY: `blocking` is writable; flags 0 (a blocking stream), destroyed below.
    assert_eq!(unsafe { cuStreamCreate(&raw mut blocking, 0) }, 0);
    let legacy = LEGACY as *mut c_void;
    let streams = [
        (
            "the per-thread default stream",
            PER_THREAD as *mut c_void,
            true,
        ),
        ("a blocking stream", blocking, true),
        ("a non-blocking stream", raw(&nonblocking), false),
    ];
    for (stream_name, stream, seen) in streams {
        for (mode, mode_name) in [
            (GLOBAL, "GLOBAL"),
            (THREAD_LOCAL, "THREAD_LOCAL"),
            (RELAXED, "RELAXED"),
        ] {
            let previous = exchange_mode(mode);
            // SAFETY: live handles of the current context; the capture is ended below.
            assert_eq!(unsafe { cuStreamBeginCapture_v2(stream, mode) }, 0);
            assert_eq!(memset(&mut buffer, stream, 1), 0);
            let here = status_raw(legacy);
            // Another thread asks in RELAXED mode, and then in GLOBAL mode (a thread's default).
            let (elsewhere, elsewhere_global) = std::thread::scope(|t| {
                t.spawn(|| {
                    let previous = exchange_mode(RELAXED);
                    bind(&ctx);
                    let relaxed = status_raw(LEGACY as *mut c_void);
                    exchange_mode(GLOBAL);
                    let global = status_raw(LEGACY as *mut c_void);
                    exchange_mode(previous);
                    (relaxed, global)
                })
                .join()
                .unwrap()
            });
            let still = status_raw(stream);
            let (ended, nodes) = end(stream);
            exchange_mode(previous);
            println!(
                "{stream_name} capturing ({mode_name}): the legacy query from this thread {} \
                 (status {}), from another thread {} (status {}), and there in GLOBAL mode {}; the \
                 capture then {still:?}, its end {} ({nodes:?} nodes)",
                name(here.0),
                here.1,
                name(elsewhere.0),
                elsewhere.1,
                name(elsewhere_global.0),
                name(ended),
            );
            let expected = if seen { CAPTURE_IMPLICIT } else { 0 };
            assert_eq!(
                (here.0, elsewhere.0, elsewhere_global.0),
                (expected, expected, expected),
                "{stream_name}, {mode_name}: the legacy query"
            );
            if !seen {
                assert_eq!(
                    (here.1, elsewhere.1, elsewhere_global.1),
                    (STATUS_NONE, STATUS_NONE, STATUS_NONE)
                );
            }
            assert_eq!(
                still,
                (0, STATUS_ACTIVE),
                "{stream_name}, {mode_name}: left active"
            );
            assert_eq!(
                (ended, nodes),
                (0, Some(1)),
                "{stream_name}, {mode_name}: its graph"
            );
        }
    }
    assert_eq!(status_raw(legacy), (0, STATUS_NONE), "no capture left");
    // SAFETY: the stream made above, idle (its captures ended), destroyed once.
    assert_eq!(unsafe { cuStreamDestroy_v2(blocking) }, 0);
}

/// Another thread's work queued onto a stream that this thread captures in `THREAD_LOCAL` mode is
/// captured (the capture is a state of the stream, not of the thread), and that other thread
/// cannot end the capture.
#[test]
fn work_of_another_thread_on_a_capturing_stream() {
    let _serial = serial();
    let Some((_device, ctx)) = common::gpu_or_skip("work_of_another_thread_on_a_capturing_stream")
    else {
        return;
    };
    let mut buffer = DeviceBuffer::<u8>::zeroed(&ctx, 1 << 20).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let (begun, queued) = (Barrier::new(2), Barrier::new(2));
    let target = raw(&stream) as usize;
    std::thread::scope(|t| {
        t.spawn(|| {
            bind(&ctx);
            // SAFETY: a live stream of the current context.
            let code = unsafe { cuStreamBeginCapture_v2(target as *mut c_void, THREAD_LOCAL) };
            assert_eq!(code, 0);
            begun.wait();
            queued.wait();
            let (ended, nodes) = end(target as *mut c_void);
            println!(
                "capturing thread: its end {} with {nodes:?} nodes (the other thread's memset among \
                 them)",
                name(ended)
            );
            let _ = nodes;
        });
        begun.wait();
        bind(&ctx);
        let previous = exchange_mode(RELAXED);
        let code = memset(&mut buffer, target as *mut c_void, 4);
        let (mut status, mut id) = (99u32, 0u64);
        // SAFETY: a live stream; the optional outputs are null.
        let info = unsafe {
            cuStreamGetCaptureInfo_v2(
                target as *mut c_void,
                &raw mut status,
                &raw mut id,
                ptr::null_mut(),
                ptr::null_mut(),
                ptr::null_mut(),
            )
        };
        let (ended, nodes) = end(target as *mut c_void);
        // SAFETY: a live stream.
        let waited = unsafe { cuStreamSynchronize(target as *mut c_void) };
        println!(
            "other thread: memset {}, capture info {} (status {status}, id {id}), its end of the \
             capture {} ({nodes:?}), its wait {}",
            name(code),
            name(info),
            name(ended),
            name(waited)
        );
        exchange_mode(previous);
        queued.wait();
        assert_eq!(
            (code, info, status),
            (0, 0, STATUS_ACTIVE),
            "the memset was captured"
        );
        assert_eq!(
            ended, CAPTURE_WRONG_THREAD,
            "only the capturing thread ends it"
        );
    });
    bind(&ctx);
    // SAFETY: a live stream, no longer capturing.
    assert_eq!(unsafe { cuStreamSynchronize(raw(&stream)) }, 0);
}

/// What the checks of the crate's seams cost, per call, on an idle stream: a capture check, a
/// capture info query, an event record and query, a stream query, a context wait. Printed (the
/// bench holds the claims); each call must succeed.
#[test]
fn what_the_checks_cost() {
    const N: u32 = 20_000;
    let _serial = serial();
    let Some((_device, ctx)) = common::gpu_or_skip("what_the_checks_cost") else {
        return;
    };
    let stream = Stream::new(&ctx).unwrap();
    let event = Event::new(&ctx).unwrap();
    bind(&ctx);
    let (s, e) = (raw(&stream), ev(&event));
    let time = |what: &str, f: &dyn Fn() -> u32| {
        for _ in 0..1000 {
            assert_eq!(f(), 0, "{what}");
        }
        let start = Instant::now();
        for _ in 0..N {
            f();
        }
        let ns = start.elapsed().as_secs_f64() * 1e9 / f64::from(N);
        println!("{what}: {ns:.1} ns per call");
    };
    time("cuStreamIsCapturing", &|| {
        let mut status = 0;
        // SAFETY: a live stream of the current context; `status` is writable.
        unsafe { cuStreamIsCapturing(s, &raw mut status) }
    });
    time("cuStreamGetCaptureInfo_v2 (status and id)", &|| {
        let (mut status, mut id) = (0u32, 0u64);
        // SAFETY: as above; the optional outputs are null.
        unsafe {
            cuStreamGetCaptureInfo_v2(
                s,
                &raw mut status,
                &raw mut id,
                ptr::null_mut(),
                ptr::null_mut(),
                ptr::null_mut(),
            )
        }
    });
    // SAFETY: a live event and stream of the current context.
    time("cuEventRecord", &|| unsafe { cuEventRecord(e, s) });
    // SAFETY: a live event of the current context.
    time("cuEventQuery", &|| unsafe { cuEventQuery(e) });
    // SAFETY: a live stream of the current context.
    time("cuStreamQuery", &|| unsafe { cuStreamQuery(s) });
    // SAFETY: a live stream of the current context.
    time("cuStreamSynchronize (idle)", &|| unsafe {
        cuStreamSynchronize(s)
    });
    // SAFETY: no arguments; a context is current.
    time("cuCtxSynchronize (idle)", &|| unsafe { cuCtxSynchronize() });
    time("cuThreadExchangeStreamCaptureMode (twice)", &|| {
        let mut mode = RELAXED;
        // SAFETY: `mode` is readable and writable; the mode is given back by the second call.
        unsafe {
            cuThreadExchangeStreamCaptureMode(&raw mut mode)
                | cuThreadExchangeStreamCaptureMode(&raw mut mode)
        }
    });
}

/// NCCL's group state is the calling thread's: a group begun by any binding of the same library
/// (cudarc's `group_start`, say) defers this crate's collectives too. What a lone `ncclGroupEnd`
/// answers outside a group and inside one, and what it costs: the probe the crate's collectives
/// make before NCCL is called.
#[cfg(feature = "nccl")]
#[test]
fn a_lone_group_end_tells_whether_a_group_is_open() {
    use core::ffi::c_int;
    let _serial = serial();
    // SAFETY: NCCL's runtime library, whose initialisers are sound to run.
    let library = match unsafe { libloading::Library::new("libnccl.so.2") } {
        Ok(library) => library,
        Err(e) => {
            common::skip(&format!(
                "SKIPPED a_lone_group_end_tells_whether_a_group_is_open: no libnccl.so.2 ({e})"
            ));
            return;
        }
    };
    // SAFETY: the symbols' C signatures, `ncclResult_t` read as `c_int`.
    let (start, end) = unsafe {
        (
            *library
                .get::<unsafe extern "C" fn() -> c_int>(b"ncclGroupStart\0")
                .unwrap(),
            *library
                .get::<unsafe extern "C" fn() -> c_int>(b"ncclGroupEnd\0")
                .unwrap(),
        )
    };
    // SAFETY: group calls with no arguments; every group begun here is ended here.
    unsafe {
        let outside = end();
        assert_eq!(start(), 0);
        let inside = end();
        let after = end();
        assert_eq!(start(), 0);
        assert_eq!(start(), 0);
        let nested = end();
        let outer = end();
        println!(
            "lone ncclGroupEnd: outside a group {outside}, inside one {inside}, after it {after}; \
             in a nested group {nested}, then the outer end {outer}"
        );
        assert_eq!((inside, nested, outer), (0, 0, 0));
        assert_ne!(outside, 0);
        let begin = Instant::now();
        for _ in 0..100_000 {
            end();
        }
        println!(
            "lone ncclGroupEnd outside a group: {:.1} ns per call",
            begin.elapsed().as_secs_f64() * 1e4
        );
    }
}
