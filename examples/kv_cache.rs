//! A key-value cache the way an inference server keeps one: a 64 GiB address budget reserved once,
//! one slot of it per sequence, and pages of device memory (the granularity, 2 MiB on an H200) mapped
//! into a slot on demand as its sequence grows. Ending a sequence in the middle unmaps its pages and
//! releases their memory at once; a new sequence reuses the slot. No address ever changes, and no
//! byte is ever copied to make room.
//!
//! The cache is a plain struct holding a `VirtualBuffer`: no lifetimes, so it could sit in a server's
//! state for hours. The buffer grants each page to the device once, when the page is mapped; the
//! example prints the counts of `cuMemMap`, `cuMemUnmap` and `cuMemSetAccess` calls to show it, and
//! checks at the end that the device's free memory is back to the byte.
//!
//! Run with `./with-libcuda cargo run --example kv_cache`.

// Each example is its own crate, and this one uses only part of the shared module: not
// `exit_code_with_cause`, `two_or_more_devices_or_none`, `verify_debug` or `AddOne`.
#[allow(dead_code)]
mod common;

use std::process::ExitCode;

use common::{ExampleResult, check, first_vmm_device_or_none, pattern, verify};
use cuda_vmm::{
    Context, Device, Granularity, ReadWrite, VirtualBuffer, align_size, allocation_granularity,
};

/// The address budget: far more than the device's memory, and free until pages are mapped.
const BUDGET: usize = 64 << 30;
/// Sequences at once; each owns `BUDGET / SLOTS` bytes of address space (1 GiB).
const SLOTS: usize = 64;
/// The cache bytes one token takes (keys and values of every layer, say).
const TOKEN_BYTES: usize = 64 << 10;

fn main() -> ExitCode {
    common::exit_code("kv_cache", run())
}

fn run() -> ExampleResult {
    println!(
        "kv_cache: a 64 GiB address budget, device memory mapped page by page as sequences grow"
    );
    let Some(device) = first_vmm_device_or_none("there is no cache to fill")? else {
        return Ok(());
    };
    let context = Context::new(device)?;
    let page = allocation_granularity(device, Granularity::Minimum)?;
    println!("  page size (the device's granularity): {page} B");
    // The first mapping and copy of a process may set up driver bookkeeping that stays; free memory
    // is measured after one.
    let mut warm_up = VirtualBuffer::new(page, &[device], ReadWrite)?;
    warm_up.grow(device, page)?;
    warm_up
        .slice_bytes_mut::<u8>(..)?
        .copy_from_host(&vec![0; page])?;
    warm_up.free()?;
    let (free_before, _) = context.memory_info()?;

    let mut cache = KvCache::new(device, page)?;
    println!(
        "  reserved {} GiB of address space at {:#x}, nothing mapped",
        BUDGET >> 30,
        cache.buffer.base()
    );
    let base = cache.buffer.base();

    // Eight sequences of different lengths, appended to in turns, as a batch decodes.
    let lengths = [40, 7, 120, 33, 64, 1, 90, 16];
    let ids: Vec<usize> = lengths
        .iter()
        .map(|_| cache.start())
        .collect::<Option<_>>()
        .ok_or("no free slot")?;
    for step in 0..*lengths.iter().max().unwrap_or(&0) {
        for (&id, &len) in ids.iter().zip(&lengths) {
            if step < len {
                cache.append(id)?;
            }
        }
    }
    cache.report("after 8 sequences");
    for &id in &ids {
        cache.verify(id)?;
    }

    // Sequences 2 and 5 end in the middle of the batch: their memory is released at once.
    let (free_full, _) = context.memory_info()?;
    let released = cache.end(ids[2])? + cache.end(ids[5])?;
    let (free_after_end, _) = context.memory_info()?;
    check(
        free_after_end.checked_sub(free_full) == Some(released),
        &format!("  ending 2 sequences released their {released} B of memory, to the byte"),
    )?;
    for (i, &id) in ids.iter().enumerate() {
        if i != 2 && i != 5 {
            cache.verify(id)?;
        }
    }
    println!("  the other 6 sequences kept their bytes and addresses");

    // New sequences take the freed slots (the lowest free slot first) and grow there.
    let reused: Vec<usize> = (0..2)
        .map(|_| cache.start())
        .collect::<Option<_>>()
        .ok_or("no free slot")?;
    check(
        reused == [ids[2], ids[5]],
        "  the new sequences reuse the freed slots",
    )?;
    for _ in 0..50 {
        for &id in &reused {
            cache.append(id)?;
        }
    }
    for &id in ids.iter().chain(&reused) {
        cache.verify(id)?;
    }
    cache.report("after reusing 2 slots");
    check(
        cache.buffer.base() == base,
        "  the base address never changed",
    )?;
    let stats = cache.buffer.stats();
    check(
        stats.set_access_calls == stats.pages_mapped,
        &format!(
            "  one cuMemSetAccess per page mapped ({} grants for {} pages, {} tokens written)",
            stats.set_access_calls, stats.pages_mapped, cache.tokens_written
        ),
    )?;

    drop(cache);
    let (free_after, _) = context.memory_info()?;
    check(
        free_after == free_before,
        "  dropping the cache gave all its memory back, to the byte",
    )
}

