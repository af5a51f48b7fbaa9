//! cudarc interop against a real driver (feature `cudarc`): one driver and one primary context per
//! device for both libraries (either may drop first: `tests/cudarc_context_drop.rs`); an NVRTC
//! kernel writing a growing `VirtualBuffer` that cudarc's copy reads back; cuBLAS `sgemm` on VMM
//! memory; a kernel on GPU 1 reading VMM memory of GPU 0 granted to it; a write queued in
//! `cuda_vmm::scope` lent on to cudarc; an NVRTC kernel queued on a stream of `cuda_vmm::scope` with
//! the crate's typed arguments; the refusals (another stream, a graph capture) that leave
//! the memory untouched; and the limit the interop does not cover (cudarc's copy into page-locked
//! memory behind a `&mut [T]` returns before the copy ends). Every test skips visibly without a GPU;
//! the NVRTC and cuBLAS parts skip visibly, with the reason, where the library cannot be loaded.
//!
//! The tests take one lock each: a refused operation may leave a sticky error in the context, which
//! the next test must not inherit (its contexts are all released when it ends, which resets the
//! context).

#![cfg(feature = "cudarc")]

mod common;

use std::error::Error as StdError;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use common::{devices_or_skip, gpus_or_skip, pattern, skip};
use cuda_vmm::interop::cudarc::scope;
use cuda_vmm::{
    Context, DeviceBuffer, Error, Granularity, PinnedBuffer, ReadWrite, Stream, VirtualBuffer,
    allocation_granularity, peer::can_access_peer,
};
use cudarc::driver::{CudaContext, CudaFunction, DriverError, LaunchConfig, PushKernelArg, sys};

type TestResult<T = ()> = Result<T, Box<dyn StdError>>;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// CUDA C, compiled at run time by NVRTC through cudarc.
const KERNELS: &str = r#"
extern "C" __global__ void fill(unsigned int *out, unsigned int n, unsigned int seed) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = i * 2654435761u + seed;
}
extern "C" __global__ void add_one(unsigned int *dst, const unsigned int *src, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i] + 1u;
}
extern "C" __global__ void fork(unsigned int *a, unsigned int *b, const unsigned int *src,
                                unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { a[i] = src[i] + 1u; b[i] = src[i] * 3u; }
}
"#;

/// What `fill` writes.
fn filled(n: usize, seed: u32) -> Vec<u32> {
    (0u32..)
        .take(n)
        .map(|i| i.wrapping_mul(2_654_435_761).wrapping_add(seed))
        .collect()
}

/// The kernel `name` of [`KERNELS`], loaded in `ctx`; `None` after printing why where NVRTC cannot
/// be loaded, or compiles PTX newer than the driver loads.
fn kernel_or_skip(test: &str, ctx: &Arc<CudaContext>, name: &str) -> Option<CudaFunction> {
    // SAFETY: tries to `dlopen` the NVRTC library under cudarc's candidate names, nothing more.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        skip(&format!(
            "SKIPPED {test} (NVRTC part): the NVRTC library (libnvrtc.so) cannot be loaded; \
             install the CUDA toolkit's NVRTC or put it on LD_LIBRARY_PATH"
        ));
        return None;
    }
    let ptx = cudarc::nvrtc::compile_ptx(KERNELS).expect("the test kernels compile");
    match ctx.load_module(ptx) {
        Ok(module) => Some(
            module
                .load_function(name)
                .expect("the kernel is in the module"),
        ),
        Err(e) if e == DriverError(sys::CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION) => {
            skip(&format!(
                "SKIPPED {test} (NVRTC part): this NVRTC writes PTX newer than the driver \
                 (API {:?}) loads: {e}",
                cuda_vmm::device::driver_version()
            ));
            None
        }
        Err(e) => panic!("{test}: loading the NVRTC module: {e}"),
    }
}

/// The order of the square, column-major matrices of the cuBLAS test.
const N: usize = 64;

fn config(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(u32::try_from(n).expect("n fits u32"))
}

