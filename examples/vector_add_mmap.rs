//! CUDA's `vectorAddMMAP` sample with the owned layer: three vectors, each one address range striped
//! over every GPU's memory (page `i` of a vector, one granularity in size, lives on device
//! `i % devices`), granted to every GPU, made by one constructor that returns them. A kernel, CUDA C
//! compiled at run time by NVRTC through cudarc, computes `c = a + b` on each GPU in turn, each time
//! reading and writing the pages of every GPU's memory through the same three addresses, launched
//! with cudarc's builder on views lent to a `cuda_vmm::interop::cudarc::scope`.
//!
//! The vectors are `VirtualBuffer`s: no lifetimes, so the constructor returns them like any value,
//! and dropping them unmaps, releases and frees everything in the driver's order. Runs on one GPU too
//! (the stripes are then all on it). Says why and exits successfully where there is no GPU, or no
//! NVRTC library to load.
//!
//! Run with `./with-libcuda cargo run --features cudarc --example vector_add_mmap`.

// Each example is its own crate, and this one uses only part of the shared module: not
// `exit_code_with_cause`, `two_or_more_devices_or_none`, `verify_debug` or `AddOne`.
#[allow(dead_code)]
mod common;

use std::process::ExitCode;
use std::sync::Arc;

use common::{ExampleResult, check, devices_or_none, pattern, verify};
use cuda_vmm::interop::cudarc::scope;
use cuda_vmm::{Device, Error, Granularity, ReadWrite, VirtualBuffer, allocation_granularity};
use cudarc::driver::{CudaContext, CudaFunction, DriverError, LaunchConfig, PushKernelArg, sys};

/// Pages of each vector on each device.
const PAGES_PER_DEVICE: usize = 2;

/// `c[i] = a[i] + b[i]` for `i < n`, compiled by NVRTC when the example runs.
const VEC_ADD_CU: &str = r#"
extern "C" __global__ void vec_add(unsigned int *c, const unsigned int *a, const unsigned int *b,
                                   unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"#;

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
        let vector = VirtualBuffer::new(pages * page, devices, ReadWrite)?;
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
    a.slice_bytes_mut::<u32>(..)?.copy_from_host(&input_a)?;
    b.slice_bytes_mut::<u32>(..)?.copy_from_host(&input_b)?;
    let expected: Vec<u32> = input_a
        .iter()
        .zip(&input_b)
        .map(|(x, y)| x.wrapping_add(*y))
        .collect();

    // SAFETY: tries to `dlopen` the NVRTC library under cudarc's candidate names, nothing more.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        println!(
            "the NVRTC library (libnvrtc.so) cannot be loaded: no kernel to compile; skipped (the \
             hand-written PTX examples, such as cross_gpu_vmm_roundtrip, need no NVRTC)"
        );
        return Ok(());
    }
    let ptx = cudarc::nvrtc::compile_ptx(VEC_ADD_CU)?;
    let n32 = u32::try_from(n)?;
    for &device in &devices {
        let gpu = device.ordinal();
        let ctx = CudaContext::new(gpu)?; // the device's primary context, as this crate's
        let Some(vec_add) = load(&ctx, ptx.clone(), "vec_add")? else {
            return Ok(());
        };
        let stream = ctx.new_stream()?;
        c.slice_bytes_mut::<u32>(..)?.copy_from_host(&vec![0; n])?;
        let mut c_view = c.slice_bytes_mut_on::<u32>(device, ..)?;
        let (a_view, b_view) = (
            a.slice_bytes_on::<u32>(device, ..)?,
            b.slice_bytes_on::<u32>(device, ..)?,
        );
        scope(&stream, |s| -> ExampleResult {
            // Lent until the scope has waited for `stream`; each lend checks that this GPU reaches
            // the view's memory (every page is granted to every GPU).
            let (mut lc, la, lb) = (s.lend_mut(&mut c_view)?, s.lend(a_view)?, s.lend(b_view)?);
            // SAFETY: `vec_add(unsigned *c, const unsigned *a, const unsigned *b, unsigned n)`
            // takes these four, in this order, and touches the first `n` values of each view, which
            // is every view's length; it writes only `c`, lent exclusively, which overlaps neither
            // source (three buffers). Launched on the scope's stream (`launch_builder`).
            unsafe {
                s.launch_builder(&vec_add)?
                    .arg(&mut lc)
                    .arg(&la)
                    .arg(&lb)
                    .arg(&n32)
                    .launch(LaunchConfig::for_num_elems(n32))
            }?;
            Ok(())
        })?; // the kernel has finished: the scope waited for the stream
        let result = c.slice_bytes::<u32>(..)?.to_vec()?;
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

/// The kernel `name` of `ptx`, loaded in `ctx`; `None` after saying why where the driver is older
/// than the NVRTC that wrote the PTX.
fn load(
    ctx: &Arc<CudaContext>,
    ptx: cudarc::nvrtc::Ptx,
    name: &str,
) -> ExampleResult<Option<CudaFunction>> {
    match ctx.load_module(ptx) {
        Ok(module) => Ok(Some(module.load_function(name)?)),
        Err(e) if e == DriverError(sys::CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION) => {
            println!("this NVRTC writes PTX newer than the driver loads ({e}); skipped");
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}
