//! Evict and restore at a stable address: the bytes of a range's pages copied to pinned host
//! memory (an [`Evicted`] handle), the pages unmapped and released while the reservation stays, and
//! later new pages mapped at the same addresses with the bytes copied back.

use core::fmt;
use core::ops::{Range, RangeBounds};

use super::page::{Memory, Piece};
use super::{BUDGET, VirtualBuffer};
use crate::error::Error;
use crate::stream::PinnedBuffer;
use crate::view::range_bounds;
use crate::vmm::access::{AccessMode, ReadWrite};
use crate::vmm::physical::PhysicalAllocation;

/// The bytes of a [`VirtualBuffer`]'s evicted pages, in pinned host memory, and where the pages
/// were: made by [`VirtualBuffer::evict`], consumed by [`VirtualBuffer::restore`], which maps new
/// pages at the same addresses (same sizes, same devices) and copies the bytes back.
///
/// It belongs to the buffer it came from: restoring it into another buffer is refused at run time
/// (the types cannot tell two buffers apart). Dropping it drops the bytes; the evicted range then
/// stays evicted (no view, no new page) for the rest of the buffer's life.
///
/// # Examples
/// ```no_run
/// use cuda_vmm::{Device, ReadWrite, VirtualBuffer};
///
/// # fn main() -> cuda_vmm::Result<()> {
/// let device = Device::get(0)?;
/// let mut buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
/// buffer.grow(device, 2 << 20)?;
/// buffer.slice_bytes_mut::<u8>(..2 << 20)?.copy_from_host(&vec![5; 2 << 20])?;
/// let evicted = buffer.evict(..2 << 20)?; // device memory freed, the address kept
/// assert!(evicted.host_bytes().iter().all(|&b| b == 5));
/// buffer.restore(evicted)?;
/// assert_eq!(buffer.slice_bytes::<u8>(..2 << 20)?.to_vec()?, vec![5; 2 << 20]);
/// # Ok(())
/// # }
/// ```
pub struct Evicted {
    /// The id of the buffer it came from.
    pub(super) buffer: u64,
    /// In address order; their bytes lie one after another in `bytes`, in the same order.
    pub(super) pieces: Vec<Piece>,
    pub(super) bytes: PinnedBuffer<u8>,
}

impl fmt::Debug for Evicted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Evicted")
            .field("pieces", &self.pieces)
            .field("bytes", &self.bytes.len())
            .finish_non_exhaustive()
    }
}

impl Evicted {
    /// The byte ranges of the evicted pages (counted from the buffer's base), in address order.
    ///
    /// # Examples
    /// ```no_run
    /// # use cuda_vmm::{Device, ReadWrite, VirtualBuffer};
    /// # fn main() -> cuda_vmm::Result<()> {
    /// # let device = Device::get(0)?;
    /// # let mut buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// buffer.grow(device, 2 << 20)?;
    /// buffer.grow(device, 4 << 20)?;
    /// let evicted = buffer.evict(..)?;
    /// assert_eq!(evicted.ranges().collect::<Vec<_>>(), [0..2 << 20, 2 << 20..6 << 20]);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn ranges(&self) -> impl ExactSizeIterator<Item = Range<usize>> + '_ {
        self.pieces.iter().map(|p| p.offset..p.end())
    }

    /// The evicted bytes, the pages' one after another in address order (holes between pages are
    /// not kept).
    ///
    /// # Examples
    /// ```no_run
    /// # use cuda_vmm::{Device, ReadWrite, VirtualBuffer};
    /// # fn main() -> cuda_vmm::Result<()> {
    /// # let device = Device::get(0)?;
    /// # let mut buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// buffer.grow(device, 2 << 20)?;
    /// assert_eq!(buffer.evict(..)?.host_bytes().len(), 2 << 20);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn host_bytes(&self) -> &[u8] {
        // The pinned memory may be longer (one given to `evict_into`): its first `len` bytes.
        self.bytes.get(..self.len()).unwrap_or(&self.bytes)
    }

    /// The bytes evicted (the sum of the pages' sizes).
    #[must_use]
    pub fn len(&self) -> usize {
        self.pieces
            .iter()
            .fold(0usize, |sum, p| sum.saturating_add(p.size))
    }

    /// Whether no byte was evicted (never: an eviction takes at least one page).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pinned host memory that holds the bytes (at its start), whole: as long as
    /// [`len`](Evicted::len), or longer where it was given to
    /// [`evict_into`](VirtualBuffer::evict_into).
    #[must_use]
    pub fn host_capacity(&self) -> usize {
        self.bytes.len()
    }
}

