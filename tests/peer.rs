//! Peer access, revocable grants, kernels and the fallback copy. Single-GPU parts run on any GPU;
//! the multi-GPU parts take every device the machine has and skip visibly with fewer than two.

mod common;

use common::{add_one, gpu_or_skip, gpus_or_skip, pattern};
use cuda_vmm::{
    Context, DeviceBuffer, Error, Granularity, PeerAccess, PhysicalAllocation, ReadWrite,
    VirtualReservation, allocation_granularity, copy_between, peer::CopyPath, peer::Route,
    peer::STAGING_CHUNK_BYTES, peer::Staging, peer::can_access_peer, peer::copy_between_with,
    peer::p2p_attributes,
};

#[test]
fn kernel_reads_and_writes_granted_vmm_memory() {
    let Some((device, ctx)) = gpu_or_skip("kernel_reads_and_writes_granted_vmm_memory") else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let memory = PhysicalAllocation::new(device, 2 * g).unwrap();
    let mut reservation = VirtualReservation::new(2 * g, 0).unwrap();
    let mut region = reservation.region();
    let mut mapping = region.map(&memory).unwrap();
    let mut access = mapping.grant(&ctx, ReadWrite).unwrap();
    let (src_view, dst_view) = access
        .slice_mut::<u32>()
        .unwrap()
        .split_at_mut(g / 4)
        .unwrap();
    let mut src_view = src_view;
    let input = pattern(g / 4, 5);
    src_view.copy_from_host(&input).unwrap();
    // SAFETY: both halves are granted to `ctx`'s device, `g / 4` u32s each, and stay borrowed (alive,
    // unused) across the call.
    unsafe { add_one(&ctx, dst_view.as_raw_ptr(), src_view.as_raw_ptr(), g / 4) }.unwrap();
    let expected: Vec<u32> = input.iter().map(|x| x.wrapping_add(1)).collect();
    assert_eq!(dst_view.to_vec().unwrap(), expected);
}

#[test]
fn staged_copy_equals_direct_copy_on_one_device() {
    let Some((_, ctx)) = gpu_or_skip("staged_copy_equals_direct_copy_on_one_device") else {
        return;
    };
    // Not a whole number of chunks, so the last chunk is short; more than two, so both buffers recycle.
    let len = (3 * STAGING_CHUNK_BYTES + 12_345 * 4) / 4;
    let input = pattern(len, 21);
    let src = DeviceBuffer::from_host(&ctx, &input).unwrap();
    let mut direct = DeviceBuffer::<u32>::zeroed(&ctx, len).unwrap();
    let mut staged = DeviceBuffer::<u32>::zeroed(&ctx, len).unwrap();
    let path = copy_between(&mut direct.as_mut_slice(), &src.as_slice(), Route::Direct).unwrap();
    assert_eq!(path, CopyPath::Direct);
    let path = copy_between(&mut staged.as_mut_slice(), &src.as_slice(), Route::Staged).unwrap();
    assert_eq!(path, CopyPath::Staged);
    let (d, s) = (
        direct.as_slice().to_vec().unwrap(),
        staged.as_slice().to_vec().unwrap(),
    );
    assert!(
        d == input && s == input,
        "direct and staged copies differ from the source"
    );
    let path = copy_between(&mut staged.as_mut_slice(), &direct.as_slice(), Route::Auto).unwrap();
    assert_eq!(
        path,
        CopyPath::Direct,
        "one device: Auto takes the direct path"
    );

    // Reused staging memory with an odd chunk size (not a multiple of the element size) copies the
    // same bytes, twice in a row.
    let mut staging = Staging::new(&ctx, (1 << 20) + 3).unwrap();
    let mut again = DeviceBuffer::<u32>::zeroed(&ctx, len).unwrap();
    for _ in 0..2 {
        let path = copy_between_with(
            &mut again.as_mut_slice(),
            &src.as_slice(),
            Route::Staged,
            &mut staging,
        );
        assert_eq!(path.unwrap(), CopyPath::Staged);
        assert!(
            again.as_slice().to_vec().unwrap() == input,
            "reused staging memory"
        );
    }
    assert_eq!(
        Staging::new(&ctx, 0).unwrap_err(),
        Error::ZeroSize {
            what: "staging chunk"
        }
    );

    let mut short = DeviceBuffer::<u32>::zeroed(&ctx, 3).unwrap();
    let e = copy_between(&mut short.as_mut_slice(), &src.as_slice(), Route::Staged).unwrap_err();
    assert_eq!(
        e,
        Error::LengthMismatch {
            expected: 3,
            found: len
        }
    );
}

