//! A key-value cache in motion, the way an inference server runs one: the whole decode loop is one
//! `cuda_vmm::scope`, and between its steps the cache maps pages for the sequences that grow, lends
//! them to the decode kernels, and retires the pages of the sequences that finish, while the kernels
//! of earlier steps still run. Inside the loop the host never waits for the device.
//!
//! - The cache is a plain struct of `VirtualBuffer`s: a 64 GiB address budget, a 1 GiB slot per
//!   sequence, and pages (the granularity, 2 MiB on an H200) mapped into a slot as its sequence
//!   grows (`ScopedBuffer::map_page`, through `&self`, beside the running kernels).
//! - Each step launches a decode kernel per sequence (`spin_add_one`: it spins for 1 ms, then writes
//!   its token as the previous token + 1) into a `Rewritable` the cache lends, reading the previous
//!   token through the `DeviceInFlight` of the step before.
//! - The prompt prefix all sequences share is one `SharedPage`, written once through a read-write
//!   mapping and mapped read-only per sequence, at several offsets of one `ReadOnly` buffer; a
//!   sequence's first step reads it through a `DeviceInFlight`.
//! - A finished sequence's pages and prefix mapping are retired (`ScopedBuffer::retire`): the call
//!   returns at once, later lends are refused, and the pages are released only once the device has
//!   passed the work queued before the retire (an event on the scope's stream).
//!
//! The host queues the loop far ahead of the device (a server would bound its lead on an event), so
//! free memory, printed as it goes, falls as pages are mapped and rises after the loop, as the device
//! passes each retire. Checked: every token, the driver calls (`BufferStats`), and free memory back
//! to the byte once the cache is dropped.
//!
//! Run with `./with-libcuda cargo run --example kv_cache`.

// Each example is its own crate, and this one uses only part of the shared module: not
// `exit_code_with_cause`, `two_or_more_devices_or_none`, `verify_debug` or `AddOne`.
#[allow(dead_code)]
mod common;

use std::ffi::CString;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use common::{ExampleResult, check, first_vmm_device_or_none, pattern, verify};
use cuda_vmm::module::Function;
use cuda_vmm::owned::{ScopedBuffer, SharedPage};
use cuda_vmm::stream::{
    DeviceInFlight, KernelArg, PinnedChunks, Rewritable, Scope, ScopedRead, ScopedStream,
};
use cuda_vmm::{
    Context, Device, Error, Event, Granularity, Module, PinnedBuffer, ReadOnly, ReadWrite, Stream,
    VirtualBuffer, align_size, allocation_granularity,
};

/// The address budget: far more than the device's memory, and free until pages are mapped.
const BUDGET: usize = 64 << 30;
/// Slots of the budget, one per sequence (1 GiB each).
const SLOTS: usize = 64;
/// The cache bytes of one token (keys and values of every layer, say): 8 tokens to a 2 MiB page.
const TOKEN_BYTES: usize = 256 << 10;
/// How long each decode kernel spins before it writes its token.
const SPIN_NS: u64 = 1_000_000;
/// `spin_add_one(u32 *dst, const u32 *src, u32 n, u64 ns)`: spins `ns`, then `dst[i] = src[i] + 1`.
const SPIN_PTX: &str = include_str!("kernels/spin_add_one.ptx");
/// One wave of blocks (every block resident at once), one thread per value of a token.
const GRID: (u32, u32, u32) = (64, 1, 1);
const BLOCK: (u32, u32, u32) = (256, 1, 1);
/// The tokens each sequence decodes, and the step it joins at; a sequence's id is its slot.
const LENGTHS: [usize; 10] = [12, 3, 30, 9, 16, 1, 24, 5, 12, 12];
const JOINS_AT: [usize; 10] = [0, 0, 0, 0, 0, 0, 0, 0, 6, 6];

fn main() -> ExitCode {
    common::exit_code("kv_cache", run())
}

