//! Copies queued on streams under `cuda_vmm::scope`, on GPU 0: 64 MiB of pinned host memory goes up
//! into VMM memory and comes back down in 4 MiB chunks, uploads on one stream and downloads on
//! another, each download waiting (through an event) for its chunk's upload. Chunk i+1 goes up while
//! chunk i comes down, so the two directions of the host link overlap. The same copies, one after the
//! other on one stream, are timed for comparison; both runs are checked byte for byte.
//!
//! What the types do here: every chunk (device view, host slice) is borrowed for the scope, so nothing
//! can touch, free or unmap it before `scope` has waited for the streams; the host bytes are read
//! only after it returns. The first upload is also timed with events, next to the wall clock.
//!
//! Run with `./with-libcuda cargo run --release --example async_copies`; without a GPU it says so and
//! exits successfully.

// Each example is its own crate, and this one uses only part of the shared module.
#[allow(dead_code)]
mod common;

use std::process::ExitCode;
use std::time::Instant;

use common::{ExampleResult, devices_or_none, pattern, verify};
use cuda_vmm::{
    Context, DeviceSliceMut, Error, Event, Granularity, PhysicalAllocation, PinnedBuffer,
    ReadWrite, Stream, VirtualReservation, align_size, allocation_granularity,
};

const BYTES: usize = 64 << 20;
const CHUNK_BYTES: usize = 4 << 20;
/// Runs of each kind; the fastest is reported (the first copies of a process warm the link up).
const RUNS: usize = 5;

fn main() -> ExitCode {
    common::exit_code("async_copies", run())
}

