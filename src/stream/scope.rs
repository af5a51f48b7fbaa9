//! [`scope`] and the [`ScopedStream`]s it hands out: the queued operations, which borrow what they
//! use until the scope has waited for them.

use core::fmt;
use core::marker::PhantomData;
use core::ops::Deref;
use core::ptr;
use std::sync::{Mutex, PoisonError};

use crate::error::{Error, Result, first_error};
#[cfg(doc)]
use crate::view::{DeviceSlice, DeviceSliceMut};
use crate::wait;

use super::lend::Registry;
use super::{Stream, StreamId};
#[cfg(doc)]
use super::{
    event::Event,
    lend::{DeviceInFlight, HostInFlight},
    rewritable::Rewritable,
};

/// `cuStreamSynchronize` on every stream of a scope — run stream-ordered work that borrows views,
/// host memory and kernels for the rest of the scope, and wait for all of it before returning.
///
/// `f` receives the [`Scope`]; [`Scope::on`] turns a [`Stream`] into a [`ScopedStream`], which queues
/// copies, memsets and kernel launches that borrow what they use for `'scope`. When `f` returns, or
/// panics, `scope` waits for every stream it queued on, then returns `f`'s value, or the first error
/// (see `# Errors`), or resumes the panic.
///
/// Why this is sound (the wait is in `scope`'s own frame, so `mem::forget` of anything the caller
/// holds changes nothing), how events order streams, and what happens where a wait fails under
/// stream capture, are the [module documentation](super)'s: [Why a scope](super#why-a-scope),
/// [When a wait fails](super#when-a-wait-fails).
///
/// # Lifetimes
/// - `'scope`: the lifetime of the scope itself — while `f` runs and until every queued operation
///   has finished, when `scope` returns. Everything lent to queued work is borrowed for `'scope`, so
///   it must be declared outside the closure (as with [`std::thread::scope`]). Invariant.
/// - `'env`: the lifetime of whatever the scope borrows from outside (the streams, views, buffers
///   and kernels); it outlives `'scope`.
///
/// # Errors
/// `f`'s error, if it returns one (the waits happen in any case; a wait's failure then is not
/// returned, but a sticky error shows again on the context's next call). Otherwise the first error
/// of the waits: every stream is waited for even after one failed (see
/// [When a wait fails](super#when-a-wait-fails)). An error of one of `f`'s operations leaves the
/// work queued before it in place: it runs, and is waited for.
///
/// # Panics
/// Resumes a panic of `f`, after waiting for every stream (so the borrows it held are free when the
/// panic reaches the caller).
///
/// # Examples
/// Upload on one stream, download on another once the upload is done:
/// ```no_run
/// use cuda_vmm::{Context, Device, DeviceBuffer, Event, PinnedBuffer, Stream};
///
/// # fn main() -> Result<(), cuda_vmm::Error> {
/// let context = Context::new(Device::get(0)?)?;
/// let mut device = DeviceBuffer::<u32>::zeroed(&context, 1 << 20)?;
/// let input = PinnedBuffer::from_slice(&context, &vec![7u32; 1 << 20])?;
/// let mut output = PinnedBuffer::<u32>::zeroed(&context, 1 << 20)?;
/// let (up_stream, down_stream) = (Stream::new(&context)?, Stream::new(&context)?);
/// let uploaded = Event::new(&context)?;
/// let mut view = device.as_mut_slice();
///
/// cuda_vmm::scope(|s| {
///     let (up, down) = (s.on(&up_stream), s.on(&down_stream));
///     // Queued: `view` and `input` stay borrowed until the scope has waited for the copy.
///     let written = up.copy_from_host(&mut view, &input)?;
///     up.record(&uploaded)?;
///     down.wait(&uploaded)?;
///     down.copy_to_host(&mut output, written)?;
///     Ok(())
/// })?; // both streams waited for
/// assert!(output.iter().all(|&x| x == 7));
/// # Ok(())
/// # }
/// ```
///
/// A host buffer cannot be dropped while queued work may still read it (nor touched at all while
/// queued work writes it):
/// ```compile_fail,E0505
/// # use cuda_vmm::{Context, Device, DeviceBuffer, PinnedBuffer, Stream};
/// # fn main() -> Result<(), cuda_vmm::Error> {
/// # let context = Context::new(Device::get(0)?)?;
/// # let mut device = DeviceBuffer::<u32>::zeroed(&context, 1024)?;
/// # let mut view = device.as_mut_slice();
/// let input = PinnedBuffer::from_slice(&context, &[1u32; 1024])?;
/// let stream = Stream::new(&context)?;
/// cuda_vmm::scope(|s| {
///     s.on(&stream).copy_from_host(&mut view, &input)?;
///     drop(input); // the copy may not have run yet
///     Ok(())
/// })?;
/// # Ok(())
/// # }
/// ```
///
/// Nor can a value the closure owns be lent: it is dropped when the closure ends, before the wait.
/// ```compile_fail,E0597
/// # use cuda_vmm::{Context, Device, DeviceBuffer, PinnedBuffer, Stream};
/// # fn main() -> Result<(), cuda_vmm::Error> {
/// # let context = Context::new(Device::get(0)?)?;
/// # let device = DeviceBuffer::<u32>::zeroed(&context, 1024)?;
/// let stream = Stream::new(&context)?;
/// cuda_vmm::scope(|s| {
///     let mut output = PinnedBuffer::<u32>::zeroed(&context, 1024)?;
///     s.on(&stream).copy_to_host(&mut output, device.as_slice())?;
///     Ok(())
/// })?;
/// # Ok(())
/// # }
/// ```
#[doc(alias = "cuStreamSynchronize")]
pub fn scope<'env, F, T>(f: F) -> Result<T, Error>
where
    F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> Result<T, Error>,
{
    let scope = Scope {
        streams: Mutex::new(Streams::new()),
        _lifetimes: PhantomData,
    };
    // The wait is in `wait::after`'s frame, on return and while a panic of `f` unwinds, before any
    // borrow lent to the scope ends.
    let (result, waited) = wait::after(|| f(&scope), &|| scope.wait_all());
    let value = result?;
    waited?;
    Ok(value)
}

