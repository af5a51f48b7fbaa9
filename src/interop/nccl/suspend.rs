//! A communicator's memory given back while the engine sleeps: [`Comm::suspend`] and
//! [`Comm::resume`] (`ncclCommSuspend`, `ncclCommResume`, NCCL 2.29.7 and later), refused with
//! [`Error::NcclUnavailable`] where the loaded NCCL has no such functions.
//!
//! An inference engine that sleeps (its weights and KV cache evicted to host memory, or released)
//! gives back its communicators' buffers too, about a gigabyte per GPU, and resumes them with the
//! communicator's identity and connections kept, instead of destroying and making it again. NCCL's
//! rule is that a suspended communicator is not used until it is resumed: here both take `&mut`,
//! so no scope, registration or group member of the communicator is alive across either call, and
//! every use between them is refused at run time ([`Error::NcclRefused`]).

use super::api::{self, IN_PROGRESS, SUSPEND_MEM};
use super::comm::Comm;
use crate::error::Error;

/// Why the suspend functions are missing.
const NEEDS_2_29_7: &str = "the loaded NCCL library has no ncclCommSuspend and ncclCommResume \
                            (they came with NCCL 2.29.7): keep the communicator, or destroy it and \
                            make it again";

impl Comm {
    /// `ncclCommSuspend` with `NCCL_SUSPEND_MEM` — give back the communicator's suspendable device
    /// memory until [`resume`](Comm::resume), keeping the communicator: for an engine going to
    /// sleep. Collective: every rank of the clique suspends (a thread that drives several ranks,
    /// [`Comm::from_devices`], suspends them inside one [`group`](super::group), since NCCL's
    /// barriers wait for every rank).
    ///
    /// Takes `&mut self`: no scope or registration of the communicator lives across it. Until [`resume`](Comm::resume), every call on the communicator (a scope, a
    /// collective, a registration) is refused with [`Error::NcclRefused`]. Dropping a suspended
    /// communicator destroys it (a non-blocking one is aborted, its finalize being refused).
    ///
    /// # Errors
    /// Before NCCL is called: [`Error::NcclUnavailable`] where the loaded NCCL has no
    /// `ncclCommSuspend` (older than 2.29.7, such as 2.28.3); [`Error::NcclRefused`] where the
    /// communicator is suspended already, aborted, or has a window registered (its memory is
    /// mapped into the other ranks; deregister it first). [`Error::Nccl`] for NCCL's refusal (a
    /// non-blocking communicator is then aborted).
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::interop::nccl::Comm;
    ///
    /// fn sleep_and_wake(comm: &mut Comm) -> cuda_vmm::Result<()> {
    ///     comm.suspend()?; // ncclCommSuspend(comm, NCCL_SUSPEND_MEM)
    ///     // ... the engine sleeps: its KV cache evicted, its weights released ...
    ///     comm.resume() // ncclCommResume: the same communicator, its buffers back
    /// }
    /// ```
    #[doc(alias = "ncclCommSuspend")]
    pub fn suspend(&mut self) -> Result<(), Error> {
        const CALL: &str = "ncclCommSuspend";
        let api = api::api(CALL)?;
        let suspend = api.comm_suspend.ok_or(Error::NcclUnavailable {
            call: CALL,
            why: NEEDS_2_29_7,
        })?;
        if self.core.suspended.get() {
            return Err(Error::NcclRefused {
                call: CALL,
                why: "the communicator is suspended already",
            });
        }
        if !self.core.windows.borrow().is_empty() {
            return Err(Error::NcclRefused {
                call: CALL,
                why: "the communicator has a window registered, whose memory the other ranks \
                      map: deregister its windows before suspending it",
            });
        }
        self.core.live(CALL)?;
        // SAFETY: a live communicator (not aborted or suspended: checked) that NCCL made; no work
        // of it is queued (every scope waited, `&mut self`), no window is registered (checked).
        let code = unsafe { suspend(self.core.raw, SUSPEND_MEM) };
        self.core.finish(code, CALL)?;
        self.core.suspended.set(true);
        Ok(())
    }

    /// `ncclCommResume` — bring back what [`suspend`](Comm::suspend) gave back; the communicator
    /// is used as before. Collective, as `suspend`.
    ///
    /// # Errors
    /// Before NCCL is called: [`Error::NcclUnavailable`] where the loaded NCCL has no
    /// `ncclCommResume`; [`Error::NcclRefused`] where the communicator is not suspended, or was
    /// aborted. [`Error::Nccl`] for NCCL's refusal: the communicator stays suspended (a
    /// non-blocking one whose resume fails while NCCL polls it is aborted).
    ///
    /// # Examples
    /// ```no_run
    /// # use cuda_vmm::interop::nccl::Comm;
    /// fn wake(comm: &mut Comm) -> cuda_vmm::Result<()> {
    ///     if comm.is_suspended() {
    ///         comm.resume()?;
    ///     }
    ///     Ok(())
    /// }
    /// ```
    #[doc(alias = "ncclCommResume")]
    pub fn resume(&mut self) -> Result<(), Error> {
        const CALL: &str = "ncclCommResume";
        let api = api::api(CALL)?;
        let resume = api.comm_resume.ok_or(Error::NcclUnavailable {
            call: CALL,
            why: NEEDS_2_29_7,
        })?;
        if !self.core.suspended.get() {
            return Err(Error::NcclRefused {
                call: CALL,
                why: "the communicator is not suspended",
            });
        }
        // `live` refuses a suspended communicator: checked here without it.
        self.core.unless_aborted(CALL)?;
        self.core.bind()?;
        // SAFETY: a communicator that NCCL made and `suspend` suspended (checked), not aborted
        // (checked); nothing of it is in use (`&mut self`).
        let code = unsafe { resume(self.core.raw) };
        if code == 0 || code == IN_PROGRESS {
            // Resumed, or resuming in NCCL's thread, which `finish` polls with the calls that a
            // suspended communicator refuses.
            self.core.suspended.set(false);
        }
        self.core.finish(code, CALL)
    }

    /// Whether the communicator is suspended ([`suspend`](Comm::suspend)): every call but
    /// [`resume`](Comm::resume) is refused then.
    #[must_use]
    pub fn is_suspended(&self) -> bool {
        self.core.suspended.get()
    }
}
