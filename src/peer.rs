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
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::device::{Context, Device};
use crate::error::{DriverError, DriverResult, Error, Result, check};
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
    let get = |attribute: c_int| -> DriverResult<i32> {
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
/// disables. Every `cuCtxEnablePeerAccess` and `cuCtxDisablePeerAccess` of a guard is made under this
/// lock, so no enable of a direction races its disable. The last guard's wait for its `from` context
/// (which lasts as long as the slowest work queued there) is made without it: see [`GuardCounts`] for
/// why that is sound.
static ENABLED: Mutex<GuardCounts<Held>> = Mutex::new(GuardCounts::new());

/// [`ENABLED`], locked. A poisoned lock is taken as it is: nothing panics while holding it, and the
/// counts are consistent after every method of [`GuardCounts`] in any case.
fn enabled() -> MutexGuard<'static, GuardCounts<Held>> {
    ENABLED.lock().unwrap_or_else(PoisonError::into_inner)
}

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

/// One direction with live guards, or whose last guard is waiting for its context before the disable.
#[derive(Debug)]
struct Direction<H> {
    /// Live guards. 0 while the last guard to end waits for its `from` context: the direction is then
    /// closing, still enabled, and a guard made meanwhile joins it.
    live: usize,
    /// The generation of the latest guard added (see [`GuardCounts::add`]).
    generation: u64,
    /// What the direction holds on to, made by its first guard.
    hold: H,
}

/// The claim of a direction's last guard on ending it, taken by [`GuardCounts::begin_end`] before its
/// wait and redeemed by [`GuardCounts::finish_end`] after it. Neither `Clone` nor `Copy`: one claim
/// per end.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a closing direction stays enabled until its claim is redeemed by `finish_end`"]
struct Closing {
    pair: Pair,
    /// The direction's generation when its last guard ended.
    generation: u64,
}

/// Live guards per direction, each with what it holds: the bookkeeping behind overlapping guards, free
/// of driver calls.
///
/// Ending a guard takes two steps, so that the lock around the counts need not be held while the last
/// guard of a direction waits for its work: [`begin_end`](GuardCounts::begin_end) counts the guard
/// out and, for the last one, keeps the direction (closing, with no live guard) and hands back a
/// [`Closing`] claim; after the wait, [`finish_end`](GuardCounts::finish_end) hands back the hold (the
/// direction is to be disabled now) only where no guard of the direction was added since the claim
/// was taken. Every add moves the direction to a new generation, and the claim names the generation
/// it saw; a guard added while the last one waited therefore makes that waiter's claim stale,
/// whether the new guard still lives (the disable would pull access from under it) or has ended in
/// turn (its own work was queued after the stale waiter's wait began, so only its own end, which
/// waits after that work, may disable). Such a later guard joins the closing direction and inherits
/// its hold; the disable is its end's, or that of the last of its own successors. Generations are
/// numbered across all directions and enablements, so a claim can never match a later enablement of
/// its direction either: exactly one end disables each enablement.
#[derive(Debug)]
struct GuardCounts<H> {
    directions: BTreeMap<Pair, Direction<H>>,
    /// Guards ever added, of any direction: the generation of the latest one.
    adds: u64,
}

impl<H> GuardCounts<H> {
    const fn new() -> GuardCounts<H> {
        GuardCounts {
            directions: BTreeMap::new(),
            adds: 0,
        }
    }

    /// Whether `pair` is enabled: it has a live guard, or its last guard is still waiting to disable.
    #[cfg(test)]
    fn is_enabled(&self, pair: Pair) -> bool {
        self.directions.contains_key(&pair)
    }

    /// The live guards of `pair`.
    #[cfg(test)]
    fn live(&self, pair: Pair) -> usize {
        self.directions
            .get(&pair)
            .map_or(0, |direction| direction.live)
    }

