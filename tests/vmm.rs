//! The single-GPU VMM lifecycle against a real driver. Every test skips visibly without a GPU.

mod common;

use common::{gpu_or_skip, pattern};
use cuda_vmm::{
    DeviceBuffer, DriverError, Error, Granularity, PhysicalAllocation, ReadOnly, ReadWrite,
    VirtualReservation, align_size, allocation_granularity,
};

#[test]
fn granularity_is_a_power_of_two_and_sizes_round_up_to_it() {
    let Some((device, _ctx)) =
        gpu_or_skip("granularity_is_a_power_of_two_and_sizes_round_up_to_it")
    else {
        return;
    };
    let min = allocation_granularity(device, Granularity::Minimum).unwrap();
    let rec = allocation_granularity(device, Granularity::Recommended).unwrap();
    println!("{device:?}: minimum granularity {min}, recommended {rec}");
    assert!(min.is_power_of_two(), "minimum granularity {min}");
    assert!(
        rec.is_power_of_two() && rec.is_multiple_of(min),
        "recommended granularity {rec}"
    );
    assert_eq!(align_size(1, min).unwrap(), min);
    assert_eq!(align_size(min, min).unwrap(), min);
    assert_eq!(align_size(min + 1, min).unwrap(), 2 * min);
    assert!(device.supports_vmm().unwrap());
    assert!(device.unified_addressing().unwrap());
    assert!(!device.name().unwrap().is_empty());
}

#[test]
fn read_write_round_trip_with_sub_slices() {
    let Some((device, ctx)) = gpu_or_skip("read_write_round_trip_with_sub_slices") else {
        return;
    };
    let size = allocation_granularity(device, Granularity::Minimum).unwrap();
    let memory = PhysicalAllocation::new(device, size).unwrap();
    let mut reservation = VirtualReservation::new(size, 0).unwrap();
    let mut region = reservation.region();
    let mut mapping = region.map(&memory).unwrap();
    assert!(region.is_empty());
    let mut access = mapping.grant(&ctx, ReadWrite).unwrap();
    assert_eq!(access.devices(), vec![device]);

    let mut view = access.slice_mut::<u32>().unwrap();
    assert_eq!(view.len(), size / 4);
    let input = pattern(view.len(), 7);
    view.copy_from_host(&input).unwrap();
    assert_eq!(view.to_vec().unwrap(), input);

    // A sub-slice writes only its own elements.
    view.slice_mut(100..200)
        .unwrap()
        .copy_from_host(&[0xdead_beef; 100])
        .unwrap();
    let mut expected = input.clone();
    expected[100..200].fill(0xdead_beef);
    assert_eq!(view.to_vec().unwrap(), expected);
    assert_eq!(
        view.as_slice().slice(150..=151).unwrap().to_vec().unwrap(),
        vec![0xdead_beef; 2]
    );

    // split_at_mut gives disjoint halves.
    let half = view.len() / 2;
    let (mut lo, hi) = view.split_at_mut(half).unwrap();
    lo.copy_from_device(&hi.as_slice()).unwrap();
    let after = lo.to_vec().unwrap();
    assert_eq!(after, expected[half..]);
}

#[test]
fn explicit_teardown_reports_success_and_returns_the_region() {
    let Some((device, ctx)) =
        gpu_or_skip("explicit_teardown_reports_success_and_returns_the_region")
    else {
        return;
    };
    let size = allocation_granularity(device, Granularity::Minimum).unwrap();
    let a = PhysicalAllocation::new(device, size).unwrap();
    let b = PhysicalAllocation::new(device, size).unwrap();
    let mut reservation = VirtualReservation::new(size, 0).unwrap();
    let base = reservation.base();
    {
        let mut region = reservation.region();
        let mut mapping = region.map(&a).unwrap();
        mapping
            .grant(&ctx, ReadWrite)
            .unwrap()
            .slice_mut::<u8>()
            .unwrap()
            .copy_from_host(&vec![1u8; size])
            .unwrap();
        // The unmapped range comes back as a region and can take other memory.
        let mut region = mapping.unmap().unwrap();
        assert_eq!((region.start(), region.len()), (base, size));
        let mut mapping = region.map(&b).unwrap();
        let mut access = mapping.grant(&ctx, ReadWrite).unwrap();
        let mut view = access.slice_mut::<u8>().unwrap();
        view.copy_from_host(&vec![2u8; size]).unwrap();
        assert_eq!(view.to_vec().unwrap(), vec![2u8; size]);
        // `a` kept its bytes: the 2s went into `b`, which is what the region held.
        let mut region = mapping.unmap().unwrap();
        let mut again = region.map(&a).unwrap();
        let first = again
            .grant(&ctx, ReadOnly)
            .unwrap()
            .slice::<u8>()
            .unwrap()
            .to_vec()
            .unwrap();
        assert_eq!(first, vec![1u8; size], "a's memory is untouched");
        again.unmap().unwrap();
    }
    reservation.free().unwrap();
    a.release().unwrap();
    b.release().unwrap();
}