#[test]
fn peer_queries_on_one_device_change_nothing() {
    let Some((device, _ctx)) = gpu_or_skip("peer_queries_on_one_device_change_nothing") else {
        return;
    };
    assert_eq!(
        can_access_peer(device, device).unwrap(),
        None,
        "a device is not its own peer"
    );
    let attributes = p2p_attributes(device, device);
    println!("p2p_attributes({device:?}, {device:?}): {attributes:?}");
    assert!(attributes.is_err());
}

/// A device with its primary context.
type Gpu = (cuda_vmm::Device, Context);
/// Two devices, as indices into the list of [`Gpu`]s, and the link from the first to the second.
type LinkedPair = (usize, usize, cuda_vmm::peer::PeerLink);

/// Every device with its context, and every ordered pair of distinct devices (as indices) with its
/// peer link, where the driver reports one. The pairs without one are reported visibly; with fewer
/// than two devices, or where no pair has a link, `None` after printing that `test` is skipped.
fn linked_gpus_or_skip(test: &str) -> Option<(Vec<Gpu>, Vec<LinkedPair>)> {
    let gpus = gpus_or_skip(test, 2)?;
    let mut pairs = Vec::new();
    for (i, (a, _)) in gpus.iter().enumerate() {
        for (j, (b, _)) in gpus.iter().enumerate() {
            if i != j {
                match can_access_peer(*a, *b).unwrap() {
                    Some(link) => pairs.push((i, j, link)),
                    None => {
                        common::skip(&format!("SKIPPED {test} for {a:?} -> {b:?}: no peer link"));
                    }
                }
            }
        }
    }
    if pairs.is_empty() {
        common::skip(&format!(
            "SKIPPED {test}: no pair of devices has a peer link"
        ));
        return None;
    }
    Some((gpus, pairs))
}

#[test]
fn peer_guard_gates_buffer_access_in_every_direction() {
    let test = "peer_guard_gates_buffer_access_in_every_direction";
    let Some((gpus, pairs)) = linked_gpus_or_skip(test) else {
        return;
    };
    for (i, j, link) in pairs {
        let ((_, from), (_, to)) = (&gpus[i], &gpus[j]);
        let attributes = p2p_attributes(link.from(), link.to()).unwrap();
        println!("{:?} -> {:?}: {attributes:?}", link.from(), link.to());
        assert!(attributes.access_supported);

        let input = pattern(1 << 16, (i * 16 + j) as u32);
        let remote = DeviceBuffer::from_host(to, &input).unwrap();
        let mut local = DeviceBuffer::<u32>::zeroed(from, input.len()).unwrap();
        let guard = PeerAccess::enable(from, to, link).unwrap();
        let peer_view = remote.peer_slice(&guard).unwrap();
        assert_eq!(peer_view.device(), link.from());
        assert_eq!(
            peer_view.to_vec().unwrap(),
            input,
            "copy issued on the peer's context"
        );

        let out = local.as_mut_slice();
        // SAFETY: `peer_view` is `to`'s buffer opened to `from` by the live guard; `out` is `from`'s own
        // buffer; both hold `input.len()` u32s and stay borrowed across the call.
        unsafe { add_one(from, out.as_raw_ptr(), peer_view.as_raw_ptr(), input.len()) }.unwrap();
        let expected: Vec<u32> = input.iter().map(|x| x.wrapping_add(1)).collect();
        assert_eq!(
            local.as_slice().to_vec().unwrap(),
            expected,
            "kernel on {i} reading {j}'s memory"
        );

        // The link is one direction: it does not enable the other one.
        assert!(matches!(
            PeerAccess::enable(to, from, link),
            Err(Error::DeviceMismatch { .. })
        ));
        // A guard of the other direction does not open this buffer, for reading or writing.
        match can_access_peer(link.to(), link.from()).unwrap() {
            Some(back) => {
                let reverse = PeerAccess::enable(to, from, back).unwrap();
                assert!(matches!(
                    remote.peer_slice(&reverse),
                    Err(Error::DeviceMismatch { .. })
                ));
                let mut writable = DeviceBuffer::<u32>::zeroed(to, 4).unwrap();
                assert!(matches!(
                    writable.peer_slice_mut(&reverse),
                    Err(Error::DeviceMismatch { .. })
                ));
                assert!(writable.peer_slice_mut(&guard).is_ok());
                reverse.disable().unwrap();
            }
            None => common::skip(&format!(
                "SKIPPED {test} reverse-guard check for {j} -> {i}: no peer link that way"
            )),
        }
        guard.disable().unwrap();
    }
}

