//! The seams where other code queues work on a stream the crate lends memory to, each driven from
//! safe code: another thread capturing graphs beside scopes, cudarc's event tracking pulling a
//! lent stream into a capture, this thread's per-thread stream capturing in a legacy wait's way,
//! and two contexts' legacy streams (which share the null handle). Each test shows that when a
//! scope returns, the work it lent memory to has finished or never existed, and that no graph
//! alive after the scope holds a lent address. The NCCL seams (a group begun outside the crate,
//! registration under capture) are in `tests/nccl.rs`; the capture of a stream a scope holds does
//! not compile (`ui-tests/stream/capture_on_stream_a_scope_holds`).
//!
//! Every test skips visibly without a GPU, or with fewer than it needs. The tests take one lock: a
//! capture of one test must not meet the calls of another.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use common::gpu_or_skip;
use cuda_vmm::stream::Graph;
use cuda_vmm::{Granularity, ReadWrite, Stream, VirtualBuffer, allocation_granularity};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The program, as far as it compiles now: thread B captures graph after graph (each
/// spinning 0–8 µs inside its capture, the last 256 kept), while thread A runs scope after scope,
/// each a memset of a 2 MiB page checked on the host afterwards. At 07952f7 both used one stream,
/// and the process died with SIGSEGV inside `cuMemsetD8Async` while B instantiated its graph (A's
/// memset was recorded into B's capture); now `Graph::capture` takes its stream by `&mut`, so B
/// captures on a stream of its own (sharing A's does not compile). For 3 s: every scope's memset
/// has run when the scope returns, and every capture succeeds.
#[test]
fn captures_beside_scopes_on_other_threads() {
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("captures_beside_scopes_on_other_threads") else {
        return;
    };
    let page = allocation_granularity(device, Granularity::Minimum).unwrap();
    let mut buffer = VirtualBuffer::new(page, &[device], ReadWrite).unwrap();
    buffer.grow(device, page).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let mut capturing = Stream::new(&ctx).unwrap();
    let stop = AtomicBool::new(false);
    let zeros = vec![0u8; page];
    let (mut scopes, mut unrun) = (0u64, 0u64);
    let (captures, failed) = std::thread::scope(|t| {
        let capturer = t.spawn(|| {
            let mut graphs = std::collections::VecDeque::new();
            let (mut n, mut failed) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let spin = Duration::from_nanos(n * 7919 % 8000);
                match Graph::capture(&mut capturing, |_| {
                    let s = Instant::now();
                    while s.elapsed() < spin {}
                    Ok(())
                }) {
                    Ok(g) => {
                        graphs.push_back(g);
                        if graphs.len() > 256 {
                            graphs.pop_front();
                        }
                    }
                    Err(_) => failed += 1,
                }
            }
            (n, failed)
        });
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(3) {
            let mut view = buffer.slice_bytes_mut::<u8>(..page).unwrap();
            view.copy_from_host(&zeros).unwrap();
            cuda_vmm::scope(|s| s.on(&stream).memset(&mut view, 0xab).map(drop)).unwrap();
            scopes += 1;
            if view.to_vec().unwrap().iter().any(|&b| b != 0xab) {
                unrun += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        capturer.join().unwrap()
    });
    println!(
        "{scopes} scopes ({unrun} returned with their memset not run) beside {captures} captures \
         ({failed} failed) on another thread"
    );
    assert!(scopes > 100 && captures > 100, "both threads ran");
    assert_eq!(unrun, 0, "a scope returned before its memset had run");
    assert_eq!(failed, 0, "a capture failed beside the scopes");
}

/// A capture of this thread's per-thread default stream, begun inside a scope on the legacy
/// default stream, stands in the scope's wait's way (the legacy wait is an implicit dependency on
/// it, 906). At 07952f7 the wait polled for 10 s and aborted the process (measured: abort after
/// 10.15 s); now the wait ends that capture (this thread began it) and returns
/// `Error::StreamCapturing` once the memset has run, at once.
#[cfg(feature = "cudarc")]
#[test]
fn a_per_thread_capture_in_a_legacy_scopes_way_is_ended() {
    use cudarc::driver::{CudaContext, sys::CUstreamCaptureMode, sys::CUstreamCaptureStatus};
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("a_per_thread_capture_in_a_legacy_scopes_way_is_ended")
    else {
        return;
    };
    let cudarc = CudaContext::new(device.ordinal()).unwrap();
    let page = allocation_granularity(device, Granularity::Minimum).unwrap();
    let mut buffer = VirtualBuffer::new(page, &[device], ReadWrite).unwrap();
    buffer.grow(device, page).unwrap();
    let mut view = buffer.slice_bytes_mut::<u8>(..page).unwrap();
    view.copy_from_host(&vec![0u8; page]).unwrap();
    let legacy = Stream::legacy_default(&ctx).unwrap();
    let per_thread = cudarc.per_thread_stream();
    for mode in [
        CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
    ] {
        let start = Instant::now();
        let result = cuda_vmm::scope(|s| {
            s.on(&legacy).memset(&mut view, 0x5a)?;
            per_thread.begin_capture(mode).unwrap();
            Ok(())
        });
        let took = start.elapsed();
        println!("{mode:?}: the scope returned {result:?} after {took:?}");
        assert!(
            matches!(result, Err(cuda_vmm::Error::StreamCapturing { .. })),
            "{mode:?}: {result:?}"
        );
        assert!(took < Duration::from_secs(2), "{mode:?}: the wait polled");
        assert!(
            matches!(
                per_thread.capture_status(),
                Ok(CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
            ),
            "{mode:?}: the per-thread capture was ended"
        );
        assert!(
            view.to_vec().unwrap().iter().all(|&b| b == 0x5a),
            "{mode:?}: the memset ran before the scope returned"
        );
        view.copy_from_host(&vec![0u8; page]).unwrap();
    }
}

/// cudarc's event tracking pulls a lent stream into a capture: `memcpy_dtod(&lent, &mut slice)`
/// takes the view's address (the stream is not capturing then), and then makes the stream wait
/// for the slice's last write, recorded inside a capture of another stream, which joins the stream
/// to that capture: the copy is captured, not run. Here the closure goes on with another copy from
/// the lent view: the scope's probe event, recorded right after the first copy, is found captured,
/// and the query invalidates the capture, so its end makes no graph, and the scope returns
/// `Error::StreamCapturing` with nothing of the lent view in any graph. At 07952f7 the capture
/// ended with a graph that read the lent address after the scope
/// (`a_pulled_capture_that_ends_in_the_scope_aborts`). The slice is made inside the capture, so
/// that its events were recorded there: one whose events were recorded before the capture would
/// invalidate it at its first wait (an event from outside a capture), which is what the issue saw
/// on one GPU.
#[cfg(feature = "cudarc")]
#[test]
fn a_lent_stream_pulled_into_a_capture_is_refused() {
    use cudarc::driver::{CudaContext, sys};
    let _serial = serial();
    let Some((device, _ctx)) = gpu_or_skip("a_lent_stream_pulled_into_a_capture_is_refused") else {
        return;
    };
    let cudarc = CudaContext::new(device.ordinal()).unwrap();
    let (x, s) = (cudarc.new_stream().unwrap(), cudarc.new_stream().unwrap());
    let page = allocation_granularity(device, Granularity::Minimum).unwrap();
    let mut buffer = VirtualBuffer::new(page, &[device], ReadWrite).unwrap();
    buffer.grow(device, page).unwrap();
    let n = page / 4;
    let a: Vec<u32> = (0..u32::try_from(n).unwrap()).collect();
    buffer
        .slice_bytes_mut::<u32>(..page)
        .unwrap()
        .copy_from_host(&a)
        .unwrap();
    let view = buffer.slice_bytes::<u32>(..page).unwrap();
    let mut host = vec![0u32; n];
    x.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    // Made inside the capture, so its write event is recorded inside it (a slice whose events were
    // recorded before would invalidate the capture at its first wait: an event from outside).
    let mut dst = x.alloc_zeros::<u32>(n).unwrap();
    let mut ended = None;
    let result = cuda_vmm::interop::cudarc::scope(&s, |sc| -> Result<(), cuda_vmm::Error> {
        let lent = sc.lend(view)?;
        let pulled = s.memcpy_dtod(&lent, &mut dst);
        let second = s.memcpy_dtoh(&lent, &mut host);
        let joined = x.join(&s);
        ended = Some(x.end_capture(sys::CUgraphInstantiate_flags(0)));
        println!(
            "the pulled copy {pulled:?}, the next copy {second:?}, the rejoin {joined:?}, the \
             capture's end {:?}",
            ended.as_ref().map(|e| e.as_ref().map(Option::is_some))
        );
        Ok(())
    });
    println!("the scope returned {result:?}");
    assert!(
        matches!(result, Err(cuda_vmm::Error::StreamCapturing { .. })),
        "{result:?}"
    );
    assert!(
        matches!(ended, Some(Err(_) | Ok(None))),
        "the capture's end made no graph"
    );
    s.synchronize().unwrap();
    // The lent bytes are as they were (the refused copy read never-mapped addresses, if anything).
    assert_eq!(view.to_vec().unwrap(), a);
    drop(dst); // memory of the invalidated capture's allocation node: cudarc records the error
}

#[cfg(feature = "cudarc")]
const CHILD: &str = "CUDA_VMM_SEAMS_CHILD";

/// As [`a_lent_stream_pulled_into_a_capture_is_refused`], but the closure rejoins and ends the
/// capture right after the pulled copy, with no lend in between: the capture ends with a graph
/// that holds the lent address. At 07952f7 the scope returned `Ok` and a replay of the graph after
/// the scope read the view's memory (measured). Nothing sound is left once that graph exists: the
/// scope's end finds its probe event recorded inside an ended capture and aborts the process,
/// with a line on stderr. Run in a child process, which must die that way.
#[cfg(feature = "cudarc")]
#[test]
fn a_pulled_capture_that_ends_in_the_scope_aborts() {
    use cudarc::driver::{CudaContext, sys};
    let _serial = serial();
    if std::env::var_os(CHILD).is_some() {
        let Some((device, _ctx)) = gpu_or_skip("child") else {
            return;
        };
        let cudarc = CudaContext::new(device.ordinal()).unwrap();
        let (x, s) = (cudarc.new_stream().unwrap(), cudarc.new_stream().unwrap());
        let page = allocation_granularity(device, Granularity::Minimum).unwrap();
        let buffer = VirtualBuffer::new(page, &[device], ReadWrite).unwrap();
        buffer.grow(device, page).unwrap();
        let view = buffer.slice_bytes::<u32>(..page).unwrap();
        x.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .unwrap();
        let mut dst = x.alloc_zeros::<u32>(page / 4).unwrap(); // its events recorded inside
        let mut graph = None;
        let result = cuda_vmm::interop::cudarc::scope(&s, |sc| -> Result<(), cuda_vmm::Error> {
            let lent = sc.lend(view)?;
            s.memcpy_dtod(&lent, &mut dst).unwrap();
            x.join(&s).unwrap();
            graph = x.end_capture(sys::CUgraphInstantiate_flags(0)).unwrap();
            println!("child: the capture ended with a graph: {}", graph.is_some());
            Ok(())
        });
        println!("child: the scope returned {result:?}");
        return;
    }
    let Some(_) = gpu_or_skip("a_pulled_capture_that_ends_in_the_scope_aborts") else {
        return;
    };
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_pulled_capture_that_ends_in_the_scope_aborts",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    println!(
        "child: {:?}; stdout: {}; stderr: {}",
        out.status,
        stdout
            .lines()
            .filter(|l| l.starts_with("child"))
            .collect::<Vec<_>>()
            .join(" | "),
        stderr
            .lines()
            .filter(|l| l.starts_with("cuda-vmm"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    assert!(
        stdout.contains("child: the capture ended with a graph: true"),
        "the capture made its graph"
    );
    assert!(
        !stdout.contains("child: the scope returned"),
        "the scope returned while a graph held its lent address"
    );
    assert!(
        stderr.contains(
            "cuda-vmm: aborting: a cudarc operation on a view lent to a scope was captured"
        ),
        "the process aborted with the crate's line"
    );
    assert!(!out.status.success());
}

/// Two contexts' legacy default streams share the null handle. A scope on GPU 1's legacy stream
/// lends a scoped buffer (its retires record their events on that stream); a cudarc scope on
/// GPU 0's legacy stream asks for a view of it. At 07952f7 the view was admitted (the null handle
/// was registered), and a retire would have released its page under GPU 0's copy; now streams
/// are told apart by context and handle, and the lend is refused (`Error::StreamRefused`). A
/// rewritable slot written on GPU 1's legacy stream is refused on GPU 0's likewise. Needs two GPUs:
/// the crate works in primary contexts only, one per device, so one GPU has one legacy stream (the
/// identity itself is unit-tested in `src/stream/lend.rs`).
#[cfg(feature = "cudarc")]
#[test]
fn two_contexts_legacy_streams_are_two_streams() {
    use cuda_vmm::interop::cudarc::scope as cudarc_scope;
    use cudarc::driver::CudaContext;
    let _serial = serial();
    let Some(gpus) = common::gpus_or_skip("two_contexts_legacy_streams_are_two_streams", 2) else {
        return;
    };
    let ((d0, ctx0), (d1, ctx1)) = (gpus[0].clone(), gpus[1].clone());
    let page = allocation_granularity(d1, Granularity::Minimum).unwrap();
    let mut buffer = VirtualBuffer::new(4 * page, &[d0, d1], ReadWrite).unwrap();
    buffer.grow(d1, 2 * page).unwrap();
    let (legacy0, legacy1) = (
        Stream::legacy_default(&ctx0).unwrap(),
        Stream::legacy_default(&ctx1).unwrap(),
    );
    let cudarc0 = CudaContext::new(d0.ordinal()).unwrap().default_stream();
    cuda_vmm::scope(|s| {
        let on1 = s.on(&legacy1);
        let kv = buffer.in_scope(s);
        let read = kv.read::<u32>(..page)?;
        let lent = cudarc_scope(&cudarc0, |c| c.lend(read).map(drop));
        println!("a view lent to GPU 0's legacy stream: {lent:?}");
        assert!(
            matches!(lent, Err(cuda_vmm::Error::StreamRefused { .. })),
            "{lent:?}"
        );
        let on0 = s.on(&legacy0);
        let mut slot = kv.write::<u32>(page..2 * page)?;
        on1.memset(&mut slot, 1)?;
        let refused = on0.memset(&mut slot, 2);
        println!("a slot written on GPU 1's legacy stream, then on GPU 0's: {refused:?}");
        assert!(matches!(
            refused,
            Err(cuda_vmm::Error::StreamRefused { .. })
        ));
        Ok(())
    })
    .unwrap();
    let _ = ctx1;
}