    /// Records a new guard of `pair` and returns the direction's hold: the one it has where it is
    /// enabled already (closing ones included: the new guard joins the access still enabled, and
    /// inherits the end of it), else one made by `hold` (where that fails, nothing is recorded).
    fn add<E>(&mut self, pair: Pair, hold: impl FnOnce() -> Result<H, E>) -> Result<&mut H, E> {
        // Cannot wrap in practice (one per guard made, 2^64 of them); wrapping rather than panicking.
        let generation = self.adds.wrapping_add(1);
        let direction = match self.directions.entry(pair) {
            Entry::Occupied(entry) => entry.into_mut(),
            Entry::Vacant(entry) => entry.insert(Direction {
                live: 0,
                generation,
                hold: hold()?,
            }),
        };
        self.adds = generation;
        direction.generation = generation;
        // A count of live guards cannot overflow: each guard is a value in memory.
        direction.live += 1;
        Ok(&mut direction.hold)
    }

    /// Ends one guard of `pair`. For the last one, the direction's hold and the claim to redeem with
    /// [`finish_end`](GuardCounts::finish_end) once its work has been waited for; the direction stays
    /// enabled (closing) until then. `None` where other guards still live, or where `pair` has no live
    /// guard at all.
    fn begin_end(&mut self, pair: Pair) -> Option<(Closing, &H)> {
        let direction = self.directions.get_mut(&pair)?;
        if direction.live == 0 {
            return None;
        }
        direction.live -= 1;
        let closing = Closing {
            pair,
            generation: direction.generation,
        };
        (direction.live == 0).then_some((closing, &direction.hold))
    }

    /// Redeems the claim of a last guard: the direction's hold, removed, where no guard of it was added
    /// since [`begin_end`](GuardCounts::begin_end) (the direction is to be disabled now); `None` where
    /// one was, so the disable is left to that later guard (or to the last of its successors).
    #[allow(
        clippy::needless_pass_by_value,
        reason = "the claim is used up: one `finish_end` per `begin_end`"
    )]
    fn finish_end(&mut self, closing: Closing) -> Option<H> {
        let Entry::Occupied(entry) = self.directions.entry(closing.pair) else {
            return None;
        };
        let direction = entry.get();
        if direction.live != 0 || direction.generation != closing.generation {
            return None;
        }
        Some(entry.remove().hold)
    }
}

