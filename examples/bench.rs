//! Benchmark: the safe API against the same driver calls made raw, side by side in one run.
//!
//! Prints a table and writes the figures as JSON (to the path in `BENCH_JSON`, default
//! `bench.json`). Every figure is the median of many repetitions; safe and raw runs alternate so
//! that drift affects both alike. Not a test: it asserts nothing about speed.
//!
//! Run with `./with-libcuda cargo run --release --example bench` on a GPU machine. Without a device it
//! says so and exits successfully.
//!
//! On every machine (GPU 0): the VMM lifecycle, host <-> device copies, device -> device on one GPU,
//! map/grant churn, `copy_between` with `Route::Direct` between two buffers of one GPU against
//! `cuMemcpyDtoD`, and the staged path (a new against a reused `Staging`, and against its slower host
//! leg), from GPU 0 to GPU 1 where there are two, else on GPU 0.
//!
//! The owned layer, on GPU 0: a `VirtualBuffer` (128 GiB of address space) grown by one page (2 MiB on
//! an H200) and shrunk back, with 2 MiB, 1 GiB and 64 GiB already mapped page by page, against the
//! same raw calls at the same address of the same reservation (`cuMemCreate`, `cuMemMap`,
//! `cuMemSetAccess`, then `cuMemUnmap`, `cuMemRelease`); the same growth at 1 GiB and at 64 GiB against
//! a buffer with 2 MiB mapped (goal ~1: growth does not depend on the size); that growth against a
//! reallocation by copy at each size (`cuMemAlloc` of the size plus a page, `cuMemcpyDtoD` of the
//! size, `cuMemFree` of the old buffer; goal "report"); and churn of pages through `map_page` and
//! `unmap` against the raw calls, as the map/grant churn above does for the borrowed layer. A size
//! the device has too little free memory for is not run, and a "not run" line says so.
//!
//! With two or more devices, between GPU 0 and GPU 1, in both directions, each where
//! `cuDeviceCanAccessPeer(dst, src)` says yes (else a "not run" line says why):
//! - direct copies of `cuMemAlloc` memory at 64 MiB, 256 MiB and 1 GiB: `copy_between` with
//!   `Route::Direct` from the source's peer view under the destination's `PeerAccess` guard (one
//!   `cuMemcpyDtoD` in the destination's context and a wait there) against raw `cuMemcpyPeer` and
//!   `cuCtxSynchronize` in the destination's context, under the same guard, enabled once per direction;
//! - the 1 GiB figure against the `NVLink` 4 peak, 450 GB/s per direction (the "raw" column is the peak);
//! - a 1 GiB VMM source on the source GPU, granted to both devices (`grant_all`, no context peer
//!   access), copied into a `cuMemAlloc` buffer of the destination: `copy_between` with `Route::Direct`
//!   against raw `cuMemcpyPeer` from the same address.
//!
//! Then, GPU 0 -> GPU 1 at 1 GiB with no access at all (every guard ended, checked with the driver): the
//! crate's `Route::Auto` on plain views, which stages through pinned host memory (a reused `Staging`),
//! against raw `cuMemcpyPeer`, which the driver then stages itself (the call `Route::Direct` used to
//! make): a reference, goal "report".
//!
//! Memory in motion, on GPU 0, with the hand-written `spin_add_one` kernel (it spins for a given
//! time, then writes `dst = src + 1`): the host time of `ScopedBuffer::retire` of a page with 100 ms
//! of that kernel queued, against `cuStreamSynchronize` + `cuMemUnmap` + `cuMemRelease` of the same
//! work on a raw page (goal: the retire under 1 % of the wait); a decode loop of 256 steps in one
//! scope, one kernel per step, that maps a page and retires one every 8 steps, against the same loop
//! over a preallocated `VirtualBuffer` that maps and retires nothing (the crate's own buffer, so the
//! ratio is the cost of the motion alone), once with 100 us kernels (goal <= 1.02) and once with
//! kernels that do not spin, where the host's calls set the pace (goal "report"); the same two
//! loops again with a reserve on the growing buffer (`VirtualBuffer::reserve_ahead`: a worker
//! thread makes the pages ahead and releases the retired ones, so the launch thread makes no VMM
//! call where the worker keeps up; goals <= 1.01 with 100 us kernels and the host at most 2 steps
//! ahead, <= 1.05 host-bound; a note after each says how many maps took a page of the reserve, a
//! fact to read beside the ratio: whether the worker's calls on another thread delay the launches,
//! measured, not assumed); the same two reserve rows with each page retired at the scope's end
//! (`ScopedBuffer::retire_at_scope_end`: no event, the pages come back at the next run's scope;
//! same goals); and a second
//! mapping of a shared page (`VirtualBuffer::map_shared` + `unmap`) against `cuMemMap` +
//! `cuMemSetAccess` + `cuMemUnmap` of the same handle at the same address, with the raw calls
//! against themselves as calibration, the pairs in ABBA order and again in a random order (goal
//! <= 1.01 in the random order, whose calibration reads 1 within 0.1 %). Then the decode engine of
//! `examples/decode_engine.rs`, whose step is one graph (a `GraphTable`'s upload and a 100 us
//! `decode_step` kernel) replayed with the host at most 2 steps ahead, 8 seeded sequences whose
//! pages are taken from a reserve of 4 as they start and retired as they end, against the same
//! engine over a preallocated cache (every lane mapped before the run, none retired), paired, only
//! the scopes timed (goal <= 1.02). With the argument `motion` (`cargo run --release --example
//! bench -- motion`), only these rows (and the graph rows) run; with `graph`, only the decode
//! engine's row and the graph rows; with `elastic`, only the decode rows with a reserve and the
//! shared page's rows; with `shared`, the shared page's rows alone; with `parts`, where the host's
//! time goes in the host-bound elastic decode loop (a report, no goal; `parts-end` with retires
//! at the scope's end); with `seams`, the rows of the paths other code can queue beside (the
//! scope, the graph replays, cudarc's and NCCL's scopes).
//!
//! With the `cudarc` feature (`--features cudarc`), on GPU 0: a kernel (NVRTC-compiled, launched with
//! cudarc's builder) over 1 GiB of VMM memory lent inside `cuda_vmm::interop::cudarc::scope`, the
//! scope waiting for the stream, against the same launch over cudarc's own `CudaSlice` followed by
//! `CudaStream::synchronize` (goal safe/raw >= 0.99). Not run, with a line saying why, where NVRTC
//! cannot be loaded or the device has too little free memory.

use core::ffi::c_void;
use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Instant;

use cuda_vmm::{
    Access, Context, Device, DeviceBuffer, DeviceSlice, DriverError, Granularity, PeerAccess,
    PhysicalAllocation, ReadWrite, VirtualReservation, allocation_granularity, copy_between,
    peer::CopyPath, peer::Route, peer::STAGING_CHUNK_BYTES, peer::Staging, peer::can_access_peer,
    peer::copy_between_with,
};

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Byte and operation counts as `f64`, for rates: exact below 2^53, far beyond any size here.
#[allow(clippy::cast_precision_loss)]
fn float(n: usize) -> f64 {
    n as f64
}

#[path = "../tests/common/raw_vmm.rs"]
mod raw_vmm;
// The decode engine of `examples/decode_engine.rs`, whose step is one graph with a graph table.
#[allow(dead_code)]
#[path = "common/graph_engine.rs"]
mod graph_engine;

/// The raw driver calls the safe API makes, declared with integer results.
mod raw {
    use core::ffi::c_void;

    pub(crate) use super::raw_vmm::*;

    unsafe extern "C" {
        pub(crate) fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, bytes: usize) -> u32;
        pub(crate) fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, bytes: usize) -> u32;
        pub(crate) fn cuMemcpyDtoD_v2(dst: u64, src: u64, bytes: usize) -> u32;
        pub(crate) fn cuMemcpyPeer(
            dst: u64,
            dst_ctx: *mut c_void,
            src: u64,
            src_ctx: *mut c_void,
            bytes: usize,
        ) -> u32;
        pub(crate) fn cuStreamSynchronize(stream: *mut c_void) -> u32;
        pub(crate) fn cuEventCreate(event: *mut *mut c_void, flags: u32) -> u32;
        pub(crate) fn cuEventRecord(event: *mut c_void, stream: *mut c_void) -> u32;
        pub(crate) fn cuEventQuery(event: *mut c_void) -> u32;
        pub(crate) fn cuEventDestroy_v2(event: *mut c_void) -> u32;
        pub(crate) fn cuCtxSynchronize() -> u32;
        pub(crate) fn cuCtxSetCurrent(ctx: *mut c_void) -> u32;
        pub(crate) fn cuCtxDisablePeerAccess(peer: *mut c_void) -> u32;
        pub(crate) fn cuMemHostAlloc(pp: *mut *mut c_void, bytes: usize, flags: u32) -> u32;
        pub(crate) fn cuMemFreeHost(p: *mut c_void) -> u32;
    }
}

