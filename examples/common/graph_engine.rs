//! A toy paged-attention decode engine whose step is one CUDA graph, captured once and replayed
//! every step over an elastic cache: shared by `examples/decode_engine.rs` and the bench's decode
//! rows (`examples/bench.rs`, `motion`).
//!
//! Each sequence owns one lane: a page of the cache (its K/V blocks, then its output blocks), taken
//! when it starts (`grow`, from a reserve of [`RESERVE`] pages that a worker thread keeps mapped
//! ahead, so the launch thread makes no VMM call) and retired when it ends (elastic), or mapped
//! before the run at the lane's own slot and kept (preallocated). Each step sets, for every live
//! sequence, the graph table's entries (the K/V block the step appends, the new token's K/V, the
//! output block, and the history read back), then replays the graph: the table's upload and
//! `decode_step` (`kernels/decode_step.ptx`). The host stays at most two steps ahead (an event per
//! step).

use std::error::Error;
use std::ffi::CString;
use std::time::{Duration, Instant};

use cuda_vmm::owned::ReserveOptions;
use cuda_vmm::stream::{Graph, GraphTable, ParkedGraph, PinnedSliceMut};
use cuda_vmm::{
    Context, Device, DeviceBuffer, Event, Module, PinnedBuffer, ReadWrite, Stream, VirtualBuffer,
};

type Result<T = (), E = Box<dyn Error>> = core::result::Result<T, E>;

/// The pages the elastic cache's reserve keeps mapped ahead (`VirtualBuffer::reserve_ahead`):
/// memory the engine holds beyond its live pages, enough for the sequences that start within
/// one refill (a page takes the worker about 50 µs; a step, 100 µs of kernel and more).
pub(crate) const RESERVE: usize = 4;

/// `decode_step(const u64 *table, u32 seqs, u32 hist, u32 len, u64 ns)`.
const DECODE_STEP_PTX: &str = include_str!("../kernels/decode_step.ptx");
const GRID: (u32, u32, u32) = (32, 1, 1);
const BLOCK: (u32, u32, u32) = (256, 1, 1);

/// The sequences a run decodes: lane `s` holds one sequence, which starts at `starts[s]` and
/// decodes `lengths[s]` tokens.
#[derive(Debug, Clone)]
pub(crate) struct Workload {
    pub(crate) starts: Vec<usize>,
    pub(crate) lengths: Vec<usize>,
    /// The most tokens a sequence decodes: the history entries of a lane.
    pub(crate) hist: usize,
    /// The `u32`s of one token's K/V block.
    pub(crate) len: usize,
}

impl Workload {
    /// `lanes` sequences of random lengths in `2..=hist`, starting at random steps in `0..hist / 2`,
    /// from `seed` (a xorshift generator: the same seed, the same sequences).
    pub(crate) fn random(seed: u64, lanes: usize, hist: usize, len: usize) -> Workload {
        let mut state = seed | 1;
        let mut next = move |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            usize::try_from(state % n.max(1) as u64).unwrap_or(0)
        };
        let lengths = (0..lanes).map(|_| 2 + next(hist - 1)).collect();
        let starts = (0..lanes).map(|_| next(hist / 2)).collect();
        Workload {
            starts,
            lengths,
            hist,
            len,
        }
    }

    pub(crate) fn lanes(&self) -> usize {
        self.lengths.len()
    }

    /// Steps until the last sequence has ended.
    pub(crate) fn steps(&self) -> usize {
        (0..self.lanes())
            .map(|s| self.starts[s] + self.lengths[s])
            .max()
            .unwrap_or(0)
    }

    /// The lanes whose sequence decodes at `step`, with the token each decodes.
    pub(crate) fn live(&self, step: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.lanes()).filter_map(move |s| {
            let t = step.checked_sub(self.starts[s])?;
            (t < self.lengths[s]).then_some((s, t))
        })
    }

    /// The K/V values of token `t` of lane `s`.
    pub(crate) fn token(&self, s: usize, t: usize) -> Vec<u32> {
        let seed = u32::try_from(s * 1000 + t).unwrap_or(u32::MAX);
        (0u32..)
            .take(self.len)
            .map(|i| i.wrapping_mul(2_654_435_761).wrapping_add(seed))
            .collect()
    }

    /// The CPU's output of token `t` of lane `s`: its K/V plus every earlier token's, wrapping.
    pub(crate) fn expected(&self, s: usize, t: usize) -> Vec<u32> {
        let mut out = self.token(s, t);
        for j in 0..t {
            for (o, v) in out.iter_mut().zip(self.token(s, j)) {
                *o = o.wrapping_add(v);
            }
        }
        out
    }

    /// Where the output of token `t` of lane `s` is in a run's downloads (in blocks).
    pub(crate) fn download_block(&self, s: usize, t: usize) -> usize {
        self.lengths[..s].iter().sum::<usize>() + t
    }

    /// The blocks every run downloads.
    pub(crate) fn download_blocks(&self) -> usize {
        self.lengths.iter().sum()
    }
}

