//! Shared by the GPU integration tests: finding devices, or skipping visibly where there are none.

#![allow(dead_code, unreachable_pub)]

use core::ffi::c_void;

#[cfg(target_os = "linux")]
pub mod processes;

use cuda_vmm::{Context, Device, DriverError};

// The driver's own symbols with integer results, for what the safe API does not (or must not) offer:
// no driver value lands in a Rust enum.
unsafe extern "C" {
    fn cuDevicePrimaryCtxGetState(dev: i32, flags: *mut u32, active: *mut i32) -> u32;
    fn cuCtxSetCurrent(ctx: *mut c_void) -> u32;
    fn cuCtxEnablePeerAccess(peer: *mut c_void, flags: u32) -> u32;
    fn cuCtxDisablePeerAccess(peer: *mut c_void) -> u32;
    fn cuThreadExchangeStreamCaptureMode(mode: *mut u32) -> u32;
}

/// Every device the driver reports with its primary context, or `None` after printing why the test is
/// skipped. Skips only where the machine has no usable GPU (no device, no kernel driver, a stub
/// library) or fewer than `needed`; any other driver failure fails the test.
pub fn gpus_or_skip(test: &str, needed: usize) -> Option<Vec<(Device, Context)>> {
    let devices = devices_or_skip(test, needed)?;
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

/// As [`gpus_or_skip`], without retaining any context.
pub fn devices_or_skip(test: &str, needed: usize) -> Option<Vec<Device>> {
    match cuda_vmm::init() {
        Ok(()) => {}
        Err(e) if e.is_no_gpu() => {
            let version = cuda_vmm::device::driver_version()
                .map_or_else(|e| e.to_string(), |v| v.to_string());
            skip(&format!(
                "SKIPPED {test}: no CUDA device (driver library API version {version}; cuInit: {e})"
            ));
            return None;
        }
        Err(e) => panic!("{test}: the driver failed to initialise: {e}"),
    }
    let devices = Device::all().unwrap_or_else(|e| panic!("{test}: listing devices: {e}"));
    if devices.len() < needed {
        skip(&format!(
            "SKIPPED {test}: needs {needed} CUDA device(s), the driver reports {}",
            devices.len()
        ));
        return None;
    }
    Some(devices)
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

/// A raw driver result as text: `CUDA_SUCCESS` or the error's name and description.
pub fn code_name(code: u32) -> String {
    DriverError::from_raw(code).map_or_else(|| "CUDA_SUCCESS".to_owned(), |e| e.to_string())
}

/// A deterministic byte pattern that differs between `seed`s.
pub fn pattern(len: usize, seed: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| i.wrapping_mul(2_654_435_761).wrapping_add(seed))
        .collect()
}

/// The `add_one(u32 *dst, const u32 *src, u32 n)` kernel's PTX: `dst[i] = src[i] + 1`.
pub fn add_one_ptx() -> std::ffi::CString {
    std::ffi::CString::new(include_str!("../../examples/kernels/add_one.ptx"))
        .expect("PTX has no NUL byte")
}

/// Runs `add_one` on `ctx`'s device: `dst[i] = src[i] + 1` for `n` elements.
///
/// # Safety
/// `dst` and `src` must be device addresses of at least `n` `u32`s, reachable from `ctx`'s device (granted
/// VMM memory, its own buffers, or peer buffers under a live `PeerAccess`), alive and not otherwise used
/// until this returns.
pub unsafe fn add_one(
    ctx: &Context,
    mut dst: u64,
    mut src: u64,
    n: usize,
) -> Result<(), cuda_vmm::Error> {
    use core::ffi::c_void;
    let module = cuda_vmm::Module::load_ptx(ctx, &add_one_ptx())?;
    let kernel = module.function(c"add_one")?;
    let mut n32 = u32::try_from(n).expect("n fits u32");
    let mut params = [
        (&raw mut dst).cast::<c_void>(),
        (&raw mut src).cast::<c_void>(),
        (&raw mut n32).cast::<c_void>(),
    ];
    let blocks = n32.div_ceil(256);
    // SAFETY: the parameters are (u64, u64, u32) as the kernel declares; the caller guarantees both
    // addresses for `n` elements for the whole launch, which waits for the kernel to finish.
    unsafe { kernel.launch((blocks, 1, 1), (256, 1, 1), &mut params) }
}

/// Whether `device`'s primary context is active (retained by someone, and not reset), as
/// `cuDevicePrimaryCtxGetState` says.
pub fn primary_active(device: Device) -> bool {
    let (mut flags, mut active) = (0u32, 0i32);
    // SAFETY: both pointers are valid and writable; `device` is a device the driver listed.
    let code =
        unsafe { cuDevicePrimaryCtxGetState(device.as_raw(), &raw mut flags, &raw mut active) };
    assert_eq!(code, 0, "cuDevicePrimaryCtxGetState: {}", code_name(code));
    active != 0
}

/// Raw `cuCtxSetCurrent`: makes `ctx` current on this thread; panics where the driver refuses.
pub fn raw_bind(ctx: &Context) {
    // SAFETY: `ctx` is a retained context, alive for the call.
    let code = unsafe { cuCtxSetCurrent(ctx.as_raw().cast()) };
    assert_eq!(code, 0, "cuCtxSetCurrent: {}", code_name(code));
}

/// Raw `cuThreadExchangeStreamCaptureMode`: sets the calling thread's capture mode (0 `GLOBAL`, 1
/// `THREAD_LOCAL`, 2 `RELAXED`); returns the previous one; panics where the driver refuses.
pub fn exchange_capture_mode(mode: u32) -> u32 {
    let mut mode = mode;
    // SAFETY: `mode` is readable and writable for the call, which concerns this thread only.
    let code = unsafe { cuThreadExchangeStreamCaptureMode(&raw mut mode) };
    assert_eq!(
        code,
        0,
        "cuThreadExchangeStreamCaptureMode: {}",
        code_name(code)
    );
    mode
}

/// Raw `cuCtxEnablePeerAccess` from `from` to `to`, outside any guard: the driver's answer.
pub fn raw_enable_peer(from: &Context, to: &Context) -> u32 {
    raw_bind(from);
    // SAFETY: `from` is current (bound just above); `to` is a retained context; flags 0.
    unsafe { cuCtxEnablePeerAccess(to.as_raw().cast(), 0) }
}

/// Raw `cuCtxDisablePeerAccess` from `from` to `to`, outside any guard: the driver's answer.
pub fn raw_disable_peer(from: &Context, to: &Context) -> u32 {
    raw_bind(from);
    // SAFETY: `from` is current (bound just above); `to` is a retained context.
    unsafe { cuCtxDisablePeerAccess(to.as_raw().cast()) }
}

/// `count(u32 *counter)`: one thread adds one to `*counter`, atomically.
pub const COUNT_PTX: &str = r"
.version 7.0
.target sm_52
.address_size 64

.visible .entry count(.param .u64 param_counter)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [param_counter];
    cvta.to.global.u64 %rd2, %rd1;
    atom.global.add.u32 %r1, [%rd2], 1;
    ret;
}
";