/// A refused [`VirtualBuffer::restore`]: the error, and the [`Evicted`] handle back, unchanged, so
/// that the bytes are not lost and the restore can be tried again (after memory was freed, say).
/// It converts into the crate's [`Error`] (the handle is dropped then), so `?` works in a function
/// that returns [`crate::Result`].
///
/// # Examples
/// ```no_run
/// use cuda_vmm::{Device, ReadWrite, VirtualBuffer};
///
/// # fn main() -> cuda_vmm::Result<()> {
/// let device = Device::get(0)?;
/// let mut buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
/// buffer.grow(device, 2 << 20)?;
/// let evicted = buffer.evict(..)?;
/// if let Err(refused) = buffer.restore(evicted) {
///     eprintln!("not yet: {}", refused.error());
///     let evicted = refused.into_evicted(); // try again later
/// #   drop(evicted);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct NotRestored {
    pub(super) error: Error,
    pub(super) evicted: Evicted,
}

impl NotRestored {
    /// Why the restore was refused.
    #[must_use]
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// The handle, unchanged.
    #[must_use]
    pub fn into_evicted(self) -> Evicted {
        self.evicted
    }

    /// The error and the handle.
    #[must_use]
    pub fn into_parts(self) -> (Error, Evicted) {
        (self.error, self.evicted)
    }
}

impl fmt::Display for NotRestored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "evicted pages not restored: {}", self.error)
    }
}

impl std::error::Error for NotRestored {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<NotRestored> for Error {
    fn from(refused: NotRestored) -> Error {
        refused.error
    }
}

impl<M: AccessMode> VirtualBuffer<M> {
    /// The bytes of evicted pages not restored yet.
    ///
    /// # Examples
    /// ```no_run
    /// # use cuda_vmm::{Device, ReadWrite, VirtualBuffer};
    /// # fn main() -> cuda_vmm::Result<()> {
    /// # let device = Device::get(0)?;
    /// # let mut buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// buffer.grow(device, 2 << 20)?;
    /// let evicted = buffer.evict(..)?;
    /// assert_eq!((buffer.evicted_bytes(), buffer.mapped_bytes()), (2 << 20, 0));
    /// # drop(evicted);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn evicted_bytes(&self) -> usize {
        self.lock().evicted_bytes()
    }
}

impl VirtualBuffer<ReadWrite> {
    /// `cuMemCreate` of new memory for each of `pieces` (same sizes, same devices, the buffer's
    /// page options): all of it before any page is mapped, so the likely refusal (out of memory)
    /// changes nothing.
    pub(super) fn memories_for(&self, pieces: &[Piece]) -> Result<Vec<PhysicalAllocation>, Error> {
        pieces
            .iter()
            .map(|p| PhysicalAllocation::with_options(p.size, self.options.for_device(p.device)))
            .collect()
    }

