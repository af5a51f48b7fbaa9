//! NCCL on VMM memory against a real driver and a real NCCL (feature `nccl`): a single-rank
//! communicator all-reducing memory registered and not, the four collectives, registration and
//! window registration with their refusals, registrations dropped before and after the buffer's
//! other users, 10 000 register/deregister rounds that leak nothing, a window over a
//! `VirtualBuffer` range, a scope past its timeout aborting its communicator (which then refuses
//! every call), non-blocking communicators (a single rank all-reducing, registering, grouping and
//! tearing down to the byte of free memory, a creation whose peer never joins ending at its
//! timeout, two ranks in one thread and in two), two ranks (one process driving two GPUs, two
//! processes meeting through a unique id passed over a pipe, and a peer that never joins an
//! all-reduce), point-to-point transfers (a rank's send to itself in a group with an all-reduce,
//! its refusals, and two ranks swapping blocks), and suspend and resume (or their refusal where
//! NCCL is older than 2.29.7). Every test skips visibly without a GPU, with too few GPUs, or where NCCL cannot be
//! loaded.
//!
//! No test harness (`harness = false` in Cargo.toml): `main` sets `NCCL_NVLS_ENABLE=0` before any
//! thread starts and before NCCL reads its environment (`NVLink` SHARP would create multicast
//! objects, which these machines must not), then runs the tests one after another. Run as
//! `cargo test --features nccl --test nccl`; the child rank of the two-process test is this binary
//! again, started with `CUDA_VMM_NCCL_CHILD=1`.

#![cfg(feature = "nccl")]
// The test data are small integers, exact in `f32`: the casts and the exact comparisons are too.
#![allow(clippy::cast_precision_loss, clippy::float_cmp)]

mod common;

use std::error::Error as StdError;
use std::io::Write as _;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{devices_or_skip, pattern, skip};
use cuda_vmm::interop::nccl::{self, Comm, CommOptions, ReduceOp, UniqueId, group};
use cuda_vmm::owned::{GrantedMapping, PageOptions, SharedReservation};
use cuda_vmm::vmm::{AllocationOptions, HandleKinds};
use cuda_vmm::{
    Context, Device, Error, Granularity, PhysicalAllocation, ReadWrite, VirtualBuffer,
    allocation_granularity,
};
use cudarc::driver::{CudaContext, CudaStream};

