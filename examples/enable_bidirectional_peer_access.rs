//! Context peer access in both directions, for every pair of devices that supports it, with guards.
//!
//! For each pair whose two directions both have a `PeerLink` (the answer of `can_access_peer`), this:
//! - enables both directions with `PeerAccess::enable`, which takes the link: access the driver did not
//!   report cannot be enabled, and a link of the other direction is refused;
//! - proves each direction is real: a `DeviceBuffer<u32>` on the `to` device is read through
//!   `peer_slice(&guard)` (a view whose copies run on `from`), and the `add_one` kernel runs on `from`'s
//!   GPU reading that peer buffer directly; the results are compared with what was written;
//! - enables one direction again while its guard lives (an overlapping guard, not an error), ends that
//!   second guard and shows access stays enabled under the first;
//! - ends every guard with `disable()`, which waits for `from`'s work and reports the driver's answer.
//!
//! Context peer access opens `cuMemAlloc` memory (`DeviceBuffer`) only; VMM mappings are opened per
//! mapping by grants (see `cross_gpu_vmm_roundtrip`).
//!
//! Needs two devices; with fewer it says what it found. Run with
//! `./with-libcuda cargo run --example enable_bidirectional_peer_access`.

// Each example is its own crate, and this one uses only part of the shared module: not
// `exit_code_with_cause`, `check` or `verify_debug`.
#[allow(dead_code)]
mod common;

use std::process::ExitCode;

use common::{AddOne, ExampleResult, pattern, two_or_more_devices_or_none, verify};
use cuda_vmm::{Context, DeviceBuffer, Error, PeerAccess, peer::PeerLink, peer::can_access_peer};

/// Elements of each test buffer (4 MiB of `u32`).
const ELEMENTS: usize = 1 << 20;

fn main() -> ExitCode {
    common::exit_code("enable_bidirectional_peer_access", run())
}

fn run() -> ExampleResult {
    println!(
        "enable_bidirectional_peer_access: directional peer access guards, both ways, every pair"
    );
    let Some(devices) = two_or_more_devices_or_none(
        "there is no peer access to enable",
        "the P2P path is skipped",
    )?
    else {
        return Ok(());
    };

    // One primary context and one loaded `add_one` per device, indexed by ordinal.
    let contexts: Vec<Context> = devices
        .iter()
        .map(|&d| Context::new(d))
        .collect::<Result<_, _>>()?;
    let kernels: Vec<AddOne> = contexts
        .iter()
        .map(AddOne::load)
        .collect::<Result<_, _>>()?;

    let (mut enabled, mut skipped) = (0usize, 0usize);
    for i in 0..devices.len() {
        for j in i + 1..devices.len() {
            let (a, b) = (devices[i], devices[j]);
            // `PeerAccess::enable` takes the link `can_access_peer` returns, and nothing else makes
            // one: without both links, enabling both directions cannot be written.
            let (Some(a_to_b), Some(b_to_a)) = (can_access_peer(a, b)?, can_access_peer(b, a)?)
            else {
                println!(
                    "\nGPU {i} <-> GPU {j}: can_access_peer did not give a PeerLink for both \
                     directions, so PeerAccess::enable cannot be called for both; copies between \
                     them take the staged path (Route::Auto)"
                );
                skipped += 1;
                continue;
            };
            both_directions(&contexts, &kernels, a_to_b, b_to_a)?;
            enabled += 1;
        }
    }
    println!(
        "\nenable_bidirectional_peer_access: {enabled} pair(s) enabled both ways, verified and \
         disabled; {skipped} pair(s) without a link in both directions"
    );
    Ok(())
}