    /// `cuMemHostAlloc`, `cuMemcpyDtoH`, `cuMemUnmap`, `cuMemRelease` — evict the pages inside the
    /// byte range `range`: copy their bytes to pinned host memory (returned in an [`Evicted`]),
    /// then unmap them and release their memory, so that the device's free memory rises by their
    /// size. The reservation stays: the range is marked evicted, and until
    /// [`restore`](VirtualBuffer::restore) maps it again it gives no view, no lend to a scope and
    /// no new page ([`Error::PageRange`] naming the evicted bytes). Holes inside the range stay
    /// holes; the other pages keep their addresses and bytes.
    ///
    /// Takes `&mut self`: no view of the pages lives, and the work of every scope that lent one has
    /// finished. Only a [`ReadWrite`] buffer evicts, since a restore writes the bytes back through
    /// the buffer's own grant.
    ///
    /// # Errors
    /// Before any driver call: [`Error::OutOfBounds`]; [`Error::PageRange`] where a page straddles
    /// either end of the range, where the range holds no page, or for a page that is retired, not
    /// granted, or a share of a [`SharedPage`](crate::owned::SharedPage) (whose memory other
    /// mappings keep: evicting it would free nothing). Then the driver's error of the pinning or a
    /// copy: nothing is changed. Where `cuMemUnmap` of a page is refused, the pages evicted before
    /// it are restored at once and the error returned ([`Error::CleanupFailed`] where that restore
    /// fails too: their bytes are then lost, their range stays evicted). A refused `cuMemRelease`
    /// is not reported (the page is unmapped and evicted; its memory may stay allocated until the
    /// process ends), as in `drop`. No driver failure of a whole-mapping unmap is known.
    ///
    /// # Examples
    /// A view of the evicted range is refused, and the address is the same after the restore:
    /// ```no_run
    /// use cuda_vmm::{Device, Error, ReadWrite, VirtualBuffer};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let page = 2 << 20;
    /// let mut buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// buffer.grow(device, page)?;
    /// buffer.grow(device, page)?;
    /// let evicted = buffer.evict(page..2 * page)?;
    /// assert!(matches!(buffer.slice_bytes::<u8>(page..), Err(Error::PageRange { .. })));
    /// assert!(buffer.grow(device, page).is_ok()); // after the evicted range, not over it
    /// buffer.restore(evicted)?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// A view does not live across the eviction of its pages:
    /// ```compile_fail,E0502
    /// # fn main() -> cuda_vmm::Result<()> {
    /// # let device = cuda_vmm::Device::get(0)?;
    /// let mut buffer = cuda_vmm::VirtualBuffer::new(1 << 30, &[device], cuda_vmm::ReadWrite)?;
    /// buffer.grow(device, 2 << 20)?;
    /// let view = buffer.slice_bytes::<u8>(..)?;
    /// let evicted = buffer.evict(..)?; // unmaps the page the view reads
    /// view.to_vec()?;
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuMemcpyDtoH")]
    #[doc(alias = "cuMemUnmap")]
    #[doc(alias = "cuMemRelease")]
    pub fn evict(&mut self, range: impl RangeBounds<usize>) -> Result<Evicted, Error> {
        self.evict_with(range, None)
    }

    /// `cuMemcpyDtoH`, `cuMemUnmap`, `cuMemRelease` — as [`evict`](VirtualBuffer::evict), into
    /// `host`, pinned host memory the caller keeps from one eviction to the next (given back by
    /// [`restore_host`](VirtualBuffer::restore_host)): pinning is the slow part of an eviction
    /// (`cuMemHostAlloc` of 1 GiB takes longer than copying it over the host link many times), so
    /// an engine that sleeps and wakes often pins once. The bytes are written at the start of
    /// `host`; the rest of it is left as it was.
    ///
    /// # Errors
    /// As [`evict`](VirtualBuffer::evict); and, before any driver call, [`Error::LengthMismatch`]
    /// where `host` is shorter than the pages to evict (`expected` is their size). On any error
    /// `host` is dropped (freed).
    ///
    /// # Examples
    /// Sleep and wake twice with one pinned buffer:
    /// ```no_run
    /// use cuda_vmm::{Context, Device, PinnedBuffer, ReadWrite, VirtualBuffer};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let mut weights = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// weights.grow(device, 64 << 20)?;
    /// let mut host = PinnedBuffer::<u8>::zeroed(&Context::new(device)?, 64 << 20)?;
    /// for _ in 0..2 {
    ///     let asleep = weights.evict_into(.., host)?; // no pinning here
    ///     host = weights.restore_host(asleep)?; // the same pinned memory back
    /// }
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuMemcpyDtoH")]
    #[doc(alias = "cuMemUnmap")]
    #[doc(alias = "cuMemRelease")]
    pub fn evict_into(
        &mut self,
        range: impl RangeBounds<usize>,
        host: PinnedBuffer<u8>,
    ) -> Result<Evicted, Error> {
        self.evict_with(range, Some(host))
    }

