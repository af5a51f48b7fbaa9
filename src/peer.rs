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

/// How many live [`PeerAccess`] guards each `(from, to)` context pair has. The driver's peer table is
/// process-wide, so overlapping guards of one direction share one enablement: the first enables, the
/// last to end disables.
static ENABLED: Mutex<GuardCounts> = Mutex::new(GuardCounts::new());

/// A `(from, to)` pair of contexts, by handle address.
type Pair = (usize, usize);

fn pair(from: &Context, to: &Context) -> Pair {
    (from.as_raw() as usize, to.as_raw() as usize)
}

/// Live guards per context pair: the bookkeeping behind overlapping guards, free of driver calls.
#[derive(Debug)]
struct GuardCounts(Vec<(Pair, usize)>);

impl GuardCounts {
    const fn new() -> GuardCounts {
        GuardCounts(Vec::new())
    }

    /// Whether `pair` has a live guard (its direction is enabled).
    fn is_enabled(&self, pair: Pair) -> bool {
        self.0.iter().any(|e| e.0 == pair)
    }

    /// Records a new guard of `pair`.
    fn add(&mut self, pair: Pair) {
        match self.0.iter_mut().find(|e| e.0 == pair) {
            Some(entry) => entry.1 += 1,
            None => self.0.push((pair, 1)),
        }
    }

    /// Ends one guard of `pair`; `true` where it was the last, so the direction is to be disabled.
    fn remove(&mut self, pair: Pair) -> bool {
        let Some(i) = self.0.iter().position(|e| e.0 == pair) else {
            return false;
        };
        self.0[i].1 -= 1;
        if self.0[i].1 > 0 {
            return false;
        }
        self.0.swap_remove(i);
        true
    }
}

/// Context peer access from one context to another, enabled while this guard lives.
///
/// `cuCtxEnablePeerAccess` when made; when it ends (drop, or [`disable`](PeerAccess::disable)), the
/// `from` context is synchronised and then `cuCtxDisablePeerAccess` turns the direction off, unless
/// another guard of the same direction still lives. Whatever uses the peer memory borrows the guard
/// ([`DeviceBuffer::peer_slice`](crate::DeviceBuffer::peer_slice)), so access cannot end while in use.
///
/// Forgetting a guard (`mem::forget`) leaves the direction enabled for the rest of the process: a
/// leak, never a use after disable.
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
    /// error.
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
        if !counts.is_enabled(pair(from, to)) {
            from.bind_to_thread()?;
            // SAFETY: `from` is current; `to.as_raw()` is a retained context (borrowed for `'ctx`); flags 0.
            let code = unsafe { sys::cuCtxEnablePeerAccess(to.as_raw(), 0) };
            if DriverError::from_raw(code) != Some(DriverError::PEER_ACCESS_ALREADY_ENABLED) {
                check(code)?;
            }
        }
        counts.add(pair(from, to));
        Ok(PeerAccess { from, to })
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

    /// Ends the guard and reports the driver's answer, which `drop` ignores: synchronises `from`, then
    /// `cuCtxDisablePeerAccess` if this was the last guard of the direction. Access that is already
    /// disabled (`CUDA_ERROR_PEER_ACCESS_NOT_ENABLED`, by other code) is not an error.
    ///
    /// # Errors
    /// The error of the synchronisation (work in `from` failed) or of the disable.
    #[doc(alias = "cuCtxDisablePeerAccess")]
    pub fn disable(self) -> Result<()> {
        let this = core::mem::ManuallyDrop::new(self);
        this.end()
    }

    fn end(&self) -> Result<()> {
        let mut counts = ENABLED.lock().unwrap_or_else(PoisonError::into_inner);
        if !counts.remove(pair(self.from, self.to)) {
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
        check(code)
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
        /// Against a model: a direction is enabled exactly while it has guards, and `remove` reports
        /// the last guard of a pair once.
        #[test]
        fn guard_counts_follow_the_model(ops in proptest::collection::vec((0usize..3, 0usize..3, any::<bool>()), 0..64)) {
            let mut counts = GuardCounts::new();
            let mut model: HashMap<Pair, usize> = HashMap::new();
            for (from, to, add) in ops {
                let pair = (from, to);
                let live = model.get(&pair).copied().unwrap_or(0);
                prop_assert_eq!(counts.is_enabled(pair), live > 0);
                if add {
                    counts.add(pair);
                    *model.entry(pair).or_default() += 1;
                } else {
                    let last = counts.remove(pair);
                    prop_assert_eq!(last, live == 1);
                    if live > 0 {
                        model.insert(pair, live - 1);
                    }
                }
                prop_assert_eq!(counts.is_enabled(pair), model.get(&pair).copied().unwrap_or(0) > 0);
            }
        }
    }

    #[test]
    fn overlapping_guards_disable_once() {
        let mut counts = GuardCounts::new();
        counts.add((1, 2));
        counts.add((1, 2));
        counts.add((2, 1));
        assert!(!counts.remove((1, 2)), "a guard of 1 -> 2 is still live");
        assert!(counts.is_enabled((1, 2)));
        assert!(counts.remove((1, 2)), "the last guard of 1 -> 2 ended");
        assert!(!counts.is_enabled((1, 2)));
        assert!(
            counts.is_enabled((2, 1)),
            "the other direction is untouched"
        );
        assert!(!counts.remove((1, 2)), "nothing to end");
    }
}
