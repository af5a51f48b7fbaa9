//! Which GPUs can access which other GPU's memory directly: `can_access_peer(from, to)` for every
//! ordered pair of devices.
//!
//! Peer access is directional: `from -> to` says nothing about `to -> from`, so both orders of every
//! pair are asked. The query changes nothing; where it answers yes it returns a `PeerLink`, the proof
//! that `PeerAccess::enable` requires (see `enable_bidirectional_peer_access`).
//!
//! Needs two devices; with fewer it says what it found. Run with
//! `./with-libcuda cargo run --example check_peer_access`.

// Each example is its own crate, and this one uses only part of the shared module: not
// `exit_code_with_cause`, `check`, `verify`, `verify_debug`, `pattern` or `AddOne`.
#[allow(dead_code)]
mod common;

use std::process::ExitCode;

use common::{ExampleResult, two_or_more_devices_or_none};
use cuda_vmm::peer::can_access_peer;

fn main() -> ExitCode {
    common::exit_code("check_peer_access", run())
}

fn run() -> ExampleResult {
    println!("check_peer_access: can_access_peer(from, to) for every ordered pair of devices");
    let Some(devices) = two_or_more_devices_or_none(
        "there is no peer access to check",
        "no pair to check (the P2P path is skipped)",
    )?
    else {
        return Ok(());
    };

    let mut can = 0usize;
    let mut pairs = 0usize;
    for &from in &devices {
        for &to in &devices {
            if from == to {
                continue;
            }
            pairs += 1;
            match can_access_peer(from, to)? {
                Some(link) => {
                    can += 1;
                    println!(
                        "  GPU {} can access GPU {}",
                        link.from().ordinal(),
                        link.to().ordinal()
                    );
                }
                None => println!(
                    "  GPU {} cannot access GPU {}",
                    from.ordinal(),
                    to.ordinal()
                ),
            }
        }
    }

    // Directional answers may differ between the two orders of a pair: say so where they do.
    for (i, &a) in devices.iter().enumerate() {
        for &b in &devices[i + 1..] {
            let (ab, ba) = (can_access_peer(a, b)?, can_access_peer(b, a)?);
            if ab.is_some() != ba.is_some() {
                println!(
                    "  note: GPU {} and GPU {} differ by direction: only one of them may access the other",
                    a.ordinal(),
                    b.ordinal()
                );
            }
        }
    }
    println!(
        "checked {pairs} ordered pairs of {} devices: {can} can access directly, {} cannot (copies \
         between those take the staged path through host memory)",
        devices.len(),
        pairs - can
    );
    Ok(())
}