fn run() -> ExampleResult {
    println!("kv_cache: pages mapped, lent and retired while the decode kernels run, in one scope");
    let Some(device) = first_vmm_device_or_none("there is no cache to serve")? else {
        return Ok(());
    };
    let context = Context::new(device)?;
    let page = allocation_granularity(device, Granularity::Minimum)?;
    if page % TOKEN_BYTES != 0 {
        return Err(format!("a page of {page} B is not a whole number of tokens").into());
    }
    let module = Module::load_ptx(&context, &CString::new(SPIN_PTX)?)?;
    let kernel = module.function(c"spin_add_one")?;
    let work = Stream::new(&context)?;
    let done = Event::new(&context)?;
    let n = TOKEN_BYTES / 4;
    // The tokens' downloads, one buffer per sequence, read once the scope has waited.
    let mut outputs: Vec<PinnedBuffer<u32>> = LENGTHS
        .iter()
        .map(|&len| PinnedBuffer::zeroed(&context, len * n))
        .collect::<Result<_, _>>()?;
    warm_up(device, &kernel, &work, page)?;
    let (free_before, _) = context.memory_info()?;

    let prompt = pattern(page / 4, 0x5eed);
    let mut cache = KvCache::new(device, page, &prompt)?;
    println!(
        "  reserved {} GiB at {:#x}; the prompt prefix page written once, mapped read-only for \
         {} sequences ({} shares of it)",
        BUDGET >> 30,
        cache.buffer.base(),
        LENGTHS.len(),
        cache.prefix.share_count()
    );
    let served =
        cuda_vmm::scope(|s| Ok(cache.serve(s, &context, &work, &kernel, &done, &mut outputs)))?;
    served?;

    let (stats, prefix) = (cache.buffer.stats(), cache.prompts.stats());
    for (what, s) in [("cache pages", stats), ("prefix mappings", prefix)] {
        println!(
            "  {what}: {} cuMemMap, {} cuMemUnmap, {} cuMemSetAccess, {} retired, {} events recorded",
            s.map_calls, s.unmap_calls, s.set_access_calls, s.pages_retired, s.events_recorded
        );
    }
    let sequences = LENGTHS.len() as u64;
    check(
        stats.set_access_calls == stats.pages_mapped
            && stats.pages_retired == stats.pages_mapped
            && stats.events_recorded == sequences
            && (prefix.pages_retired, prefix.events_recorded) == (sequences, sequences)
            && cache.prefix.share_count() == 1,
        "  one cuMemSetAccess per page mapped, every page and prefix mapping retired, one event \
         per retire (one stream); the prefix's last share is the cache's own handle",
    )?;
    let (mut got, mut expected) = (Vec::new(), Vec::new());
    for (id, (&len, output)) in LENGTHS.iter().zip(&outputs).enumerate() {
        let first = prefix_token(id, page) / 4;
        let source = &prompt[first..first + n];
        got.extend_from_slice(output);
        expected.extend(
            (1..=u32::try_from(len)?).flat_map(|k| source.iter().map(move |v| v.wrapping_add(k))),
        );
    }
    verify(
        "  every token the kernels wrote (the prefix token + 1, + 2, ...)",
        &got,
        &expected,
    )?;

    drop(cache);
    let (free_after, _) = context.memory_info()?;
    check(
        free_after == free_before,
        "  dropping the cache gave all its memory back, to the byte",
    )
}

/// The cache: the sequences' tokens, a slot each, and the shared prompt prefix. Owned outright: it
/// could live in a server's state.
struct KvCache {
    /// The tokens: slot `id` of `slot_bytes` for sequence `id`, pages mapped as it grows.
    buffer: VirtualBuffer<ReadWrite>,
    /// The prefix, mapped read-only at page `id` for sequence `id`.
    prompts: VirtualBuffer<ReadOnly>,
    prefix: SharedPage,
    device: Device,
    page: usize,
    slot_bytes: usize,
}

/// A sequence being decoded, inside the scope.
struct Decoding<'scope> {
    id: usize,
    tokens: usize,
    /// The bytes mapped in its slot, from the slot's start.
    mapped: usize,
    /// Its last token, as the kernel that wrote it returned it.
    last: Option<DeviceInFlight<'scope, u32>>,
    /// Where each of its tokens is downloaded, in order.
    out: PinnedChunks<'scope, u32>,
}

