//! Shared pages and joined views against a real driver: one `SharedPage` mapped into the
//! reservations of three sequences, read-only in each, written once through a read-write mapping and
//! read identically through all three, and released only with its last mapping; a kernel's write
//! through a read-only mapping of it, in a child process (a sticky fault); one view over three
//! adjacent granted mappings, copied in and out across their boundaries; and the refusals of
//! `map_shared` and of the joined views, made before any driver call. Every test skips visibly
//! without a GPU (the access-set refusal also with fewer than two).
//!
//! The tests measure free device memory; they take one lock each, from before their first context
//! to after their last, as `tests/owned.rs` does. The child of the fault test is this binary run
//! again (`current_exe()` with `<test name> --exact --nocapture`, the role in
//! `CUDA_VMM_SHARED_PAGES_CHILD`), so that the fault's sticky error dies with its process.

mod common;

use std::process::{Command, Stdio};

use common::{gpu_or_skip, gpus_or_skip, pattern};
use cuda_vmm::owned::{GrantedMapping, SharedPage, SharedReservation, Unmapped};
use cuda_vmm::{
    Context, Device, DriverError, Error, Granularity, PhysicalAllocation, ReadOnly, ReadWrite,
    allocation_granularity,
};

/// The child's role, in the child of the fault test.
const CHILD: &str = "CUDA_VMM_SHARED_PAGES_CHILD";

/// The tests of this file measure free memory; they must not run at the same time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn granularity(device: Device) -> usize {
    allocation_granularity(device, Granularity::Minimum).unwrap()
}

fn free_memory(ctx: &Context) -> usize {
    ctx.memory_info().unwrap().0
}

/// Maps, writes, reads and releases one shared page: the first calls of a process may set up driver
/// bookkeeping that stays for the process's lifetime, so tests measure free memory after this.
fn warm_up(device: Device) {
    let g = granularity(device);
    let page = SharedPage::new(device, g).unwrap();
    let reservation = SharedReservation::new(g, 0).unwrap();
    let mut mapping = reservation
        .map_shared(0, &page)
        .unwrap()
        .keep_grant(&[device], ReadWrite)
        .unwrap();
    mapping
        .slice_mut::<u32>()
        .unwrap()
        .copy_from_host(&pattern(g / 4, 0))
        .unwrap();
    assert_eq!(
        mapping.slice::<u32>().unwrap().to_vec().unwrap().len(),
        g / 4
    );
}

/// The words a read-only mapping holds.
fn read<M: cuda_vmm::vmm::AccessMode>(mapping: &GrantedMapping<M>) -> Vec<u32> {
    mapping.slice::<u32>().unwrap().to_vec().unwrap()
}

/// One sequence: the shared prefix, mapped read-only into its reservation, and its own page,
/// read-write, right after it.
struct Sequence {
    prefix: GrantedMapping<ReadOnly>,
    own: GrantedMapping<ReadWrite>,
    seed: u32,
}

