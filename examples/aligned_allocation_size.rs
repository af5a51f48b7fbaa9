//! Allocation granularity and `align_size`: the sizes VMM accepts.
//!
//! Physical allocations, and the offsets they are mapped at, must be multiples of the device's minimum
//! allocation granularity, which is device-dependent: never assume a page size such as 4 KiB. This
//! example queries the minimum and recommended granularity of every device, rounds a few requested
//! sizes up with `align_size` and checks each result, and shows `align_size`'s documented errors
//! (zero granularity, overflow near `usize::MAX`).
//!
//! `align_size` is plain arithmetic: without a GPU it is shown with an example granularity, and the
//! errors are shown either way. Run with `./with-libcuda cargo run --example aligned_allocation_size`.

// Each example is its own crate, and this one uses only part of the shared module: not
// `exit_code_with_cause`, `two_or_more_devices_or_none`, `verify`, `verify_debug`, `pattern` or
// `AddOne`.
#[allow(dead_code)]
mod common;

use std::process::ExitCode;

use common::{ExampleResult, check, devices_or_none};
use cuda_vmm::{
    Device, Error, Granularity, PhysicalAllocation, align_size, allocation_granularity,
};

/// The granularity an H200 reports (2 MiB), used only to show the arithmetic where there is no device
/// to ask. Code on a GPU always queries it.
const EXAMPLE_GRANULARITY: usize = 2 << 20;

fn main() -> ExitCode {
    common::exit_code("aligned_allocation_size", run())
}

fn run() -> ExampleResult {
    println!("aligned_allocation_size: granularity queries and align_size");
    let devices = devices_or_none("no granularity to query")?.unwrap_or_default();
    let mut queried = None;
    for &device in &devices {
        let minimum = per_device(device)?;
        queried = queried.or(minimum);
    }
    let granularity = if let Some(g) = queried {
        g
    } else {
        let why = if devices.is_empty() {
            "without a device"
        } else {
            "no device supports VMM"
        };
        println!(
            "\n{why}: align_size is shown with an example granularity of {EXAMPLE_GRANULARITY} B \
             (2 MiB, what an H200 reports; on a GPU it is queried, never assumed)"
        );
        align_table(EXAMPLE_GRANULARITY)?;
        EXAMPLE_GRANULARITY
    };
    documented_errors(granularity)?;
    println!("\naligned_allocation_size: every check passed");
    Ok(())
}

/// The chapter's `aligned_allocation_size`, in this crate's API: the requested size rounded up to
/// `device`'s minimum granularity. Both steps can fail, and say why: the query with the driver's error,
/// the rounding with `Error::Overflow` (the chapter's version cannot report an overflow).
fn aligned_allocation_size(device: Device, requested: usize) -> Result<usize, Error> {
    let granularity = allocation_granularity(device, Granularity::Minimum)?;
    align_size(requested, granularity)
}