/// The scope of [`scope`]: where streams become [`ScopedStream`]s ([`Scope::on`]), and which waits
/// for every one of them before [`scope`] returns.
///
/// # Lifetimes
/// As [`scope`]: `'scope` is the scope itself (until every queued operation has finished), `'env`
/// what it borrows from outside. Both are invariant, as in [`std::thread::Scope`].
pub struct Scope<'scope, 'env: 'scope> {
    /// Every stream work was queued on, waited for when the scope ends. A `Mutex`, so that a scope
    /// can be shared with threads (`std::thread::scope`) that queue work too.
    streams: Mutex<Streams<'scope, Stream>>,
    /// Invariant in `'scope`, which can be neither shortened (that would let a queued operation
    /// borrow something that ends before the wait) nor lengthened; invariant in `'env`, as
    /// `std::thread::Scope`. `Send` and `Sync`.
    _lifetimes: PhantomData<(&'scope mut &'scope (), &'env mut &'env ())>,
}

impl fmt::Debug for Scope<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Scope")
            .field("streams", &streams.iter().collect::<Vec<_>>())
            .finish()
    }
}

impl<'scope> Scope<'scope, '_> {
    /// Registers `stream` with the scope, which will wait for it before [`scope`] returns, and returns
    /// the handle that queues work on it. Registering a stream again returns the same handle.
    pub fn on(&'scope self, stream: &'scope Stream) -> ScopedStream<'scope> {
        self.streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(stream);
        ScopedStream {
            stream,
            _scope: PhantomData,
        }
    }

    /// The streams of the scope, for the handles whose memory can leave while it lasts (a buffer
    /// lent to the scope, [`VirtualBuffer::in_scope`](crate::VirtualBuffer::in_scope)).
    pub(crate) fn registry(&'scope self) -> &'scope (dyn Registry + 'scope) {
        &self.streams
    }

    /// Waits for every registered stream, all of them even after an error; the first error.
    fn wait_all(&self) -> Result<(), Error> {
        let streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        first_error(streams.iter().map(Stream::synchronize))
    }
}