/// A prefix page shared by three sequences (two in one reservation, the page mapped there twice;
/// the third in another), read-only in each, each with its own read-write page. Bytes written once
/// through a fourth, read-write mapping of the page are read identically through all three
/// read-only mappings, at four distinct addresses, and a second write is seen by all three (the
/// same memory, not copies); the sequences' own writes leave the prefix alone. The memory stays
/// while any mapping does: with every handle and all but one mapping gone, the last reads the bytes
/// and free memory is still short of the page; the last unmap gives back the last share, whose
/// release frees it, and free memory is back to the byte.
#[test]
fn a_prefix_page_shared_by_three_sequences() {
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("a_prefix_page_shared_by_three_sequences") else {
        return;
    };
    let g = granularity(device);
    let words = g / 4;
    warm_up(device);
    let free_before = free_memory(&ctx);

    let prefix = SharedPage::new(device, g).unwrap();
    assert_eq!((prefix.size(), prefix.device()), (g, Some(device)));
    let writer_reservation = SharedReservation::new(g, 0).unwrap();
    let mut writer = writer_reservation
        .map_shared(0, &prefix)
        .unwrap()
        .keep_grant(&[device], ReadWrite)
        .unwrap();
    writer
        .slice_mut::<u32>()
        .unwrap()
        .copy_from_host(&pattern(words, 1))
        .unwrap();

    let two = SharedReservation::new(4 * g, 0).unwrap();
    let one = SharedReservation::new(2 * g, 0).unwrap();
    let mut sequences = three_sequences(&prefix, &two, &one, device);
    read_and_write(&mut sequences, &mut writer, words);

    // The handle and the writer go; then two of the sequences: the last one still reads the page.
    drop((prefix, writer, writer_reservation));
    let last = sequences.pop().unwrap();
    assert_eq!(
        last.prefix.mapping().shared_page().unwrap().share_count(),
        3
    );
    assert!(
        free_memory(&ctx) <= free_before - 4 * g,
        "the prefix and three own pages are held"
    );
    drop(sequences);
    assert_eq!(
        last.prefix.mapping().shared_page().unwrap().share_count(),
        1
    );
    assert!(two.mapped().is_empty());
    let Sequence { prefix, own, seed } = last;
    drop(own);
    assert!(
        read(&prefix) == pattern(words, 2),
        "the last mapping reads the prefix"
    );
    assert!(
        free_memory(&ctx) <= free_before - g,
        "the prefix is held by its last mapping (sequence {seed})"
    );

    // The last unmap gives back the last share; its release frees the memory.
    let Unmapped::Shared(share) = prefix.revoke().unwrap().unmap().unwrap() else {
        panic!("a mapping made by `map_shared` gives its share back");
    };
    assert_eq!(share.share_count(), 1);
    assert!(one.mapped().is_empty());
    assert!(
        share.release().unwrap(),
        "the last share releases the memory"
    );
    drop((one, two));
    assert_eq!(
        free_memory(&ctx),
        free_before,
        "every page released, to the byte"
    );
}

/// Three sequences sharing `prefix`: two in `two` (the page mapped there twice), one in `one`; each
/// sequence's own page right after its prefix.
fn three_sequences(
    prefix: &SharedPage,
    two: &SharedReservation,
    one: &SharedReservation,
    device: Device,
) -> Vec<Sequence> {
    let g = prefix.size();
    let sequences: Vec<Sequence> = [(two, 0), (two, 2 * g), (one, 0)]
        .into_iter()
        .zip(10u32..)
        .map(|((reservation, offset), seed)| Sequence {
            prefix: reservation
                .map_shared(offset, prefix)
                .unwrap()
                .keep_grant(&[device], ReadOnly)
                .unwrap(),
            own: reservation
                .map(offset + g, PhysicalAllocation::new(device, g).unwrap())
                .unwrap()
                .keep_grant(&[device], ReadWrite)
                .unwrap(),
            seed,
        })
        .collect();
    assert_eq!(
        prefix.share_count(),
        5,
        "the handle, the writer and three readers"
    );
    assert_eq!(two.mapped(), [0..g, g..2 * g, 2 * g..3 * g, 3 * g..4 * g]);
    assert!(
        sequences
            .iter()
            .all(|s| s.prefix.mapping().shared_page().is_some())
    );
    assert!(
        sequences
            .iter()
            .all(|s| s.own.mapping().shared_page().is_none())
    );

    sequences
}

/// The reads and writes of [`a_prefix_page_shared_by_three_sequences`], with the prefix written
/// once (seed 1) through `writer`: the four mappings of the page have four addresses, every
/// sequence reads the prefix, writes its own page and reads both back, and a second write through
/// `writer` (seed 2) is read through every sequence.
fn read_and_write(
    sequences: &mut [Sequence],
    writer: &mut GrantedMapping<ReadWrite>,
    words: usize,
) {
    let mut addresses: Vec<u64> = sequences
        .iter()
        .map(|s| s.prefix.slice::<u8>().unwrap().as_raw_ptr())
        .chain([writer.slice::<u8>().unwrap().as_raw_ptr()])
        .collect();
    addresses.sort_unstable();
    addresses.dedup();
    assert_eq!(addresses.len(), 4, "four mappings, four addresses");

    for sequence in sequences.iter_mut() {
        assert!(
            read(&sequence.prefix) == pattern(words, 1),
            "sequence {} reads the prefix",
            sequence.seed
        );
        sequence
            .own
            .slice_mut::<u32>()
            .unwrap()
            .copy_from_host(&pattern(words, sequence.seed))
            .unwrap();
    }
    for sequence in sequences.iter() {
        assert!(
            read(&sequence.own) == pattern(words, sequence.seed),
            "sequence {}'s own page",
            sequence.seed
        );
        assert!(
            read(&sequence.prefix) == pattern(words, 1),
            "sequence {}: its own write left the prefix alone",
            sequence.seed
        );
    }
    // A second write through the writer is seen through every reader: one memory.
    writer
        .slice_mut::<u32>()
        .unwrap()
        .copy_from_host(&pattern(words, 2))
        .unwrap();
    for sequence in sequences.iter() {
        assert!(
            read(&sequence.prefix) == pattern(words, 2),
            "sequence {} sees the new prefix",
            sequence.seed
        );
    }
}

