//! [`group`]: NCCL groups, whose collectives are launched together at the group's end, inside
//! every scope that encloses it; and the probe that finds a group begun outside the crate.

use core::cell::RefCell;
use core::ffi::c_int;
use std::rc::Rc;

use super::api::{self, IN_PROGRESS};
#[cfg(doc)]
use super::comm::Comm;
use super::handle::{Core, enter_group, in_group, leave_group};
use crate::error::Error;

thread_local! {
    /// The communicators whose collectives the outermost [`group`] of this thread holds, settled
    /// at its end where they are non-blocking.
    static GROUP_COMMS: RefCell<Vec<Rc<Core>>> = const { RefCell::new(Vec::new()) };
}

/// Why a collective is refused in a group of communicators of the other kind.
const MIXED: &str = "the NCCL group holds collectives of a blocking communicator and of a \
                     non-blocking one, which NCCL refuses in one group";

/// Whether a collective of a communicator that blocks or not (`blocking`) may join a group whose
/// communicators so far are `joined` (their `blocking`, or `None` for none yet).
pub(super) fn may_join(joined: Option<bool>, blocking: bool) -> bool {
    joined.is_none_or(|j| j == blocking)
}

/// `ncclInvalidUsage`: what `ncclGroupEnd` answers where no group is open on the thread.
const INVALID_USAGE: c_int = 5;

/// More group levels than any program nests: where a probe still finds one open after these, the
/// library does not answer as NCCL does, and the levels are given back.
const MAX_FOREIGN_LEVELS: usize = 4096;

/// Why a collective is refused while a group begun outside this crate is open.
const FOREIGN_GROUP: &str = "an NCCL group begun outside this crate (cudarc's `group_start`, say) \
                             is open on this thread: NCCL would launch the work at that group's \
                             end, after the scope has waited; end it first, or use \
                             `nccl::group` inside the scope";

/// `ncclGroupEnd` as a probe: `Ok` where no NCCL group is open on this thread, so that NCCL queues
/// the call about to be made at once, before any scope's wait.
///
/// NCCL's group state is per thread and shared by every binding of the library in the process: a
/// group that cudarc's `group_start` began defers this crate's collectives to that group's end,
/// which may come after the scope's wait, and this crate's own group count does not see it. NCCL
/// has no query for the depth, but a lone `ncclGroupEnd` outside any group answers
/// `ncclInvalidUsage` and changes nothing (measured on NCCL 2.28: 5, about 60 ns; read in
/// `ncclGroupEndInternal`, whose first test is the depth). Inside a group it ends one level of it
/// (the outermost launches what the group holds); this then begins one again, so that the
/// caller's own `ncclGroupEnd` still has a group to end, and refuses the call.
///
/// # Errors
/// [`Error::NcclRefused`] where a group was open; [`Error::NcclUnavailable`] where NCCL or its group
/// functions cannot be loaded.
pub(super) fn no_foreign_group(call: &'static str) -> Result<(), Error> {
    let api = api::api(call)?;
    let end = api::function(api.group_end, "ncclGroupEnd")?;
    let start = api::function(api.group_start, "ncclGroupStart")?;
    // SAFETY: no arguments. Outside a group it returns `ncclInvalidUsage` before touching any
    // state; inside one it ends one level, which the `ncclGroupStart` below gives back.
    let code = unsafe { end() };
    if code == INVALID_USAGE {
        return Ok(());
    }
    // SAFETY: no arguments; begins the level that the probe ended, which the caller of the
    // foreign group ends.
    let _ = unsafe { start() };
    Err(Error::NcclRefused {
        call,
        why: FOREIGN_GROUP,
    })
}

/// Before a collective of `core`: outside a [`group`] of this crate, refuses it while a group begun
/// outside the crate is open ([`no_foreign_group`]); inside one, records the communicator for the
/// group's end, and refuses a communicator that blocks where the group's others do not, or the
/// reverse.
pub(super) fn join_group(core: &Rc<Core>, call: &'static str) -> Result<(), Error> {
    if !in_group() {
        return no_foreign_group(call);
    }
    GROUP_COMMS.with(|comms| {
        let mut comms = comms.try_borrow_mut().map_err(|_| Error::NcclRefused {
            call,
            why: "the group's list of communicators is in use (a collective queued from inside \
                  another's bookkeeping)",
        })?;
        if !may_join(comms.first().map(|c| c.blocking), core.blocking) {
            return Err(Error::NcclRefused { call, why: MIXED });
        }
        if !comms.iter().any(|c| Rc::ptr_eq(c, core)) {
            comms.push(Rc::clone(core));
        }
        Ok(())
    })
}

