//! The cudarc scope's version check (feature `cudarc`): a scope is entered where the driver's API is
//! no newer than the CUDA version cudarc was built for, and refused before its closure runs, with
//! both versions named, where the driver is newer (cudarc reads every `CUresult` into an enum of its
//! version's codes; see "What it does not cover" in `interop::cudarc`).
//!
//! This suite builds cudarc for CUDA 13.4 (the dev-dependency's feature, checked here without a
//! GPU), so on a driver up to 13.4 the GPU test sees the admitting side; it sees the refusal on a
//! newer driver, and the comparison's unit test in `src/interop/cudarc.rs` covers both.

#![cfg(feature = "cudarc")]

mod common;

use std::io::Write;

use common::devices_or_skip;
use cuda_vmm::Error;
use cuda_vmm::interop::cudarc::scope;
use cudarc::driver::CudaContext;

/// The version the crate's own tests, examples and doctests build cudarc for is the one
/// `Cargo.toml` names for them, whatever `nvcc` the machine has: the newest cudarc 0.19 knows,
/// whose enum holds every code of this crate's table.
#[test]
fn the_suite_builds_cudarc_for_cuda_13_4() {
    assert_eq!(cudarc::driver::sys::CUDA_VERSION, 13040);
}

#[test]
fn scope_admits_a_driver_no_newer_than_cudarc_and_refuses_a_newer_one() {
    let test = "scope_admits_a_driver_no_newer_than_cudarc_and_refuses_a_newer_one";
    let Some(devices) = devices_or_skip(test, 1) else {
        return;
    };
    let driver = cuda_vmm::device::driver_version().unwrap();
    let cudarc = cudarc::driver::sys::CUDA_VERSION;
    let stream = CudaContext::new(devices[0].ordinal())
        .unwrap()
        .new_stream()
        .unwrap();
    let mut ran = false;
    let entered = scope(&stream, |_| -> Result<(), Error> {
        ran = true;
        Ok(())
    });
    let outcome = if i64::from(driver) <= i64::from(cudarc) {
        assert_eq!(entered, Ok(()), "driver {driver}, cudarc {cudarc}");
        assert!(ran, "the closure ran");
        "entered".to_owned()
    } else {
        assert_eq!(
            entered,
            Err(Error::CudarcOlderThanDriver { cudarc, driver })
        );
        assert!(!ran, "refused before the closure runs");
        format!("refused: {}", entered.unwrap_err())
    };
    // Straight to stderr, past the harness's capture: which side this machine checked.
    let _ = writeln!(
        std::io::stderr().lock(),
        "{test}: driver API {driver}, cudarc built for {cudarc}: the scope {outcome}"
    );
}
