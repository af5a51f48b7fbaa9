//! What outlives the last `Context` of a device: a primary context released by its last user is
//! reset, which unpins its pinned host memory. A clone of a `Context` shares its retain, and a
//! `DeviceBuffer` or `Module` keeps a clone of its context; `Staging` keeps the context it depends
//! on retained; a guard leaves peer access that other code enabled as it found it. A process of its
//! own, since these tests need to be the only holders of a device's primary context
//! (`tests/forgotten_guard.rs` has the peer side of the reset).

mod common;

use common::{code_name as name, pattern, primary_active, raw_disable_peer, raw_enable_peer};

use std::sync::{Mutex, PoisonError};

use core::ffi::c_void;

use cuda_vmm::{
    Context, DeviceBuffer, DriverError, Module, PeerAccess, peer::CopyPath, peer::Route,
    peer::Staging, peer::can_access_peer, peer::copy_between_with,
};

/// The tests each need to be the only holders of the primary contexts they look at.
static SERIAL: Mutex<()> = Mutex::new(());

/// A staged copy of `input` from a new buffer to another on `ctx`'s device through `staging`.
fn staged_roundtrip(ctx: &Context, staging: &mut Staging, input: &[u32]) -> Vec<u32> {
    let src = DeviceBuffer::from_host(ctx, input).unwrap();
    let mut dst = DeviceBuffer::<u32>::zeroed(ctx, input.len()).unwrap();
    let path = copy_between_with(
        &mut dst.as_mut_slice(),
        &src.as_slice(),
        Route::Staged,
        staging,
    )
    .unwrap();
    assert_eq!(path, CopyPath::Staged);
    dst.as_slice().to_vec().unwrap()
}

#[test]
fn staging_keeps_its_context_and_memory_alive() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(devices) = common::devices_or_skip("staging_keeps_its_context_and_memory_alive", 1)
    else {
        return;
    };
    let device = devices[0];

    // The premise: the last release resets the primary context.
    drop(Context::new(device).unwrap());
    assert!(
        !primary_active(device),
        "no one else in this process holds {device:?}'s primary context"
    );

    // Made in a context that is released at once: `Staging` keeps it retained.
    let mut early = {
        let ctx = Context::new(device).unwrap();
        Staging::new(&ctx, 1 << 20).unwrap()
    };
    assert!(primary_active(device), "Staging keeps its context");
    assert_eq!(early.device(), device);

    let ctx = Context::new(device).unwrap();
    let mut late = Staging::new(&ctx, 1 << 20).unwrap();
    // Three chunks and a partial one through each, interleaved: each owns its own pinned memory.
    let (a, b) = (pattern((3 << 18) + 1000, 11), pattern((3 << 18) + 1000, 12));
    assert_eq!(staged_roundtrip(&ctx, &mut early, &a), a);
    assert_eq!(staged_roundtrip(&ctx, &mut late, &b), b);
    drop(early);
    assert_eq!(
        staged_roundtrip(&ctx, &mut late, &a),
        a,
        "freeing one frees only its own"
    );
    drop((late, ctx));
    assert!(
        !primary_active(device),
        "the last Staging released its context"
    );
}

#[test]
fn clones_buffers_and_modules_keep_their_context_retained() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let test = "clones_buffers_and_modules_keep_their_context_retained";
    let Some(devices) = common::devices_or_skip(test, 1) else {
        return;
    };
    let device = devices[0];
    drop(Context::new(device).unwrap());
    assert!(
        !primary_active(device),
        "no one else in this process holds {device:?}'s primary context"
    );

    // A clone shares its original's one retain: the last of the two to be dropped releases it.
    let ctx = Context::new(device).unwrap();
    let clone = ctx.clone();
    assert_eq!(clone.as_raw(), ctx.as_raw());
    drop(ctx);
    assert!(primary_active(device), "the clone keeps the shared retain");
    drop(clone);
    assert!(!primary_active(device), "the last clone released it");

    // Buffers and a module own a clone of the context they were made with: they keep it, and work,
    // after it is dropped.
    let input = pattern(1 << 12, 31);
    let (src, mut dst, module) = {
        let ctx = Context::new(device).unwrap();
        (
            DeviceBuffer::from_host(&ctx, &input).unwrap(),
            DeviceBuffer::<u32>::zeroed(&ctx, input.len()).unwrap(),
            Module::load_ptx(&ctx, &common::add_one_ptx()).unwrap(),
        )
    };
    assert!(
        primary_active(device),
        "the buffers and the module keep their context"
    );
    let kernel = module.function(c"add_one").unwrap();
    let mut dst_ptr = dst.as_mut_slice().as_raw_ptr();
    let mut src_ptr = src.as_slice().as_raw_ptr();
    let mut n = u32::try_from(input.len()).unwrap();
    let mut params = [
        (&raw mut dst_ptr).cast::<c_void>(),
        (&raw mut src_ptr).cast::<c_void>(),
        (&raw mut n).cast::<c_void>(),
    ];
    // SAFETY: the parameters are (u64, u64, u32) as `add_one` declares; both buffers hold `n` values
    // of this device's memory, alive and used by nothing else until the launch has waited for the
    // kernel.
    unsafe { kernel.launch((n.div_ceil(256), 1, 1), (256, 1, 1), &mut params) }.unwrap();
    let expected: Vec<u32> = input.iter().map(|x| x.wrapping_add(1)).collect();
    assert_eq!(dst.as_slice().to_vec().unwrap(), expected);
    drop((src, dst));
    assert!(primary_active(device), "the module still keeps its context");
    drop(module);
    assert!(
        !primary_active(device),
        "the module, the last owner of a clone, released it"
    );
}

#[test]
fn access_enabled_by_other_code_survives_the_last_guard() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let test = "access_enabled_by_other_code_survives_the_last_guard";
    let Some(devices) = common::devices_or_skip(test, 2) else {
        return;
    };
    let (d0, d1) = (devices[0], devices[1]);
    let Some(link) = can_access_peer(d1, d0).unwrap() else {
        common::skip(&format!("SKIPPED {test}: {d1:?} cannot access {d0:?}"));
        return;
    };
    let (c0, c1) = (Context::new(d0).unwrap(), Context::new(d1).unwrap());
    let enabled = raw_enable_peer(&c1, &c0);
    assert_eq!(enabled, 0, "other code enables 1 -> 0: {}", name(enabled));

    let guard = PeerAccess::enable(&c1, &c0, link).unwrap();
    guard.disable().unwrap();
    let disabled = raw_disable_peer(&c1, &c0);
    println!("raw disable 1->0 after the guard ended: {}", name(disabled));
    assert_eq!(disabled, 0, "the guard left enabled what it found enabled");

    // Now enabled by a guard itself: its end disables it.
    let guard = PeerAccess::enable(&c1, &c0, link).unwrap();
    guard.disable().unwrap();
    let after = raw_disable_peer(&c1, &c0);
    assert_eq!(after, DriverError::PEER_ACCESS_NOT_ENABLED.code());
}
