//! The decode step an engine runs, captured once as one CUDA graph and replayed every step over an
//! elastic cache, in one `cuda_vmm::scope`: N sequences of random (seeded) lengths and start steps,
//! each step appending one token's K/V for every live sequence and reading its whole history
//! through a graph table (`GraphTable`), with pages taken as sequences start (`grow`, from a
//! reserve of 4 pages a worker thread keeps mapped ahead) and retired as they end between replays.
//! The graph holds the table's upload and the step's kernel (`decode_step`, a stand-in for paged
//! attention: it appends the new token's K/V through the table and sums the history into the
//! sequence's output block); every replay admits and counts the table's entries as lends, so a page
//! is released only after the replays that may reach it. The host stays at most two steps ahead (an
//! event per step) and otherwise never waits; nothing is captured again.
//!
//! Checked: every output block of every step against a CPU reference, and free device memory back
//! to the byte once every sequence has ended and the reserve is trimmed. Printed: the time per step
//! of the elastic engine against the same engine over a preallocated cache (every lane mapped
//! before the run, none retired), paired in one run (the two alternate, ABAB), with the ratio of
//! the medians.
//!
//! Run with `./with-libcuda cargo run --release --example decode_engine`.

// Each example is its own crate, and this one uses only part of the shared modules.
#[allow(dead_code)]
mod common;
#[allow(dead_code)]
#[path = "common/graph_engine.rs"]
mod graph_engine;

use std::process::ExitCode;
use std::time::Duration;

use common::{ExampleResult, check, first_vmm_device_or_none};
use cuda_vmm::{Context, Granularity, PinnedBuffer, allocation_granularity};
use graph_engine::{GraphEngine, Workload};

/// Sequences (lanes of the table), the most tokens one decodes, the `u32`s of a K/V block (4 KiB).
const LANES: usize = 8;
const HIST: usize = 24;
const LEN: usize = 1024;
/// The kernel's time per step: 100 µs.
const STEP_NS: u64 = 100_000;
/// Pairs of runs timed (elastic, preallocated, elastic, ...).
const ROUNDS: usize = 5;

fn main() -> ExitCode {
    common::exit_code("decode_engine", run())
}

fn run() -> ExampleResult {
    println!("decode_engine: one graph per step, replayed over an elastic cache");
    let Some(device) = first_vmm_device_or_none("there is nothing to decode")? else {
        return Ok(());
    };
    let context = Context::new(device)?;
    let page = allocation_granularity(device, Granularity::Minimum)?;
    let workload = Workload::random(0x5eed_0032, LANES, HIST, LEN);
    println!(
        "  {LANES} sequences, lengths {:?}, starting at steps {:?}: {} steps",
        workload.lengths,
        workload.starts,
        workload.steps()
    );
    let mut engine = GraphEngine::new(&context, page, workload.clone(), STEP_NS)?;
    let mut downloads = PinnedBuffer::<u32>::zeroed(&context, workload.download_blocks() * LEN)?;

    // A first run of each, so that the driver's first-call bookkeeping is in place; both checked.
    for elastic in [true, false] {
        downloads.fill(0);
        engine.run(elastic, Some(&mut downloads))?;
        verify(&workload, &downloads, elastic)?;
    }
    println!("  every output of every step checked, both engines; free memory back to the byte");

    let steps = u32::try_from(workload.steps().max(1))?;
    let (mut elastic, mut preallocated) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        elastic.push(engine.run(true, None)? / steps);
        preallocated.push(engine.run(false, None)? / steps);
    }
    let (e, p) = (median(&mut elastic), median(&mut preallocated));
    println!(
        "  per step: elastic {e:?}, preallocated {p:?}; ratio of the medians {:.4} ({ROUNDS} runs each, alternating; `bench graph` gives the paired ratio)",
        e.as_secs_f64() / p.as_secs_f64()
    );
    Ok(())
}

/// Every step's output block of every live sequence against the CPU's.
fn verify(workload: &Workload, downloads: &PinnedBuffer<u32>, elastic: bool) -> ExampleResult {
    let engine = if elastic { "elastic" } else { "preallocated" };
    for (lane, &length) in workload.lengths.iter().enumerate() {
        for t in 0..length {
            let at = workload.download_block(lane, t) * LEN;
            check(
                downloads.as_slice().get(at..at + LEN) == Some(&workload.expected(lane, t)[..]),
                &format!("{engine}: sequence {lane}, token {t}: its output over its whole history"),
            )?;
        }
    }
    Ok(())
}

fn median(times: &mut [Duration]) -> Duration {
    times.sort_unstable();
    times.get(times.len() / 2).copied().unwrap_or_default()
}