fn ok(code: u32) -> BenchResult<()> {
    match DriverError::from_raw(code) {
        None => Ok(()),
        Some(e) => Err(e.into()),
    }
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Times `safe` and `raw` alternately, `reps` times each, in ABBA order (which of the two runs first
/// swaps every repetition, so an order effect does not favour either); returns the median seconds of
/// each.
fn race(
    reps: usize,
    safe: impl FnMut() -> BenchResult<()>,
    raw: impl FnMut() -> BenchResult<()>,
) -> BenchResult<(f64, f64)> {
    let (s, r, _) = race_paired(reps, safe, raw)?;
    Ok((s, r))
}

/// As [`race`], also returning the median of the per-repetition ratios `safe / raw`: each pair ran
/// back to back, so drift over the run (which moves both medians, and by different amounts where
/// the distribution changes shape) cancels within a pair.
fn race_paired(
    reps: usize,
    safe: impl FnMut() -> BenchResult<()>,
    raw: impl FnMut() -> BenchResult<()>,
) -> BenchResult<(f64, f64, f64)> {
    let (s, r) = race_samples(reps, safe, raw, None)?;
    let ratios = paired_ratios(&s, &r);
    Ok((median(s), median(r), median(ratios)))
}

/// As [`race_paired`], also returning the median of the per-repetition differences `safe - raw`,
/// in seconds: for a row whose goal is an excess in time, not a ratio.
#[cfg(feature = "nccl")]
fn race_paired_excess(
    reps: usize,
    safe: impl FnMut() -> BenchResult<()>,
    raw: impl FnMut() -> BenchResult<()>,
) -> BenchResult<(f64, f64, f64, f64)> {
    let (s, r) = race_samples(reps, safe, raw, None)?;
    let ratios = paired_ratios(&s, &r);
    let excess = s.iter().zip(&r).map(|(a, b)| a - b).collect();
    Ok((median(s), median(r), median(ratios), median(excess)))
}

/// As [`race_paired`], each pair's order (safe or raw first) drawn from a pseudo-random sequence
/// seeded with `seed` instead of ABBA: where the driver's own cost goes in a cycle of four calls
/// or more, ABBA puts one side on the same places of every cycle, and the raw calls read up to 1 %
/// apart from themselves; a random order puts neither side there more often.
fn race_paired_shuffled(
    reps: usize,
    safe: impl FnMut() -> BenchResult<()>,
    raw: impl FnMut() -> BenchResult<()>,
    seed: u64,
) -> BenchResult<(f64, f64, f64)> {
    let (s, r) = race_samples(reps, safe, raw, Some(seed))?;
    let ratios = paired_ratios(&s, &r);
    Ok((median(s), median(r), median(ratios)))
}

/// The ratio `safe / raw` of each pair.
fn paired_ratios(safe: &[f64], raw: &[f64]) -> Vec<f64> {
    safe.iter().zip(raw).map(|(a, b)| a / b).collect()
}

/// The seconds of each of `reps` repetitions of `safe` and of `raw`, run in pairs (after one
/// untimed run of each), in ABBA order (`seed` `None`) or in an order drawn with `seed`
/// (xorshift64).
fn race_samples(
    reps: usize,
    mut safe: impl FnMut() -> BenchResult<()>,
    mut raw: impl FnMut() -> BenchResult<()>,
    seed: Option<u64>,
) -> BenchResult<(Vec<f64>, Vec<f64>)> {
    let mut state = seed.unwrap_or(0) | 1;
    let mut safe_first = |i: usize| {
        if seed.is_none() {
            return i.is_multiple_of(2);
        }
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state & 1 == 0
    };
    safe()?;
    raw()?;
    let (mut s, mut r) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    let time = |f: &mut dyn FnMut() -> BenchResult<()>, into: &mut Vec<f64>| -> BenchResult<()> {
        let t = Instant::now();
        f()?;
        into.push(t.elapsed().as_secs_f64());
        Ok(())
    };
    for i in 0..reps {
        if safe_first(i) {
            time(&mut safe, &mut s)?;
            time(&mut raw, &mut r)?;
        } else {
            time(&mut raw, &mut r)?;
            time(&mut safe, &mut s)?;
        }
    }
    Ok((s, r))
}

/// Page-locked host memory, so that copies run at the link's speed.
struct Pinned {
    ptr: *mut c_void,
    len: usize,
}

impl Pinned {
    fn new(ctx: &Context, len: usize) -> BenchResult<Pinned> {
        ctx.bind_to_thread()?;
        let mut ptr = core::ptr::null_mut();
        // SAFETY: `ptr` is writable; flags 1 = portable; a context is current (bound just above).
        ok(unsafe { raw::cuMemHostAlloc(&raw mut ptr, len, 1) })?;
        // SAFETY: `len` writable bytes were just allocated; fill them so they are initialised.
        unsafe { core::ptr::write_bytes(ptr.cast::<u8>(), 0x5a, len) };
        Ok(Pinned { ptr, len })
    }
    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `len` initialised bytes owned by `self`, borrowed mutably once.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.cast::<u8>(), self.len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: memory from `cuMemHostAlloc`, freed once; no copy uses it any more (all synchronous).
        let _ = unsafe { raw::cuMemFreeHost(self.ptr) };
    }
}

struct Row {
    name: String,
    unit: &'static str,
    safe: f64,
    raw: f64,
    /// The median of the per-repetition ratios, where measured ([`race_paired`]).
    paired: Option<f64>,
    goal: &'static str,
}

impl Row {
    /// A time row in microseconds, from the seconds ([`race_paired`]'s or
    /// [`race_paired_shuffled`]'s median of each side, and the median ratio of the pairs).
    fn us(
        name: impl Into<String>,
        (safe, raw, paired): (f64, f64, f64),
        goal: &'static str,
    ) -> Row {
        Row {
            name: name.into(),
            unit: "us",
            safe: safe * 1e6,
            raw: raw * 1e6,
            paired: Some(paired),
            goal,
        }
    }

    /// A bandwidth row: `bytes` moved in the median seconds `safe` and `raw`, in GB/s.
    fn gbs(name: impl Into<String>, bytes: usize, safe: f64, raw: f64, goal: &'static str) -> Row {
        let rate = |t: f64| float(bytes) / t / 1e9;
        Row {
            name: name.into(),
            unit: "GB/s",
            safe: rate(safe),
            raw: rate(raw),
            paired: None,
            goal,
        }
    }

    /// With the paired ratio of a bandwidth row, from [`race_paired`]'s median ratio of *times*
    /// `safe / raw`: a rate's ratio is its reciprocal.
    fn with_paired_times(mut self, time_ratio: f64) -> Row {
        self.paired = Some(1.0 / time_ratio);
        self
    }
}

fn main() -> ExitCode {
    // NVLink SHARP off before NCCL reads its environment (it would create multicast objects).
    // SAFETY: the first statement of `main`: no other thread of this process runs yet.
    #[cfg(feature = "nccl")]
    unsafe {
        std::env::set_var("NCCL_NVLS_ENABLE", "0");
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> BenchResult<()> {
    match cuda_vmm::init() {
        Err(e) if e.is_no_gpu() => {
            println!("no CUDA device found (cuInit: {e}): nothing to measure.");
            return Ok(());
        }
        r => r?,
    }
    let devices = Device::all()?;
    let contexts: Vec<Context> = devices
        .iter()
        .map(|&d| Context::new(d))
        .collect::<Result<_, _>>()?;
    let (device, ctx) = (devices[0], &contexts[0]);
    println!(
        "bench on {} x {} (driver API {})",
        devices.len(),
        device.name()?,
        cuda_vmm::device::driver_version()?
    );
    let g = allocation_granularity(device, Granularity::Minimum)?;
    let mut rows = Vec::new();
    if let Some(mode) = std::env::args().nth(1)
        && run_mode(&mode, &contexts, g)?
    {
        return Ok(());
    }

    for (label, size, reps) in [("2 MiB", 2usize << 20, 2000), ("1 GiB", 1usize << 30, 300)] {
        let (safe, raw_t, paired) = race_paired(
            reps,
            || lifecycle_safe(ctx, size),
            || lifecycle_raw(ctx, size),
        )?;
        // The same raw calls against themselves: the bias and noise of this measurement.
        let (a, b, calibration) = race_paired(
            reps,
            || lifecycle_raw(ctx, size),
            || lifecycle_raw(ctx, size),
        )?;
        rows.push(Row {
            name: format!("lifecycle {label}, raw vs raw (us)"),
            unit: "us",
            safe: a * 1e6,
            raw: b * 1e6,
            paired: Some(calibration),
            goal: "calibration: ~1",
        });
        rows.push(Row {
            name: format!("lifecycle {label} (us)"),
            unit: "us",
            safe: safe * 1e6,
            raw: raw_t * 1e6,
            paired: Some(paired),
            goal: "safe/raw <= 1.01",
        });
    }

    let bytes = 256usize << 20;
    copies(ctx, bytes, g, &mut rows)?;
    churn(ctx, g, &mut rows)?;
    one_device_direct(ctx, bytes, &mut rows)?;
    staged_rows(&contexts, bytes, &mut rows)?;
    stream_rows(ctx, bytes, &mut rows)?;
    let mut not_run = Vec::new();
    owned_rows(ctx, g, &mut rows, &mut not_run)?;
    shareable_rows(ctx, g, &mut rows, &mut not_run)?;
    motion_rows(ctx, g, &mut rows)?;
    graph_decode_row(ctx, g, &mut rows)?;
    graph_rows(ctx, &mut rows)?;
    two_devices(&contexts, &mut rows, &mut not_run)?;
    host_and_ipc(ctx, &mut rows, &mut not_run)?;
    #[cfg(feature = "cudarc")]
    cudarc_rows(ctx, &mut rows, &mut not_run)?;
    #[cfg(feature = "nccl")]
    nccl_rows(ctx, &mut rows, &mut not_run)?;
    #[cfg(feature = "nccl")]
    nccl_two_rank_rows(&contexts, &mut rows, &mut not_run)?;

    report(&device.name()?, devices.len(), &rows, &not_run)
}

/// The modes that run a few rows (`bench motion`, `graph`, `elastic`, `shared`, `parts`, `seams`,
/// `nccl`): whether `mode` named one (and it ran), else the whole bench runs.
fn run_mode(mode: &str, contexts: &[Context], g: usize) -> BenchResult<bool> {
    let ctx = contexts.first().ok_or("no device")?;
    let device = ctx.device();
    let mut rows = Vec::new();
    if mode == "motion" {
        motion_rows(ctx, g, &mut rows)?;
        graph_decode_row(ctx, g, &mut rows)?;
        graph_rows(ctx, &mut rows)?;
        let mut not_run = Vec::new();
        shareable_rows(ctx, g, &mut rows, &mut not_run)?;
        report(&device.name()?, contexts.len(), &rows, &not_run)?;
        return Ok(true);
    }
    // The graph rows alone (`bench graph`): the decode engine as one graph over an elastic cache
    // against the same engine over a preallocated one, and the graph replays.
    if mode == "graph" {
        graph_decode_row(ctx, g, &mut rows)?;
        graph_rows(ctx, &mut rows)?;
        report(&device.name()?, contexts.len(), &rows, &[])?;
        return Ok(true);
    }
    // The rows of issue "elastic at static speed" alone (`bench elastic`): the decode loops with a
    // reserve, and the second mapping of a shared page.
    if mode == "elastic" {
        elastic_rows(ctx, g, &mut rows)?;
        report(&device.name()?, contexts.len(), &rows, &[])?;
        return Ok(true);
    }
    // The shared page's rows alone (`bench shared`).
    if mode == "shared" {
        shared_map_rows(ctx, g, &mut rows)?;
        report(&device.name()?, contexts.len(), &rows, &[])?;
        return Ok(true);
    }
    // Where the host's time goes in the host-bound elastic decode loop (`bench parts`): a report,
    // no goal.
    if mode == "parts" || mode == "parts-end" {
        elastic_parts(ctx, g, mode == "parts-end")?;
        return Ok(true);
    }
    // The rows of the paths that other code can queue work beside (`bench seams`): the scope
    // around a small copy, the graph replays, cudarc's scope and NCCL's.
    if mode == "seams" {
        // Only the cudarc and NCCL rows push to it.
        #[cfg_attr(not(feature = "cudarc"), allow(unused_mut))]
        let mut not_run = Vec::new();
        stream_rows(ctx, 256usize << 20, &mut rows)?;
        graph_rows(ctx, &mut rows)?;
        #[cfg(feature = "cudarc")]
        cudarc_rows(ctx, &mut rows, &mut not_run)?;
        #[cfg(feature = "nccl")]
        nccl_rows(ctx, &mut rows, &mut not_run)?;
        report(&device.name()?, contexts.len(), &rows, &not_run)?;
        return Ok(true);
    }
    #[cfg(feature = "nccl")]
    if mode == "nccl" {
        let mut not_run = Vec::new();
        nccl_rows(ctx, &mut rows, &mut not_run)?;
        nccl_two_rank_rows(contexts, &mut rows, &mut not_run)?;
        report(&device.name()?, contexts.len(), &rows, &not_run)?;
        return Ok(true);
    }
    Ok(false)
}

/// Prints the table (and the rows that could not run) and writes the JSON.
fn report(device: &str, devices: usize, rows: &[Row], not_run: &[String]) -> BenchResult<()> {
    let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(0).max(6);
    println!(
        "\n{:<width$} {:>12} {:>12} {:>8} {:>8}  goal",
        "figure", "safe", "raw", "ratio", "paired"
    );
    let mut json = String::from("{\n  \"device\": ");
    write!(
        json,
        "{device:?},\n  \"devices\": {devices},\n  \"rows\": [\n"
    )?;
    for (i, r) in rows.iter().enumerate() {
        let ratio = r.safe / r.raw;
        let paired = r
            .paired
            .map_or_else(|| "-".to_owned(), |p| format!("{p:.4}"));
        println!(
            "{:<width$} {:>12.3} {:>12.3} {:>8.4} {:>8}  {}",
            r.name, r.safe, r.raw, ratio, paired, r.goal
        );
        let comma = if i + 1 < rows.len() { "," } else { "" };
        let paired = r
            .paired
            .map_or_else(|| "null".to_owned(), |p| format!("{p:.5}"));
        writeln!(
            json,
            "    {{\"figure\": {:?}, \"unit\": {:?}, \"safe\": {:.4}, \"raw\": {:.4}, \"ratio\": {:.5}, \"paired_ratio\": {paired}, \"goal\": {:?}}}{comma}",
            r.name, r.unit, r.safe, r.raw, ratio, r.goal
        )?;
    }
    json.push_str("  ],\n  \"not_run\": [");
    for (i, why) in not_run.iter().enumerate() {
        println!("not run: {why}");
        let comma = if i + 1 < not_run.len() { "," } else { "" };
        write!(json, "\n    {why:?}{comma}")?;
    }
    json.push_str(if not_run.is_empty() {
        "]\n}\n"
    } else {
        "\n  ]\n}\n"
    });
    let path = std::env::var("BENCH_JSON").unwrap_or_else(|_| "bench.json".to_owned());
    std::fs::write(&path, json)?;
    println!("\nJSON written to {path}");
    Ok(())
}

fn lifecycle_safe(ctx: &Context, size: usize) -> BenchResult<()> {
    let memory = PhysicalAllocation::new(ctx.device(), size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut region = reservation.region();
    let mut mapping = region.map(&memory)?;
    mapping.grant(ctx, ReadWrite)?;
    mapping.unmap()?;
    reservation.free()?;
    memory.release()?;
    Ok(())
}

fn lifecycle_raw(ctx: &Context, size: usize) -> BenchResult<()> {
    let (prop, desc) = page_props(ctx.device());
    let (mut handle, mut ptr) = (0u64, 0u64);
    // SAFETY: the same calls the safe API makes, in the documented order, on resources made here.
    unsafe {
        ok(raw::cuMemCreate(&raw mut handle, size, &raw const prop, 0))?;
        ok(raw::cuMemAddressReserve(&raw mut ptr, size, 0, 0, 0))?;
        ok(raw::cuMemMap(ptr, size, 0, handle, 0))?;
        ok(raw::cuMemSetAccess(ptr, size, &raw const desc, 1))?;
        ok(raw::cuMemUnmap(ptr, size))?;
        ok(raw::cuMemAddressFree(ptr, size))?;
        ok(raw::cuMemRelease(handle))?;
    }
    Ok(())
}

fn copies(ctx: &Context, bytes: usize, granularity: usize, rows: &mut Vec<Row>) -> BenchResult<()> {
    let size = cuda_vmm::align_size(bytes, granularity)?;
    let first = PhysicalAllocation::new(ctx.device(), size)?;
    let second = PhysicalAllocation::new(ctx.device(), size)?;
    let (mut res1, mut res2) = (
        VirtualReservation::new(size, 0)?,
        VirtualReservation::new(size, 0)?,
    );
    let (mut region1, mut region2) = (res1.region(), res2.region());
    let (mut map1, mut map2) = (region1.map(&first)?, region2.map(&second)?);
    let mut dst = map1.grant(ctx, ReadWrite)?;
    let src = map2.grant(ctx, ReadWrite)?;
    let (dst_ptr, src_ptr) = (dst.as_raw_ptr(), src.as_raw_ptr());
    let mut host = Pinned::new(ctx, bytes)?;
    let host_ptr = host.ptr;
    let reps = 30;

    // Untimed copies both ways first: without them the first row measured half the rate the same
    // copy reached one row later (a warm-up of the link or the clocks, not of the copy).
    let warm = Instant::now();
    while warm.elapsed().as_secs_f64() < 1.0 {
        download(&src, &mut host, bytes)?;
        upload(&mut dst, &mut host, bytes)?;
    }

    let (safe, raw_t) = race(
        reps,
        || upload(&mut dst, &mut host, bytes),
        // SAFETY: `dst_ptr` is `bytes` of granted memory; `host_ptr` is `bytes` of pinned memory;
        // both outlive the race, and the safe closure runs only between raw ones.
        || unsafe { raw_htod(ctx, dst_ptr, host_ptr, bytes) },
    )?;
    rows.push(Row::gbs(
        "host -> device, pinned (GB/s)",
        bytes,
        safe,
        raw_t,
        "safe/raw >= 0.99",
    ));

    // SAFETY: `dst_ptr` is `dst`'s granted range of at least `bytes`, `host_ptr` is `host`'s `bytes`
    // of pinned memory; both live until the end of this function, and nothing else uses them meanwhile.
    unsafe { destination_kind(ctx, dst_ptr, host_ptr, bytes, reps, rows) }?;

    let (safe, raw_t) = race(
        reps,
        || download(&src, &mut host, bytes),
        // SAFETY: as above, the other way; cuMemcpyDtoH returns when finished.
        || unsafe {
            ok(raw::cuCtxSetCurrent(ctx.as_raw().cast()))?;
            ok(raw::cuMemcpyDtoH_v2(host_ptr, src_ptr, bytes))
        },
    )?;
    rows.push(Row::gbs(
        "device -> host, pinned (GB/s)",
        bytes,
        safe,
        raw_t,
        "safe/raw >= 0.99",
    ));

    let (safe, raw_t) = race(
        reps,
        || {
            Ok(dst
                .slice_mut::<u8>()?
                .slice_mut(..bytes)?
                .copy_from_device(&src.slice::<u8>()?.slice(..bytes)?)?)
        },
        // SAFETY: two granted ranges of `bytes`; waited for below.
        || unsafe {
            ok(raw::cuCtxSetCurrent(ctx.as_raw().cast()))?;
            ok(raw::cuMemcpyDtoD_v2(dst_ptr, src_ptr, bytes))?;
            ok(raw::cuStreamSynchronize(core::ptr::null_mut()))
        },
    )?;
    rows.push(Row::gbs(
        "device -> device (GB/s)",
        bytes,
        safe,
        raw_t,
        "safe/raw >= 0.99",
    ));
    Ok(())
}

/// The safe host-to-device copy of `bytes` from `host` into the start of `dst`.
fn upload(dst: &mut Access<'_, ReadWrite>, host: &mut Pinned, bytes: usize) -> BenchResult<()> {
    Ok(dst
        .slice_mut::<u8>()?
        .slice_mut(..bytes)?
        .copy_from_host(host.bytes())?)
}

/// The safe device-to-host copy of the first `bytes` of `src` into `host`.
fn download(src: &Access<'_, ReadWrite>, host: &mut Pinned, bytes: usize) -> BenchResult<()> {
    Ok(src
        .slice::<u8>()?
        .slice(..bytes)?
        .copy_to_host(host.bytes())?)
}

/// The raw host-to-device copy the safe `copy_from_host` makes: `cuMemcpyHtoD` in `ctx`, then a wait.
///
/// # Safety
/// `dst` must be `bytes` of device memory reachable from `ctx`'s device and `host` `bytes` of
/// readable host memory, both alive and otherwise unused until this returns.
unsafe fn raw_htod(ctx: &Context, dst: u64, host: *mut c_void, bytes: usize) -> BenchResult<()> {
    // SAFETY: `ctx` is a retained context.
    ok(unsafe { raw::cuCtxSetCurrent(ctx.as_raw().cast()) })?;
    // SAFETY: the caller's guarantee; the copy is waited for just below, before anything is freed.
    ok(unsafe { raw::cuMemcpyHtoD_v2(dst, host, bytes) })?;
    // SAFETY: no arguments but the legacy stream of the current context.
    ok(unsafe { raw::cuStreamSynchronize(core::ptr::null_mut()) })
}

/// The destination's kind, raw against raw: the same pinned source copied into the VMM mapping at
/// `dst_ptr` and into an ordinary `cuMemAlloc` buffer, so the host-link figures of different rows
/// compare.
///
/// # Safety
/// `dst_ptr` must be `bytes` of device memory granted to `ctx`'s device and `host_ptr` `bytes` of
/// pinned host memory, both alive and otherwise unused until this returns.
unsafe fn destination_kind(
    ctx: &Context,
    dst_ptr: u64,
    host_ptr: *mut c_void,
    bytes: usize,
    reps: usize,
    rows: &mut Vec<Row>,
) -> BenchResult<()> {
    let mut plain = DeviceBuffer::<u8>::zeroed(ctx, bytes)?;
    let plain_ptr = plain.as_mut_slice().as_raw_ptr();
    let (vmm_t, plain_t) = race(
        reps,
        // SAFETY: the caller's guarantee for `dst_ptr` and `host_ptr`.
        || unsafe { raw_htod(ctx, dst_ptr, host_ptr, bytes) },
        // SAFETY: `plain_ptr` is `bytes` of `cuMemAlloc` memory owned by `plain`, which outlives
        // the race; `host_ptr` as above.
        || unsafe { raw_htod(ctx, plain_ptr, host_ptr, bytes) },
    )?;
    rows.push(Row::gbs(
        "host -> device raw, VMM vs cuMemAlloc dst (GB/s)",
        bytes,
        vmm_t,
        plain_t,
        "report",
    ));
    Ok(())
}

fn churn(ctx: &Context, g: usize, rows: &mut Vec<Row>) -> BenchResult<()> {
    let chunks = 64;
    let memory: Vec<PhysicalAllocation> = (0..chunks)
        .map(|_| PhysicalAllocation::new(ctx.device(), g))
        .collect::<Result<_, _>>()?;
    let mut reservation = VirtualReservation::new(chunks * g, 0)?;
    let base = reservation.base();
    let desc = raw::AccessDesc {
        location: raw::Location {
            type_: 1,
            id: ctx.device().as_raw(),
        },
        flags: 3,
    };
    let (safe, raw_t, paired) = race_paired(
        50,
        || {
            let mut region = reservation.region();
            let mut mapped = Vec::with_capacity(chunks);
            for m in &memory {
                let mut mapping = region.map(m)?;
                mapping.grant(ctx, ReadWrite)?;
                mapped.push(mapping);
            }
            // Dropping unmaps each mapping, as the raw loop below does.
            drop(mapped);
            Ok(())
        },
        || {
            for (i, m) in memory.iter().enumerate() {
                let at = base + (i * g) as u64;
                // SAFETY: `at` is a free granule of the reservation (the safe run unmapped all before).
                unsafe {
                    ok(raw::cuMemMap(at, g, 0, m.as_raw(), 0))?;
                    ok(raw::cuMemSetAccess(at, g, &raw const desc, 1))?;
                }
            }
            for i in 0..chunks {
                // SAFETY: unmaps what the loop above mapped.
                unsafe { ok(raw::cuMemUnmap(base + (i * g) as u64, g))? };
            }
            Ok(())
        },
    )?;
    let per_s = |t: f64| float(chunks) / t;
    rows.push(Row {
        name: format!("churn map+grant+unmap {} MiB (ops/s)", g >> 20),
        unit: "ops/s",
        safe: per_s(safe),
        raw: per_s(raw_t),
        // A rate: the reciprocal of the median time ratio.
        paired: Some(1.0 / paired),
        goal: "safe/raw >= 0.99",
    });
    Ok(())
}

/// Untimed runs of `safe` and `raw`, alternating, for at least `seconds` (and at least once each),
/// before a row group: the first copies over a link, or on a device idle until then, measure a warm-up
/// of the link or the clocks (see [`copies`]), not the copy.
fn warm_up(
    seconds: f64,
    safe: &mut impl FnMut() -> BenchResult<()>,
    raw: &mut impl FnMut() -> BenchResult<()>,
) -> BenchResult<()> {
    let start = Instant::now();
    loop {
        safe()?;
        raw()?;
        if start.elapsed().as_secs_f64() >= seconds {
            return Ok(());
        }
    }
}

/// `"GPU s -> GPU d"`, for row names.
fn pair_label(src: &Context, dst: &Context) -> String {
    format!(
        "GPU {} -> GPU {}",
        src.device().ordinal(),
        dst.device().ordinal()
    )
}

/// The single-device direct row: `copy_between` with `Route::Direct` between two buffers of `ctx`'s
/// device against the calls it makes, `cuMemcpyDtoD` and a wait on the legacy stream.
fn one_device_direct(ctx: &Context, bytes: usize, rows: &mut Vec<Row>) -> BenchResult<()> {
    let src = DeviceBuffer::<u8>::zeroed(ctx, bytes)?;
    let mut dst = DeviceBuffer::<u8>::zeroed(ctx, bytes)?;
    let (dst_ptr, src_ptr) = (dst.as_mut_slice().as_raw_ptr(), src.as_slice().as_raw_ptr());
    let mut safe = || -> BenchResult<()> {
        copy_between(&mut dst.as_mut_slice(), &src.as_slice(), Route::Direct)?;
        Ok(())
    };
    let mut raw = || -> BenchResult<()> {
        // SAFETY: `dst_ptr` and `src_ptr` are two `cuMemAlloc` buffers of `bytes` in `ctx`, owned by
        // `dst` and `src`, which outlive the closure; the safe closure runs only between raw runs,
        // and the copy is waited for before this returns.
        unsafe {
            ok(raw::cuCtxSetCurrent(ctx.as_raw().cast()))?;
            ok(raw::cuMemcpyDtoD_v2(dst_ptr, src_ptr, bytes))?;
            ok(raw::cuStreamSynchronize(core::ptr::null_mut()))
        }
    };
    warm_up(0.2, &mut safe, &mut raw)?;
    let (safe_t, raw_t, paired) = race_paired(30, &mut safe, &mut raw)?;
    rows.push(
        Row::gbs(
            format!(
                "{} direct {} MiB, copy_between vs cuMemcpyDtoD (GB/s)",
                pair_label(ctx, ctx),
                bytes >> 20
            ),
            bytes,
            safe_t,
            raw_t,
            "safe/raw >= 0.99",
        )
        .with_paired_times(paired),
    );
    Ok(())
}

/// The staged path from the first device to the second (to itself where there is one): a new
/// `Staging` per copy against a reused one, and the reused one against the slower of its two host
/// legs timed alone.
fn staged_rows(contexts: &[Context], bytes: usize, rows: &mut Vec<Row>) -> BenchResult<()> {
    let (src_ctx, dst_ctx) = match contexts {
        [only] => (only, only),
        [a, b, ..] => (a, b),
        [] => return Ok(()),
    };
    let label = pair_label(src_ctx, dst_ctx);
    let src = DeviceBuffer::<u8>::zeroed(src_ctx, bytes)?;
    let mut dst = DeviceBuffer::<u8>::zeroed(dst_ctx, bytes)?;
    let mut host = Pinned::new(src_ctx, bytes)?;
    let mut staging = Staging::new(src_ctx, STAGING_CHUNK_BYTES)?;
    let reps = 20;

    // Both host legs, untimed: on two GPUs the second one has been idle until here.
    warm_up(
        0.5,
        &mut || staged_copy(&mut dst, &src, &mut staging),
        &mut || Ok(src.as_slice().copy_to_host(host.bytes())?),
    )?;
    let (staged, down) = race(
        reps,
        || staged_copy(&mut dst, &src, &mut staging),
        || Ok(src.as_slice().copy_to_host(host.bytes())?),
    )?;
    let (one_shot, _) = race(
        reps,
        || Ok(copy_between(&mut dst.as_mut_slice(), &src.as_slice(), Route::Staged).map(|_| ())?),
        || Ok(()),
    )?;
    let (up, _) = race(
        reps,
        || Ok(dst.as_mut_slice().copy_from_host(host.bytes())?),
        || Ok(()),
    )?;
    let slower_leg = down.max(up);
    let mib = bytes >> 20;
    rows.push(Row::gbs(
        format!("{label} staged {mib} MiB, new vs reused staging (GB/s)"),
        bytes,
        one_shot,
        staged,
        "report",
    ));
    rows.push(Row::gbs(
        format!("{label} staged {mib} MiB vs slower host leg (GB/s)"),
        bytes,
        staged,
        slower_leg,
        "staged/slower leg: ~1 when overlapped",
    ));
    Ok(())
}

/// The staged copy of all of `src` into `dst` through the reused `staging`.
fn staged_copy(
    dst: &mut DeviceBuffer<u8>,
    src: &DeviceBuffer<u8>,
    staging: &mut Staging,
) -> BenchResult<()> {
    copy_between_with(
        &mut dst.as_mut_slice(),
        &src.as_slice(),
        Route::Staged,
        staging,
    )?;
    Ok(())
}

/// The `NVLink` 4 peak of one direction (18 links), in bytes per second.
const NVLINK4_PEAK: f64 = 450e9;
const GIB: usize = 1 << 30;
/// The sizes of the direct rows between two GPUs, with their repetitions.
const PEER_SIZES: [(&str, usize, usize); 3] = [
    ("64 MiB", 64 << 20, 200),
    ("256 MiB", 256 << 20, 100),
    ("1 GiB", GIB, 50),
];

/// The rows between GPU 0 and GPU 1: each direction where the destination can access the source
/// (direct copies of `cuMemAlloc` memory under a peer guard, the same at 1 GiB against the `NVLink`
/// peak, and from VMM memory granted to both), then the reference row without any access. Where a row
/// cannot run, a line in `not_run` says why.
fn two_devices(
    contexts: &[Context],
    rows: &mut Vec<Row>,
    not_run: &mut Vec<String>,
) -> BenchResult<()> {
    let [c0, c1, ..] = contexts else {
        not_run.push(
            "the GPU 0 <-> GPU 1 rows (direct over the link against cuMemcpyPeer and against the \
             NVLink peak, from VMM memory, and the copy without access): one device only"
                .to_owned(),
        );
        return Ok(());
    };
    let mut on0 = DeviceBuffer::<u8>::zeroed(c0, GIB)?;
    let mut on1 = DeviceBuffer::<u8>::zeroed(c1, GIB)?;
    direction(&on0, &mut on1, rows, not_run)?;
    direction(&on1, &mut on0, rows, not_run)?;
    without_access(&on0, &mut on1, rows)
}

/// The direct rows of one direction, `src`'s device to `dst`'s, where `cuDeviceCanAccessPeer(dst, src)`
/// says yes.
fn direction(
    src: &DeviceBuffer<u8>,
    dst: &mut DeviceBuffer<u8>,
    rows: &mut Vec<Row>,
    not_run: &mut Vec<String>,
) -> BenchResult<()> {
    let (src_ctx, dst_ctx) = (src.context(), dst.context());
    let label = pair_label(src_ctx, dst_ctx);
    if can_access_peer(dst_ctx.device(), src_ctx.device())?.is_none() {
        not_run.push(format!(
            "{label} direct rows (peer view, against the NVLink peak, from VMM memory): \
             cuDeviceCanAccessPeer({}, {}) says no",
            dst_ctx.device().ordinal(),
            src_ctx.device().ordinal()
        ));
        return Ok(());
    }
    peer_view_rows(src, dst, &label, rows)?;
    vmm_row(src_ctx, dst, &label, rows)
}

/// Direct copies of `cuMemAlloc` memory: the destination's context opens the source's (one guard for
/// the whole group), and `copy_between` with `Route::Direct` from the peer view races raw
/// `cuMemcpyPeer` under the same enablement, at each of [`PEER_SIZES`]; then the 1 GiB figure against
/// the `NVLink` peak. The guard is disabled at the end, with its error reported.
fn peer_view_rows(
    src: &DeviceBuffer<u8>,
    dst: &mut DeviceBuffer<u8>,
    label: &str,
    rows: &mut Vec<Row>,
) -> BenchResult<()> {
    let src_ctx = src.context();
    // A clone of `dst`'s context (a share of its retain), so that it is not a borrow of `dst`, which
    // the safe side borrows mutably.
    let dst_ctx = &dst.context().clone();
    // Once for the group: enabling costs about 10 ms (the driver maps every allocation of the peer),
    // far more than a copy. The raw side runs under this same enablement.
    let guard = PeerAccess::open(dst_ctx, src_ctx)?;
    let view = src.peer_slice(&guard)?;
    let (dst_ptr, src_ptr) = (dst.as_mut_slice().as_raw_ptr(), view.as_raw_ptr());
    warm_up(
        0.5,
        &mut || pull(dst, &view, GIB),
        // SAFETY: `dst_ptr` is `dst`'s `GIB` bytes of `cuMemAlloc` memory in `dst_ctx`, `src_ptr`
        // `src`'s in `src_ctx`; both buffers outlive this function, nothing else uses them meanwhile
        // (the safe closure runs only between raw runs), and peer access is enabled by `guard`.
        &mut || unsafe { raw_peer(dst_ctx, dst_ptr, src_ctx, src_ptr, GIB) },
    )?;
    let mut at_one_gib = None;
    for (size, n, reps) in PEER_SIZES {
        let (safe_t, raw_t, paired) = race_paired(
            reps,
            || pull(dst, &view, n),
            // SAFETY: as for the warm-up above; `n <= GIB`.
            || unsafe { raw_peer(dst_ctx, dst_ptr, src_ctx, src_ptr, n) },
        )?;
        rows.push(
            Row::gbs(
                format!("{label} direct {size}, peer view vs cuMemcpyPeer (GB/s)"),
                n,
                safe_t,
                raw_t,
                "safe/raw >= 0.99",
            )
            .with_paired_times(paired),
        );
        if n == GIB {
            at_one_gib = Some(safe_t);
        }
    }
    guard.disable()?;
    if let Some(safe_t) = at_one_gib {
        rows.push(Row::gbs(
            format!("{label} direct 1 GiB vs NVLink 4 peak 450 (GB/s)"),
            GIB,
            safe_t,
            float(GIB) / NVLINK4_PEAK,
            "safe/peak >= 0.85",
        ));
    }
    Ok(())
}

/// The safe direct copy of the first `n` bytes of `src` (a view open to `dst`'s device) into `dst`.
fn pull(dst: &mut DeviceBuffer<u8>, src: &DeviceSlice<'_, u8>, n: usize) -> BenchResult<()> {
    copy_between(
        &mut dst.as_mut_slice().slice_mut(..n)?,
        &src.slice(..n)?,
        Route::Direct,
    )?;
    Ok(())
}

/// The raw copy of the direct rows: `cuMemcpyPeer` with the destination's context current, then
/// `cuCtxSynchronize` there. The safe path waits on the destination's context too: its `cuMemcpyDtoD`
/// runs there, followed by `cuStreamSynchronize` of the legacy stream.
///
/// # Safety
/// `dst` must be `bytes` of device memory of `dst_ctx`'s device and `src` `bytes` of device memory
/// `src_ctx`'s device can read, both alive and otherwise unused until this returns.
unsafe fn raw_peer(
    dst_ctx: &Context,
    dst: u64,
    src_ctx: &Context,
    src: u64,
    bytes: usize,
) -> BenchResult<()> {
    // SAFETY: `dst_ctx` is a retained context, borrowed for the call.
    ok(unsafe { raw::cuCtxSetCurrent(dst_ctx.as_raw().cast()) })?;
    // SAFETY: the caller's guarantee for both ranges; both contexts are retained (borrowed). The copy
    // is waited for just below, before either range can be freed.
    ok(unsafe {
        raw::cuMemcpyPeer(
            dst,
            dst_ctx.as_raw().cast(),
            src,
            src_ctx.as_raw().cast(),
            bytes,
        )
    })?;
    // SAFETY: no arguments; `dst_ctx` is current. For device-to-device copies `cuMemcpyPeer` is
    // asynchronous to the host but serialised with all work of the current, source and destination
    // contexts (the driver API's docs), so this returns when the copy has finished.
    ok(unsafe { raw::cuCtxSynchronize() })
}

/// Direct copies from VMM memory: physical memory on `src_ctx`'s device in one reservation and one
/// mapping, granted to both devices (`grant_all`, no context peer access), copied into `dst` with
/// `copy_between` and `Route::Direct`, against raw `cuMemcpyPeer` from the same address.
fn vmm_row(
    src_ctx: &Context,
    dst: &mut DeviceBuffer<u8>,
    label: &str,
    rows: &mut Vec<Row>,
) -> BenchResult<()> {
    // A clone of `dst`'s context (a share of its retain), so that it is not a borrow of `dst`, which
    // the safe side borrows mutably.
    let dst_ctx = &dst.context().clone();
    let granularity = allocation_granularity(src_ctx.device(), Granularity::Minimum)?;
    let size = cuda_vmm::align_size(GIB, granularity)?;
    let memory = PhysicalAllocation::new(src_ctx.device(), size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut region = reservation.region();
    let mut mapping = region.map(&memory)?;
    let both = [src_ctx, dst_ctx];
    let access = mapping.grant_all(&both, ReadWrite)?;
    // Copies through `src_ctx` (the first granted), reachable from both devices.
    let view = access.slice::<u8>()?.slice(..GIB)?;
    let (dst_ptr, src_ptr) = (dst.as_mut_slice().as_raw_ptr(), view.as_raw_ptr());
    let mut safe = || pull(dst, &view, GIB);
    // SAFETY: `dst_ptr` is `dst`'s `GIB` bytes of `cuMemAlloc` memory in `dst_ctx`; `src_ptr` is
    // `GIB` bytes of `mapping`, granted to both devices by `access`; all outlive the closure, and
    // nothing else uses them meanwhile (the safe closure runs only between raw runs).
    let mut raw = || unsafe { raw_peer(dst_ctx, dst_ptr, src_ctx, src_ptr, GIB) };
    warm_up(0.25, &mut safe, &mut raw)?;
    let (safe_t, raw_t, paired) = race_paired(50, &mut safe, &mut raw)?;
    rows.push(
        Row::gbs(
            format!("{label} direct 1 GiB, VMM src granted to both vs cuMemcpyPeer (GB/s)"),
            GIB,
            safe_t,
            raw_t,
            "safe/raw >= 0.99",
        )
        .with_paired_times(paired),
    );
    Ok(())
}

/// The reference row, with no access in either direction (no guard, no grant): the crate's
/// `Route::Auto` on plain views, which stages through a reused `Staging`, against raw `cuMemcpyPeer`,
/// which the driver then stages itself (the old call of `Route::Direct`).
fn without_access(
    src: &DeviceBuffer<u8>,
    dst: &mut DeviceBuffer<u8>,
    rows: &mut Vec<Row>,
) -> BenchResult<()> {
    let src_ctx = src.context();
    // A clone of `dst`'s context (a share of its retain), so that it is not a borrow of `dst`, which
    // the safe side borrows mutably.
    let dst_ctx = &dst.context().clone();
    // Every guard of this bench has ended (disabled, with its error reported); ask the driver too.
    ensure_access_off(dst_ctx, src_ctx)?;
    ensure_access_off(src_ctx, dst_ctx)?;
    let mut staging = Staging::new(src_ctx, STAGING_CHUNK_BYTES)?;
    let plain = src.as_slice();
    let (dst_ptr, src_ptr) = (dst.as_mut_slice().as_raw_ptr(), plain.as_raw_ptr());
    let mut safe = || -> BenchResult<()> {
        let path = copy_between_with(&mut dst.as_mut_slice(), &plain, Route::Auto, &mut staging)?;
        if path == CopyPath::Staged {
            Ok(())
        } else {
            Err(format!("Route::Auto between plain views took {path:?}, not Staged").into())
        }
    };
    let mut raw = || -> BenchResult<()> {
        // SAFETY: `dst_ptr` is `dst`'s `GIB` bytes of `cuMemAlloc` memory in `dst_ctx`, `src_ptr`
        // `src`'s in `src_ctx` (the driver reaches it by staging); both outlive the closure and
        // nothing else uses them meanwhile.
        unsafe { raw_peer(dst_ctx, dst_ptr, src_ctx, src_ptr, GIB) }?;
        // The driver's own staging involves both devices: wait on the source's context as well, so
        // the figure surely covers the whole copy (microseconds against tens of milliseconds).
        Ok(src_ctx.synchronize()?)
    };
    warm_up(0.2, &mut safe, &mut raw)?;
    let (safe_t, raw_t, paired) = race_paired(20, &mut safe, &mut raw)?;
    rows.push(
        Row::gbs(
            format!(
                "{} 1 GiB, crate Auto without access (staged) vs driver's hidden staging (cuMemcpyPeer) (GB/s)",
                pair_label(src_ctx, dst_ctx)
            ),
            GIB,
            safe_t,
            raw_t,
            "report",
        )
        .with_paired_times(paired),
    );
    Ok(())
}

/// Makes sure context peer access `from -> to` is off, asking the driver: `cuCtxDisablePeerAccess`
/// answers 705 (`PEER_ACCESS_NOT_ENABLED`) where it is. Where it answers 0 instead, access was still
/// on (no guard of this bench leaves it so); it is off now, and a line says so. A direction the driver
/// reports no link for cannot have been enabled, and is not asked.
fn ensure_access_off(from: &Context, to: &Context) -> BenchResult<()> {
    if can_access_peer(from.device(), to.device())?.is_none() {
        return Ok(());
    }
    from.bind_to_thread()?;
    // SAFETY: `from` is current (bound just above) and `to` is a retained context (borrowed). No peer
    // guard of this bench is live here (each was disabled before its function returned), so no view
    // relies on this access.
    let code = unsafe { raw::cuCtxDisablePeerAccess(to.as_raw().cast()) };
    match DriverError::from_raw(code) {
        Some(e) if e == DriverError::PEER_ACCESS_NOT_ENABLED => Ok(()),
        None => {
            println!(
                "note: peer access GPU {} -> GPU {} was still enabled; disabled for the row without access",
                from.device().ordinal(),
                to.device().ordinal()
            );
            Ok(())
        }
        Some(e) => Err(e.into()),
    }
}

// Host memory and memory shared between processes: each row needs its own device support, and says
// why where it cannot run.

/// Device reads of host-located VMM memory against pinned memory, and the latency of sharing an
/// allocation (export, send, import, map) against the raw calls.
fn host_and_ipc(ctx: &Context, rows: &mut Vec<Row>, not_run: &mut Vec<String>) -> BenchResult<()> {
    host_reads(ctx, rows, not_run)?;
    #[cfg(unix)]
    ipc_latency(ctx, rows, not_run)?;
    Ok(())
}

/// 256 MiB read by the device from host memory: a host-located VMM mapping granted to the device,
/// copied into device memory with `copy_from_device` (a `cuMemcpyDtoD` whose source is host memory),
/// against `cuMemcpyHtoD` from pinned `cuMemHostAlloc` memory into the same buffer.
fn host_reads(ctx: &Context, rows: &mut Vec<Row>, not_run: &mut Vec<String>) -> BenchResult<()> {
    use cuda_vmm::{host::HostAllocation, vmm::AllocationOptions};
    let device = ctx.device();
    let bytes = 256usize << 20;
    let (options, label) = if device.supports_host_numa_memory()? {
        let node = device.host_numa_node()?.unwrap_or(0);
        (AllocationOptions::host_numa(node), "host NUMA")
    } else if device.supports_host_memory()? {
        (AllocationOptions::host(), "host")
    } else {
        not_run.push("device reads of host VMM memory: the device supports none".to_owned());
        return Ok(());
    };
    let size = cuda_vmm::align_size(bytes, options.granularity(Granularity::Minimum)?)?;
    let mut memory = match options.location {
        cuda_vmm::vmm::Location::HostNuma(node) => {
            HostAllocation::on_numa_node(device, node, size)?
        }
        _ => HostAllocation::new(device, size)?,
    };
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut region = reservation.region();
    let mut mapping = region.map_host(&mut memory)?;
    mapping
        .grant_host(ReadWrite)?
        .as_mut_slice::<u8>()?
        .fill(0x5a);
    let access = mapping.grant(ctx, ReadWrite)?;
    let src = access.slice::<u8>()?;
    let mut dst = DeviceBuffer::<u8>::zeroed(ctx, size)?;
    let dst_ptr = dst.as_slice().as_raw_ptr();
    let pinned = Pinned::new(ctx, size)?;
    let host_ptr = pinned.ptr;
    let raw_copy = || -> BenchResult<()> {
        ctx.bind_to_thread()?;
        // SAFETY: `size` bytes of pinned host memory into a device buffer of `size` bytes, both alive
        // for the call; the stream synchronisation makes the copy finished before either is touched.
        unsafe {
            ok(raw::cuMemcpyHtoD_v2(dst_ptr, host_ptr, size))?;
            ok(raw::cuStreamSynchronize(core::ptr::null_mut()))?;
        }
        Ok(())
    };
    let (safe, raw_t) = race(
        20,
        || Ok(dst.as_mut_slice().copy_from_device(&src)?),
        raw_copy,
    )?;
    rows.push(Row::gbs(
        format!(
            "device reads {} MiB of {label} memory: VMM mapping (copy_from_device) against pinned cuMemHostAlloc (cuMemcpyHtoD), GB/s",
            size >> 20
        ),
        size,
        safe,
        raw_t,
        "report",
    ));
    Ok(())
}

/// The driver calls of sharing an allocation, with integer results.
#[cfg(unix)]
mod raw_ipc {
    use core::ffi::c_void;
    unsafe extern "C" {
        pub(crate) fn cuMemExportToShareableHandle(
            shareable: *mut c_void,
            handle: u64,
            handle_type: u32,
            flags: u64,
        ) -> u32;
        pub(crate) fn cuMemImportFromShareableHandle(
            handle: *mut u64,
            os_handle: *mut c_void,
            handle_type: u32,
        ) -> u32;
    }
}

/// Export, send over a socket pair, receive, import, map (then unmap and release the import) of one
/// 2 MiB allocation in one process: the safe API (which also checks the message, the device and the
/// driver's location of the memory) against the same driver calls and a bare `sendmsg` / `recvmsg`.
#[cfg(unix)]
fn ipc_latency(ctx: &Context, rows: &mut Vec<Row>, not_run: &mut Vec<String>) -> BenchResult<()> {
    use cuda_vmm::{
        ipc::ExportInfo, ipc::ExportedAllocation, ipc::PosixFd, ipc::ShareableAllocation,
    };
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::net::UnixStream;

    let device = ctx.device();
    if !device.supports_posix_fd_handles()? {
        not_run.push("export + send + import + map: no POSIX-fd shareable memory".to_owned());
        return Ok(());
    }
    let g = allocation_granularity(device, Granularity::Minimum)?;
    let memory = ShareableAllocation::<PosixFd>::new(device, g)?;
    let (near_end, far_end) = UnixStream::pair()?;
    let mut reservation = VirtualReservation::new(g, 0)?;
    let va = reservation.base();
    let mut safe = || -> BenchResult<()> {
        let exported = memory.export()?;
        exported.send(&near_end)?;
        drop(exported);
        let received = ExportedAllocation::receive(&far_end)?;
        let imported = received.import()?;
        drop(received);
        let mut region = reservation.region();
        region.map(&imported)?.unmap()?;
        imported.release()?;
        Ok(())
    };
    if let Err(e) = safe() {
        not_run.push(format!("export + send + import + map in one process: {e}"));
        return Ok(());
    }
    let info = ExportInfo::new(g, device.ordinal(), g)?.to_bytes();
    let raw_share = || -> BenchResult<()> {
        let mut fd: i32 = -1;
        // SAFETY: the driver writes one `int` through the pointer; the handle is `memory`'s, alive.
        ok(unsafe {
            raw_ipc::cuMemExportToShareableHandle((&raw mut fd).cast(), memory.as_raw(), 1, 0)
        })?;
        // SAFETY: the driver has just opened `fd` for the caller.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        raw_send(&near_end, &info, &fd)?;
        drop(fd);
        let received = raw_receive(&far_end)?;
        let fd_value = usize::try_from(received.as_raw_fd())?;
        let mut handle = 0u64;
        // SAFETY: the descriptor's value in the pointer argument, as the driver takes a POSIX fd;
        // `handle` is writable. Then the calls the safe API makes, on the range reserved above.
        unsafe {
            ok(raw_ipc::cuMemImportFromShareableHandle(
                &raw mut handle,
                core::ptr::without_provenance_mut(fd_value),
                1,
            ))?;
            drop(received);
            ok(raw::cuMemMap(va, g, 0, handle, 0))?;
            ok(raw::cuMemUnmap(va, g))?;
            ok(raw::cuMemRelease(handle))?;
        }
        Ok(())
    };
    let (safe_t, raw_t, paired) = race_paired(2000, safe, raw_share)?;
    rows.push(Row {
        name: "export + send + import + map (+ unmap, release), 2 MiB, one process (us)".to_owned(),
        unit: "us",
        safe: safe_t * 1e6,
        raw: raw_t * 1e6,
        paired: Some(paired),
        goal: "safe/raw <= 1.01",
    });
    Ok(())
}

/// A bare `sendmsg` of `bytes` with `fd` as `SCM_RIGHTS`.
#[cfg(unix)]
fn raw_send(
    socket: &std::os::unix::net::UnixStream,
    bytes: &[u8],
    fd: &std::os::fd::OwnedFd,
) -> BenchResult<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    use std::os::fd::AsFd;
    let fds = [fd.as_fd()];
    let mut space = [core::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    control.push(SendAncillaryMessage::ScmRights(&fds));
    rustix::net::sendmsg(
        socket,
        &[std::io::IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// A bare `recvmsg` of one message, keeping its first descriptor, without checks.
#[cfg(unix)]
fn raw_receive(socket: &std::os::unix::net::UnixStream) -> BenchResult<std::os::fd::OwnedFd> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut bytes = [0u8; 40];
    let mut space = [core::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    rustix::net::recvmsg(
        socket,
        &mut [std::io::IoSliceMut::new(&mut bytes)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(mut fds) = message
            && let Some(fd) = fds.next()
        {
            return Ok(fd);
        }
    }
    Err("no descriptor received".into())
}

// The owned layer: a `VirtualBuffer` grown by one page with more and more already mapped, against the
// raw calls and against a reallocation by copy; and pages mapped and unmapped through it.

/// The owned layer's rows: growth of a `VirtualBuffer` by one page at each of [`GROWTH_SIZES`] already
/// mapped (against the raw calls, and against itself at the smallest size), the same growth against a
/// reallocation by copy, and churn of pages through `map_page` / `unmap`. A size the device has too
/// little free memory for is not run, with a line in `not_run`.
fn owned_rows(
    ctx: &Context,
    g: usize,
    rows: &mut Vec<Row>,
    not_run: &mut Vec<String>,
) -> BenchResult<()> {
    let grown = growth_rows(ctx, g, rows, not_run)?;
    realloc_rows(ctx, g, &grown, rows, not_run)?;
    owned_churn(ctx, g, rows)
}

/// The sizes already mapped when one page is added: label, bytes (rounded up to the granularity),
/// repetitions of the growth rows, repetitions of the reallocation row.
const GROWTH_SIZES: [(&str, usize, usize, usize); 3] = [
    ("2 MiB", 2 << 20, 5000, 2000),
    ("1 GiB", GIB, 5000, 200),
    ("64 GiB", 64 * GIB, 5000, 10),
];
/// The address budget of the growth rows' buffers: address space only, costing no memory, and larger
/// than the largest size plus a page.
const GROWTH_BUDGET: usize = 128 * GIB;
/// Free device memory left aside beyond what a row maps or allocates, for the driver's own needs.
const HEADROOM: usize = 512 << 20;
/// The longest that mapping a buffer page by page up to one of [`GROWTH_SIZES`] may take; past it, that
/// size and the larger ones are not run, so that the owned rows stay within about a minute.
const FILL_LIMIT_S: f64 = 20.0;

/// A size whose growth row ran, with the median seconds of the safe growth (grow and shrink back).
struct Grown {
    label: &'static str,
    size: usize,
    safe: f64,
}

/// Growth by one page of `g` bytes (and the shrink back, so each repetition leaves the buffer as it
/// was) of a `VirtualBuffer` with each of [`GROWTH_SIZES`] mapped page by page, against the raw calls
/// of the same work at the same address of the same reservation; from the second size on, also the
/// same growth against a buffer with the smallest size mapped (goal ~1: growth does not depend on the
/// size). Returns the sizes that ran, for [`realloc_rows`]; both buffers are freed before it returns.
fn growth_rows(
    ctx: &Context,
    g: usize,
    rows: &mut Vec<Row>,
    not_run: &mut Vec<String>,
) -> BenchResult<Vec<Grown>> {
    let device = ctx.device();
    let page = format!("{} MiB", g >> 20);
    let budget = cuda_vmm::align_size(GROWTH_BUDGET, g)?;
    // `big` goes through every size; `small` stays at the smallest, for the rows against it.
    let mut big = cuda_vmm::VirtualBuffer::new(budget, &[device], ReadWrite)?;
    let mut small = cuda_vmm::VirtualBuffer::new(budget, &[device], ReadWrite)?;
    let (smallest_label, smallest, ..) = GROWTH_SIZES[0];
    let smallest = cuda_vmm::align_size(smallest, g)?;
    if let Err(why) = fill_to(ctx, &mut small, g, smallest)? {
        not_run.push(format!(
            "VirtualBuffer growth rows and the reallocation rows: {why}"
        ));
        return Ok(Vec::new());
    }
    let mut grown = Vec::new();
    for (label, size, reps, _) in GROWTH_SIZES {
        let size = cuda_vmm::align_size(size, g)?;
        let started = Instant::now();
        if let Err(why) = fill_to(ctx, &mut big, g, size)? {
            not_run.push(format!(
                "grow+shrink one {page} page at {label} mapped, and every larger size: {why}"
            ));
            break;
        }
        println!(
            "owned rows: {label} mapped as {} pages of {page} in {:.2} s",
            big.pages().len(),
            started.elapsed().as_secs_f64()
        );
        // The raw side maps the next page where `grow` maps it: inside the budget, past the last page.
        let at = big.base() + size as u64;
        if big.end() != size || size + g > big.budget() {
            return Err(format!(
                "growth row at {label}: the buffer ends at {} of a {} budget, not at {size}",
                big.end(),
                big.budget()
            )
            .into());
        }
        let mut safe = || grow_shrink(&mut big, device, g);
        // SAFETY: `[at, at + g)` lies inside `big`'s reservation (checked just above), right after its
        // last page, and is aligned to `g`, the device's granularity. `big` maps nothing there between
        // safe runs (each shrinks back) and no safe run overlaps a raw one; each raw run unmaps what it
        // mapped before it returns, so `big`'s next `grow` finds the range free.
        let mut raw = || unsafe { raw_grow_shrink(device, at, g) };
        warm_up(0.2, &mut safe, &mut raw)?;
        let (safe_t, raw_t, paired) = race_paired(reps, &mut safe, &mut raw)?;
        rows.push(Row {
            name: format!("grow+shrink one {page} page at {label} mapped, VirtualBuffer (us)"),
            unit: "us",
            safe: safe_t * 1e6,
            raw: raw_t * 1e6,
            paired: Some(paired),
            goal: "safe/raw <= 1.01",
        });
        grown.push(Grown {
            label,
            size,
            safe: safe_t,
        });
        if size > smallest {
            let mut at_size = || grow_shrink(&mut big, device, g);
            let mut at_smallest = || grow_shrink(&mut small, device, g);
            warm_up(0.2, &mut at_size, &mut at_smallest)?;
            let (big_t, small_t, paired) = race_paired(reps, &mut at_size, &mut at_smallest)?;
            rows.push(Row {
                name: format!(
                    "grow+shrink one {page} page, VirtualBuffer at {label} vs at {smallest_label} mapped (us)"
                ),
                unit: "us",
                safe: big_t * 1e6,
                raw: small_t * 1e6,
                paired: Some(paired),
                goal: "~1: growth does not depend on size",
            });
        }
    }
    // Freed here, with the driver's answer: the reallocation rows need the memory.
    let started = Instant::now();
    big.free()?;
    small.free()?;
    println!(
        "owned rows: growth buffers freed in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    Ok(grown)
}

/// Grows `buffer` by pages of `g` bytes, as a cache grows, until `size` bytes are mapped; or says why
/// it cannot: too little free device memory for the rest and a page more (checked before any page),
/// `cuMemCreate` out of memory, or more than [`FILL_LIMIT_S`] seconds spent. Where it cannot, the
/// pages it mapped stay.
fn fill_to(
    ctx: &Context,
    buffer: &mut cuda_vmm::VirtualBuffer,
    g: usize,
    size: usize,
) -> BenchResult<Result<(), String>> {
    let missing = size.saturating_sub(buffer.end());
    let need = missing.saturating_add(g).saturating_add(HEADROOM);
    let (free, _) = ctx.memory_info()?;
    if free < need {
        return Ok(Err(format!(
            "{} MiB of device memory free, {} MiB needed",
            free >> 20,
            need >> 20
        )));
    }
    let started = Instant::now();
    while buffer.end() < size {
        match buffer.grow(ctx.device(), g) {
            Ok(_) => {}
            Err(cuda_vmm::Error::Driver(e)) if e == DriverError::OUT_OF_MEMORY => {
                return Ok(Err(format!(
                    "cuMemCreate out of memory at {} MiB mapped",
                    buffer.end() >> 20
                )));
            }
            Err(e) => return Err(e.into()),
        }
        if started.elapsed().as_secs_f64() > FILL_LIMIT_S {
            return Ok(Err(format!(
                "mapping page by page reached only {} MiB in {FILL_LIMIT_S} s",
                buffer.end() >> 20
            )));
        }
    }
    Ok(Ok(()))
}

/// One growth of `buffer` by a page of `g` bytes of `device`'s memory, and the shrink back: the buffer
/// is as it was.
fn grow_shrink(buffer: &mut cuda_vmm::VirtualBuffer, device: Device, g: usize) -> BenchResult<()> {
    buffer.grow(device, g)?;
    buffer.shrink()?;
    Ok(())
}

/// The allocation properties and the read-write access descriptor of pinned memory on `device`, as
/// the crate passes them.
fn page_props(device: Device) -> (raw::Prop, raw::AccessDesc) {
    let location = || raw::Location {
        type_: 1,
        id: device.as_raw(),
    };
    let prop = raw::Prop {
        type_: 1,
        handle_types: 0,
        location: location(),
        win32: core::ptr::null_mut(),
        flags: 0,
    };
    let desc = raw::AccessDesc {
        location: location(),
        flags: 3,
    };
    (prop, desc)
}

/// The raw calls of [`grow_shrink`]: `cuMemCreate` of `size` bytes on `device`, `cuMemMap` at `at`,
/// `cuMemSetAccess` read-write for `device`, then `cuMemUnmap` and `cuMemRelease`.
///
/// # Safety
/// `[at, at + size)` must lie inside a live reservation, be unmapped and aligned to `device`'s
/// granularity (as `size` must be), and be mapped by nothing else until this returns.
unsafe fn raw_grow_shrink(device: Device, at: u64, size: usize) -> BenchResult<()> {
    let (prop, desc) = page_props(device);
    let mut handle = 0u64;
    // SAFETY: `handle` is writable and `prop` a live, initialised property struct; flags must be 0.
    ok(unsafe { raw::cuMemCreate(&raw mut handle, size, &raw const prop, 0) })?;
    // SAFETY: the caller's guarantee for `[at, at + size)`; `handle` is the allocation of `size` bytes
    // made just above; offset 0 and flags 0 as the driver requires.
    ok(unsafe { raw::cuMemMap(at, size, 0, handle, 0) })?;
    // SAFETY: `[at, at + size)` is the whole mapping made just above; `desc` is one live descriptor.
    ok(unsafe { raw::cuMemSetAccess(at, size, &raw const desc, 1) })?;
    // SAFETY: unmaps exactly the mapping made above, once; nothing has used its address.
    ok(unsafe { raw::cuMemUnmap(at, size) })?;
    // SAFETY: `handle` came from `cuMemCreate` above, is no longer mapped, and is released once.
    ok(unsafe { raw::cuMemRelease(handle) })
}

/// The driver calls of a reallocation by copy, with integer results.
mod raw_alloc {
    unsafe extern "C" {
        pub(crate) fn cuMemAlloc_v2(ptr: *mut u64, bytes: usize) -> u32;
        pub(crate) fn cuMemFree_v2(ptr: u64) -> u32;
    }
}

/// Device memory from raw `cuMemAlloc` in `ctx`, freed on drop: the buffer a reallocation by copy
/// moves.
struct RawAlloc<'ctx> {
    ctx: &'ctx Context,
    ptr: u64,
}

impl<'ctx> RawAlloc<'ctx> {
    /// `cuMemAlloc` of `bytes` in `ctx`.
    fn new(ctx: &'ctx Context, bytes: usize) -> Result<RawAlloc<'ctx>, cuda_vmm::Error> {
        ctx.bind_to_thread()?;
        let mut ptr = 0u64;
        // SAFETY: `ptr` is writable; `ctx` is current (bound just above).
        let code = unsafe { raw_alloc::cuMemAlloc_v2(&raw mut ptr, bytes) };
        match DriverError::from_raw(code) {
            None => Ok(RawAlloc { ctx, ptr }),
            Some(e) => Err(e.into()),
        }
    }

    /// Moves to a new allocation of `bytes`, carrying the first `keep` bytes over: `cuMemAlloc`,
    /// `cuMemcpyDtoD`, a wait on the legacy stream, `cuMemFree` of the old allocation.
    fn realloc(&mut self, bytes: usize, keep: usize) -> BenchResult<()> {
        let moved = RawAlloc::new(self.ctx, bytes)?;
        // SAFETY: `keep` bytes of the old allocation (the caller keeps `keep` within both sizes) into
        // the new one, both `cuMemAlloc` memory of the current context (bound by `new`), alive until
        // after the wait just below.
        ok(unsafe { raw::cuMemcpyDtoD_v2(moved.ptr, self.ptr, keep) })?;
        // SAFETY: no arguments but the legacy stream of the current context.
        ok(unsafe { raw::cuStreamSynchronize(core::ptr::null_mut()) })?;
        core::mem::replace(self, moved).free()
    }

    /// `cuMemFree`, with the driver's answer.
    fn free(self) -> BenchResult<()> {
        let this = core::mem::ManuallyDrop::new(self);
        this.ctx.bind_to_thread()?;
        // SAFETY: `ptr` came from `cuMemAlloc` in this context and is freed once (`drop` will not run);
        // every copy that used it was waited for.
        ok(unsafe { raw_alloc::cuMemFree_v2(this.ptr) })
    }
}

impl Drop for RawAlloc<'_> {
    fn drop(&mut self) {
        // Errors are ignored: `drop` cannot return them, and memory the driver refuses to free cannot be
        // freed later either; `free` reports them.
        let _ = self.ctx.bind_to_thread();
        // SAFETY: `ptr` came from `cuMemAlloc` in this context and is freed only here (`free` skips
        // this); every copy that used it was waited for.
        let _ = unsafe { raw_alloc::cuMemFree_v2(self.ptr) };
    }
}

/// Growth by one page where the address may move: at each size the growth rows ran at, a
/// reallocation by copy of a buffer of the size plus a page (`cuMemAlloc` of that, `cuMemcpyDtoD` of
/// the size, `cuMemFree` of the old buffer, so each repetition leaves a buffer of the same size),
/// against the `VirtualBuffer` growth (and shrink back) of the same run at the same size. Goal
/// "report": what address-stable growth saves.
fn realloc_rows(
    ctx: &Context,
    g: usize,
    grown: &[Grown],
    rows: &mut Vec<Row>,
    not_run: &mut Vec<String>,
) -> BenchResult<()> {
    let page = format!("{} MiB", g >> 20);
    for (label, size, _, reps) in GROWTH_SIZES {
        let size = cuda_vmm::align_size(size, g)?;
        let what = format!("grow by {page} at {label}, realloc by copy");
        let Some(vmm) = grown.iter().find(|r| r.size == size) else {
            not_run.push(format!(
                "{what}: no VirtualBuffer growth figure at this size"
            ));
            continue;
        };
        // The old buffer and the new one, both of the size plus a page.
        let need = size
            .saturating_add(g)
            .saturating_mul(2)
            .saturating_add(HEADROOM);
        let (free, _) = ctx.memory_info()?;
        if free < need {
            not_run.push(format!(
                "{what}: {} MiB of device memory free, {} MiB needed",
                free >> 20,
                need >> 20
            ));
            continue;
        }
        let mut buffer = match RawAlloc::new(ctx, size + g) {
            Ok(buffer) => buffer,
            Err(cuda_vmm::Error::Driver(DriverError::OUT_OF_MEMORY)) => {
                not_run.push(format!("{what}: cuMemAlloc out of memory"));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let mut realloc = || buffer.realloc(size + g, size);
        warm_up(0.2, &mut realloc, &mut || Ok(()))?;
        let (realloc_t, _) = race(reps, &mut realloc, || Ok(()))?;
        buffer.free()?;
        rows.push(Row {
            name: format!(
                "grow by {page} at {}: VirtualBuffer grow+shrink vs realloc (cuMemAlloc+DtoD+cuMemFree) (us)",
                vmm.label
            ),
            unit: "us",
            safe: vmm.safe * 1e6,
            raw: realloc_t * 1e6,
            paired: None,
            goal: "report",
        });
    }
    Ok(())
}

/// The owned layer's churn, as [`churn`] for the borrowed layer: pages of `g` bytes mapped one by one
/// into an empty `VirtualBuffer` with `map_page` (`cuMemCreate`, `cuMemMap`, `cuMemSetAccess`) and
/// unmapped one by one with `unmap` (`cuMemUnmap`, `cuMemRelease`), against the same raw calls at the
/// same addresses of the same reservation, in ops/s (one op: one page mapped, granted and unmapped).
fn owned_churn(ctx: &Context, g: usize, rows: &mut Vec<Row>) -> BenchResult<()> {
    let chunks = 64;
    let device = ctx.device();
    let mut buffer = cuda_vmm::VirtualBuffer::new(chunks * g, &[device], ReadWrite)?;
    let base = buffer.base();
    let (prop, desc) = page_props(device);
    let mut handles = vec![0u64; chunks];
    let mut safe = || -> BenchResult<()> {
        for i in 0..chunks {
            buffer.map_page(i * g, device, g)?;
        }
        for i in 0..chunks {
            buffer.unmap(i * g..(i + 1) * g)?;
        }
        Ok(())
    };
    let mut raw = || -> BenchResult<()> {
        for (i, handle) in handles.iter_mut().enumerate() {
            let at = base + (i * g) as u64;
            // SAFETY: `handle` is writable and `prop` a live property struct; then `[at, at + g)` is a
            // free granule of the buffer's reservation, aligned to the granularity `g` (every safe run
            // unmapped all its pages, and no safe run overlaps a raw one), mapped to the allocation
            // just made and granted whole.
            unsafe {
                ok(raw::cuMemCreate(handle, g, &raw const prop, 0))?;
                ok(raw::cuMemMap(at, g, 0, *handle, 0))?;
                ok(raw::cuMemSetAccess(at, g, &raw const desc, 1))?;
            }
        }
        for (i, &handle) in handles.iter().enumerate() {
            // SAFETY: unmaps what the loop above mapped, once, then releases its allocation, once.
            unsafe {
                ok(raw::cuMemUnmap(base + (i * g) as u64, g))?;
                ok(raw::cuMemRelease(handle))?;
            }
        }
        Ok(())
    };
    warm_up(0.2, &mut safe, &mut raw)?;
    let (safe_t, raw_t, paired) = race_paired(100, &mut safe, &mut raw)?;
    let per_s = |t: f64| float(chunks) / t;
    rows.push(Row {
        name: format!(
            "owned churn map_page+unmap {} MiB (create, map, grant, unmap, release) (ops/s)",
            g >> 20
        ),
        unit: "ops/s",
        safe: per_s(safe_t),
        raw: per_s(raw_t),
        // A rate: the reciprocal of the median time ratio.
        paired: Some(1.0 / paired),
        goal: "safe/raw >= 0.99",
    });
    buffer.free()?;
    Ok(())
}

/// The driver calls of the stream rows that the safe API makes, declared with integer results.
mod raw_stream {
    use core::ffi::c_void;

    unsafe extern "C" {
        pub(crate) fn cuMemcpyHtoDAsync_v2(
            dst: u64,
            src: *const c_void,
            bytes: usize,
            stream: *mut c_void,
        ) -> u32;
        pub(crate) fn cuMemcpyDtoHAsync_v2(
            dst: *mut c_void,
            src: u64,
            bytes: usize,
            stream: *mut c_void,
        ) -> u32;
    }
}

/// The duplex rows of [`stream_rows`]: both directions at once through the scope, against one
/// direction through the scope and against the same two raw async copies.
fn duplex_rows(ctx: &Context, bytes: usize, rows: &mut Vec<Row>) -> BenchResult<()> {
    use cuda_vmm::{PinnedBuffer, Stream};

    let mut up_dst = DeviceBuffer::<u8>::zeroed(ctx, bytes)?;
    let mut alone_dst = DeviceBuffer::<u8>::zeroed(ctx, bytes)?;
    let down_src = DeviceBuffer::<u8>::zeroed(ctx, bytes)?;
    let up_src = PinnedBuffer::<u8>::zeroed(ctx, bytes)?;
    let mut down_dst = PinnedBuffer::<u8>::zeroed(ctx, bytes)?;
    let (up, down) = (Stream::new(ctx)?, Stream::new(ctx)?);
    let mut up_view = up_dst.as_mut_slice();
    let down_view = down_src.as_slice();

    let mut both = || -> BenchResult<()> {
        cuda_vmm::scope(|s| {
            s.on(&up).copy_from_host(&mut up_view, &up_src)?;
            s.on(&down).copy_to_host(&mut down_dst, down_view)?;
            Ok(())
        })?;
        Ok(())
    };
    let mut up_view_alone = alone_dst.as_mut_slice();
    let mut one = || -> BenchResult<()> {
        cuda_vmm::scope(|s| {
            s.on(&up).copy_from_host(&mut up_view_alone, &up_src)?;
            Ok(())
        })?;
        Ok(())
    };
    warm_up(0.5, &mut both, &mut one)?;
    let (both_t, one_t) = race(30, &mut both, &mut one)?;
    rows.push(Row {
        name: format!(
            "host <-> device {} MiB each way on two streams vs host -> device alone (GB/s)",
            bytes >> 20
        ),
        unit: "GB/s",
        safe: 2.0 * float(bytes) / both_t / 1e9,
        raw: float(bytes) / one_t / 1e9,
        paired: None,
        goal: "both/one ~2 (full duplex)",
    });

    // The same duplex made raw: the two async copies on the same two streams, then a wait for each.
    let (up_raw, down_raw) = (up.as_raw().cast::<c_void>(), down.as_raw().cast::<c_void>());
    let (up_dst_ptr, down_src_ptr) = (
        up_dst.as_mut_slice().as_raw_ptr(),
        down_src.as_slice().as_raw_ptr(),
    );
    let (up_src_ptr, down_dst_ptr) = (up_src.as_ptr(), down_dst.as_mut_ptr());
    let raw_both = || -> BenchResult<()> {
        // SAFETY: `up_dst_ptr` and `down_src_ptr` are `bytes` of `up_dst`'s and `down_src`'s device
        // memory, `up_src_ptr` and `down_dst_ptr` `bytes` of pinned host memory, all alive until this
        // function returns and used by nothing else while it runs (the safe closure runs only between
        // raw runs); both copies are waited for before it returns.
        unsafe {
            ok(raw::cuCtxSetCurrent(ctx.as_raw().cast()))?;
            ok(raw_stream::cuMemcpyHtoDAsync_v2(
                up_dst_ptr,
                up_src_ptr.cast::<c_void>(),
                bytes,
                up_raw,
            ))?;
            ok(raw_stream::cuMemcpyDtoHAsync_v2(
                down_dst_ptr.cast::<c_void>(),
                down_src_ptr,
                bytes,
                down_raw,
            ))?;
            ok(raw::cuStreamSynchronize(up_raw))?;
            ok(raw::cuStreamSynchronize(down_raw))
        }
    };
    let mut up_view = up_dst.as_mut_slice();
    let down_view = down_src.as_slice();
    let both = || -> BenchResult<()> {
        cuda_vmm::scope(|s| {
            s.on(&up).copy_from_host(&mut up_view, &up_src)?;
            s.on(&down).copy_to_host(&mut down_dst, down_view)?;
            Ok(())
        })?;
        Ok(())
    };
    let (safe_t, raw_t, paired) = race_paired(30, both, raw_both)?;
    rows.push(Row {
        name: format!(
            "host <-> device {} MiB each way on two streams: scope vs the same two raw async copies (GB/s)",
            bytes >> 20
        ),
        unit: "GB/s",
        safe: 2.0 * float(bytes) / safe_t / 1e9,
        raw: 2.0 * float(bytes) / raw_t / 1e9,
        paired: Some(1.0 / paired),
        goal: "safe/raw >= 0.99",
    });

    Ok(())
}

/// Stream-ordered copies under `cuda_vmm::scope`, on GPU 0:
/// - host -> device and device -> host at once, on two streams, against host -> device alone (both
///   through the scope): the host link is full duplex, so close to 2x;
/// - the same duplex through the scope against the same two raw async copies on the same two
///   streams and a raw wait for each, in the same run, paired (goal >= 0.99);
/// - a scope around one 4 KiB async upload against the raw `cuMemcpyHtoDAsync` and
///   `cuStreamSynchronize` on the same stream: the scope's overhead (registration, the context bound
///   before each call, the wait), with the raw calls against themselves as calibration;
/// - a 256 MiB upload timed by events recorded around it on the stream, next to the wall clock around
///   the scope (which adds the queueing and the wait).
fn stream_rows(ctx: &Context, bytes: usize, rows: &mut Vec<Row>) -> BenchResult<()> {
    use cuda_vmm::{Event, PinnedBuffer, Stream};

    duplex_rows(ctx, bytes, rows)?;
    let mut up_dst = DeviceBuffer::<u8>::zeroed(ctx, bytes)?;
    let up_src = PinnedBuffer::<u8>::zeroed(ctx, bytes)?;
    let up = Stream::new(ctx)?;
    small_copy_rows(ctx, &up, rows)?;

    // Event-timed against wall-clock, the same upload.
    let (start, end) = (Event::timed(ctx)?, Event::timed(ctx)?);
    let mut up_view = up_dst.as_mut_slice();
    let (mut on_stream, mut wall) = (Vec::new(), Vec::new());
    for _ in 0..30 {
        let t = Instant::now();
        cuda_vmm::scope(|s| {
            let q = s.on(&up);
            q.record(&start)?;
            q.copy_from_host(&mut up_view, &up_src)?;
            q.record(&end)?;
            Ok(())
        })?;
        wall.push(t.elapsed().as_secs_f64());
        on_stream.push(f64::from(start.elapsed_ms(&end)?) / 1e3);
    }
    rows.push(Row::gbs(
        format!(
            "host -> device {} MiB on a stream, event-timed vs wall clock around the scope (GB/s)",
            bytes >> 20
        ),
        bytes,
        median(on_stream),
        median(wall),
        "report",
    ));
    Ok(())
}

/// The scope's overhead on a small copy: a scope around one 4 KiB upload from pinned memory, against
/// the raw `cuMemcpyHtoDAsync` and `cuStreamSynchronize` on the same stream; and the raw calls
/// against themselves (calibration). Both pairs are timed twice, in ABBA order and with each pair's
/// order drawn at random; the scope's row carries the goal in both.
fn small_copy_rows(
    ctx: &Context,
    stream: &cuda_vmm::Stream,
    rows: &mut Vec<Row>,
) -> BenchResult<()> {
    const SMALL: usize = 4096;
    let host = cuda_vmm::PinnedBuffer::<u8>::zeroed(ctx, SMALL)?;
    let mut device = DeviceBuffer::<u8>::zeroed(ctx, SMALL)?;
    let mut view = device.as_mut_slice();
    let (dst, src, raw_stream) = (view.as_raw_ptr(), host.as_ptr(), stream.as_raw());
    let raw_copy = || -> BenchResult<()> {
        // SAFETY: `dst` is `SMALL` bytes of `device`'s memory and `src` `SMALL` bytes of `host`'s
        // pinned memory, both alive until this function returns; the copy is waited for before this
        // returns, and the safe closure runs only between raw runs.
        unsafe {
            ok(raw::cuCtxSetCurrent(ctx.as_raw().cast()))?;
            ok(raw_stream::cuMemcpyHtoDAsync_v2(
                dst,
                src.cast::<c_void>(),
                SMALL,
                raw_stream.cast::<c_void>(),
            ))?;
            ok(raw::cuStreamSynchronize(raw_stream.cast::<c_void>()))
        }
    };
    let mut safe = || -> BenchResult<()> {
        cuda_vmm::scope(|s| {
            s.on(stream).copy_from_host(&mut view, &host)?;
            Ok(())
        })?;
        Ok(())
    };
    let mut raw_warm = raw_copy;
    warm_up(0.2, &mut safe, &mut raw_warm)?;
    rows.push(Row::us(
        "async copy 4 KiB + sync, raw vs raw (calibration) (us)",
        race_paired(5000, raw_copy, raw_copy)?,
        "calibration: ~1",
    ));
    rows.push(Row::us(
        "scope + async copy 4 KiB vs cuMemcpyHtoDAsync + cuStreamSynchronize (us)",
        race_paired(5000, &mut safe, raw_copy)?,
        "safe/raw <= 1.01",
    ));
    // The same two with each pair's order drawn at random ([`race_paired_shuffled`]), as the shared
    // page's rows: the ABBA calibration above reads about half a percent off 1 in some runs, and a
    // random order puts neither side on the same places of the driver's cycles more often.
    rows.push(Row::us(
        "async copy 4 KiB + sync, raw vs raw, pairs in a random order (calibration) (us)",
        race_paired_shuffled(5000, raw_copy, raw_copy, 0x5eed_0029)?,
        "calibration: ~1",
    ));
    rows.push(Row::us(
        "scope + async copy 4 KiB vs cuMemcpyHtoDAsync + cuStreamSynchronize, pairs in a random \
         order (us)",
        race_paired_shuffled(5000, &mut safe, raw_copy, 0x5eed_002a)?,
        "safe/raw <= 1.01",
    ));
    Ok(())
}

/// The cudarc interop: a kernel launched through cudarc's builder on VMM memory lent inside
/// `interop::cudarc::scope` (which checks the lend, builds on the scope's stream and waits for it),
/// against the same launch on cudarc's own `CudaSlice` and `CudaStream::synchronize`, on one stream.
/// The kernel reads and writes every value once, so the rate is the bytes moved per second.
#[cfg(feature = "cudarc")]
fn cudarc_rows(ctx: &Context, rows: &mut Vec<Row>, not_run: &mut Vec<String>) -> BenchResult<()> {
    use cuda_vmm::interop::cudarc::scope;
    use cuda_vmm::{ReadWrite, VirtualBuffer};
    use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};

    const SCALE: &str = r#"
extern "C" __global__ void scale(float *x, unsigned long long n) {
    unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += stride)
        x[i] = x[i] * 0.5f + 1.0f;
}
"#;
    const BYTES: usize = GIB;
    // SAFETY: tries to `dlopen` the NVRTC library under cudarc's candidate names, nothing more.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        not_run.push("cudarc kernel launch: the NVRTC library cannot be loaded".to_owned());
        return Ok(());
    }
    let device = ctx.device();
    if ctx.memory_info()?.0 < 2 * BYTES + HEADROOM {
        not_run.push(format!(
            "cudarc kernel launch: needs 2 x {} MiB free on GPU 0",
            BYTES >> 20
        ));
        return Ok(());
    }
    let cu = CudaContext::new(device.ordinal())?;
    let stream = cu.new_stream()?;
    let kernel = cu
        .load_module(cudarc::nvrtc::compile_ptx(SCALE)?)?
        .load_function("scale")?;
    let n = u64::try_from(BYTES / 4)?;
    let cfg = LaunchConfig {
        grid_dim: (1024, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut buffer = VirtualBuffer::new(BYTES, &[device], ReadWrite)?;
    buffer.grow(device, BYTES)?;
    let mut view = buffer.slice_bytes_mut::<f32>(..)?;
    let mut slice = stream.alloc_zeros::<f32>(BYTES / 4)?;
    scope(&stream, |s| -> BenchResult<()> {
        stream.memset_zeros(&mut s.lend_mut(&mut view)?)?;
        Ok(())
    })?;

    let mut vmm = || -> BenchResult<()> {
        scope(&stream, |s| -> BenchResult<()> {
            let mut x = s.lend_mut(&mut view)?;
            // SAFETY: `scale(float *x, unsigned long long n)` takes these two, in this order, and
            // touches `x[0..n)`, the lent view's `n` values; launched on the scope's stream.
            unsafe { s.launch_builder(&kernel)?.arg(&mut x).arg(&n).launch(cfg) }?;
            Ok(())
        })
    };
    let mut own = || -> BenchResult<()> {
        // SAFETY: as above, over cudarc's own `n` values; the stream is waited for before this
        // returns, as the scope does.
        unsafe {
            stream
                .launch_builder(&kernel)
                .arg(&mut slice)
                .arg(&n)
                .launch(cfg)
        }?;
        stream.synchronize()?;
        Ok(())
    };
    warm_up(0.5, &mut vmm, &mut own)?;
    let (safe, raw_t, paired) = race_paired(300, &mut vmm, &mut own)?;
    rows.push(
        Row::gbs(
            format!(
                "cudarc: kernel over {} MiB of VMM memory lent in a scope vs over cudarc's \
                 CudaSlice + synchronize (GB/s moved)",
                BYTES >> 20
            ),
            2 * BYTES,
            safe,
            raw_t,
            "safe/raw >= 0.99",
        )
        .with_paired_times(paired),
    );
    Ok(())
}

/// PTX of `spin_add_one(u32 *dst, const u32 *src, u32 n, u64 ns)`: every thread spins until `ns`
/// nanoseconds have passed, then `dst[i] = src[i] + 1` for `i < n`: work of a known duration.
const SPIN_PTX: &str = include_str!("kernels/spin_add_one.ptx");

/// The driver calls of the raw side of the memory-in-motion rows, declared with integer results.
mod raw_launch {
    use core::ffi::{c_char, c_void};

    unsafe extern "C" {
        pub(crate) fn cuModuleLoadData(module: *mut *mut c_void, image: *const c_void) -> u32;
        pub(crate) fn cuModuleGetFunction(
            function: *mut *mut c_void,
            module: *mut c_void,
            name: *const c_char,
        ) -> u32;
        pub(crate) fn cuModuleUnload(module: *mut c_void) -> u32;
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn cuLaunchKernel(
            function: *mut c_void,
            grid_x: u32,
            grid_y: u32,
            grid_z: u32,
            block_x: u32,
            block_y: u32,
            block_z: u32,
            shared_bytes: u32,
            stream: *mut c_void,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> u32;
        pub(crate) fn cuMemsetD8Async(dst: u64, byte: u8, bytes: usize, stream: *mut c_void)
        -> u32;
    }
}

/// `spin_add_one` loaded with the raw calls (`cuModuleLoadData`, `cuModuleGetFunction`), for the
/// raw side of the rows; unloaded on drop.
struct RawSpin {
    ctx: Context,
    module: *mut c_void,
    function: *mut c_void,
}

impl RawSpin {
    fn load(ctx: &Context) -> BenchResult<RawSpin> {
        let ptx = std::ffi::CString::new(SPIN_PTX)?;
        ctx.bind_to_thread()?;
        let mut module = core::ptr::null_mut();
        // SAFETY: `module` is writable; `ptx` is NUL-terminated PTX text, alive for the call; a
        // context is current (bound just above).
        ok(unsafe { raw_launch::cuModuleLoadData(&raw mut module, ptx.as_ptr().cast()) })?;
        // Owned from here, so that an error below unloads it.
        let mut loaded = RawSpin {
            ctx: ctx.clone(),
            module,
            function: core::ptr::null_mut(),
        };
        // SAFETY: `loaded.function` is writable, `module` the module loaded just above, the name
        // NUL-terminated.
        ok(unsafe {
            raw_launch::cuModuleGetFunction(
                &raw mut loaded.function,
                module,
                c"spin_add_one".as_ptr(),
            )
        })?;
        Ok(loaded)
    }

    /// `cuLaunchKernel` of `spin_add_one(dst, src, n, ns)` on `stream`, `grid` blocks of 256.
    ///
    /// # Safety
    /// `dst` and `src` must be `n` `u32`s each of device memory of this kernel's context, mapped
    /// and granted until the kernel has finished, which nothing else writes meanwhile.
    unsafe fn launch(
        &self,
        stream: *mut c_void,
        grid: u32,
        (dst, src, n, ns): (u64, u64, u32, u64),
    ) -> BenchResult<()> {
        let (mut dst, mut src, mut n, mut ns) = (dst, src, n, ns);
        let mut params = [
            (&raw mut dst).cast::<c_void>(),
            (&raw mut src).cast::<c_void>(),
            (&raw mut n).cast::<c_void>(),
            (&raw mut ns).cast::<c_void>(),
        ];
        self.ctx.bind_to_thread()?;
        // SAFETY: `spin_add_one` takes (.u64 dst, .u64 src, .u32 n, .u64 ns); `params` points, in
        // that order, at values of those types, alive for the call (the driver copies them). The
        // memory is the caller's guarantee; the context is current (bound just above).
        ok(unsafe {
            raw_launch::cuLaunchKernel(
                self.function,
                grid,
                1,
                1,
                256,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                core::ptr::null_mut(),
            )
        })
    }
}

impl Drop for RawSpin {
    fn drop(&mut self) {
        // Errors are ignored: `drop` cannot return them, and a module the driver refuses to unload
        // stays loaded until its context goes, which is all that could happen later anyway.
        let _ = self.ctx.bind_to_thread();
        // SAFETY: the module loaded by `load`, unloaded once; every launch of its kernel was waited
        // for by the row that made it.
        let _ = unsafe { raw_launch::cuModuleUnload(self.module) };
    }
}

/// As [`race_paired`], for runs that time only a part of themselves: each run returns the seconds
/// of its timed part (the rest, such as mapping a page first or waiting for a scope after, is not
/// counted).
fn race_paired_parts(
    reps: usize,
    mut safe: impl FnMut() -> BenchResult<f64>,
    mut raw: impl FnMut() -> BenchResult<f64>,
) -> BenchResult<(f64, f64, f64)> {
    safe()?;
    raw()?;
    let (mut s, mut r) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for i in 0..reps {
        if i % 2 == 0 {
            s.push(safe()?);
            r.push(raw()?);
        } else {
            r.push(raw()?);
            s.push(safe()?);
        }
    }
    let ratios = paired_ratios(&s, &r);
    Ok((median(s), median(r), median(ratios)))
}

/// Memory in motion, on GPU 0: a retire behind queued work against the raw wait and unmap; a decode
/// loop in one scope that grows and retires pages against the same loop over a preallocated buffer;
/// and a second mapping of a shared page against the raw calls.
fn motion_rows(ctx: &Context, g: usize, rows: &mut Vec<Row>) -> BenchResult<()> {
    let module = cuda_vmm::Module::load_ptx(ctx, &std::ffi::CString::new(SPIN_PTX)?)?;
    let kernel = module.function(c"spin_add_one")?;
    let raw_kernel = RawSpin::load(ctx)?;
    let stream = cuda_vmm::Stream::new(ctx)?;
    retire_row(ctx, g, &kernel, &raw_kernel, &stream, rows)?;
    vmm_calls_beside_queued_work(ctx, g, &kernel, &stream)?;
    raw_decode_row(ctx, g, &raw_kernel, &stream, Lead::Unbounded, rows)?;
    raw_decode_row(ctx, g, &raw_kernel, &stream, Lead::Steps(2), rows)?;
    raw_decode_row(ctx, g, &raw_kernel, &stream, Lead::Steps(4), rows)?;
    // Without a reserve: each page made and released by the loop itself.
    for (spin_ns, lead, reps) in [
        (100_000, Lead::Steps(2), 40),
        (100_000, Lead::Steps(4), 40),
        (100_000, Lead::Unbounded, 40),
        (0, Lead::Unbounded, 400),
    ] {
        let motion = Motion {
            spin_ns,
            lead,
            reps,
            reserve: false,
            at_end: false,
        };
        decode_row(ctx, g, &kernel, &stream, motion, rows)?;
    }
    reserve_decode_rows(ctx, g, &kernel, &stream, rows)?;
    shared_map_rows(ctx, g, rows)
}

/// The decode rows with a reserve of [`motion_rows`] (host-bound and paced, each with `retire` and
/// with `retire_at_scope_end`), then the second mapping of a shared page: `bench elastic`.
fn elastic_rows(ctx: &Context, g: usize, rows: &mut Vec<Row>) -> BenchResult<()> {
    let module = cuda_vmm::Module::load_ptx(ctx, &std::ffi::CString::new(SPIN_PTX)?)?;
    let kernel = module.function(c"spin_add_one")?;
    let stream = cuda_vmm::Stream::new(ctx)?;
    reserve_decode_rows(ctx, g, &kernel, &stream, rows)?;
    shared_map_rows(ctx, g, rows)
}

/// The decode rows with a reserve, paced and host-bound: each page retired with `retire` (an
/// event), then each retired at the scope's end (`ScopedBuffer::retire_at_scope_end`: no event;
/// the scope is one run). What `bench motion` and `bench elastic` share.
fn reserve_decode_rows(
    ctx: &Context,
    g: usize,
    kernel: &cuda_vmm::module::Function<'_>,
    stream: &cuda_vmm::Stream,
    rows: &mut Vec<Row>,
) -> BenchResult<()> {
    for at_end in [false, true] {
        for (spin_ns, lead, reps) in [(100_000, Lead::Steps(2), 40), (0, Lead::Unbounded, 400)] {
            let motion = Motion {
                spin_ns,
                lead,
                reps,
                reserve: true,
                at_end,
            };
            decode_row(ctx, g, kernel, stream, motion, rows)?;
        }
    }
    Ok(())
}

/// The decode engine of `examples/decode_engine.rs` (8 seeded sequences of up to 24 tokens, a
/// 100 us `decode_step` per step, the step one graph with a graph table, replayed, the host at most
/// two steps ahead): pages taken as sequences start (`grow`, from a reserve of
/// `graph_engine::RESERVE` pages kept mapped ahead by its worker thread) and retired as they end,
/// against the same engine over a preallocated cache (every lane mapped before the run, none
/// retired), paired. Only each run's scope is timed (the cache's reservation, the reserve's first
/// fill, and the preallocated pages' mapping, are not).
fn graph_decode_row(ctx: &Context, g: usize, rows: &mut Vec<Row>) -> BenchResult<()> {
    const REPS: usize = 40;
    let workload = graph_engine::Workload::random(0x5eed_0032, 8, 24, 1024);
    let steps = workload.steps();
    let engine =
        std::cell::RefCell::new(graph_engine::GraphEngine::new(ctx, g, workload, 100_000)?);
    let mut elastic =
        || -> BenchResult<f64> { Ok(engine.borrow_mut().run(true, None)?.as_secs_f64()) };
    let mut fixed =
        || -> BenchResult<f64> { Ok(engine.borrow_mut().run(false, None)?.as_secs_f64()) };
    for _ in 0..3 {
        elastic()?;
        fixed()?;
    }
    let (elastic_t, fixed_t, paired) = race_paired_parts(REPS, &mut elastic, &mut fixed)?;
    let per_step = 1e6 / float(steps);
    let reserve = graph_engine::RESERVE;
    rows.push(Row {
        name: format!(
            "decode engine, one graph per step (graph table upload + 100 us kernel), the host at \
             most 2 steps ahead, {steps} steps: pages taken on demand from a reserve of {reserve} and \
             retired as sequences end vs a preallocated cache, per step (us)"
        ),
        unit: "us",
        safe: elastic_t * per_step,
        raw: fixed_t * per_step,
        paired: Some(paired),
        goal: "safe/raw <= 1.02",
    });
    Ok(())
}

/// The host time of a retire behind about 100 ms of queued work: a page of `g` bytes, half of it
/// zeroed and read by `spin_add_one` (100 ms spin) into the other half, then
/// `ScopedBuffer::retire` of the page, which records an event and returns; against the same work on
/// a raw page (`cuMemCreate`, `cuMemMap`, `cuMemSetAccess`, `cuMemsetD8Async`, `cuLaunchKernel` on the
/// same stream), then `cuStreamSynchronize`, `cuMemUnmap` and `cuMemRelease`, the host's other way
/// to release memory under running work. Only the retire and the wait-and-release are timed; the
/// scope's own wait, after the retire, is not.
fn retire_row(
    ctx: &Context,
    g: usize,
    kernel: &cuda_vmm::module::Function<'_>,
    raw_kernel: &RawSpin,
    stream: &cuda_vmm::Stream,
    rows: &mut Vec<Row>,
) -> BenchResult<()> {
    const QUEUED_NS: u64 = 100_000_000;
    let device = ctx.device();
    let n = u32::try_from(g / 8)?; // half a page of u32s
    let mut buffer = cuda_vmm::VirtualBuffer::new(g, &[device], ReadWrite)?;
    let safe = || -> BenchResult<f64> {
        buffer.grow(device, g)?;
        let mut took = 0.0;
        cuda_vmm::scope(|s| {
            let (w, kv) = (s.on(stream), buffer.in_scope(s));
            let (mut src, mut dst) = (kv.write::<u32>(..g / 2)?, kv.write::<u32>(g / 2..)?);
            let zeroed = w.memset(&mut src, 0)?;
            // SAFETY: `spin_add_one(u32*, const u32*, u32, u64)` takes these four, in this order,
            // and touches `n` values of each view, which hold `n` each.
            let _written = unsafe {
                w.launch(
                    kernel,
                    (64, 1, 1),
                    (256, 1, 1),
                    (&mut dst, zeroed, n, QUEUED_NS),
                )?
            };
            let started = Instant::now();
            kv.retire(..)?;
            took = started.elapsed().as_secs_f64();
            Ok(())
        })?;
        // The scope waited for the kernel: the page is released here, so the next run maps at 0.
        if buffer.reclaim()? != 1 {
            return Err("retire row: the retired page was not released after its work".into());
        }
        Ok(took)
    };
    let reservation = VirtualReservation::new(g, 0)?;
    let at = reservation.base();
    let (prop, desc) = page_props(device);
    let raw_stream = stream.as_raw().cast::<c_void>();
    let raw = || -> BenchResult<f64> {
        let mut handle = 0u64;
        ctx.bind_to_thread()?;
        // SAFETY: `handle` is writable and `prop` a live property struct; `[at, at + g)` is the whole
        // of `reservation`, unmapped (each run unmaps it), aligned to the granularity `g`, mapped to
        // the allocation just made and granted whole; the context is current (bound just above).
        unsafe {
            ok(raw::cuMemCreate(&raw mut handle, g, &raw const prop, 0))?;
            ok(raw::cuMemMap(at, g, 0, handle, 0))?;
            ok(raw::cuMemSetAccess(at, g, &raw const desc, 1))?;
            ok(raw_launch::cuMemsetD8Async(at, 0, g / 2, raw_stream))?;
            // The kernel reads the first half and writes the second, `n` values each, and is
            // waited for below before the page is unmapped.
            raw_kernel.launch(raw_stream, 64, (at + (g / 2) as u64, at, n, QUEUED_NS))?;
        }
        let started = Instant::now();
        // SAFETY: waits for the stream, so nothing uses the page any more; then unmaps the mapping
        // made above, once, and releases its allocation, once.
        unsafe {
            ok(raw::cuStreamSynchronize(raw_stream))?;
            ok(raw::cuMemUnmap(at, g))?;
            ok(raw::cuMemRelease(handle))?;
        }
        Ok(started.elapsed().as_secs_f64())
    };
    let (safe_t, raw_t, paired) = race_paired_parts(10, safe, raw)?;
    rows.push(Row {
        name: format!(
            "retire of a {} MiB page with 100 ms of kernel queued: ScopedBuffer::retire vs \
             cuStreamSynchronize + cuMemUnmap + cuMemRelease (us)",
            g >> 20
        ),
        unit: "us",
        safe: safe_t * 1e6,
        raw: raw_t * 1e6,
        paired: Some(paired),
        goal: "retire < 1 % of sync",
    });
    buffer.free()?;
    reservation.free()?;
    Ok(())
}

/// Steps of the decode loop rows, and how often the growing loop maps a page and retires one.
const DECODE_STEPS: usize = 256;
const DECODE_EVERY: usize = 8;
/// The bytes each step writes (a token), read by the next step.
const DECODE_TOKEN: usize = 4096;

/// How far the host may run ahead of the device in a decode loop.
#[derive(Clone, Copy)]
enum Lead {
    /// The whole loop is queued at once: every retire's event is still pending when the host
    /// reaches the next map, so the pages are released only by the next run's first map, before it
    /// queues anything (with the device idle).
    Unbounded,
    /// As an engine that reads each step's token before it plans the next: before step `i`, the
    /// host waits (polling an event, `cuEventQuery`) until step `i - n` has finished. The releases
    /// then happen inside the loop, beside the running kernels.
    Steps(usize),
}

/// Keeps the host at most `lead` steps ahead of `stream`: call it before queuing step `step`, and
/// [`Pacer::record`] after.
struct Pacer {
    events: Vec<cuda_vmm::Event>,
}

impl Pacer {
    fn new(ctx: &Context, lead: Lead) -> BenchResult<Pacer> {
        let n = match lead {
            Lead::Unbounded => 0,
            Lead::Steps(n) => n,
        };
        let events = (0..n)
            .map(|_| cuda_vmm::Event::new(ctx))
            .collect::<Result<_, _>>()?;
        Ok(Pacer { events })
    }

    /// Polls until the step `lead` steps before `step` has finished (nothing before the first
    /// `lead` steps).
    fn before(&self, step: usize) -> cuda_vmm::Result<()> {
        if self.events.is_empty() || step < self.events.len() {
            return Ok(());
        }
        let event = &self.events[step % self.events.len()];
        while !event.is_complete()? {
            core::hint::spin_loop();
        }
        Ok(())
    }

    /// Records step `step`'s end on `stream`.
    fn record(&self, stream: &cuda_vmm::Stream, step: usize) -> cuda_vmm::Result<()> {
        if self.events.is_empty() {
            return Ok(());
        }
        stream.record(&self.events[step % self.events.len()])
    }
}

/// The slots of a decode row's ring with a reserve: one run's maps (`DECODE_STEPS /
/// DECODE_EVERY` pages) and one more, so a slot is mapped again a run after its page was retired:
/// the retire's events have completed by then (the GPU keeps pace with the host within a run, and
/// the scope's wait ends each run), and the worker, which looks at them every 100 us while retires
/// wait, has recycled the page; where it has not yet, the map takes the page in place itself (a
/// `cuEventQuery`).
const DECODE_RESERVE_RING: usize = DECODE_STEPS / DECODE_EVERY + 1;

/// The pages a decode row's reserve holds ahead at most: the whole ring. Each retired page, once
/// its work has finished, is recycled in place (no driver call) and waits there for the map that
/// comes round to its slot; after the first fill neither the launch thread nor the worker makes a
/// VMM call, and the worker's rounds are `cuEventQuery` and state changes. A run retires its last
/// page too, so between runs no page is live and every page of the ring is retired or in the
/// reserve: with a bound one smaller, the worker found the reserve full when that page's retire
/// finished, released it, and made a new page for the next run (the note of the host-bound row
/// with `retire` read "the worker made 349 pages ... and released 316 retired ones" over 16 128
/// maps, at f4e6200 on one H100; with retires at the scope's end, whose order let the next run's
/// map take the page first, 33 and 0). The buffer holds at most the ring either way.
const DECODE_RESERVE: usize = DECODE_RESERVE_RING;

/// What a decode row runs: the kernel's spin, how far the host runs ahead, the runs of each loop,
/// whether the growing buffer has a reserve (`VirtualBuffer::reserve_ahead`), and whether its pages
/// are retired at the scope's end (`ScopedBuffer::retire_at_scope_end`, no event) rather than
/// after the work queued so far (`ScopedBuffer::retire`, an event each).
#[derive(Clone, Copy)]
struct Motion {
    spin_ns: u64,
    lead: Lead,
    reps: usize,
    reserve: bool,
    at_end: bool,
}

/// A decode loop's time per step, in one scope on one stream, the scope's closing wait included:
/// each step launches `spin_add_one` (`spin_ns` of spin, then one token of 4 KiB written from the
/// step before's). The growing loop maps a new page of `g` bytes (`ScopedBuffer::map_page`) every
/// 8 steps, writes the next 8 tokens there and retires the page before (`ScopedBuffer::retire`),
/// and retires its last page at the end; the preallocated loop writes the same tokens round two
/// pages of a `VirtualBuffer` mapped before, lent the same way, with no map or retire. Both loops
/// are paced alike (`lead`).
///
/// With `reserve`, the growing buffer has a reserve of [`DECODE_RESERVE`] pages over a ring of
/// [`DECODE_RESERVE_RING`] slots: its worker thread makes the pages ahead at the slots the loop
/// maps next, and recycles each retired page in place once its work has finished (else releases
/// it), so the launch thread's `map_page` takes a page with no driver call where the worker was
/// ahead (the printed note says how many of the maps did, how many pages were recycled in place,
/// how many the worker released, and the VMM calls made in all). What these rows
/// measure, beside the ratio: whether the worker's `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`,
/// `cuMemUnmap` and `cuMemRelease`, made on another thread while the launches run, delay the
/// launches (the host-bound row shows it first: any delay of a launch is a delay of its step).
fn decode_row(
    ctx: &Context,
    g: usize,
    kernel: &cuda_vmm::module::Function<'_>,
    stream: &cuda_vmm::Stream,
    motion: Motion,
    rows: &mut Vec<Row>,
) -> BenchResult<()> {
    let Motion {
        spin_ns,
        lead,
        reps,
        reserve,
        at_end,
    } = motion;
    let retire =
        |kv: &cuda_vmm::owned::ScopedBuffer<'_, ReadWrite>, at| retire_page(kv, at, g, at_end);
    let pacer = Pacer::new(ctx, lead)?;
    // Slots of the growing buffer: one run maps `DECODE_STEPS / DECODE_EVERY` pages, at slots after
    // the last run's, whose retires the scope's wait finished (so the next map releases them).
    // With a reserve, the ring it covers whole, so its pages are recycled in place.
    let ring = if reserve {
        DECODE_RESERVE_RING
    } else {
        2 * (DECODE_STEPS / DECODE_EVERY + 1)
    };
    let device = ctx.device();
    let mut growing = cuda_vmm::VirtualBuffer::new(ring * g, &[device], ReadWrite)?;
    if reserve {
        growing.reserve_ahead(cuda_vmm::owned::ReserveOptions::new(
            device,
            g,
            DECODE_RESERVE,
        ))?;
    }
    let mut preallocated = cuda_vmm::VirtualBuffer::new(2 * g, &[device], ReadWrite)?;
    preallocated.grow(device, g)?;
    preallocated.grow(device, g)?;
    let mut next = 0usize;
    let mut grow_loop = || -> BenchResult<()> {
        cuda_vmm::scope(|s| {
            let (w, kv) = (s.on(stream), growing.in_scope(s));
            let mut page = (next % ring) * g;
            next += 1;
            kv.map_page(page, device, g)?;
            let mut tokens = token_slots(&kv, page, DECODE_EVERY)?;
            let mut last = w.memset(&mut tokens[0], 0)?;
            for step in 1..DECODE_STEPS {
                pacer.before(step)?;
                if step % DECODE_EVERY == 0 {
                    let old = page;
                    page = (next % ring) * g;
                    next += 1;
                    kv.map_page(page, device, g)?;
                    tokens = token_slots(&kv, page, DECODE_EVERY)?;
                    last = decode_step(w, kernel, &mut tokens[0], last, spin_ns)?;
                    retire(&kv, old)?; // after the kernel that read its last token
                } else {
                    last = decode_step(w, kernel, &mut tokens[step % DECODE_EVERY], last, spin_ns)?;
                }
                pacer.record(stream, step)?;
            }
            retire(&kv, page)?;
            Ok(())
        })?;
        Ok(())
    };
    let mut fixed_loop = || -> BenchResult<()> {
        cuda_vmm::scope(|s| {
            let (w, kv) = (s.on(stream), preallocated.in_scope(s));
            let mut tokens = token_slots(&kv, 0, DECODE_EVERY)?;
            tokens.extend(token_slots(&kv, g, DECODE_EVERY)?);
            let mut last = w.memset(&mut tokens[0], 0)?;
            for step in 1..DECODE_STEPS {
                pacer.before(step)?;
                let slot = step % tokens.len();
                last = decode_step(w, kernel, &mut tokens[slot], last, spin_ns)?;
                pacer.record(stream, step)?;
            }
            Ok(())
        })?;
        Ok(())
    };
    warm_up(0.3, &mut grow_loop, &mut fixed_loop)?;
    let (grow_t, fixed_t, paired) = race_paired(reps, &mut grow_loop, &mut fixed_loop)?;
    let per_step = 1e6 / float(DECODE_STEPS);
    let (name, goal) = decode_name(motion);
    let pacing = match lead {
        Lead::Unbounded => String::new(),
        Lead::Steps(n) => format!(", the host at most {n} steps ahead"),
    };
    rows.push(Row {
        name: format!(
            "decode loop in one scope, {name} per step{pacing}: mapping + retiring a {} MiB page \
             every {DECODE_EVERY} steps vs a preallocated VirtualBuffer (no map, no retire), per \
             step (us)",
            g >> 20
        ),
        unit: "us",
        safe: grow_t * per_step,
        raw: fixed_t * per_step,
        paired: Some(paired),
        goal,
    });
    if reserve {
        reserve_note(&format!("{name}{pacing}"), growing.stats());
    }
    growing.free()?;
    preallocated.free()?;
    Ok(())
}

/// Retires the page of `g` bytes at `at`: after the work queued so far (`retire`, an event), or
/// at the scope's end (`retire_at_scope_end`, no event).
fn retire_page(
    kv: &cuda_vmm::owned::ScopedBuffer<'_, ReadWrite>,
    at: usize,
    g: usize,
    at_end: bool,
) -> cuda_vmm::Result<usize> {
    if at_end {
        kv.retire_at_scope_end(at..at + g)
    } else {
        kv.retire(at..at + g)
    }
}

/// A decode row's name and goal.
fn decode_name(motion: Motion) -> (&'static str, &'static str) {
    if motion.at_end {
        return if motion.spin_ns == 0 {
            (
                "a kernel with no spin (host-bound), the growing buffer with a reserve, each page \
                 retired at the scope's end (no event)",
                "growing/preallocated <= 1.05",
            )
        } else {
            (
                "a 100 us kernel, the growing buffer with a reserve, each page retired at the \
                 scope's end (no event)",
                "growing/preallocated <= 1.01",
            )
        };
    }
    match (motion.spin_ns, motion.lead, motion.reserve) {
        (0, _, true) => (
            "a kernel with no spin (host-bound), the growing buffer with a reserve",
            "growing/preallocated <= 1.05",
        ),
        (_, Lead::Steps(2), true) => (
            "a 100 us kernel, the growing buffer with a reserve",
            "growing/preallocated <= 1.01",
        ),
        (_, _, true) => ("a 100 us kernel, with a reserve", "report"),
        (0, _, false) => (
            "a kernel with no spin (host-bound)",
            "report: the map and retire calls show",
        ),
        (_, Lead::Unbounded, false) => (
            "a 100 us kernel, the whole loop queued at once (releases land at the next run's start, \
             device idle)",
            "report",
        ),
        (_, Lead::Steps(2), false) => ("a 100 us kernel", "growing/preallocated <= 1.02"),
        (_, Lead::Steps(_), false) => ("a 100 us kernel", "report: more slack for the VMM calls"),
    }
}

/// Prints what a decode row's reserve did: the maps that took a page of it, the retired pages
/// recycled in place, the pages its worker made and the retired ones it released, and the VMM
/// calls made on the buffer in all (the launch thread's and the worker's).
fn reserve_note(row: &str, stats: cuda_vmm::owned::BufferStats) {
    println!(
        "  note ({row}): {} of {} maps took a page of the reserve (no driver call); {} retired \
         pages recycled in place (no driver call); the worker made {} pages ({} of them with the \
         memory of a retired page) and released {} retired ones, {} refused fills; VMM calls in \
         all: {} cuMemMap, {} cuMemSetAccess, {} cuMemUnmap; at most {} pages in the reserve",
        stats.reserve_taken,
        stats.pages_mapped,
        stats.reserve_recycled_in_place,
        stats.reserve_created,
        stats.reserve_recycled,
        stats.released_in_background,
        stats.reserve_faults,
        stats.map_calls,
        stats.set_access_calls,
        stats.unmap_calls,
        stats.reserve_peak_pages,
    );
}

/// `bench parts`: the host-bound decode loop with a reserve (as the row "a kernel with no spin
/// (host-bound), the growing buffer with a reserve"), timed per operation on the host, beside the
/// preallocated loop timed the same way, so the difference per page is split into the map, the
/// token slots, the launches, the retire and the scope's end; and beside them a third loop that
/// lends as the growing one does over pages mapped before (no map, no retire, no reserve). Each
/// figure is the mean over the runs, in microseconds per run of `DECODE_STEPS` steps. Then what
/// the driver calls of a retire and of the reserve's worker cost alone. `bench parts-end`: the
/// same, the growing loop's pages retired at the scope's end (`retire_at_scope_end`, no event).
#[allow(clippy::too_many_lines)] // the three loops side by side, read top to bottom
fn elastic_parts(ctx: &Context, g: usize, at_end: bool) -> BenchResult<()> {
    let module = cuda_vmm::Module::load_ptx(ctx, &std::ffi::CString::new(SPIN_PTX)?)?;
    let kernel = module.function(c"spin_add_one")?;
    let stream = cuda_vmm::Stream::new(ctx)?;
    let device = ctx.device();
    let ring = DECODE_RESERVE_RING;
    let mut growing = cuda_vmm::VirtualBuffer::new(ring * g, &[device], ReadWrite)?;
    growing.reserve_ahead(cuda_vmm::owned::ReserveOptions::new(
        device,
        g,
        DECODE_RESERVE,
    ))?;
    let mut preallocated = cuda_vmm::VirtualBuffer::new(2 * g, &[device], ReadWrite)?;
    preallocated.grow(device, g)?;
    preallocated.grow(device, g)?;
    // The growing loop's lends without its maps and retires: every slot of the ring mapped before
    // the runs, each page's token slots lent as the growing loop lends them (a page every
    // `DECODE_EVERY` steps), nothing mapped or retired; so the lends' and launches' share of the
    // difference is told apart from the maps', the retires' and the reserve worker's.
    let mut spread = cuda_vmm::VirtualBuffer::new(ring * g, &[device], ReadWrite)?;
    for _ in 0..ring {
        spread.grow(device, g)?;
    }
    // [map, slots, launch, retire, scope end, whole run]
    let mut grow_t = [0f64; 6];
    let mut fixed_t = [0f64; 6];
    let mut spread_t = [0f64; 6];
    // Where the growing and the preallocated loop's launches take their time ([`Launches`]).
    let (mut growing_launches, mut prealloc_launches) = (Launches::default(), Launches::default());
    // The first map of each run (the first after the scope's start, where the reserve's worker
    // is woken to take the last run's retires at the scope's end): whether the maps' extra time
    // sits at the run's start.
    let mut first_map = 0f64;
    let mut next = 0usize;
    let reps = 400usize;
    for rep in 0..(2 * reps) {
        let counting = rep >= reps;
        let mut t = [0f64; 6];
        let run = Instant::now();
        let mut inner_end = Instant::now();
        cuda_vmm::scope(|s| {
            let (w, kv) = (s.on(&stream), growing.in_scope(s));
            let mut page = (next % ring) * g;
            next += 1;
            let a = Instant::now();
            kv.map_page(page, device, g)?;
            let took = a.elapsed().as_secs_f64();
            t[0] += took;
            if counting {
                first_map += took;
            }
            let a = Instant::now();
            let mut tokens = token_slots(&kv, page, DECODE_EVERY)?;
            t[1] += a.elapsed().as_secs_f64();
            let mut last = w.memset(&mut tokens[0], 0)?;
            for step in 1..DECODE_STEPS {
                if step % DECODE_EVERY == 0 {
                    let old = page;
                    page = (next % ring) * g;
                    next += 1;
                    let a = Instant::now();
                    kv.map_page(page, device, g)?;
                    t[0] += a.elapsed().as_secs_f64();
                    let a = Instant::now();
                    tokens = token_slots(&kv, page, DECODE_EVERY)?;
                    t[1] += a.elapsed().as_secs_f64();
                    let a = Instant::now();
                    last = decode_step(w, &kernel, &mut tokens[0], last, 0)?;
                    let took = a.elapsed().as_secs_f64();
                    t[2] += took;
                    if counting {
                        growing_launches.count(step, took);
                    }
                    let a = Instant::now();
                    retire_page(&kv, old, g, at_end)?;
                    t[3] += a.elapsed().as_secs_f64();
                } else {
                    let a = Instant::now();
                    last = decode_step(w, &kernel, &mut tokens[step % DECODE_EVERY], last, 0)?;
                    let took = a.elapsed().as_secs_f64();
                    t[2] += took;
                    if counting {
                        growing_launches.count(step, took);
                    }
                }
            }
            let a = Instant::now();
            retire_page(&kv, page, g, at_end)?;
            t[3] += a.elapsed().as_secs_f64();
            inner_end = Instant::now();
            Ok(())
        })?;
        end_run(&mut grow_t, t, (run, inner_end), counting);
        let mut t = [0f64; 6];
        let run = Instant::now();
        let mut inner_end = Instant::now();
        cuda_vmm::scope(|s| {
            let (w, kv) = (s.on(&stream), preallocated.in_scope(s));
            let a = Instant::now();
            let mut tokens = token_slots(&kv, 0, DECODE_EVERY)?;
            tokens.extend(token_slots(&kv, g, DECODE_EVERY)?);
            t[1] += a.elapsed().as_secs_f64();
            let mut last = w.memset(&mut tokens[0], 0)?;
            for step in 1..DECODE_STEPS {
                let slot = step % tokens.len();
                let a = Instant::now();
                last = decode_step(w, &kernel, &mut tokens[slot], last, 0)?;
                let took = a.elapsed().as_secs_f64();
                t[2] += took;
                if counting {
                    prealloc_launches.count(step, took);
                }
            }
            inner_end = Instant::now();
            Ok(())
        })?;
        end_run(&mut fixed_t, t, (run, inner_end), counting);
        let mut t = [0f64; 6];
        let run = Instant::now();
        let mut inner_end = Instant::now();
        cuda_vmm::scope(|s| {
            let (w, kv) = (s.on(&stream), spread.in_scope(s));
            let mut page = 0usize;
            let a = Instant::now();
            let mut tokens = token_slots(&kv, page, DECODE_EVERY)?;
            t[1] += a.elapsed().as_secs_f64();
            let mut last = w.memset(&mut tokens[0], 0)?;
            for step in 1..DECODE_STEPS {
                if step % DECODE_EVERY == 0 {
                    page = (page + g) % (ring * g);
                    let a = Instant::now();
                    tokens = token_slots(&kv, page, DECODE_EVERY)?;
                    t[1] += a.elapsed().as_secs_f64();
                }
                let a = Instant::now();
                last = decode_step(w, &kernel, &mut tokens[step % DECODE_EVERY], last, 0)?;
                t[2] += a.elapsed().as_secs_f64();
            }
            inner_end = Instant::now();
            Ok(())
        })?;
        end_run(&mut spread_t, t, (run, inner_end), counting);
    }
    capture_query_costs(&stream);
    let per = 1e6 / float(reps);
    println!(
        "host-bound decode loop, {DECODE_STEPS} steps per run, us per run (mean of {reps} runs)"
    );
    println!(
        "{:>12} {:>10} {:>10} {:>10} {:>10}",
        "part", "growing", "prealloc", "diff", "spread"
    );
    for (i, name) in [
        "map_page",
        "token slots",
        "launches",
        "retire",
        "scope end",
        "whole run",
    ]
    .iter()
    .enumerate()
    {
        let (a, b, c) = (grow_t[i] * per, fixed_t[i] * per, spread_t[i] * per);
        println!("{name:>12} {a:>10.2} {b:>10.2} {:>10.2} {c:>10.2}", a - b);
    }
    let places = |at: &[f64]| {
        at.iter()
            .map(|x| format!("{:.2}", x * per))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "launches by step within a page (us per run, step % {DECODE_EVERY} = 0..{DECODE_EVERY}; 0 \
         follows a map): growing [{}], prealloc [{}]",
        places(&growing_launches.by_place),
        places(&prealloc_launches.by_place)
    );
    println!(
        "the run's first map: {:.2} us per run (of the map_page row); launches of the run's first \
         page (steps 1..{DECODE_EVERY}): growing {:.2}, prealloc {:.2} us per run",
        first_map * per,
        growing_launches.first_page * per,
        prealloc_launches.first_page * per
    );
    let stats = growing.stats();
    println!("{stats:?}");
    growing.free()?;
    preallocated.free()?;
    spread.free()?;
    Ok(())
}

/// The launch times of a `bench parts` loop, summed over the counted runs: by their step's place
/// within a page (`step % DECODE_EVERY`; 0: the launch right after a map, before the retire), to
/// tell whether a loop's extra launch time follows the maps and retires or is spread evenly; and
/// those of each run's first page (steps `1..DECODE_EVERY`), to tell whether it sits at the run's
/// start.
#[derive(Default)]
struct Launches {
    by_place: [f64; DECODE_EVERY],
    first_page: f64,
}

impl Launches {
    /// Counts the launch of step `step`, which took `took` seconds.
    fn count(&mut self, step: usize, took: f64) {
        if let Some(at) = self.by_place.get_mut(step % DECODE_EVERY) {
            *at += took;
        }
        if step < DECODE_EVERY {
            self.first_page += took;
        }
    }
}

/// Ends one run of a `bench parts` loop: its scope's end and whole time go into `t`'s last two
/// parts (`ends`: when the run began, when its scope's closure returned), and `t` into `sums` where
/// the run is `counting` (after the warm-up runs).
fn end_run(sums: &mut [f64; 6], mut t: [f64; 6], ends: (Instant, Instant), counting: bool) {
    let (run, inner_end) = ends;
    t[4] = inner_end.elapsed().as_secs_f64();
    t[5] = run.elapsed().as_secs_f64();
    if counting {
        for (sum, x) in sums.iter_mut().zip(t) {
            *sum += x;
        }
    }
}

/// What one `cuStreamIsCapturing` costs, nothing capturing: on a created (non-blocking) stream,
/// this thread's per-thread default stream and the legacy default stream (ns per call, the median
/// of 21 batches of 10 000).
fn capture_query_costs(stream: &cuda_vmm::Stream) {
    unsafe extern "C" {
        fn cuStreamIsCapturing(stream: *mut core::ffi::c_void, status: *mut u32) -> u32;
    }
    let targets: [(&str, *mut core::ffi::c_void); 3] = [
        ("created", stream.as_raw().cast()),
        ("per-thread", 2usize as *mut core::ffi::c_void),
        ("legacy", core::ptr::null_mut()),
    ];
    for (name, raw) in targets {
        let mut batches = Vec::new();
        let mut code = 0;
        let mut status = 0u32;
        for _ in 0..21 {
            let start = Instant::now();
            for _ in 0..10_000 {
                // SAFETY: a live stream of the current context (or a special handle);
                // `status` is writable for the call.
                code |= unsafe { cuStreamIsCapturing(core::hint::black_box(raw), &raw mut status) };
            }
            batches.push(start.elapsed().as_secs_f64() * 1e9 / 10_000.0);
        }
        batches.sort_by(f64::total_cmp);
        println!(
            "cuStreamIsCapturing({name}): {:.1} ns (code {code}, status {status})",
            batches[10]
        );
    }
    event_call_costs(stream);
}

/// What one `cuEventRecord` on `stream` (idle) and one `cuEventQuery` of a completed event cost
/// (ns per call, the median of 21 batches of 1 000): a retire's record, and a look of the
/// reserve's worker at a retire's event.
fn event_call_costs(stream: &cuda_vmm::Stream) {
    let mut event = core::ptr::null_mut();
    // SAFETY: `event` is writable; the event is destroyed below.
    if unsafe { raw::cuEventCreate(&raw mut event, 2) } != 0 {
        println!("cuEventCreate refused: no event costs");
        return;
    }
    let s = stream.as_raw().cast::<core::ffi::c_void>();
    let mut code = 0;
    for (name, record) in [("cuEventRecord", true), ("cuEventQuery", false)] {
        let mut batches = Vec::new();
        for _ in 0..21 {
            let start = Instant::now();
            for _ in 0..1_000 {
                // SAFETY: a live event and a live stream of the current context.
                code |= unsafe {
                    if record {
                        raw::cuEventRecord(event, s)
                    } else {
                        raw::cuEventQuery(event)
                    }
                };
            }
            batches.push(start.elapsed().as_secs_f64() * 1e9 / 1_000.0);
            // SAFETY: a live stream.
            code |= unsafe { raw::cuStreamSynchronize(s) };
        }
        batches.sort_by(f64::total_cmp);
        println!("{name}: {:.1} ns (code {code})", batches[10]);
    }
    // SAFETY: the event is idle (the stream was synchronised) and not used again.
    unsafe { raw::cuEventDestroy_v2(event) };
}

/// `count` token slots of [`DECODE_TOKEN`] bytes from byte `from` of `kv`, each lent for writing,
/// in one call (`ScopedBuffer::write_chunks`), as an engine lends the slots of a page it has just
/// mapped.
fn token_slots<'scope>(
    kv: &cuda_vmm::owned::ScopedBuffer<'scope, ReadWrite>,
    from: usize,
    count: usize,
) -> cuda_vmm::Result<Vec<cuda_vmm::stream::Rewritable<'scope, u32>>> {
    kv.write_chunks::<u32>(from..from + count * DECODE_TOKEN, DECODE_TOKEN / 4)
}

/// One decode step: `spin_add_one(token, last, n, spin_ns)` on one block of 256 threads; returns
/// the token written.
fn decode_step<'scope>(
    w: cuda_vmm::stream::ScopedStream<'scope>,
    kernel: &'scope cuda_vmm::module::Function<'_>,
    token: &mut cuda_vmm::stream::Rewritable<'scope, u32>,
    last: cuda_vmm::stream::DeviceInFlight<'scope, u32>,
    spin_ns: u64,
) -> cuda_vmm::Result<cuda_vmm::stream::DeviceInFlight<'scope, u32>> {
    let n = token.len();
    if last.len() != n {
        return Err(cuda_vmm::Error::LengthMismatch {
            expected: n,
            found: last.len(),
        });
    }
    let n32 = u32::try_from(n).map_err(|_| cuda_vmm::Error::Overflow {
        what: "token length",
    })?;
    // SAFETY: `spin_add_one(u32*, const u32*, u32, u64)` takes these four, in this order; it writes
    // `n` values of `token` and reads `n` of `last`, which hold `n` each (checked above).
    let (written, (), (), ()) =
        unsafe { w.launch(kernel, (1, 1, 1), (256, 1, 1), (token, last, n32, spin_ns))? };
    Ok(written)
}

/// A second mapping of a shared page of `g` bytes (the first, read-only in another buffer, stays
/// for the whole row): `VirtualBuffer::map_shared` and `unmap` (`cuMemMap`, `cuMemSetAccess`,
/// `cuMemUnmap`; the share is dropped, the memory stays) against the same raw calls with the same
/// handle at the same address; and the raw calls against themselves (calibration). Both pairs are
/// timed twice: in ABBA order (a report) and with each pair's order drawn at random (the goal).
fn shared_map_rows(ctx: &Context, g: usize, rows: &mut Vec<Row>) -> BenchResult<()> {
    let device = ctx.device();
    let memory = PhysicalAllocation::new(device, g)?;
    let handle = memory.as_raw();
    let page = cuda_vmm::owned::SharedPage::from_allocation(memory);
    let first = cuda_vmm::VirtualBuffer::new(g, &[device], cuda_vmm::ReadOnly)?;
    first.map_shared(0, &page)?;
    let mut second = cuda_vmm::VirtualBuffer::new(g, &[device], ReadWrite)?;
    let at = second.base();
    let (_, desc) = page_props(device);
    let mut safe = || -> BenchResult<()> {
        second.map_shared(0, &page)?;
        second.unmap(..)?;
        Ok(())
    };
    let raw = || -> BenchResult<()> {
        ctx.bind_to_thread()?;
        // SAFETY: `[at, at + g)` is the whole of `second`'s reservation, aligned to the granularity
        // `g`, which `second` maps nothing into between safe runs (each unmaps what it mapped) and
        // no safe run overlaps a raw one; `handle` is the allocation `page` shares, alive for the
        // whole row (`first` and `page` hold shares). Mapped whole, granted whole, unmapped once;
        // the context is current (bound just above).
        unsafe {
            ok(raw::cuMemMap(at, g, 0, handle, 0))?;
            ok(raw::cuMemSetAccess(at, g, &raw const desc, 1))?;
            ok(raw::cuMemUnmap(at, g))
        }
    };
    let mut raw_warm = raw;
    warm_up(0.2, &mut safe, &mut raw_warm)?;
    let mib = g >> 20;
    rows.push(Row::us(
        format!("second mapping of a shared {mib} MiB page, raw vs raw (calibration) (us)"),
        race_paired(5000, raw, raw)?,
        "calibration: ~1",
    ));
    rows.push(Row::us(
        format!(
            "second mapping of a shared {mib} MiB page: VirtualBuffer::map_shared + unmap vs \
             cuMemMap + cuMemSetAccess + cuMemUnmap of the same handle (us)"
        ),
        race_paired(5000, &mut safe, raw)?,
        "report: ABBA, biased here (its calibration above)",
    ));
    // The same two, each pair's order drawn at random ([`race_paired_shuffled`]), which carry the
    // goal: on one H100 on 2026-12-06 the raw calls read 0.9995 to 1.0007 against themselves so
    // in 17 runs, and 0.9893 to 1.0107 in ABBA in the same runs.
    rows.push(Row::us(
        format!(
            "second mapping of a shared {mib} MiB page, raw vs raw, pairs in a random order \
             (calibration) (us)"
        ),
        race_paired_shuffled(5000, raw, raw, 0x5eed_0033)?,
        "calibration: ~1",
    ));
    rows.push(Row::us(
        format!(
            "second mapping of a shared {mib} MiB page: VirtualBuffer::map_shared + unmap vs the \
             raw calls, pairs in a random order (us)"
        ),
        race_paired_shuffled(5000, &mut safe, raw, 0x5eed_0034)?,
        "safe/raw <= 1.01",
    ));
    second.free()?;
    first.free()?;
    page.release()?;
    Ok(())
}

/// The raw graph calls, declared with integer results.
mod raw_graph {
    use core::ffi::c_void;

    unsafe extern "C" {
        pub(crate) fn cuStreamBeginCapture_v2(stream: *mut c_void, mode: u32) -> u32;
        pub(crate) fn cuStreamEndCapture(stream: *mut c_void, graph: *mut *mut c_void) -> u32;
        pub(crate) fn cuGraphInstantiateWithFlags(
            exec: *mut *mut c_void,
            graph: *mut c_void,
            flags: u64,
        ) -> u32;
        pub(crate) fn cuGraphLaunch(exec: *mut c_void, stream: *mut c_void) -> u32;
        pub(crate) fn cuGraphExecDestroy(exec: *mut c_void) -> u32;
        pub(crate) fn cuGraphDestroy(graph: *mut c_void) -> u32;
    }
}

/// Splits `view` into `parts` views of `each` values.
fn chunks(
    mut view: cuda_vmm::DeviceSliceMut<'_, u32>,
    parts: usize,
    each: usize,
) -> BenchResult<Vec<cuda_vmm::DeviceSliceMut<'_, u32>>> {
    let mut out = Vec::with_capacity(parts);
    for _ in 1..parts {
        let (head, rest) = view.split_at_mut(each)?;
        out.push(head);
        view = rest;
    }
    out.push(view);
    Ok(out)
}

/// Graph rows: a graph of 64 small operations (32 memsets of 4 KiB, each read by a `spin_add_one`
/// launch of 1024 values that does not spin), replayed once in a scope, against the same operations
/// queued one by one in a scope (a report: what a graph saves); and the same replay against a raw
/// graph of the same shape captured with raw calls and launched with `cuGraphLaunch` +
/// `cuStreamSynchronize` (the cost of the safe replay).
fn graph_rows(ctx: &Context, rows: &mut Vec<Row>) -> BenchResult<()> {
    const PAIRS: usize = 32;
    const N: usize = 1024;
    const REPS: usize = 2000;
    let module = cuda_vmm::Module::load_ptx(ctx, &std::ffi::CString::new(SPIN_PTX)?)?;
    let kernel = module.function(c"spin_add_one")?;
    let raw_kernel = RawSpin::load(ctx)?;
    let mut stream = cuda_vmm::Stream::new(ctx)?;
    let n32 = u32::try_from(N)?;
    let zeroed = || DeviceBuffer::<u32>::zeroed(ctx, PAIRS * N);
    let (mut gx, mut gy, mut qx, mut qy, rx, ry) = (
        zeroed()?,
        zeroed()?,
        zeroed()?,
        zeroed()?,
        zeroed()?,
        zeroed()?,
    );
    let mut graph_x = chunks(gx.as_mut_slice(), PAIRS, N)?;
    let mut graph_y = chunks(gy.as_mut_slice(), PAIRS, N)?;
    let mut queued_x = chunks(qx.as_mut_slice(), PAIRS, N)?;
    let mut queued_y = chunks(qy.as_mut_slice(), PAIRS, N)?;
    let graph = cuda_vmm::stream::Graph::capture(&mut stream, |c| {
        for (x, y) in graph_x.iter_mut().zip(graph_y.iter_mut()) {
            let set = c.memset(&mut *x, 0)?;
            // SAFETY: `spin_add_one(u32*, const u32*, u32, u64)`, `N` values of each view.
            unsafe { c.launch(&kernel, (4, 1, 1), (256, 1, 1), (&mut *y, set, n32, 0u64))? };
        }
        Ok(())
    })?;
    let replay = || -> BenchResult<()> {
        cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph))?;
        Ok(())
    };
    let mut queued = || -> BenchResult<()> {
        cuda_vmm::scope(|s| {
            let q = s.on(&stream);
            for (x, y) in queued_x.iter_mut().zip(queued_y.iter_mut()) {
                let set = q.memset(&mut *x, 0)?;
                // SAFETY: as above.
                unsafe { q.launch(&kernel, (4, 1, 1), (256, 1, 1), (&mut *y, set, n32, 0u64))? };
            }
            Ok(())
        })?;
        Ok(())
    };
    let (safe, raw_t, paired) = race_paired(REPS / 4, replay, &mut queued)?;
    rows.push(Row {
        name: "graph of 64 ops replayed in a scope vs queued op by op in a scope (us)".into(),
        unit: "us",
        safe: safe * 1e6,
        raw: raw_t * 1e6,
        paired: Some(paired),
        goal: "report",
    });

    launch_rows(ctx, &stream, &graph, &raw_kernel, (&rx, &ry), rows)?;
    drop(graph);
    Ok(())
}

/// The graph launch row of [`graph_rows`]: `graph`'s replay in a scope against a raw graph of the
/// same 64 operations on `rx`/`ry`, captured with raw calls, launched with `cuGraphLaunch` and
/// waited for with `cuStreamSynchronize`; and the scoped graph row (against a raw graph over its own
/// page, and against this raw replay as a report).
fn launch_rows(
    ctx: &Context,
    stream: &cuda_vmm::Stream,
    graph: &cuda_vmm::stream::Graph<'_>,
    raw_kernel: &RawSpin,
    (rx, ry): (&DeviceBuffer<u32>, &DeviceBuffer<u32>),
    rows: &mut Vec<Row>,
) -> BenchResult<()> {
    const REPS: usize = 2000;
    // The raw graph: the same 64 operations on `rx`/`ry`, captured with raw calls.
    let raw_stream = stream.as_raw().cast::<c_void>();
    let (x0, y0) = (rx.as_slice().as_raw_ptr(), ry.as_slice().as_raw_ptr());
    // SAFETY: `rx` and `ry` hold the values the graph touches and outlive it (destroyed below).
    let (raw_graph, exec) = unsafe { raw_graph_of_64(ctx, raw_stream, raw_kernel, (x0, y0))? };
    // SAFETY: the instantiated raw graph, on its stream, waited for before the next launch.
    let raw_replay = || unsafe { replay_raw_graph(ctx, exec, raw_stream) };
    let replay = || -> BenchResult<()> {
        cuda_vmm::scope(|s| s.on(stream).launch_graph(graph))?;
        Ok(())
    };
    let (safe, raw_t, paired) = race_paired(REPS, replay, raw_replay)?;
    let (a, b, calibration) = race_paired(REPS, raw_replay, raw_replay)?;
    scoped_graph_row(ctx, raw_kernel, raw_replay, rows)?;
    // SAFETY: the raw graph's last launch was waited for; destroyed once.
    unsafe { destroy_raw_graph(raw_graph, exec)? };
    rows.push(Row {
        name: "graph launch, raw vs raw (us)".into(),
        unit: "us",
        safe: a * 1e6,
        raw: b * 1e6,
        paired: Some(calibration),
        goal: "calibration: ~1",
    });
    rows.push(Row {
        name: "graph launch: scope + launch_graph vs cuGraphLaunch + cuStreamSynchronize, 64 nodes (us)"
            .into(),
        unit: "us",
        safe: safe * 1e6,
        raw: raw_t * 1e6,
        paired: Some(paired),
        goal: "safe/raw <= 1.01",
    });
    Ok(())
}

/// The raw graph of [`launch_rows`] and [`scoped_graph_row`]: 32 memsets of `N` values at `x0`,
/// each read by a `spin_add_one` of `N` values into `y0` that does not spin, captured on
/// `raw_stream` with raw calls and instantiated. The caller destroys both (after the last launch,
/// waited for).
///
/// # Safety
/// `x0` and `y0` must each start `32 * N` `u32`s of device memory of `ctx`, mapped and granted
/// until the graph is destroyed, which nothing else uses while a launch of the graph runs.
unsafe fn raw_graph_of_64(
    ctx: &Context,
    raw_stream: *mut c_void,
    raw_kernel: &RawSpin,
    (x0, y0): (u64, u64),
) -> BenchResult<(*mut c_void, *mut c_void)> {
    const PAIRS: usize = 32;
    const N: usize = 1024;
    let n32 = u32::try_from(N)?;
    let mut raw_graph = core::ptr::null_mut();
    let mut exec = core::ptr::null_mut();
    ctx.bind_to_thread()?;
    // SAFETY: a live, non-capturing stream of the current context; every address is `N` values
    // at `x0` or `y0`, alive until the caller destroys the graph (the caller's guarantee); the
    // capture is ended and instantiated here.
    unsafe {
        ok(raw_graph::cuStreamBeginCapture_v2(raw_stream, 1))?;
        for i in 0..PAIRS {
            let offset = (i * N * 4) as u64;
            ok(raw_launch::cuMemsetD8Async(
                x0 + offset,
                0,
                N * 4,
                raw_stream,
            ))?;
            raw_kernel.launch(raw_stream, 4, (y0 + offset, x0 + offset, n32, 0))?;
        }
        ok(raw_graph::cuStreamEndCapture(
            raw_stream,
            &raw mut raw_graph,
        ))?;
        ok(raw_graph::cuGraphInstantiateWithFlags(
            &raw mut exec,
            raw_graph,
            0,
        ))?;
    }
    Ok((raw_graph, exec))
}

/// `cuGraphLaunch` of `exec` on `stream`, then `cuStreamSynchronize`: one raw replay, waited for.
///
/// # Safety
/// `exec` must be a live instantiated graph of `ctx`, and `stream` a live stream of `ctx`; the
/// memory its operations touch must be mapped and granted, and used by nothing else until the
/// replay has finished (it has when this returns `Ok`).
unsafe fn replay_raw_graph(
    ctx: &Context,
    exec: *mut c_void,
    stream: *mut c_void,
) -> BenchResult<()> {
    ctx.bind_to_thread()?;
    // SAFETY: the caller's guarantee; the context is current (bound just above).
    unsafe {
        ok(raw_graph::cuGraphLaunch(exec, stream))?;
        ok(raw::cuStreamSynchronize(stream))
    }
}

/// `cuGraphExecDestroy` of `exec`, then `cuGraphDestroy` of `graph`: the pair
/// [`raw_graph_of_64`] made.
///
/// # Safety
/// Both must be live, made together, with no launch of `exec` still running; each is destroyed
/// once.
unsafe fn destroy_raw_graph(graph: *mut c_void, exec: *mut c_void) -> BenchResult<()> {
    // SAFETY: the caller's guarantee.
    unsafe {
        ok(raw_graph::cuGraphExecDestroy(exec))?;
        ok(raw_graph::cuGraphDestroy(graph))
    }
}

/// The scoped graph row: the same 64 operations captured over one page of a `VirtualBuffer`,
/// parked and bound to one long scope over the buffer lent to it (`ParkedGraph::in_scope`), each
/// replay admitting its range (`launch_scoped_graph`; the memsets and kernels write 256 KiB of the
/// page, one range once merged) and waited for on its stream: what the admission of every replay
/// costs in an engine's one scope. Against a raw graph of the same 64 operations over the same
/// bytes of the same page, captured with raw calls on the same stream (`cuGraphLaunch` +
/// `cuStreamSynchronize`): the row with the goal, where only the crate's calls differ. Against
/// `raw_replay` too (the raw graph of [`launch_rows`], over memory of `cuMemAlloc`), a report: the
/// two raw graphs differ by the memory their operations touch.
fn scoped_graph_row(
    ctx: &Context,
    raw_kernel: &RawSpin,
    mut raw_replay: impl FnMut() -> BenchResult<()>,
    rows: &mut Vec<Row>,
) -> BenchResult<()> {
    const PAIRS: usize = 32;
    const N: usize = 1024;
    const REPS: usize = 2000;
    let device = ctx.device();
    let g = allocation_granularity(device, Granularity::Minimum)?;
    let module = cuda_vmm::Module::load_ptx(ctx, &std::ffi::CString::new(SPIN_PTX)?)?;
    let kernel = module.function(c"spin_add_one")?;
    let n32 = u32::try_from(N)?;
    let mut cache = cuda_vmm::VirtualBuffer::new(4 * g, &[device], ReadWrite)?;
    cache.grow(device, g)?;
    let mut capturing = cuda_vmm::Stream::new(ctx)?;
    let stream = cuda_vmm::Stream::new(ctx)?;
    let parked = {
        let view = cache.slice_bytes_mut::<u32>(..2 * PAIRS * N * 4)?;
        let (x, y) = view.split_at_mut(PAIRS * N)?;
        let (mut xs, mut ys) = (chunks(x, PAIRS, N)?, chunks(y, PAIRS, N)?);
        cuda_vmm::stream::Graph::capture(&mut capturing, |c| {
            for (x, y) in xs.iter_mut().zip(ys.iter_mut()) {
                let set = c.memset(&mut *x, 0)?;
                // SAFETY: `spin_add_one(u32*, const u32*, u32, u64)`, `N` values of each view.
                unsafe { c.launch(&kernel, (4, 1, 1), (256, 1, 1), (&mut *y, set, n32, 0u64))? };
            }
            Ok(())
        })?
        .park()
    };
    // The raw graph of the same operations over the same bytes: `x` is the page's first
    // `PAIRS * N` values, `y` the next, as the views split above.
    let raw_stream = stream.as_raw().cast::<c_void>();
    let x0 = cache.base();
    let y0 = x0 + u64::try_from(PAIRS * N * 4)?;
    // SAFETY: the page mapped at `x0` holds both halves (256 KiB of 2 MiB), mapped and granted
    // until `cache` drops, after the graph is destroyed below; only this row's replays touch it,
    // each waited for before the next.
    let (page_graph, page_exec) =
        unsafe { raw_graph_of_64(ctx, raw_stream, raw_kernel, (x0, y0))? };
    // SAFETY: the instantiated raw graph over the page, on its stream, waited for before the next
    // launch (of it or of the scoped graph).
    let raw_page_replay = || unsafe { replay_raw_graph(ctx, page_exec, raw_stream) };
    let mut timed = None;
    let scoped = cuda_vmm::scope(|s| {
        let work = s.on(&stream);
        let kv = cache.in_scope(s);
        let mut graph = parked.in_scope().buffer(&kv).module(&module).finish()?;
        let mut replay = || -> BenchResult<()> {
            work.launch_scoped_graph(&mut graph)?;
            work.synchronize()?;
            Ok(())
        };
        let same_page = race_paired(REPS, &mut replay, raw_page_replay);
        let other_memory = race_paired(REPS, &mut replay, &mut raw_replay);
        timed = Some((same_page, other_memory));
        Ok(())
    });
    // SAFETY: every launch of the raw graph was waited for; destroyed once.
    unsafe { destroy_raw_graph(page_graph, page_exec)? };
    scoped?;
    let (same_page, other_memory) = timed.ok_or("the scoped graph row did not run")?;
    let (safe, raw_t, paired) = same_page?;
    rows.push(Row {
        name: "scoped graph replay: launch_scoped_graph (its one range admitted) + sync in one scope vs \
               cuGraphLaunch + cuStreamSynchronize of the same 64 nodes over the same page (us)"
            .into(),
        unit: "us",
        safe: safe * 1e6,
        raw: raw_t * 1e6,
        paired: Some(paired),
        goal: "safe/raw <= 1.01",
    });
    let (safe, raw_t, paired) = other_memory?;
    rows.push(Row {
        name:
            "scoped graph replay, as above, vs the raw graph of the graph launch row (its 64 nodes \
               over memory of cuMemAlloc) (us)"
                .into(),
        unit: "us",
        safe: safe * 1e6,
        raw: raw_t * 1e6,
        paired: Some(paired),
        goal: "report",
    });
    Ok(())
}

/// Not a row but a printed fact, for reading the decode rows: whether each raw VMM call returns
/// while 50 ms of kernel work is queued on a stream of the same context (work on other memory), or
/// only once the queue has drained. A call that waits for the device stalls a decode loop for as
/// long as the host then needs to queue the next step.
fn vmm_calls_beside_queued_work(
    ctx: &Context,
    g: usize,
    kernel: &cuda_vmm::module::Function<'_>,
    stream: &cuda_vmm::Stream,
) -> BenchResult<()> {
    const QUEUED_NS: u64 = 50_000_000;
    let device = ctx.device();
    let mut busy = cuda_vmm::VirtualBuffer::new(g, &[device], ReadWrite)?;
    busy.grow(device, g)?;
    let reservation = VirtualReservation::new(g, 0)?;
    let at = reservation.base();
    let (prop, desc) = page_props(device);
    let done = cuda_vmm::Event::new(ctx)?;
    let n = u32::try_from(g / 8)?;
    for call in [
        "cuMemCreate",
        "cuMemMap",
        "cuMemSetAccess",
        "cuMemUnmap",
        "cuMemRelease",
    ] {
        let mut handle = 0u64;
        let mut result: BenchResult<(std::time::Duration, bool)> =
            Ok((std::time::Duration::ZERO, false));
        cuda_vmm::scope(|s| {
            let (w, kv) = (s.on(stream), busy.in_scope(s));
            let (mut src, mut dst) = (kv.write::<u32>(..g / 2)?, kv.write::<u32>(g / 2..)?);
            let zeroed = w.memset(&mut src, 0)?;
            ctx.bind_to_thread()?;
            // The calls before the one measured, outside the timed part.
            let mut before = |upto: &str| -> BenchResult<()> {
                // SAFETY: as in `retire_row`'s raw side: a fresh allocation mapped over the whole,
                // unmapped reservation, granted, unmapped and released in that order, once each.
                unsafe {
                    for step in ["cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap"] {
                        if step == upto {
                            break;
                        }
                        match step {
                            "cuMemCreate" => {
                                ok(raw::cuMemCreate(&raw mut handle, g, &raw const prop, 0))?;
                            }
                            "cuMemMap" => ok(raw::cuMemMap(at, g, 0, handle, 0))?,
                            "cuMemSetAccess" => ok(raw::cuMemSetAccess(at, g, &raw const desc, 1))?,
                            _ => ok(raw::cuMemUnmap(at, g))?,
                        }
                    }
                }
                Ok(())
            };
            result = before(call).and_then(|()| {
                // SAFETY: `spin_add_one(u32*, const u32*, u32, u64)`, `n` values of each view.
                unsafe {
                    w.launch(
                        kernel,
                        (64, 1, 1),
                        (256, 1, 1),
                        (&mut dst, zeroed, n, QUEUED_NS),
                    )?
                };
                w.record(&done)?;
                let started = Instant::now();
                // SAFETY: the measured call, on the allocation and range the calls before made.
                unsafe {
                    match call {
                        "cuMemCreate" => {
                            ok(raw::cuMemCreate(&raw mut handle, g, &raw const prop, 0))?;
                        }
                        "cuMemMap" => ok(raw::cuMemMap(at, g, 0, handle, 0))?,
                        "cuMemSetAccess" => ok(raw::cuMemSetAccess(at, g, &raw const desc, 1))?,
                        "cuMemUnmap" => ok(raw::cuMemUnmap(at, g))?,
                        _ => ok(raw::cuMemRelease(handle))?,
                    }
                }
                Ok((started.elapsed(), done.is_complete()?))
            });
            Ok(())
        })?;
        // The rest of the lifecycle, after the scope's wait, so every run starts unmapped.
        ctx.bind_to_thread()?;
        // SAFETY: finishes the lifecycle the calls above began, each call once.
        unsafe {
            let after: &[&str] = match call {
                "cuMemCreate" => &["cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease"],
                "cuMemMap" => &["cuMemSetAccess", "cuMemUnmap", "cuMemRelease"],
                "cuMemSetAccess" => &["cuMemUnmap", "cuMemRelease"],
                "cuMemUnmap" => &["cuMemRelease"],
                _ => &[],
            };
            for step in after {
                match *step {
                    "cuMemMap" => ok(raw::cuMemMap(at, g, 0, handle, 0))?,
                    "cuMemSetAccess" => ok(raw::cuMemSetAccess(at, g, &raw const desc, 1))?,
                    "cuMemUnmap" => ok(raw::cuMemUnmap(at, g))?,
                    _ => ok(raw::cuMemRelease(handle))?,
                }
            }
        }
        let (took, drained) = result?;
        println!(
            "fact: {call} with 50 ms of kernel queued on the context returned after {:.1} us; the \
             queue had {}",
            took.as_secs_f64() * 1e6,
            if drained {
                "DRAINED (the call waited for the device)"
            } else {
                "not drained"
            }
        );
    }
    busy.free()?;
    Ok(())
}

/// The decode loop of [`decode_row`] in raw calls only, a 100 µs kernel per step: a new page mapped
/// (`cuMemCreate`, `cuMemMap`, `cuMemSetAccess`) every 8 steps while the kernels run, against the
/// same loop over two pages mapped before it, both paced alike (`lead`). Each run is timed from its
/// first launch to the end of its `cuStreamSynchronize`.
///
/// - `Lead::Unbounded`: the pages a growing run mapped are unmapped and released after it, untimed:
///   what mapping pages beside running kernels costs the driver alone.
/// - `Lead::Steps(n)`: as the crate's retire and reclaim do, an event (`cuEventRecord`) follows the
///   kernel that read a page's last token, and each new map first releases (`cuMemUnmap`,
///   `cuMemRelease`) the pages whose events have completed (`cuEventQuery`), beside the running
///   kernels; what is still pending at the end is released after the run, untimed. The driver's
///   floor under the crate's paced decode row.
#[allow(clippy::too_many_lines)]
fn raw_decode_row(
    ctx: &Context,
    g: usize,
    raw_kernel: &RawSpin,
    stream: &cuda_vmm::Stream,
    lead: Lead,
    rows: &mut Vec<Row>,
) -> BenchResult<()> {
    const SPIN_NS: u64 = 100_000;
    let device = ctx.device();
    let pages = DECODE_STEPS / DECODE_EVERY + 1;
    let reservation = VirtualReservation::new((pages + 2) * g, 0)?;
    let base = reservation.base();
    let (prop, desc) = page_props(device);
    let raw_stream = stream.as_raw().cast::<c_void>();
    let n = u32::try_from(DECODE_TOKEN / 4)?;
    let token = DECODE_TOKEN as u64;
    let pacer = Pacer::new(ctx, lead)?;
    let release_in_loop = matches!(lead, Lead::Steps(_));
    let map = |at: u64| -> BenchResult<u64> {
        let mut handle = 0u64;
        // SAFETY: a fresh allocation of `g` bytes mapped at `at`, a granularity-aligned, unmapped
        // page of `reservation`, and granted whole; the context is current (bound by the caller).
        unsafe {
            ok(raw::cuMemCreate(&raw mut handle, g, &raw const prop, 0))?;
            ok(raw::cuMemMap(at, g, 0, handle, 0))?;
            ok(raw::cuMemSetAccess(at, g, &raw const desc, 1))?;
        }
        Ok(handle)
    };
    let unmap = |at: u64, handle: u64| -> BenchResult<()> {
        // SAFETY: the mapping `map` made at `at`, once, after every kernel that used it finished
        // (the stream was waited for, or the event recorded after its last use completed).
        unsafe {
            ok(raw::cuMemUnmap(at, g))?;
            ok(raw::cuMemRelease(handle))
        }
    };
    // One event per page that can be pending at once (a run retires `pages - 1` pages in the loop).
    let mut events = Vec::with_capacity(pages);
    for _ in 0..pages {
        let mut event = core::ptr::null_mut();
        ctx.bind_to_thread()?;
        // SAFETY: `event` is writable; flag 2 is CU_EVENT_DISABLE_TIMING; the context is current.
        ok(unsafe { raw::cuEventCreate(&raw mut event, 2) })?;
        events.push(event);
    }
    // Releases the retired pages (address, handle, event index; in retire order) whose events
    // have completed, as the crate's reclaim does.
    let release_finished = |retired: &mut Vec<(u64, u64, usize)>| -> BenchResult<()> {
        while let Some(&(at, handle, e)) = retired.first() {
            // SAFETY: a live event of the current context, recorded on `raw_stream` after the last
            // kernel that read its page; the page is unmapped only once it has completed.
            match unsafe { raw::cuEventQuery(events[e]) } {
                0 => {
                    unmap(at, handle)?;
                    retired.remove(0);
                }
                600 => break, // CUDA_ERROR_NOT_READY
                code => ok(code)?,
            }
        }
        Ok(())
    };
    let fixed_at = base + (pages * g) as u64;
    ctx.bind_to_thread()?;
    let fixed = [map(fixed_at)?, map(fixed_at + g as u64)?];
    let slots_fixed = 2 * g / DECODE_TOKEN;
    let growing = || -> BenchResult<f64> {
        ctx.bind_to_thread()?;
        let mut mapped = vec![(base, map(base)?)];
        // Retired pages: (address, handle, event index), in retire order.
        let mut retired: Vec<(u64, u64, usize)> = Vec::new();
        let started = Instant::now();
        let mut last = base;
        for step in 1..DECODE_STEPS {
            pacer.before(step)?;
            ctx.bind_to_thread()?;
            let page = step / DECODE_EVERY;
            if step % DECODE_EVERY == 0 {
                if release_in_loop {
                    release_finished(&mut retired)?;
                }
                let at = base + (page * g) as u64;
                mapped.push((at, map(at)?));
            }
            let dst = base + (page * g) as u64 + (step % DECODE_EVERY) as u64 * token;
            // SAFETY: `dst` and `last` are `n` values of mapped, granted pages of this run, which
            // are unmapped only after the kernels that use them have finished.
            unsafe { raw_kernel.launch(raw_stream, 1, (dst, last, n, SPIN_NS))? };
            if release_in_loop && step % DECODE_EVERY == 0 {
                // The page before has had its last token read by this kernel: retire it.
                let (at, handle) = mapped.remove(0);
                let e = page - 1;
                // SAFETY: a live event and stream of the current context.
                ok(unsafe { raw::cuEventRecord(events[e], raw_stream) })?;
                retired.push((at, handle, e));
            }
            pacer.record(stream, step)?;
            last = dst;
        }
        // SAFETY: a live stream of the current context.
        ok(unsafe { raw::cuStreamSynchronize(raw_stream) })?;
        let took = started.elapsed().as_secs_f64();
        for (at, handle, _) in retired {
            unmap(at, handle)?;
        }
        for (at, handle) in mapped {
            unmap(at, handle)?;
        }
        Ok(took)
    };
    let preallocated = || -> BenchResult<f64> {
        ctx.bind_to_thread()?;
        let started = Instant::now();
        let mut last = fixed_at;
        for step in 1..DECODE_STEPS {
            pacer.before(step)?;
            let dst = fixed_at + (step % slots_fixed) as u64 * token;
            // SAFETY: `dst` and `last` are `n` values of the two pages mapped before the loop.
            unsafe { raw_kernel.launch(raw_stream, 1, (dst, last, n, SPIN_NS))? };
            pacer.record(stream, step)?;
            last = dst;
        }
        // SAFETY: a live stream of the current context.
        ok(unsafe { raw::cuStreamSynchronize(raw_stream) })?;
        Ok(started.elapsed().as_secs_f64())
    };
    let (grow_t, prealloc_t, paired) = race_paired_parts(40, growing, preallocated)?;
    for (i, handle) in fixed.into_iter().enumerate() {
        unmap(fixed_at + (i * g) as u64, handle)?;
    }
    for event in events {
        // SAFETY: an event created above, destroyed once; the stream was waited for.
        ok(unsafe { raw::cuEventDestroy_v2(event) })?;
    }
    let per_step = 1e6 / float(DECODE_STEPS);
    let (what, goal) = match lead {
        Lead::Unbounded => (
            "the whole loop queued at once, nothing released in the loop".to_string(),
            "report: the driver's floor under the decode row",
        ),
        Lead::Steps(n) => (
            format!(
                "the host at most {n} steps ahead, pages released in the loop once an event \
                 after their last read completed (cuEventRecord, cuEventQuery, cuMemUnmap, \
                 cuMemRelease)"
            ),
            "report: the driver's floor under the paced decode row",
        ),
    };
    rows.push(Row {
        name: format!(
            "raw decode loop, a 100 us kernel per step, {what}: cuMemCreate + cuMemMap + \
             cuMemSetAccess of a {} MiB page every {DECODE_EVERY} steps vs two pages mapped before, \
             per step (us)",
            g >> 20
        ),
        unit: "us",
        safe: grow_t * per_step,
        raw: prealloc_t * per_step,
        paired: Some(paired),
        goal,
    });
    Ok(())
}

/// NCCL's functions the raw sides of the NCCL rows call, with `int` for `ncclResult_t` and the
/// enums (NCCL 2.28's `nccl.h`), from the library kept open as long as the value lives.
#[cfg(feature = "nccl")]
struct RawNccl {
    register: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, *mut *mut c_void) -> i32,
    deregister: unsafe extern "C" fn(*mut c_void, *mut c_void) -> i32,
    #[allow(clippy::type_complexity)]
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        i32,
        i32,
        *mut c_void,
        *mut c_void,
    ) -> i32,
    mem_alloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> i32,
    mem_free: unsafe extern "C" fn(*mut c_void) -> i32,
    send: unsafe extern "C" fn(*const c_void, usize, i32, i32, *mut c_void, *mut c_void) -> i32,
    recv: unsafe extern "C" fn(*mut c_void, usize, i32, i32, *mut c_void, *mut c_void) -> i32,
    group_start: unsafe extern "C" fn() -> i32,
    group_end: unsafe extern "C" fn() -> i32,
    /// Keeps the functions above loaded.
    _library: libloading::Library,
}

#[cfg(feature = "nccl")]
impl RawNccl {
    /// Opens the NCCL that `nccl::version` loaded (its constructors ran already) and looks the
    /// functions up.
    fn load() -> BenchResult<RawNccl> {
        // SAFETY: opening NCCL runs no constructor that has not run yet (the crate loaded it).
        let library = unsafe { libloading::Library::new("libnccl.so.2") }
            .or_else(|_| unsafe { libloading::Library::new("libnccl.so") })?;
        // SAFETY: each field's type is the C signature of its function in NCCL 2.28's `nccl.h`;
        // the pointers are used only while `library`, moved into the value, is open.
        unsafe {
            Ok(RawNccl {
                register: *library.get(b"ncclCommRegister\0")?,
                deregister: *library.get(b"ncclCommDeregister\0")?,
                all_reduce: *library.get(b"ncclAllReduce\0")?,
                mem_alloc: *library.get(b"ncclMemAlloc\0")?,
                mem_free: *library.get(b"ncclMemFree\0")?,
                send: *library.get(b"ncclSend\0")?,
                recv: *library.get(b"ncclRecv\0")?,
                group_start: *library.get(b"ncclGroupStart\0")?,
                group_end: *library.get(b"ncclGroupEnd\0")?,
                _library: library,
            })
        }
    }
}

/// `Ok` for `ncclSuccess`; else the call's name and code.
#[cfg(feature = "nccl")]
fn nccl_ok(code: i32, call: &str) -> BenchResult<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(format!("{call} failed: {code}").into())
    }
}

