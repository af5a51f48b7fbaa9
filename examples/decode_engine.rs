//! The decode step an engine runs, in one `cuda_vmm::scope` on two streams: every step appends one
//! token's K/V block per live sequence on the `append` stream, reads it back for the `attend` stream
//! (`ScopedBuffer::read_back`: the crate orders `attend` after the append), uploads every live
//! sequence's whole history into one block table (`BlockTable`) and gathers it there with one kernel
//! launch (`spin_gather`, a stand-in for paged attention) that takes the table as one argument.
//! A sequence's page is mapped when it starts and retired when it ends, while the kernels run. The
//! host stays at most two steps ahead (an event per step), and otherwise never waits.
//!
//! Checked: every step's gather against a CPU reference, and free memory back to the byte once
//! the cache is dropped. Printed: the time per step.
//!
//! Not shown yet: the step captured once as a graph and replayed (a block table is not captured),
//! and the same engine over a preallocated cache, paired.
//!
//! Run with `./with-libcuda cargo run --example decode_engine`.

// Each example is its own crate, and this one uses only part of the shared module.
#[allow(dead_code)]
mod common;

use std::ffi::CString;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use common::{ExampleResult, check, first_vmm_device_or_none, pattern};
use cuda_vmm::stream::{BlockTable, DeviceInFlight};
use cuda_vmm::{
    Context, DeviceBuffer, DeviceSliceMut, Event, Granularity, Module, PinnedBuffer, ReadWrite,
    Stream, VirtualBuffer, allocation_granularity,
};

/// The tokens each sequence decodes; every sequence starts at step 0 and ends after its length.
const LENGTHS: [usize; 8] = [5, 17, 9, 30, 2, 24, 12, 20];
/// The values (`u32`) of one token's K/V block: 4 KiB.
const LEN: usize = 1024;
/// `spin_gather(u32 *out, const u32 *const *table, u32 blocks, u32 len, u64 ns)`.
const GATHER_PTX: &str = include_str!("kernels/spin_gather.ptx");
const GRID: (u32, u32, u32) = (64, 1, 1);
const BLOCK: (u32, u32, u32) = (256, 1, 1);

fn main() -> ExitCode {
    common::exit_code("decode_engine", run())
}

/// The sequences still decoding at `step`.
fn live(step: usize) -> impl Iterator<Item = usize> {
    (0..LENGTHS.len()).filter(move |&seq| LENGTHS.get(seq).is_some_and(|&len| step < len))
}

/// The values of token `t` of sequence `seq`.
fn token(seq: usize, t: usize) -> Vec<u32> {
    pattern(LEN, u32::try_from(seq * 1000 + t).unwrap_or(u32::MAX))
}

fn run() -> ExampleResult {
    println!("decode_engine: append, read back, one block table and one gather per step");
    let Some(device) = first_vmm_device_or_none("there is nothing to decode")? else {
        return Ok(());
    };
    let context = Context::new(device)?;
    let page = allocation_granularity(device, Granularity::Minimum)?;
    let steps = LENGTHS.iter().copied().max().unwrap_or(0);
    check(
        page >= steps * LEN * 4,
        "a page holds a whole sequence's blocks",
    )?;
    let module = Module::load_ptx(&context, &CString::new(GATHER_PTX)?)?;
    let inputs: Vec<PinnedBuffer<u32>> = (0..LENGTHS.len())
        .map(|seq| {
            let all: Vec<u32> = (0..LENGTHS[seq]).flat_map(|t| token(seq, t)).collect();
            PinnedBuffer::from_slice(&context, &all)
        })
        .collect::<Result<_, _>>()?;
    let engine = Engine {
        device,
        page,
        gather: module.function(c"spin_gather")?,
        inputs,
        // Each step's gather: the blocks of every live sequence's history, in sequence order.
        blocks: (0..steps)
            .map(|step| live(step).count() * (step + 1))
            .collect(),
        append: Stream::new(&context)?,
        attend: Stream::new(&context)?,
        paced: [Event::new(&context)?, Event::new(&context)?],
    };
    let total: usize = engine.blocks.iter().sum();
    let mut out = DeviceBuffer::<u32>::zeroed(&context, total * LEN)?;
    let mut out_views: Vec<DeviceSliceMut<'_, u32>> = Vec::new();
    let mut rest = out.as_mut_slice();
    for &b in &engine.blocks {
        let (head, tail) = rest.split_at_mut(b * LEN)?;
        out_views.push(head);
        rest = tail;
    }
    let mut downloads: Vec<PinnedBuffer<u32>> = engine
        .blocks
        .iter()
        .map(|&b| PinnedBuffer::zeroed(&context, b * LEN))
        .collect::<Result<_, _>>()?;
    let capacity = engine.blocks.iter().copied().max().unwrap_or(1);
    let mut table = BlockTable::<u32>::new(&context, capacity, LEN, 2)?;

    // A first pass, so that the driver's first-call bookkeeping is in place before free memory is
    // read; then the measured one.
    engine.pass(&mut out_views, &mut downloads, &mut table)?;
    let (free_before, _) = context.memory_info()?;
    let took = engine.pass(&mut out_views, &mut downloads, &mut table)?;
    println!(
        "  {steps} steps, {total} blocks gathered through the table: {:?} per step",
        took / u32::try_from(steps.max(1))?
    );
    verify_steps(&downloads)?;
    let (free_after, _) = context.memory_info()?;
    check(free_after == free_before, "free memory back to the byte")?;
    println!("  every step checked; free memory back to the byte");
    Ok(())
}

