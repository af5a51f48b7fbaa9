//! What the driver does where the safe API forbids the call: checked through raw driver calls, so the
//! rules the types enforce stay grounded in measured behaviour. One test, run alone in its own process:
//! touching an ungranted mapping may leave a sticky error in the context.

mod common;

use common::code_name as name;

use core::ffi::c_void;

use cuda_vmm::{
    Access, Context, Device, DriverError, Granularity, Mapping, PhysicalAllocation, ReadWrite,
    VirtualReservation, allocation_granularity, vmm::AccessMode,
};

#[repr(C)]
struct MemLocation {
    type_: u32,
    id: i32,
}

#[repr(C)]
struct MemAccessDesc {
    location: MemLocation,
    flags: u32,
}

// The same symbols the crate declares, with integer results: no driver value lands in a Rust enum.
unsafe extern "C" {
    fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, bytes: usize) -> u32;
    fn cuMemSetAccess(ptr: u64, size: usize, desc: *const MemAccessDesc, count: usize) -> u32;
    fn cuMemUnmap(ptr: u64, size: usize) -> u32;
    fn cuMemMap(ptr: u64, size: usize, offset: usize, handle: u64, flags: u64) -> u32;
}

#[test]
fn driver_refuses_what_the_types_forbid() {
    let Some((device, ctx)) = common::gpu_or_skip("driver_refuses_what_the_types_forbid") else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let memory = PhysicalAllocation::new(device, g).unwrap();
    let mut reservation = VirtualReservation::new(2 * g, 0).unwrap();
    let (mut first, mut second_half) = reservation.region().split_at(g).unwrap();
    let mut granted = first.map(&memory).unwrap();
    let ptr = {
        let mut access = granted.grant(&ctx, ReadWrite).unwrap();
        access
            .slice_mut::<u8>()
            .unwrap()
            .copy_from_host(&vec![7; g])
            .unwrap();
        access.as_raw_ptr()
    };

    // A double unmap is not caught by the driver: the types must (ui-tests/vmm/mapping_unmapped_twice).
    // Done on a raw mapping of the reservation's second half, made and unmapped here.
    let second = second_half.start();
    // SAFETY: `[second, second + g)` is `second_half`, which nothing maps; `memory` is alive; the range
    // is unmapped (twice) below before `second_half` is used again.
    let mapped = unsafe { cuMemMap(second, g, 0, memory.as_raw(), 0) };
    assert_eq!(mapped, 0, "cuMemMap: {}", name(mapped));
    // SAFETY: unmaps the range mapped just above.
    let first_unmap = unsafe { cuMemUnmap(second, g) };
    // SAFETY: the range is already unmapped; the driver is expected to return success regardless.
    let second_unmap = unsafe { cuMemUnmap(second, g) };
    println!(
        "unmap: {}; unmap again: {}",
        name(first_unmap),
        name(second_unmap)
    );
    assert_eq!(first_unmap, 0);
    assert_eq!(
        second_unmap, 0,
        "the driver reports a double unmap as success, so only the types can catch it"
    );

    // Mapping over a range that is already mapped (only reachable after `mem::forget(mapping)`, which
    // ends the borrows but leaves the range mapped): the driver refuses it, so forgetting only leaks.
    // SAFETY: `[ptr, ptr + g)` is mapped by `granted`; the driver is expected to refuse, and if it did
    // not, the test fails before anything uses the range.
    let overmap = unsafe { cuMemMap(ptr, g, 0, memory.as_raw(), 0) };
    println!("cuMemMap over a mapped range: {}", name(overmap));
    assert_eq!(
        overmap,
        DriverError::INVALID_VALUE.code(),
        "the driver refuses to map over a mapped range"
    );
    // Also where the new range only partly overlaps a mapped one: a two-granule allocation over the
    // whole reservation, whose first half is mapped and second half free.
    let big = PhysicalAllocation::new(device, 2 * g).unwrap();
    // SAFETY: `[ptr, ptr + 2g)` is the whole reservation; the driver is expected to refuse, and if it
    // did not, the test fails before anything uses the range.
    let partly = unsafe { cuMemMap(ptr, 2 * g, 0, big.as_raw(), 0) };
    println!("cuMemMap partly over a mapped range: {}", name(partly));
    assert_eq!(partly, DriverError::INVALID_VALUE.code());
    drop(big);

    revocation_facts(device, &ctx, &mut granted, ptr);

    // Reading a mapping no device may access: the driver refuses it. The types make this unwritable
    // (ui-tests/access/view_before_grant, pointer_before_grant).
    let ungranted = second_half.map(&memory).unwrap();
    let mut host = vec![0u8; 64];
    // SAFETY: `host` is writable for 64 bytes; the source is mapped (never granted), so the driver
    // either refuses the copy or fails it; it cannot write elsewhere.
    let read = unsafe { cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), second, host.len()) };
    println!("copy from an ungranted mapping: {}", name(read));
    assert_eq!(
        read,
        DriverError::INVALID_VALUE.code(),
        "the driver refuses to read an ungranted mapping"
    );
    println!(
        "context afterwards: {:?}",
        ctx.synchronize().map_err(|e| e.to_string())
    );
    drop(ungranted);
    drop(granted);
}