impl KvCache {
    fn new(device: Device, page: usize, prompt: &[u32]) -> ExampleResult<KvCache> {
        let slot_bytes = align_size(BUDGET / SLOTS, page)?;
        let prefix = SharedPage::new(device, page)?;
        // Written once, through a read-write mapping of its own, which then goes: the read-only
        // mappings below hold the page.
        let mut writer = VirtualBuffer::new(page, &[device], ReadWrite)?;
        writer.map_shared(0, &prefix)?;
        writer.slice_bytes_mut::<u32>(..)?.copy_from_host(prompt)?;
        writer.free()?;
        // Mapped before the scope: inside it, a `ScopedBuffer` maps new pages but no shares.
        let prompts = VirtualBuffer::new(SLOTS * page, &[device], ReadOnly)?;
        for id in 0..LENGTHS.len() {
            prompts.map_shared(id * page, &prefix)?;
        }
        Ok(KvCache {
            buffer: VirtualBuffer::new(slot_bytes * SLOTS, &[device], ReadWrite)?,
            prompts,
            prefix,
            device,
            page,
            slot_bytes,
        })
    }

    /// The decode loop, in the scope `s`: each step queues a kernel per sequence, maps a page for
    /// each whose next token needs one and retires the slots of those that finish.
    fn serve<'scope>(
        &'scope mut self,
        s: &'scope Scope<'scope, '_>,
        context: &Context,
        work: &'scope Stream,
        kernel: &'scope Function<'_>,
        done: &Event,
        outputs: &'scope mut [PinnedBuffer<u32>],
    ) -> ExampleResult {
        let (device, page, slot_bytes) = (self.device, self.page, self.slot_bytes);
        let (kv, prefixes) = (self.buffer.in_scope(s), self.prompts.in_scope(s));
        let w = s.on(work);
        let mut sequences: Vec<Decoding<'scope>> = outputs
            .iter_mut()
            .enumerate()
            .map(|(id, out)| {
                Ok(Decoding {
                    id,
                    tokens: 0,
                    mapped: 0,
                    last: None,
                    out: out.chunks_mut(TOKEN_BYTES / 4)?,
                })
            })
            .collect::<Result<_, cuda_vmm::Error>>()?;
        let free_mib = || context.memory_info().map(|(free, _)| free >> 20);
        let late = JOINS_AT.iter().filter(|&&at| at > 0).count();
        println!(
            "  step  0: {} sequences start ({late} join later); free {} MiB",
            LENGTHS.len() - late,
            free_mib()?
        );
        let (started, mut longest, mut step, mut kernels) = (Instant::now(), Duration::ZERO, 0, 0);
        while sequences.iter().any(|d| d.tokens < LENGTHS[d.id]) {
            let step_started = Instant::now();
            for seq in &mut sequences {
                let (slot, len) = (seq.id * slot_bytes, LENGTHS[seq.id]);
                if JOINS_AT[seq.id] > step || seq.tokens == len {
                    continue;
                }
                if seq.tokens == 0 && step > 0 {
                    println!(
                        "  step {step:2}: sequence {} joins; free {} MiB",
                        seq.id,
                        free_mib()?
                    );
                }
                if seq.tokens * TOKEN_BYTES == seq.mapped {
                    kv.map_page(slot + seq.mapped, device, page)?; // beside the running kernels
                    seq.mapped += page;
                }
                let at = slot + seq.tokens * TOKEN_BYTES;
                let mut token = kv.write::<u32>(at..at + TOKEN_BYTES)?;
                let written = if let Some(previous) = seq.last {
                    decode(w, kernel, &mut token, (previous, previous.len()))?
                } else {
                    let from = seq.id * page + prefix_token(seq.id, page);
                    let prefix = prefixes.read::<u32>(from..from + TOKEN_BYTES)?;
                    decode(w, kernel, &mut token, (prefix, prefix.len()))?
                };
                w.copy_to_host(seq.out.next().ok_or("more tokens than outputs")?, written)?;
                seq.last = Some(written);
                seq.tokens += 1;
                kernels += 1;
                if seq.tokens < len {
                    continue;
                }
                let pages = kv.retire(slot..slot + slot_bytes)?; // returns at once
                prefixes.retire(seq.id * page..(seq.id + 1) * page)?;
                println!(
                    "  step {step:2}: sequence {} done ({len} tokens): {pages} page(s) and its \
                     prefix mapping retired; free {} MiB, {} MiB mapped, {} MiB of it retired",
                    seq.id,
                    free_mib()?,
                    kv.mapped_bytes() >> 20,
                    kv.retired_bytes() >> 20
                );
                let refused = kv.read::<u32>(slot..slot + 4);
                if !matches!(refused, Err(Error::PageRange { .. })) {
                    return Err(format!("a view of a retired slot was lent: {refused:?}").into());
                }
            }
            longest = longest.max(step_started.elapsed());
            step += 1;
        }
        w.record(done)?;
        let queued = started.elapsed();
        check(
            !done.is_complete()?,
            &format!(
                "  {step} steps queued in {:.1} ms (the longest {:.2} ms), {kernels} kernels of \
                 {} ms each: the device is still running them, so no step waited for it",
                queued.as_secs_f64() * 1e3,
                longest.as_secs_f64() * 1e3,
                SPIN_NS / 1_000_000
            ),
        )?;

        release_retired(context, kv, prefixes, started)
    }
}

