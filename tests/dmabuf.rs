//! dma-buf export of a `VirtualBuffer`'s range (`VirtualBuffer::export_dma_buf`) against a real
//! driver: a five-page range of pages made separately, one descriptor per page, each checked here
//! to be a dma-buf of its page's size by the kernel's own records (`fstat`, `lseek(SEEK_END)`,
//! `/proc/self/fdinfo`), with free device memory exact once they are closed; one descriptor over
//! the five pages, measured with a raw `cuMemGetHandleForAddressRange` and compared with the
//! crate's answer; and the refusals before any driver call (unmapped, evicted, retired and cut
//! pages, an empty range, a page not made RDMA capable).
//!
//! Every test prints the device's dma-buf attribute (`CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`, 124)
//! and the RDMA attributes it read: where the device has no dma-buf support, the export tests show
//! the crate's refusal (`Error::Unsupported` naming attribute 124) instead of the descriptors.
//! Lines starting `MEASURED` record what the driver did where the crate does not decide it.

#![cfg(target_os = "linux")]

mod common;

use core::ffi::c_void;
use std::io::{Seek, SeekFrom};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use cuda_vmm::device::Capabilities;
use cuda_vmm::ipc::{DmaBufExport, DmaBufLayout};
use cuda_vmm::owned::PageOptions;
use cuda_vmm::{
    Context, Device, Error, Granularity, ReadWrite, Stream, VirtualBuffer, allocation_granularity,
};

unsafe extern "C" {
    fn cuMemGetHandleForAddressRange(
        handle: *mut c_void,
        dptr: u64,
        size: usize,
        handle_type: u32,
        flags: u64,
    ) -> u32;
}

/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
const DMA_BUF_FD: u32 = 1;

/// The tests of this file measure free memory and open descriptors; they run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn page(device: Device) -> usize {
    allocation_granularity(device, Granularity::Minimum).unwrap()
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// The device's report, printed with the kernel's release (dma-buf's records depend on it).
fn report(test: &str, device: Device) -> Capabilities {
    let caps = device.capabilities().unwrap();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!(
        "{test}: {device:?}: DMA_BUF_SUPPORTED (124) {}, GPU_DIRECT_RDMA_SUPPORTED (116) {}, \
         GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED (110) {}; kernel {}",
        caps.dma_buf,
        caps.gpu_direct_rdma,
        caps.gpu_direct_rdma_with_vmm,
        kernel.trim()
    );
    caps
}

/// A buffer of `pages` pages of `page` bytes each, made one by one (each its own `cuMemCreate`),
/// RDMA capable where the device can make VMM memory so.
fn separate_pages(device: Device, caps: &Capabilities, page: usize, pages: usize) -> VirtualBuffer {
    let options = PageOptions::new().with_rdma(caps.gpu_direct_rdma_with_vmm);
    let buffer = VirtualBuffer::with_options(16 * page, &[device], ReadWrite, options).unwrap();
    for _ in 0..pages {
        buffer.grow(device, page).unwrap();
    }
    assert_eq!(buffer.pages().len(), pages);
    buffer
}

/// What the kernel says of a descriptor: its `fstat` size, its size by `lseek(SEEK_END)` (the
/// documented size query of a dma-buf), and the `size` and `exp_name` lines of its
/// `/proc/self/fdinfo` entry (present for a dma-buf only).
#[derive(Debug)]
struct FdFacts {
    fstat_size: u64,
    seek_size: Option<u64>,
    fdinfo_size: Option<u64>,
    exporter: Option<String>,
}

fn fd_facts(fd: BorrowedFd<'_>) -> FdFacts {
    let mut file = std::fs::File::from(fd.try_clone_to_owned().unwrap());
    let fstat_size = file.metadata().unwrap().len();
    let seek_size = file.seek(SeekFrom::End(0)).ok();
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).unwrap();
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name))
            .map(|value| value.trim().to_owned())
    };
    FdFacts {
        fstat_size,
        seek_size,
        fdinfo_size: field("size:").and_then(|v| v.parse().ok()),
        exporter: field("exp_name:"),
    }
}