#[test]
fn one_driver_one_primary_context_per_device() {
    let _serial = serial();
    let test = "one_driver_one_primary_context_per_device";
    let Some(devices) = devices_or_skip(test, 1) else {
        return;
    };
    for device in devices {
        let ours = Context::new(device).unwrap();
        let theirs = CudaContext::new(device.ordinal()).unwrap();
        assert!(theirs.is_primary());
        assert_eq!(theirs.cu_device(), device.as_raw());
        assert_eq!(
            ours.as_raw().addr(),
            theirs.cu_ctx().addr(),
            "cudarc's dynamically loaded driver and the linked one are one driver, with one primary \
             context for {device:?}"
        );
    }
}

/// The issue's test: an NVRTC kernel, launched through cudarc's builder, writes a `VirtualBuffer`
/// that grows between the launches, and cudarc's copy reads every byte back.
#[test]
fn nvrtc_kernel_writes_a_growing_buffer_and_cudarc_reads_it_back() -> TestResult {
    let _serial = serial();
    let test = "nvrtc_kernel_writes_a_growing_buffer_and_cudarc_reads_it_back";
    let Some(devices) = devices_or_skip(test, 1) else {
        return Ok(());
    };
    let device = devices[0];
    let ctx = CudaContext::new(device.ordinal())?;
    let Some(fill) = kernel_or_skip(test, &ctx, "fill") else {
        return Ok(());
    };
    let stream = ctx.new_stream()?;
    let page = allocation_granularity(device, Granularity::Minimum)?;
    let mut buffer = VirtualBuffer::new(4 * page, &[device], ReadWrite)?;
    let base = buffer.base();
    for round in 1..=4u32 {
        buffer.grow(device, page)?;
        let end = buffer.end();
        let (n, n32) = (end / 4, u32::try_from(end / 4)?);
        let mut view = buffer.slice_bytes_mut::<u32>(..end)?; // every page mapped so far
        let mut host = vec![0u32; n];
        scope(&stream, |s| -> TestResult {
            let mut lent = s.lend_mut(&mut view)?;
            // SAFETY: `fill(unsigned *out, unsigned n, unsigned seed)` takes these three, in this
            // order, and writes `out[0..n)`, the lent view's `n` values; launched on the scope's
            // stream (`Scope::launch_builder`).
            unsafe {
                s.launch_builder(&fill)?
                    .arg(&mut lent)
                    .arg(&n32)
                    .arg(&round)
                    .launch(config(n))
            }?;
            stream.memcpy_dtoh(&lent, &mut host)?; // ordered after the kernel on the stream
            Ok(())
        })?;
        assert_eq!(host, filled(n, round), "round {round}: {n} values");
        assert_eq!(buffer.base(), base, "the base never moves");
    }
    Ok(())
}