type TestResult<T = ()> = Result<T, Box<dyn StdError>>;
type Test = (&'static str, fn() -> TestResult);

const CHILD: &str = "CUDA_VMM_NCCL_CHILD";

/// The register/deregister rounds of the leak test.
const ROUNDS: u64 = 10_000;

/// The device of each of the first `needed` GPUs with a new cudarc stream, or `None` after printing
/// why the test is skipped (no GPU, too few, or no NCCL).
fn gpus_and_nccl_or_skip(test: &str, needed: usize) -> Option<Vec<(Device, Arc<CudaStream>)>> {
    let devices = devices_or_skip(test, needed)?;
    if let Err(e) = nccl::version() {
        skip(&format!("SKIPPED {test}: NCCL cannot be loaded ({e})"));
        return None;
    }
    Some(
        devices
            .into_iter()
            .take(needed)
            .map(|d| {
                let ctx = CudaContext::new(d.ordinal()).expect("cudarc retains the context");
                (d, ctx.new_stream().expect("cudarc makes a stream"))
            })
            .collect(),
    )
}

fn one_rank(test: &str) -> Option<(Device, Comm)> {
    let (device, stream) = gpus_and_nccl_or_skip(test, 1)?.remove(0);
    let comm = Comm::from_devices(&[stream])
        .expect("a single-rank communicator")
        .remove(0);
    Some((device, comm))
}

/// As [`one_rank`], on a device whose memory exports as POSIX file descriptors (what windows
/// need); skips visibly otherwise.
fn one_rank_with_posix_fd(test: &str) -> Result<Option<(Device, Comm)>, Error> {
    let Some((device, comm)) = one_rank(test) else {
        return Ok(None);
    };
    if !device.supports_posix_fd_handles()? {
        skip(&format!(
            "SKIPPED {test}: the device has no POSIX-fd handles"
        ));
        return Ok(None);
    }
    Ok(Some((device, comm)))
}

fn page(device: Device) -> usize {
    allocation_granularity(device, Granularity::Minimum).expect("the granularity")
}

/// A buffer of 1 GiB of address space on `device` alone, grown by one page of each size in `pages`.
fn grown(device: Device, pages: &[usize]) -> TestResult<VirtualBuffer> {
    let buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    for &size in pages {
        buffer.grow(device, size)?;
    }
    Ok(buffer)
}

fn floats(n: usize, seed: u32) -> Vec<f32> {
    pattern(n, seed)
        .into_iter()
        .map(|x| (x % 1000) as f32)
        .collect()
}

/// Needs no GPU: NCCL loads, or every call says why not.
#[allow(clippy::unnecessary_wraps)] // the signature of every test
fn nccl_loads_or_says_why() -> TestResult {
    match nccl::version() {
        Ok(version) => assert!(version >= 21_900, "NCCL {version}: registration needs 2.19"),
        Err(e) => {
            assert!(matches!(e, Error::NcclUnavailable { .. }), "{e:?}");
            assert!(matches!(
                UniqueId::new(),
                Err(Error::NcclUnavailable { .. })
            ));
            skip(&format!("SKIPPED nccl_loads_or_says_why (NCCL part): {e}"));
        }
    }
    Ok(())
}

/// A single-rank all-reduce of `input` from `buffer`'s first page into its second, neither
/// registered (the second zeroed first): one rank's sum is its input.
fn all_reduce_unregistered(
    test: &str,
    comm: &Comm,
    buffer: &mut VirtualBuffer,
    page: usize,
    input: &[f32],
) -> TestResult {
    let view = buffer.slice_bytes_mut::<f32>(..2 * page)?;
    let (mut send, mut recv) = view.split_at_mut(input.len())?;
    send.copy_from_host(input)?;
    recv.copy_from_host(&vec![0.0; input.len()])?;
    comm.scope(|s| -> Result<(), Error> {
        let send = s.lend(&send)?;
        let mut recv = s.lend_mut(&mut recv)?;
        s.all_reduce(&send, &mut recv, ReduceOp::Sum)
    })?;
    assert_eq!(
        recv.to_vec()?,
        input,
        "{test}: one rank's sum is its input (not registered)"
    );
    Ok(())
}

fn single_rank_all_reduce_registered_and_not() -> TestResult {
    let test = "single_rank_all_reduce_registered_and_not";
    let Some((device, comm)) = one_rank(test) else {
        return Ok(());
    };
    let page = page(device);
    let mut buffer = grown(device, &[page, page])?;
    let n = page / 4;
    let input = floats(n, 7);
    // Not registered: first page into the second.
    all_reduce_unregistered(test, &comm, &mut buffer, page, &input)?;
    // Registered: the same, then in place.
    let mut registration = comm.register(&mut buffer, ..2 * page)?;
    {
        let view = registration.slice_bytes_mut::<f32>(..2 * page)?;
        let (send, mut recv) = view.split_at_mut(n)?;
        recv.copy_from_host(&vec![0.0; n])?;
        comm.scope(|s| -> Result<(), Error> {
            let send = s.lend(&send)?;
            let mut recv = s.lend_mut(&mut recv)?;
            s.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
            s.all_reduce_in_place(&mut recv, ReduceOp::Max)
        })?;
        assert_eq!(recv.to_vec()?, input, "{test}: registered");
    }
    drop(registration);
    assert_eq!(comm.registration_stats().registered, 1);
    assert_eq!(comm.registration_stats().deregistered, 1);
    Ok(())
}

fn all_four_collectives_on_one_rank() -> TestResult {
    let test = "all_four_collectives_on_one_rank";
    let Some((device, comm)) = one_rank(test) else {
        return Ok(());
    };
    let page = page(device);
    let mut buffer = grown(device, &[page])?;
    let n = page / 8;
    let input = floats(n, 11);
    let view = buffer.slice_bytes_mut::<f32>(..page)?;
    let (mut send, mut recv) = view.split_at_mut(n)?;
    send.copy_from_host(&input)?;
    for which in [
        "broadcast",
        "all_gather",
        "reduce_scatter",
        "broadcast_in_place",
    ] {
        recv.copy_from_host(&vec![-1.0; n])?;
        if which == "broadcast_in_place" {
            recv.copy_from_host(&input)?;
        }
        comm.scope(|s| -> Result<(), Error> {
            let send = s.lend(&send)?;
            let mut recv = s.lend_mut(&mut recv)?;
            match which {
                "broadcast" => s.broadcast(Some(&send), &mut recv, 0),
                "all_gather" => s.all_gather(&send, &mut recv),
                "reduce_scatter" => s.reduce_scatter(&send, &mut recv, ReduceOp::Sum),
                _ => s.broadcast_in_place(&mut recv, 0),
            }
        })?;
        assert_eq!(recv.to_vec()?, input, "{test}: {which}");
    }
    // The refusals, before NCCL is called.
    comm.scope(|s| -> Result<(), Error> {
        let short = send.as_slice().slice(..n - 1)?;
        let short = s.lend(short)?;
        let mut recv = s.lend_mut(&mut recv)?;
        let mismatch = s.all_reduce(&short, &mut recv, ReduceOp::Sum);
        assert!(
            matches!(mismatch, Err(Error::LengthMismatch { .. })),
            "{mismatch:?}"
        );
        let no_root_data = s.broadcast(None, &mut recv, 0);
        assert!(
            matches!(no_root_data, Err(Error::NcclRefused { .. })),
            "{no_root_data:?}"
        );
        let root = s.broadcast_in_place(&mut recv, 1);
        assert!(matches!(root, Err(Error::OutOfBounds { .. })), "{root:?}");
        Ok(())
    })?;
    Ok(())
}

fn registration_refusals() -> TestResult {
    let test = "registration_refusals";
    let Some((device, comm)) = one_rank(test) else {
        return Ok(());
    };
    let page = page(device);
    let mut buffer = grown(device, &[page])?;
    let unmapped = comm.register(&mut buffer, ..2 * page).map(drop);
    assert!(
        matches!(unmapped, Err(Error::PageRange { .. })),
        "{unmapped:?}"
    );
    let empty = comm.register(&mut buffer, 0..0).map(drop);
    assert!(matches!(empty, Err(Error::ZeroSize { .. })), "{empty:?}");
    let in_group = group(|| comm.register(&mut buffer, ..page).map(drop));
    assert!(
        matches!(in_group, Err(Error::NcclRefused { .. })),
        "{in_group:?}"
    );
    let scope_in_group = group(|| comm.scope(|_| Ok::<(), Error>(())));
    assert!(
        matches!(scope_in_group, Err(Error::StreamRefused { .. })),
        "{scope_in_group:?}"
    );
    assert_eq!(comm.registration_stats().registered, 0);
    Ok(())
}

fn exportable_mapping(
    device: Device,
    size: usize,
    kinds: HandleKinds,
) -> TestResult<GrantedMapping> {
    let reservation = SharedReservation::new(size, 0)?;
    let memory = PhysicalAllocation::with_options(
        size,
        AllocationOptions::device(device).with_handle_kinds(kinds),
    )?;
    Ok(reservation
        .map(0, memory)?
        .keep_grant(&[device], ReadWrite)?)
}

fn window_registration() -> TestResult {
    let test = "window_registration";
    let Some((device, mut comm)) = one_rank_with_posix_fd(test)? else {
        return Ok(());
    };
    let page = page(device);
    let mut private = exportable_mapping(device, page, HandleKinds::NONE)?;
    let refused = comm.register_window(&mut private, ..).map(drop);
    assert!(
        matches!(refused, Err(Error::NcclRefused { why, .. }) if why.contains("POSIX")),
        "{refused:?}"
    );
    let mut memory = exportable_mapping(device, page, HandleKinds::POSIX_FD)?;
    let misaligned = comm.register_window(&mut memory, 100..page).map(drop);
    assert!(
        matches!(
            misaligned,
            Err(Error::NotAligned {
                granularity: 4096,
                ..
            })
        ),
        "{misaligned:?}"
    );
    let mut window = match comm.register_window(&mut memory, ..) {
        Err(e @ Error::NcclUnavailable { .. }) => {
            skip(&format!("SKIPPED {test} (window part): {e}"));
            return Ok(());
        }
        other => other?,
    };
    let n = page / 4;
    let input = floats(n, 3);
    let mut view = window.slice_mut::<f32>()?;
    view.copy_from_host(&input)?;
    comm.scope(|s| -> Result<(), Error> {
        s.all_reduce_in_place(&mut s.lend_mut(&mut view)?, ReduceOp::Sum)
    })?;
    assert_eq!(view.to_vec()?, input, "{test}: all-reduce in a window");
    window.deregister()?;
    // The same bytes again, once the first window is gone.
    let again = comm.register_window(&mut memory, ..4096)?;
    drop(again);
    Ok(())
}

fn registration_dropped_before_and_after_other_users() -> TestResult {
    let test = "registration_dropped_before_and_after_other_users";
    let Some((device, comm)) = one_rank(test) else {
        return Ok(());
    };
    let page = page(device);
    let mut buffer = grown(device, &[page])?;
    let n = page / 4;
    let input = floats(n, 5);
    // Dropped after its users: a view lent in a scope, and a growth through the registration.
    let mut registration = comm.register(&mut buffer, ..page)?;
    registration.buffer().grow(device, page)?;
    let mut view = registration.slice_bytes_mut::<f32>(..page)?;
    view.copy_from_host(&input)?;
    comm.scope(|s| -> Result<(), Error> {
        s.all_reduce_in_place(&mut s.lend_mut(&mut view)?, ReduceOp::Sum)
    })?;
    assert_eq!(view.to_vec()?, input);
    registration.deregister()?;
    // Dropped before them: the buffer's views, a shrink and an unmap come after it.
    let registration = comm.register(&mut buffer, ..2 * page)?;
    drop(registration);
    assert_eq!(buffer.slice_bytes::<f32>(..page)?.to_vec()?, input);
    buffer.shrink()?;
    buffer.unmap(..)?;
    assert_eq!(buffer.mapped_bytes(), 0);
    let stats = comm.registration_stats();
    assert_eq!((stats.registered, stats.deregistered), (2, 2));
    Ok(())
}

fn ten_thousand_registrations_leak_nothing() -> TestResult {
    let test = "ten_thousand_registrations_leak_nothing";
    let Some((device, comm)) = one_rank(test) else {
        return Ok(());
    };
    let context = Context::new(device)?;
    let page = page(device);
    let mut buffer = grown(device, &[4 * page])?;
    // One round first: NCCL sets up its registration cache once.
    drop(comm.register(&mut buffer, 0..4 * page)?);
    let (before, _) = context.memory_info()?;
    for round in 0..ROUNDS {
        let bytes = match round % 3 {
            0 => 0..4 * page,
            1 => page..2 * page,
            _ => 0..page,
        };
        drop(comm.register(&mut buffer, bytes)?);
    }
    let (after, _) = context.memory_info()?;
    assert_eq!(
        after, before,
        "{test}: device free memory after {ROUNDS} rounds"
    );
    let stats = comm.registration_stats();
    assert_eq!(stats.registered, ROUNDS + 1);
    assert_eq!(
        stats.deregistered, stats.registered,
        "{test}: one deregister per register"
    );
    Ok(())
}

fn window_over_a_virtual_buffer() -> TestResult {
    let test = "window_over_a_virtual_buffer";
    let Some((device, mut comm)) = one_rank_with_posix_fd(test)? else {
        return Ok(());
    };
    let page = page(device);
    // Refused before NCCL: pages made without a POSIX-fd handle, a hole, a misaligned start.
    let mut private = grown(device, &[page])?;
    let refused = comm.register_window(&mut private, ..page).map(drop);
    assert!(
        matches!(refused, Err(Error::NcclRefused { why, .. }) if why.contains("POSIX")),
        "{test}: {refused:?}"
    );
    let mut buffer =
        VirtualBuffer::with_options(1 << 30, &[device], ReadWrite, PageOptions::posix_fd())?;
    buffer.grow(device, page)?;
    buffer.grow(device, page)?;
    let hole = comm.register_window(&mut buffer, ..3 * page).map(drop);
    assert!(
        matches!(hole, Err(Error::PageRange { .. })),
        "{test}: a range past the mapped pages: {hole:?}"
    );
    let misaligned = comm.register_window(&mut buffer, 100..page).map(drop);
    assert!(
        matches!(
            misaligned,
            Err(Error::NotAligned {
                granularity: 4096,
                ..
            })
        ),
        "{test}: {misaligned:?}"
    );
    // Two pages, one window: an all-reduce in it, with a generous timeout that must not fire.
    comm.set_timeout(Some(std::time::Duration::from_mins(1)));
    let mut window = match comm.register_window(&mut buffer, ..2 * page) {
        Err(e @ Error::NcclUnavailable { .. }) => {
            skip(&format!("SKIPPED {test} (window part): {e}"));
            return Ok(());
        }
        other => other?,
    };
    assert_eq!(window.bytes(), 0..2 * page);
    let n = 2 * page / 4;
    let input = floats(n, 11);
    let mut view = window.slice_mut::<f32>()?;
    view.copy_from_host(&input)?;
    comm.scope(|s| -> Result<(), Error> {
        s.all_reduce_in_place(&mut s.lend_mut(&mut view)?, ReduceOp::Sum)
    })?;
    assert_eq!(
        view.to_vec()?,
        input,
        "{test}: all-reduce in a buffer's window"
    );
    assert!(
        !comm.is_aborted(),
        "{test}: the timeout fired on a finished scope"
    );
    window.deregister()?;
    // The window is gone: the buffer grows and shrinks again, and a window over its first page
    // alone is accepted.
    let again = comm.register_window(&mut buffer, ..page)?;
    drop(again);
    buffer.shrink()?;
    assert_eq!(buffer.mapped_bytes(), page);
    Ok(())
}

/// Every call of an aborted communicator is refused, naming the abort.
fn assert_refused_after_abort(test: &str, comm: &Comm, buffer: &mut VirtualBuffer) {
    assert!(comm.is_aborted(), "{test}: the communicator is aborted");
    let aborted = |r: &Result<(), Error>| matches!(r, Err(Error::NcclRefused { why, .. }) if why.contains("aborted"));
    let scope = comm.scope(|_| -> Result<(), Error> { Ok(()) });
    assert!(
        aborted(&scope),
        "{test}: a scope after the abort: {scope:?}"
    );
    let polled = comm.async_error();
    assert!(
        aborted(&polled),
        "{test}: the async error after the abort: {polled:?}"
    );
    let mapped = buffer.mapped_bytes();
    let registered = comm.register(buffer, ..mapped).map(drop);
    assert!(
        aborted(&registered),
        "{test}: a registration after the abort: {registered:?}"
    );
}

fn a_scope_past_its_timeout_aborts_the_communicator() -> TestResult {
    const HALF: usize = 256 << 20;
    const COPIES: usize = 1000;
    let test = "a_scope_past_its_timeout_aborts_the_communicator";
    let Some((device, mut comm)) = one_rank(test) else {
        return Ok(());
    };
    let mut buffer = grown(device, &[HALF, HALF])?;
    let n = HALF / 4;
    // 1000 single-rank all-reduces of 256 MiB out of place (copies, about 0.15 ms each): far past
    // a 1 ms timeout.
    comm.set_timeout(Some(std::time::Duration::from_millis(1)));
    let started = std::time::Instant::now();
    let result = {
        let view = buffer.slice_bytes_mut::<f32>(..2 * HALF)?;
        let (send, mut recv) = view.split_at_mut(n)?;
        comm.scope(|s| -> Result<(), Error> {
            let send = s.lend(&send)?;
            let mut recv = s.lend_mut(&mut recv)?;
            for _ in 0..COPIES {
                s.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
            }
            Ok(())
        })
    };
    let took = started.elapsed();
    // The scope waited for its stream before returning: an event recorded on it now is complete at
    // once (the queue was far longer than the timeout).
    let after = comm.stream().record_event(None)?;
    assert!(
        after.try_is_complete()?,
        "{test}: the stream still ran work when the scope returned"
    );
    assert!(
        matches!(result, Err(Error::Nccl { code: 8, .. })),
        "{test}: the scope's result: {result:?}"
    );
    assert!(took.as_millis() >= 1, "{test}: took {took:?}");
    assert_refused_after_abort(test, &comm, &mut buffer);
    // The buffer is the program's again: views, a shrink.
    buffer.shrink()?;
    assert_eq!(buffer.mapped_bytes(), HALF);
    drop(comm); // no ncclCommDestroy of a freed communicator
    Ok(())
}

/// A scope's end polls its stream and returns on the first poll that finds it idle, with no wait
/// after it: that poll must be the proof. 200 all-reduces of 256 MiB (about 30 ms, through the
/// polls' spinning, yielding and sleeping phases), with no timeout: when the scope returns, an
/// event recorded on the stream is complete at once, and the last copy's bytes are all there.
fn a_scope_returns_once_its_collectives_finished() -> TestResult {
    const HALF: usize = 256 << 20;
    const COPIES: usize = 200;
    let test = "a_scope_returns_once_its_collectives_finished";
    let Some((device, comm)) = one_rank(test) else {
        return Ok(());
    };
    let mut buffer = grown(device, &[HALF, HALF])?;
    let n = HALF / 4;
    let data = floats(n, 7);
    buffer
        .slice_bytes_mut::<f32>(..HALF)?
        .copy_from_host(&data)?;
    buffer
        .slice_bytes_mut::<f32>(HALF..2 * HALF)?
        .copy_from_host(&vec![-1.0; n])?;
    let started = std::time::Instant::now();
    {
        let view = buffer.slice_bytes_mut::<f32>(..2 * HALF)?;
        let (send, mut recv) = view.split_at_mut(n)?;
        comm.scope(|s| -> Result<(), Error> {
            let send = s.lend(&send)?;
            let mut recv = s.lend_mut(&mut recv)?;
            for _ in 0..COPIES {
                s.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
            }
            Ok(())
        })?;
    }
    let took = started.elapsed();
    let after = comm.stream().record_event(None)?;
    assert!(
        after.try_is_complete()?,
        "{test}: the stream still ran work when the scope returned (after {took:?})"
    );
    assert!(
        took.as_millis() >= 5,
        "{test}: {COPIES} copies of 256 MiB cannot end in {took:?}"
    );
    let mut back = vec![0f32; n];
    buffer
        .slice_bytes::<f32>(HALF..2 * HALF)?
        .copy_to_host(&mut back)?;
    assert!(
        back == data,
        "{test}: the reduced bytes differ from the sent ones"
    );
    println!("{test}: {COPIES} all-reduces of 256 MiB waited for in {took:?}");
    Ok(())
}

/// `copies` single-rank all-reduces of 256 MiB queued in `comm`'s scope, then `at_end` inside the
/// scope; the scope's result.
fn copies_then(
    comm: &Comm,
    buffer: &mut VirtualBuffer,
    copies: usize,
    at_end: impl FnOnce() -> TestResult,
) -> TestResult<TestResult> {
    const HALF: usize = 256 << 20;
    let view = buffer.slice_bytes_mut::<f32>(..2 * HALF)?;
    let (send, mut recv) = view.split_at_mut(HALF / 4)?;
    Ok(comm.scope(|s| -> TestResult {
        let send = s.lend(&send)?;
        let mut recv = s.lend_mut(&mut recv)?;
        for _ in 0..copies {
            s.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
        }
        at_end()
    }))
}

/// Whether `comm`'s stream still runs work: an event recorded on it now is not complete at once.
fn busy(comm: &Comm) -> TestResult<bool> {
    Ok(!comm.stream().record_event(None)?.try_is_complete()?)
}

/// A scope whose stream is capturing a graph when its closure returns is not polled (a query
/// would be refused): the one wait ends the capture, destroys its graph, waits for the 100
/// all-reduces queued before it, and the scope returns `Error::StreamCapturing`. The communicator
/// is not aborted, and its next scope runs.
fn a_capture_at_a_scope_end_is_ended_and_waited_for() -> TestResult {
    let test = "a_capture_at_a_scope_end_is_ended_and_waited_for";
    let Some((device, comm)) = one_rank(test) else {
        return Ok(());
    };
    let mut buffer = grown(device, &[512 << 20])?;
    let stream = Arc::clone(comm.stream());
    let result = copies_then(&comm, &mut buffer, 100, || {
        stream.begin_capture(
            cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )?;
        Ok(())
    })?;
    assert!(
        !busy(&comm)?,
        "{test}: the stream still ran work when the scope returned"
    );
    let refusal = result.expect_err("the scope reports the capture");
    assert!(
        matches!(
            refusal.downcast_ref::<Error>(),
            Some(Error::StreamCapturing { .. })
        ),
        "{test}: {refusal}"
    );
    assert!(!comm.is_aborted(), "{test}: the communicator was aborted");
    copies_then(&comm, &mut buffer, 1, || Ok(()))??;
    assert!(
        !busy(&comm)?,
        "{test}: the next scope returned with work running"
    );
    Ok(())
}

/// A collective queued while the scope's stream captures a graph gets never-mapped addresses (one
/// capture check for all of its views): whatever NCCL makes of them, the scope returns
/// `Error::StreamRefused`, the views' bytes are untouched, and the communicator's next scope
/// all-reduces them.
fn a_collective_queued_under_capture_is_refused() -> TestResult {
    let test = "a_collective_queued_under_capture_is_refused";
    let Some((device, comm)) = one_rank(test) else {
        return Ok(());
    };
    let page = page(device);
    let mut buffer = grown(device, &[page, page])?;
    let n = page / 4;
    let input = floats(n, 3);
    let view = buffer.slice_bytes_mut::<f32>(..2 * page)?;
    let (mut send, mut recv) = view.split_at_mut(n)?;
    send.copy_from_host(&input)?;
    recv.copy_from_host(&vec![0.0; n])?;
    let stream = Arc::clone(comm.stream());
    let mut queued = None;
    let result = comm.scope(|s| -> TestResult {
        let send = s.lend(&send)?;
        let mut recv = s.lend_mut(&mut recv)?;
        stream.begin_capture(
            cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )?;
        queued = Some(s.all_reduce(&send, &mut recv, ReduceOp::Sum));
        Ok(())
    });
    let refusal = result.expect_err("the scope reports the refused collective");
    assert!(
        matches!(
            refusal.downcast_ref::<Error>(),
            Some(Error::StreamRefused { .. })
        ),
        "{test}: {refusal} (the collective returned {queued:?})"
    );
    assert!(
        !busy(&comm)?,
        "{test}: the stream still ran work when the scope returned"
    );
    assert_eq!(
        recv.to_vec()?,
        vec![0.0; n],
        "{test}: the output was written"
    );
    assert_eq!(send.to_vec()?, input, "{test}: the input changed");
    comm.scope(|s| -> Result<(), Error> {
        s.all_reduce(&s.lend(&send)?, &mut s.lend_mut(&mut recv)?, ReduceOp::Sum)
    })?;
    assert_eq!(recv.to_vec()?, input, "{test}: the next scope's sum");
    Ok(())
}

/// `ncclGroupStart` and `ncclGroupEnd` of the same library, called as another binding would
/// (cudarc's `group_start`): NCCL's group state is the thread's, whoever began it.
struct OutsideGroup {
    _library: libloading::Library,
    start: unsafe extern "C" fn() -> i32,
    end: unsafe extern "C" fn() -> i32,
}

impl OutsideGroup {
    fn load() -> TestResult<OutsideGroup> {
        // SAFETY: NCCL's runtime library (the one this crate opens), whose initialisers are sound.
        let library = unsafe { libloading::Library::new("libnccl.so.2") }?;
        // SAFETY: the C signatures of the two functions, `ncclResult_t` read as `i32`.
        let (start, end) = unsafe {
            (
                *library.get::<unsafe extern "C" fn() -> i32>(b"ncclGroupStart\0")?,
                *library.get::<unsafe extern "C" fn() -> i32>(b"ncclGroupEnd\0")?,
            )
        };
        Ok(OutsideGroup {
            _library: library,
            start,
            end,
        })
    }

    fn start(&self) -> i32 {
        // SAFETY: no arguments; every test ends the groups it begins.
        unsafe { (self.start)() }
    }

    fn end(&self) -> i32 {
        // SAFETY: no arguments.
        unsafe { (self.end)() }
    }
}

/// A group begun outside the crate (as cudarc's `group_start` does, through the same library):
/// NCCL would hold a collective queued inside it until that group's end, after the scope's wait.
/// At 07952f7 the scope returned `Ok` (on one rank the reduction ran anyway; on two it would have
/// run after the scope). Now: a collective inside such a group is refused before NCCL is called
/// (`Error::NcclRefused`), and so is a `nccl::group` begun inside one; the outside group is left
/// as it was (its end succeeds). A group begun inside a `nccl::group` and left open is ended at
/// the crate's group's end, launching the collective before the scope's wait (its result is
/// there), begun again for its owner, and reported.
fn a_group_begun_outside_the_crate_is_refused() -> TestResult {
    let test = "a_group_begun_outside_the_crate_is_refused";
    let Some((device, comm)) = one_rank(test) else {
        return Ok(());
    };
    let outside = OutsideGroup::load()?;
    let page = page(device);
    let mut buffer = grown(device, &[page, page])?;
    let n = page / 4;
    let input = floats(n, 5);
    let view = buffer.slice_bytes_mut::<f32>(..2 * page)?;
    let (mut send, mut recv) = view.split_at_mut(n)?;
    send.copy_from_host(&input)?;
    recv.copy_from_host(&vec![0.0; n])?;

    assert_eq!(outside.start(), 0);
    let result = comm.scope(|s| -> Result<(), Error> {
        s.all_reduce(&s.lend(&send)?, &mut s.lend_mut(&mut recv)?, ReduceOp::Sum)
    });
    let ended = outside.end();
    println!("{test}: a collective inside an outside group: {result:?}; that group's end {ended}");
    assert!(
        matches!(result, Err(Error::NcclRefused { .. })),
        "{result:?}"
    );
    assert_eq!(ended, 0, "{test}: the outside group was left as it was");
    assert_eq!(recv.to_vec()?, vec![0.0; n], "{test}: nothing was reduced");

    assert_eq!(outside.start(), 0);
    let grouped = group(|| -> Result<(), Error> { Ok(()) });
    let ended = outside.end();
    println!(
        "{test}: a nccl::group inside an outside group: {grouped:?}; that group's end {ended}"
    );
    assert!(
        matches!(grouped, Err(Error::NcclRefused { .. })),
        "{grouped:?}"
    );
    assert_eq!(ended, 0);

    let mut left_open = 0;
    let result = comm.scope(|s| -> Result<(), Error> {
        let (send, mut recv) = (s.lend(&send)?, s.lend_mut(&mut recv)?);
        group(|| -> Result<(), Error> {
            left_open = outside.start();
            s.all_reduce(&send, &mut recv, ReduceOp::Sum)
        })
    });
    let ended = outside.end();
    println!(
        "{test}: a group begun inside a nccl::group and left open ({left_open}): {result:?}; its \
         end afterwards {ended}"
    );
    assert!(
        matches!(result, Err(Error::NcclRefused { .. })),
        "{result:?}"
    );
    assert_eq!(ended, 0, "{test}: the level was begun again for its owner");
    assert_eq!(outside.end(), 5, "{test}: no group is left open");
    assert_eq!(
        recv.to_vec()?,
        input,
        "{test}: the collective ran before the scope returned"
    );
    Ok(())
}

/// As [`a_group_begun_outside_the_crate_is_refused`], on two ranks driven by one thread, where an
/// outside group would have held the collectives past both scopes' waits.
fn a_group_begun_outside_the_crate_is_refused_on_two_ranks() -> TestResult {
    let test = "a_group_begun_outside_the_crate_is_refused_on_two_ranks";
    let Some(gpus) = gpus_and_nccl_or_skip(test, 2) else {
        return Ok(());
    };
    let outside = OutsideGroup::load()?;
    let streams: Vec<_> = gpus.iter().map(|(_, s)| Arc::clone(s)).collect();
    let comms = Comm::from_devices(&streams)?;
    let mut buffers = Vec::new();
    for (device, _) in &gpus {
        buffers.push(grown(*device, &[page(*device)])?);
    }
    let n = page(gpus[0].0) / 4;
    assert_eq!(outside.start(), 0);
    for (comm, buffer) in comms.iter().zip(&mut buffers) {
        let mut view = buffer.slice_bytes_mut::<f32>(..n * 4)?;
        let result = comm.scope(|s| -> Result<(), Error> {
            s.all_reduce_in_place(&mut s.lend_mut(&mut view)?, ReduceOp::Sum)
        });
        assert!(
            matches!(result, Err(Error::NcclRefused { .. })),
            "{test}: {result:?}"
        );
    }
    assert_eq!(outside.end(), 0);
    Ok(())
}

/// Registration while a capture that this thread can see is under way is refused before NCCL is
/// called (`Error::StreamCapturing`): NCCL's driver calls would be refused and invalidate the
/// capture (vLLM #54626). A capture of the communicator's stream, of this thread's per-thread
/// default stream (through cudarc), of a blocking stream on another thread, and a
/// `Graph::capture` of this thread; each capture goes on unharmed, and registration works once
/// it has ended.
fn registration_under_capture_is_refused() -> TestResult {
    use cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    let test = "registration_under_capture_is_refused";
    let Some((device, comm)) = one_rank(test) else {
        return Ok(());
    };
    let page = page(device);
    let mut buffer = grown(device, &[page])?;
    let refused = |r: Result<nccl::Registration<'_, '_, ReadWrite>, Error>, what: &str| {
        let refused = r.map(drop);
        println!("{test}: {what}: {refused:?}");
        assert!(
            matches!(refused, Err(Error::StreamCapturing { .. })),
            "{what}: {refused:?}"
        );
    };

    let stream = Arc::clone(comm.stream());
    stream.begin_capture(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    refused(
        comm.register(&mut buffer, ..page),
        "the communicator's stream capturing",
    );
    let graph = stream.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))?;
    assert!(graph.is_some(), "{test}: that capture went on");

    let per_thread = stream.context().per_thread_stream();
    per_thread.begin_capture(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    refused(
        comm.register(&mut buffer, ..page),
        "the per-thread stream capturing",
    );
    per_thread.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))?;

    // A blocking stream of the context, captured by another thread in RELAXED mode: seen through
    // the one query of the legacy stream.
    let context = Arc::clone(stream.context());
    let (began_tx, began_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || -> Result<usize, String> {
        use cudarc::driver::result::{graph, stream as raw_stream};
        use cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        let as_text = |e: cudarc::driver::DriverError| e.to_string();
        let began = (|| -> Result<cudarc::driver::sys::CUstream, String> {
            context.bind_to_thread().map_err(as_text)?;
            let blocking = raw_stream::create(raw_stream::StreamKind::Default).map_err(as_text)?;
            // SAFETY: the stream just made, of the bound context; ended below.
            unsafe { raw_stream::begin_capture(blocking, CU_STREAM_CAPTURE_MODE_RELAXED) }
                .map_err(as_text)?;
            Ok(blocking)
        })();
        let blocking = match began {
            Ok(blocking) => {
                let _ = began_tx.send(Ok(()));
                blocking
            }
            Err(e) => {
                let _ = began_tx.send(Err(e.clone()));
                return Err(e);
            }
        };
        let _ = end_rx.recv();
        // SAFETY: the capture begun above on this thread; its graph (no nodes) and the stream are
        // destroyed once.
        unsafe {
            let captured = raw_stream::end_capture(blocking).map_err(as_text)?;
            let mut nodes = 0usize;
            let code = cudarc::driver::sys::cuGraphGetNodes(
                captured,
                core::ptr::null_mut(),
                &raw mut nodes,
            );
            graph::destroy(captured).map_err(as_text)?;
            raw_stream::destroy(blocking).map_err(as_text)?;
            code.result().map_err(as_text)?;
            Ok(nodes)
        }
    });
    began_rx.recv()??;
    refused(
        comm.register(&mut buffer, ..page),
        "a blocking stream of the context capturing on another thread",
    );
    let _ = end_tx.send(());
    let nodes = other
        .join()
        .map_err(|_| "the capturing thread panicked")??;
    assert_eq!(nodes, 0, "{test}: that capture went on, empty");

    let context = cuda_vmm::Context::new(device)?;
    let mut capturing = cuda_vmm::Stream::new(&context)?;
    let captured = cuda_vmm::stream::Graph::capture(&mut capturing, |_| {
        refused(
            comm.register(&mut buffer, ..page),
            "a Graph::capture of this thread",
        );
        Ok(())
    });
    assert!(
        captured.is_ok(),
        "{test}: that capture went on: {captured:?}"
    );

    comm.register(&mut buffer, ..page)?.deregister()?;
    Ok(())
}