#[cfg(feature = "nccl")]
thread_local! {
    /// The floor row's stand-in for a group depth, read by every checked registration.
    static FLOOR_GROUP_DEPTH: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
}

/// The floor row's registration: the raw calls behind the cheapest checks a registration of a
/// page table's bytes needs (not inside a group, a non-empty range, every byte on a granted page of
/// a table on the heap, the communicator not aborted), and a guard whose `Drop` deregisters.
/// Hand-written, not the crate's: what no checked wrapper can undercut.
#[cfg(feature = "nccl")]
struct FloorRegistration<'a> {
    raw: &'a RawNccl,
    comm: *mut c_void,
    handle: *mut c_void,
}

#[cfg(feature = "nccl")]
impl<'a> FloorRegistration<'a> {
    /// Checks, then `ncclCommRegister` of `[base + start, base + end)`; not inlined, as a
    /// library's call is not.
    #[inline(never)]
    fn new(
        raw: &'a RawNccl,
        comm: *mut c_void,
        aborted: &core::cell::Cell<bool>,
        pages: &[(usize, usize, bool)],
        base: usize,
        (start, end): (usize, usize),
    ) -> BenchResult<FloorRegistration<'a>> {
        if FLOOR_GROUP_DEPTH.with(core::cell::Cell::get) > 0 || aborted.get() || start >= end {
            return Err("refused".into());
        }
        let index = pages.partition_point(|p| p.1 <= start);
        let mut at = start;
        for &(s, e, granted) in pages.iter().skip(index) {
            if at >= end || s > at || !granted {
                break;
            }
            at = e;
        }
        if at < end {
            return Err("not mapped and granted".into());
        }
        let mut handle = core::ptr::null_mut();
        // SAFETY: a live communicator of the bound context; the bytes are mapped and granted
        // (checked) for the whole row; the handle is deregistered by `Drop`, with nothing queued.
        let code = unsafe {
            (raw.register)(
                comm,
                (base + start) as *mut c_void,
                end - start,
                &raw mut handle,
            )
        };
        nccl_ok(code, "ncclCommRegister")?;
        Ok(FloorRegistration { raw, comm, handle })
    }
}