#[test]
fn one_allocation_mapped_twice_is_one_memory_and_read_only_alias_reads_it() {
    let Some((device, ctx)) =
        gpu_or_skip("one_allocation_mapped_twice_is_one_memory_and_read_only_alias_reads_it")
    else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let memory = PhysicalAllocation::new(device, g).unwrap();
    // One reservation, two disjoint regions, the same memory behind both.
    let mut reservation = VirtualReservation::new(2 * g, 0).unwrap();
    let (mut first, mut second) = reservation.region().split_at(g).unwrap();
    let mut writer = first.map(&memory).unwrap();
    let mut reader = second.map(&memory).unwrap();

    let mut rw = writer.grant(&ctx, ReadWrite).unwrap();
    let ro = reader.grant(&ctx, ReadOnly).unwrap();
    assert_ne!(rw.as_raw_ptr(), ro.as_raw_ptr());

    let input = pattern(g / 4, 99);
    rw.slice_mut::<u32>()
        .unwrap()
        .copy_from_host(&input)
        .unwrap();
    assert_eq!(
        ro.slice::<u32>().unwrap().to_vec().unwrap(),
        input,
        "read through the read-only alias"
    );

    // And the other way: a second write through the writer shows through the reader.
    rw.slice_mut::<u32>()
        .unwrap()
        .slice_mut(..4)
        .unwrap()
        .copy_from_host(&[1, 2, 3, 4])
        .unwrap();
    assert_eq!(
        ro.slice::<u32>()
            .unwrap()
            .slice(..4)
            .unwrap()
            .to_vec()
            .unwrap(),
        vec![1, 2, 3, 4]
    );
}

#[test]
fn adjacent_allocations_mapped_and_granted_as_one() {
    let Some((device, ctx)) = gpu_or_skip("adjacent_allocations_mapped_and_granted_as_one") else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let a = PhysicalAllocation::new(device, g).unwrap();
    let b = PhysicalAllocation::new(device, 2 * g).unwrap();
    let mut reservation = VirtualReservation::new(4 * g, 0).unwrap();
    let mut region = reservation.region();
    region.skip(g).unwrap();
    let mut both = region.map_all(&[&a, &b]).unwrap();
    assert_eq!(both.size(), 3 * g);
    assert!(region.is_empty());
    let input = pattern(3 * g / 4, 3);
    {
        let mut access = both.grant(&ctx, ReadWrite).unwrap();
        access
            .slice_mut::<u32>()
            .unwrap()
            .copy_from_host(&input)
            .unwrap();
    }
    let region = both.unmap().unwrap();
    // `b` alone now holds the last two thirds of what was written across the boundary.
    let mut only_b = region.split_at(g).unwrap().1.map(&b).unwrap();
    let access = only_b.grant(&ctx, ReadOnly).unwrap();
    assert_eq!(
        access.slice::<u32>().unwrap().to_vec().unwrap(),
        input[g / 4..]
    );
}

#[test]
fn device_to_device_between_mappings_and_buffers() {
    let Some((device, ctx)) = gpu_or_skip("device_to_device_between_mappings_and_buffers") else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let a = PhysicalAllocation::new(device, g).unwrap();
    let b = PhysicalAllocation::new(device, g).unwrap();
    let mut ra = VirtualReservation::new(g, 0).unwrap();
    let mut rb = VirtualReservation::new(g, 0).unwrap();
    let (mut region_a, mut region_b) = (ra.region(), rb.region());
    let (mut ma, mut mb) = (region_a.map(&a).unwrap(), region_b.map(&b).unwrap());
    let mut aa = ma.grant(&ctx, ReadWrite).unwrap();
    let mut ab = mb.grant(&ctx, ReadWrite).unwrap();

    let input = pattern(g / 4, 11);
    let mut va = aa.slice_mut::<u32>().unwrap();
    va.copy_from_host(&input).unwrap();
    let mut vb = ab.slice_mut::<u32>().unwrap();
    vb.copy_from_device(&va.as_slice()).unwrap();
    assert_eq!(vb.to_vec().unwrap(), input);

    // An ordinary cuMemAlloc buffer and a mapping copy into each other.
    let mut buffer = DeviceBuffer::<u32>::zeroed(&ctx, 1000).unwrap();
    assert_eq!(buffer.as_slice().to_vec().unwrap(), vec![0; 1000]);
    buffer
        .as_mut_slice()
        .copy_from_device(&vb.as_slice().slice(5..1005).unwrap())
        .unwrap();
    assert_eq!(buffer.as_slice().to_vec().unwrap(), input[5..1005]);
    va.slice_mut(..1000)
        .unwrap()
        .copy_from_device(&buffer.as_slice())
        .unwrap();
    buffer.free().unwrap();
    assert_eq!(
        va.as_slice().slice(..1000).unwrap().to_vec().unwrap(),
        input[5..1005]
    );
}