#[test]
fn overlapping_guards_and_already_enabled_are_not_errors() {
    let test = "overlapping_guards_and_already_enabled_are_not_errors";
    let Some((gpus, pairs)) = linked_gpus_or_skip(test) else {
        return;
    };
    for (i, j, link) in pairs {
        let ((_, from), (_, to)) = (&gpus[i], &gpus[j]);
        let input = pattern(4096, 77);
        let remote = DeviceBuffer::from_host(to, &input).unwrap();
        let mut local = DeviceBuffer::<u32>::zeroed(from, input.len()).unwrap();
        let first = PeerAccess::enable(from, to, link).unwrap();
        let second = PeerAccess::enable(from, to, link).unwrap();
        first.disable().unwrap();
        // Access stays enabled while `second` lives: a kernel on `from` still reads `to`'s memory.
        let view = remote.peer_slice(&second).unwrap();
        let out = local.as_mut_slice();
        // SAFETY: as in `peer_guard_gates_buffer_access_in_every_direction`, under `second`.
        unsafe { add_one(from, out.as_raw_ptr(), view.as_raw_ptr(), input.len()) }.unwrap();
        assert_eq!(
            local.as_slice().to_vec().unwrap()[..4],
            [0, 1, 2, 3].map(|k| input[k].wrapping_add(1))
        );
        second.disable().unwrap();
        // Enabling again after every guard ended works, and so does ending it again.
        PeerAccess::enable(from, to, link)
            .unwrap()
            .disable()
            .unwrap();
    }
}