/// Asserts that `fd` is a dma-buf of `size` bytes by every record of the kernel.
fn assert_dma_buf_of(test: &str, what: &str, fd: BorrowedFd<'_>, size: usize) {
    let facts = fd_facts(fd);
    println!("{test}: {what}: {facts:?}");
    let exporter = facts.exporter.as_deref().unwrap_or_else(|| {
        panic!("{test}: {what}: /proc/self/fdinfo has no exp_name: not a dma-buf ({facts:?})")
    });
    assert!(!exporter.is_empty(), "{test}: {what}: {facts:?}");
    assert_eq!(
        facts.fdinfo_size,
        Some(size as u64),
        "{test}: {what}: fdinfo size"
    );
    assert_eq!(
        facts.seek_size,
        Some(size as u64),
        "{test}: {what}: lseek(SEEK_END)"
    );
    assert_eq!(facts.fstat_size, size as u64, "{test}: {what}: fstat size");
}

/// The device is current on this thread (for the raw call) and free memory is read through it.
fn free(ctx: &Context) -> usize {
    ctx.memory_info().unwrap().0
}

/// One export of the buffer's first page, closed at once: what the process's first dma-buf export
/// sets up for good (if anything) is set up before free memory is measured. Returns the free
/// memory it took for good, printed; `Err` with the crate's refusal where the device has no dma-buf
/// support.
fn warm_up(test: &str, ctx: &Context, buffer: &VirtualBuffer, page: usize) -> Result<usize, Error> {
    let cold = free(ctx);
    drop(buffer.export_dma_buf(..page, DmaBufLayout::PerPage)?);
    let kept = cold.saturating_sub(free(ctx));
    println!("MEASURED {test}: device memory kept after the first export was closed: {kept} bytes");
    Ok(kept)
}

#[test]
fn five_separate_pages_export_one_dma_buf_each() {
    const TEST: &str = "five_separate_pages_export_one_dma_buf_each";
    let _serial = serial();
    let Some((device, ctx)) = common::gpu_or_skip(TEST) else {
        return;
    };
    let caps = report(TEST, device);
    let g = page(device);
    let free_at_start = free(&ctx);
    let buffer = separate_pages(device, &caps, g, 7);
    let fds_before = open_fds();
    let kept = match warm_up(TEST, &ctx, &buffer, g) {
        Err(e @ Error::Unsupported { attribute: 124, .. }) => {
            assert!(
                !caps.dma_buf,
                "{TEST}: refused although attribute 124 says yes: {e}"
            );
            assert_eq!(
                open_fds(),
                fds_before,
                "{TEST}: a refused export opened a descriptor"
            );
            println!("{TEST}: no dma-buf support here; the export is refused: {e}");
            return;
        }
        other => other.unwrap_or_else(|e| panic!("{TEST}: {e}")),
    };
    assert_eq!(
        open_fds(),
        fds_before,
        "{TEST}: the warm-up's descriptor closed"
    );
    let free_before = free(&ctx);
    // Pages 1 to 5 of 0 to 6: the range starts and ends between pages, none at the base.
    let export = buffer
        .export_dma_buf(g..6 * g, DmaBufLayout::PerPage)
        .unwrap_or_else(|e| panic!("{TEST}: {e}"));
    assert!(
        caps.dma_buf,
        "{TEST}: exported although attribute 124 says no"
    );
    assert_eq!(export.range(), g..6 * g);
    assert_eq!(export.chunks().len(), 5, "{TEST}: one descriptor per page");
    for (i, chunk) in export.chunks().iter().enumerate() {
        let offset = (i + 1) * g;
        assert_eq!(chunk.offset(), offset, "{TEST}: chunk {i}");
        assert_eq!(chunk.size(), g, "{TEST}: chunk {i}");
        assert_eq!(chunk.address(), buffer.base() + offset as u64);
        assert_eq!(chunk.device(), device);
        assert_dma_buf_of(TEST, &format!("chunk {i}"), chunk.fd(), g);
    }
    assert_eq!(open_fds(), fds_before + 5, "{TEST}: five descriptors open");
    let free_exported = free(&ctx);
    println!(
        "MEASURED {TEST}: free device memory {free_before} bytes before the export, \
         {free_exported} with the five descriptors open"
    );
    drop(export);
    assert_eq!(open_fds(), fds_before, "{TEST}: every descriptor closed");
    assert_eq!(
        free(&ctx),
        free_before,
        "{TEST}: free memory once the descriptors are closed"
    );
    // The pages are the buffer's as before: unmapped and released, to the byte (less what the
    // first export of the process kept, measured above).
    drop(buffer);
    assert_eq!(
        free(&ctx),
        free_at_start - kept,
        "{TEST}: the buffer or an export leaked"
    );
}

