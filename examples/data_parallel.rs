//! Data-parallel gradients with NCCL (feature `nccl`): each GPU keeps its gradients in a
//! `VirtualBuffer`, registered once with its communicator (`ncclCommRegister`), all-reduced every
//! step, while the buffer grows by a page between steps (the new pages beside the registered ones).
//! One GPU gives a single-rank communicator; with more, one rank per GPU, all driven from this
//! thread (`Comm::from_devices`, the collectives of every rank in one `nccl::group`). The sums are
//! checked on the host.
//!
//! `./with-libcuda cargo run --features nccl --example data_parallel`. Without a GPU or without
//! NCCL (`libnccl.so.2`) it says so and stops.
//!
//! `NCCL_NVLS_ENABLE=0` is set first, before any thread starts or NCCL reads its environment:
//! `NVLink` SHARP would create multicast objects, which the machines this is measured on must not.

use std::error::Error as StdError;

use cuda_vmm::interop::nccl::{self, Comm, ReduceOp, group};
use cuda_vmm::{Device, DeviceSliceMut, Error, Granularity, ReadWrite, VirtualBuffer};
use cudarc::driver::CudaContext;

const STEPS: usize = 4;

/// A job queued inside the group: one rank's all-reduce on the view lent in its scope.
type Job<'a> = Box<dyn FnOnce() -> Result<(), Error> + 'a>;

/// Opens a scope on each communicator's stream, one inside the other, lends each rank's view in
/// its own scope, and in the innermost runs every rank's all-reduce in one group: the group ends,
/// launching them together, inside every scope, and each scope then waits for its stream.
fn all_reduce_everywhere(
    comms: &[Comm],
    views: &mut [DeviceSliceMut<'_, f32>],
    jobs: Vec<Job<'_>>,
) -> Result<(), Error> {
    let (Some((comm, comms)), Some((view, views))) = (comms.split_first(), views.split_first_mut())
    else {
        return group(|| jobs.into_iter().try_for_each(|job| job()));
    };
    comm.scope(|s| {
        let mut lent = s.lend_mut(view)?;
        let mut jobs: Vec<Job<'_>> = jobs;
        jobs.push(Box::new(move || {
            s.all_reduce_in_place(&mut lent, ReduceOp::Sum)
        }));
        all_reduce_everywhere(comms, views, jobs)
    })
}

// The gradients are small integers, exact in `f32`: the casts and the exact comparison are too.
#[allow(clippy::cast_precision_loss, clippy::float_cmp)]
fn main() -> Result<(), Box<dyn StdError>> {
    // SAFETY: the first statement of `main`: no other thread runs, nothing reads the environment.
    unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    match cuda_vmm::init() {
        Err(e) if e.is_no_gpu() => {
            println!("data_parallel: SKIPPED: no CUDA device ({e})");
            return Ok(());
        }
        other => other?,
    }
    let version = match nccl::version() {
        Ok(version) => version,
        Err(e) => {
            println!("data_parallel: SKIPPED: {e}");
            return Ok(());
        }
    };
    let devices = Device::all()?;
    let mut streams = Vec::new();
    for device in &devices {
        streams.push(CudaContext::new(device.ordinal())?.new_stream()?);
    }
    let comms = Comm::from_devices(&streams)?;
    let ranks = comms.len();
    println!("data_parallel: NCCL {version}, {ranks} rank(s), one per GPU");
    let page = cuda_vmm::allocation_granularity(devices[0], Granularity::Minimum)?;

    let mut gradients = Vec::new();
    for device in &devices {
        let buffer = VirtualBuffer::new(1 << 30, &[*device], ReadWrite)?;
        buffer.grow(*device, page)?;
        gradients.push(buffer);
    }
    // Registered once: the first page of each buffer, for the whole run.
    let mut registered = Vec::new();
    for (comm, buffer) in comms.iter().zip(gradients.iter_mut()) {
        registered.push(comm.register(buffer, ..page)?);
    }
    for step in 0..STEPS {
        for (registration, device) in registered.iter().zip(&devices) {
            if step > 0 {
                registration.buffer().grow(*device, page)?; // beside the registered page
            }
        }
        // Each rank's gradients: `(rank + 1) * (step + 1)` everywhere.
        let mut views = Vec::new();
        for (rank, registration) in registered.iter_mut().enumerate() {
            let end = registration.buffer().end();
            let mut view = registration.slice_bytes_mut::<f32>(..end)?;
            view.copy_from_host(&vec![((rank + 1) * (step + 1)) as f32; view.len()])?;
            views.push(view);
        }
        all_reduce_everywhere(&comms, &mut views, Vec::new())?;
        let expected = ((step + 1) * ranks * (ranks + 1) / 2) as f32;
        for (rank, view) in views.iter().enumerate() {
            let sums = view.to_vec()?;
            if let Some(wrong) = sums.iter().position(|&x| x != expected) {
                return Err(format!(
                    "step {step}, rank {rank}: element {wrong} is {}, not {expected}",
                    sums[wrong]
                )
                .into());
            }
        }
        println!(
            "step {step}: {} MiB of gradients per GPU all-reduced to {expected} (first {} MiB registered)",
            (views[0].len() * 4) >> 20,
            page >> 20
        );
    }
    drop(registered);
    let stats: Vec<_> = comms.iter().map(Comm::registration_stats).collect();
    assert!(
        stats
            .iter()
            .all(|s| s.registered == 1 && s.deregistered == 1)
    );
    println!("data_parallel: ok");
    Ok(())
}