/// An NVRTC kernel (a cudarc `CudaFunction`) queued on a stream of `cuda_vmm::scope` with this
/// crate's typed arguments: it reads an upload through the `DeviceInFlight` of a scoped buffer's
/// write and writes another range through its `Rewritable`, and a download on the same stream
/// reads its values. The checks of the crate's own launch hold: an empty grid is refused, and so is
/// a view of a page retired before the launch, with its bytes named, both before any driver call.
#[test]
fn nvrtc_kernel_on_a_scoped_stream_takes_lent_views() -> TestResult {
    let _serial = serial();
    let test = "nvrtc_kernel_on_a_scoped_stream_takes_lent_views";
    let Some(devices) = devices_or_skip(test, 1) else {
        return Ok(());
    };
    let device = devices[0];
    let ctx = CudaContext::new(device.ordinal())?;
    let Some(add_one) = kernel_or_skip(test, &ctx, "add_one") else {
        return Ok(());
    };
    let ours = Context::new(device)?;
    let page = allocation_granularity(device, Granularity::Minimum)?;
    let n = 4096usize;
    let (bytes, n32) = (n * 4, u32::try_from(n)?);
    let data = pattern(n, 11);
    let input = PinnedBuffer::from_slice(&ours, &data)?;
    let mut output = PinnedBuffer::<u32>::zeroed(&ours, n)?;
    let stream = Stream::new(&ours)?;
    let mut buffer = VirtualBuffer::new(4 * page, &[device], ReadWrite)?;
    // Two pages, so that the second is retired alone.
    buffer.grow(device, page)?;
    buffer.grow(device, page)?;
    cuda_vmm::scope(|s| {
        let work = s.on(&stream);
        let kv = buffer.in_scope(s);
        let mut src = kv.write::<u32>(0..bytes)?;
        let mut dst = kv.write::<u32>(bytes..2 * bytes)?;
        let mut gone = kv.write::<u32>(page..page + bytes)?;
        let uploaded = work.copy_from_host(&mut src, &input)?;
        let empty = LaunchConfig {
            grid_dim: (0, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `add_one(unsigned *dst, const unsigned *src, unsigned n)` takes these three, in
        // this order, and touches `n` values of each view. Refused before the launch.
        let refused = unsafe { work.launch_cudarc(&add_one, empty, (&mut dst, uploaded, n32)) };
        assert!(
            matches!(refused, Err(Error::ZeroSize { .. })),
            "{refused:?}"
        );
        kv.retire(page..2 * page)?;
        // SAFETY: as above; refused before the launch.
        let refused =
            unsafe { work.launch_cudarc(&add_one, config(n), (&mut gone, uploaded, n32)) };
        match refused {
            Err(Error::PageRange { start, end, .. }) => assert_eq!((start, end), (page, 2 * page)),
            other => panic!("a view of a retired page: {other:?}"),
        }
        // SAFETY: as above.
        let (added, (), ()) =
            unsafe { work.launch_cudarc(&add_one, config(n), (&mut dst, uploaded, n32))? };
        work.copy_to_host(&mut output, added)?;
        Ok(())
    })?;
    let expected: Vec<u32> = data.iter().map(|v| v.wrapping_add(1)).collect();
    assert_eq!(
        output.to_vec(),
        expected,
        "the kernel's values, read after it"
    );
    buffer.free()?;
    Ok(())
}

/// One launch writes two sequences of a `VirtualBuffer` and reads a third, through three views of
/// disjoint ranges that `slice_bytes_disjoint_mut` hands out at once (spanning the boundary of two
/// pages); overlapping ranges and a range over a hole are refused before any driver call.
#[test]
fn one_launch_writes_two_disjoint_views_and_reads_a_third() -> TestResult {
    let _serial = serial();
    let test = "one_launch_writes_two_disjoint_views_and_reads_a_third";
    let Some(devices) = devices_or_skip(test, 1) else {
        return Ok(());
    };
    let device = devices[0];
    let ctx = CudaContext::new(device.ordinal())?;
    let Some(fork) = kernel_or_skip(test, &ctx, "fork") else {
        return Ok(());
    };
    let stream = ctx.new_stream()?;
    let page = allocation_granularity(device, Granularity::Minimum)?;
    let mut buffer = VirtualBuffer::new(4 * page, &[device], ReadWrite)?;
    buffer.grow(device, 2 * page)?;
    let third = 2 * page / 3 / 4 * 4; // bytes per view, a whole number of u32s
    let (n, n32) = (third / 4, u32::try_from(third / 4)?);
    let input = pattern(n, 5);
    buffer
        .slice_bytes_mut::<u32>(2 * third..3 * third)?
        .copy_from_host(&input)?;

    // Refused before any driver call: an overlap (named by its bytes) and a range over unmapped bytes.
    assert_eq!(
        buffer
            .slice_bytes_disjoint_mut::<u32, 2>([0..third, third - 4..2 * third])
            .err(),
        Some(Error::PageRange {
            start: third - 4,
            end: third,
            problem: "are in two of the views asked for at once",
        })
    );
    assert!(matches!(
        buffer.slice_bytes_disjoint_mut::<u32, 2>([0..third, 2 * page..2 * page + 4]),
        Err(Error::PageRange { .. })
    ));

    let [mut a, mut b, src] = buffer.slice_bytes_disjoint_mut::<u32, 3>([
        0..third,
        third..2 * third,
        2 * third..3 * third,
    ])?;
    let (mut got_a, mut got_b) = (vec![0u32; n], vec![0u32; n]);
    scope(&stream, |s| -> TestResult {
        let (mut lent_a, mut lent_b, lent_src) =
            (s.lend_mut(&mut a)?, s.lend_mut(&mut b)?, s.lend(&src)?);
        // SAFETY: `fork(unsigned *a, unsigned *b, const unsigned *src, unsigned n)` takes these four,
        // in this order, writes `a[0..n)` and `b[0..n)` and reads `src[0..n)`: the three lent views'
        // `n` values each; launched on the scope's stream (`Scope::launch_builder`).
        unsafe {
            s.launch_builder(&fork)?
                .arg(&mut lent_a)
                .arg(&mut lent_b)
                .arg(&lent_src)
                .arg(&n32)
                .launch(config(n))
        }?;
        stream.memcpy_dtoh(&lent_a, &mut got_a)?;
        stream.memcpy_dtoh(&lent_b, &mut got_b)?;
        Ok(())
    })?;
    let plus_one: Vec<u32> = input.iter().map(|x| x.wrapping_add(1)).collect();
    let times_three: Vec<u32> = input.iter().map(|x| x.wrapping_mul(3)).collect();
    assert_eq!(got_a, plus_one, "the first writer");
    assert_eq!(
        got_b, times_three,
        "the second writer, across the page boundary"
    );
    assert_eq!(src.to_vec()?, input, "the input is unchanged");
    Ok(())
}

/// cuBLAS `sgemm` reads two matrices and writes a third, all in one `VirtualBuffer`.
#[test]
fn cublas_sgemm_on_vmm_memory() -> TestResult {
    use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys::cublasOperation_t};

    let _serial = serial();
    let test = "cublas_sgemm_on_vmm_memory";
    let Some(devices) = devices_or_skip(test, 1) else {
        return Ok(());
    };
    // SAFETY: tries to `dlopen` the cuBLAS library under cudarc's candidate names, nothing more.
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        skip(&format!(
            "SKIPPED {test} (cuBLAS part): the cuBLAS library (libcublas.so) cannot be loaded; \
             install the CUDA toolkit's cuBLAS or put it on LD_LIBRARY_PATH"
        ));
        return Ok(());
    }
    let device = devices[0];
    let ctx = CudaContext::new(device.ordinal())?;
    let stream = ctx.new_stream()?;
    let blas = CudaBlas::new(stream.clone())?; // the same `CudaStream`: the scope's
    let a: Vec<f32> = (0..N * N).map(|i| f32::from((i % 7) as u8)).collect();
    let b: Vec<f32> = (0..N * N).map(|i| f32::from((i % 5) as u8)).collect();
    let mut expected = vec![0f32; N * N];
    for col in 0..N {
        for row in 0..N {
            expected[col * N + row] = (0..N).map(|k| a[k * N + row] * b[col * N + k]).sum();
        }
    }

    let page = allocation_granularity(device, Granularity::Minimum)?;
    let mut buffer = VirtualBuffer::new(page, &[device], ReadWrite)?;
    buffer.grow(device, page)?;
    let matrix = N * N * 4;
    let (mut va, rest) = buffer
        .slice_bytes_mut::<f32>(..3 * matrix)?
        .split_at_mut(N * N)?;
    let (mut vb, mut vc) = rest.split_at_mut(N * N)?;
    let mut c = vec![0f32; N * N];
    scope(&stream, |s| -> TestResult {
        let (mut la, mut lb, mut lc) = (
            s.lend_mut(&mut va)?,
            s.lend_mut(&mut vb)?,
            s.lend_mut(&mut vc)?,
        );
        stream.memcpy_htod(&a, &mut la)?;
        stream.memcpy_htod(&b, &mut lb)?;
        let n = i32::try_from(N)?;
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_N,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: n,
            n,
            k: n,
            alpha: 1.0f32,
            lda: n,
            ldb: n,
            beta: 0.0f32,
            ldc: n,
        };
        // SAFETY: three N x N column-major matrices of N * N values each, with leading dimension N,
        // as `cfg` says; the handle's stream is the scope's.
        unsafe { blas.gemm(cfg, &la, &lb, &mut lc) }?;
        stream.memcpy_dtoh(&lc, &mut c)?;
        Ok(())
    })?;
    assert_eq!(c, expected, "cuBLAS sgemm on VMM memory");
    Ok(())
}