    /// [`evict`](VirtualBuffer::evict) into `host`, or into new pinned memory.
    fn evict_with(
        &mut self,
        range: impl RangeBounds<usize>,
        host: Option<PinnedBuffer<u8>>,
    ) -> Result<Evicted, Error> {
        let (start, end) = range_bounds(range, self.budget, BUDGET)?;
        let pieces = {
            let mut table = self.table_mut();
            table.reclaim_finished();
            table.evictable(start, end)?
        };
        let total = pieces.iter().try_fold(0usize, |sum, p| {
            sum.checked_add(p.size).ok_or(Error::Overflow {
                what: "evicted bytes",
            })
        })?;
        let mut bytes = match host {
            Some(host) if host.len() >= total => host,
            Some(host) => {
                return Err(Error::LengthMismatch {
                    expected: total,
                    found: host.len(),
                });
            }
            // SAFETY: `total` bytes, the pieces' sizes added up: the loop below writes every one of
            // them (the pieces one after another, each copy finished when it returns) before
            // `bytes` is handed out; where a copy fails, `bytes` is dropped unread.
            None => unsafe { PinnedBuffer::<u8>::unfilled(self.first_context()?, total)? },
        };
        let host = bytes.as_mut_ptr();
        let mut at = 0usize;
        for piece in &pieces {
            let view = self.slice_bytes::<u8>(piece.offset..piece.end())?;
            // SAFETY: `[at, at + size)` lies inside the first `total` bytes of `bytes` (the sizes
            // add up to `total`, and `bytes` holds at least that many), which nothing else reads or
            // writes meanwhile (`bytes` is owned here).
            unsafe { view.copy_to_host_raw(host.wrapping_add(at))? };
            at = at.saturating_add(piece.size);
        }
        let (evicted, refused) = self.table_mut().evict(&pieces);
        let evicted = Evicted {
            buffer: self.id,
            pieces: evicted,
            bytes,
        };
        let Some(error) = refused else {
            return Ok(evicted);
        };
        if evicted.pieces.is_empty() {
            return Err(Error::Driver(error));
        }
        // Undo: the pages evicted before the refusal are mapped again with their bytes.
        match self.restore(evicted) {
            Ok(()) => Err(Error::Driver(error)),
            Err(refused) => Err(match refused.error.driver() {
                Some(cleanup) => Error::CleanupFailed {
                    error,
                    cleanup,
                    what: "eviction (restoring the pages evicted before the refused unmap)",
                },
                None => refused.error,
            }),
        }
    }

