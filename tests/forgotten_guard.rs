//! A forgotten peer-access guard leaves its direction enabled, even once every `Context` of the two
//! devices is dropped: the guard bookkeeping keeps both primary contexts retained, since a released
//! primary context is reset and a reset drops its peer access. A process of its own: the forgotten
//! guard stays for the rest of it. Needs two GPUs with a peer link; skips visibly otherwise.

mod common;

use common::{code_name as name, pattern, primary_active, raw_enable_peer};

use cuda_vmm::{Context, DeviceBuffer, DriverError, PeerAccess, peer::can_access_peer};

#[test]
fn forgotten_guard_keeps_its_direction_enabled() {
    let test = "forgotten_guard_keeps_its_direction_enabled";
    let Some(devices) = common::devices_or_skip(test, 2) else {
        return;
    };
    let (d0, d1) = (devices[0], devices[1]);
    assert!(
        !primary_active(d0) && !primary_active(d1),
        "nothing else in this process holds the contexts"
    );
    let Some(link) = can_access_peer(d0, d1).unwrap() else {
        common::skip(&format!("SKIPPED {test}: {d0:?} cannot access {d1:?}"));
        return;
    };
    {
        let (c0, c1) = (Context::new(d0).unwrap(), Context::new(d1).unwrap());
        core::mem::forget(PeerAccess::enable(&c0, &c1, link).unwrap());
    }
    assert!(
        primary_active(d0) && primary_active(d1),
        "a forgotten guard keeps both contexts retained"
    );

    let (c0, c1) = (Context::new(d0).unwrap(), Context::new(d1).unwrap());
    let again = raw_enable_peer(&c0, &c1);
    println!("raw enable 0->1 after the forgotten guard: {}", name(again));
    assert_eq!(
        again,
        DriverError::PEER_ACCESS_ALREADY_ENABLED.code(),
        "the direction is still enabled"
    );

    // A new guard of the same direction works and, ending, leaves the forgotten one's access.
    let input = pattern(1 << 14, 21);
    let remote = DeviceBuffer::from_host(&c1, &input).unwrap();
    let guard = PeerAccess::enable(&c0, &c1, link).unwrap();
    assert_eq!(remote.peer_slice(&guard).unwrap().to_vec().unwrap(), input);
    guard.disable().unwrap();
    let still = raw_enable_peer(&c0, &c1);
    assert_eq!(still, DriverError::PEER_ACCESS_ALREADY_ENABLED.code());
}
