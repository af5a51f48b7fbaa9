//! Shareable and evictable owned memory on a GPU: an `ExportableBuffer` (a `VirtualBuffer` whose
//! pages are made with `PageOptions::posix_fd`), exported whole to a child process that imports it
//! as one owned buffer; and pages evicted to host memory and restored at the same addresses.
//!
//! The child is this test binary again (`current_exe()` with `<test name> --exact --nocapture`, the
//! role in `CUDA_VMM_EXPORTABLE_CHILD`), its standard input its end of a Unix socket pair, as in
//! `tests/ipc.rs`. The tests measure free memory and so run one at a time. Every test skips visibly
//! without a GPU.

#![cfg(target_os = "linux")]

mod common;

use common::processes::{
    self, expect_byte, receive_byte, send_byte, settled_free, shareable_gpu_or_skip, wait_success,
};

use std::os::unix::net::UnixStream;

use cuda_vmm::ipc::{ExportedAllocation, ExportedBuffer, PosixFd, ShareableAllocation};
use cuda_vmm::owned::{ExportableBuffer, PageOptions, SharedPage, SharedReservation, Unmapped};
use cuda_vmm::{Device, Error, Granularity, ReadWrite, VirtualBuffer, allocation_granularity};

const CHILD: &str = "CUDA_VMM_EXPORTABLE_CHILD";

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Starts this test binary again as the child of `test` in `role`, with `socket` as its standard
/// input.
fn spawn_child(test: &str, role: &str, socket: UnixStream) -> std::process::Child {
    processes::spawn_child(CHILD, test, role, socket)
}

fn child_role() -> Option<String> {
    std::env::var(CHILD).ok()
}

fn pattern(bytes: usize, seed: u32) -> Vec<u32> {
    common::pattern(bytes / 4, seed)
}

/// The five pages of the exported buffer, in granules: (offset, size). Sizes differ, and a hole
/// lies between the third and the fourth.
const PIECES: [(usize, usize); 5] = [(0, 1), (1, 2), (3, 1), (5, 3), (8, 1)];
const BUDGET: usize = 16;
const END: usize = 9;

/// An exportable buffer of the five pieces, filled with `pattern(.., 1)`.
fn five_piece_buffer(device: Device, g: usize) -> ExportableBuffer {
    let mut buffer = ExportableBuffer::new(BUDGET * g, &[device], ReadWrite).unwrap();
    for (offset, size) in PIECES {
        buffer.map_page(offset * g, device, size * g).unwrap();
    }
    write_pieces(&mut buffer, g, 1);
    buffer
}

/// Writes `pattern(size, seed + i)` into piece `i`.
fn write_pieces(buffer: &mut VirtualBuffer, g: usize, seed: u32) {
    for (i, (offset, size)) in PIECES.into_iter().enumerate() {
        buffer
            .slice_bytes_mut::<u32>(offset * g..(offset + size) * g)
            .unwrap()
            .copy_from_host(&pattern(size * g, seed + i as u32))
            .unwrap();
    }
}

/// Checks that piece `i` holds `pattern(size, seed + i)`, for the pieces `which`.
fn check_pieces(buffer: &VirtualBuffer, g: usize, seed: u32, which: impl Fn(usize) -> bool) {
    for (i, (offset, size)) in PIECES.into_iter().enumerate() {
        if which(i) {
            assert_eq!(
                buffer
                    .slice_bytes::<u32>(offset * g..(offset + size) * g)
                    .unwrap()
                    .to_vec()
                    .unwrap(),
                pattern(size * g, seed + i as u32),
                "piece {i}"
            );
        }
    }
}

/// Driver bookkeeping that the first shareable allocation and the first pinning set up and keep.
fn warm_up(device: Device, g: usize) {
    let memory = ShareableAllocation::<PosixFd>::new(device, g).unwrap();
    drop(memory.export().unwrap());
    drop(memory);
    let mut buffer = VirtualBuffer::new(g, &[device], ReadWrite).unwrap();
    buffer.grow(device, g).unwrap();
    let evicted = buffer.evict(..).unwrap();
    buffer.restore(evicted).unwrap();
}