/// A kernel on GPU 1 reads VMM memory that lives on GPU 0, granted to GPU 1 by the buffer's access
/// set; memory not granted to GPU 1 is refused when lent, before any work is queued.
#[test]
fn kernel_on_one_gpu_reads_vmm_memory_of_another() -> TestResult {
    let _serial = serial();
    let test = "kernel_on_one_gpu_reads_vmm_memory_of_another";
    let Some(gpus) = gpus_or_skip(test, 2) else {
        return Ok(());
    };
    let (d0, d1) = (gpus[0].0, gpus[1].0);
    if can_access_peer(d1, d0)?.is_none() {
        skip(&format!(
            "SKIPPED {test}: GPU 1 has no peer link to GPU 0 (cuDeviceCanAccessPeer answered 0)"
        ));
        return Ok(());
    }
    let ctx1 = CudaContext::new(d1.ordinal())?;
    let Some(add_one) = kernel_or_skip(test, &ctx1, "add_one") else {
        return Ok(());
    };
    let stream1 = ctx1.new_stream()?;
    let page = allocation_granularity(d0, Granularity::Minimum)?
        .max(allocation_granularity(d1, Granularity::Minimum)?);
    let n = page / 4;
    let input = pattern(n, 7);

    // Memory on GPU 0, granted to both GPUs (the buffer's access set), and memory granted to GPU 0
    // only.
    let mut on_gpu0 = VirtualBuffer::new(page, &[d0, d1], ReadWrite)?;
    on_gpu0.grow(d0, page)?;
    assert_eq!(on_gpu0.pages().next().map(|p| p.device), Some(d0));
    on_gpu0.slice_bytes_mut::<u32>(..)?.copy_from_host(&input)?;
    let gpu0_only = VirtualBuffer::new(page, &[d0], ReadWrite)?;
    gpu0_only.grow(d0, page)?;

    let mut out = VirtualBuffer::new(page, &[d1], ReadWrite)?;
    out.grow(d1, page)?;
    let n32 = u32::try_from(n)?;
    let mut host = vec![0u32; n];
    let src = on_gpu0.slice_bytes_on::<u32>(d1, ..)?;
    let mut dst = out.slice_bytes_mut::<u32>(..)?;
    let gpu0_only = gpu0_only.slice_bytes::<u32>(..)?;
    scope(&stream1, |s| -> TestResult {
        let refused = s.lend(gpu0_only);
        assert!(
            matches!(refused, Err(Error::NoPeerAccess { .. })),
            "memory GPU 1 is not granted is refused when lent: {refused:?}"
        );
        let (src, mut dst) = (s.lend(src)?, s.lend_mut(&mut dst)?);
        // SAFETY: `add_one(unsigned *dst, const unsigned *src, unsigned n)` takes these, in this
        // order; it writes `dst[0..n)` and reads `src[0..n)`, the lent views' `n` values each;
        // launched on the scope's stream.
        unsafe {
            s.launch_builder(&add_one)?
                .arg(&mut dst)
                .arg(&src)
                .arg(&n32)
                .launch(config(n))
        }?;
        stream1.memcpy_dtoh(&dst, &mut host)?;
        Ok(())
    })?;
    let expected: Vec<u32> = input.iter().map(|x| x.wrapping_add(1)).collect();
    assert_eq!(
        host, expected,
        "GPU 1 read GPU 0's VMM memory over the link"
    );
    Ok(())
}