#[cfg(feature = "nccl")]
impl Drop for FloorRegistration<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle `new` made, deregistered once.
        let _ = unsafe { (self.raw.deregister)(self.comm, self.handle) };
    }
}

/// NCCL (feature `nccl`), one rank on GPU 0: `Comm::register` + drop against raw `ncclCommRegister`
/// and `ncclCommDeregister` of the same bytes (with a raw-against-raw calibration row, and the same
/// raw calls behind a hand-written guard with the cheapest checks, the floor of any checked
/// wrapper), and a single-rank all-reduce (out of place: in place, one rank queues nothing) on
/// `VirtualBuffer` memory lent in `Comm::scope` against the same `ncclAllReduce` +
/// `cuStreamSynchronize` on `ncclMemAlloc` memory. Where NCCL cannot be loaded, a line in
/// `not_run` says why.
#[cfg(feature = "nccl")]
#[allow(clippy::too_many_lines)] // one row group, read top to bottom
fn nccl_rows(ctx: &Context, rows: &mut Vec<Row>, not_run: &mut Vec<String>) -> BenchResult<()> {
    use cuda_vmm::interop::nccl::{self, Comm, ReduceOp};
    use cuda_vmm::{ReadWrite, VirtualBuffer};
    use cudarc::driver::CudaContext;

    const REGISTERED: usize = 64 << 20;
    if let Err(e) = nccl::version() {
        not_run.push(format!("nccl rows: {e}"));
        return Ok(());
    }
    let device = ctx.device();
    if ctx.memory_info()?.0 < 4 * GIB + HEADROOM {
        not_run.push("nccl rows: need 4 GiB free on GPU 0".to_owned());
        return Ok(());
    }
    let raw_nccl = RawNccl::load()?;
    let RawNccl {
        register,
        deregister,
        all_reduce,
        mem_alloc,
        mem_free,
        ..
    } = raw_nccl;
    let stream = CudaContext::new(device.ordinal())?.new_stream()?;
    let comm = Comm::from_devices(&[stream])?.remove(0);
    let (raw_comm, raw_stream) = (comm.as_raw(), comm.stream().cu_stream().cast::<c_void>());

    // Registration.
    let mut buffer = VirtualBuffer::new(GIB, &[device], ReadWrite)?;
    buffer.grow(device, REGISTERED)?;
    let base = usize::try_from(buffer.base())? as *mut c_void;
    let mut safe_register = || -> BenchResult<()> {
        drop(comm.register(&mut buffer, ..REGISTERED)?);
        Ok(())
    };
    let raw_register = || -> BenchResult<()> {
        ctx.bind_to_thread()?;
        let mut handle = core::ptr::null_mut();
        // SAFETY: a live communicator of this context; the bytes are mapped and granted for the
        // whole function; the handle is deregistered at once, with nothing queued on it.
        let code = unsafe { register(raw_comm, base, REGISTERED, &raw mut handle) };
        nccl_ok(code, "ncclCommRegister")?;
        // SAFETY: the handle just made, deregistered once.
        nccl_ok(
            unsafe { deregister(raw_comm, handle) },
            "ncclCommDeregister",
        )
    };
    // One rank: 1 % of the raw pair is about 4 ns, less than one check, so the goal is the excess
    // in time (the median of the paired differences), with the raw calls against themselves as
    // its calibration. The two-rank row's goal is the ratio.
    let excess_row = |name: &str, excess: f64, goal| Row {
        name: format!(
            "nccl: {name}, one rank: the median of the paired differences (ns; the raw column is \
             the bound, 100 ns, the ratio the excess over it)"
        ),
        unit: "ns",
        safe: excess * 1e9,
        raw: 100.0,
        paired: None,
        goal,
    };
    let (a, b, calibration, noise) = race_paired_excess(2000, raw_register, raw_register)?;
    rows.push(Row {
        name: "nccl: ncclCommRegister + ncclCommDeregister of 64 MiB, raw vs raw (us)".to_owned(),
        unit: "us",
        safe: a * 1e6,
        raw: b * 1e6,
        paired: Some(calibration),
        goal: "calibration: ~1",
    });
    rows.push(excess_row(
        "the raw calls minus themselves",
        noise,
        "calibration: ~0 ns",
    ));
    let (safe, raw_t, paired, excess) = race_paired_excess(2000, &mut safe_register, raw_register)?;
    rows.push(Row {
        name: "nccl: Comm::register + drop of 64 MiB of a VirtualBuffer vs the raw calls (us)"
            .to_owned(),
        unit: "us",
        safe: safe * 1e6,
        raw: raw_t * 1e6,
        paired: Some(paired),
        goal: "report: one rank's goal is the excess (next row)",
    });
    rows.push(excess_row(
        "Comm::register + drop minus the raw calls",
        excess,
        "safe - raw <= 100 ns",
    ));
    // The floor of a checked wrapper, against the same raw calls.
    let (pages, aborted) = (vec![(0, REGISTERED, true)], core::cell::Cell::new(false));
    let floor_register = || -> BenchResult<()> {
        ctx.bind_to_thread()?;
        let pages = core::hint::black_box(pages.as_slice());
        let bytes = core::hint::black_box((0, REGISTERED));
        let base = core::hint::black_box(base as usize);
        drop(FloorRegistration::new(
            &raw_nccl, raw_comm, &aborted, pages, base, bytes,
        )?);
        Ok(())
    };
    let (floor, raw_t, paired) = race_paired(2000, floor_register, raw_register)?;
    rows.push(Row {
        name: "nccl: the same raw calls behind the cheapest checks (hand-written: thread-local \
               group depth, range, a one-page table, a flag) and a deregistering guard vs the raw \
               calls (us)"
            .to_owned(),
        unit: "us",
        safe: floor * 1e6,
        raw: raw_t * 1e6,
        paired: Some(paired),
        goal: "report: the floor of a checked wrapper",
    });
    drop(buffer);

    // Single-rank all-reduce, out of place.
    for (label, bytes, reps) in [("64 MiB", 64usize << 20, 500), ("1 GiB", GIB, 100)] {
        let mut buffer = VirtualBuffer::new(2 * bytes, &[device], ReadWrite)?;
        buffer.grow(device, 2 * bytes)?;
        let vmm_send = usize::try_from(buffer.base())? as *const c_void;
        let view = buffer.slice_bytes_mut::<f32>(..)?;
        let (send, mut recv) = view.split_at_mut(bytes / 4)?;
        ctx.bind_to_thread()?;
        let mut raw_memory = core::ptr::null_mut();
        // SAFETY: `raw_memory` is writable; a context is current (bound just above).
        let code = unsafe { mem_alloc(&raw mut raw_memory, 2 * bytes) };
        nccl_ok(code, "ncclMemAlloc")?;
        let mut safe_reduce = || -> BenchResult<()> {
            comm.scope(|s| -> BenchResult<()> {
                let send = s.lend(&send)?;
                let mut recv = s.lend_mut(&mut recv)?;
                s.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
                Ok(())
            })
        };
        let mut raw_reduce = || -> BenchResult<()> {
            ctx.bind_to_thread()?;
            let src = raw_memory.cast_const();
            // SAFETY: `2 * bytes` bytes from `ncclMemAlloc`, alive until after this loop: the
            // first half reduced into the second, `bytes / 4` floats (ncclFloat32 7, ncclSum 0).
            let dst = unsafe { raw_memory.cast::<u8>().add(bytes) }.cast::<c_void>();
            // SAFETY: as above, on the communicator's stream, waited for just below.
            let code = unsafe { all_reduce(src, dst, bytes / 4, 7, 0, raw_comm, raw_stream) };
            nccl_ok(code, "ncclAllReduce")?;
            // SAFETY: the communicator's live stream, of the current context.
            ok(unsafe { raw::cuStreamSynchronize(raw_stream) })
        };
        // The same raw call and wait on the VirtualBuffer's own pages (their address read before
        // the view was lent, so the raw and the crate's runs use the same bytes): what the memory
        // costs, apart from the crate's scope.
        let mut raw_on_vmm = || -> BenchResult<()> {
            ctx.bind_to_thread()?;
            // SAFETY: the buffer's `2 * bytes` mapped, granted bytes, alive until after this loop;
            // no view of them is used while this runs (the runs alternate on one thread): the
            // first half reduced into the second, `bytes / 4` floats (ncclFloat32 7, ncclSum 0).
            let dst = unsafe { vmm_send.cast::<u8>().add(bytes) }
                .cast_mut()
                .cast::<c_void>();
            // SAFETY: as above, on the communicator's stream, waited for just below.
            let code = unsafe { all_reduce(vmm_send, dst, bytes / 4, 7, 0, raw_comm, raw_stream) };
            nccl_ok(code, "ncclAllReduce")?;
            // SAFETY: the communicator's live stream, of the current context.
            ok(unsafe { raw::cuStreamSynchronize(raw_stream) })
        };
        warm_up(0.5, &mut safe_reduce, &mut raw_reduce)?;
        let (on_vmm, on_nccl, paired_memory) = race_paired(reps, &mut raw_on_vmm, &mut raw_reduce)?;
        rows.push(
            Row::gbs(
                format!(
                    "nccl: single-rank all-reduce of {label}, raw ncclAllReduce + synchronize on \
                     the VirtualBuffer's pages vs on ncclMemAlloc memory (GB/s reduced)"
                ),
                bytes,
                on_vmm,
                on_nccl,
                "report: the memory's part",
            )
            .with_paired_times(paired_memory),
        );
        let (lent, raw_vmm_t, paired_scope) = race_paired(reps, &mut safe_reduce, &mut raw_on_vmm)?;
        rows.push(
            Row::gbs(
                format!(
                    "nccl: single-rank all-reduce of {label} on the same VirtualBuffer pages, lent \
                     in Comm::scope vs raw ncclAllReduce + synchronize (GB/s reduced)"
                ),
                bytes,
                lent,
                raw_vmm_t,
                "report: the scope's part",
            )
            .with_paired_times(paired_scope),
        );
        let (safe, raw_t, paired) = race_paired(reps, &mut safe_reduce, &mut raw_reduce)?;
        rows.push(
            Row::gbs(
                format!(
                    "nccl: single-rank all-reduce of {label}, VirtualBuffer lent in Comm::scope vs \
                     ncclAllReduce + synchronize on ncclMemAlloc memory (GB/s reduced)"
                ),
                bytes,
                safe,
                raw_t,
                "safe/raw >= 0.99",
            )
            .with_paired_times(paired),
        );
        // SAFETY: memory from `ncclMemAlloc`, freed once; its last all-reduce was waited for.
        nccl_ok(unsafe { mem_free(raw_memory) }, "ncclMemFree")?;
    }
    nccl_self_transfer_rows(ctx, &comm, &raw_nccl, rows, not_run)?;
    drop(comm);
    drop(raw_nccl);
    Ok(())
}

