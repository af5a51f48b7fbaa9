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

use core::ffi::c_void;
use std::ffi::CString;
use std::process::ExitCode;

use cuda_vmm::{
    Context, Device, DeviceBuffer, DeviceSlice, DeviceSliceMut, DriverError, Error, Module,
    PeerAccess, PeerLink, can_access_peer,
};

type ExampleResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// Elements of each test buffer (4 MiB of `u32`).
const ELEMENTS: usize = 1 << 20;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("enable_bidirectional_peer_access failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> ExampleResult {
    println!(
        "enable_bidirectional_peer_access: directional peer access guards, both ways, every pair"
    );
    let Some(devices) = devices_or_none()? else {
        return Ok(());
    };
    if devices.len() < 2 {
        println!(
            "this example needs two CUDA devices, found {}: the P2P path is skipped",
            devices.len()
        );
        return Ok(());
    }

    // One primary context and one loaded `add_one` per device, indexed by ordinal.
    let contexts: Vec<Context> = devices
        .iter()
        .map(|&d| Context::new(d))
        .collect::<Result<_, _>>()?;
    let kernels: Vec<AddOne<'_>> = contexts
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
    kernels: &[AddOne<'_>],
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
fn prove(guard: &PeerAccess<'_>, kernel: &AddOne<'_>, which: &str) -> ExampleResult {
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
    kernel.run(&mut local.as_mut_slice(), &peer_view)?;
    let expected: Vec<u32> = input.iter().map(|x| x.wrapping_add(1)).collect();
    verify(
        &format!("    add_one on GPU {f} read GPU {t}'s buffer, wrote GPU {f}'s ({which})"),
        &local.as_slice().to_vec()?,
        &expected,
    )
}

/// PTX of `add_one(u32 *dst, const u32 *src, u32 n)`: `dst[i] = src[i] + 1` for `i < n`.
const ADD_ONE_PTX: &str = include_str!("kernels/add_one.ptx");

/// The `add_one` kernel, loaded into one device's context.
struct AddOne<'ctx> {
    module: Module<'ctx>,
    device: Device,
}

impl<'ctx> AddOne<'ctx> {
    fn load(context: &'ctx Context) -> ExampleResult<AddOne<'ctx>> {
        let module = Module::load_ptx(context, &CString::new(ADD_ONE_PTX)?)?;
        Ok(AddOne {
            module,
            device: context.device(),
        })
    }

    /// `dst[i] = src[i] + 1` on this kernel's device; returns when the kernel has finished.
    ///
    /// Both views must be views *for this device* (`view.device()`): the crate hands out such a view
    /// only for memory reachable from that device: its own buffer, a VMM mapping granted to it, or
    /// (here) a peer buffer through `peer_slice`, which borrows a live `PeerAccess` from it.
    fn run(&self, dst: &mut DeviceSliceMut<'_, u32>, src: &DeviceSlice<'_, u32>) -> ExampleResult {
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
        //   above), the device the launch runs on. `src` is the peer buffer of the other GPU, opened to
        //   this one by the live `PeerAccess` guard that the view borrows; `dst` is a buffer of this
        //   device's own context. The kernel touches the first `n` elements of each, and `n` is both
        //   views' length (checked above).
        // - Lifetimes: both views are borrowed by this function for the whole call, and through them the
        //   buffers and the guard, so none can be freed or disabled while the kernel runs; `launch`
        //   returns only once the kernel has finished.
        // - No other writer: `dst` is an exclusive view, and `src` is a different allocation that
        //   nothing else writes during the call (copies of this crate are synchronous).
        unsafe { function.launch((n.div_ceil(block), 1, 1), (block, 1, 1), &mut params) }?;
        Ok(())
    }
}

/// A deterministic pattern that differs between seeds.
fn pattern(len: usize, seed: u32) -> Vec<u32> {
    (0u32..)
        .take(len)
        .map(|i| i.wrapping_mul(2_654_435_761).wrapping_add(seed))
        .collect()
}

/// Compares what was read back with what was expected; an error names the first difference.
fn verify(what: &str, got: &[u32], expected: &[u32]) -> ExampleResult {
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
            "{what}: FAILED at index {i}: read {:#x}, expected {:#x}",
            got[i], expected[i]
        )
        .into()),
    }
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
            println!("no CUDA device found: there is no peer access to enable on this machine.");
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
