//! The machine's GPU topology as tables: for every device its name, VMM support and allocation
//! granularities, its capability report (`Device::capabilities`: POSIX-fd and fabric handles and
//! the IMEX channel, `GPUDirect` RDMA with and without VMM, dma-buf, host and host-NUMA memory) and
//! the paths it offers an engine beyond one process; for every ordered pair of devices its report
//! (`peer::pair_capabilities`: whether one can access the other's memory, the driver's P2P
//! attributes of that direction), and the path `copy_between` with `Route::Auto` takes.
//!
//! Written for any number of devices. With one GPU it prints the device table and says that the peer
//! matrix needs two; without a GPU it says what it checked and that no device was found.
//!
//! Run with `./with-libcuda cargo run --example topology`.

#[path = "common/topology.rs"]
mod topology;

// Each example is its own crate, and this one uses only part of the shared module: not
// `exit_code_with_cause`, `two_or_more_devices_or_none`, `check`, `verify`, `verify_debug`, `pattern`
// or `AddOne`.
#[allow(dead_code)]
mod common;

use std::process::ExitCode;

use common::{ExampleResult, devices_or_none};

fn main() -> ExitCode {
    common::exit_code("topology", run())
}

fn run() -> ExampleResult {
    println!("topology: devices, their capabilities, peer access, P2P attributes and copy paths");
    let Some(devices) = devices_or_none("there is no topology to show")? else {
        return Ok(());
    };
    topology::print(&devices)?;
    Ok(())
}
