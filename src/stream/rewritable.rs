//! [`Rewritable`]: device memory a scope's queued work writes again and again, each write ordered
//! after the one before on one stream, and handed to another stream only behind an event.

use core::fmt;

use bytemuck::Pod;

use crate::device::Device;
use crate::error::Error;
use crate::view::DeviceSlice;

use super::StreamId;
use super::event::Event;
use super::lend::{Origin, ScopedWrite, lend_mut, reachable, sealed};
use super::scope::ScopedStream;
#[cfg(doc)]
use super::{lend::DeviceInFlight, scope::scope};

/// Device memory lent for writing for the rest of a scope that queued work may write again and
/// again: each write, lent as `&mut rewritable`, is ordered after the one before, because every write
/// runs on one stream at a time. A ring of two slots then serves any number of batches.
///
/// Made by [`ScopedStream::rewritable`] from a writable view (which it lends for the rest of the
/// scope), or by the `write` of a buffer lent to the scope
/// ([`VirtualBuffer::in_scope`](crate::VirtualBuffer::in_scope)). The first write may run
/// on any stream of the scope, and binds the memory to it; a write on another stream is refused
/// ([`Error::StreamRefused`], before any driver call) until [`hand_over`](Rewritable::hand_over)
/// orders the new stream after the old one behind an [`Event`]. Each write returns a
/// [`DeviceInFlight`], with which later work reads what it wrote; reads queued on other streams are
/// ordered by the caller, as for every [`DeviceInFlight`], and a read ordered after a later write
/// reads that write's bytes. A scoped buffer's range is read back instead
/// (`ScopedBuffer::read_back`), which orders the read itself; its `Rewritable` is refused
/// ([`Error::PageRange`]) from then on.
///
/// Like a [`DeviceInFlight`], it gives the host nothing: no host read, no view.
///
/// # Lifetimes
/// `'scope` is the exclusive borrow of the memory, which lasts the scope.
///
/// # Examples
/// Two slots, a hundred batches, one scope:
/// ```no_run
/// use cuda_vmm::{Context, Device, DeviceBuffer, PinnedBuffer, Stream};
///
/// # fn main() -> Result<(), cuda_vmm::Error> {
/// let context = Context::new(Device::get(0)?)?;
/// let mut slots = DeviceBuffer::<u32>::zeroed(&context, 2 * 1024)?;
/// let batches: Vec<PinnedBuffer<u32>> = (0..100)
///     .map(|b| PinnedBuffer::from_slice(&context, &vec![b; 1024]))
///     .collect::<Result<_, _>>()?;
/// let mut sums = PinnedBuffer::<u32>::zeroed(&context, 100 * 1024)?;
/// let stream = Stream::new(&context)?;
/// let (mut a, mut b) = slots.as_mut_slice().split_at_mut(1024)?;
/// cuda_vmm::scope(|s| {
///     let up = s.on(&stream);
///     let mut ring = [up.rewritable(&mut a)?, up.rewritable(&mut b)?];
///     for (i, (batch, out)) in batches.iter().zip(sums.chunks_mut(1024)?).enumerate() {
///         let written = up.copy_from_host(&mut ring[i % 2], batch)?; // after the slot's last write
///         up.copy_to_host(out, written)?;
///     }
///     Ok(())
/// })?;
/// # Ok(())
/// # }
/// ```
pub struct Rewritable<'scope, T> {
    pub(crate) view: DeviceSlice<'scope, T>,
    pub(crate) origin: Option<Origin<'scope>>,
    /// The stream of the last write, which the next one must run on (`None` before the first).
    pub(crate) stream: Option<StreamId>,
}

// SAFETY: a `Rewritable` is a view's address, length and context, and the identity of a stream
// that it only compares: it gives no thread any access to the memory, and its `&mut` lends are
// exclusive by the borrow rules.
unsafe impl<T: Send> Send for Rewritable<'_, T> {}
// SAFETY: `&Rewritable` gives nothing but the length and the device.
unsafe impl<T: Sync> Sync for Rewritable<'_, T> {}