/// While another thread captures a graph in `GLOBAL` mode (CUDA's default), a scope's end polls
/// its stream in `RELAXED` mode: the polls are not refused (the scope returns `Ok`, once the 100
/// all-reduces have finished), and the other thread's capture is not invalidated (its end gives
/// a graph).
fn another_threads_capture_survives_a_scope_end() -> TestResult {
    let test = "another_threads_capture_survives_a_scope_end";
    let Some((device, comm)) = one_rank(test) else {
        return Ok(());
    };
    let mut buffer = grown(device, &[512 << 20])?;
    let context = Arc::clone(comm.stream().context());
    let (go, go_rx) = std::sync::mpsc::channel::<()>();
    let (began, began_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let (end, end_rx) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || -> Result<(), String> {
        let stream = context.new_stream().map_err(|e| e.to_string())?;
        // Only once this thread's collectives are queued: NCCL's own calls while they are
        // queued are not this test's subject.
        go_rx
            .recv()
            .map_err(|_| "the scope never queued its collectives")?;
        let captured = stream
            .begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
            .map_err(|e| e.to_string());
        let _ = began.send(captured.clone());
        captured?;
        let _ = end_rx.recv();
        stream
            .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))
            .map(|_| ())
            .map_err(|e| format!("the capture ended in {e}"))
    });
    let result = copies_then(&comm, &mut buffer, 100, move || {
        // The other thread captures from here until the scope has returned.
        go.send(())?;
        began_rx
            .recv()?
            .map_err(|e| format!("begin_capture: {e}"))?;
        Ok(())
    });
    // Nothing else of this thread's runs in GLOBAL mode before the capture ends (creating the
    // event below would be refused, and would invalidate it).
    let _ = end.send(());
    let captured = other.join().map_err(|_| "the capturing thread panicked")?;
    result??;
    // The queue was about 13 ms long; ending the other capture took microseconds.
    assert!(
        !busy(&comm)?,
        "{test}: the stream still ran work when the scope returned"
    );
    assert!(
        captured.is_ok(),
        "{test}: the other thread's capture: {captured:?}"
    );
    Ok(())
}