#[test]
fn argument_errors_are_caught_before_the_driver() {
    let Some((device, ctx)) = gpu_or_skip("argument_errors_are_caught_before_the_driver") else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();

    let e = PhysicalAllocation::new(device, g + 4096).unwrap_err();
    assert_eq!(
        e,
        Error::NotAligned {
            what: "allocation size",
            value: g + 4096,
            granularity: g
        }
    );
    println!("unaligned size: {e}");
    assert_eq!(
        PhysicalAllocation::new(device, 0).unwrap_err(),
        Error::ZeroSize {
            what: "allocation size"
        }
    );
    assert_eq!(
        VirtualReservation::new(0, 0).unwrap_err(),
        Error::ZeroSize {
            what: "reservation size"
        }
    );

    let memory = PhysicalAllocation::new(device, g).unwrap();
    let mut reservation = VirtualReservation::new(2 * g, 0).unwrap();
    let (_, mut misaligned) = reservation.region().split_at(4096).unwrap();
    let e = misaligned.map(&memory).unwrap_err();
    assert!(
        matches!(e, Error::NotAligned { what: "mapping address", granularity, .. } if granularity == g),
        "{e}"
    );
    let len_before = misaligned.len();

    let mut region = reservation.region();
    region.skip(g + 1).unwrap();
    assert!(matches!(
        region.map(&memory),
        Err(Error::OutOfBounds { .. } | Error::NotAligned { .. })
    ));
    assert_eq!(len_before, 2 * g - 4096);
    let mut small = VirtualReservation::new(g, 0).unwrap();
    let mut small_region = small.region();
    let big = PhysicalAllocation::new(device, 2 * g).unwrap();
    assert!(
        matches!(small_region.map(&big), Err(Error::OutOfBounds { end, len, .. }) if end == 2 * g && len == g)
    );
    assert_eq!(
        small_region.len(),
        g,
        "a failed map leaves the region unchanged"
    );
    assert!(matches!(
        small_region.map_all(&[]),
        Err(Error::ZeroSize { .. })
    ));

    let mut mapping = small_region.map(&memory).unwrap();
    let mut access = mapping.grant(&ctx, ReadWrite).unwrap();
    assert!(matches!(
        access.slice::<[u8; 3]>(),
        Err(Error::NotWholeElements {
            element_size: 3,
            ..
        })
    ));
    // A view of a zero-sized type does not build (a const assertion in `access::elements`, shown by
    // its `compile_fail` doctest); its run-time check is unit-tested there.
    let mut view = access.slice_mut::<u8>().unwrap();
    assert_eq!(
        view.copy_from_host(&[1, 2, 3]).unwrap_err(),
        Error::LengthMismatch {
            expected: g,
            found: 3
        }
    );
    assert!(matches!(
        view.slice_mut((g - 1)..=g),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        view.as_slice().slice(core::ops::Range { start: 3, end: 2 }),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        view.as_slice().slice(..=usize::MAX),
        Err(Error::Overflow { .. })
    ));
    let mut small_host = vec![0u8; 10];
    assert!(matches!(
        view.copy_to_host(&mut small_host),
        Err(Error::LengthMismatch { .. })
    ));
}

