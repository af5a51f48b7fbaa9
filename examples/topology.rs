//! The machine's GPU topology as tables: for every device its name, VMM support and allocation
//! granularities; for every ordered pair of devices whether one can access the other's memory, the
//! driver's P2P attributes of that direction, and the path `copy_between` with `Route::Auto` takes.
//!
//! Written for any number of devices. With one GPU it prints the device table and says that the peer
//! matrix needs two; without a GPU it says what it checked and that no device was found.
//!
//! Run with `./with-libcuda cargo run --example topology`.

#[path = "common/topology.rs"]
mod topology;

use std::process::ExitCode;

use cuda_vmm::{Device, DriverError};

type ExampleResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("topology failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> ExampleResult {
    println!("topology: devices, peer access, P2P attributes and copy paths");
    let Some(devices) = devices_or_none()? else {
        return Ok(());
    };
    topology::print(&devices)?;
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
            println!("no CUDA device found: there is no topology to show on this machine.");
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