/// Non-blocking, with a generous timeout that must not fire.
fn non_blocking() -> CommOptions {
    CommOptions::new()
        .with_blocking(false)
        .with_timeout(Some(Duration::from_mins(1)))
}

fn non_blocking_single_rank_all_reduces_registers_and_tears_down() -> TestResult {
    let test = "non_blocking_single_rank_all_reduces_registers_and_tears_down";
    let Some(mut gpus) = gpus_and_nccl_or_skip(test, 1) else {
        return Ok(());
    };
    let (device, stream) = gpus.remove(0);
    let context = Context::new(device)?;
    let page = page(device);
    let mut buffer = grown(device, &[page, page])?;
    // One round first: NCCL sets up its process-wide state (for non-blocking communicators, their
    // registration cache and collectives too) once.
    non_blocking_round(test, &stream, &mut buffer, page)?;
    let (before, _) = context.memory_info()?;
    for _ in 0..3 {
        non_blocking_round(test, &stream, &mut buffer, page)?;
    }
    let (after, _) = context.memory_info()?;
    assert_eq!(
        after, before,
        "{test}: device free memory after three rounds of communicators made and torn down"
    );
    // The buffer is the program's again.
    buffer.shrink()?;
    assert_eq!(buffer.mapped_bytes(), page);
    Ok(())
}