// ---------------------------------------------------------------------------------------------------

#[test]
fn child_imports_a_five_piece_buffer_writes_and_parent_reads() {
    const TEST: &str = "child_imports_a_five_piece_buffer_writes_and_parent_reads";
    if child_role().is_some() {
        return child_imports_and_writes();
    }
    let _serial = serial();
    let Some((device, ctx)) = shareable_gpu_or_skip(TEST) else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    warm_up(device, g);
    let (free_before, _) = ctx.memory_info().unwrap();
    {
        let buffer = five_piece_buffer(device, g);
        let (socket, child_end) = UnixStream::pair().unwrap();
        let child = spawn_child(TEST, "write", child_end);
        let exported = buffer.export().unwrap();
        assert_eq!(exported.info().pieces().len(), 5);
        assert_eq!(exported.info().budget(), BUDGET * g);
        assert_eq!(exported.info().total_bytes(), END * g - g);
        exported.send(&socket).unwrap();
        drop(exported); // the child has its own descriptors
        expect_byte(&socket, b'D');
        wait_success(child, TEST);
        check_pieces(&buffer, g, 20, |_| true);
    }
    assert_eq!(settled_free(&ctx, free_before), free_before, "leak");
}

/// The child: receive and import as one owned buffer, check its pages and bytes, write its own.
fn child_imports_and_writes() {
    let (device, _ctx) = common::gpu_or_skip("child").expect("the child sees the parent's GPU");
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let mut buffer = VirtualBuffer::receive(std::io::stdin(), &[device], ReadWrite).unwrap();
    assert_eq!(buffer.budget(), BUDGET * g);
    let pages: Vec<(usize, usize)> = buffer.pages().map(|p| (p.offset, p.size)).collect();
    let expected: Vec<(usize, usize)> = PIECES.iter().map(|&(o, s)| (o * g, s * g)).collect();
    assert_eq!(pages, expected, "the same pages at the same offsets");
    check_pieces(&buffer, g, 1, |_| true);
    // The hole stays a hole here too.
    assert!(matches!(
        buffer.slice_bytes::<u8>(4 * g..5 * g),
        Err(Error::PageRange { .. })
    ));
    write_pieces(&mut buffer, g, 20);
    // The imported buffer grows like any other, with pages of the imported ones' options. It is a
    // plain `VirtualBuffer`, with no `export`: the driver does not export imported memory again
    // (`child_maps_the_import_twice` checks the run-time refusal of an imported page mapped into an
    // exportable buffer).
    assert_eq!(
        buffer.grow(device, g).unwrap(),
        END * g,
        "after the imported pages"
    );
    assert_eq!(buffer.page_options(), PageOptions::posix_fd());
    send_byte(std::io::stdin(), b'D');
}

// ---------------------------------------------------------------------------------------------------

#[test]
fn child_killed_halfway_leaves_the_exported_buffer_intact() {
    const TEST: &str = "child_killed_halfway_leaves_the_exported_buffer_intact";
    if child_role().is_some() {
        return child_writes_two_pieces_then_hangs();
    }
    let _serial = serial();
    let Some((device, ctx)) = shareable_gpu_or_skip(TEST) else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    warm_up(device, g);
    let (free_before, _) = ctx.memory_info().unwrap();
    {
        let mut buffer = five_piece_buffer(device, g);
        let (socket, child_end) = UnixStream::pair().unwrap();
        let mut child = spawn_child(TEST, "half", child_end);
        buffer.export().unwrap().send(&socket).unwrap();
        expect_byte(&socket, b'H');
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert!(!status.success(), "the child was killed: {status}");
        check_pieces(&buffer, g, 30, |i| i < 2);
        check_pieces(&buffer, g, 1, |i| i >= 2);
        // The parent's buffer still works, and still changes.
        write_pieces(&mut buffer, g, 40);
        check_pieces(&buffer, g, 40, |_| true);
        buffer.grow(device, g).unwrap();
        assert_eq!(buffer.shrink().unwrap().map(|p| p.size), Some(g));
    }
    assert_eq!(settled_free(&ctx, free_before), free_before, "leak");
}