/// Queries `device`'s granularities, rounds sizes to them and shows that `cuMemCreate` takes the result.
/// Returns the minimum granularity, or `None` where the device has no VMM support.
fn per_device(device: Device) -> ExampleResult<Option<usize>> {
    let ordinal = device.ordinal();
    println!("\nGPU {ordinal}: {}", device.name()?);
    if !device.supports_vmm()? {
        println!(
            "  no VMM support (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0): skipped"
        );
        return Ok(None);
    }
    let minimum = allocation_granularity(device, Granularity::Minimum)?;
    let recommended = allocation_granularity(device, Granularity::Recommended)?;
    println!(
        "  granularity (cuMemGetAllocationGranularity): minimum {minimum} B, recommended {recommended} B"
    );
    check(
        minimum > 0 && recommended.is_multiple_of(minimum),
        "  the recommended granularity is a non-zero multiple of the minimum",
    )?;

    println!("  align_size to the minimum granularity:");
    align_table(minimum)?;
    if recommended != minimum {
        println!("  align_size to the recommended granularity:");
        align_table(recommended)?;
    }

    let size = aligned_allocation_size(device, 4096)?;
    check(
        size == 4096_usize.div_ceil(minimum) * minimum,
        &format!(
            "  aligned_allocation_size(GPU {ordinal}, 4096) = {size} B, the least multiple of {minimum} B that holds 4096 B"
        ),
    )?;

    // PhysicalAllocation::new checks the size against the granularity before calling the driver.
    if 4096_usize.is_multiple_of(minimum) {
        println!("  4096 B is a multiple of {minimum} B on this device: nothing to refuse");
    } else {
        expect_refused(
            "  PhysicalAllocation::new with 4096 B (not rounded)",
            PhysicalAllocation::new(device, 4096).map(|m| m.size()),
            |e| matches!(e, Error::NotAligned { .. }),
        )?;
    }
    let memory = PhysicalAllocation::new(device, size)?;
    check(
        memory.size() == size,
        &format!("  PhysicalAllocation::new with the rounded {size} B (cuMemCreate) accepted"),
    )?;
    memory.release()?;
    println!("  PhysicalAllocation::release (cuMemRelease): reported success");
    Ok(Some(minimum))
}

/// Rounds the sizes 0, 1, 4096, g, g + 1 and 100 MiB up to `g` and checks every result: a multiple of
/// `g`, at least the request, and less than one granule above it.
fn align_table(g: usize) -> ExampleResult {
    const MIB: usize = 1 << 20;
    let requests = [0, 1, 4096, g, g + 1, 100 * MIB];
    println!(
        "    {:>12}    {:>12}   checked: a multiple of {g}, at least the request, less than {g} above it",
        "requested B", "aligned B"
    );
    for requested in requests {
        let aligned = align_size(requested, g)?;
        if !(aligned.is_multiple_of(g) && aligned >= requested && aligned - requested < g) {
            return Err(format!(
                "align_size({requested}, {g}) = {aligned}: FAILED, not the least multiple of {g} at or \
                 above the request"
            )
            .into());
        }
        println!("    {requested:>12} -> {aligned:>12}   ok");
    }
    Ok(())
}

/// `align_size`'s documented errors, which it reports instead of wrapping around or panicking.
fn documented_errors(g: usize) -> ExampleResult {
    println!("\nalign_size's documented errors (granularity {g} B):");
    expect_refused("  align_size(4096, 0)", align_size(4096, 0), |e| {
        matches!(e, Error::ZeroSize { .. })
    })?;

    // The largest multiple of `g` that fits a usize is the largest size that can be rounded up.
    let largest = usize::MAX - usize::MAX % g;
    check(
        align_size(largest, g)? == largest,
        &format!("  align_size({largest}, {g}) = {largest}: the largest size that rounds"),
    )?;
    if largest == usize::MAX {
        println!("  every usize is a multiple of {g}: nothing can overflow");
        return Ok(());
    }
    let overflows = |e: &Error| matches!(e, Error::Overflow { .. });
    expect_refused(
        &format!("  align_size({}, {g}), one byte more", largest + 1),
        align_size(largest + 1, g),
        overflows,
    )?;
    expect_refused(
        &format!("  align_size(usize::MAX, {g})"),
        align_size(usize::MAX, g),
        overflows,
    )
}

/// Checks that `result` is the error `expected` accepts, and prints it.
fn expect_refused(
    what: &str,
    result: Result<usize, Error>,
    expected: impl Fn(&Error) -> bool,
) -> ExampleResult {
    match result {
        Err(e) if expected(&e) => {
            println!("{what}: refused as documented ({e}): ok");
            Ok(())
        }
        Err(e) => Err(format!("{what}: FAILED, refused with an unexpected error: {e}").into()),
        Ok(value) => Err(format!("{what}: FAILED, accepted ({value})").into()),
    }
}
