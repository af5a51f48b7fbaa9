//! Helpers shared by the examples: the `main` wrapper, finding the devices (or saying that there are
//! none, or fewer than two), checking results, and the `add_one` kernel.
//!
//! Each example is its own crate and includes this module with `mod common;`; an example uses only some
//! of the helpers, so each include allows `dead_code`.

use core::ffi::c_void;
use std::ffi::CString;
use std::fmt::{Debug, LowerHex};
use std::process::ExitCode;

use cuda_vmm::{Context, Device, DeviceSlice, DeviceSliceMut, Module};

/// What an example's steps return: any error ends the example with a message.
pub(crate) type ExampleResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// The exit status of an example whose body returned `result`: success, or failure after printing
/// "`example` failed: error" on stderr.
pub(crate) fn exit_code(example: &str, result: ExampleResult) -> ExitCode {
    finish(example, result, false)
}

/// As [`exit_code`], and on failure also the error's source, where it has one, as "  caused by: …".
pub(crate) fn exit_code_with_cause(example: &str, result: ExampleResult) -> ExitCode {
    finish(example, result, true)
}

fn finish(example: &str, result: ExampleResult, with_cause: bool) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{example} failed: {e}");
            if with_cause && let Some(source) = std::error::Error::source(&*e) {
                eprintln!("  caused by: {source}");
            }
            ExitCode::FAILURE
        }
    }
}