fn child_writes_two_pieces_then_hangs() {
    let (device, _ctx) = common::gpu_or_skip("child").expect("the child sees the parent's GPU");
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let mut buffer = VirtualBuffer::receive(std::io::stdin(), &[device], ReadWrite).unwrap();
    for (i, (offset, size)) in PIECES.into_iter().enumerate().take(2) {
        buffer
            .slice_bytes_mut::<u32>(offset * g..(offset + size) * g)
            .unwrap()
            .copy_from_host(&pattern(size * g, 30 + i as u32))
            .unwrap();
    }
    send_byte(std::io::stdin(), b'H');
    let _ = receive_byte(std::io::stdin());
    panic!("the child should have been killed");
}

// ---------------------------------------------------------------------------------------------------

/// An imported allocation (and a shareable one) goes into a `SharedReservation` and, as a
/// `SharedPage`, into a `VirtualBuffer` page.
#[test]
fn imported_allocation_maps_into_a_shared_reservation_and_a_buffer_page() {
    const TEST: &str = "imported_allocation_maps_into_a_shared_reservation_and_a_buffer_page";
    if child_role().is_some() {
        return child_maps_the_import_twice();
    }
    let _serial = serial();
    let Some((device, ctx)) = shareable_gpu_or_skip(TEST) else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    warm_up(device, g);
    let (free_before, _) = ctx.memory_info().unwrap();
    {
        let memory = ShareableAllocation::<PosixFd>::new(device, g).unwrap();
        let exported = memory.export().unwrap();
        // The shareable memory itself, as a page of a buffer.
        let page = SharedPage::from_allocation(memory.into_allocation());
        let mut buffer = ExportableBuffer::new(2 * g, &[device], ReadWrite).unwrap();
        buffer.map_shared(0, &page).unwrap();
        drop(page);
        buffer
            .slice_bytes_mut::<u32>(..g)
            .unwrap()
            .copy_from_host(&pattern(g, 5))
            .unwrap();
        let (socket, child_end) = UnixStream::pair().unwrap();
        let child = spawn_child(TEST, "maps", child_end);
        exported.send(&socket).unwrap();
        drop(exported);
        expect_byte(&socket, b'D');
        wait_success(child, TEST);
        assert_eq!(
            buffer.slice_bytes::<u32>(..g).unwrap().to_vec().unwrap(),
            pattern(g, 6)
        );
        // The page's memory was created exportable: the buffer exports it as any page.
        assert_eq!(buffer.export().unwrap().info().pieces().len(), 1);
    }
    assert_eq!(settled_free(&ctx, free_before), free_before, "leak");
}

fn child_maps_the_import_twice() {
    let (device, _ctx) = common::gpu_or_skip("child").expect("the child sees the parent's GPU");
    let received = ExportedAllocation::receive(std::io::stdin()).unwrap();
    let size = received.info().size();
    let imported = received.import().unwrap();
    drop(received);
    // First as an owned mapping of its own...
    let reservation = SharedReservation::new(size, 0).unwrap();
    let mapping = reservation.map(0, imported).unwrap();
    let granted = mapping.keep_grant(&[device], ReadWrite).unwrap();
    assert_eq!(
        granted.slice::<u32>().unwrap().to_vec().unwrap(),
        pattern(size, 5)
    );
    let imported = match granted.revoke().unwrap().unmap().unwrap() {
        Unmapped::Owned(memory) => memory,
        Unmapped::Shared(_) => panic!("the mapping owned its memory"),
    };
    // ... then as a shared page of an exportable buffer, which writes.
    let page = SharedPage::from_allocation(imported);
    let mut buffer = ExportableBuffer::new(2 * size, &[device], ReadWrite).unwrap();
    buffer.grow(device, size).unwrap();
    buffer.map_shared(size, &page).unwrap();
    buffer
        .slice_bytes_mut::<u32>(size..)
        .unwrap()
        .copy_from_host(&pattern(size, 6))
        .unwrap();
    // The imported page is not exported again (the driver would answer CUDA_ERROR_INVALID_VALUE):
    // refused before any driver call, naming it, though the buffer's own page is exportable.
    match buffer.export() {
        Err(Error::PageRange { start, end, .. }) => assert_eq!((start, end), (size, 2 * size)),
        other => panic!("an export of an imported page: {other:?}"),
    }
    buffer.unmap(size..).unwrap();
    assert_eq!(
        buffer.export().unwrap().info().pieces().len(),
        1,
        "its own page alone"
    );
    send_byte(std::io::stdin(), b'D');
}