/// Without access opened, a copy between two devices never reaches the driver's own staging: `Direct`
/// is refused before any driver call (the destination keeps its bytes), `Auto` and `Staged` take this
/// crate's staged path, and both give the source's bytes. For `cuMemAlloc` buffers and for a VMM view
/// granted to its own device only.
#[test]
fn cross_device_copies_without_access_are_staged_or_refused() {
    let test = "cross_device_copies_without_access_are_staged_or_refused";
    let Some(gpus) = gpus_or_skip(test, 2) else {
        return;
    };
    let len = (2 * STAGING_CHUNK_BYTES + 4 * 999) / 4;
    for (i, (da, a)) in gpus.iter().enumerate() {
        let input = pattern(len, i as u32);
        let src = DeviceBuffer::from_host(a, &input).unwrap();
        // The same bytes in VMM memory of `a`, granted to `a` alone.
        let g = allocation_granularity(*da, Granularity::Minimum).unwrap();
        let size = cuda_vmm::align_size(len * 4, g).unwrap();
        let memory = PhysicalAllocation::new(*da, size).unwrap();
        let mut reservation = VirtualReservation::new(size, 0).unwrap();
        let mut region = reservation.region();
        let mut mapping = region.map(&memory).unwrap();
        let mut own = mapping.grant(a, ReadWrite).unwrap();
        let mut vmm = own
            .slice_mut::<u32>()
            .unwrap()
            .into_slice_mut(..len)
            .unwrap();
        vmm.copy_from_host(&input).unwrap();
        let vmm = vmm.as_slice();

        for (j, (db, b)) in gpus.iter().enumerate() {
            if i == j {
                continue;
            }
            for (kind, view) in [("buffer", src.as_slice()), ("VMM view", vmm)] {
                assert!(!view.reachable_from(*db), "{i} -> {j} {kind}: reachable");
                let mut dst = DeviceBuffer::<u32>::zeroed(b, len).unwrap();
                let e = copy_between(&mut dst.as_mut_slice(), &view, Route::Direct).unwrap_err();
                assert_eq!(
                    e,
                    Error::NoPeerAccess {
                        device: db.as_raw(),
                        owner: da.as_raw()
                    },
                    "{i} -> {j} {kind}: Direct without access"
                );
                assert!(
                    dst.as_slice().to_vec().unwrap().iter().all(|&x| x == 0),
                    "{i} -> {j} {kind}: a refused copy wrote"
                );
                let e = dst.as_mut_slice().copy_from_device(&view).unwrap_err();
                assert!(matches!(e, Error::NoPeerAccess { .. }), "{e}");
                for route in [Route::Auto, Route::Staged] {
                    dst = DeviceBuffer::<u32>::zeroed(b, len).unwrap();
                    let path = copy_between(&mut dst.as_mut_slice(), &view, route).unwrap();
                    assert_eq!(path, CopyPath::Staged, "{i} -> {j} {kind}: {route:?}");
                    assert!(
                        dst.as_slice().to_vec().unwrap() == input,
                        "{i} -> {j} {kind}: {route:?} copied other bytes"
                    );
                }
            }
        }
    }
}

/// A peer view under a guard opens `cuMemAlloc` memory to the other device: the copy takes the direct
/// path, pulling (the destination's context reads the source) and pushing (the source's context
/// writes the destination), and gives the source's bytes. Once the guard has ended, `Auto` stages.
#[test]
fn copy_under_a_guard_takes_the_link() {
    let test = "copy_under_a_guard_takes_the_link";
    let Some((gpus, pairs)) = linked_gpus_or_skip(test) else {
        return;
    };
    let len = (STAGING_CHUNK_BYTES + 4 * 77) / 4;
    for (i, j, _) in pairs {
        // `i` can access `j`'s memory: copies from `j` into `i` (pull) and from `i` into `j` (push).
        let ((di, ci), (dj, cj)) = (&gpus[i], &gpus[j]);
        let input = pattern(len, (i * 8 + j) as u32);
        let on_j = DeviceBuffer::from_host(cj, &input).unwrap();
        let on_i = DeviceBuffer::from_host(ci, &input).unwrap();
        let mut into_i = DeviceBuffer::<u32>::zeroed(ci, len).unwrap();
        let mut into_j = DeviceBuffer::<u32>::zeroed(cj, len).unwrap();
        {
            let guard = PeerAccess::open(ci, cj).unwrap();
            let pulled = on_j.peer_slice(&guard).unwrap();
            assert!(pulled.reachable_from(*di) && pulled.reachable_from(*dj));
            for route in [Route::Direct, Route::Auto] {
                let path = copy_between(&mut into_i.as_mut_slice(), &pulled, route).unwrap();
                assert_eq!(path, CopyPath::Direct, "pull {j} -> {i}, {route:?}");
            }
            assert!(
                into_i.as_slice().to_vec().unwrap() == input,
                "pull {j} -> {i}"
            );

            let mut pushed = into_j.peer_slice_mut(&guard).unwrap();
            let path = copy_between(&mut pushed, &on_i.as_slice(), Route::Direct).unwrap();
            assert_eq!(path, CopyPath::Direct, "push {i} -> {j}");
            guard.disable().unwrap();
        }
        assert!(
            into_j.as_slice().to_vec().unwrap() == input,
            "push {i} -> {j}"
        );
        // The guard has ended: the plain views are not open to each other any more.
        let path = copy_between(&mut into_i.as_mut_slice(), &on_j.as_slice(), Route::Auto).unwrap();
        assert_eq!(path, CopyPath::Staged, "{j} -> {i} after the guard ended");
    }
}

