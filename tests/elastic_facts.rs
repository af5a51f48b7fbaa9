//! Whether the driver serialises VMM calls made on one thread with kernel launches made on another:
//! what an elastic cache that maps and releases pages off the launch thread would save. Thread A
//! queues small kernels in a scope and times each launch on the host; thread B meanwhile maps and
//! releases 2 MiB pages of another buffer (`cuMemCreate`, `cuMemMap`, `cuMemSetAccess`,
//! `cuMemUnmap`, `cuMemRelease`) in a loop, then maps, grants and unmaps one kept allocation (the
//! calls of a reserve's worker that recycles a retired page's memory). Printed: the launch times
//! with B idle and busy each way (median, 99th percentile, maximum) and B's cycle times. The
//! launches must all succeed and the kernels' results be right; the times are facts to read, not
//! claims (the bench holds those).

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{add_one_ptx, gpu_or_skip, pattern};
use cuda_vmm::{
    DeviceBuffer, Granularity, Module, PhysicalAllocation, ReadWrite, Stream, VirtualBuffer,
    VirtualReservation, allocation_granularity,
};

const LAUNCHES: usize = 20_000;

/// Times `LAUNCHES` launches of `add_one` over 256 values, queued in one scope; returns the host
/// time of each launch, sorted.
fn launch_times(
    ctx: &cuda_vmm::Context,
    module: &Module,
    stream: &Stream,
    src: &DeviceBuffer<u32>,
    dst: &mut DeviceBuffer<u32>,
) -> Vec<Duration> {
    let add_one = module.function(c"add_one").unwrap();
    let mut times = Vec::with_capacity(LAUNCHES);
    let (input, mut output) = (src.as_slice(), dst.as_mut_slice());
    cuda_vmm::scope(|s| {
        let q = s.on(stream);
        let mut slot = q.rewritable(&mut output)?; // written again by every launch, in order
        for _ in 0..LAUNCHES {
            let start = Instant::now();
            // SAFETY: add_one(u32 *dst, const u32 *src, u32 n) over the 256 values of each view.
            unsafe { q.launch(&add_one, (1, 1, 1), (256, 1, 1), (&mut slot, input, 256u32))? };
            times.push(start.elapsed());
        }
        Ok(())
    })
    .unwrap();
    let _ = ctx;
    times.sort_unstable();
    times
}

fn summary(times: &[Duration]) -> String {
    let at = |per_mille: usize| times[(times.len() - 1) * per_mille / 1000];
    format!(
        "median {:?}, p99 {:?}, max {:?}",
        at(500),
        at(990),
        times[times.len() - 1]
    )
}

#[test]
fn vmm_calls_on_another_thread_beside_launches() {
    let Some((device, ctx)) = gpu_or_skip("vmm_calls_on_another_thread_beside_launches") else {
        return;
    };
    let page = allocation_granularity(device, Granularity::Minimum).unwrap();
    let module = Module::load_ptx(&ctx, &add_one_ptx()).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let data = pattern(256, 9);
    let src = DeviceBuffer::from_host(&ctx, &data).unwrap();
    let mut dst = DeviceBuffer::<u32>::zeroed(&ctx, 256).unwrap();
    // Warm-up, then B idle.
    launch_times(&ctx, &module, &stream, &src, &mut dst);
    let idle = launch_times(&ctx, &module, &stream, &src, &mut dst);

    // B makes every call of a fresh page: create, map, grant, unmap, release.
    let mut churn = VirtualBuffer::new(64 * page, &[device], ReadWrite).unwrap();
    let (busy, cycle) = beside(
        || {
            let at = churn.grow(device, page).unwrap();
            churn.unmap(at..).unwrap();
        },
        || launch_times(&ctx, &module, &stream, &src, &mut dst),
    );
    // B maps, grants and unmaps one kept allocation: what a reserve's worker does with the memory
    // of a retired page it recycles (no create, no release).
    let memory = PhysicalAllocation::new(device, page).unwrap();
    let mut reservation = VirtualReservation::new(page, 0).unwrap();
    let (mapping, map_cycle) = beside(
        || {
            let mut region = reservation.region();
            let mut mapped = region.map(&memory).unwrap();
            let _granted = mapped.grant(&ctx, ReadWrite).unwrap(); // cuMemSetAccess
            // `mapped` unmaps here (cuMemUnmap).
        },
        || launch_times(&ctx, &module, &stream, &src, &mut dst),
    );
    let plus: Vec<u32> = data.iter().map(|v| v + 1).collect();
    assert_eq!(dst.as_slice().to_vec().unwrap(), plus, "the kernels ran");
    println!(
        "launch host time, another thread idle: {}; mapping and releasing a 2 MiB page per {cycle:?} \
         (grow + unmap): {}; mapping, granting and unmapping one kept 2 MiB allocation per \
         {map_cycle:?} (cuMemMap + cuMemSetAccess + cuMemUnmap): {}",
        summary(&idle),
        summary(&busy),
        summary(&mapping)
    );
    assert_eq!(
        (idle.len(), busy.len(), mapping.len()),
        (LAUNCHES, LAUNCHES, LAUNCHES)
    );
}

/// Runs `launches` on this thread while another thread runs `churn` in a loop (started before the
/// launches, stopped after them): the launches' result, and the time of one churn cycle.
fn beside<T>(churn: impl FnMut() + Send, launches: impl FnOnce() -> T) -> (T, Duration) {
    let mut churn = churn;
    let busy_flag = AtomicBool::new(true);
    let cycles = AtomicU64::new(0);
    std::thread::scope(|t| {
        let b = t.spawn(|| {
            let start = Instant::now();
            while busy_flag.load(Ordering::Relaxed) {
                churn();
                cycles.fetch_add(1, Ordering::Relaxed);
            }
            start.elapsed()
        });
        // B has started cycling.
        while cycles.load(Ordering::Relaxed) < 10 {
            std::thread::yield_now();
        }
        let result = launches();
        busy_flag.store(false, Ordering::Relaxed);
        let took = b.join().unwrap();
        (
            result,
            took / u32::try_from(cycles.load(Ordering::Relaxed))
                .unwrap()
                .max(1),
        )
    })
}