    /// `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`, `cuMemcpyHtoD` — restore the pages of
    /// `evicted`, which [`evict`](VirtualBuffer::evict) of this buffer made: new memory of the same
    /// sizes and devices (made with the buffer's [`PageOptions`](super::PageOptions)) mapped at the
    /// same addresses, granted to the buffer's access set, and the bytes copied back. The addresses
    /// are those the pages had; the range gives views again.
    ///
    /// All the memory is created before any page is mapped, so the likely refusal (out of memory)
    /// changes nothing.
    ///
    /// # Errors
    /// A [`NotRestored`] holding the error and the handle back, unchanged; the buffer is then as it
    /// was (the range still evicted). [`Error::InvalidArgument`] for a handle of another buffer,
    /// before any driver call; then the driver's error, e.g.
    /// [`DriverError::OUT_OF_MEMORY`](crate::DriverError::OUT_OF_MEMORY) from `cuMemCreate`. A refused map, grant or copy undoes
    /// the pages mapped so far.
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::{Device, ReadWrite, VirtualBuffer};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let mut buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// buffer.grow(device, 2 << 20)?;
    /// let base = buffer.base();
    /// let evicted = buffer.evict(..)?;
    /// buffer.restore(evicted)?; // `?` turns a `NotRestored` into the crate's `Error`
    /// assert_eq!(buffer.base(), base);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// A handle is restored once:
    /// ```compile_fail,E0382
    /// # fn main() -> cuda_vmm::Result<()> {
    /// # let device = cuda_vmm::Device::get(0)?;
    /// let mut buffer = cuda_vmm::VirtualBuffer::new(1 << 30, &[device], cuda_vmm::ReadWrite)?;
    /// buffer.grow(device, 2 << 20)?;
    /// let evicted = buffer.evict(..)?;
    /// buffer.restore(evicted)?;
    /// buffer.restore(evicted)?; // moved by the first restore
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuMemCreate")]
    #[doc(alias = "cuMemMap")]
    #[doc(alias = "cuMemSetAccess")]
    #[doc(alias = "cuMemcpyHtoD")]
    pub fn restore(&mut self, evicted: Evicted) -> Result<(), NotRestored> {
        self.restore_host(evicted).map(drop)
    }

    /// `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`, `cuMemcpyHtoD` — as
    /// [`restore`](VirtualBuffer::restore), and gives back the pinned host memory that held the
    /// bytes, for the next [`evict_into`](VirtualBuffer::evict_into).
    ///
    /// # Errors
    /// As [`restore`](VirtualBuffer::restore).
    ///
    /// # Examples
    /// ```no_run
    /// # use cuda_vmm::{Device, ReadWrite, VirtualBuffer};
    /// # fn main() -> cuda_vmm::Result<()> {
    /// # let device = Device::get(0)?;
    /// let mut buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// buffer.grow(device, 2 << 20)?;
    /// let evicted = buffer.evict(..)?; // pins 2 MiB once
    /// let host = buffer.restore_host(evicted)?;
    /// let evicted = buffer.evict_into(.., host)?; // and reuses them
    /// buffer.restore(evicted)?;
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuMemcpyHtoD")]
    pub fn restore_host(&mut self, evicted: Evicted) -> Result<PinnedBuffer<u8>, NotRestored> {
        let restored = if evicted.buffer == self.id {
            self.restore_pieces(&evicted)
        } else {
            Err(Error::InvalidArgument {
                what: "an Evicted handle of another buffer: it is restored only into the buffer \
                       it was evicted from",
            })
        };
        match restored {
            Ok(()) => Ok(evicted.bytes),
            Err(error) => Err(NotRestored { error, evicted }),
        }
    }

    fn restore_pieces(&mut self, evicted: &Evicted) -> Result<(), Error> {
        let pieces = &evicted.pieces;
        {
            let mut table = self.table_mut();
            table.reclaim_finished();
            table.check_still_evicted(pieces.iter().map(|p| p.offset..p.end()))?;
        }
        let memories = self.memories_for(pieces)?;
        {
            let mut table = self.shared.settled();
            for (index, (piece, memory)) in pieces.iter().zip(memories).enumerate() {
                let mapped =
                    table.restore(piece, Memory::Own(memory), &self.access, ReadWrite::FLAGS);
                if let Err(error) = mapped {
                    // The refused piece too: where undoing its grant failed, its page stayed.
                    table.unrestore(pieces.get(..=index).unwrap_or(pieces));
                    return Err(error);
                }
            }
        }
        let mut at = 0usize;
        for piece in pieces {
            let to = at.saturating_add(piece.size);
            let copied = evicted
                .bytes
                .get(at..to)
                .ok_or(Error::Overflow {
                    what: "evicted bytes",
                })
                .and_then(|host| {
                    self.slice_bytes_mut::<u8>(piece.offset..piece.end())?
                        .copy_from_host(host)
                });
            if let Err(error) = copied {
                self.table_mut().unrestore(pieces);
                return Err(error);
            }
            at = to;
        }
        self.table_mut().restored(pieces, false);
        Ok(())
    }
}