// ---------------------------------------------------------------------------------------------------

#[test]
fn evict_then_restore_frees_exactly_and_keeps_bytes_and_address() {
    const TEST: &str = "evict_then_restore_frees_exactly_and_keeps_bytes_and_address";
    if child_role().is_some() {
        return;
    }
    let _serial = serial();
    let Some((device, ctx)) = common::gpu_or_skip(TEST) else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    warm_up(device, g);
    let (free_before, _) = ctx.memory_info().unwrap();
    {
        let mut buffer = VirtualBuffer::new(BUDGET * g, &[device], ReadWrite).unwrap();
        for (offset, size) in PIECES {
            buffer.map_page(offset * g, device, size * g).unwrap();
        }
        write_pieces(&mut buffer, g, 1);
        let base = buffer.base();
        let (free_mapped, _) = ctx.memory_info().unwrap();

        // Pieces 1..4 (granules 1..8, with the hole at 4): 6 granules.
        let evicted = buffer.evict(g..8 * g).unwrap();
        assert_eq!(evicted.len(), 6 * g);
        assert_eq!(
            evicted.ranges().collect::<Vec<_>>(),
            [g..3 * g, 3 * g..4 * g, 5 * g..8 * g]
        );
        let (free_evicted, _) = ctx.memory_info().unwrap();
        assert_eq!(
            free_evicted - free_mapped,
            6 * g,
            "free memory rises by exactly the evicted bytes"
        );
        assert_eq!(buffer.evicted_bytes(), 6 * g);
        assert_eq!(buffer.mapped_bytes(), 2 * g);
        assert_eq!(buffer.base(), base, "the reservation stays");
        let mut host = pattern(2 * g, 2);
        host.extend(pattern(g, 3));
        host.extend(pattern(3 * g, 4));
        assert_eq!(evicted.host_bytes(), bytemuck::cast_slice::<u32, u8>(&host));

        // No view and no new page reaches the evicted range; the hole inside it stays free.
        match buffer.slice_bytes::<u8>(2 * g..3 * g) {
            Err(Error::PageRange {
                start,
                end,
                problem,
            }) => {
                assert_eq!(
                    (start, end),
                    (g, 3 * g),
                    "the error names the evicted bytes"
                );
                assert!(problem.contains("evicted"), "{problem}");
            }
            other => panic!("a view of an evicted range: {other:?}"),
        }
        assert!(matches!(
            buffer.map_page(5 * g, device, g),
            Err(Error::PageRange { .. })
        ));
        assert!(matches!(
            buffer.evict(g..3 * g),
            Err(Error::PageRange { .. })
        ));
        buffer.map_page(4 * g, device, g).unwrap();
        assert_eq!(buffer.unmap(4 * g..5 * g).unwrap(), 1);
        // grow maps after the evicted range, not over it.
        assert_eq!(buffer.grow(device, g).unwrap(), END * g);
        buffer.shrink().unwrap();
        // The untouched pieces keep their bytes.
        check_pieces(&buffer, g, 1, |i| i == 0 || i == 4);

        // A handle is restored only into its own buffer.
        let mut other = VirtualBuffer::new(BUDGET * g, &[device], ReadWrite).unwrap();
        let refused = other.restore(evicted).unwrap_err();
        assert!(matches!(refused.error(), Error::InvalidArgument { .. }));
        assert_eq!(other.mapped_bytes(), 0);
        let evicted = refused.into_evicted();

        buffer.restore(evicted).unwrap();
        assert_eq!(buffer.base(), base, "the address is unchanged");
        assert_eq!(buffer.evicted_bytes(), 0);
        let (free_restored, _) = ctx.memory_info().unwrap();
        assert_eq!(free_restored, free_mapped);
        check_pieces(&buffer, g, 1, |_| true);
        let pages: Vec<(usize, usize)> = buffer.pages().map(|p| (p.offset, p.size)).collect();
        let expected: Vec<(usize, usize)> = PIECES.iter().map(|&(o, s)| (o * g, s * g)).collect();
        assert_eq!(pages, expected, "the same pages at the same offsets");
        let stats = buffer.stats();
        assert_eq!((stats.pages_evicted, stats.pages_restored), (3, 3));
    }
    assert_eq!(settled_free(&ctx, free_before), free_before, "leak");
}

