//! Grows one `VirtualBuffer` by 1 GiB pages until the device runs out of memory, then proves that the
//! failed growth left the buffer as it was (every page and its bytes still there), and that dropping
//! the buffer gives every byte back (`cuMemGetInfo`'s free memory, to the byte).
//!
//! The buffer's address budget is larger than the device's memory, so the growth stops at the memory,
//! not at the budget: `cuMemCreate` answers `CUDA_ERROR_OUT_OF_MEMORY`, and the buffer undoes nothing
//! because nothing else was done for that page.
//!
//! Run with `./with-libcuda cargo run --example grow_until_oom`.

// Each example is its own crate, and this one uses only part of the shared module: not
// `exit_code_with_cause`, `two_or_more_devices_or_none`, `verify`, `verify_debug`, `pattern` or
// `AddOne`.
#[allow(dead_code)]
mod common;

use std::process::ExitCode;

use common::{ExampleResult, check, first_vmm_device_or_none};
use cuda_vmm::{
    Context, DriverError, Granularity, ReadWrite, VirtualBuffer, align_size,
    allocation_granularity, owned::PageInfo,
};

/// The size of each growth.
const STEP: usize = 1 << 30;

fn main() -> ExitCode {
    common::exit_code("grow_until_oom", run())
}

fn run() -> ExampleResult {
    println!(
        "grow_until_oom: 1 GiB pages until the device says out of memory, then all of it back"
    );
    let Some(device) = first_vmm_device_or_none("there is no memory to fill")? else {
        return Ok(());
    };
    let context = Context::new(device)?;
    let granularity = allocation_granularity(device, Granularity::Minimum)?;
    let step = align_size(STEP, granularity)?;
    // The first mapping and copy of a process may set up driver bookkeeping that stays; free memory
    // is measured after one.
    let mut warm_up = VirtualBuffer::new(granularity, &[device], ReadWrite)?;
    warm_up.grow(device, granularity)?;
    warm_up.slice_bytes_mut::<u32>(..4)?.copy_from_host(&[0])?;
    warm_up.free()?;
    let (free_before, total) = context.memory_info()?;
    // A budget of twice the device's memory: address space only, so the growth meets the memory's
    // end first.
    let budget = align_size(2 * total, step)?;
    let mut buffer = VirtualBuffer::new(budget, &[device], ReadWrite)?;
    println!(
        "  GPU 0: {} MiB of {} MiB free; budget {} GiB at {:#x}",
        free_before >> 20,
        total >> 20,
        budget >> 30,
        buffer.base()
    );

    let refusal = loop {
        match buffer.grow(device, step) {
            Ok(offset) => {
                // A marker at the start of each page, to find again after the refusal.
                let marker = (offset / step) as u32;
                buffer
                    .slice_bytes_mut::<u32>(offset..offset + 4)?
                    .copy_from_host(&[marker])?;
            }
            Err(e) => break e,
        }
    };
    let pages = buffer.pages().len();
    println!(
        "  mapped {pages} pages ({} GiB) before the refusal: {refusal}",
        buffer.mapped_bytes() >> 30
    );
    check(
        refusal.driver() == Some(DriverError::OUT_OF_MEMORY),
        "  the refusal is CUDA_ERROR_OUT_OF_MEMORY",
    )?;
    let layout: Vec<PageInfo> = buffer.pages().collect();
    check(
        layout
            .iter()
            .enumerate()
            .all(|(i, p)| p.offset == i * step && p.size == step && p.granted),
        "  the failed growth left the buffer as it was: every page in place, granted",
    )?;
    for page in 0..pages {
        let mut marker = [0u32];
        buffer
            .slice_bytes::<u32>(page * step..page * step + 4)?
            .copy_to_host(&mut marker)?;
        if marker[0] != page as u32 {
            return Err(format!("  page {page}: marker {} changed", marker[0]).into());
        }
    }
    println!("  every page's marker read back");
    let stats = buffer.stats();
    let pages_u64 = pages as u64;
    // Which call refused: the memory (`cuMemCreate`, the usual case), or, with memory nearly gone,
    // the mapping or the grant; the buffer undid whatever was done for the page in any case.
    let refused_by = if stats.map_calls == pages_u64 {
        "cuMemCreate"
    } else if stats.set_access_calls == pages_u64 {
        "cuMemMap (the page's memory was released again)"
    } else {
        "cuMemSetAccess (the page was unmapped and released again)"
    };
    check(
        stats.pages_mapped == pages_u64,
        &format!(
            "  {} cuMemMap and {} cuMemSetAccess for {pages} pages; the refusal came from {refused_by}",
            stats.map_calls, stats.set_access_calls
        ),
    )?;

    buffer.free()?;
    let (free_after, _) = context.memory_info()?;
    println!(
        "  free after the buffer was freed: {} MiB",
        free_after >> 20
    );
    check(
        free_after == free_before,
        "  every byte is back (cuMemGetInfo's free memory, to the byte)",
    )
}