/// One round of [`non_blocking_single_rank_all_reduces_registers_and_tears_down`]: a non-blocking
/// single-rank communicator all-reduces `buffer`'s first two pages, registered and not, is refused
/// in a group with a blocking one, and is torn down with them (`ncclCommFinalize`, polled, then
/// `ncclCommDestroy`).
fn non_blocking_round(
    test: &str,
    stream: &Arc<cudarc::driver::CudaStream>,
    buffer: &mut VirtualBuffer,
    page: usize,
) -> TestResult {
    let comm = Comm::from_devices_with(&[Arc::clone(stream)], non_blocking())?.remove(0);
    assert!(!comm.is_blocking(), "{test}: made non-blocking");
    assert_eq!((comm.rank(), comm.size()), (0, 1));
    let n = page / 4;
    let input = floats(n, 13);
    // Not registered, out of place.
    all_reduce_unregistered(test, &comm, buffer, page, &input)?;
    // Registered, out of place and then in place inside a group (settled at its end).
    let mut registration = comm.register(buffer, ..2 * page)?;
    {
        let view = registration.slice_bytes_mut::<f32>(..2 * page)?;
        let (send, mut recv) = view.split_at_mut(n)?;
        recv.copy_from_host(&vec![-1.0; n])?;
        comm.scope(|s| -> Result<(), Error> {
            let send = s.lend(&send)?;
            let mut recv = s.lend_mut(&mut recv)?;
            s.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
            group(|| s.all_reduce_in_place(&mut recv, ReduceOp::Max))
        })?;
        assert_eq!(recv.to_vec()?, input, "{test}: registered, then in a group");
    }
    registration.deregister()?;
    let stats = comm.registration_stats();
    assert_eq!((stats.registered, stats.deregistered), (1, 1));
    // One group takes one kind of communicator: a blocking one's collective first, then the
    // non-blocking one's is refused before NCCL sees it.
    let blocking = Comm::from_devices(&[Arc::clone(stream)])?.remove(0);
    assert!(blocking.is_blocking());
    let view = buffer.slice_bytes_mut::<f32>(..2 * page)?;
    let (mut first, mut second) = view.split_at_mut(n)?;
    first.copy_from_host(&input)?;
    let mixed = blocking.scope(|b| {
        comm.scope(|s| -> Result<(), Error> {
            let mut first = b.lend_mut(&mut first)?;
            let mut second = s.lend_mut(&mut second)?;
            group(|| {
                b.all_reduce_in_place(&mut first, ReduceOp::Sum)?;
                s.all_reduce_in_place(&mut second, ReduceOp::Sum)
            })
        })
    });
    assert!(
        matches!(mixed, Err(Error::NcclRefused { why, .. }) if why.contains("non-blocking")),
        "{test}: a group of both kinds: {mixed:?}"
    );
    assert_eq!(
        first.to_vec()?,
        input,
        "{test}: the blocking all-reduce ran"
    );
    assert!(!comm.is_aborted(), "{test}: the communicator was aborted");
    // A single-rank communicator made by rank, non-blocking too.
    let by_rank = Comm::from_rank_with(stream, 0, 1, &UniqueId::new()?, non_blocking())?;
    assert!(!by_rank.is_blocking());
    drop(by_rank);
    drop(blocking);
    drop(comm); // ncclCommFinalize, polled, then ncclCommDestroy
    Ok(())
}