/// A VMM view granted to both devices is open to both: a copy into a buffer of the other device takes
/// the direct path (the destination's context reads the grant), and so does a copy from a buffer into
/// a granted view seen through the other device (the source's context writes the grant);
/// `copy_from_device` across the two devices works too. Bytes are checked each time.
#[test]
fn copy_from_a_granted_vmm_view_takes_the_link() {
    let test = "copy_from_a_granted_vmm_view_takes_the_link";
    let Some((gpus, pairs)) = linked_gpus_or_skip(test) else {
        return;
    };
    for (i, j, _) in pairs {
        // VMM memory of `j`, granted to `j` and `i` (`i` can access `j`).
        let ((di, ci), (dj, cj)) = (&gpus[i], &gpus[j]);
        let g = allocation_granularity(*dj, Granularity::Minimum).unwrap();
        let len = 2 * g / 4;
        let input = pattern(len, (i * 8 + j + 1) as u32);
        let memory = PhysicalAllocation::new(*dj, 2 * g).unwrap();
        let mut reservation = VirtualReservation::new(2 * g, 0).unwrap();
        let mut region = reservation.region();
        let mut mapping = region.map(&memory).unwrap();
        let contexts = [cj, ci];
        let mut scoped = mapping.grant_revocable(&contexts, ReadWrite).unwrap();
        scoped
            .slice_mut::<u32>()
            .unwrap()
            .copy_from_host(&input)
            .unwrap();

        let granted = scoped.slice::<u32>().unwrap();
        assert_eq!(granted.device(), *dj);
        assert!(granted.reachable_from(*di));
        let mut into_i = DeviceBuffer::<u32>::zeroed(ci, len).unwrap();
        let path = copy_between(&mut into_i.as_mut_slice(), &granted, Route::Direct).unwrap();
        assert_eq!(path, CopyPath::Direct, "{j}'s VMM memory into {i}");
        assert!(into_i.as_slice().to_vec().unwrap() == input, "{j} -> {i}");

        let mut again = DeviceBuffer::<u32>::zeroed(ci, len).unwrap();
        again.as_mut_slice().copy_from_device(&granted).unwrap();
        assert!(
            again.as_slice().to_vec().unwrap() == input,
            "copy_from_device {j} -> {i}"
        );

        // Push: a buffer of `i` into the grant, seen through `j` (so the view's device is `j`): `i`'s
        // context writes it.
        let reversed: Vec<u32> = input.iter().rev().copied().collect();
        let from_i = DeviceBuffer::from_host(ci, &reversed).unwrap();
        let mut target = scoped.slice_mut::<u32>().unwrap();
        assert_eq!(target.device(), *dj);
        let path = copy_between(&mut target, &from_i.as_slice(), Route::Auto).unwrap();
        assert_eq!(path, CopyPath::Direct, "{i}'s buffer into the grant");
        assert!(
            target.to_vec().unwrap() == reversed,
            "{i} -> {j}'s VMM memory"
        );
        scoped.revoke().unwrap();
    }
}

