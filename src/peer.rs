//! Peer-to-peer access between devices: capability queries and a guard that keeps context peer access
//! enabled while anything uses it.
//!
//! Two mechanisms open one GPU's memory to another, and they do not overlap:
//! - **Context peer access** (`cuCtxEnablePeerAccess`, this module's [`PeerAccess`]) opens memory from
//!   `cuMemAlloc` ([`DeviceBuffer`](crate::DeviceBuffer)) of one context to another context. It does
//!   **not** open VMM mappings.
//! - **VMM access grants** (`cuMemSetAccess`, [`Mapping::grant_all`](crate::Mapping::grant_all) and
//!   [`Mapping::grant_scoped`](crate::Mapping::grant_scoped)) open one mapping to the devices named,
//!   whether or not context peer access is enabled.

use core::ffi::c_int;
use core::fmt;
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::{Mutex, PoisonError};

use crate::device::{Context, Device};
use crate::error::{DriverError, Error, Result, check};
use crate::sys;

/// Proof that the driver reported `from` able to access `to`'s memory directly: the only way to get
/// one is [`can_access_peer`], and [`PeerAccess::enable`] requires one, so enabling access without
/// having asked cannot be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerLink {
    from: Device,
    to: Device,
}

impl PeerLink {
    /// The device that may access.
    #[must_use]
    pub fn from(self) -> Device {
        self.from
    }

    /// The device whose memory is accessed.
    #[must_use]
    pub fn to(self) -> Device {
        self.to
    }
}

/// `cuDeviceCanAccessPeer` — whether `from` can access `to`'s memory directly. Directional: an answer
/// for `from → to` says nothing about `to → from`. Changes nothing.
///
/// Returns the [`PeerLink`] that [`PeerAccess::enable`] requires, or `None` (always for `from == to`).
///
/// # Errors
/// The driver's error, if any.
#[doc(alias = "cuDeviceCanAccessPeer")]
pub fn can_access_peer(from: Device, to: Device) -> Result<Option<PeerLink>> {
    let mut can: c_int = 0;
    // SAFETY: `can` is writable for the call; both devices are ordinals the driver accepted.
    check(unsafe { sys::cuDeviceCanAccessPeer(&raw mut can, from.as_raw(), to.as_raw()) })?;
    Ok((can != 0).then_some(PeerLink { from, to }))
}

/// The driver's peer-to-peer attributes of one direction (`cuDeviceGetP2PAttribute`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct P2PAttributes {
    /// Relative performance of the link; lower is better (`CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK`).
    pub performance_rank: i32,
    /// Whether peer access is supported (`CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED`).
    pub access_supported: bool,
    /// Whether atomics work natively over the link (`CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED`).
    pub native_atomics: bool,
    /// Whether CUDA arrays can be accessed over the link
    /// (`CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED`).
    pub cuda_array_access: bool,
}

/// `cuDeviceGetP2PAttribute` — the attributes of the `from → to` direction. Changes nothing.
///
/// # Errors
/// The driver's error, e.g. [`DriverError::INVALID_DEVICE`] for `from == to`.
#[doc(alias = "cuDeviceGetP2PAttribute")]
pub fn p2p_attributes(from: Device, to: Device) -> Result<P2PAttributes> {
    let get = |attribute: c_int| -> Result<i32> {
        let mut value: c_int = 0;
        // SAFETY: `value` is writable for the call; both devices are ordinals the driver accepted.
        check(unsafe {
            sys::cuDeviceGetP2PAttribute(&raw mut value, attribute, from.as_raw(), to.as_raw())
        })?;
        Ok(value)
    };
    Ok(P2PAttributes {
        performance_rank: get(sys::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK)?,
        access_supported: get(sys::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED)? != 0,
        native_atomics: get(sys::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED)? != 0,
        cuda_array_access: get(sys::CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED)? != 0,
    })
}

/// The live [`PeerAccess`] guards of each direction. The driver's peer table is process-wide, so
/// overlapping guards of one direction share one enablement: the first enables, the last to end
/// disables. Every `enable` and `end` takes this lock, so they are serialised process-wide (ending the
/// last guard of a direction synchronises its `from` context under it).
static ENABLED: Mutex<GuardCounts<Held>> = Mutex::new(GuardCounts::new());

/// A `(from, to)` direction, by device ordinal. Every [`Context`] is its device's primary context, so a
/// device names its context.
type Pair = (i32, i32);

