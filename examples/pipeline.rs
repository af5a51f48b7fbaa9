//! A producer/consumer pipeline over two GPUs under one `cuda_vmm::scope`, its stages overlapped.
//!
//! GPU 0 produces batches into VMM memory: a kernel (`spin_add_one`, standing in for work of a known
//! duration: it waits `STAGE`, then adds one) writes batch i into slot i of one mapping. GPU 1
//! consumes each batch once it is produced: its stream waits for an event recorded on GPU 0's
//! stream, then a kernel adds one again.
//! - Over the link (where GPU 1 can access GPU 0): the mapping is granted to both GPUs (`grant_all`),
//!   and GPU 1's kernel reads the slot directly.
//! - Staged (where it cannot, or with `--staged`): the mapping is granted to GPU 0 only; GPU 0's
//!   stream also downloads the batch into pinned host memory, and GPU 1's stream uploads it into its
//!   own memory before its kernel.
//!
//! While GPU 1 consumes batch i, GPU 0 already produces batch i+1. The same work is then run stage
//! after stage (GPU 0 waits, through a second event, for GPU 1 to finish each batch before it starts
//! the next), and both times are printed. Both runs are checked: every value is its input plus two.
//!
//! What the types do here: each slot, input, output and host chunk is lent to the scope, so none can
//! be unmapped, regranted, freed or read on the host before the scope has waited for both GPUs; the
//! consumer reads what the producer wrote through the `DeviceInFlight` the producer's launch handed
//! back, which only queued work (ordered behind an event) can read; a view GPU 1 cannot reach is
//! refused before the driver.
//!
//! Run with `./with-libcuda cargo run --release --example pipeline [-- --staged]`. Needs two GPUs with
//! VMM support; with fewer it says so and exits successfully.

// Each example is its own crate, and this one uses only part of the shared module.
#[allow(dead_code)]
mod common;

use std::ffi::CString;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use common::{ExampleResult, check, pattern, two_or_more_devices_or_none, verify};
use cuda_vmm::{
    Context, DeviceBuffer, DeviceSlice, DeviceSliceMut, Error, Event, Granularity, Module,
    PhysicalAllocation, PinnedBuffer, ReadWrite, Stream, VirtualReservation, align_size,
    allocation_granularity, module::Function, peer::can_access_peer, stream::PinnedSliceMut,
};

/// Batches per run.
const BATCHES: usize = 8;
/// Values per batch (4 MiB of `u32`).
const BATCH: usize = 1 << 20;
/// How long each stage's kernel works on a batch.
const STAGE: Duration = Duration::from_millis(4);
/// `spin_add_one(u32 *dst, const u32 *src, u32 n, u64 ns)`.
const SPIN_PTX: &str = include_str!("kernels/spin_add_one.ptx");
/// One wave of blocks (the kernel strides over the batch).
const GRID: (u32, u32, u32) = (64, 1, 1);
const BLOCK: (u32, u32, u32) = (256, 1, 1);

fn main() -> ExitCode {
    common::exit_code("pipeline", run())
}

/// How GPU 1 gets at a batch.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path {
    /// Its kernel reads GPU 0's memory over the link.
    Link,
    /// Through pinned host memory, on both GPUs' streams.
    Staged,
}

/// The two stages' kernels and streams, and the event between them.
struct Stages<'a> {
    produce: &'a Function<'a>,
    consume: &'a Function<'a>,
    gpu0: &'a Stream,
    gpu1: &'a Stream,
    /// Recorded on GPU 0 after each batch; GPU 1 waits for it.
    produced: &'a Event,
    /// Recorded on GPU 1 after each batch; GPU 0 waits for it in the stage-after-stage run only.
    consumed: &'a Event,
}

/// Everything a run lends to its scope: views of the whole program (`'v`) and of one run (`'r`).
struct Batches<'s, 'v, 'r> {
    inputs: &'s [DeviceSlice<'v, u32>],
    slots: &'s mut [DeviceSliceMut<'v, u32>],
    /// Staged path: pinned host memory and GPU 1's landing buffers (unused over the link).
    hops: PinnedSliceMut<'s, u32>,
    landings: &'s mut [DeviceSliceMut<'r, u32>],
    outputs: &'s mut [DeviceSliceMut<'r, u32>],
}