fn a_non_blocking_creation_whose_peer_never_joins_ends_at_its_timeout() -> TestResult {
    let test = "a_non_blocking_creation_whose_peer_never_joins_ends_at_its_timeout";
    let Some(mut gpus) = gpus_and_nccl_or_skip(test, 1) else {
        return Ok(());
    };
    let (_, stream) = gpus.remove(0);
    // Rank 0 of 2; rank 1 never comes. A blocking creation would wait for ever.
    let options = CommOptions::new()
        .with_blocking(false)
        .with_timeout(Some(Duration::from_secs(2)));
    let started = Instant::now();
    let made = Comm::from_rank_with(&stream, 0, 2, &UniqueId::new()?, options).map(drop);
    let took = started.elapsed();
    assert!(
        matches!(
            made,
            Err(Error::Nccl {
                call: "ncclCommInitRankConfig",
                code: 8
            })
        ),
        "{test}: {made:?}"
    );
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_mins(1),
        "{test}: returned after {took:?}"
    );
    // Refused before NCCL: a rank outside the clique.
    let outside = Comm::from_rank_with(&stream, 2, 2, &UniqueId::new()?, options).map(drop);
    assert!(
        matches!(outside, Err(Error::OutOfBounds { .. })),
        "{test}: {outside:?}"
    );
    Ok(())
}

fn two_gpus_non_blocking_in_one_process() -> TestResult {
    let test = "two_gpus_non_blocking_in_one_process";
    let Some(gpus) = gpus_and_nccl_or_skip(test, 2) else {
        return Ok(());
    };
    let streams: Vec<_> = gpus.iter().map(|(_, s)| Arc::clone(s)).collect();
    let comms = Comm::from_devices_with(&streams, non_blocking())?;
    assert!(comms.iter().all(|c| !c.is_blocking()));
    // The group's end returns ncclInProgress; both communicators are polled.
    all_reduce_on_two(test, &gpus, &comms)
}

/// One non-blocking rank of two in its own thread: as [`one_rank_of_two`], its communicator made
/// non-blocking (torn down with the other rank's: finalized, then destroyed).
fn one_non_blocking_rank_of_two(
    stream: &Arc<CudaStream>,
    device: Device,
    rank: usize,
    id: &UniqueId,
) -> TestResult {
    let comm = Comm::from_rank_with(stream, rank, 2, id, non_blocking())?;
    all_reduce_as_rank_of_two(&comm, device, rank)
}

fn two_non_blocking_ranks_in_two_threads() -> TestResult {
    let test = "two_non_blocking_ranks_in_two_threads";
    let Some(gpus) = gpus_and_nccl_or_skip(test, 2) else {
        return Ok(());
    };
    let id = UniqueId::new()?;
    let (device1, stream1) = gpus[1].clone();
    let peer = std::thread::spawn(move || {
        one_non_blocking_rank_of_two(&stream1, device1, 1, &id).map_err(|e| e.to_string())
    });
    let (device0, stream0) = &gpus[0];
    let mine = one_non_blocking_rank_of_two(stream0, *device0, 0, &id);
    peer.join().map_err(|_| "rank 1 panicked")??;
    mine
}

fn a_peer_that_never_joins_ends_in_an_error() -> TestResult {
    let test = "a_peer_that_never_joins_ends_in_an_error";
    let Some(gpus) = gpus_and_nccl_or_skip(test, 2) else {
        return Ok(());
    };
    let id = UniqueId::new()?;
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let (device1, stream1) = gpus[1].clone();
    let peer_id = id;
    // Rank 1 joins the communicator, never joins the all-reduce, and aborts once rank 0 is done.
    let peer = std::thread::spawn(move || -> Result<(), String> {
        let comm = Comm::from_rank(&stream1, 1, 2, &peer_id).map_err(|e| e.to_string())?;
        let _ = device1;
        done_rx.recv().map_err(|e| e.to_string())?;
        comm.abort().map_err(|e| e.to_string())
    });
    let (device0, stream0) = &gpus[0];
    let mut comm = Comm::from_rank(stream0, 0, 2, &id)?;
    comm.set_timeout(Some(std::time::Duration::from_secs(2)));
    let mut buffer = grown(*device0, &[page(*device0)])?;
    let started = std::time::Instant::now();
    let result = {
        let mut view = buffer.slice_bytes_mut::<f32>(..)?;
        comm.scope(|s| -> Result<(), Error> {
            s.all_reduce_in_place(&mut s.lend_mut(&mut view)?, ReduceOp::Sum)
        })
    };
    let took = started.elapsed();
    let after = stream0.record_event(None)?;
    assert!(
        after.try_is_complete()?,
        "{test}: rank 0's stream still ran the all-reduce when the scope returned"
    );
    let _ = done_tx.send(());
    assert!(
        matches!(result, Err(Error::Nccl { code: 8, .. })),
        "{test}: rank 0's scope: {result:?}"
    );
    assert!(
        took >= std::time::Duration::from_secs(2) && took < std::time::Duration::from_mins(1),
        "{test}: rank 0 returned after {took:?}"
    );
    assert_refused_after_abort(test, &comm, &mut buffer);
    drop(comm);
    peer.join().map_err(|_| "rank 1 panicked")??;
    Ok(())
}

