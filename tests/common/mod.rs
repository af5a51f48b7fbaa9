//! Shared by the GPU integration tests: finding devices, or skipping visibly where there are none.

#![allow(dead_code, unreachable_pub)]

use cuda_vmm::{Context, Device, DriverError};

/// Every device the driver reports with its primary context, or `None` after printing why the test is
/// skipped. Skips only where the machine has no usable GPU (no device, no kernel driver, a stub
/// library) or fewer than `needed`; any other driver failure fails the test.
pub fn gpus_or_skip(test: &str, needed: usize) -> Option<Vec<(Device, Context)>> {
    match cuda_vmm::init() {
        Ok(()) => {}
        Err(e) if e == DriverError::NO_DEVICE || e == DriverError::STUB_LIBRARY => {
            let version =
                cuda_vmm::driver_version().map_or_else(|e| e.to_string(), |v| v.to_string());
            skip(&format!(
                "SKIPPED {test}: no CUDA device (driver library API version {version}; cuInit: {e})"
            ));
            return None;
        }
        Err(e) => panic!("{test}: the driver failed to initialise: {e}"),
    }
    let devices = Device::all().unwrap_or_else(|e| panic!("{test}: listing devices: {e}"));
    if devices.len() < needed {
        let msg = format!(
            "SKIPPED {test}: needs {needed} CUDA device(s), the driver reports {}",
            devices.len()
        );
        skip(&msg);
        return None;
    }
    Some(
        devices
            .into_iter()
            .map(|d| {
                (
                    d,
                    Context::new(d)
                        .unwrap_or_else(|e| panic!("{test}: retaining {d:?}'s context: {e}")),
                )
            })
            .collect(),
    )
}

/// Prints `msg` where it is seen: straight to the process's stderr, past the test harness's output
/// capture (which hides `println!`/`eprintln!` of passing tests).
pub fn skip(msg: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{msg}");
}

/// The first device and its context, or `None` after printing why the test is skipped.
pub fn gpu_or_skip(test: &str) -> Option<(Device, Context)> {
    gpus_or_skip(test, 1).and_then(|v| v.into_iter().next())
}

/// A deterministic byte pattern that differs between `seed`s.
pub fn pattern(len: usize, seed: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| i.wrapping_mul(2_654_435_761).wrapping_add(seed))
        .collect()
}