/// The engine: the graph captured once, its table, the tokens' K/V on the device, one stream.
pub(crate) struct GraphEngine {
    context: Context,
    device: Device,
    page: usize,
    module: Module,
    table: GraphTable<u32>,
    parked: ParkedGraph,
    /// Every token's K/V, lane after lane, `hist` tokens a lane.
    inputs: DeviceBuffer<u32>,
    stream: Stream,
    /// Recorded after each step, two in turn: the host's bound on its lead.
    paced: [Event; 2],
    pub(crate) workload: Workload,
}

impl GraphEngine {
    /// The engine for `workload` on `device`, with a step of at least `ns` nanoseconds of kernel:
    /// the tokens uploaded and the step captured, once.
    pub(crate) fn new(
        context: &Context,
        page: usize,
        workload: Workload,
        ns: u64,
    ) -> Result<GraphEngine> {
        let device = context.device();
        let (lanes, hist, len) = (workload.lanes(), workload.hist, workload.len);
        if 2 * hist * len * 4 > page {
            return Err("a page holds a lane's K/V and output blocks".into());
        }
        let module = Module::load_ptx(context, &CString::new(DECODE_STEP_PTX)?)?;
        let mut inputs = DeviceBuffer::<u32>::zeroed(context, lanes * hist * len)?;
        let mut all = Vec::with_capacity(lanes * hist * len);
        for s in 0..lanes {
            for t in 0..hist {
                all.extend(workload.token(s, t));
            }
        }
        inputs.as_mut_slice().copy_from_host(&all)?;
        let mut table = GraphTable::<u32>::new(context, 3 * lanes + lanes * hist, len, 2)?;
        let mut stream = Stream::new(context)?;
        let parked = {
            let step = module.function(c"decode_step")?;
            let (seqs, hist32, len32) = (
                u32::try_from(lanes)?,
                u32::try_from(hist)?,
                u32::try_from(len)?,
            );
            Graph::capture_with_table(&mut stream, &mut table, |c, t| {
                // SAFETY: `decode_step(const u64*, u32, u32, u32, u64)`: it reads and writes
                // `len` values through non-null entries of the table only, writing only the
                // entries [0, seqs) and [2 seqs, 3 seqs), which the engine sets for writing.
                unsafe { c.launch(&step, GRID, BLOCK, (t, seqs, hist32, len32, ns))? };
                Ok(())
            })?
            .park()
        };
        Ok(GraphEngine {
            context: context.clone(),
            device,
            page,
            module,
            table,
            parked,
            inputs,
            stream,
            paced: [Event::new(context)?, Event::new(context)?],
            workload,
        })
    }