/// Enables, proves and disables both directions of one pair.
fn both_directions(
    contexts: &[Context],
    kernels: &[AddOne],
    a_to_b: PeerLink,
    b_to_a: PeerLink,
) -> ExampleResult {
    let (i, j) = (a_to_b.from().ordinal(), a_to_b.to().ordinal());
    let (ca, cb) = (&contexts[i], &contexts[j]);
    println!("\nGPU {i} <-> GPU {j}");

    // A link is for one direction: the other direction's link is refused before the driver is called.
    match PeerAccess::enable(ca, cb, b_to_a) {
        Err(Error::DeviceMismatch { .. }) => println!(
            "  PeerAccess::enable(GPU {i} -> GPU {j}) with the GPU {j} -> GPU {i} link: refused \
             (DeviceMismatch): ok"
        ),
        Ok(guard) => {
            guard.disable()?;
            return Err(format!(
                "GPU {i} -> GPU {j} was enabled with the link of GPU {j} -> GPU {i}"
            )
            .into());
        }
        Err(e) => return Err(e.into()),
    }

    let a_reads_b = PeerAccess::enable(ca, cb, a_to_b)?;
    let b_reads_a = PeerAccess::enable(cb, ca, b_to_a)?;
    println!(
        "  PeerAccess::enable (cuCtxEnablePeerAccess): GPU {i} -> GPU {j} and GPU {j} -> GPU {i}"
    );
    prove(&a_reads_b, &kernels[i], "first guard")?;
    prove(&b_reads_a, &kernels[j], "first guard")?;

    // A peer view is checked against its guard: a buffer of GPU j is not opened by GPU j's own guard
    // to GPU i (it opens GPU i's memory to GPU j).
    let buffer = DeviceBuffer::<u32>::zeroed(cb, 16)?;
    match buffer.peer_slice(&b_reads_a) {
        Err(Error::DeviceMismatch { .. }) => println!(
            "  peer_slice of a GPU {j} buffer with the GPU {j} -> GPU {i} guard: refused \
             (DeviceMismatch): ok"
        ),
        Ok(_) => return Err("a guard of the other direction opened a peer buffer".into()),
        Err(e) => return Err(e.into()),
    }
    buffer.free()?;

    // Enabling a direction that a live guard already enabled is not an error: the guards share one
    // enablement, and the direction stays enabled until the last of them ends.
    let again = PeerAccess::enable(ca, cb, a_to_b)?;
    println!("  PeerAccess::enable(GPU {i} -> GPU {j}) again while its guard lives: ok");
    prove(&again, &kernels[i], "second, overlapping guard")?;
    again.disable()?;
    println!(
        "  disable() of the second guard: reported success; the first guard still holds the direction"
    );
    prove(
        &a_reads_b,
        &kernels[i],
        "first guard, after the second ended",
    )?;

    // `disable` needs the guard by value, so it cannot be called while a peer view borrows it: work
    // that uses peer memory has finished (or waits in `disable`'s synchronisation) before access ends.
    a_reads_b.disable()?;
    b_reads_a.disable()?;
    println!(
        "  disable() of both directions (cuCtxSynchronize, then cuCtxDisablePeerAccess): reported success"
    );
    Ok(())
}

/// Proves that `guard` opens its `to` device's memory to its `from` device: a buffer of `to` is read
/// through a peer view (copy on `from`), and `add_one` runs on `from` reading the buffer directly.
fn prove(guard: &PeerAccess<'_>, kernel: &AddOne, which: &str) -> ExampleResult {
    let (from, to) = (guard.from(), guard.to());
    let (f, t) = (from.device().ordinal(), to.device().ordinal());
    let input = pattern(ELEMENTS, (f * 64 + t) as u32);
    let remote = DeviceBuffer::from_host(to, &input)?;
    let peer_view = remote.peer_slice(guard)?;
    verify(
        &format!("    GPU {f} reads GPU {t}'s buffer through peer_slice ({which})"),
        &peer_view.to_vec()?,
        &input,
    )?;

    let mut local = DeviceBuffer::<u32>::zeroed(from, ELEMENTS)?;
    // SAFETY: `local` is a buffer just allocated on `from`, so it does not overlap `peer_view` (a
    // buffer of `to`); nothing else writes either while the kernel runs: this example has one thread,
    // and every copy of the crate has finished when it returns.
    unsafe { kernel.run(&mut local.as_mut_slice(), &peer_view) }?;
    let expected: Vec<u32> = input.iter().map(|x| x.wrapping_add(1)).collect();
    verify(
        &format!("    add_one on GPU {f} read GPU {t}'s buffer, wrote GPU {f}'s ({which})"),
        &local.as_slice().to_vec()?,
        &expected,
    )
}
