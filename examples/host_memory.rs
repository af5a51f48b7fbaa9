//! Host memory through VMM: physical memory located on the host, mapped once, written by the CPU
//! through a Rust `&mut [u32]`, read and written back by the device (the `add_one` kernel, in place),
//! and read by the CPU through a `&[u32]`.
//!
//! The CPU grant and a device grant both borrow the mapping mutably, and a slice borrows the CPU
//! grant, so a Rust slice of the bytes never coexists with a device view of them; `Region::map_host`
//! borrows the allocation mutably, so no second mapping (alias) of it exists meanwhile either.
//!
//! Without a GPU, or where the device does not support host memory (the attributes
//! `CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED` and
//! `..._HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`), it says so and exits successfully.
//!
//! Run with `./with-libcuda cargo run --example host_memory`.

// Each example is its own crate, and this one uses only part of the shared module.
#[allow(dead_code)]
mod common;

use std::process::ExitCode;

use common::{AddOne, ExampleResult, pattern, verify};
use cuda_vmm::{
    Context, Granularity, HostAllocation, ReadOnly, ReadWrite, VirtualReservation,
    allocation_granularity,
};

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
    let context = Context::new(device)?;
    let kernel = AddOne::load(&context)?;
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
        // SAFETY: `dst` and `src` are disjoint halves of one grant to this kernel's device, and
        // nothing else writes them until the kernel has finished (`run` waits for it).
        unsafe { kernel.run(&mut dst, &src.as_slice().slice(..n / 2)?)? };
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