#[test]
fn one_reservation_is_one_address_on_every_device() {
    let test = "one_reservation_is_one_address_on_every_device";
    let Some(gpus) = gpus_or_skip(test, 2) else {
        return;
    };
    let mut shared = 0;
    for (home, (home_device, _)) in gpus.iter().enumerate() {
        // The memory's own device, and every device the driver says can reach it.
        let reaching: Vec<&(cuda_vmm::Device, Context)> = gpus
            .iter()
            .filter(|(d, _)| {
                d == home_device || can_access_peer(*d, *home_device).unwrap().is_some()
            })
            .collect();
        if reaching.len() < 2 {
            common::skip(&format!(
                "SKIPPED {test} for {home_device:?}: no other device can reach its memory"
            ));
            continue;
        }
        shared += 1;
        let contexts: Vec<&Context> = reaching.iter().map(|(_, c)| c).collect();
        let g = allocation_granularity(*home_device, Granularity::Minimum).unwrap();
        let memory = PhysicalAllocation::new(*home_device, g).unwrap();
        let mut reservation = VirtualReservation::new(g, 0).unwrap();
        let mut region = reservation.region();
        let mut mapping = region.map(&memory).unwrap();
        let mut access = mapping.grant_all(&contexts, ReadWrite).unwrap();
        let input = pattern(g / 4, home as u32);
        access
            .slice_mut_on::<u32>(*home_device)
            .unwrap()
            .copy_from_host(&input)
            .unwrap();
        for (device, ctx) in reaching {
            let view = access.slice_on::<u32>(*device).unwrap();
            assert_eq!(
                view.as_raw_ptr(),
                access.as_raw_ptr(),
                "one address for every device"
            );
            assert_eq!(
                view.to_vec().unwrap(),
                input,
                "{device:?} reads {home_device:?}'s memory"
            );
            let mut out = DeviceBuffer::<u32>::zeroed(ctx, input.len()).unwrap();
            let out_view = out.as_mut_slice();
            // SAFETY: the mapping is granted to `device`; `out` is its own buffer; both hold `g / 4`
            // u32s and stay borrowed across the call.
            unsafe { add_one(ctx, out_view.as_raw_ptr(), view.as_raw_ptr(), input.len()) }.unwrap();
            let got = out.as_slice().to_vec().unwrap();
            assert!(
                got.iter().zip(&input).all(|(o, i)| *o == i.wrapping_add(1)),
                "kernel on {device:?}"
            );
        }
    }
    if shared == 0 {
        common::skip(&format!(
            "SKIPPED {test}: no device's memory is reachable from another"
        ));
    }
}

#[test]
fn scoped_peer_grant_opens_and_closes_a_vmm_mapping() {
    let Some(gpus) = gpus_or_skip("scoped_peer_grant_opens_and_closes_a_vmm_mapping", 2) else {
        return;
    };
    let ((d0, c0), (d1, c1)) = (&gpus[0], &gpus[1]);
    if can_access_peer(*d1, *d0).unwrap().is_none() {
        common::skip(&format!(
            "SKIPPED scoped_peer_grant_opens_and_closes_a_vmm_mapping: {d1:?} cannot access {d0:?}"
        ));
        return;
    }
    let g = allocation_granularity(*d0, Granularity::Minimum).unwrap();
    let memory = PhysicalAllocation::new(*d0, g).unwrap();
    let mut reservation = VirtualReservation::new(g, 0).unwrap();
    let mut region = reservation.region();
    let mut mapping = region.map(&memory).unwrap();
    let input = pattern(g / 4, 1234);
    {
        let contexts = [c0, c1];
        let mut scoped = mapping.grant_revocable(&contexts, ReadWrite).unwrap();
        scoped
            .slice_mut_on::<u32>(*d0)
            .unwrap()
            .copy_from_host(&input)
            .unwrap();
        assert_eq!(
            scoped.slice_on::<u32>(*d1).unwrap().to_vec().unwrap(),
            input
        );
        scoped.revoke().unwrap();
    }
    // Granted again to the owner only, the data is still there.
    let access = mapping.grant(c0, ReadWrite).unwrap();
    assert_eq!(access.slice::<u32>().unwrap().to_vec().unwrap(), input);
    assert!(matches!(
        access.slice_on::<u32>(*d1),
        Err(Error::DeviceMismatch { .. })
    ));
}