/// What the decode loop runs with, made once.
struct Engine<'m> {
    device: cuda_vmm::Device,
    page: usize,
    gather: cuda_vmm::module::Function<'m>,
    /// Every token of each sequence, in order.
    inputs: Vec<PinnedBuffer<u32>>,
    /// The blocks each step gathers.
    blocks: Vec<usize>,
    append: Stream,
    attend: Stream,
    /// Recorded after each step's download, two in turn: the host's bound on its lead.
    paced: [Event; 2],
}

impl Engine<'_> {
    /// One run of the decode loop over a new cache, dropped at the end (every retired page
    /// released): the time it took.
    fn pass(
        &self,
        out_views: &mut [DeviceSliceMut<'_, u32>],
        downloads: &mut [PinnedBuffer<u32>],
        table: &mut BlockTable<u32>,
    ) -> ExampleResult<Duration> {
        let (device, page) = (self.device, self.page);
        let mut cache = VirtualBuffer::new(LENGTHS.len() * page, &[device], ReadWrite)?;
        let started = Instant::now();
        cuda_vmm::scope(|s| {
            let (append, attend) = (s.on(&self.append), s.on(&self.attend));
            let kv = cache.in_scope(s);
            let mut table = table.in_scope(attend);
            let mut history: Vec<Vec<DeviceInFlight<'_, u32>>> = vec![Vec::new(); LENGTHS.len()];
            let per_step = out_views
                .iter_mut()
                .zip(downloads.iter_mut())
                .zip(&self.blocks);
            for (step, ((out_view, download), &count)) in per_step.enumerate() {
                if step >= 2 {
                    // The host stays at most two steps ahead of the device.
                    self.paced[step % 2].synchronize()?;
                }
                for seq in live(step) {
                    let slot = seq * page;
                    if step == 0 {
                        kv.map_page(slot, device, page)?; // mapped as the sequence starts
                    }
                    let at = slot + step * LEN * 4;
                    let mut kv_block = kv.write::<u32>(at..at + LEN * 4)?;
                    let input = &self.inputs[seq].as_slice()[step * LEN..(step + 1) * LEN];
                    append.copy_from_host(&mut kv_block, input)?;
                    history[seq].push(kv.read_back::<u32>(at..at + LEN * 4, attend)?);
                }
                table.upload(live(step).flat_map(|seq| history[seq].iter().copied()))?;
                let count = u32::try_from(count).map_err(|_| cuda_vmm::Error::Overflow {
                    what: "blocks of a step",
                })?;
                // SAFETY: `spin_gather(u32*, const u32* const*, u32, u32, u64)`: it reads `LEN`
                // values through each of the table's first `count` addresses and writes
                // `count * LEN` values of `out_view`.
                let (gathered, (), (), (), ()) = unsafe {
                    attend.launch(
                        &self.gather,
                        GRID,
                        BLOCK,
                        (out_view, &table, count, LEN as u32, 0u64),
                    )?
                };
                attend.copy_to_host(download, gathered)?;
                attend.record(&self.paced[step % 2])?;
                for seq in live(step).filter(|&seq| LENGTHS[seq] == step + 1) {
                    kv.retire(seq * page..(seq + 1) * page)?; // released once the device passes it
                    history[seq].clear();
                }
            }
            Ok(())
        })?;
        let took = started.elapsed();
        cache.reclaim()?;
        check(cache.retired_bytes() == 0, "every retired page released")?;
        drop(cache);
        Ok(took)
    }
}

/// Every step's gather against the CPU's: the whole history of every live sequence, in order.
fn verify_steps(downloads: &[PinnedBuffer<u32>]) -> ExampleResult {
    for (step, download) in downloads.iter().enumerate() {
        let expected: Vec<u32> = live(step)
            .flat_map(|seq| (0..=step).flat_map(move |t| token(seq, t)))
            .collect();
        check(
            download.as_slice() == expected.as_slice(),
            &format!("step {step}: every live sequence's whole history"),
        )?;
    }
    Ok(())
}