impl Registry for Mutex<Streams<'_, Stream>> {
    fn registered(&self, stream: StreamId) -> bool {
        let streams = self.lock().unwrap_or_else(PoisonError::into_inner);
        streams.iter().any(|s| s.id() == stream)
    }

    fn each(&self, f: &mut dyn FnMut(&Stream) -> Result<(), Error>) -> Result<(), Error> {
        let streams = self.lock().unwrap_or_else(PoisonError::into_inner);
        first_error(streams.iter().map(f))
    }
}

/// The streams of a scope, each once: the first few inline (a scope usually has one to four, and
/// registering them then allocates nothing), the rest in a `Vec`.
struct Streams<'a, S> {
    inline: [Option<&'a S>; 4],
    more: Vec<&'a S>,
}

impl<'a, S> Streams<'a, S> {
    fn new() -> Streams<'a, S> {
        Streams {
            inline: [None; 4],
            more: Vec::new(),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &'a S> + '_ {
        self.inline
            .iter()
            .flatten()
            .copied()
            .chain(self.more.iter().copied())
    }

    /// Adds `stream` unless it is there already (the same value: compared by address).
    fn insert(&mut self, stream: &'a S) {
        if self.iter().any(|s| ptr::eq(s, stream)) {
            return;
        }
        match self.inline.iter_mut().find(|slot| slot.is_none()) {
            Some(slot) => *slot = Some(stream),
            None => self.more.push(stream),
        }
    }
}

/// A [`Stream`] registered with a [`Scope`] (by [`Scope::on`]): it queues copies, memsets and kernel
/// launches that borrow what they use for `'scope`, and the scope waits for it before it ends.
///
/// Every operation checks its arguments before any driver call: lengths, and that the stream's
/// device reaches each view's memory ([`DeviceSlice::reachable_from`]; [`Error::NoPeerAccess`]
/// otherwise). It then checks that the stream is not capturing a graph, which could run the work
/// after the scope ([`Error::StreamCapturing`], before any work is queued), queues the work and
/// returns at once. An operation that writes device memory returns a [`DeviceInFlight`] of it,
/// valid for the scope, which only work queued after it (on this stream, or on another behind an
/// [`Event`]) reads; one that writes host memory returns a [`HostInFlight`] for the same purpose.
/// The host reads the results after [`scope`] has returned.
///
/// It dereferences to the [`Stream`], whose [`record`](Stream::record) and [`wait`](Stream::wait)
/// order work between streams.
///
/// # Lifetimes
/// `'scope` is the scope's: invariant, so the handle can neither leave the closure nor accept a
/// borrow that ends before the scope's wait.
#[derive(Clone, Copy)]
pub struct ScopedStream<'scope> {
    stream: &'scope Stream,
    /// Invariant in `'scope`, as [`Scope`].
    _scope: PhantomData<&'scope mut &'scope ()>,
}

impl fmt::Debug for ScopedStream<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ScopedStream").field(self.stream).finish()
    }
}

impl Deref for ScopedStream<'_> {
    type Target = Stream;
    fn deref(&self) -> &Stream {
        self.stream
    }
}

#[cfg(test)]
mod tests {
    use super::Streams;

    #[test]
    fn a_stream_is_registered_once_and_every_one_is_kept() {
        let values: Vec<u32> = (0..10).collect();
        let mut streams = Streams::new();
        for v in values.iter().chain(&values) {
            streams.insert(v);
        }
        let kept: Vec<u32> = streams.iter().copied().collect();
        assert_eq!(kept, values, "inline ones first, then the rest, each once");
        // Equal values at two addresses are two streams.
        let twin = 3u32;
        streams.insert(&twin);
        assert_eq!(streams.iter().count(), 11);
    }
}