    /// One run over a new cache, elastic (a page taken from the reserve as each sequence starts,
    /// retired as it ends; the reserve started and filled before the clock starts, as an
    /// engine's at start-up) or preallocated (every lane mapped before, none retired); with
    /// `downloads`, each output block is read back into it. The time from the scope's start to its
    /// end. An elastic run checks that free device memory is back to the byte once every sequence
    /// has ended, its page is released and the reserve is trimmed.
    pub(crate) fn run(
        &mut self,
        elastic: bool,
        downloads: Option<&mut PinnedBuffer<u32>>,
    ) -> Result<Duration> {
        let (device, page) = (self.device, self.page);
        let w = &self.workload;
        let (lanes, hist, len) = (w.lanes(), w.hist, w.len);
        let mut cache = VirtualBuffer::new(lanes * page, &[device], ReadWrite)?;
        let (free_before, _) = self.context.memory_info()?;
        // Where each lane's page lies: its own slot when preallocated; where `grow` took it when
        // elastic (set as the sequence starts).
        let mut at: Vec<usize> = (0..lanes).map(|s| s * page).collect();
        prepare(&mut cache, elastic, device, page, &at)?;
        let mut chunks: Vec<Option<PinnedSliceMut<'_, u32>>> = match downloads {
            Some(d) => d.chunks_mut(len)?.map(Some).collect(),
            None => Vec::new(),
        };
        let kv_block = |slot: usize, t: usize| {
            let at = slot + t * len * 4;
            at..at + len * 4
        };
        let out_block = |slot: usize, t: usize| {
            let at = slot + (hist + t) * len * 4;
            at..at + len * 4
        };
        let (table, parked, module, inputs) =
            (&mut self.table, &self.parked, &self.module, &self.inputs);
        let (stream, paced) = (&self.stream, &self.paced);
        let started = Instant::now();
        cuda_vmm::scope(|s| {
            let work = s.on(stream);
            let kv = cache.in_scope(s);
            let mut graph = parked
                .in_scope()
                .table(table, work)
                .module(module)
                .finish()?;
            let inputs = inputs.as_slice();
            for step in 0..w.steps() {
                if step >= 2 {
                    // The host stays at most two steps ahead of the device.
                    paced[step % 2].synchronize()?;
                }
                for (lane, t) in w.live(step) {
                    if t == 0 && elastic {
                        at[lane] = kv.grow(device, page)?; // on demand, from the reserve
                    }
                    let slot = at[lane];
                    if t > 0 {
                        // Last step's K/V, read back (ends its write claim) into the history.
                        let prev = kv.read_back::<u32>(kv_block(slot, t - 1), work)?;
                        graph.set_read(3 * lanes + lane * hist + t - 1, prev)?;
                    }
                    graph.set_write(lane, kv.write::<u32>(kv_block(slot, t))?)?;
                    let from = (lane * hist + t) * len;
                    graph.set_read(lanes + lane, inputs.slice(from..from + len)?)?;
                    graph.set_write(2 * lanes + lane, kv.write::<u32>(out_block(slot, t))?)?;
                }
                work.launch_scoped_graph(&mut graph)?;
                for (lane, t) in w.live(step) {
                    let slot = at[lane];
                    if let Some(chunk) = chunks
                        .get_mut(w.download_block(lane, t))
                        .and_then(Option::take)
                    {
                        let out = kv.read_back::<u32>(out_block(slot, t), work)?;
                        work.copy_to_host(chunk, out)?;
                    }
                    if t + 1 == w.lengths[lane] {
                        // The sequence ends: its entries cleared, its page retired behind the
                        // replays queued so far, while the device runs.
                        for index in [lane, lanes + lane, 2 * lanes + lane] {
                            graph.clear_entry(index)?;
                        }
                        for j in 0..t {
                            graph.clear_entry(3 * lanes + lane * hist + j)?;
                        }
                        if elastic {
                            kv.retire(slot..slot + page)?;
                        }
                    }
                }
                work.record(&paced[step % 2])?;
            }
            Ok(())
        })?;
        let took = started.elapsed();
        // The reserve's pages given back (a buffer without one gives back none), then the retired
        // pages whose work has finished (all of it: the scope has waited).
        cache.trim()?;
        cache.reclaim()?;
        if cache.retired_bytes() != 0 {
            return Err("a retired page was not released after the scope".into());
        }
        let (free_after, _) = self.context.memory_info()?;
        if elastic && free_after != free_before {
            return Err(format!(
                "free memory {free_after} after every sequence ended, {free_before} before"
            )
            .into());
        }
        Ok(took)
    }
}

/// Before a run's clock starts: an elastic cache's reserve started and filled (as an engine's
/// at start-up); a preallocated cache's page mapped at each lane's slot `at`.
fn prepare(
    cache: &mut VirtualBuffer,
    elastic: bool,
    device: Device,
    page: usize,
    at: &[usize],
) -> Result {
    if elastic {
        cache.reserve_ahead(ReserveOptions::new(device, page, RESERVE))?;
        let filling = Instant::now();
        while cache.stats().reserve_pages < RESERVE as u64 {
            if filling.elapsed() > Duration::from_secs(10) {
                return Err("the reserve was not filled within 10 s".into());
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    } else {
        for &slot in at {
            cache.map_page(slot, device, page)?;
        }
    }
    Ok(())
}
