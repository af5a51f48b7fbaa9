//! Which GPUs can access which other GPU's memory directly: `can_access_peer(from, to)` for every
//! ordered pair of devices.
//!
//! Peer access is directional: `from -> to` says nothing about `to -> from`, so both orders of every
//! pair are asked. The query changes nothing; where it answers yes it returns a `PeerLink`, the proof
//! that `PeerAccess::enable` requires (see `enable_bidirectional_peer_access`).
//!
//! Needs two devices; with fewer it says what it found. Run with
//! `./with-libcuda cargo run --example check_peer_access`.

use std::process::ExitCode;

use cuda_vmm::{Device, DriverError, can_access_peer};

type ExampleResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("check_peer_access failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> ExampleResult {
    println!("check_peer_access: can_access_peer(from, to) for every ordered pair of devices");
    let Some(devices) = devices_or_none()? else {
        return Ok(());
    };
    if devices.len() < 2 {
        println!(
            "this example needs two CUDA devices, found {}: no pair to check (the P2P path is skipped)",
            devices.len()
        );
        return Ok(());
    }

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

/// Every CUDA device, or `None` after printing what was checked and that there is none. Only "no GPU
/// here" (no device or no kernel driver, or a stub library) is `None`; any other failure is an error.
fn devices_or_none() -> ExampleResult<Option<Vec<Device>>> {
    match cuda_vmm::driver_version() {
        Ok(v) => println!(
            "  checked: the CUDA driver library loads (driver API {}.{})",
            v / 1000,
            v % 1000 / 10
        ),
        Err(e) => println!("  checked: the CUDA driver library loads; cuDriverGetVersion: {e}"),
    }
    match cuda_vmm::init() {
        Ok(()) => {}
        Err(e) if e == DriverError::NO_DEVICE || e == DriverError::STUB_LIBRARY => {
            println!("  checked: cuInit: {e}");
            println!("no CUDA device found: there is no peer access to check on this machine.");
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    }
    let devices = Device::all()?;
    if devices.is_empty() {
        println!("no CUDA device found: cuInit succeeded but the driver lists no device.");
        return Ok(None);
    }
    println!("  checked: cuInit succeeded; {} device(s)", devices.len());
    Ok(Some(devices))
}
