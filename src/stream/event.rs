//! [`Event`]: a marker in a stream's work, for ordering streams and timing them.

use core::fmt;
use core::ptr;

use crate::device::{Context, Device};
use crate::error::{DriverError, Error, Result, check};
use crate::sys;
use crate::wait;

#[cfg(doc)]
use super::Stream;

/// A marker in a stream's work (`CUevent`): [`Stream::record`] sets it, [`Stream::wait`] makes
/// another stream wait for it, [`Event::synchronize`] makes the host wait for it, and
/// [`Event::elapsed_ms`] reads the time between two of them. Destroyed on drop.
///
/// An event keeps its primary context retained and makes it current before every driver call on the
/// event, also when dropped.
pub struct Event {
    pub(super) raw: sys::CUevent,
    timed: bool,
    context: Context,
}

// SAFETY: a `CUevent` is a handle to a driver object, not to thread-local state; the driver API is
// thread-safe, and every method makes the event's context current first.
unsafe impl Send for Event {}
// SAFETY: as for `Send`: every method takes `&self` and only passes the handle to thread-safe driver
// calls.
unsafe impl Sync for Event {}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("raw", &self.raw)
            .field("timed", &self.timed)
            .field("device", &self.context.device())
            .finish()
    }
}

impl Event {
    /// `cuEventCreate` — an event of `context`'s device without timing
    /// (`CU_EVENT_DISABLE_TIMING`): the cheapest kind, for ordering work.
    ///
    /// # Errors
    /// The driver's error, if any.
    #[doc(alias = "cuEventCreate")]
    pub fn new(context: &Context) -> Result<Event, Error> {
        Event::create(context, sys::CU_EVENT_DISABLE_TIMING)
    }

    /// `cuEventCreate` — an event of `context`'s device that also takes a time stamp when it
    /// completes, for [`elapsed_ms`](Event::elapsed_ms).
    ///
    /// # Errors
    /// The driver's error, if any.
    #[doc(alias = "cuEventCreate")]
    pub fn timed(context: &Context) -> Result<Event, Error> {
        Event::create(context, sys::CU_EVENT_DEFAULT)
    }

    fn create(context: &Context, flags: u32) -> Result<Event, Error> {
        let context = Context::new(context.device())?;
        context.bind_to_thread()?;
        let mut raw: sys::CUevent = ptr::null_mut();
        // SAFETY: `raw` is writable for the call; `context` is current (bound just above).
        check(unsafe { sys::cuEventCreate(&raw mut raw, flags) })?;
        Ok(Event {
            raw,
            timed: flags == sys::CU_EVENT_DEFAULT,
            context,
        })
    }

    /// The device whose primary context the event belongs to.
    #[must_use]
    pub fn device(&self) -> Device {
        self.context.device()
    }

    /// Whether the event takes time stamps (made by [`Event::timed`]).
    #[must_use]
    pub fn is_timed(&self) -> bool {
        self.timed
    }

    /// The raw `CUevent`: an escape hatch that owns nothing. It stays valid while `self` lives; do not
    /// destroy it.
    #[must_use]
    pub fn as_raw(&self) -> sys::CUevent {
        self.raw
    }

    /// `cuEventSynchronize` — wait until the event has completed (at once for an event never
    /// recorded).
    ///
    /// The wait holds under stream capture, as [`Stream::synchronize`] does: other threads'
    /// captures do not refuse it, and an event last recorded in a capture is waited out.
    ///
    /// # Errors
    /// A sticky error of earlier asynchronous work.
    #[doc(alias = "cuEventSynchronize")]
    pub fn synchronize(&self) -> Result<(), Error> {
        wait::event(self.context.as_raw(), self.raw)
    }

    /// `cuEventQuery` — whether the event has completed (`true` also for an event never recorded),
    /// without waiting.
    ///
    /// # Errors
    /// The driver's error other than `CUDA_ERROR_NOT_READY` (which is `Ok(false)`).
    #[doc(alias = "cuEventQuery")]
    pub fn is_complete(&self) -> Result<bool> {
        self.context.bind_to_thread()?;
        // SAFETY: a live event of the current context (bound just above).
        match check(unsafe { sys::cuEventQuery(self.raw) }) {
            Ok(()) => Ok(true),
            Err(DriverError::NOT_READY) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// `cuEventElapsedTime` — the milliseconds from this event to `end` (about half a microsecond of
    /// resolution), both of one device, made by [`Event::timed`], recorded and completed. Negative
    /// where `end` completed first.
    ///
    /// # Errors
    /// [`Error::NotTimed`] where either event was made without timing ([`Event::new`]), and
    /// [`Error::DeviceMismatch`] for events of two devices, both before any driver call; the
    /// driver's error otherwise: `CUDA_ERROR_INVALID_HANDLE` where either event was never recorded,
    /// `CUDA_ERROR_NOT_READY` where either has not completed (call
    /// [`synchronize`](Event::synchronize) on `end` first).
    #[doc(alias = "cuEventElapsedTime")]
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, Error> {
        if !self.is_timed() || !end.is_timed() {
            return Err(Error::NotTimed);
        }
        if end.device() != self.device() {
            return Err(Error::DeviceMismatch {
                expected: self.device().as_raw(),
                found: end.device().as_raw(),
            });
        }
        self.context.bind_to_thread()?;
        let mut ms = 0f32;
        // SAFETY: `ms` is writable for the call; both events are live and belong to the current
        // context (same device, primary contexts).
        check(unsafe { sys::cuEventElapsedTime(&raw mut ms, self.raw, end.raw) })?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // `cuEventDestroy` with the event's context current, on whatever thread drops it; where the
        // context cannot be made current the event is leaked. Errors are ignored (`drop`).
        if self.context.bind_to_thread().is_ok() {
            // SAFETY: an event this value created, destroyed once, with its context current; the
            // driver defers the release of an event still to complete.
            let _ = unsafe { sys::cuEventDestroy_v2(self.raw) };
        }
    }
}
