//! Host memory through VMM: physical memory located on the host, mapped once, written by the CPU
//! through a Rust `&mut [u32]`, read and written back by the device (an `add_one` kernel, CUDA C
//! compiled at run time by NVRTC and launched through cudarc on views lent to
//! `cuda_vmm::interop::cudarc::scope`), and read by the CPU through a `&[u32]`.
//!
//! The CPU grant and a device grant both borrow the mapping mutably, and a slice borrows the CPU
//! grant, so a Rust slice of the bytes never coexists with a device view of them; `Region::map_host`
//! borrows the allocation mutably, so no second mapping (alias) of it exists meanwhile either.
//!
//! Without a GPU, or where the device does not support host memory (the attributes
//! `CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED` and
//! `..._HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`), or where the NVRTC library cannot be
//! loaded, it says so and exits successfully.
//!
//! Run with `./with-libcuda cargo run --features cudarc --example host_memory`.

// Each example is its own crate, and this one uses only part of the shared module.
#[allow(dead_code)]
mod common;

use std::process::ExitCode;

use common::{ExampleResult, pattern, verify};
use cuda_vmm::interop::cudarc::scope;
use cuda_vmm::{
    Context, Granularity, ReadOnly, ReadWrite, VirtualReservation, allocation_granularity,
    host::HostAllocation,
};
use cudarc::driver::{CudaContext, DriverError, LaunchConfig, PushKernelArg, sys};

/// `dst[i] = src[i] + 1` for `i < n`, compiled by NVRTC when the example runs.
const ADD_ONE_CU: &str = r#"
extern "C" __global__ void add_one(unsigned int *dst, const unsigned int *src, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i] + 1u;
}
"#;

fn main() -> ExitCode {
    common::exit_code("host_memory", run())
}

fn run() -> ExampleResult {
    println!("host_memory: host memory, written by the CPU as a slice and by the device");
    let Some(devices) = common::devices_or_none("there is no device to share host memory with")?
    else {
        return Ok(());
    };
    let device = devices[0];
    let size = allocation_granularity(device, Granularity::Minimum)?;
    let mut memory = if device.supports_host_numa_memory()? {
        let node = device.host_numa_node()?;
        println!("GPU 0 supports host NUMA memory; nearest host NUMA node: {node:?}");
        HostAllocation::near(device, size)?
    } else if device.supports_host_memory()? {
        println!("GPU 0 supports host memory on no particular NUMA node");
        HostAllocation::new(device, size)?
    } else {
        println!("GPU 0 supports no VMM memory located on the host: nothing to show.");
        return Ok(());
    };
    println!("allocated {memory:?}");
    // SAFETY: tries to `dlopen` the NVRTC library under cudarc's candidate names, nothing more.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        println!("the NVRTC library (libnvrtc.so) cannot be loaded: no kernel to compile; skipped");
        return Ok(());
    }
    let context = Context::new(device)?;
    let cu = CudaContext::new(device.ordinal())?; // the same primary context
    let kernel = match cu.load_module(cudarc::nvrtc::compile_ptx(ADD_ONE_CU)?) {
        Ok(module) => module.load_function("add_one")?,
        Err(e) if e == DriverError(sys::CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION) => {
            println!("this NVRTC writes PTX newer than the driver loads ({e}); skipped");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let stream = cu.new_stream()?;
    let n = size / 4;

    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut region = reservation.region();
    let mut mapping = region.map_host(&mut memory)?;
    {
        let mut cpu = mapping.grant_host(ReadWrite)?;
        cpu.as_mut_slice::<u32>()?.copy_from_slice(&pattern(n, 7));
        println!("CPU: wrote {n} values through a &mut [u32]");
    }
    {
        let mut on_device = mapping.grant(&context, ReadWrite)?;
        let view = on_device.slice_mut::<u32>()?;
        let (mut dst, src) = view.split_at_mut(n / 2)?;
        let src = src.into_slice().slice(..n / 2)?;
        let half = u32::try_from(n / 2)?;
        scope(&stream, |s| -> ExampleResult {
            let (mut dst, src) = (s.lend_mut(&mut dst)?, s.lend(src)?);
            // SAFETY: `add_one(unsigned *dst, const unsigned *src, unsigned n)` takes these, in this
            // order, and touches the first `half` values of each view, which is both views' length;
            // `dst` and `src` are disjoint halves of one grant, `dst` lent exclusively. Launched on
            // the scope's stream, which the scope waits for.
            unsafe {
                s.launch_builder(&kernel)?
                    .arg(&mut dst)
                    .arg(&src)
                    .arg(&half)
                    .launch(LaunchConfig::for_num_elems(half))
            }?;
            Ok(())
        })?;
        println!("GPU 0: first half := second half + 1, in host memory");
    }
    let cpu = mapping.grant_host(ReadOnly)?;
    let bytes = cpu.as_slice::<u32>()?;
    let written = pattern(n, 7);
    let expected: Vec<u32> = written[n / 2..].iter().map(|x| x.wrapping_add(1)).collect();
    verify(
        "CPU: reads the device's writes through a &[u32]",
        &bytes[..n / 2],
        &expected,
    )?;
    verify(
        "CPU: the second half is as the CPU wrote it",
        &bytes[n / 2..],
        &written[n / 2..],
    )?;
    println!("host_memory: CPU and device took turns on one buffer, checked");
    Ok(())
}