fn pair(from: &Context, to: &Context) -> Pair {
    (from.device().as_raw(), to.device().as_raw())
}

/// What a direction with live guards holds on to.
struct Held {
    /// Both primary contexts, retained while the direction has guards, forgotten ones included: a
    /// primary context released by its last user is reset, and a reset drops its peer access. Held
    /// here, a forgotten guard keeps the direction really enabled (a leak), and no later guard can
    /// count on an enablement that a reset took away.
    _contexts: (Context, Context),
    /// Whether the first guard enabled the direction itself. Where the driver answered
    /// `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED` instead, other code sharing the primary context enabled
    /// it, and the last guard leaves it enabled as it found it.
    disable_at_end: bool,
}

/// Live guards per direction, each with what it holds: the bookkeeping behind overlapping guards, free
/// of driver calls.
#[derive(Debug)]
struct GuardCounts<H>(BTreeMap<Pair, (usize, H)>);

impl<H> GuardCounts<H> {
    const fn new() -> GuardCounts<H> {
        GuardCounts(BTreeMap::new())
    }

    /// Whether `pair` has a live guard (its direction is enabled).
    #[cfg(test)]
    fn is_enabled(&self, pair: Pair) -> bool {
        self.0.contains_key(&pair)
    }

    /// Records a new guard of `pair` and returns the direction's hold: the one it has where it has
    /// live guards already, else one made by `hold` (where that fails, nothing is recorded).
    fn add<E>(&mut self, pair: Pair, hold: impl FnOnce() -> Result<H, E>) -> Result<&mut H, E> {
        let entry = match self.0.entry(pair) {
            Entry::Occupied(entry) => entry.into_mut(),
            Entry::Vacant(entry) => entry.insert((0, hold()?)),
        };
        // A count of live guards cannot overflow: each guard is a value in memory.
        entry.0 += 1;
        Ok(&mut entry.1)
    }

    /// Ends one guard of `pair`; its hold where it was the last, so the direction is to be disabled.
    fn remove(&mut self, pair: Pair) -> Option<H> {
        let Entry::Occupied(mut entry) = self.0.entry(pair) else {
            return None;
        };
        let count = &mut entry.get_mut().0;
        *count = count.saturating_sub(1);
        if *count > 0 {
            return None;
        }
        Some(entry.remove().1)
    }
}

/// Context peer access from one context to another, enabled while this guard lives.
///
/// `cuCtxEnablePeerAccess` when made; when it ends (drop, or [`disable`](PeerAccess::disable)), the
/// `from` context is synchronised and then `cuCtxDisablePeerAccess` turns the direction off, unless
/// another guard of the same direction still lives. Whatever uses the peer memory borrows the guard
/// ([`DeviceBuffer::peer_slice`](crate::DeviceBuffer::peer_slice)), so access cannot end while in use.
///
/// While a direction has guards, the crate also keeps both primary contexts retained. Forgetting a
/// guard (`mem::forget`) therefore leaves the direction enabled, and both contexts alive, for the rest
/// of the process: a leak, never a use after disable.
///
/// Access that other code sharing the primary context (a runtime-based library, say) had enabled
/// before the first guard is left enabled when the last guard ends.
///
/// `enable` and the end of a guard are serialised process-wide by one lock.
///
/// # Lifetimes
/// `'ctx` is the borrow of both contexts: neither can be released while the guard lives.
pub struct PeerAccess<'ctx> {
    from: &'ctx Context,
    to: &'ctx Context,
}

impl fmt::Debug for PeerAccess<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerAccess")
            .field("from", &self.from.device())
            .field("to", &self.to.device())
            .finish()
    }
}