#[test]
fn ten_thousand_evict_restore_rounds_leak_nothing() {
    const TEST: &str = "ten_thousand_evict_restore_rounds_leak_nothing";
    if child_role().is_some() {
        return;
    }
    let _serial = serial();
    let Some((device, ctx)) = common::gpu_or_skip(TEST) else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    warm_up(device, g);
    let (free_before, _) = ctx.memory_info().unwrap();
    {
        let mut buffer = VirtualBuffer::new(4 * g, &[device], ReadWrite).unwrap();
        buffer.grow(device, g).unwrap();
        buffer.grow(device, 2 * g).unwrap();
        buffer
            .slice_bytes_mut::<u32>(..3 * g)
            .unwrap()
            .copy_from_host(&pattern(3 * g, 9))
            .unwrap();
        let (free_mapped, _) = ctx.memory_info().unwrap();
        for round in 0..10_000 {
            let range = if round % 2 == 0 { ..3 * g } else { ..g };
            let evicted = buffer.evict(range).unwrap();
            buffer.restore(evicted).unwrap();
            if round % 100 == 0 {
                assert_eq!(ctx.memory_info().unwrap().0, free_mapped, "round {round}");
            }
        }
        assert_eq!(
            buffer
                .slice_bytes::<u32>(..3 * g)
                .unwrap()
                .to_vec()
                .unwrap(),
            pattern(3 * g, 9)
        );
    }
    assert_eq!(settled_free(&ctx, free_before), free_before, "leak");
}

/// Evictions into pinned memory the caller keeps: a buffer too short is refused before any driver
/// call (nothing changes, the page stays mapped); a longer one takes the bytes at its start; the
/// restore gives back the same pinned memory, which the next eviction takes again; free memory
/// rises by the evicted page each time and is back to the byte at the end.
#[test]
fn evictions_into_kept_pinned_memory() {
    const TEST: &str = "evictions_into_kept_pinned_memory";
    if child_role().is_some() {
        return;
    }
    let _serial = serial();
    let Some((device, ctx)) = common::gpu_or_skip(TEST) else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    warm_up(device, g);
    let (free_before, _) = ctx.memory_info().unwrap();
    {
        let mut buffer = VirtualBuffer::new(4 * g, &[device], ReadWrite).unwrap();
        buffer.grow(device, 2 * g).unwrap();
        let data = pattern(2 * g, 31);
        buffer
            .slice_bytes_mut::<u32>(..2 * g)
            .unwrap()
            .copy_from_host(&data)
            .unwrap();
        let (free_mapped, _) = ctx.memory_info().unwrap();
        // Too short: refused, nothing evicted.
        let short = cuda_vmm::PinnedBuffer::<u8>::zeroed(&ctx, g).unwrap();
        let refused = buffer.evict_into(.., short).unwrap_err();
        assert!(
            matches!(refused, Error::LengthMismatch { expected, found } if expected == 2 * g && found == g),
            "{refused:?}"
        );
        assert_eq!(buffer.evicted_bytes(), 0);
        assert_eq!(ctx.memory_info().unwrap().0, free_mapped);
        // Longer: the bytes at its start, the rest as it was.
        let mut host = cuda_vmm::PinnedBuffer::<u8>::zeroed(&ctx, 3 * g).unwrap();
        host.slice_mut(2 * g..).unwrap().fill(0xa5);
        let at = host.as_ptr();
        for round in 0..20u32 {
            let evicted = buffer.evict_into(.., host).unwrap();
            assert_eq!(evicted.len(), 2 * g);
            assert_eq!(evicted.host_capacity(), 3 * g);
            assert_eq!(evicted.host_bytes().len(), 2 * g);
            let words: Vec<u32> = evicted
                .host_bytes()
                .chunks_exact(4)
                .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
                .collect();
            assert_eq!(words, data, "round {round}: the evicted bytes");
            assert_eq!(
                ctx.memory_info().unwrap().0,
                free_mapped + 2 * g,
                "round {round}: free memory rises by the evicted pages"
            );
            host = buffer.restore_host(evicted).unwrap();
            assert_eq!(
                host.as_ptr(),
                at,
                "round {round}: the same pinned memory back"
            );
            assert!(
                host[2 * g..].iter().all(|&b| b == 0xa5),
                "round {round}: the tail"
            );
            assert_eq!(ctx.memory_info().unwrap().0, free_mapped, "round {round}");
        }
        assert_eq!(
            buffer
                .slice_bytes::<u32>(..2 * g)
                .unwrap()
                .to_vec()
                .unwrap(),
            data
        );
    }
    assert_eq!(settled_free(&ctx, free_before), free_before, "leak");
}