/// Context peer access from one context to another, enabled while this guard lives.
///
/// `cuCtxEnablePeerAccess` when made; when it ends (drop, or [`disable`](PeerAccess::disable)), the
/// `from` context is synchronised and then `cuCtxDisablePeerAccess` turns the direction off, unless
/// another guard of the same direction still lives, or was made while this one waited (that guard then
/// owns the end of the access). Whatever uses the peer memory borrows the guard
/// ([`DeviceBuffer::peer_slice`](crate::DeviceBuffer::peer_slice)), so access cannot end while in use.
///
/// While a direction has guards, the crate also keeps both primary contexts retained. Forgetting a
/// guard (`mem::forget`) therefore leaves the direction enabled, and both contexts alive, for the rest
/// of the process: a leak, never a use after disable.
///
/// Access that other code sharing the primary context (a runtime-based library, say) had enabled
/// before the first guard is left enabled when the last guard ends.
///
/// The driver calls of `enable` and of the end of a guard (`cuCtxEnablePeerAccess`,
/// `cuCtxDisablePeerAccess`) are serialised process-wide by one lock. The wait for `from`'s work before
/// a disable is not made under it, so a slow context holds up no guard of another direction, nor of its
/// own: a guard made while the last one waits joins the access, which is still enabled, and the waiting
/// guard then leaves the disable to it, since its wait may have begun before the new guard's work.
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
        let mut counts = enabled();
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
    /// The crate's process-wide lock is not held while `from` is synchronised, only around the
    /// bookkeeping and the disable: guards of other directions, or of this one, are made and ended
    /// meanwhile. A guard of this direction made during the wait joins the access (still enabled) and
    /// takes over its end, so this one then returns without disabling: the new guard may still live,
    /// and even once it has ended, its work was queued after this wait began, so only its own end's
    /// wait covers it.
    ///
    /// # Errors
    /// The error of the synchronisation (work in `from` failed) or of the disable.
    #[doc(alias = "cuCtxDisablePeerAccess")]
    pub fn disable(self) -> Result<(), Error> {
        let this = core::mem::ManuallyDrop::new(self);
        this.end()
    }

    /// Ends the guard in two steps under the lock, with the wait between them made without it.
    ///
    /// Sound because the direction is not forgotten while its last guard waits: it stays recorded,
    /// closing and still enabled, with its hold (both contexts retained, `disable_at_end`). A guard of
    /// the direction made meanwhile finds it, so it does not take the driver's
    /// `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED` for access that other code enabled (recording that it
    /// must not disable, while this guard disables under its live views), nor make a second hold: it
    /// joins, and its adding makes this guard's claim stale ([`GuardCounts::finish_end`] answers
    /// `None`), so the disable is left to the new guard's end, whose own wait covers its own work.
    /// Where no guard came, the disable is made under the lock again, in the critical section that
    /// removes the direction, so no enable of the direction runs between the check and the disable.
    fn end(&self) -> Result<(), Error> {
        let closing = {
            let mut counts = enabled();
            let Some((closing, held)) = counts.begin_end(pair(self.from, self.to)) else {
                // Other guards of the direction still live.
                return Ok(());
            };
            if !held.disable_at_end {
                // Other code had enabled the access: it stays enabled, nothing to wait for. Dropping
                // the hold releases the retained contexts (the guard's own borrows keep both alive).
                drop(counts.finish_end(closing));
                return Ok(());
            }
            closing
        };
        // Complete all work that may use peer memory before access goes away (the chapter's rule).
        // Without the lock: this lasts as long as the slowest work queued in `from`.
        let synced = self.from.synchronize();
        let mut counts = enabled();
        // Dropped (releasing the retained contexts) when this function returns, after the disable and
        // still under the lock; the guard's own borrows keep both contexts alive until then in any case.
        let Some(held) = counts.finish_end(closing) else {
            // A guard of the direction was made during the wait: the access is its to end.
            return synced;
        };
        if !held.disable_at_end {
            // Cannot be: it was set when this guard's wait began, and a guard that joins only sets it.
            return synced;
        }
        // The disable acts on the current context: without `from` current it must not run (the
        // direction then stays enabled: a leak, not a use after disable). Bound again here rather than
        // relying on the wait to leave it current.
        if let Err(e) = self.from.bind_to_thread() {
            return synced.and(Err(e));
        }
        // SAFETY: `from` is current (bound just above); `to.as_raw()` is a retained context (the guard
        // borrows it, and `held` retains it too).
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
    use super::{Closing, GuardCounts, Pair};
    use proptest::prelude::*;
    use proptest::test_runner::TestCaseError;
    use std::collections::{HashMap, HashSet};

    /// The directions the model test uses: few, so that its operations often meet on one.
    const PAIRS: [Pair; 4] = [(0, 0), (0, 1), (1, 0), (1, 1)];

    /// What the model knows of one enablement of a direction: from the guard that made its hold to
    /// the end that hands it back.
    #[derive(Debug)]
    struct Enablement {
        /// Guards that have not begun to end.
        live: usize,
        /// The hold its first guard made.
        hold: usize,
        /// The latest end that left the direction without a live guard (it then waits).
        latest_waiter: Option<usize>,
    }

    /// Finishes the end `id` (a last guard's, after its wait) and checks it against the model: the
    /// hold comes back (the driver disable) exactly where no guard of the direction lives and no end
    /// that began after this one left it without guards, and once per enablement.
    fn finish(
        counts: &mut GuardCounts<usize>,
        model: &mut HashMap<Pair, Enablement>,
        disabled: &mut HashSet<usize>,
        (closing, pair, id): (Closing, Pair, usize),
    ) -> Result<(), TestCaseError> {
        let expected = model
            .get(&pair)
            .filter(|m| m.live == 0 && m.latest_waiter == Some(id))
            .map(|m| m.hold);
        let ended = counts.finish_end(closing);
        prop_assert_eq!(
            ended,
            expected,
            "disabled exactly without guards and later waiters"
        );
        if let Some(hold) = ended {
            prop_assert!(
                model.get(&pair).is_some_and(|m| m.live == 0),
                "never while a guard lives"
            );
            prop_assert!(disabled.insert(hold), "once per enablement");
            model.remove(&pair);
        }
        Ok(())
    }

    proptest! {
        /// Against a model, with ends that wait (begin, then finish later) interleaved with adds and
        /// other ends: a direction is enabled exactly from its first guard until one end disables it;
        /// its hold is made by the first guard only, shared by every guard until then (guards made
        /// while the last one waits included) and handed back (the driver disable) by exactly one end:
        /// the one that, when its wait is over, finds no live guard and no end that began waiting after
        /// it. A failed hold records nothing.
        #[test]
        fn guard_counts_follow_the_model(
            ops in proptest::collection::vec((0..PAIRS.len(), 0u8..5, 0usize..64), 0..128)
        ) {
            let mut counts: GuardCounts<usize> = GuardCounts::new();
            let mut model: HashMap<Pair, Enablement> = HashMap::new();
            // Ends that have begun and wait: the claim, its direction and the end's number.
            let mut waiting: Vec<(Closing, Pair, usize)> = Vec::new();
            let mut disabled: HashSet<usize> = HashSet::new();
            let (mut holds_made, mut ends) = (0usize, 0usize);
            for (pair, op, pick) in ops {
                let pair = PAIRS[pair];
                let live = model.get(&pair).map_or(0, |m| m.live);
                match op {
                    // A guard is made.
                    0 => {
                        let hold = *counts.add(pair, || -> Result<usize, ()> {
                            holds_made += 1;
                            Ok(holds_made)
                        }).unwrap();
                        let m = model.entry(pair).or_insert(Enablement {
                            live: 0,
                            hold: holds_made,
                            latest_waiter: None,
                        });
                        m.live += 1;
                        prop_assert_eq!(hold, m.hold, "one hold per enablement");
                    }
                    // A guard whose hold cannot be made: asked for only where the direction is not
                    // enabled (closing counts as enabled: the new guard joins).
                    1 => {
                        let joined = counts.add(pair, || Err::<usize, &str>("no hold")).is_ok();
                        prop_assert_eq!(joined, model.contains_key(&pair));
                        if joined {
                            model.get_mut(&pair).unwrap().live += 1;
                        }
                    }
                    // A guard ends; the last one waits (its end finishes later).
                    2 | 4 => {
                        let began = counts.begin_end(pair).map(|(closing, &hold)| (closing, hold));
                        prop_assert_eq!(began.is_some(), live == 1, "the last guard waits");
                        if live > 0 {
                            model.get_mut(&pair).unwrap().live -= 1;
                        }
                        if let Some((closing, hold)) = began {
                            let m = model.get_mut(&pair).unwrap();
                            prop_assert_eq!(hold, m.hold);
                            ends += 1;
                            m.latest_waiter = Some(ends);
                            if op == 2 {
                                waiting.push((closing, pair, ends));
                            } else {
                                // Finished at once, as an end with nothing to wait for does.
                                finish(&mut counts, &mut model, &mut disabled, (closing, pair, ends))?;
                            }
                        }
                    }
                    // A waiting end (any of them) finishes its wait.
                    _ => {
                        if !waiting.is_empty() {
                            let end = waiting.remove(pick % waiting.len());
                            finish(&mut counts, &mut model, &mut disabled, end)?;
                        }
                    }
                }
                for pair in PAIRS {
                    prop_assert_eq!(counts.is_enabled(pair), model.contains_key(&pair));
                    prop_assert_eq!(counts.live(pair), model.get(&pair).map_or(0, |m| m.live));
                }
            }
            // Every wait ends: then exactly the directions with live guards are enabled, and every
            // other enablement was disabled, once.
            for end in waiting {
                finish(&mut counts, &mut model, &mut disabled, end)?;
            }
            for pair in PAIRS {
                let live = model.get(&pair).map_or(0, |m| m.live);
                prop_assert_eq!(counts.is_enabled(pair), live > 0, "no enablement is left unended");
            }
            prop_assert_eq!(disabled.len() + model.len(), holds_made);
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
        assert!(
            counts.begin_end((1, 2)).is_none(),
            "a guard of 1 -> 2 is still live"
        );
        assert!(counts.is_enabled((1, 2)));
        let (closing, hold) = counts.begin_end((1, 2)).unwrap();
        assert_eq!(*hold, "first", "the last guard of 1 -> 2 ended");
        assert!(
            counts.is_enabled((1, 2)),
            "enabled while the last guard waits"
        );
        assert_eq!(
            counts.finish_end(closing),
            Some("first"),
            "and disabled after"
        );
        assert!(!counts.is_enabled((1, 2)));
        assert!(
            counts.is_enabled((2, 1)),
            "the other direction is untouched"
        );
        assert!(counts.begin_end((1, 2)).is_none(), "nothing to end");
        assert!(
            counts.add((3, 4), || Err::<&str, _>("refused")).is_err(),
            "a hold that cannot be made records no guard"
        );
        assert!(!counts.is_enabled((3, 4)));
    }

    /// The ABA case: the last guard E1 waits; a guard G of the same direction is made and ends (so it
    /// is the last again, and waits too) before E1's wait is over. E1 must not disable (its wait may
    /// have begun before G's work was queued); G's end, whose wait began after it, does.
    #[test]
    fn a_guard_made_during_the_last_ones_wait_takes_over_the_disable() {
        let mut counts: GuardCounts<&str> = GuardCounts::new();
        counts.add((1, 2), || Ok::<_, ()>("first")).unwrap();
        let (e1, _) = counts.begin_end((1, 2)).unwrap();
        let g = counts
            .add((1, 2), || Err::<&str, _>("the direction is still enabled"))
            .unwrap();
        assert_eq!(
            *g, "first",
            "G joins the closing direction and shares its hold"
        );
        let (g_end, _) = counts.begin_end((1, 2)).unwrap();
        assert_eq!(
            counts.finish_end(e1),
            None,
            "E1 comes back: G's work may postdate its wait"
        );
        assert!(counts.is_enabled((1, 2)), "still enabled for G's wait");
        assert_eq!(counts.finish_end(g_end), Some("first"), "G's end disables");
        assert!(!counts.is_enabled((1, 2)));

        // G still live when E1's wait is over: E1 leaves it enabled, and G's end waits and disables.
        counts.add((1, 2), || Ok::<_, ()>("second")).unwrap();
        let (e1, _) = counts.begin_end((1, 2)).unwrap();
        counts.add((1, 2), || Err::<&str, _>("joins")).unwrap();
        assert_eq!(counts.finish_end(e1), None, "never while a guard lives");
        assert_eq!(counts.live((1, 2)), 1);
        let (g_end, _) = counts.begin_end((1, 2)).unwrap();
        assert_eq!(counts.finish_end(g_end), Some("second"));
    }

    /// A wait that is over after a later end disabled its direction, and after a new enablement of it
    /// began and is waiting in turn, disables nothing: generations never repeat.
    #[test]
    fn a_stale_wait_never_ends_a_later_enablement() {
        let mut counts: GuardCounts<&str> = GuardCounts::new();
        counts.add((1, 2), || Ok::<_, ()>("first")).unwrap();
        let (e1, _) = counts.begin_end((1, 2)).unwrap();
        counts.add((1, 2), || Err::<&str, _>("joins")).unwrap();
        let (g_end, _) = counts.begin_end((1, 2)).unwrap();
        assert_eq!(
            counts.finish_end(g_end),
            Some("first"),
            "G's wait was over first"
        );
        counts.add((1, 2), || Ok::<_, ()>("second")).unwrap();
        let (h_end, _) = counts.begin_end((1, 2)).unwrap();
        assert_eq!(
            counts.finish_end(e1),
            None,
            "E1's enablement has ended already"
        );
        assert!(
            counts.is_enabled((1, 2)),
            "the new one waits for its own end"
        );
        assert_eq!(counts.finish_end(h_end), Some("second"));
        assert!(!counts.is_enabled((1, 2)));
    }
}