/// A sequence's place in the cache: its slot, and how many tokens it holds.
struct Sequence {
    slot: usize,
    tokens: usize,
    /// A seed for the sequence's token bytes, so that reads can be checked.
    seed: u32,
}

/// The cache: one buffer, a slot per sequence. Owned outright: it could live in a server's state.
struct KvCache {
    buffer: VirtualBuffer<ReadWrite>,
    device: Device,
    page: usize,
    slot_bytes: usize,
    sequences: Vec<Option<Sequence>>,
    next_seed: u32,
    tokens_written: usize,
}

impl KvCache {
    fn new(device: Device, page: usize) -> ExampleResult<KvCache> {
        let slot_bytes = align_size(BUDGET / SLOTS, page)?;
        Ok(KvCache {
            buffer: VirtualBuffer::new(slot_bytes * SLOTS, &[device], ReadWrite)?,
            device,
            page,
            slot_bytes,
            sequences: (0..SLOTS).map(|_| None).collect(),
            next_seed: 1,
            tokens_written: 0,
        })
    }

    /// Starts a sequence in the lowest free slot; its id is the slot. Maps nothing yet.
    fn start(&mut self) -> Option<usize> {
        let slot = self.sequences.iter().position(Option::is_none)?;
        let seed = self.next_seed;
        self.next_seed += 1;
        self.sequences[slot] = Some(Sequence {
            slot,
            tokens: 0,
            seed,
        });
        Some(slot)
    }

    /// Appends one token to sequence `id`, mapping a new page into its slot when the token crosses
    /// into bytes not mapped yet.
    fn append(&mut self, id: usize) -> ExampleResult {
        let sequence = self.sequences[id].as_mut().ok_or("no such sequence")?;
        let start = sequence.slot * self.slot_bytes + sequence.tokens * TOKEN_BYTES;
        let end = start + TOKEN_BYTES;
        if end > (sequence.slot + 1) * self.slot_bytes {
            return Err("the sequence is longer than its slot".into());
        }
        let slot_start = sequence.slot * self.slot_bytes;
        let token = token_bytes(sequence.seed, sequence.tokens);
        sequence.tokens += 1;
        // Pages are mapped from the slot's start; map another where the token reaches past them.
        let mut mapped_end = slot_start + (start - slot_start).div_ceil(self.page) * self.page;
        while end > mapped_end {
            self.buffer.map_page(mapped_end, self.device, self.page)?;
            mapped_end += self.page;
        }
        self.buffer
            .slice_bytes_mut::<u32>(start..end)?
            .copy_from_host(&token)?;
        self.tokens_written += 1;
        Ok(())
    }

    /// Reads back every token of sequence `id` and compares.
    fn verify(&self, id: usize) -> ExampleResult {
        let sequence = self.sequences[id].as_ref().ok_or("no such sequence")?;
        let start = sequence.slot * self.slot_bytes;
        let got = self
            .buffer
            .slice_bytes::<u32>(start..start + sequence.tokens * TOKEN_BYTES)?
            .to_vec()?;
        let expected: Vec<u32> = (0..sequence.tokens)
            .flat_map(|t| token_bytes(sequence.seed, t))
            .collect();
        if got == expected {
            Ok(())
        } else {
            verify(&format!("sequence {id}"), &got, &expected)
        }
    }

    /// Ends sequence `id`: unmaps its slot's pages and releases their memory. Returns the bytes
    /// released.
    fn end(&mut self, id: usize) -> ExampleResult<usize> {
        let sequence = self.sequences[id].take().ok_or("no such sequence")?;
        let start = sequence.slot * self.slot_bytes;
        let before = self.buffer.mapped_bytes();
        let pages = self.buffer.unmap(start..start + self.slot_bytes)?;
        let released = before - self.buffer.mapped_bytes();
        println!(
            "  ended sequence {id} ({} tokens): {pages} page(s), {released} B unmapped and released",
            sequence.tokens
        );
        Ok(released)
    }

    fn report(&self, when: &str) {
        let stats = self.buffer.stats();
        let live = self.sequences.iter().flatten().count();
        println!(
            "  {when}: {live} sequences, {} pages, {} MiB mapped of a {} GiB budget; calls: \
             {} cuMemMap, {} cuMemUnmap, {} cuMemSetAccess",
            self.buffer.pages().len(),
            self.buffer.mapped_bytes() >> 20,
            self.buffer.budget() >> 30,
            stats.map_calls,
            stats.unmap_calls,
            stats.set_access_calls
        );
    }
}

/// The bytes of token `t` of the sequence with `seed`, as `u32`s.
fn token_bytes(seed: u32, t: usize) -> Vec<u32> {
    pattern(TOKEN_BYTES / 4, (seed << 16) ^ t as u32)
}
