//! Peer-to-peer access between devices: capability queries (one report per direction:
//! [`pair_capabilities`]) and a guard that keeps context peer access enabled while anything uses it.
//!
//! Two mechanisms open one GPU's memory to another, and they do not overlap:
//! - **Context peer access** (`cuCtxEnablePeerAccess`, this module's [`PeerAccess`]) opens memory from
//!   `cuMemAlloc` ([`DeviceBuffer`](crate::DeviceBuffer)) of one context to another context. It does
//!   **not** open VMM mappings.
//! - **VMM access grants** (`cuMemSetAccess`, [`Mapping::grant_all`](crate::Mapping::grant_all) and
//!   [`Mapping::grant_revocable`](crate::Mapping::grant_revocable)) open one mapping to the devices
//!   named, whether or not context peer access is enabled.

use core::ffi::c_int;
use core::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::device::{Context, Device};
use crate::error::{DriverError, DriverResult, Error, Result, check};
use crate::sys;

mod guards;
// `DeviceBuffer::peer_slice` and `peer_slice_mut`.
pub(crate) mod transfer;
mod views;

use guards::{GuardCounts, Pair};
pub use transfer::{
    CopyPath, Route, STAGING_CHUNK_BYTES, Staging, copy_between, copy_between_with,
};

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

/// What one direction between two devices can do, in one report ([`pair_capabilities`]): whether
/// `from` reaches `to`'s memory directly and the driver's attributes of that link. With
/// [`Device::capabilities`] of each device, what an engine picks its path between two GPUs from:
/// a direct copy or a VMM grant naming the other device where [`peer_access`] is true, staging
/// through host memory where not.
///
/// [`peer_access`]: PairCapabilities::peer_access
///
/// # Examples
/// ```no_run
/// use cuda_vmm::{Device, peer::pair_capabilities};
///
/// # fn main() -> cuda_vmm::Result<()> {
/// let pair = pair_capabilities(Device::get(0)?, Device::get(1)?)?;
/// println!("GPU 0 reaches GPU 1 directly: {} (rank {})", pair.peer_access,
///          pair.attributes.map_or(-1, |a| a.performance_rank));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct PairCapabilities {
    /// The device that would access.
    pub from: Device,
    /// The device whose memory would be accessed.
    pub to: Device,
    /// Whether `from` can access `to`'s memory directly (`cuDeviceCanAccessPeer`).
    pub peer_access: bool,
    /// The link's attributes (`cuDeviceGetP2PAttribute`); `None` for a device and itself, which
    /// has no link.
    pub attributes: Option<P2PAttributes>,
}

/// `cuDeviceCanAccessPeer`, `cuDeviceGetP2PAttribute` — what the `from → to` direction can do, with
/// no allocation and no change: [`can_access_peer`] and [`p2p_attributes`] in one report. For
/// `from == to`, no access and no attributes.
///
/// # Errors
/// The driver's error, if any.
#[doc(alias = "cuDeviceCanAccessPeer")]
#[doc(alias = "cuDeviceGetP2PAttribute")]
pub fn pair_capabilities(from: Device, to: Device) -> Result<PairCapabilities> {
    let (peer_access, attributes) = if from == to {
        (false, None)
    } else {
        (
            can_access_peer(from, to)?.is_some(),
            Some(p2p_attributes(from, to)?),
        )
    };
    Ok(PairCapabilities {
        from,
        to,
        peer_access,
        attributes,
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
    /// Enabling and disabling take milliseconds (about 9.7 ms for the pair on two H200s): the driver
    /// maps every allocation of the peer into the accessing context. Keep a guard for a phase of
    /// copies ([`PeerAccess::open`]), never one per copy.
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