/// What a write queued inside `cuda_vmm::scope` hands back, a `DeviceInFlight`, which the host cannot
/// read, is lent to a cudarc scope nested in it, whose copy is ordered after the write (here behind
/// the host's wait for the uploading stream) and reads what it wrote.
#[test]
fn a_write_in_flight_is_lent_to_cudarc() -> TestResult {
    let _serial = serial();
    let test = "a_write_in_flight_is_lent_to_cudarc";
    let Some(gpus) = gpus_or_skip(test, 1) else {
        return Ok(());
    };
    let (device, context) = &gpus[0];
    let theirs = CudaContext::new(device.ordinal())?;
    let cudarc_stream = theirs.new_stream()?;
    let ours = Stream::new(context)?;
    let n = 4096;
    let input = PinnedBuffer::from_slice(context, &pattern(n, 5))?;
    let mut buffer = DeviceBuffer::<u32>::zeroed(context, n)?;
    let mut view = buffer.as_mut_slice();
    let mut host = vec![0u32; n];
    let copied = cuda_vmm::scope(|s| {
        let q = s.on(&ours);
        let written = q.copy_from_host(&mut view, &input)?;
        // The host waits for the upload, so cudarc's copy below is ordered after it.
        q.synchronize()?;
        scope(
            &cudarc_stream,
            |c| -> Result<Result<(), DriverError>, Error> {
                let lent = c.lend(written)?;
                Ok(cudarc_stream.memcpy_dtoh(&lent, &mut host))
            },
        )
    })?;
    copied?;
    assert_eq!(
        host,
        pattern(n, 5),
        "cudarc read what the queued upload wrote"
    );
    assert_eq!(buffer.as_slice().to_vec()?, pattern(n, 5));
    Ok(())
}