fn two_gpus_in_one_process() -> TestResult {
    let test = "two_gpus_in_one_process";
    let Some(gpus) = gpus_and_nccl_or_skip(test, 2) else {
        return Ok(());
    };
    let streams: Vec<_> = gpus.iter().map(|(_, s)| Arc::clone(s)).collect();
    let comms = Comm::from_devices(&streams)?;
    all_reduce_on_two(test, &gpus, &comms)
}

/// Ranks 0 and 1 of `comms`, one per GPU of `gpus`, all-reduce `rank + 1` in registered VMM memory
/// in one group, and both read 3.
fn all_reduce_on_two(test: &str, gpus: &[(Device, Arc<CudaStream>)], comms: &[Comm]) -> TestResult {
    let mut buffers = Vec::new();
    for (rank, (device, _)) in gpus.iter().enumerate() {
        let page = page(*device);
        let mut buffer = grown(*device, &[page])?;
        buffer
            .slice_bytes_mut::<f32>(..page)?
            .copy_from_host(&vec![rank as f32 + 1.0; page / 4])?;
        buffers.push(buffer);
    }
    let [b0, b1] = &mut buffers[..] else {
        unreachable!("two buffers")
    };
    let (mut r0, mut r1) = (comms[0].register(b0, ..)?, comms[1].register(b1, ..)?);
    let mut v0 = r0.slice_bytes_mut::<f32>(..)?;
    let mut v1 = r1.slice_bytes_mut::<f32>(..)?;
    comms[0].scope(|s0| {
        comms[1].scope(|s1| -> Result<(), Error> {
            let (mut l0, mut l1) = (s0.lend_mut(&mut v0)?, s1.lend_mut(&mut v1)?);
            group(|| {
                s0.all_reduce_in_place(&mut l0, ReduceOp::Sum)?;
                s1.all_reduce_in_place(&mut l1, ReduceOp::Sum)
            })
        })
    })?;
    assert!(v0.to_vec()?.iter().all(|&x| x == 3.0), "{test}: rank 0");
    assert!(v1.to_vec()?.iter().all(|&x| x == 3.0), "{test}: rank 1");
    Ok(())
}

/// One rank of the two-process test: all-reduces `rank + 1` with the other and checks the sum.
fn one_rank_of_two(
    stream: &Arc<CudaStream>,
    device: Device,
    rank: usize,
    id: &UniqueId,
) -> TestResult {
    let comm = Comm::from_rank(stream, rank, 2, id)?;
    all_reduce_as_rank_of_two(&comm, device, rank)
}

/// Rank `rank` of the two of `comm` all-reduces `rank + 1` in registered VMM memory on `device`
/// and reads the sum of both, 3.
fn all_reduce_as_rank_of_two(comm: &Comm, device: Device, rank: usize) -> TestResult {
    let page = page(device);
    let mut buffer = grown(device, &[page])?;
    let mut registration = comm.register(&mut buffer, ..)?;
    let mut view = registration.slice_bytes_mut::<f32>(..)?;
    view.copy_from_host(&vec![rank as f32 + 1.0; page / 4])?;
    comm.scope(|s| -> Result<(), Error> {
        s.all_reduce_in_place(&mut s.lend_mut(&mut view)?, ReduceOp::Sum)
    })?;
    assert!(
        view.to_vec()?.iter().all(|&x| x == 3.0),
        "rank {rank}: the sum of both ranks"
    );
    Ok(())
}

fn two_processes_with_a_unique_id() -> TestResult {
    let test = "two_processes_with_a_unique_id";
    let Some(gpus) = gpus_and_nccl_or_skip(test, 2) else {
        return Ok(());
    };
    let id = UniqueId::new()?;
    let mut child = Command::new(std::env::current_exe()?)
        .env(CHILD, "1")
        .env("NCCL_NVLS_ENABLE", "0")
        .stdin(Stdio::piped())
        .spawn()?;
    {
        let stdin = child.stdin.as_mut().ok_or("the child's stdin")?;
        id.write_to(&mut *stdin)?;
    }
    drop(child.stdin.take());
    let (device, stream) = &gpus[0];
    let mine = one_rank_of_two(stream, *device, 0, &id);
    let status = child.wait()?;
    mine?;
    assert!(status.success(), "{test}: the child rank failed: {status}");
    Ok(())
}

/// The child of [`two_processes_with_a_unique_id`]: rank 1 on GPU 1, its id read from stdin.
fn child() -> TestResult {
    let id = UniqueId::read_from(std::io::stdin().lock())?;
    let ctx = CudaContext::new(1)?;
    one_rank_of_two(&ctx.new_stream()?, Device::get(1)?, 1, &id)
}

/// Four blocks of `n` floats each, split from one writable view: what the point-to-point tests
/// send from, receive into, and all-reduce beside them.
fn p2p_blocks(
    buffer: &mut VirtualBuffer,
    n: usize,
) -> TestResult<[cuda_vmm::DeviceSliceMut<'_, f32>; 4]> {
    let view = buffer.slice_bytes_mut::<f32>(..4 * n * 4)?;
    let (first, rest) = view.split_at_mut(n)?;
    let (second, rest) = rest.split_at_mut(n)?;
    let (third, fourth) = rest.split_at_mut(n)?;
    Ok([first, second, third, fourth])
}

/// One rank sends a block to itself: refused outside a group and for a peer outside the clique
/// (before NCCL is called); inside a group, with an all-reduce of two other blocks in the same
/// group, the received block is the sent one and the reduced block the input. Where NCCL refuses
/// a rank's transfer to itself, the transfer part skips visibly with NCCL's code.
fn send_and_recv_to_itself_on_one_rank() -> TestResult {
    let test = "send_and_recv_to_itself_on_one_rank";
    let Some((device, comm)) = one_rank(test) else {
        return Ok(());
    };
    let page = page(device);
    let mut buffer = grown(device, &[page])?;
    let n = page / 16;
    let (input, reduced) = (floats(n, 13), floats(n, 17));
    let [mut send, mut recv, mut reduce_from, mut reduce_into] = p2p_blocks(&mut buffer, n)?;
    send.copy_from_host(&input)?;
    reduce_from.copy_from_host(&reduced)?;
    for block in [&mut recv, &mut reduce_into] {
        block.copy_from_host(&vec![-1.0; n])?;
    }
    comm.scope(|s| -> Result<(), Error> {
        let from_block = s.lend(&send)?;
        let mut received = s.lend_mut(&mut recv)?;
        let alone = s.send(&from_block, 0);
        assert!(
            matches!(alone, Err(Error::NcclRefused { why, .. }) if why.contains("group")),
            "{test}: a send to itself outside a group: {alone:?}"
        );
        let alone = s.recv(&mut received, 0);
        assert!(
            matches!(alone, Err(Error::NcclRefused { .. })),
            "{test}: {alone:?}"
        );
        let outside = s.send(&from_block, 1);
        assert!(
            matches!(outside, Err(Error::OutOfBounds { len: 1, .. })),
            "{test}: {outside:?}"
        );
        Ok(())
    })?;
    let grouped = comm.scope(|s| -> Result<(), Error> {
        let from_block = s.lend(&send)?;
        let mut received = s.lend_mut(&mut recv)?;
        let from = s.lend(&reduce_from)?;
        let mut into = s.lend_mut(&mut reduce_into)?;
        group(|| {
            s.send(&from_block, 0)?;
            s.all_reduce(&from, &mut into, ReduceOp::Sum)?;
            s.recv(&mut received, 0)
        })
    });
    match grouped {
        Err(e @ Error::Nccl { .. }) => {
            skip(&format!(
                "SKIPPED {test} (the transfer): NCCL {} refuses a rank's send to itself: {e}",
                nccl::version()?
            ));
            return Ok(());
        }
        other => other?,
    }
    assert_eq!(recv.to_vec()?, input, "{test}: received what was sent");
    assert_eq!(
        reduce_into.to_vec()?,
        reduced,
        "{test}: the all-reduce of the same group"
    );
    assert_eq!(send.to_vec()?, input, "{test}: the sent block is unchanged");
    Ok(())
}