/// A kernel that writes through a read-only mapping of a shared page faults: shown in a child
/// process, because the fault is a sticky error that spoils the child's context. The child first
/// launches the same kernel with the read-only mapping as its source and a read-write mapping of
/// the same page as its destination (which works, and is read back through the read-only one), then
/// with the two swapped, and prints each launch's result. The parent asserts that the child ran
/// to its end, that the first launch worked, and that the second returned
/// `CUDA_ERROR_ILLEGAL_ADDRESS` (700).
#[test]
fn a_kernel_writing_through_a_read_only_mapping_faults() {
    const TEST: &str = "a_kernel_writing_through_a_read_only_mapping_faults";
    if let Ok(role) = std::env::var(CHILD) {
        assert_eq!(role, "write", "{TEST}: an unknown child role");
        return write_child(TEST);
    }
    let _serial = serial();
    if gpu_or_skip(TEST).is_none() {
        return;
    }
    let output = Command::new(std::env::current_exe().unwrap())
        .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "write")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{TEST}: running the child: {e}"));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    println!(
        "{TEST}: the child ended with {:?}\n--- its stdout:\n{stdout}\n--- its stderr:\n{stderr}",
        output.status
    );
    assert!(
        output.status.success(),
        "the child did not run to its end: {:?}",
        output.status
    );
    assert!(
        stdout.contains(&format!(
            "{TEST} (child): the launch writing through the read-write mapping: 0"
        )),
        "the control launch did not work"
    );
    let faulted = format!(
        "{TEST} (child): the launch writing through the read-only mapping: {}",
        DriverError::ILLEGAL_ADDRESS.code()
    );
    assert!(
        stdout.contains(&faulted),
        "the write through the read-only mapping did not fail with CUDA_ERROR_ILLEGAL_ADDRESS"
    );
}

/// The child of [`a_kernel_writing_through_a_read_only_mapping_faults`]: it prints the result code
/// of each launch (0 for success), then exits without tearing down its spoiled context.
fn write_child(test: &str) {
    use std::io::Write;
    let (device, ctx) = gpu_or_skip(test).expect("the child sees the parent's GPU");
    let g = granularity(device);
    let n = g / 4;
    let page = SharedPage::new(device, g).unwrap();
    let reservation = SharedReservation::new(2 * g, 0).unwrap();
    let mut writer = reservation
        .map_shared(0, &page)
        .unwrap()
        .keep_grant(&[device], ReadWrite)
        .unwrap();
    let reader = reservation
        .map_shared(g, &page)
        .unwrap()
        .keep_grant(&[device], ReadOnly)
        .unwrap();
    writer
        .slice_mut::<u32>()
        .unwrap()
        .copy_from_host(&pattern(n, 5))
        .unwrap();
    let rw = writer.slice_mut::<u32>().unwrap().as_raw_ptr();
    let ro = reader.slice::<u32>().unwrap().as_raw_ptr();
    let code = |result: Result<(), Error>| match result {
        Ok(()) => 0,
        Err(e) => e.driver().map_or(u32::MAX, DriverError::code),
    };

    // SAFETY: both addresses are `n` words of one page, mapped and granted to `ctx`'s device while
    // `writer` and `reader` live (past the launch, which waits for the kernel); the kernel writes
    // through the read-write mapping only. Each thread reads its word before writing it.
    let control = unsafe { common::add_one(&ctx, rw, ro, n) };
    println!(
        "{test} (child): the launch writing through the read-write mapping: {} ({control:?})",
        code(control.clone())
    );
    let expected: Vec<u32> = pattern(n, 5).iter().map(|x| x.wrapping_add(1)).collect();
    assert!(
        read(&reader) == expected,
        "the read-only mapping reads the kernel's write"
    );

    // SAFETY: as above, but the kernel writes through the read-only mapping: what is tested is that
    // the device refuses the write (a fault, in this process only); both ranges stay mapped and
    // nothing else uses them until the launch's wait returns.
    let faulted = unsafe { common::add_one(&ctx, ro, rw, n) };
    println!(
        "{test} (child): the launch writing through the read-only mapping: {} ({faulted:?})",
        code(faulted.clone())
    );
    let _ = std::io::stdout().flush();
    // The context's error is sticky: nothing more can be asked of it, and the process's end frees
    // everything.
    std::process::exit(0);
}