/// One descriptor over five pages made separately: what the driver does is measured with a raw
/// call and printed (`MEASURED`), and the crate's `DmaBufLayout::PerRun` must give the same
/// answer, or refuse a descriptor that covers less than its run.
#[test]
fn one_dma_buf_over_five_pages_is_measured() {
    const TEST: &str = "one_dma_buf_over_five_pages_is_measured";
    let _serial = serial();
    let Some((device, ctx)) = common::gpu_or_skip(TEST) else {
        return;
    };
    let caps = report(TEST, device);
    if !caps.dma_buf {
        common::skip(&format!(
            "SKIPPED {TEST}: the device has no dma-buf support (attribute 124 is 0)"
        ));
        return;
    }
    let g = page(device);
    let buffer = separate_pages(device, &caps, g, 5);
    let len = 5 * g;
    warm_up(TEST, &ctx, &buffer, g).unwrap_or_else(|e| panic!("{TEST}: {e}"));
    let free_before = free(&ctx);
    // The raw call, in the device's context (current since `free`).
    let mut fd: i32 = -1;
    // SAFETY: the driver writes one `int` through the pointer; the range is the buffer's five
    // mapped pages, alive (borrowed) for the call.
    let code = unsafe {
        cuMemGetHandleForAddressRange(
            (&raw mut fd).cast::<c_void>(),
            buffer.base(),
            len,
            DMA_BUF_FD,
            0,
        )
    };
    let raw = if code == 0 {
        assert!(fd >= 0, "{TEST}: success without a descriptor");
        // SAFETY: the driver has just opened `fd` for this call; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let facts = fd_facts(std::os::fd::AsFd::as_fd(&fd));
        println!(
            "MEASURED {TEST}: one cuMemGetHandleForAddressRange over 5 separately made pages of \
             {g} bytes: accepted; {facts:?} (the range is {len} bytes)"
        );
        Ok(facts.seek_size)
    } else {
        println!(
            "MEASURED {TEST}: one cuMemGetHandleForAddressRange over 5 separately made pages: \
             refused with {}",
            common::code_name(code)
        );
        Err(code)
    };
    match (raw, buffer.export_dma_buf(..len, DmaBufLayout::PerRun)) {
        (Ok(Some(size)), Ok(export)) => {
            assert_eq!(
                size, len as u64,
                "{TEST}: the crate returned a short descriptor"
            );
            assert_eq!(
                export.chunks().len(),
                1,
                "{TEST}: one run of five alike pages"
            );
            assert_dma_buf_of(TEST, "the run", export.chunks()[0].fd(), len);
            println!("MEASURED {TEST}: DmaBufLayout::PerRun gives one descriptor over the range");
        }
        (Ok(size), Err(e @ Error::PageRange { .. })) => {
            assert_ne!(
                size,
                Some(len as u64),
                "{TEST}: refused a whole descriptor: {e}"
            );
            println!("MEASURED {TEST}: the driver's one descriptor covers less; refused: {e}");
        }
        (Err(code), Err(e)) => {
            assert_eq!(
                e.driver().map(cuda_vmm::DriverError::code),
                Some(code),
                "{TEST}: {e}"
            );
        }
        (raw, crate_answer) => panic!(
            "{TEST}: the raw call ({raw:?}) and the crate ({:?}) disagree",
            crate_answer.map(|e| e.chunks().len())
        ),
    }
    assert_eq!(free(&ctx), free_before, "{TEST}: every descriptor closed");
}