/// Exportable pages are checked once, at construction; a page mapped into an exportable buffer from
/// elsewhere is refused at export; an import of a description this process cannot honour is
/// refused before any import, with nothing left mapped.
#[test]
fn exportable_options_and_imports_are_checked() {
    const TEST: &str = "exportable_options_and_imports_are_checked";
    if child_role().is_some() {
        return;
    }
    let _serial = serial();
    let Some((device, ctx)) = shareable_gpu_or_skip(TEST) else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    warm_up(device, g);
    let (free_before, _) = ctx.memory_info().unwrap();
    {
        // A plain buffer has no `export` (ui-tests/owned/plain_buffer_exported.rs); an exportable
        // one needs options with a POSIX-fd handle kind.
        assert!(matches!(
            ExportableBuffer::with_options(2 * g, &[device], ReadWrite, PageOptions::new()),
            Err(Error::InvalidArgument { .. })
        ));
        // A page of memory made without a handle kind, mapped in as a shared page, is refused
        // before any driver call, named, with nothing exported.
        let mixed = ExportableBuffer::new(4 * g, &[device], ReadWrite).unwrap();
        mixed.grow(device, g).unwrap();
        let plain_page = SharedPage::new(device, g).unwrap();
        mixed.map_shared(2 * g, &plain_page).unwrap();
        match mixed.export() {
            Err(Error::PageRange { start, end, .. }) => assert_eq!((start, end), (2 * g, 3 * g)),
            other => panic!("an export of a plain page: {other:?}"),
        }
        drop((mixed, plain_page));
        // An empty exportable buffer has nothing to export.
        let empty = ExportableBuffer::new(2 * g, &[device], ReadWrite).unwrap();
        assert!(matches!(empty.export(), Err(Error::ZeroSize { .. })));
        // A description naming a device this process does not have.
        let buffer = five_piece_buffer(device, g);
        let (fds, info) = buffer.export().unwrap().into_parts();
        let count = Device::count().unwrap();
        let pieces = info
            .pieces()
            .iter()
            .map(|p| cuda_vmm::ipc::BufferPiece::new(p.offset(), p.size(), count, p.granularity()))
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let wrong = cuda_vmm::ipc::BufferInfo::new(info.budget(), pieces).unwrap();
        let exported = ExportedBuffer::from_parts(fds, wrong).unwrap();
        assert!(matches!(
            VirtualBuffer::import(&exported, &[device], ReadWrite),
            Err(Error::NoSuchDevice { .. })
        ));
        // Nothing was imported or changed.
        check_pieces(&buffer, g, 1, |_| true);
    }
    assert_eq!(settled_free(&ctx, free_before), free_before, "leak");
}