/// A lent view asked for its address for another stream, or while the scope's stream captures a
/// graph, gets a never-mapped address: the memory is untouched, and the scope says why.
#[test]
fn refused_operations_touch_no_memory() -> TestResult {
    let _serial = serial();
    let test = "refused_operations_touch_no_memory";
    let Some(devices) = devices_or_skip(test, 1) else {
        return Ok(());
    };
    let device = devices[0];
    let ctx = CudaContext::new(device.ordinal())?;
    let (stream, other) = (ctx.new_stream()?, ctx.new_stream()?);
    let page = allocation_granularity(device, Granularity::Minimum)?;
    let mut buffer = VirtualBuffer::new(page, &[device], ReadWrite)?;
    buffer.grow(device, page)?;
    let input = pattern(page / 4, 9);
    buffer.slice_bytes_mut::<u32>(..)?.copy_from_host(&input)?;

    // Another stream of the same context.
    let mut view = buffer.slice_bytes_mut::<u32>(..)?;
    let result = scope(&stream, |s| -> TestResult {
        let mut lent = s.lend_mut(&mut view)?;
        let queued = other.memset_zeros(&mut lent);
        other.synchronize().ok();
        eprintln!("{test}: memset on another stream answered {queued:?}");
        Ok(())
    });
    let refusal = result.expect_err("the scope reports the refusal");
    assert!(
        matches!(
            refusal.downcast_ref::<Error>(),
            Some(Error::StreamRefused { .. })
        ),
        "{refusal}"
    );
    assert_eq!(
        buffer.slice_bytes::<u32>(..)?.to_vec()?,
        input,
        "nothing was zeroed"
    );

    // A capture of the scope's stream: the captured memset gets a never-mapped address.
    let mut view = buffer.slice_bytes_mut::<u32>(..)?;
    let result = scope(&stream, |s| -> TestResult {
        let mut lent = s.lend_mut(&mut view)?;
        stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let queued = stream.memset_zeros(&mut lent);
        let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
        eprintln!(
            "{test}: captured memset answered {queued:?}; the capture {}",
            match &graph {
                Ok(Some(_)) => "made a graph (of a never-mapped address; not launched)",
                Ok(None) => "made no graph",
                Err(_) => "failed",
            }
        );
        Ok(())
    });
    let refusal = result.expect_err("the scope reports the refusal");
    assert!(
        matches!(
            refusal.downcast_ref::<Error>(),
            Some(Error::StreamRefused { .. })
        ),
        "{refusal}"
    );
    assert_eq!(
        buffer.slice_bytes::<u32>(..)?.to_vec()?,
        input,
        "nothing was zeroed"
    );

    // A stream that is capturing when the scope starts is refused before the closure runs.
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let entered = scope(&stream, |_| -> TestResult { Ok(()) });
    let _ = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    assert!(
        matches!(
            entered.map_err(|e| e.downcast::<Error>().map(|e| *e)),
            Err(Ok(Error::StreamRefused { .. }))
        ),
        "a capturing stream is refused"
    );
    Ok(())
}