/// Every refusal that the page table decides comes before any driver call: no descriptor is
/// opened, and on a device without dma-buf support the refusal names the pages, not the
/// attribute (which is asked only after the range is found good).
#[test]
fn ranges_the_page_table_refuses_reach_no_driver_call() {
    const TEST: &str = "ranges_the_page_table_refuses_reach_no_driver_call";
    let _serial = serial();
    let Some((device, ctx)) = common::gpu_or_skip(TEST) else {
        return;
    };
    let caps = report(TEST, device);
    let g = page(device);
    let mut buffer = separate_pages(device, &caps, g, 5);
    // Pages at 0..5g; a hole at 5g..6g, then one page of two granules at 6g..8g.
    buffer.map_page(6 * g, device, 2 * g).unwrap();
    let fds = open_fds();
    let refusal = |buffer: &VirtualBuffer, range: core::ops::Range<usize>| {
        let refused = buffer
            .export_dma_buf(range.clone(), DmaBufLayout::PerPage)
            .map(|e: DmaBufExport<'_>| e.chunks().len());
        assert_eq!(open_fds(), fds, "{TEST}: {range:?} opened a descriptor");
        match refused {
            Err(Error::PageRange {
                start,
                end,
                problem,
            }) => {
                println!("{TEST}: {range:?} refused: bytes {start}..{end} {problem}");
                (start, end, problem)
            }
            other => panic!("{TEST}: {range:?}: {other:?}"),
        }
    };
    // Unmapped.
    let (start, end, problem) = refusal(&buffer, 4 * g..7 * g);
    assert_eq!((start, end), (5 * g, 6 * g));
    assert!(problem.contains("not mapped"), "{problem}");
    // A page cut in two.
    let (start, end, problem) = refusal(&buffer, 6 * g..7 * g);
    assert_eq!((start, end), (6 * g, 8 * g));
    assert!(problem.contains("cut in two"), "{problem}");
    // Evicted.
    let evicted = buffer.evict(2 * g..3 * g).unwrap();
    let (start, end, problem) = refusal(&buffer, 0..5 * g);
    assert_eq!((start, end), (2 * g, 3 * g));
    assert!(problem.contains("evicted"), "{problem}");
    buffer.restore(evicted).unwrap();
    // Retired, its stream's work not yet seen finished.
    let stream = Stream::new(&ctx).unwrap();
    assert_eq!(buffer.retire_after(&stream, 4 * g..5 * g).unwrap(), 1);
    let (start, end, problem) = refusal(&buffer, 3 * g..5 * g);
    assert_eq!((start, end), (4 * g, 5 * g));
    assert!(problem.contains("retired"), "{problem}");
    stream.synchronize().unwrap();
    assert_eq!(buffer.reclaim().unwrap(), 1);
    // Empty, and outside the budget.
    assert!(matches!(
        buffer.export_dma_buf(g..g, DmaBufLayout::PerPage),
        Err(Error::ZeroSize { .. })
    ));
    assert!(matches!(
        buffer.export_dma_buf(..17 * g, DmaBufLayout::PerPage),
        Err(Error::OutOfBounds { .. })
    ));
    assert_eq!(open_fds(), fds);
    // The good part of the buffer exports where the device can.
    match buffer.export_dma_buf(..4 * g, DmaBufLayout::PerPage) {
        Ok(export) => {
            assert!(caps.dma_buf);
            assert_eq!(export.chunks().len(), 4);
        }
        Err(e @ Error::Unsupported { attribute: 124, .. }) => {
            assert!(!caps.dma_buf);
            println!("{TEST}: the good range is refused for the device: {e}");
        }
        Err(e) => panic!("{TEST}: the good range: {e}"),
    }
}

/// A page made without the RDMA flag, on a device whose VMM memory can have it, is refused by
/// name (before any export); on a device that cannot, it exports as it is.
#[test]
fn pages_not_made_rdma_capable_are_refused_where_they_could_be() {
    const TEST: &str = "pages_not_made_rdma_capable_are_refused_where_they_could_be";
    let _serial = serial();
    let Some((device, _ctx)) = common::gpu_or_skip(TEST) else {
        return;
    };
    let caps = report(TEST, device);
    let g = page(device);
    let plain = VirtualBuffer::new(4 * g, &[device], ReadWrite).unwrap();
    plain.grow(device, g).unwrap();
    let fds = open_fds();
    match plain.export_dma_buf(..g, DmaBufLayout::PerPage) {
        Err(e @ Error::Unsupported { attribute: 124, .. }) => {
            assert!(!caps.dma_buf, "{e}");
            println!("{TEST}: no dma-buf support: {e}");
        }
        Err(e @ Error::PageRange { .. }) => {
            assert!(caps.dma_buf && caps.gpu_direct_rdma_with_vmm, "{e}");
            assert!(e.to_string().contains("RDMA"), "{e}");
            println!("{TEST}: refused: {e}");
        }
        Ok(export) => {
            assert!(caps.dma_buf && !caps.gpu_direct_rdma_with_vmm);
            assert_eq!(export.chunks().len(), 1);
            println!("{TEST}: the device cannot make VMM memory RDMA capable: exported as it is");
        }
        Err(e) => panic!("{TEST}: {e}"),
    }
    assert_eq!(open_fds(), fds);
}
