//! Exact leak accounting: VMM memory is accounted to the byte in `cuMemGetInfo`, so every lifecycle
//! (a buffer's reserve and its worker thread among them), including the failing ones, must leave the
//! free memory exactly where it was. Tests that run at the same time would move the free-memory
//! figure, so the tests here take a lock, and nothing else runs in this process.

mod common;

use cuda_vmm::owned::ReserveOptions;
use cuda_vmm::{
    Context, Device, DeviceBuffer, DriverError, Error, Granularity, PeerAccess, PhysicalAllocation,
    ReadOnly, ReadWrite, VirtualBuffer, VirtualReservation, align_size, allocation_granularity,
    peer::can_access_peer,
};

// The driver's own symbol with an integer result, for what the safe API cannot (and must not) do.
unsafe extern "C" {
    fn cuMemUnmap(ptr: u64, size: usize) -> u32;
}

fn lifecycle(ctx: &Context, g: usize, round: u32) -> Result<(), Error> {
    let device = ctx.device();
    let a = PhysicalAllocation::new(device, g)?;
    let b = PhysicalAllocation::new(device, g)?;
    let mut reservation = VirtualReservation::new(3 * g, 0)?;
    let (mut left, mut right) = reservation.region().split_at(g)?;
    let mut both = right.map_all(&[&a, &b])?;
    let mut alias = left.map(&a)?;
    let mut rw = both.grant(ctx, ReadWrite)?;
    let data = common::pattern(64, round);
    rw.slice_mut::<u32>()?
        .slice_mut(..64)?
        .copy_from_host(&data)?;
    let ro = alias.grant(ctx, ReadOnly)?;
    assert_eq!(ro.slice::<u32>()?.slice(..64)?.to_vec()?, data);
    let buffer = DeviceBuffer::from_host(ctx, &data)?;
    assert_eq!(buffer.as_slice().to_vec()?, data);
    // A buffer with a reserve: its worker thread, the pages it makes ahead, the page a grow takes
    // from it (or makes, where the worker is not there yet), given back by a trim or the drop.
    let mut kv = VirtualBuffer::new(4 * g, &[device], ReadWrite)?;
    kv.reserve_ahead(ReserveOptions::new(device, g, 2))?;
    let at = kv.grow(device, g)?;
    kv.slice_bytes_mut::<u32>(at..at + 256)?
        .copy_from_host(&data)?;
    assert_eq!(kv.slice_bytes::<u32>(at..at + 256)?.to_vec()?, data);
    if round.is_multiple_of(2) {
        kv.trim()?;
    }
    Ok(())
}

/// Every failure the safe API can meet halfway through a lifecycle; each must leave nothing behind and
/// the process working.
fn failures(ctx: &Context, g: usize) {
    let device = ctx.device();
    // Out of memory.
    let huge = align_size(1 << 50, g).unwrap();
    let e = PhysicalAllocation::new(device, huge).unwrap_err();
    assert_eq!(e.driver(), Some(DriverError::OUT_OF_MEMORY), "{e}");
    assert_eq!(
        DeviceBuffer::<u8>::zeroed(ctx, 1 << 50)
            .unwrap_err()
            .driver(),
        Some(DriverError::OUT_OF_MEMORY)
    );
    // Unaligned size and offset, an invalid device.
    assert!(matches!(
        PhysicalAllocation::new(device, g + 1),
        Err(Error::NotAligned { .. })
    ));
    let count = Device::count().unwrap();
    assert_eq!(
        Device::get(count).unwrap_err(),
        Error::NoSuchDevice {
            ordinal: count,
            count
        }
    );
    let memory = PhysicalAllocation::new(device, g).unwrap();
    let mut small = VirtualReservation::new(2 * g, 0).unwrap();
    // A reservation at an address already taken lands elsewhere or is refused.
    if let Ok(other) = VirtualReservation::with_address_hint(g, 0, small.base()) {
        assert_ne!(other.base(), small.base());
    }
    let mut region = small.region();
    region.skip(g / 2).unwrap();
    assert!(matches!(region.map(&memory), Err(Error::NotAligned { .. })));
    region.skip(g / 2).unwrap();
    // A copy past the end of a view, after mapping and granting succeeded.
    let mut mapping = region.map(&memory).unwrap();
    let mut access = mapping.grant(ctx, ReadWrite).unwrap();
    let mut view = access.slice_mut::<u8>().unwrap();
    assert!(matches!(
        view.slice_mut(g - 8..g + 8),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        view.copy_from_host(&vec![0; g + 1]),
        Err(Error::LengthMismatch { .. })
    ));
    view.copy_from_host(&vec![9; g]).unwrap();
    drop(mapping);

    // A `map_all` refused halfway: the first allocation maps, the second meets a range that a
    // forgotten mapping still covers (the driver refuses), and the first is unmapped again.
    let mut halves = VirtualReservation::new(2 * g, 0).unwrap();
    let back = halves.base() + g as u64;
    let (_, mut second_half) = halves.region().split_at(g).unwrap();
    core::mem::forget(second_half.map(&memory).unwrap());
    let e = halves.region().map_all(&[&memory, &memory]).unwrap_err();
    assert_eq!(e.driver(), Some(DriverError::INVALID_VALUE), "{e}");
    // The first half was given back: it maps again (the driver would refuse a mapped range).
    let (mut first_half, _) = halves.region().split_at(g).unwrap();
    first_half.map(&memory).unwrap().unmap().unwrap();
    // SAFETY: `[back, back + g)` is the forgotten mapping, unmapped once here; nothing uses it.
    assert_eq!(unsafe { cuMemUnmap(back, g) }, 0);
}