impl<T> fmt::Debug for Rewritable<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rewritable")
            .field("view", &self.view)
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

impl<'scope, T: Pod> Rewritable<'scope, T> {
    /// The number of values.
    #[must_use]
    pub fn len(&self) -> usize {
        self.view.len()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.view.is_empty()
    }

    /// The device whose context the memory's copies run in.
    #[must_use]
    pub fn device(&self) -> Device {
        self.view.device()
    }

    /// `cuEventRecord`, `cuStreamWaitEvent` — let the next write run on `to`: record `event` on the
    /// stream of the last write and make `to` wait for it, so every write and read queued there
    /// before now comes first. Before the first write it only binds the memory to `to`.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] for an event of another device than the last write's stream (before
    /// any driver call); [`Error::StreamRefused`] where `from` is not the stream of the last write;
    /// the driver's error otherwise, and the memory stays bound to its stream.
    #[doc(alias = "cuEventRecord")]
    #[doc(alias = "cuStreamWaitEvent")]
    pub fn hand_over(
        &mut self,
        from: ScopedStream<'scope>,
        to: ScopedStream<'scope>,
        event: &Event,
    ) -> Result<(), Error> {
        if let Some(stream) = self.stream {
            if stream != from.id() {
                return Err(Error::StreamRefused {
                    why: "the memory was last written on another stream than `from`",
                });
            }
            from.record(event)?;
            to.wait(event)?;
        }
        self.stream = Some(to.id());
        Ok(())
    }
}

impl<T: Pod> sealed::Write for &mut Rewritable<'_, T> {}
impl<'scope, T: Pod> ScopedWrite<'scope, T> for &mut Rewritable<'scope, T> {
    fn lend_mut(self, token: sealed::Token) -> Result<sealed::Lent<'scope, T>, Error> {
        if token.capture {
            return Err(Error::StreamRefused {
                why: "a rewritable view is not captured into a graph: each replay would write it \
                      again, on whichever stream replays it, unordered after its other writes",
            });
        }
        if self.stream.is_some_and(|s| s != token.stream) {
            return Err(Error::StreamRefused {
                why: "memory written on one stream is written again on another only behind an event \
                      (`Rewritable::hand_over`)",
            });
        }
        let lent = sealed::Lent::admit_write(self.view, self.origin, token)?;
        self.stream = Some(token.stream);
        Ok(lent)
    }
    fn check_reach(&self, device: Device) -> Result<(), Error> {
        reachable(&self.view, device)
    }
    fn rewritable_already(&self) -> bool {
        true
    }
}

impl<'scope> ScopedStream<'scope> {
    /// Lends `view` for writing for the rest of the scope, as a [`Rewritable`] that queued work writes
    /// again and again, each write ordered after the one before (see [`Rewritable`]). No driver call;
    /// the first write binds it to its stream.
    ///
    /// # Errors
    /// As the view's lend: [`Error::StreamRefused`] for a view of a scoped buffer of another scope,
    /// [`Error::PageRange`] for one whose pages have been retired. [`Error::StreamRefused`] for a
    /// `&mut Rewritable`: it is its bytes' one writer already, and a second handle, bound to no
    /// stream, could write them on another stream unordered after the first.
    pub fn rewritable<T: Pod>(
        &self,
        view: impl ScopedWrite<'scope, T>,
    ) -> Result<Rewritable<'scope, T>, Error> {
        if view.rewritable_already() {
            return Err(Error::StreamRefused {
                why: "a Rewritable is not made rewritable again: it is its bytes' one writer, and \
                      a second handle could write them on another stream, unordered",
            });
        }
        let token = sealed::Token::new(self.id(), false);
        let (view, origin, _) = lend_mut(view, token)?.into_parts();
        Ok(Rewritable {
            view,
            origin,
            stream: None,
        })
    }
}