/// Every CUDA device, or `None` after printing what was checked and that there is none. Only "no GPU
/// here" (no device or no kernel driver, or a stub library) is `None`; any other failure is an error.
///
/// `nothing_to_do` says what the example cannot do without a device, in the line
/// "no CUDA device found: `nothing_to_do` on this machine."
pub(crate) fn devices_or_none(nothing_to_do: &str) -> ExampleResult<Option<Vec<Device>>> {
    match cuda_vmm::device::driver_version() {
        Ok(v) => println!(
            "  checked: the CUDA driver library loads (driver API {}.{})",
            v / 1000,
            v % 1000 / 10
        ),
        Err(e) => println!("  checked: the CUDA driver library loads; cuDriverGetVersion: {e}"),
    }
    match cuda_vmm::init() {
        Ok(()) => {}
        Err(e) if e.is_no_gpu() => {
            println!("  checked: cuInit: {e}");
            println!("no CUDA device found: {nothing_to_do} on this machine.");
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

/// GPU 0 where it supports VMM, or `None` after saying why the example has nothing to do (no device,
/// or no VMM support).
pub(crate) fn first_vmm_device_or_none(nothing_to_do: &str) -> ExampleResult<Option<Device>> {
    let Some(devices) = devices_or_none(nothing_to_do)? else {
        return Ok(None);
    };
    let Some(&device) = devices.first() else {
        return Ok(None);
    };
    if !device.supports_vmm()? {
        println!("GPU 0 has no VMM support: skipped");
        return Ok(None);
    }
    Ok(Some(device))
}

/// As [`devices_or_none`], and `None` also where there is only one device, after printing
/// "this example needs two CUDA devices, found 1: `skipped`".
pub(crate) fn two_or_more_devices_or_none(
    nothing_to_do: &str,
    skipped: &str,
) -> ExampleResult<Option<Vec<Device>>> {
    let Some(devices) = devices_or_none(nothing_to_do)? else {
        return Ok(None);
    };
    if devices.len() < 2 {
        println!(
            "this example needs two CUDA devices, found {}: {skipped}",
            devices.len()
        );
        return Ok(None);
    }
    Ok(Some(devices))
}

/// Prints "`what`: ok" where `ok` holds; otherwise the error "`what`: FAILED".
pub(crate) fn check(ok: bool, what: &str) -> ExampleResult {
    if ok {
        println!("{what}: ok");
        Ok(())
    } else {
        Err(format!("{what}: FAILED").into())
    }
}

/// Compares what was read back with what was expected; an error names the first difference, with the
/// values in hex (`0x…`).
pub(crate) fn verify<T: PartialEq + LowerHex>(
    what: &str,
    got: &[T],
    expected: &[T],
) -> ExampleResult {
    compare(what, got, expected, |v| format!("{v:#x}"))
}

/// As [`verify`], with the values of an error shown by `Debug`.
pub(crate) fn verify_debug<T: PartialEq + Debug>(
    what: &str,
    got: &[T],
    expected: &[T],
) -> ExampleResult {
    compare(what, got, expected, |v| format!("{v:?}"))
}

fn compare<T: PartialEq>(
    what: &str,
    got: &[T],
    expected: &[T],
    show: fn(&T) -> String,
) -> ExampleResult {
    if got.len() != expected.len() {
        return Err(format!(
            "{what}: FAILED, read {} values, expected {}",
            got.len(),
            expected.len()
        )
        .into());
    }
    match got.iter().zip(expected).position(|(g, e)| g != e) {
        None => {
            println!("{what}: ok ({} values match)", got.len());
            Ok(())
        }
        Some(i) => Err(format!(
            "{what}: FAILED at index {i}: read {}, expected {}",
            show(&got[i]),
            show(&expected[i])
        )
        .into()),
    }
}

/// A deterministic pattern that differs between seeds.
pub(crate) fn pattern(len: usize, seed: u32) -> Vec<u32> {
    (0u32..)
        .take(len)
        .map(|i| i.wrapping_mul(2_654_435_761).wrapping_add(seed))
        .collect()
}

/// PTX of `add_one(u32 *dst, const u32 *src, u32 n)`: `dst[i] = src[i] + 1` for `i < n`.
const ADD_ONE_PTX: &str = include_str!("../kernels/add_one.ptx");

/// The `add_one` kernel, loaded into one device's context.
pub(crate) struct AddOne {
    module: Module,
    device: Device,
}

impl AddOne {
    pub(crate) fn load(context: &Context) -> ExampleResult<AddOne> {
        let module = Module::load_ptx(context, &CString::new(ADD_ONE_PTX)?)?;
        Ok(AddOne {
            module,
            device: context.device(),
        })
    }

    /// `dst[i] = src[i] + 1` on this kernel's device; returns when the kernel has finished.
    ///
    /// Both views must be views *for this device* (`view.device()`), and of the same length; both are
    /// checked, and an error says which is not. The crate hands out a view for a device only for memory
    /// reachable from that device: its own buffer, a peer buffer through `peer_slice`, which borrows a
    /// live `PeerAccess`, or a VMM mapping granted to it, through `Access::slice_on`.
    ///
    /// # Safety
    /// The views cover where the addresses point, and for how long; the caller guarantees what no view
    /// can: `src` does not overlap `dst`, and nothing but this kernel writes the memory of either view
    /// until this returns.
    pub(crate) unsafe fn run(
        &self,
        dst: &mut DeviceSliceMut<'_, u32>,
        src: &DeviceSlice<'_, u32>,
    ) -> ExampleResult {
        for view_device in [dst.device(), src.device()] {
            if view_device != self.device {
                return Err(format!(
                    "add_one on GPU {} was given a view for GPU {}",
                    self.device.ordinal(),
                    view_device.ordinal()
                )
                .into());
            }
        }
        if dst.len() != src.len() {
            return Err(format!("add_one: {} outputs for {} inputs", dst.len(), src.len()).into());
        }
        let mut n = u32::try_from(src.len())?;
        if n == 0 {
            return Ok(());
        }
        let function = self.module.function(c"add_one")?;
        let mut dst_ptr = dst.as_raw_ptr();
        let mut src_ptr = src.as_raw_ptr();
        let mut params = [
            (&raw mut dst_ptr).cast::<c_void>(),
            (&raw mut src_ptr).cast::<c_void>(),
            (&raw mut n).cast::<c_void>(),
        ];
        let block = 256;
        // SAFETY:
        // - Parameter types: `add_one` declares (.u64 dst, .u64 src, .u32 n); `params` points, in that
        //   order, at a u64 device address, a u64 device address and a u32, alive for the call.
        // - Reachability for the whole launch: both views are views for this kernel's device (checked
        //   above), the device the launch runs on, and the crate makes a view for a device only of
        //   memory that device can reach: a buffer of its own context, another device's buffer opened
        //   to it by the live `PeerAccess` guard the view borrows, or a VMM mapping granted to it
        //   (`cuMemSetAccess`) by the `Access` the view borrows. The kernel touches the first `n`
        //   elements of each, and `n` is both views' length (checked above).
        // - Lifetimes: both views are borrowed by this function for the whole call, and through them
        //   what they view (a buffer and, for a peer view, its guard; or a grant, so the mapping,
        //   reservation and physical memory), so none can be freed, disabled, unmapped or revoked
        //   while the kernel runs; `launch` returns only once the kernel has finished.
        // - No other writer: `dst` is an exclusive view, and the caller guarantees (`# Safety`) that
        //   `src` does not overlap it and that nothing else writes either during the call.
        unsafe { function.launch((n.div_ceil(block), 1, 1), (block, 1, 1), &mut params) }?;
        Ok(())
    }
}