/// NCCL point to point (feature `nccl`), one rank on GPU 0: a send of the first half of a
/// `VirtualBuffer` to the rank itself and its receive into the second half, in one group, lent in
/// `Comm::scope` (`CommScope::send`, `CommScope::recv`, `nccl::group`), against the same
/// `ncclGroupStart` + `ncclSend` + `ncclRecv` + `ncclGroupEnd` + `cuStreamSynchronize` on the same
/// pages. Where NCCL refuses a rank's transfer to itself, a line in `not_run` says so.
#[cfg(feature = "nccl")]
fn nccl_self_transfer_rows(
    ctx: &Context,
    comm: &cuda_vmm::interop::nccl::Comm,
    raw_nccl: &RawNccl,
    rows: &mut Vec<Row>,
    not_run: &mut Vec<String>,
) -> BenchResult<()> {
    use cuda_vmm::interop::nccl::group;
    use cuda_vmm::{ReadWrite, VirtualBuffer};

    let RawNccl {
        send,
        recv,
        group_start,
        group_end,
        ..
    } = *raw_nccl;
    let device = ctx.device();
    let (raw_comm, raw_stream) = (comm.as_raw(), comm.stream().cu_stream().cast::<c_void>());
    for (label, bytes, reps) in [("64 MiB", 64usize << 20, 500), ("1 GiB", GIB, 100)] {
        let mut buffer = VirtualBuffer::new(2 * bytes, &[device], ReadWrite)?;
        buffer.grow(device, 2 * bytes)?;
        let base = usize::try_from(buffer.base())? as *mut c_void;
        let view = buffer.slice_bytes_mut::<f32>(..)?;
        let (sent, mut received) = view.split_at_mut(bytes / 4)?;
        let mut safe_transfer = || -> BenchResult<()> {
            comm.scope(|s| -> BenchResult<()> {
                let from = s.lend(&sent)?;
                let mut into = s.lend_mut(&mut received)?;
                group(|| -> Result<(), cuda_vmm::Error> {
                    s.send(&from, 0)?;
                    s.recv(&mut into, 0)
                })?;
                Ok(())
            })
        };
        if let Err(e) = safe_transfer() {
            not_run.push(format!(
                "nccl self-transfer rows: NCCL refuses a rank's send to itself: {e}"
            ));
            return Ok(());
        }
        let mut raw_transfer = || -> BenchResult<()> {
            ctx.bind_to_thread()?;
            // SAFETY: the buffer's `2 * bytes` mapped, granted bytes, alive until after this loop;
            // no view of them is used while this runs (the runs alternate on one thread): the
            // first half sent to this rank and received into the second, `bytes / 4` floats
            // (ncclFloat32 7), on the communicator's stream, in one group, waited for below.
            unsafe {
                let into = base.cast::<u8>().add(bytes).cast::<c_void>();
                nccl_ok(group_start(), "ncclGroupStart")?;
                let sent = send(base.cast_const(), bytes / 4, 7, 0, raw_comm, raw_stream);
                let received = recv(into, bytes / 4, 7, 0, raw_comm, raw_stream);
                let ended = group_end();
                nccl_ok(sent, "ncclSend")?;
                nccl_ok(received, "ncclRecv")?;
                nccl_ok(ended, "ncclGroupEnd")?;
                // The communicator's live stream, of the current context.
                ok(raw::cuStreamSynchronize(raw_stream))
            }
        };
        warm_up(0.5, &mut safe_transfer, &mut raw_transfer)?;
        let (safe, raw_t, paired) = race_paired(reps, &mut safe_transfer, &mut raw_transfer)?;
        rows.push(
            Row::gbs(
                format!(
                    "nccl: single-rank send + recv of {label} to itself in one group, \
                     VirtualBuffer pages lent in Comm::scope vs raw ncclSend + ncclRecv in a group \
                     + synchronize on the same pages (GB/s moved)"
                ),
                bytes,
                safe,
                raw_t,
                "safe/raw >= 0.99",
            )
            .with_paired_times(paired),
        );
    }
    Ok(())
}