impl<'ctx> PeerAccess<'ctx> {
    /// `cuCtxEnablePeerAccess` — let `from` access memory of `to`'s context (one direction).
    ///
    /// `link` is the answer of [`can_access_peer`]`(from.device(), to.device())`. Access that is already
    /// enabled (`CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`, by another guard or by other code) is not an
    /// error. The first guard of a direction also retains both primary contexts until the last one
    /// ends.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] where `link` is not for these two devices in this direction;
    /// [`DriverError::TOO_MANY_PEERS`] where `from` already has the most peers the driver allows (8);
    /// [`DriverError::PEER_ACCESS_UNSUPPORTED`] or another driver error otherwise.
    #[doc(alias = "cuCtxEnablePeerAccess")]
    pub fn enable(
        from: &'ctx Context,
        to: &'ctx Context,
        link: PeerLink,
    ) -> Result<PeerAccess<'ctx>, Error> {
        for (expected, found) in [(link.from, from.device()), (link.to, to.device())] {
            if expected != found {
                return Err(Error::DeviceMismatch {
                    expected: expected.as_raw(),
                    found: found.as_raw(),
                });
            }
        }
        let mut counts = ENABLED.lock().unwrap_or_else(PoisonError::into_inner);
        // Asked of the driver every time, not only for the first guard: the bookkeeping then never
        // stands in for the driver's own table.
        from.bind_to_thread()?;
        // SAFETY: `from` is current; `to.as_raw()` is a retained context (borrowed for `'ctx`); flags 0.
        let code = unsafe { sys::cuCtxEnablePeerAccess(to.as_raw(), 0) };
        let enabled_here = match DriverError::from_raw(code) {
            None => true,
            Some(e) if e == DriverError::PEER_ACCESS_ALREADY_ENABLED => false,
            Some(e) => return Err(e.into()),
        };
        let added = counts.add(pair(from, to), || {
            Ok::<_, Error>(Held {
                _contexts: (Context::new(from.device())?, Context::new(to.device())?),
                disable_at_end: enabled_here,
            })
        });
        match added {
            Ok(held) => {
                // Enabled here while guards live: other code disabled it meanwhile, and the last guard
                // now owns the enablement.
                held.disable_at_end |= enabled_here;
                Ok(PeerAccess { from, to })
            }
            Err(e) => {
                // No guard was recorded (the contexts could not be retained): undo this enable.
                if enabled_here {
                    // SAFETY: `from` is still current (bound above; retaining a primary context does
                    // not change the current one); `to.as_raw()` is retained; nothing used the access.
                    let _ = unsafe { sys::cuCtxDisablePeerAccess(to.as_raw()) };
                }
                Err(e)
            }
        }
    }

    /// `cuDeviceCanAccessPeer` + `cuCtxEnablePeerAccess` — ask the driver whether `from` can access
    /// `to`'s memory and, where it can, [`enable`](PeerAccess::enable) that direction: the one call
    /// that opens the link for a phase of work (copies from [`peer_slice`](crate::DeviceBuffer::peer_slice)
    /// views at the link's speed, kernels reading peer memory). Access ends with the guard.
    ///
    /// # Errors
    /// [`Error::NoPeerLink`] where the driver reports no link in this direction (always for one
    /// device); as [`enable`](PeerAccess::enable) otherwise.
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::{Context, Device, PeerAccess};
    ///
    /// # fn main() -> Result<(), cuda_vmm::Error> {
    /// let (gpu0, gpu1) = (Context::new(Device::get(0)?)?, Context::new(Device::get(1)?)?);
    /// let guard = PeerAccess::open(&gpu1, &gpu0)?; // GPU 1 may now read and write GPU 0's buffers
    /// // ... peer views and copies borrow `guard` ...
    /// guard.disable()?;
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuCtxEnablePeerAccess")]
    pub fn open(from: &'ctx Context, to: &'ctx Context) -> Result<PeerAccess<'ctx>, Error> {
        let link = can_access_peer(from.device(), to.device())?.ok_or(Error::NoPeerLink {
            from: from.device().as_raw(),
            to: to.device().as_raw(),
        })?;
        PeerAccess::enable(from, to, link)
    }

    /// The context that accesses.
    #[must_use]
    pub fn from(&self) -> &'ctx Context {
        self.from
    }

    /// The context whose memory is accessed.
    #[must_use]
    pub fn to(&self) -> &'ctx Context {
        self.to
    }

    /// Ends the guard and reports the driver's answer, which `drop` ignores. Only the last guard of the
    /// direction calls the driver: it synchronises `from`, then `cuCtxDisablePeerAccess` (unless other
    /// code had enabled the access before the first guard; see the type's docs). Access that is
    /// already disabled (`CUDA_ERROR_PEER_ACCESS_NOT_ENABLED`, by other code) is not an error.
    ///
    /// # Errors
    /// The error of the synchronisation (work in `from` failed) or of the disable.
    #[doc(alias = "cuCtxDisablePeerAccess")]
    pub fn disable(self) -> Result<(), Error> {
        let this = core::mem::ManuallyDrop::new(self);
        this.end()
    }

    fn end(&self) -> Result<(), Error> {
        let mut counts = ENABLED.lock().unwrap_or_else(PoisonError::into_inner);
        // Dropped (releasing the retained contexts) when this function returns, after the disable;
        // the guard's own borrows keep both contexts alive until then in any case.
        let Some(held) = counts.remove(pair(self.from, self.to)) else {
            return Ok(());
        };
        if !held.disable_at_end {
            return Ok(());
        }
        // The disable below acts on the current context: without `from` current it must not run (the
        // direction then stays enabled: a leak, not a use after disable).
        self.from.bind_to_thread()?;
        // Complete all work that may use peer memory before access goes away (the chapter's rule).
        let synced = self.from.synchronize();
        // SAFETY: `from` is current (bound above; `synchronize` binds it again); `to.as_raw()` is a
        // retained context.
        let code = unsafe { sys::cuCtxDisablePeerAccess(self.to.as_raw()) };
        synced?;
        if DriverError::from_raw(code) == Some(DriverError::PEER_ACCESS_NOT_ENABLED) {
            return Ok(());
        }
        Ok(check(code)?)
    }
}