/// Two ranks (two GPUs, one process) swap blocks: each sends `rank + 1` to the other and receives
/// the other's, paired in one group; both read what the other sent.
fn send_and_recv_between_two_ranks() -> TestResult {
    let test = "send_and_recv_between_two_ranks";
    let Some(gpus) = gpus_and_nccl_or_skip(test, 2) else {
        return Ok(());
    };
    let streams: Vec<_> = gpus.iter().map(|(_, s)| Arc::clone(s)).collect();
    let comms = Comm::from_devices(&streams)?;
    let mut buffers = Vec::new();
    for (device, _) in &gpus {
        buffers.push(grown(*device, &[page(*device)])?);
    }
    let n = page(gpus[0].0).min(page(gpus[1].0)) / 16;
    let [b0, b1] = &mut buffers[..] else {
        unreachable!("two buffers")
    };
    let [mut send0, mut recv0, _, _] = p2p_blocks(b0, n)?;
    let [mut send1, mut recv1, _, _] = p2p_blocks(b1, n)?;
    send0.copy_from_host(&vec![1.0; n])?;
    send1.copy_from_host(&vec![2.0; n])?;
    recv0.copy_from_host(&vec![-1.0; n])?;
    recv1.copy_from_host(&vec![-1.0; n])?;
    comms[0].scope(|s0| {
        comms[1].scope(|s1| -> Result<(), Error> {
            let (l0, mut r0) = (s0.lend(&send0)?, s0.lend_mut(&mut recv0)?);
            let (l1, mut r1) = (s1.lend(&send1)?, s1.lend_mut(&mut recv1)?);
            group(|| {
                s0.send(&l0, 1)?;
                s0.recv(&mut r0, 1)?;
                s1.send(&l1, 0)?;
                s1.recv(&mut r1, 0)
            })
        })
    })?;
    assert!(
        recv0.to_vec()?.iter().all(|&x| x == 2.0),
        "{test}: rank 0 got rank 1's"
    );
    assert!(
        recv1.to_vec()?.iter().all(|&x| x == 1.0),
        "{test}: rank 1 got rank 0's"
    );
    Ok(())
}

/// Suspend and resume where the loaded NCCL has them (2.29.7 and later): every call between them
/// is refused, and the communicator all-reduces again after the resume. Where it has not (2.28.3),
/// both are refused with `Error::NcclUnavailable`, the communicator stays usable, and the suspend
/// part skips visibly.
fn suspend_and_resume_or_the_refusal() -> TestResult {
    let test = "suspend_and_resume_or_the_refusal";
    let Some((device, mut comm)) = one_rank(test) else {
        return Ok(());
    };
    let context = Context::new(device)?;
    let page = page(device);
    let mut buffer = grown(device, &[page, page])?;
    let n = page / 4;
    let input = floats(n, 19);
    all_reduce_unregistered(test, &comm, &mut buffer, page, &input)?;
    let before = context.memory_info()?.0;
    match comm.suspend() {
        Err(e @ Error::NcclUnavailable { .. }) => {
            assert!(e.to_string().contains("2.29.7"), "{test}: {e}");
            assert!(!comm.is_suspended());
            let resume = comm.resume();
            assert!(
                matches!(resume, Err(Error::NcclUnavailable { .. })),
                "{test}: {resume:?}"
            );
            all_reduce_unregistered(test, &comm, &mut buffer, page, &input)?;
            println!("{test}: refused: {e}");
            skip(&format!(
                "SKIPPED {test} (suspend and resume): NCCL {} has no ncclCommSuspend",
                nccl::version()?
            ));
        }
        Err(e) => return Err(e.into()),
        Ok(()) => {
            assert!(comm.is_suspended());
            let during = context.memory_info()?.0;
            println!(
                "MEASURED {test}: free device memory {before} bytes before ncclCommSuspend, \
                 {during} after"
            );
            let suspended = |r: &Result<(), Error>| matches!(r, Err(Error::NcclRefused { why, .. }) if why.contains("suspended"));
            let scope = comm.scope(|_| -> Result<(), Error> { Ok(()) });
            assert!(suspended(&scope), "{test}: a scope: {scope:?}");
            let register = comm.register(&mut buffer, ..page).map(drop);
            assert!(suspended(&register), "{test}: a registration: {register:?}");
            let again = comm.suspend();
            assert!(matches!(again, Err(Error::NcclRefused { .. })), "{again:?}");
            comm.resume()?;
            assert!(!comm.is_suspended());
            let not_suspended = comm.resume();
            assert!(
                matches!(not_suspended, Err(Error::NcclRefused { .. })),
                "{not_suspended:?}"
            );
            all_reduce_unregistered(test, &comm, &mut buffer, page, &input)?;
        }
    }
    Ok(())
}

/// `[(name, function), ...]` of test functions, each named by its own identifier.
macro_rules! named {
    ($($test:ident),* $(,)?) => {
        [$((stringify!($test), $test as fn() -> TestResult)),*]
    };
}

fn main() -> ExitCode {
    // SAFETY: the first statement of `main`: no other thread of this process runs yet, and nothing
    // has read the environment concurrently.
    unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    if std::env::var_os(CHILD).is_some() {
        return match child() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                let _ = writeln!(std::io::stderr(), "child rank: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let tests: [Test; 26] = named![
        nccl_loads_or_says_why,
        single_rank_all_reduce_registered_and_not,
        all_four_collectives_on_one_rank,
        registration_refusals,
        window_registration,
        registration_dropped_before_and_after_other_users,
        ten_thousand_registrations_leak_nothing,
        window_over_a_virtual_buffer,
        a_scope_past_its_timeout_aborts_the_communicator,
        a_scope_returns_once_its_collectives_finished,
        a_capture_at_a_scope_end_is_ended_and_waited_for,
        a_collective_queued_under_capture_is_refused,
        a_group_begun_outside_the_crate_is_refused,
        a_group_begun_outside_the_crate_is_refused_on_two_ranks,
        registration_under_capture_is_refused,
        another_threads_capture_survives_a_scope_end,
        a_peer_that_never_joins_ends_in_an_error,
        non_blocking_single_rank_all_reduces_registers_and_tears_down,
        a_non_blocking_creation_whose_peer_never_joins_ends_at_its_timeout,
        two_gpus_non_blocking_in_one_process,
        two_non_blocking_ranks_in_two_threads,
        two_gpus_in_one_process,
        two_processes_with_a_unique_id,
        send_and_recv_to_itself_on_one_rank,
        send_and_recv_between_two_ranks,
        suspend_and_resume_or_the_refusal,
    ];
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let mut failed = 0;
    println!("\nrunning {} tests", tests.len());
    for (name, test) in tests {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        match std::panic::catch_unwind(test) {
            Ok(Ok(())) => println!("test {name} ... ok"),
            Ok(Err(e)) => {
                failed += 1;
                println!("test {name} ... FAILED: {e}");
            }
            Err(_) => {
                failed += 1;
                println!("test {name} ... FAILED (panicked)");
            }
        }
    }
    println!(
        "\ntest result: {}. {failed} failed\n",
        if failed == 0 { "ok" } else { "FAILED" }
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