/// Shareable and evictable owned memory, on GPU 0, each against the raw driver calls of the same
/// work in the same run, with the raw calls against themselves as calibration:
/// - export + send + import of a 5-page `ExportableBuffer` (one message of 5 descriptors over a
///   socket pair in this process, imported as a `VirtualBuffer` and freed) against 5
///   `cuMemExportToShareableHandle`, one `sendmsg` / `recvmsg`, 5 `cuMemImportFromShareableHandle`,
///   `cuMemAddressReserve`, 5 `cuMemMap` + `cuMemSetAccess`, and the teardown the safe drop makes
///   (5 `cuMemUnmap` + `cuMemRelease`, `cuMemAddressFree`); goal <= 1.01;
/// - `evict` + `restore` of a 1 GiB page against `cuMemHostAlloc` + `cuMemcpyDtoH` + `cuMemUnmap` +
///   `cuMemRelease` + `cuMemCreate` + `cuMemMap` + `cuMemSetAccess` + `cuMemcpyHtoD` +
///   `cuMemFreeHost` (the crate pins new host memory for each eviction, as this does); goal <= 1.01;
///   its GB/s (2 GiB moved per round) against the host link (~55 GB/s each way), and the raw round
///   with its pinned memory kept (the floor), goal "report".
///
/// With the argument `motion`, these rows run too, after the graph rows.
// Long: both rows' raw sides are written out call by call, inside this one function.
#[allow(clippy::too_many_lines)]
fn shareable_rows(
    ctx: &Context,
    g: usize,
    rows: &mut Vec<Row>,
    not_run: &mut Vec<String>,
) -> BenchResult<()> {
    /// The export + send + import row.
    #[cfg(unix)]
    fn shareable_export_row(
        ctx: &Context,
        g: usize,
        rows: &mut Vec<Row>,
        not_run: &mut Vec<String>,
    ) -> BenchResult<()> {
        use cuda_vmm::owned::ExportableBuffer;
        use rustix::net::{
            RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
            SendAncillaryMessage, SendFlags,
        };
        use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
        use std::os::unix::net::UnixStream;

        const PIECES: usize = 5;
        let device = ctx.device();
        if !device.supports_posix_fd_handles()? {
            not_run
                .push("export + send + import of a 5-page buffer: no POSIX-fd memory".to_owned());
            return Ok(());
        }
        let budget = 8 * g;
        let buffer = ExportableBuffer::new(budget, &[device], ReadWrite)?;
        for _ in 0..PIECES {
            buffer.grow(device, g)?;
        }
        let (near_end, far_end) = UnixStream::pair()?;
        let safe = || -> BenchResult<()> {
            buffer.export()?.send(&near_end)?;
            let imported = cuda_vmm::VirtualBuffer::receive(&far_end, &[device], ReadWrite)?;
            imported.free()?;
            Ok(())
        };
        let info = buffer.export()?.info().to_bytes();

        // The raw side's own 5 pages, made exportable as POSIX fds, as the buffer's are.
        ctx.bind_to_thread()?;
        let (mut prop, desc) = page_props(device);
        prop.handle_types = 1; // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        let mut handles = [0u64; PIECES];
        for handle in &mut handles {
            // SAFETY: `handle` is writable and `prop` a live, initialised property struct.
            ok(unsafe { raw::cuMemCreate(handle, g, &raw const prop, 0) })?;
        }
        let raw_round = || -> BenchResult<()> {
            let mut fds = Vec::with_capacity(PIECES);
            for &handle in &handles {
                let mut fd: i32 = -1;
                // SAFETY: the driver writes one `int`; `handle` is a live exportable allocation.
                ok(unsafe {
                    raw_ipc::cuMemExportToShareableHandle((&raw mut fd).cast(), handle, 1, 0)
                })?;
                // SAFETY: the driver has just opened `fd` for the caller.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
            let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
            let mut space =
                [core::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(PIECES))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            control.push(SendAncillaryMessage::ScmRights(&borrowed));
            rustix::net::sendmsg(
                &near_end,
                &[std::io::IoSlice::new(&info)],
                &mut control,
                SendFlags::NOSIGNAL,
            )?;
            drop(fds);
            let mut bytes = [0u8; 256];
            let mut space =
                [core::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(PIECES))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            rustix::net::recvmsg(
                &far_end,
                &mut [std::io::IoSliceMut::new(&mut bytes)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            )?;
            let mut received: Vec<OwnedFd> = Vec::with_capacity(PIECES);
            for message in control.drain() {
                if let RecvAncillaryMessage::ScmRights(fds) = message {
                    received.extend(fds);
                }
            }
            if received.len() != PIECES {
                return Err("raw receive: not 5 descriptors".into());
            }
            let mut imported = [0u64; PIECES];
            for (handle, fd) in imported.iter_mut().zip(&received) {
                let fd_value = usize::try_from(fd.as_raw_fd())?;
                // SAFETY: the descriptor's value in the pointer argument, as the driver takes a
                // POSIX fd; `handle` is writable.
                ok(unsafe {
                    raw_ipc::cuMemImportFromShareableHandle(
                        handle,
                        core::ptr::without_provenance_mut(fd_value),
                        1,
                    )
                })?;
            }
            drop(received);
            let mut va = 0u64;
            // SAFETY: `va` is writable; alignment `g` (the granularity), no fixed address, flags 0.
            ok(unsafe { raw::cuMemAddressReserve(&raw mut va, budget, g, 0, 0) })?;
            for (i, &handle) in imported.iter().enumerate() {
                let at = va + (i * g) as u64;
                // SAFETY: `[at, at + g)` lies inside the reservation just made, unmapped, aligned
                // to `g`; `handle` is an imported allocation of `g` bytes.
                ok(unsafe { raw::cuMemMap(at, g, 0, handle, 0) })?;
                // SAFETY: `[at, at + g)` is the whole mapping just made; one live descriptor.
                ok(unsafe { raw::cuMemSetAccess(at, g, &raw const desc, 1) })?;
            }
            for (i, &handle) in imported.iter().enumerate() {
                // SAFETY: unmaps the mapping made above, once; no work used it. Then releases the
                // imported handle, unmapped, once.
                unsafe {
                    ok(raw::cuMemUnmap(va + (i * g) as u64, g))?;
                    ok(raw::cuMemRelease(handle))?;
                }
            }
            // SAFETY: the reservation made above, every mapping in it unmapped, freed once.
            ok(unsafe { raw::cuMemAddressFree(va, budget) })
        };
        if let Err(e) = safe().and_then(|()| raw_round()) {
            not_run.push(format!("export + send + import of a 5-page buffer: {e}"));
        } else {
            let (a, b, calibration) = race_paired(1000, raw_round, raw_round)?;
            rows.push(Row {
                name: "export + send + import, 5-page buffer, raw vs raw (us)".to_owned(),
                unit: "us",
                safe: a * 1e6,
                raw: b * 1e6,
                paired: Some(calibration),
                goal: "calibration: ~1",
            });
            let (safe_t, raw_t, paired) = race_paired(1000, safe, raw_round)?;
            rows.push(Row {
                name: "export + send + import (+ free), 5-page ExportableBuffer, one process (us)"
                    .to_owned(),
                unit: "us",
                safe: safe_t * 1e6,
                raw: raw_t * 1e6,
                paired: Some(paired),
                goal: "safe/raw <= 1.01",
            });
        }
        for handle in handles {
            // SAFETY: allocations made above, never mapped, released once.
            ok(unsafe { raw::cuMemRelease(handle) })?;
        }
        Ok(())
    }

    /// The evict + restore rows.
    fn evict_restore_rows(
        ctx: &Context,
        rows: &mut Vec<Row>,
        not_run: &mut Vec<String>,
    ) -> BenchResult<()> {
        const REPS: usize = 15;
        let device = ctx.device();
        let size = GIB;
        // The buffer's page, the raw page and the one each restore makes before it maps it.
        let need = 3 * size + HEADROOM;
        let (free, _) = ctx.memory_info()?;
        if free < need {
            not_run.push(format!(
                "evict + restore 1 GiB: {} MiB of device memory free, {} MiB needed",
                free >> 20,
                need >> 20
            ));
            return Ok(());
        }
        let mut buffer = cuda_vmm::VirtualBuffer::new(size, &[device], ReadWrite)?;
        buffer.grow(device, size)?;
        // `reuse`: `evict_into` + `restore_host` with pinned memory kept from round to round (made
        // by the first such round); else `evict` + `restore`, which pin new memory each round.
        let mut host_kept: Option<cuda_vmm::PinnedBuffer<u8>> = None;
        let mut safe = |reuse: bool| -> BenchResult<()> {
            if reuse {
                let host = match host_kept.take() {
                    Some(host) => host,
                    None => cuda_vmm::PinnedBuffer::<u8>::zeroed(ctx, size)?,
                };
                let evicted = buffer.evict_into(.., host)?;
                host_kept = Some(buffer.restore_host(evicted)?);
            } else {
                let evicted = buffer.evict(..)?;
                buffer.restore(evicted)?;
            }
            Ok(())
        };

        // The raw side's page, at an address of its own.
        ctx.bind_to_thread()?;
        let (prop, desc) = page_props(device);
        let mut va = 0u64;
        // SAFETY: `va` is writable; alignment 0 (the default), no fixed address, flags 0.
        ok(unsafe { raw::cuMemAddressReserve(&raw mut va, size, 0, 0, 0) })?;
        let mut handle = 0u64;
        // SAFETY: `handle` writable, `prop` live; then the whole reservation mapped with it and
        // granted read-write to `device` (the reservation is `size` bytes, aligned by the driver
        // to the granularity, of which `size` is a multiple).
        unsafe {
            ok(raw::cuMemCreate(&raw mut handle, size, &raw const prop, 0))?;
            ok(raw::cuMemMap(va, size, 0, handle, 0))?;
            ok(raw::cuMemSetAccess(va, size, &raw const desc, 1))?;
        }
        let handle = core::cell::Cell::new(handle);
        // One round: copy out to `host`, unmap and release, create, map, grant, copy back.
        let round = |host: *mut c_void| -> BenchResult<()> {
            let mut new = 0u64;
            // SAFETY: `host` holds `size` pinned bytes (the caller's); `[va, va + size)` is the
            // mapping of `handle`, granted read-write, unmapped and released once here, then
            // mapped again with new memory of the same size and granted; every copy is
            // synchronous with the host for pinned memory, so nothing uses the range meanwhile.
            unsafe {
                ok(raw::cuMemcpyDtoH_v2(host, va, size))?;
                ok(raw::cuMemUnmap(va, size))?;
                ok(raw::cuMemRelease(handle.get()))?;
                ok(raw::cuMemCreate(&raw mut new, size, &raw const prop, 0))?;
                handle.set(new);
                ok(raw::cuMemMap(va, size, 0, new, 0))?;
                ok(raw::cuMemSetAccess(va, size, &raw const desc, 1))?;
                ok(raw::cuMemcpyHtoD_v2(va, host, size))?;
            }
            Ok(())
        };
        // As the crate does: pinned memory made for the eviction and freed after the restore.
        let raw_pinning = || -> BenchResult<()> {
            let mut host = core::ptr::null_mut();
            // SAFETY: `host` is writable; flags 0; `ctx` is current (bound above, and this thread
            // binds no other).
            ok(unsafe { raw::cuMemHostAlloc(&raw mut host, size, 0) })?;
            let done = round(host);
            // SAFETY: memory from `cuMemHostAlloc` just above, freed once; the copies that used it
            // were synchronous.
            ok(unsafe { raw::cuMemFreeHost(host) })?;
            done
        };
        let mut kept = Pinned::new(ctx, size)?;
        let kept_ptr = kept.bytes().as_mut_ptr().cast::<c_void>();
        let raw_kept = || round(kept_ptr);

        let outcome = (|| -> BenchResult<()> {
            let (a, b, calibration) = race_paired(REPS, raw_pinning, raw_pinning)?;
            rows.push(Row {
                name: "evict + restore 1 GiB, raw vs raw (ms)".to_owned(),
                unit: "ms",
                safe: a * 1e3,
                raw: b * 1e3,
                paired: Some(calibration),
                goal: "calibration: ~1",
            });
            let (safe_t, raw_t, paired) = race_paired(REPS, || safe(false), raw_pinning)?;
            rows.push(Row {
                name: "evict + restore 1 GiB, VirtualBuffer (ms)".to_owned(),
                unit: "ms",
                safe: safe_t * 1e3,
                raw: raw_t * 1e3,
                paired: Some(paired),
                goal: "safe/raw <= 1.01",
            });
            rows.push(
                Row::gbs(
                    "evict + restore 1 GiB, 2 GiB moved per round (GB/s; host link ~55 each way)",
                    2 * size,
                    safe_t,
                    raw_t,
                    "report: against ~55 GB/s",
                )
                .with_paired_times(paired),
            );
            let (safe_k, floor_t, paired_k) = race_paired(REPS, || safe(false), raw_kept)?;
            rows.push(Row {
                name: "evict + restore 1 GiB vs raw with its pinned memory kept (ms)".to_owned(),
                unit: "ms",
                safe: safe_k * 1e3,
                raw: floor_t * 1e3,
                paired: Some(paired_k),
                goal: "report: the cost of pinning per eviction",
            });
            let (reuse_t, kept_t, paired_r) = race_paired(REPS, || safe(true), raw_kept)?;
            rows.push(Row {
                name:
                    "evict_into + restore_host 1 GiB, pinned memory kept, vs raw with its pinned \
                       memory kept (ms)"
                        .to_owned(),
                unit: "ms",
                safe: reuse_t * 1e3,
                raw: kept_t * 1e3,
                paired: Some(paired_r),
                goal: "safe/raw <= 1.01",
            });
            rows.push(
                Row::gbs(
                    "evict_into + restore_host 1 GiB, pinned memory kept, 2 GiB moved per round \
                     (GB/s; host link ~55 each way)",
                    2 * size,
                    reuse_t,
                    kept_t,
                    "report: against ~55 GB/s",
                )
                .with_paired_times(paired_r),
            );
            let rate = |t: f64| float(2 * size) / t / 1e9;
            println!(
                "evict + restore 1 GiB: safe {:.1} GB/s, raw {:.1} GB/s, raw with pinned memory \
                 kept {:.1} GB/s, evict_into + restore_host with pinned memory kept {:.1} GB/s \
                 (2 GiB moved per round; pinned host <-> device is ~55 GB/s each way on an H200, \
                 so ~55 GB/s is the ceiling)",
                rate(safe_t),
                rate(raw_t),
                rate(kept_t),
                rate(reuse_t)
            );
            Ok(())
        })();
        drop(kept);
        // SAFETY: the raw page's mapping and memory, and its reservation, each ended once; no
        // copy uses them any more (all synchronous).
        unsafe {
            ok(raw::cuMemUnmap(va, size))?;
            ok(raw::cuMemRelease(handle.get()))?;
            ok(raw::cuMemAddressFree(va, size))?;
        }
        buffer.free()?;
        outcome
    }

    #[cfg(unix)]
    shareable_export_row(ctx, g, rows, not_run)?;
    evict_restore_rows(ctx, rows, not_run)
}

/// NCCL with two ranks in one process (feature `nccl`), GPUs 0 and 1 (`ncclCommInitAll`): the
/// in-place all-reduce's bus bandwidth (for two ranks, the bytes over the time) at 64 MiB and
/// 1 GiB, on `VirtualBuffer` memory registered with each communicator and lent in nested
/// `Comm::scope`s inside one `nccl::group`, against the same two `ncclAllReduce` in
/// `ncclGroupStart` / `ncclGroupEnd` on `ncclMemAlloc` memory followed by `cuStreamSynchronize` of
/// both streams; and unregistered `VirtualBuffer` memory lent the same way against the same raw
/// calls (report). Needs two GPUs: with fewer, a line in `not_run` says so.
#[cfg(feature = "nccl")]
#[allow(clippy::too_many_lines)] // one row group, read top to bottom
fn nccl_two_rank_rows(
    contexts: &[Context],
    rows: &mut Vec<Row>,
    not_run: &mut Vec<String>,
) -> BenchResult<()> {
    use cuda_vmm::interop::nccl::{self, Comm, ReduceOp, group};
    use cuda_vmm::{ReadWrite, VirtualBuffer};
    use cudarc::driver::CudaContext;

    let [ctx0, ctx1, ..] = contexts else {
        not_run.push(format!(
            "nccl two-rank rows (issue: two-GPU runs): need 2 GPUs, found {}",
            contexts.len()
        ));
        return Ok(());
    };
    if let Err(e) = nccl::version() {
        not_run.push(format!("nccl two-rank rows: {e}"));
        return Ok(());
    }
    for ctx in [ctx0, ctx1] {
        if ctx.memory_info()?.0 < 3 * GIB + HEADROOM {
            not_run.push("nccl two-rank rows: need 3 GiB free on each of GPUs 0 and 1".to_owned());
            return Ok(());
        }
    }
    let raw_nccl = RawNccl::load()?;
    let RawNccl {
        register,
        deregister,
        all_reduce,
        mem_alloc,
        mem_free,
        group_start,
        group_end,
        ..
    } = raw_nccl;
    let streams = [
        CudaContext::new(ctx0.device().ordinal())?.new_stream()?,
        CudaContext::new(ctx1.device().ordinal())?.new_stream()?,
    ];
    let comms = Comm::from_devices(&streams)?;
    let raw: Vec<(*mut c_void, *mut c_void)> = comms
        .iter()
        .map(|c| (c.as_raw(), c.stream().cu_stream().cast::<c_void>()))
        .collect();
    // Registration of 64 MiB with each rank's communicator (local calls, no group), and its
    // deregistration, against the raw calls on the same bytes.
    {
        const REGISTERED: usize = 64 << 20;
        let mut buffers = Vec::new();
        for ctx in [ctx0, ctx1] {
            let buffer = VirtualBuffer::new(REGISTERED, &[ctx.device()], ReadWrite)?;
            buffer.grow(ctx.device(), REGISTERED)?;
            buffers.push(buffer);
        }
        let bases: Vec<*mut c_void> = buffers
            .iter()
            .map(|b| usize::try_from(b.base()).map(|a| a as *mut c_void))
            .collect::<Result<_, _>>()?;
        let [b0, b1] = &mut buffers[..] else {
            return Err("two buffers".into());
        };
        let mut safe_register = || -> BenchResult<()> {
            drop(comms[0].register(b0, ..)?);
            drop(comms[1].register(b1, ..)?);
            Ok(())
        };
        let raw_register = || -> BenchResult<()> {
            for ((ctx, &(comm, _)), &base) in [ctx0, ctx1].into_iter().zip(&raw).zip(&bases) {
                ctx.bind_to_thread()?;
                let mut handle = core::ptr::null_mut();
                // SAFETY: a live communicator of this context; the bytes are mapped and granted
                // for the whole block; the handle is deregistered at once, with nothing queued.
                let code = unsafe { register(comm, base, REGISTERED, &raw mut handle) };
                nccl_ok(code, "ncclCommRegister")?;
                // SAFETY: the handle just made, deregistered once.
                nccl_ok(unsafe { deregister(comm, handle) }, "ncclCommDeregister")?;
            }
            Ok(())
        };
        let (a, b, calibration) = race_paired(1000, raw_register, raw_register)?;
        rows.push(Row {
            name: "nccl, two ranks: ncclCommRegister + ncclCommDeregister of 64 MiB on each, raw \
                   vs raw (us)"
                .to_owned(),
            unit: "us",
            safe: a * 1e6,
            raw: b * 1e6,
            paired: Some(calibration),
            goal: "calibration: ~1",
        });
        let (safe_t, raw_t, paired) = race_paired(1000, &mut safe_register, raw_register)?;
        rows.push(Row {
            name: "nccl, two ranks: Comm::register + drop of 64 MiB of a VirtualBuffer on each vs \
                   the raw calls (us)"
                .to_owned(),
            unit: "us",
            safe: safe_t * 1e6,
            raw: raw_t * 1e6,
            paired: Some(paired),
            goal: "safe/raw <= 1.01",
        });
    }
    for (label, bytes, reps) in [("64 MiB", 64usize << 20, 200), ("1 GiB", GIB, 40)] {
        let n = bytes / 4;
        let mut buffers = Vec::new();
        for ctx in [ctx0, ctx1] {
            let buffer = VirtualBuffer::new(bytes, &[ctx.device()], ReadWrite)?;
            buffer.grow(ctx.device(), bytes)?;
            buffers.push(buffer);
        }
        let [b0, b1] = &mut buffers[..] else {
            return Err("two buffers".into());
        };
        let mut raw_memory = [core::ptr::null_mut(); 2];
        for (ctx, memory) in [ctx0, ctx1].into_iter().zip(&mut raw_memory) {
            ctx.bind_to_thread()?;
            // SAFETY: `memory` is writable; the context of the GPU to allocate on is current.
            nccl_ok(unsafe { mem_alloc(memory, bytes) }, "ncclMemAlloc")?;
        }
        let mut raw_reduce = || -> BenchResult<()> {
            // SAFETY: a group of one in-place all-reduce per rank, on `bytes` of each rank's
            // `ncclMemAlloc` memory (alive until after this loop), on its communicator's stream;
            // both streams are waited for below (ncclFloat32 7, ncclSum 0).
            unsafe {
                nccl_ok(group_start(), "ncclGroupStart")?;
                for (&(comm, stream), &memory) in raw.iter().zip(&raw_memory) {
                    let code = all_reduce(memory.cast_const(), memory, n, 7, 0, comm, stream);
                    nccl_ok(code, "ncclAllReduce")?;
                }
                nccl_ok(group_end(), "ncclGroupEnd")?;
            }
            for (ctx, &(_, stream)) in [ctx0, ctx1].into_iter().zip(&raw) {
                ctx.bind_to_thread()?;
                // SAFETY: a live stream of the current context.
                ok(unsafe { raw::cuStreamSynchronize(stream) })?;
            }
            Ok(())
        };
        // The crate's path, registered or not: nested scopes on both communicators' streams, one
        // group around the two collectives (NCCL launches them at its end, inside both scopes).
        let lent_reduce = |v0: &mut cuda_vmm::DeviceSliceMut<'_, f32>,
                           v1: &mut cuda_vmm::DeviceSliceMut<'_, f32>| {
            comms[0].scope(|s0| {
                comms[1].scope(|s1| -> BenchResult<()> {
                    let (mut l0, mut l1) = (s0.lend_mut(v0)?, s1.lend_mut(v1)?);
                    group(|| -> BenchResult<()> {
                        s0.all_reduce_in_place(&mut l0, ReduceOp::Sum)?;
                        s1.all_reduce_in_place(&mut l1, ReduceOp::Sum)?;
                        Ok(())
                    })
                })
            })
        };
        let (safe_t, raw_t, paired) = {
            let (mut r0, mut r1) = (comms[0].register(b0, ..)?, comms[1].register(b1, ..)?);
            let mut v0 = r0.slice_bytes_mut::<f32>(..)?;
            let mut v1 = r1.slice_bytes_mut::<f32>(..)?;
            let mut registered = || lent_reduce(&mut v0, &mut v1);
            warm_up(0.5, &mut registered, &mut raw_reduce)?;
            race_paired(reps, &mut registered, &mut raw_reduce)?
        };
        // Unregistered: another pair of buffers, never registered (a registered buffer gives no
        // view but through its registration).
        let (plain_t, raw_plain_t, paired_plain) = {
            let mut plain = Vec::new();
            for ctx in [ctx0, ctx1] {
                let buffer = VirtualBuffer::new(bytes, &[ctx.device()], ReadWrite)?;
                buffer.grow(ctx.device(), bytes)?;
                plain.push(buffer);
            }
            let [p0, p1] = &mut plain[..] else {
                return Err("two buffers".into());
            };
            let mut v0 = p0.slice_bytes_mut::<f32>(..)?;
            let mut v1 = p1.slice_bytes_mut::<f32>(..)?;
            let mut unregistered = || lent_reduce(&mut v0, &mut v1);
            warm_up(0.5, &mut unregistered, &mut raw_reduce)?;
            race_paired(reps, &mut unregistered, &mut raw_reduce)?
        };
        rows.push(
            Row::gbs(
                format!(
                    "nccl, two ranks (GPUs 0 and 1): all-reduce of {label} in place, registered \
                     VirtualBuffer memory lent in Comm::scope vs ncclAllReduce in a group on \
                     ncclMemAlloc memory, bus bandwidth (GB/s)"
                ),
                bytes,
                safe_t,
                raw_t,
                "safe/raw >= 0.99",
            )
            .with_paired_times(paired),
        );
        rows.push(
            Row::gbs(
                format!(
                    "nccl, two ranks: all-reduce of {label}, unregistered VirtualBuffer memory \
                     lent in Comm::scope vs ncclAllReduce in a group on ncclMemAlloc memory, bus \
                     bandwidth (GB/s)"
                ),
                bytes,
                plain_t,
                raw_plain_t,
                "report",
            )
            .with_paired_times(paired_plain),
        );
        for (ctx, memory) in [ctx0, ctx1].into_iter().zip(raw_memory) {
            ctx.bind_to_thread()?;
            // SAFETY: memory from `ncclMemAlloc`, freed once; its last all-reduce was waited for.
            nccl_ok(unsafe { mem_free(memory) }, "ncclMemFree")?;
        }
    }
    nccl_swap_rows([ctx0, ctx1], &comms, &raw_nccl, rows)?;
    drop(comms);
    drop(raw_nccl);
    Ok(())
}

/// NCCL point to point between two ranks (feature `nccl`), GPUs 0 and 1: each rank sends the first
/// half of its `VirtualBuffer` to the other and receives the other's into its second half, all four
/// transfers in one group, lent in nested `Comm::scope`s, against the same `ncclSend` and
/// `ncclRecv` in `ncclGroupStart` / `ncclGroupEnd` with both streams synchronized, on the same
/// pages.
#[cfg(feature = "nccl")]
fn nccl_swap_rows(
    contexts: [&Context; 2],
    comms: &[cuda_vmm::interop::nccl::Comm],
    raw_nccl: &RawNccl,
    rows: &mut Vec<Row>,
) -> BenchResult<()> {
    use cuda_vmm::interop::nccl::group;
    use cuda_vmm::{ReadWrite, VirtualBuffer};

    let RawNccl {
        send,
        recv,
        group_start,
        group_end,
        ..
    } = *raw_nccl;
    let [c0, c1] = comms else {
        return Err("two communicators".into());
    };
    let raw: [(*mut c_void, *mut c_void); 2] =
        [c0, c1].map(|c| (c.as_raw(), c.stream().cu_stream().cast::<c_void>()));
    for (label, bytes, reps) in [("64 MiB", 64usize << 20, 200), ("1 GiB", GIB, 40)] {
        let mut buffers = Vec::new();
        for ctx in contexts {
            let buffer = VirtualBuffer::new(2 * bytes, &[ctx.device()], ReadWrite)?;
            buffer.grow(ctx.device(), 2 * bytes)?;
            buffers.push(buffer);
        }
        let bases: Vec<*mut c_void> = buffers
            .iter()
            .map(|b| usize::try_from(b.base()).map(|a| a as *mut c_void))
            .collect::<Result<_, _>>()?;
        let [b0, b1] = &mut buffers[..] else {
            return Err("two buffers".into());
        };
        let (s0, mut r0) = b0.slice_bytes_mut::<f32>(..)?.split_at_mut(bytes / 4)?;
        let (s1, mut r1) = b1.slice_bytes_mut::<f32>(..)?.split_at_mut(bytes / 4)?;
        let mut safe_swap = || -> BenchResult<()> {
            c0.scope(|x0| {
                c1.scope(|x1| -> BenchResult<()> {
                    let (from0, mut into0) = (x0.lend(&s0)?, x0.lend_mut(&mut r0)?);
                    let (from1, mut into1) = (x1.lend(&s1)?, x1.lend_mut(&mut r1)?);
                    group(|| -> Result<(), cuda_vmm::Error> {
                        x0.send(&from0, 1)?;
                        x0.recv(&mut into0, 1)?;
                        x1.send(&from1, 0)?;
                        x1.recv(&mut into1, 0)
                    })?;
                    Ok(())
                })
            })
        };
        let mut raw_swap = || -> BenchResult<()> {
            // SAFETY: each rank's buffer of `2 * bytes` mapped, granted bytes, alive until after
            // this loop, no view of them used while this runs: the first half sent to the other
            // rank, the other's received into the second, `bytes / 4` floats (ncclFloat32 7), on
            // each communicator's stream, in one group; both streams are waited for below.
            unsafe {
                nccl_ok(group_start(), "ncclGroupStart")?;
                for (rank, (&(comm, stream), &base)) in raw.iter().zip(&bases).enumerate() {
                    let peer = i32::from(rank == 0);
                    let into = base.cast::<u8>().add(bytes).cast::<c_void>();
                    nccl_ok(
                        send(base.cast_const(), bytes / 4, 7, peer, comm, stream),
                        "ncclSend",
                    )?;
                    nccl_ok(recv(into, bytes / 4, 7, peer, comm, stream), "ncclRecv")?;
                }
                nccl_ok(group_end(), "ncclGroupEnd")?;
            }
            for (ctx, &(_, stream)) in contexts.into_iter().zip(&raw) {
                ctx.bind_to_thread()?;
                // SAFETY: a live stream of the current context.
                ok(unsafe { raw::cuStreamSynchronize(stream) })?;
            }
            Ok(())
        };
        warm_up(0.5, &mut safe_swap, &mut raw_swap)?;
        let (safe, raw_t, paired) = race_paired(reps, &mut safe_swap, &mut raw_swap)?;
        rows.push(
            Row::gbs(
                format!(
                    "nccl, two ranks (GPUs 0 and 1): each sends {label} to the other and receives \
                     the other's in one group, VirtualBuffer pages lent in Comm::scope vs raw \
                     ncclSend + ncclRecv in a group + synchronize on the same pages (GB/s moved \
                     per rank)"
                ),
                bytes,
                safe,
                raw_t,
                "safe/raw >= 0.99",
            )
            .with_paired_times(paired),
        );
    }
    Ok(())
}