/// Forgetting the guard cudarc's trait returns changes nothing (lent values have no `Drop`): the scope waits in
/// its own frame, and the buffer can be unmapped right after.
#[test]
fn forgetting_lent_values_and_guards_is_harmless() -> TestResult {
    let _serial = serial();
    let test = "forgetting_lent_values_and_guards_is_harmless";
    let Some(devices) = devices_or_skip(test, 1) else {
        return Ok(());
    };
    let device = devices[0];
    let ctx = CudaContext::new(device.ordinal())?;
    let stream = ctx.new_stream()?;
    let page = allocation_granularity(device, Granularity::Minimum)?;
    let mut buffer = VirtualBuffer::new(page, &[device], ReadWrite)?;
    buffer.grow(device, page)?;
    let mut view = buffer.slice_bytes_mut::<u32>(..)?;
    let ones = vec![1u32; page / 4];
    scope(&stream, |s| -> TestResult {
        let mut lent = s.lend_mut(&mut view)?;
        stream.memcpy_htod(&ones, &mut lent)?;
        let (_, guard) = cudarc::driver::DevicePtr::device_ptr(&lent, &stream);
        core::mem::forget(guard); // lent values have no `Drop`: nothing of theirs can be forgotten
        Ok(())
    })?;
    buffer.unmap(..)?; // the copy has finished: the scope waited
    Ok(())
}

/// cudarc's `memcpy_dtoh` treats every `&mut [T]` as pageable memory and returns once its copy is
/// queued. Into pageable memory the driver copies before returning, so the bytes are there when
/// cudarc returns: an event recorded right after the copy has completed, and the bytes are read
/// inside the scope. Page-locked memory is the one destination into which the copy would still run
/// after the return (16 382 of 16 384 blocks unwritten, measured at 07952f7 through a dereferenced
/// `PinnedBuffer`), and no safe code gives cudarc one: a `PinnedBuffer` hands out no `&mut [T]`
/// (`ui-tests/stream/pinned_buffer_as_mut_slice`), and cudarc's own page-locked memory is made by
/// an `unsafe` function and synchronises itself.
#[test]
fn cudarc_copy_into_host_memory_returns_once_done() -> TestResult {
    let _serial = serial();
    let test = "cudarc_copy_into_host_memory_returns_once_done";
    let Some(devices) = devices_or_skip(test, 1) else {
        return Ok(());
    };
    let device = devices[0];
    let ctx = CudaContext::new(device.ordinal())?;
    let stream = ctx.new_stream()?;
    let bytes = 1 << 30;
    let mut buffer = VirtualBuffer::new(bytes, &[device], ReadWrite)?;
    buffer.grow(device, bytes)?;
    buffer
        .slice_bytes_mut::<u8>(..)?
        .copy_from_host(&vec![7u8; bytes])?;
    let view = buffer.slice_bytes::<u8>(..)?;
    let mut host = vec![0u8; bytes];
    let mut complete_on_return = false;
    let mut read_in_scope = false;
    scope(&stream, |s| -> TestResult {
        let lent = s.lend(view)?;
        stream.memcpy_dtoh(&lent, &mut host)?;
        let after = stream.record_event(None)?;
        complete_on_return = after.is_complete();
        read_in_scope = host.iter().all(|&b| b == 7);
        Ok(())
    })?;
    assert!(
        complete_on_return,
        "cudarc's copy into pageable memory was still running when it returned"
    );
    assert!(read_in_scope, "the bytes were there when cudarc returned");
    Ok(())
}