/// The tests of this file measure free memory; they must not run at the same time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The serialisation lock, taken before any context is made and released after the test's contexts
/// (declared after it, dropped before it): a context made or released while another test measures
/// moves free memory and takes or gives back address space.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[test]
fn lifecycles_and_failures_leak_nothing() {
    let _serial = serial();
    let Some((device, ctx)) = common::gpu_or_skip("lifecycles_and_failures_leak_nothing") else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    // Warm up: the first calls may set up driver bookkeeping that stays for the process's lifetime.
    lifecycle(&ctx, g, 0).unwrap();
    failures(&ctx, g);
    // A range to find again at the end: the driver honours a hint at a free range, so if every
    // reservation of the rounds was freed, a hint at the probe's range is honoured again. What it
    // proves: the rounds gave back the address space they reserved. It holds only while nothing else
    // in this process takes address space meanwhile: the other test here makes contexts (a context
    // takes address space), so the two are serialised from before their first context to after their
    // last.
    let probe = VirtualReservation::new(8 * g, 0).unwrap();
    let probe_base = probe.base();
    probe.free().unwrap();
    let (free_before, total) = ctx.memory_info().unwrap();

    let rounds = 10_000;
    for round in 1..=rounds {
        lifecycle(&ctx, g, round).unwrap();
        if round % 10 == 0 {
            failures(&ctx, g);
        }
    }
    let (free_after, _) = ctx.memory_info().unwrap();
    println!("{rounds} rounds: free before {free_before}, after {free_after} of {total}");
    assert_eq!(
        free_after,
        free_before,
        "device memory leaked: {} bytes",
        free_before.abs_diff(free_after)
    );

    let again = VirtualReservation::with_address_hint(8 * g, 0, probe_base).unwrap();
    assert_eq!(
        again.base(),
        probe_base,
        "the address space of the rounds was not all given back"
    );
    drop(again);

    // The accounting is tight enough to see one allocation.
    let memory = PhysicalAllocation::new(device, 4 * g).unwrap();
    let (free_held, _) = ctx.memory_info().unwrap();
    drop(memory);
    let (free_released, _) = ctx.memory_info().unwrap();
    assert_eq!(free_released - free_held, 4 * g);
}

/// Peer guards enabled and ended many times, over every linked pair, leave every device's free memory
/// where it was. Needs two GPUs with a peer link; skips visibly otherwise.
#[test]
fn peer_guards_leak_nothing() {
    let _serial = serial();
    let Some(gpus) = common::gpus_or_skip("peer_guards_leak_nothing", 2) else {
        return;
    };
    let before: Vec<usize> = gpus
        .iter()
        .map(|(_, c)| c.memory_info().unwrap().0)
        .collect();
    let mut cycles = 0;
    for (i, (a, from)) in gpus.iter().enumerate() {
        for (j, (b, to)) in gpus.iter().enumerate() {
            let Some(link) = (i != j).then(|| can_access_peer(*a, *b).unwrap()).flatten() else {
                continue;
            };
            for _ in 0..10_000 / gpus.len() {
                let first = PeerAccess::enable(from, to, link).unwrap();
                let second = PeerAccess::enable(from, to, link).unwrap();
                drop(first);
                second.disable().unwrap();
                cycles += 1;
            }
            // The last guard really disabled the direction: the driver finds nothing to disable.
            let code = common::raw_disable_peer(from, to);
            assert_eq!(
                code,
                DriverError::PEER_ACCESS_NOT_ENABLED.code(),
                "{i} -> {j}: {}",
                common::code_name(code)
            );
        }
    }
    if cycles == 0 {
        common::skip("SKIPPED peer_guards_leak_nothing: no pair of devices has a peer link");
        return;
    }
    let after: Vec<usize> = gpus
        .iter()
        .map(|(_, c)| c.memory_info().unwrap().0)
        .collect();
    println!("{cycles} guard cycles: free before {before:?}, after {after:?}");
    assert_eq!(after, before, "peer guards leaked device memory");
}