/// With nothing left to queue, reclaims the retired pages of `kv` and `prefixes` as the device
/// passes each retire (`reclaim` waits for nothing), and checks that free memory rises by the
/// retired pages' bytes.
fn release_retired(
    context: &Context,
    kv: ScopedBuffer<'_, ReadWrite>,
    prefixes: ScopedBuffer<'_, ReadOnly>,
    started: Instant,
) -> ExampleResult {
    let (free_start, _) = context.memory_info()?;
    let retired = kv.retired_bytes();
    while kv.retired_bytes() + prefixes.retired_bytes() > 0 {
        let (pages, mappings) = (kv.reclaim()?, prefixes.reclaim()?);
        if pages + mappings > 0 {
            println!(
                "  +{:5.1} ms: {pages} page(s) and {mappings} prefix mapping(s) released; free {} MiB",
                started.elapsed().as_secs_f64() * 1e3,
                context.memory_info()?.0 >> 20
            );
        }
        if started.elapsed() > Duration::from_secs(10) {
            return Err("retired pages not released after 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let (free_end, _) = context.memory_info()?;
    check(
        free_end.checked_sub(free_start) == Some(retired),
        &format!(
            "  free memory rose by the retired pages' {} MiB, to the byte, in the open scope",
            retired >> 20
        ),
    )
}

/// Queues one decode step: `spin_add_one(token, source, n, SPIN_NS)`, which spins, then writes
/// `token[i] = source[i] + 1`; `source` (the shared prefix's `DeviceInFlight`, or the previous
/// token's `DeviceInFlight`) holds `source_len` values. Returns the written token, for the next
/// step.
fn decode<'scope>(
    work: ScopedStream<'scope>,
    kernel: &'scope Function<'_>,
    token: &mut Rewritable<'scope, u32>,
    (source, source_len): (
        impl KernelArg<'scope, Output = ()> + ScopedRead<'scope, u32>,
        usize,
    ),
) -> cuda_vmm::Result<DeviceInFlight<'scope, u32>> {
    let n = token.len();
    if source_len != n {
        return Err(Error::LengthMismatch {
            expected: n,
            found: source_len,
        });
    }
    let n32 = u32::try_from(n).map_err(|_| Error::Overflow {
        what: "token length",
    })?;
    // SAFETY: `spin_add_one(u32 *dst, const u32 *src, u32 n, u64 ns)` takes these four arguments in
    // this order (each view as its u64 device address). It writes `dst[0..n)` only and reads
    // `src[0..n)` only, and both views hold `n` values (checked above).
    let (written, (), (), ()) =
        unsafe { work.launch(kernel, GRID, BLOCK, (token, source, n32, SPIN_NS))? };
    Ok(written)
}

/// The byte offset, inside the prefix page, of the prefix token sequence `id` starts from.
fn prefix_token(id: usize, page: usize) -> usize {
    id % (page / TOKEN_BYTES) * TOKEN_BYTES
}

/// Maps a page, runs the kernel on it in a scope and retires it: the first mapping, launch and
/// event of a process may set up driver bookkeeping that stays, so free memory is measured after.
fn warm_up(device: Device, kernel: &Function<'_>, work: &Stream, page: usize) -> ExampleResult {
    let mut buffer = VirtualBuffer::new(page, &[device], ReadWrite)?;
    buffer.grow(device, page)?;
    cuda_vmm::scope(|s| {
        let (w, kv) = (s.on(work), buffer.in_scope(s));
        let zeroed = w.memset(&mut kv.write::<u32>(..page / 2)?, 0)?;
        let mut rest = kv.write(page / 2..)?;
        decode(w, kernel, &mut rest, (zeroed, zeroed.len()))?;
        kv.retire(..)?;
        Ok(())
    })?;
    buffer.free()?;
    Ok(())
}