/// One view over three adjacent granted mappings (the first of them a shared page, also mapped in
/// another reservation): one copy in across both boundaries lands a third in each mapping (and the
/// first third in the page's other mapping), one copy out reads it all back, a sub-view across a
/// boundary and a view of two of the three read their parts, and a kernel over the joined writable
/// view reaches every word. Free memory is back to the byte.
#[test]
fn a_joined_view_spans_three_mappings() {
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("a_joined_view_spans_three_mappings") else {
        return;
    };
    let g = granularity(device);
    let words = g / 4;
    warm_up(device);
    let free_before = free_memory(&ctx);
    {
        let page = SharedPage::new(device, g).unwrap();
        let elsewhere = SharedReservation::new(g, 0).unwrap();
        let other = elsewhere
            .map_shared(0, &page)
            .unwrap()
            .keep_grant(&[device], ReadOnly)
            .unwrap();
        let reservation = SharedReservation::new(4 * g, 0).unwrap();
        let mut mappings: Vec<GrantedMapping> = vec![
            reservation.map_shared(0, &page).unwrap(),
            reservation
                .map(g, PhysicalAllocation::new(device, g).unwrap())
                .unwrap(),
            reservation
                .map(2 * g, PhysicalAllocation::new(device, g).unwrap())
                .unwrap(),
        ]
        .into_iter()
        .map(|m| m.keep_grant(&[device], ReadWrite).unwrap())
        .collect();

        let data = pattern(3 * words, 42);
        let mut joined = GrantedMapping::slice_joined_mut::<u32>(&mut mappings).unwrap();
        assert_eq!(joined.len(), 3 * words);
        assert_eq!(joined.as_raw_ptr(), reservation.base());
        joined.copy_from_host(&data).unwrap();
        for (i, mapping) in mappings.iter().enumerate() {
            assert!(
                read(mapping) == data[i * words..(i + 1) * words],
                "mapping {i} holds its third"
            );
        }
        assert!(
            read(&other) == data[..words],
            "the page's other mapping holds the first third"
        );

        let all = GrantedMapping::slice_joined::<u32>(&mappings).unwrap();
        assert!(
            all.to_vec().unwrap() == data,
            "one copy out across both boundaries"
        );
        let across = all.slice(words - 4..2 * words + 4).unwrap();
        assert!(across.to_vec().unwrap() == data[words - 4..2 * words + 4]);
        let tail = GrantedMapping::slice_joined::<u32>(&mappings[1..]).unwrap();
        assert!(tail.to_vec().unwrap() == data[words..]);
        let bytes = GrantedMapping::slice_joined::<u8>([&mappings[0], &mappings[1]]).unwrap();
        assert_eq!(bytes.len(), 2 * g);

        // A kernel over the whole joined range: every word, in every mapping, is incremented.
        let joined = GrantedMapping::slice_joined_mut::<u32>(mappings.iter_mut()).unwrap();
        let ptr = joined.as_raw_ptr();
        // SAFETY: `[ptr, ptr + 3 * g)` is the joined view's range, mapped and granted read-write to
        // `ctx`'s device while `joined` borrows the mappings (past the launch, which waits for the
        // kernel); each thread reads its word before writing it.
        unsafe { common::add_one(&ctx, ptr, ptr, 3 * words) }.unwrap();
        let incremented: Vec<u32> = data.iter().map(|x| x.wrapping_add(1)).collect();
        assert!(
            joined.as_slice().to_vec().unwrap() == incremented,
            "the kernel reached every word"
        );
        assert!(read(&other) == incremented[..words]);
        drop((mappings, other, page));
    }
    assert_eq!(
        free_memory(&ctx),
        free_before,
        "every page released, to the byte"
    );
}