/// `ncclGroupStart`, `f`, `ncclGroupEnd` — the collectives `f` queues (on any communicators of this
/// thread, in scopes opened before the group) are launched together when the group ends: the one
/// way for a thread that drives several GPUs ([`Comm::from_devices`]) to queue a collective on each.
///
/// The group ends when `f` returns, and when it unwinds: inside every scope that encloses this
/// call, so each scope's wait comes after the launch. A scope opened inside `f` is refused.
///
/// Where the group holds collectives of [non-blocking](super::CommOptions) communicators, its end
/// polls each of them until NCCL has launched its work (`ncclCommGetAsyncError`), so that every
/// enclosing scope's wait comes after the launch. One group takes communicators of one kind only:
/// a collective of a blocking communicator in a group of non-blocking ones, or the reverse, is
/// refused ([`Error::NcclRefused`]), as NCCL would refuse the group.
///
/// # Errors
/// `f`'s error, else [`Error::Nccl`] from `ncclGroupEnd` (which reports the group's collectives'
/// errors), or from polling a non-blocking communicator (which is then aborted);
/// [`Error::NcclUnavailable`] where NCCL cannot be loaded (`f` does not run then).
///
/// # Panics
/// Resumes a panic of `f`, after ending the group.
#[doc(alias = "ncclGroupStart")]
#[doc(alias = "ncclGroupEnd")]
pub fn group<R, E>(f: impl FnOnce() -> Result<R, E>) -> Result<R, E>
where
    E: From<Error>,
{
    let api = api::api("ncclGroupStart")?;
    let start = api::function(api.group_start, "ncclGroupStart")?;
    let end = api::function(api.group_end, "ncclGroupEnd")?;
    if !in_group() {
        // An outermost group of this crate ends at depth 0, launching its collectives: not inside
        // a group begun elsewhere, which would hold them past every scope's wait.
        no_foreign_group("ncclGroupStart")?;
    }
    // SAFETY: no arguments; the group is ended by `Ender` below on every path.
    api::check(unsafe { start() }, "ncclGroupStart")?;
    enter_group();
    let mut group = Ender { end, armed: true };
    let value = f();
    let ended = group.finish();
    let value = value?;
    ended?;
    Ok(value)
}

/// Ends a group begun by [`group`]: by `finish` after the closure returned, or by `Drop` while a
/// panic of the closure unwinds.
struct Ender {
    end: unsafe extern "C" fn() -> c_int,
    armed: bool,
}

impl Ender {
    fn finish(&mut self) -> Result<(), Error> {
        const CALL: &str = "ncclGroupEnd";
        self.armed = false;
        let depth = leave_group();
        // SAFETY: ends the group that `group` began on this thread (groups nest per thread).
        let code = unsafe { (self.end)() };
        if depth > 0 {
            // An inner group: NCCL launches nothing before the outermost one ends.
            return api::check(code, CALL);
        }
        let comms = GROUP_COMMS.with(|c| {
            c.try_borrow_mut()
                .map(|mut c| core::mem::take(&mut *c))
                .unwrap_or_default()
        });
        // A group begun inside this one (through another binding) and left open holds the
        // collectives still: they are launched now, by ending every level of it, each then begun
        // again for the code that began it.
        let left_open = launch_foreign_levels(self.end);
        if !(code == 0 || code == IN_PROGRESS) {
            return Err(Error::Nccl { call: CALL, code });
        }
        if left_open > 0 {
            return Err(Error::NcclRefused {
                call: CALL,
                why: "a group begun inside this one outside the crate was still open at its end: \
                      its levels were ended, launching the group's collectives before any \
                      scope's wait, and begun again",
            });
        }
        // A non-blocking group returns `ncclInProgress` and launches in NCCL's thread: each of its
        // communicators is polled until the launch is done (an error aborts that communicator).
        let mut settled = Ok(());
        for core in comms.iter().filter(|c| !c.blocking) {
            let polled = core.settle(CALL);
            if settled.is_ok() {
                settled = polled;
            }
        }
        settled
    }
}

/// Ends every NCCL group level open on this thread (probing with `end` until it answers
/// `ncclInvalidUsage`), so that what they hold is launched now, then begins as many again: how many
/// there were. Called where this crate's outermost group has ended, so every level found was begun
/// outside the crate.
fn launch_foreign_levels(end: unsafe extern "C" fn() -> c_int) -> usize {
    let mut levels = 0usize;
    // SAFETY: no arguments. Each call that does not answer `ncclInvalidUsage` ended one open level,
    // and a level is begun again below for each. NCCL's depth is finite; the bound only keeps a
    // library that answered otherwise at depth 0 from spinning here.
    while levels < MAX_FOREIGN_LEVELS && unsafe { end() } != INVALID_USAGE {
        levels = levels.saturating_add(1);
    }
    if levels > 0
        && let Ok(start) = api::api("ncclGroupStart")
            .and_then(|api| api::function(api.group_start, "ncclGroupStart"))
    {
        for _ in 0..levels {
            // SAFETY: no arguments; gives back a level ended above, which its owner ends.
            let _ = unsafe { start() };
        }
    }
    levels
}

impl Drop for Ender {
    fn drop(&mut self) {
        if self.armed {
            // Unwinding: the group is ended (launching what it queued, inside every enclosing scope,
            // which then waits for it); its error is lost with the panic, which is resumed.
            let _ = self.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_takes_communicators_of_one_kind() {
        assert!(may_join(None, true));
        assert!(may_join(None, false));
        assert!(may_join(Some(false), false));
        assert!(may_join(Some(true), true));
        assert!(!may_join(Some(true), false));
        assert!(!may_join(Some(false), true));
    }
}
