//! What the driver does with peer access where the safe API gives no way to ask: checked with raw
//! driver calls, in a process of its own (a refused access could leave a sticky error). Needs two GPUs
//! with a peer link; skips visibly otherwise.

mod common;

use common::{code_name as name, raw_disable_peer, raw_enable_peer};

use cuda_vmm::{
    Context, DeviceBuffer, DriverError, Granularity, PeerAccess, PhysicalAllocation, ReadWrite,
    VirtualReservation, allocation_granularity, peer::can_access_peer,
};

// The driver's own symbols with integer results: no driver value lands in a Rust enum.
unsafe extern "C" {
    fn cuMemcpyDtoD_v2(dst: u64, src: u64, bytes: usize) -> u32;
}

/// `cuMemcpyDtoD` issued with `ctx` current.
fn raw_copy(ctx: &Context, dst: u64, src: u64, bytes: usize) -> u32 {
    common::raw_bind(ctx);
    // SAFETY: `dst` is `bytes` of the caller's own buffer in `ctx`; `src` is mapped device memory of at
    // least `bytes`; the driver either copies or refuses. The legacy-stream copy is awaited by the
    // caller's next synchronous call.
    unsafe { cuMemcpyDtoD_v2(dst, src, bytes) }
}

#[test]
fn peer_access_facts() {
    let Some(gpus) = common::gpus_or_skip("peer_access_facts", 2) else {
        return;
    };
    let ((d0, c0), (d1, c1)) = (&gpus[0], &gpus[1]);
    let Some(link) = can_access_peer(*d0, *d1).unwrap() else {
        common::skip(&format!(
            "SKIPPED peer_access_facts: {d0:?} cannot access {d1:?}"
        ));
        return;
    };

    // 1. Enabling twice: 0, then 704; disabling twice: 0, then 705. A guard treats 704/705 as done.
    let (e1, e2) = (raw_enable_peer(c0, c1), raw_enable_peer(c0, c1));
    println!("enable 0->1 twice: {}, {}", name(e1), name(e2));
    assert_eq!(
        (e1, e2),
        (0, DriverError::PEER_ACCESS_ALREADY_ENABLED.code())
    );
    let (off1, off2) = (raw_disable_peer(c0, c1), raw_disable_peer(c0, c1));
    println!("disable 0->1 twice: {}, {}", name(off1), name(off2));
    assert_eq!(
        (off1, off2),
        (0, DriverError::PEER_ACCESS_NOT_ENABLED.code())
    );

    // Access a guard enabled itself ends with the last guard: the driver then finds nothing to disable.
    PeerAccess::enable(c0, c1, link).unwrap().disable().unwrap();
    let after_own = raw_disable_peer(c0, c1);
    println!(
        "disable after a guard that enabled the access ended: {}",
        name(after_own)
    );
    assert_eq!(after_own, DriverError::PEER_ACCESS_NOT_ENABLED.code());

    // Access other code enabled before the first guard stays enabled when the last guard ends: the
    // guard never takes away what it did not give (the other code may still be using it).
    assert_eq!(raw_enable_peer(c0, c1), 0);
    let guard = PeerAccess::enable(c0, c1, link).expect("704 under a guard is not an error");
    guard.disable().unwrap();
    let after_other = raw_disable_peer(c0, c1);
    println!(
        "disable after a guard over access other code enabled: {}",
        name(after_other)
    );
    assert_eq!(
        after_other, 0,
        "the guard disabled access it had not enabled"
    );

    // 2. Context peer access does not open a VMM mapping: memory of GPU 1, granted to GPU 1 only, is
    // refused to GPU 0 even while a guard 0 -> 1 lives; a grant to GPU 0 opens it.
    let g = allocation_granularity(*d1, Granularity::Minimum).unwrap();
    let memory = PhysicalAllocation::new(*d1, g).unwrap();
    let mut reservation = VirtualReservation::new(g, 0).unwrap();
    let mut region = reservation.region();
    let mut mapping = region.map(&memory).unwrap();
    let input = common::pattern(g / 4, 42);
    let vmm_addr = {
        let mut own = mapping.grant(c1, ReadWrite).unwrap();
        own.slice_mut::<u32>()
            .unwrap()
            .copy_from_host(&input)
            .unwrap();
        own.as_raw_ptr()
    };
    let local = DeviceBuffer::<u32>::zeroed(c0, g / 4).unwrap();
    let local_addr = local.as_slice().as_raw_ptr();
    let guard = PeerAccess::enable(c0, c1, link).unwrap();
    let refused = raw_copy(c0, local_addr, vmm_addr, g);
    println!(
        "GPU 0 reads GPU 1's VMM memory under context peer access only: {}",
        name(refused)
    );
    assert_ne!(refused, 0, "context peer access opened a VMM mapping");
    guard.disable().unwrap();
    {
        let contexts = [c1, c0];
        let _scoped = mapping.grant_revocable(&contexts, ReadWrite).unwrap();
        let opened = raw_copy(c0, local_addr, vmm_addr, g);
        println!(
            "the same after a grant to GPU 0, no context peer access: {}",
            name(opened)
        );
        assert_eq!(opened, 0);
        assert_eq!(local.as_slice().to_vec().unwrap(), input);
    }
    // The revocable grant has ended: GPU 0 is refused again.
    let closed = raw_copy(c0, local_addr, vmm_addr, g);
    println!("after the revocable grant ended: {}", name(closed));
    assert_ne!(closed, 0, "a revoked grant still opens the mapping");
}