/// The refusals of `map_shared`, each made before any driver call: the page over its own mapping,
/// over another mapping, at a misaligned offset, past the end. Each names the bytes at fault and
/// leaves the reservation's record and the page's share count as they were; the page mapped twice
/// into one reservation at ranges that do not overlap is accepted. Free memory is back to the byte.
#[test]
fn map_shared_refuses_before_the_driver() {
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("map_shared_refuses_before_the_driver") else {
        return;
    };
    let g = granularity(device);
    warm_up(device);
    let free_before = free_memory(&ctx);
    {
        let page = SharedPage::new(device, g).unwrap();
        let reservation = SharedReservation::new(4 * g, 0).unwrap();
        let first = reservation.map_shared(0, &page).unwrap();
        let own = reservation
            .map(g, PhysicalAllocation::new(device, g).unwrap())
            .unwrap();
        let (mapped, shares) = (reservation.mapped(), page.share_count());
        assert_eq!(shares, 2);

        assert_eq!(
            reservation.map_shared(0, &page).unwrap_err(),
            Error::PageRange {
                start: 0,
                end: g,
                problem: "are mapped already"
            }
        );
        assert_eq!(
            reservation.map_shared(g, &page).unwrap_err(),
            Error::PageRange {
                start: g,
                end: 2 * g,
                problem: "are mapped already"
            }
        );
        assert!(matches!(
            reservation.map_shared(g / 2, &page),
            Err(Error::NotAligned {
                what: "mapping offset",
                ..
            })
        ));
        assert_eq!(
            reservation.map_shared(4 * g, &page).unwrap_err(),
            Error::OutOfBounds {
                what: "reservation",
                start: 4 * g,
                end: 5 * g,
                len: 4 * g
            }
        );
        assert_eq!(reservation.mapped(), mapped, "nothing recorded");
        assert_eq!(page.share_count(), shares, "no share kept");

        let second = reservation.map_shared(3 * g, &page).unwrap();
        assert_eq!(page.share_count(), 3);
        assert_eq!(second.memory().as_raw(), first.memory().as_raw());
        drop((first, own, second, page));
        assert!(reservation.mapped().is_empty());
    }
    assert_eq!(
        free_memory(&ctx),
        free_before,
        "every page released, to the byte"
    );
}

