//! CUDA's `vectorAddMMAP` sample with the owned layer: three vectors, each one address range striped
//! over every GPU's memory (page `i` of a vector, one granularity in size, lives on device
//! `i % devices`), granted to every GPU, made by one constructor that returns them. A kernel
//! (`examples/kernels/vec_add.ptx`) computes `c = a + b` on each GPU in turn, each time reading and
//! writing the pages of every GPU's memory through the same three addresses.
//!
//! The vectors are `VirtualBuffer`s: no lifetimes, so the constructor returns them like any value,
//! and dropping them unmaps, releases and frees everything in the driver's order. Runs on one GPU too
//! (the stripes are then all on it).
//!
//! Run with `./with-libcuda cargo run --example vector_add_mmap`.

// Each example is its own crate, and this one uses only part of the shared module: not
// `exit_code_with_cause`, `two_or_more_devices_or_none`, `verify_debug` or `AddOne`.
#[allow(dead_code)]
mod common;

use core::ffi::c_void;
use std::ffi::CString;
use std::process::ExitCode;

use common::{ExampleResult, check, devices_or_none, pattern, verify};
use cuda_vmm::{
    Context, Device, DeviceSlice, DeviceSliceMut, Error, Granularity, Module, ReadWrite,
    VirtualBuffer, allocation_granularity,
};

/// Pages of each vector on each device.
const PAGES_PER_DEVICE: usize = 2;

/// `vec_add(u32 *c, const u32 *a, const u32 *b, u32 n)`: `c[i] = a[i] + b[i]` for `i < n`.
const VEC_ADD_PTX: &str = include_str!("kernels/vec_add.ptx");

fn main() -> ExitCode {
    common::exit_code("vector_add_mmap", run())
}

/// The sample's three vectors.
struct Vectors {
    a: VirtualBuffer<ReadWrite>,
    b: VirtualBuffer<ReadWrite>,
    c: VirtualBuffer<ReadWrite>,
}

/// The sample's layout, three times: each vector's pages striped over `devices` in turn, every page
/// granted to every device. Returned by value: the buffers own everything they use.
fn striped_vectors(devices: &[Device]) -> Result<Vectors, Error> {
    let mut page = 1;
    for &device in devices {
        page = page.max(allocation_granularity(device, Granularity::Minimum)?);
    }
    let pages = PAGES_PER_DEVICE * devices.len();
    let striped = || -> Result<VirtualBuffer, Error> {
        let mut vector = VirtualBuffer::new(pages * page, devices, ReadWrite)?;
        for &device in devices.iter().cycle().take(pages) {
            vector.grow(device, page)?;
        }
        Ok(vector)
    };
    Ok(Vectors {
        a: striped()?,
        b: striped()?,
        c: striped()?,
    })
}

fn run() -> ExampleResult {
    println!("vector_add_mmap: c = a + b over vectors striped across every GPU's memory");
    let Some(devices) = devices_or_none("there is no vector to add")? else {
        return Ok(());
    };
    for &device in &devices {
        if !device.supports_vmm()? {
            println!(
                "GPU {} has no VMM support: this example needs it on every device; skipped",
                device.ordinal()
            );
            return Ok(());
        }
    }
    let Vectors {
        mut a,
        mut b,
        mut c,
    } = striped_vectors(&devices)?;
    let stripes: Vec<usize> = a.pages().map(|p| p.device.ordinal()).collect();
    println!(
        "  3 vectors of {} B, each {} pages on GPUs {stripes:?}, granted to all {} GPU(s)",
        a.end(),
        stripes.len(),
        devices.len()
    );
    let n = a.end() / 4;
    let (input_a, input_b) = (pattern(n, 1), pattern(n, 2));
    a.slice_mut::<u32>(..)?.copy_from_host(&input_a)?;
    b.slice_mut::<u32>(..)?.copy_from_host(&input_b)?;
    let expected: Vec<u32> = input_a
        .iter()
        .zip(&input_b)
        .map(|(x, y)| x.wrapping_add(*y))
        .collect();

    for &device in &devices {
        let gpu = device.ordinal();
        let context = Context::new(device)?;
        let module = Module::load_ptx(&context, &CString::new(VEC_ADD_PTX)?)?;
        c.slice_mut::<u32>(..)?.copy_from_host(&vec![0; n])?;
        // SAFETY: `a`, `b` and `c` are three distinct buffers, so the views do not overlap, and
        // nothing else runs on them during the call.
        unsafe {
            vec_add(
                &module,
                &mut c.slice_mut_on::<u32>(.., device)?,
                &a.slice_on::<u32>(.., device)?,
                &b.slice_on::<u32>(.., device)?,
            )
        }?;
        let result = c.slice::<u32>(..)?.to_vec()?;
        verify(
            &format!("  GPU {gpu} added {n} values over the stripes of every GPU"),
            &result,
            &expected,
        )?;
    }
    let stats = c.stats();
    check(
        stats.set_access_calls == stats.pages_mapped,
        &format!(
            "  one grant per page: {} cuMemSetAccess for {} pages of c",
            stats.set_access_calls, stats.pages_mapped
        ),
    )?;
    // Dropped here: each vector unmaps its pages, releases their memory and frees its range.
    Ok(())
}

/// Runs `vec_add` on the module's device: `c[i] = a[i] + b[i]`; returns when the kernel has finished.
///
/// # Safety
/// `c` does not overlap `a` or `b`, and nothing but this kernel writes any of them until this returns.
unsafe fn vec_add(
    module: &Module<'_>,
    c: &mut DeviceSliceMut<'_, u32>,
    a: &DeviceSlice<'_, u32>,
    b: &DeviceSlice<'_, u32>,
) -> ExampleResult {
    let device = module.device();
    if [c.device(), a.device(), b.device()] != [device; 3] {
        return Err("vec_add was given a view for another device".into());
    }
    if a.len() != c.len() || b.len() != c.len() {
        return Err("vec_add: the vectors' lengths differ".into());
    }
    let mut n = u32::try_from(c.len())?;
    if n == 0 {
        return Ok(());
    }
    let function = module.function(c"vec_add")?;
    let (mut c_ptr, mut a_ptr, mut b_ptr) = (c.as_raw_ptr(), a.as_raw_ptr(), b.as_raw_ptr());
    let mut params = [
        (&raw mut c_ptr).cast::<c_void>(),
        (&raw mut a_ptr).cast::<c_void>(),
        (&raw mut b_ptr).cast::<c_void>(),
        (&raw mut n).cast::<c_void>(),
    ];
    let block = 256;
    // SAFETY:
    // - Parameter types: `vec_add` declares (.u64 c, .u64 a, .u64 b, .u32 n); `params` points, in
    //   that order, at three u64 device addresses and a u32, alive for the call.
    // - Reachability for the whole launch: the three views are views for the module's device
    //   (checked above), the device the launch runs on; a buffer hands out a view for a device only
    //   where every byte of it is mapped and granted to that device (its access set), and the views
    //   borrow their buffers, so nothing is unmapped or revoked while the kernel runs. The kernel
    //   touches the first `n` elements of each, and `n` is every view's length (checked above).
    // - No other writer: `c` is an exclusive view, and the caller guarantees (`# Safety`) that it
    //   overlaps neither source and that nothing else writes them during the call; `launch`
    //   returns only once the kernel has finished.
    unsafe { function.launch((n.div_ceil(block), 1, 1), (block, 1, 1), &mut params) }?;
    Ok(())
}