fn run() -> ExampleResult {
    println!("async_copies: host <-> device copies on two streams, overlapped");
    let Some(devices) = devices_or_none("there are no copies to queue")? else {
        return Ok(());
    };
    let device = devices[0];
    println!("GPU {}: {}", device.ordinal(), device.name()?);
    let context = Context::new(device)?;

    // VMM memory for the device side.
    let granularity = allocation_granularity(device, Granularity::Minimum)?;
    let size = align_size(BYTES, granularity)?;
    let memory = PhysicalAllocation::new(device, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut region = reservation.region();
    let mut mapping = region.map(&memory)?;
    let mut access = mapping.grant(&context, ReadWrite)?;
    let len = BYTES / 4;
    let chunk = CHUNK_BYTES / 4;
    let mut whole = access.slice_mut::<u32>()?;
    let mut device_chunks = chunks(whole.slice_mut(..len)?, chunk)?;

    // Pinned host memory: the only host memory whose copies overlap.
    let data = pattern(len, 0x5eed);
    let input = PinnedBuffer::from_slice(&context, &data)?;
    let mut output = PinnedBuffer::<u32>::zeroed(&context, len)?;
    let (up, down) = (Stream::new(&context)?, Stream::new(&context)?);

    let (overlapped, upload_ms) = two_streams(
        &mut device_chunks,
        &input,
        &mut output,
        &data,
        [&up, &down],
        &context,
    )?;
    let serial = one_stream(&mut device_chunks, &input, &mut output, &data, &up)?;

    let gb = |seconds: f64| 2.0 * float(BYTES) / seconds / 1e9;
    println!(
        "  {} MiB up and down in {} MiB chunks, fastest of {RUNS}:",
        BYTES >> 20,
        CHUNK_BYTES >> 20
    );
    println!(
        "    two streams (up and down overlapped): {:8.3} ms, {:6.1} GB/s both directions together",
        overlapped * 1e3,
        gb(overlapped)
    );
    println!(
        "    one stream (one after the other):     {:8.3} ms, {:6.1} GB/s",
        serial * 1e3,
        gb(serial)
    );
    println!(
        "    overlap speed-up: {:.2}x (2x where the link carries both directions at full speed)",
        serial / overlapped
    );
    let rate = float(CHUNK_BYTES) / (f64::from(upload_ms) / 1e3) / 1e9;
    println!(
        "  first {} MiB upload, event-timed on the stream: {upload_ms:.3} ms ({rate:.1} GB/s)",
        CHUNK_BYTES >> 20
    );
    println!("async_copies: done");
    Ok(())
}

/// Uploads on `up`, downloads on `down`, each download waiting for its chunk's upload, `RUNS`
/// times; every byte checked after the first run. The fastest run in seconds, and the first upload
/// of the first run as timed by events on the stream, in milliseconds.
fn two_streams(
    device_chunks: &mut [DeviceSliceMut<'_, u32>],
    input: &PinnedBuffer<u32>,
    output: &mut PinnedBuffer<u32>,
    data: &[u32],
    [up, down]: [&Stream; 2],
    context: &Context,
) -> ExampleResult<(f64, f32)> {
    let chunk = CHUNK_BYTES / 4;
    let uploaded = Event::new(context)?;
    let (first_up_start, first_up_end) = (Event::timed(context)?, Event::timed(context)?);
    let mut fastest = f64::INFINITY;
    let mut upload_ms = 0.0;
    for run in 0..RUNS {
        output.fill(0);
        let start = Instant::now();
        cuda_vmm::scope(|s| {
            let (up, down) = (s.on(up), s.on(down));
            let host_chunks = input.chunks(chunk).zip(output.chunks_mut(chunk)?);
            for (i, (device_chunk, (from, to))) in
                device_chunks.iter_mut().zip(host_chunks).enumerate()
            {
                if i == 0 {
                    up.record(&first_up_start)?;
                }
                let on_device = up.copy_from_host(device_chunk, from)?;
                if i == 0 {
                    up.record(&first_up_end)?;
                }
                // The download of this chunk waits for its upload, and only for that: the next
                // upload, queued right after, runs while this download does.
                up.record(&uploaded)?;
                down.wait(&uploaded)?;
                down.copy_to_host(to, on_device)?;
            }
            Ok(())
        })?;
        fastest = fastest.min(start.elapsed().as_secs_f64());
        if run == 0 {
            verify("  two streams: every byte back", output, data)?;
            upload_ms = first_up_start.elapsed_ms(&first_up_end)?;
        }
    }
    Ok((fastest, upload_ms))
}

/// The same copies one after the other on `stream`, `RUNS` times; every byte checked after the
/// first. The fastest run in seconds.
fn one_stream(
    device_chunks: &mut [DeviceSliceMut<'_, u32>],
    input: &PinnedBuffer<u32>,
    output: &mut PinnedBuffer<u32>,
    data: &[u32],
    stream: &Stream,
) -> ExampleResult<f64> {
    let chunk = CHUNK_BYTES / 4;
    let mut fastest = f64::INFINITY;
    for run in 0..RUNS {
        output.fill(0);
        let start = Instant::now();
        cuda_vmm::scope(|s| {
            let q = s.on(stream);
            let host_chunks = input.chunks(chunk).zip(output.chunks_mut(chunk)?);
            for (device_chunk, (from, to)) in device_chunks.iter_mut().zip(host_chunks) {
                let on_device = q.copy_from_host(device_chunk, from)?;
                q.copy_to_host(to, on_device)?;
            }
            Ok(())
        })?;
        fastest = fastest.min(start.elapsed().as_secs_f64());
        if run == 0 {
            verify("  one stream: every byte back", output, data)?;
        }
    }
    Ok(fastest)
}

/// A byte count as `f64`, for rates: exact below 2^53, far beyond any size here.
#[allow(clippy::cast_precision_loss)]
fn float(n: usize) -> f64 {
    n as f64
}

/// `view` cut into consecutive views of `chunk` values (the last may be shorter).
fn chunks(
    mut view: DeviceSliceMut<'_, u32>,
    chunk: usize,
) -> Result<Vec<DeviceSliceMut<'_, u32>>, Error> {
    let mut out = Vec::new();
    while view.len() > chunk {
        let (head, tail) = view.split_at_mut(chunk)?;
        out.push(head);
        view = tail;
    }
    out.push(view);
    Ok(out)
}