/// The refusals of the joined views, each made before any driver call and naming the bytes at
/// fault: no mappings, a gap, the wrong order, one mapping twice, another reservation, a joined size
/// that is no whole number of elements, a gap in a writable join. The join of adjacent mappings is
/// accepted after them.
#[test]
fn joined_views_refuse_before_the_driver() {
    let _serial = serial();
    let Some((device, _ctx)) = gpu_or_skip("joined_views_refuse_before_the_driver") else {
        return;
    };
    let g = granularity(device);
    let page = SharedPage::new(device, g).unwrap();
    let reservation = SharedReservation::new(4 * g, 0).unwrap();
    let other = SharedReservation::new(2 * g, 0).unwrap();
    let granted = |reservation: &SharedReservation, offset: usize| {
        reservation
            .map(offset, PhysicalAllocation::new(device, g).unwrap())
            .unwrap()
            .keep_grant(&[device], ReadWrite)
            .unwrap()
    };
    // front (0..g, the shared page), middle (g..2g), back (3g..4g), and one in another reservation.
    let front = reservation
        .map_shared(0, &page)
        .unwrap()
        .keep_grant(&[device], ReadWrite)
        .unwrap();
    let mut middle = granted(&reservation, g);
    let mut back = granted(&reservation, 3 * g);
    let foreign = granted(&other, g);

    assert_eq!(
        GrantedMapping::slice_joined::<u32>(Vec::<&GrantedMapping>::new()).unwrap_err(),
        Error::ZeroSize {
            what: "list of mappings to join"
        }
    );
    let refusal = |result: Result<cuda_vmm::DeviceSlice<'_, u32>, Error>| match result {
        Err(Error::PageRange {
            start,
            end,
            problem,
        }) => (start, end, problem),
        other => panic!("expected a refusal naming the bytes, got {other:?}"),
    };
    let (start, end, problem) = refusal(GrantedMapping::slice_joined([&front, &middle, &back]));
    assert_eq!((start, end), (2 * g, 3 * g), "the gap: {problem}");
    assert!(problem.contains("gap"));
    let (start, end, problem) = refusal(GrantedMapping::slice_joined([&middle, &front]));
    assert_eq!((start, end), (0, g), "out of order: {problem}");
    assert!(problem.contains("out of order"));
    let (start, end, problem) = refusal(GrantedMapping::slice_joined([&front, &front]));
    assert_eq!((start, end), (0, g), "twice: {problem}");
    let (start, end, problem) = refusal(GrantedMapping::slice_joined([&front, &foreign]));
    assert_eq!((start, end), (g, 2 * g), "another reservation: {problem}");
    assert!(problem.contains("another reservation"));
    assert!(matches!(
        GrantedMapping::slice_joined::<[u8; 3]>([&front, &middle]),
        Err(Error::NotWholeElements { bytes, element_size: 3 }) if bytes == 2 * g
    ));
    assert!(matches!(
        GrantedMapping::slice_joined_mut::<u32>([&mut middle, &mut back]),
        Err(Error::PageRange { start, end, .. }) if (start, end) == (2 * g, 3 * g)
    ));
    // The accepted join, after every refusal.
    let joined = GrantedMapping::slice_joined::<u32>([&front, &middle]).unwrap();
    assert_eq!(joined.len(), 2 * g / 4);
    assert_eq!(joined.as_raw_ptr(), reservation.base());
}

/// Two GPUs: a joined view refuses a mapping granted to another set of devices than the first
/// mapping's (naming its bytes), and accepts the same set named in another order. Skips with fewer
/// than two GPUs, or where the second cannot reach the first's memory.
#[test]
fn joined_views_refuse_another_access_set() {
    const TEST: &str = "joined_views_refuse_another_access_set";
    let _serial = serial();
    let Some(gpus) = gpus_or_skip(TEST, 2) else {
        return;
    };
    let (d0, d1) = (gpus[0].0, gpus[1].0);
    if cuda_vmm::peer::can_access_peer(d1, d0).unwrap().is_none() {
        common::skip(&format!(
            "SKIPPED {TEST}: {d1:?} cannot reach {d0:?}'s memory"
        ));
        return;
    }
    let g = granularity(d0);
    let reservation = SharedReservation::new(3 * g, 0).unwrap();
    let map = |offset: usize, devices: &[Device]| {
        reservation
            .map(offset, PhysicalAllocation::new(d0, g).unwrap())
            .unwrap()
            .keep_grant(devices, ReadOnly)
            .unwrap()
    };
    let (a, b, c) = (map(0, &[d0, d1]), map(g, &[d0]), map(2 * g, &[d1, d0]));
    assert!(matches!(
        GrantedMapping::slice_joined::<u32>([&a, &b]),
        Err(Error::PageRange { start, end, problem }) if (start, end) == (g, 2 * g) && problem.contains("other devices")
    ));
    assert!(matches!(
        GrantedMapping::slice_joined::<u32>([&b, &c]),
        Err(Error::PageRange { start, end, .. }) if (start, end) == (2 * g, 3 * g)
    ));
    drop(b);
    let reordered = map(g, &[d1, d0]);
    let joined = GrantedMapping::slice_joined::<u32>([&a, &reordered, &c]).unwrap();
    assert!(
        joined.reachable_from(d1),
        "the joined view carries the access set"
    );
    assert_eq!(joined.to_vec().unwrap().len(), 3 * g / 4);
}