/// What taking a grant back does: `PROT_NONE` is accepted, a revocable grant closes the mapping
/// when it ends, and a grant naming one device twice opens it or leaves it closed, never half open.
fn revocation_facts(device: Device, ctx: &Context, granted: &mut Mapping<'_, '_>, ptr: u64) {
    // Revoking a grant with PROT_NONE (what a revocable grant would do when it ends).
    let none = MemAccessDesc {
        location: MemLocation {
            type_: 1,
            id: device.as_raw(),
        },
        flags: 0,
    };
    // SAFETY: `[ptr, ptr + size)` is exactly `granted`'s mapped range; `none` is a valid descriptor.
    let revoke = unsafe { cuMemSetAccess(ptr, granted.size(), &raw const none, 1) };
    println!(
        "cuMemSetAccess(PROT_NONE) for the owning device: {}",
        name(revoke)
    );
    assert_eq!(revoke, 0, "PROT_NONE is how a grant is taken back");

    // A revocable grant closes the mapping again when it ends.
    {
        let contexts = [ctx];
        let scoped = granted.grant_revocable(&contexts, ReadWrite).unwrap();
        assert_eq!(first_bytes(&scoped), vec![7; 64]);
        scoped.revoke().unwrap();
    }
    let mut host = vec![0u8; 64];
    // SAFETY: `host` is writable for 64 bytes; the source is mapped, its grant revoked: the driver
    // refuses or fails the copy, and cannot write elsewhere.
    let after_revoke = unsafe { cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), ptr, host.len()) };
    println!("copy after a revocable grant ended: {}", name(after_revoke));
    assert_ne!(after_revoke, 0, "a revoked grant still opens the mapping");

    // A grant naming one device twice: whatever the driver answers, a refused grant leaves the mapping
    // closed (the crate takes back any part the driver applied).
    {
        let contexts = [ctx, ctx];
        match granted.grant_all(&contexts, ReadWrite) {
            Ok(access) => {
                println!(
                    "grant naming one device twice: accepted ({} device entries)",
                    access.devices().len()
                );
                assert_eq!(
                    first_bytes(&access),
                    vec![7; 64],
                    "the accepted grant opens the mapping"
                );
            }
            Err(e) => {
                println!("grant naming one device twice: {e}");
                let mut host = vec![0u8; 64];
                // SAFETY: as for the reads below: the driver refuses or fails the copy.
                let read = unsafe { cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), ptr, host.len()) };
                assert_ne!(read, 0, "a refused grant left the mapping open");
            }
        }
    }
}

/// The first 64 bytes of a granted mapping, read through the safe API.
fn first_bytes<M: AccessMode>(access: &Access<'_, M>) -> Vec<u8> {
    let mut host = vec![0u8; 64];
    access
        .slice::<u8>()
        .unwrap()
        .slice(..64)
        .unwrap()
        .copy_to_host(&mut host)
        .unwrap();
    host
}