fn run() -> ExampleResult {
    println!("pipeline: GPU 0 produces, GPU 1 consumes, stages overlapped");
    let Some(devices) = two_or_more_devices_or_none(
        "there is no pipeline to run",
        "the two-GPU pipeline is skipped",
    )?
    else {
        return Ok(());
    };
    let (d0, d1) = (devices[0], devices[1]);
    if !d0.supports_vmm()? {
        println!("GPU 0 has no VMM support: the pipeline's slots are VMM memory; skipped");
        return Ok(());
    }
    let forced_staged = std::env::args().any(|a| a == "--staged");
    let linked = can_access_peer(d1, d0)?.is_some();
    let path = if linked && !forced_staged {
        Path::Link
    } else {
        Path::Staged
    };
    println!(
        "GPU 0: {}; GPU 1: {}; GPU 1 {} access GPU 0: path {path:?}{}",
        d0.name()?,
        d1.name()?,
        if linked { "can" } else { "cannot" },
        if forced_staged { " (--staged)" } else { "" }
    );
    let (c0, c1) = (Context::new(d0)?, Context::new(d1)?);
    let ptx = CString::new(SPIN_PTX)?;
    let (m0, m1) = (Module::load_ptx(&c0, &ptx)?, Module::load_ptx(&c1, &ptx)?);
    let (produce, consume) = (m0.function(c"spin_add_one")?, m1.function(c"spin_add_one")?);
    let (gpu0, gpu1) = (Stream::new(&c0)?, Stream::new(&c1)?);
    let (produced, consumed) = (Event::new(&c0)?, Event::new(&c1)?);
    let stages = Stages {
        produce: &produce,
        consume: &consume,
        gpu0: &gpu0,
        gpu1: &gpu1,
        produced: &produced,
        consumed: &consumed,
    };

    // The slots: one VMM mapping on GPU 0, granted to both GPUs over the link, to GPU 0 alone
    // otherwise (GPU 1 then has no access, and the staged path moves the batches).
    let total = BATCHES * BATCH;
    let size = align_size(total * 4, allocation_granularity(d0, Granularity::Minimum)?)?;
    let memory = PhysicalAllocation::new(d0, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut region = reservation.region();
    let mut mapping = region.map(&memory)?;
    let (both, alone) = ([&c0, &c1], [&c0]);
    let granted: &[&Context] = if path == Path::Link { &both } else { &alone };
    let mut access = mapping.grant_all(granted, ReadWrite)?;
    let mut slots_view = access.slice_mut::<u32>()?;
    let mut slots = split(slots_view.slice_mut(..total)?)?;

    let data = pattern(total, 0xba7c);
    let input = DeviceBuffer::from_host(&c0, &data)?;
    let inputs: Vec<DeviceSlice<'_, u32>> = (0..BATCHES)
        .map(|i| input.as_slice().slice(i * BATCH..(i + 1) * BATCH))
        .collect::<Result<_, _>>()?;
    let [overlapped, serial] = timed_runs(&stages, path, &inputs, &mut slots, &data, &c0, &c1)?;
    let batches = f64::from(BATCHES as u32);
    println!(
        "  {BATCHES} batches of {} MiB, each stage {STAGE:?} per batch, path {path:?}:",
        (BATCH * 4) >> 20
    );
    println!(
        "    stages overlapped: {:8.2} ms",
        overlapped.as_secs_f64() * 1e3
    );
    println!(
        "    stage after stage: {:8.2} ms",
        serial.as_secs_f64() * 1e3
    );
    println!(
        "    overlap speed-up: {:.2}x (at most {:.2}x for two equal stages over {BATCHES} batches)",
        serial.as_secs_f64() / overlapped.as_secs_f64(),
        2.0 * batches / (batches + 1.0)
    );
    check(overlapped < serial, "  the overlapped pipeline is faster")?;
    println!("pipeline: done");
    Ok(())
}

/// The pipeline run overlapped, then stage after stage, each first untimed (the first launches and
/// copies warm up) and then timed, every run checked; the two timed durations. Output and landing
/// buffers are on GPU 1 (`c1`), the pinned host memory is pinned in GPU 0's context (`c0`).
fn timed_runs<'v>(
    stages: &Stages<'_>,
    path: Path,
    inputs: &[DeviceSlice<'v, u32>],
    slots: &mut [DeviceSliceMut<'v, u32>],
    data: &[u32],
    c0: &Context,
    c1: &Context,
) -> ExampleResult<[Duration; 2]> {
    let total = data.len();
    let expected: Vec<u32> = data.iter().map(|x| x.wrapping_add(2)).collect();
    let mut output = DeviceBuffer::<u32>::zeroed(c1, total)?;
    let through_host = path == Path::Staged;
    // Staged path only: GPU 1's copy of each batch, and the pinned host memory it travels through.
    let mut landing = DeviceBuffer::<u32>::zeroed(c1, if through_host { total } else { 1 })?;
    let mut hop = PinnedBuffer::<u32>::zeroed(c0, if through_host { total } else { 1 })?;

    let mut times = [Duration::ZERO; 2];
    for (overlapped, time) in [true, false].into_iter().zip(&mut times) {
        // An untimed run (the first launches and copies warm up), then the timed one; both checked.
        for timed in [false, true] {
            output.as_mut_slice().copy_from_host(&vec![0; total])?;
            let mut outputs = split(output.as_mut_slice())?;
            let mut landings = if through_host {
                split(landing.as_mut_slice())?
            } else {
                Vec::new()
            };
            let mut batches = Batches {
                inputs,
                slots: &mut *slots,
                hops: hop.as_pinned_mut(),
                landings: &mut landings,
                outputs: &mut outputs,
            };
            let start = Instant::now();
            pipeline(stages, path, overlapped, &mut batches)?;
            if timed {
                *time = start.elapsed();
            }
            let what = if overlapped {
                "stages overlapped"
            } else {
                "stage after stage"
            };
            verify(
                &format!("  {what}: every value is its input plus two"),
                &output.as_slice().to_vec()?,
                &expected,
            )?;
        }
    }
    Ok(times)
}

/// One run of every batch in one scope: GPU 0 produces batch i into slot i; GPU 1 waits for it
/// (an event) and consumes it into output i, over the link or through host memory. With
/// `overlapped` false, GPU 0 also waits for GPU 1 to finish each batch before producing the next.
fn pipeline(
    stages: &Stages<'_>,
    path: Path,
    overlapped: bool,
    batches: &mut Batches<'_, '_, '_>,
) -> Result<(), Error> {
    let n = u32::try_from(BATCH).map_err(|_| Error::InvalidArgument {
        what: "batch length",
    })?;
    let ns = u64::try_from(STAGE.as_nanos()).unwrap_or(u64::MAX);
    cuda_vmm::scope(|s| {
        let (gpu0, gpu1) = (s.on(stages.gpu0), s.on(stages.gpu1));
        let mut hops = batches.hops.chunks_mut(BATCH)?;
        let mut landings = batches.landings.iter_mut();
        let work = batches
            .inputs
            .iter()
            .zip(batches.slots.iter_mut())
            .zip(batches.outputs.iter_mut());
        for ((&input, slot), output) in work {
            // SAFETY: `spin_add_one(u32 *dst, const u32 *src, u32 n, u64 ns)` takes these four, in
            // this order, and writes the `n` values of `slot` (`n` long) from the `n` of `input`.
            let (made, (), (), ()) =
                unsafe { gpu0.launch(stages.produce, GRID, BLOCK, (slot, input, n, ns)) }?;
            let source = match path {
                Path::Link => {
                    gpu0.record(stages.produced)?;
                    gpu1.wait(stages.produced)?;
                    // GPU 1 reads slot i over the link (granted to both GPUs).
                    made
                }
                Path::Staged => {
                    let (Some(hop), Some(landing)) = (hops.next(), landings.next()) else {
                        return Err(Error::LengthMismatch {
                            expected: BATCHES,
                            found: 0,
                        });
                    };
                    let on_host = gpu0.copy_to_host(hop, made)?;
                    gpu0.record(stages.produced)?;
                    gpu1.wait(stages.produced)?;
                    gpu1.copy_from_host(landing, on_host)?
                }
            };
            // SAFETY: as above, on GPU 1: writes the `n` values of `output` from the `n` of `source`.
            unsafe { gpu1.launch(stages.consume, GRID, BLOCK, (output, source, n, ns)) }?;
            if !overlapped {
                gpu1.record(stages.consumed)?;
                gpu0.wait(stages.consumed)?;
            }
        }
        Ok(())
    })
}

/// `view` cut into `BATCHES` consecutive views of `BATCH` values.
fn split(mut view: DeviceSliceMut<'_, u32>) -> Result<Vec<DeviceSliceMut<'_, u32>>, Error> {
    let mut out = Vec::with_capacity(BATCHES);
    for _ in 1..BATCHES {
        let (head, tail) = view.split_at_mut(BATCH)?;
        out.push(head);
        view = tail;
    }
    out.push(view);
    Ok(out)
}