impl Drop for PeerAccess<'_> {
    fn drop(&mut self) {
        // Errors are ignored: `drop` cannot return them. A failed synchronisation is sticky and shows in
        // the context's next call; call `disable` to see it here.
        let _ = self.end();
    }
}

#[cfg(test)]
mod tests {
    use super::{GuardCounts, Pair};
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// Against a model: a direction is enabled exactly while it has guards, its hold is made by
        /// the first guard only and handed back by the last, and a failed hold records nothing.
        #[test]
        fn guard_counts_follow_the_model(ops in proptest::collection::vec((0i32..3, 0i32..3, 0u8..3), 0..64)) {
            let mut counts: GuardCounts<usize> = GuardCounts::new();
            let mut model: HashMap<Pair, (usize, usize)> = HashMap::new();
            let mut holds_made = 0usize;
            for (from, to, op) in ops {
                let pair = (from, to);
                let live = model.get(&pair).map_or(0, |m| m.0);
                prop_assert_eq!(counts.is_enabled(pair), live > 0);
                match op {
                    0 => {
                        let hold = *counts.add(pair, || -> Result<usize, ()> {
                            holds_made += 1;
                            Ok(holds_made)
                        }).unwrap();
                        let entry = model.entry(pair).or_insert((0, holds_made));
                        entry.0 += 1;
                        prop_assert_eq!(hold, entry.1, "one hold per run of overlapping guards");
                    }
                    1 => {
                        let failed = counts.add(pair, || Err::<usize, &str>("no hold"));
                        prop_assert_eq!(failed.is_err(), live == 0, "the hold is asked for only first");
                        if let Ok(_hold) = failed {
                            model.get_mut(&pair).unwrap().0 += 1;
                        }
                    }
                    _ => {
                        let last = counts.remove(pair);
                        let expected = (live == 1).then(|| model[&pair].1);
                        prop_assert_eq!(last, expected);
                        if live > 0 {
                            model.get_mut(&pair).unwrap().0 -= 1;
                            if live == 1 {
                                model.remove(&pair);
                            }
                        }
                    }
                }
                prop_assert_eq!(counts.is_enabled(pair), model.get(&pair).is_some_and(|m| m.0 > 0));
            }
        }
    }

    #[test]
    fn overlapping_guards_disable_once() {
        let mut counts: GuardCounts<&str> = GuardCounts::new();
        counts.add((1, 2), || Ok::<_, ()>("first")).unwrap();
        let second = counts.add((1, 2), || Ok::<_, ()>("second")).unwrap();
        assert_eq!(
            *second, "first",
            "the second guard shares the first one's hold"
        );
        counts.add((2, 1), || Ok::<_, ()>("other")).unwrap();
        assert_eq!(
            counts.remove((1, 2)),
            None,
            "a guard of 1 -> 2 is still live"
        );
        assert!(counts.is_enabled((1, 2)));
        assert_eq!(
            counts.remove((1, 2)),
            Some("first"),
            "the last guard of 1 -> 2 ended"
        );
        assert!(!counts.is_enabled((1, 2)));
        assert!(
            counts.is_enabled((2, 1)),
            "the other direction is untouched"
        );
        assert_eq!(counts.remove((1, 2)), None, "nothing to end");
        assert!(
            counts.add((3, 4), || Err::<&str, _>("refused")).is_err(),
            "a hold that cannot be made records no guard"
        );
        assert!(!counts.is_enabled((3, 4)));
    }
}