#[test]
fn driver_errors_have_names() {
    let Some((device, ctx)) = gpu_or_skip("driver_errors_have_names") else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();

    // Out of memory: far more than any GPU has.
    let huge = align_size(1 << 50, g).unwrap();
    let e = PhysicalAllocation::new(device, huge).unwrap_err();
    println!("2^50-byte allocation: {e}");
    assert_eq!(e.driver(), Some(DriverError::OUT_OF_MEMORY));
    assert!(
        e.to_string().contains("CUDA_ERROR_OUT_OF_MEMORY (2)"),
        "the error names itself: {e}"
    );
    let e = DeviceBuffer::<u8>::zeroed(&ctx, 1 << 50).unwrap_err();
    assert_eq!(e.driver(), Some(DriverError::OUT_OF_MEMORY));

    // An ordinal the driver does not have: refused before the driver is asked.
    let count = cuda_vmm::Device::count().unwrap();
    let e = cuda_vmm::Device::get(count).unwrap_err();
    println!("device {count}: {e}");
    assert_eq!(
        e,
        Error::NoSuchDevice {
            ordinal: count,
            count
        }
    );
    assert_eq!(e.driver(), None);
    assert_eq!(
        cuda_vmm::Device::get(usize::MAX).unwrap_err(),
        Error::NoSuchDevice {
            ordinal: usize::MAX,
            count
        }
    );

    // An unknown attribute number: the driver's refusal, which names itself.
    let e = device.attribute(1_000_000).unwrap_err();
    println!("attribute 1000000: {e}");
    assert_eq!(e, Error::Driver(DriverError::INVALID_VALUE));
    let e = e.driver().unwrap();
    assert_eq!(
        (e.name(), e.description()),
        (Some("CUDA_ERROR_INVALID_VALUE"), Some("invalid argument"))
    );

    // The process keeps working afterwards.
    let memory = PhysicalAllocation::new(device, g).unwrap();
    let mut reservation = VirtualReservation::new(g, 0).unwrap();
    let mut region = reservation.region();
    let mut mapping = region.map(&memory).unwrap();
    let mut access = mapping.grant(&ctx, ReadWrite).unwrap();
    access
        .slice_mut::<u8>()
        .unwrap()
        .copy_from_host(&vec![5; g])
        .unwrap();
    ctx.synchronize().unwrap();
}

#[test]
fn address_hint_never_overlaps_a_taken_range() {
    let Some((device, _ctx)) = gpu_or_skip("address_hint_never_overlaps_a_taken_range") else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let taken = VirtualReservation::new(4 * g, 0).unwrap();
    match VirtualReservation::with_address_hint(4 * g, 0, taken.base()) {
        Ok(other) => {
            println!(
                "hint {:#x} taken; driver reserved {:#x}",
                taken.base(),
                other.base()
            );
            let (a, b) = (
                (taken.base(), taken.size() as u64),
                (other.base(), other.size() as u64),
            );
            assert!(
                a.0 + a.1 <= b.0 || b.0 + b.1 <= a.0,
                "reservations overlap: {a:x?} {b:x?}"
            );
        }
        Err(e) => println!("hint {:#x} taken; driver refused: {e}", taken.base()),
    }
    // A freed range can be asked for again. Other tests of this process reserve at the same time and
    // may take it first, so here only where it lands is shown; `tests/leaks.rs`, where nothing else
    // runs, asserts that the hint is honoured.
    let base = taken.base();
    taken.free().unwrap();
    let again = VirtualReservation::with_address_hint(4 * g, 0, base).unwrap();
    println!("free hint {base:#x} -> {:#x}", again.base());
}

/// Regions freed by unmapping two neighbours merge into one, which a mapping twice as large fills; a
/// region that is not adjacent is given back; `split_off` keeps the region when it refuses.
#[test]
fn unmapped_neighbours_merge_into_one_region() {
    let Some((device, ctx)) = gpu_or_skip("unmapped_neighbours_merge_into_one_region") else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let small = PhysicalAllocation::new(device, g).unwrap();
    let large = PhysicalAllocation::new(device, 2 * g).unwrap();
    let mut reservation = VirtualReservation::new(3 * g, 0).unwrap();
    let base = reservation.base();
    let mut whole = reservation.region();
    let mut right = whole.split_off(g).unwrap();
    assert!(matches!(
        right.split_off(3 * g),
        Err(Error::OutOfBounds { .. })
    ));
    assert_eq!((right.start(), right.len()), (base + g as u64, 2 * g));
    let mut middle = right.split_off(0).unwrap();
    let far = middle.split_off(g).unwrap();

    let left = whole.map(&small).unwrap().unmap().unwrap();
    let middle = middle.map(&small).unwrap().unmap().unwrap();
    let mut merged = middle;
    assert!(merged.merge(far).is_ok(), "adjacent regions merge");
    let left_back = merged.merge(left).err();
    assert!(
        left_back.is_none(),
        "a region ending where this one starts merges too"
    );
    assert_eq!((merged.start(), merged.len()), (base, 3 * g));

    // The merged region takes a mapping across the old boundaries.
    let mut mapping = merged.map(&large).unwrap();
    let input = pattern(2 * g / 4, 5);
    {
        let mut access = mapping.grant(&ctx, ReadWrite).unwrap();
        access
            .slice_mut::<u32>()
            .unwrap()
            .copy_from_host(&input)
            .unwrap();
        assert_eq!(access.slice::<u32>().unwrap().to_vec().unwrap(), input);
    }
    let rest = mapping.unmap().unwrap();
    assert_eq!(rest.start(), base);
}
