//! Evict and restore at a stable address: the bytes of a range's pages copied to pinned host
//! memory (an [`Evicted`] handle), the pages unmapped and released while the reservation stays, and
//! later new pages mapped at the same addresses with the bytes copied back.

use core::fmt;
use core::ops::{Range, RangeBounds};

use super::{BUDGET, Memory, Table, VirtualBuffer, bump, unmap_span};
use crate::device::Device;
use crate::error::{Error, check};
use crate::owned::pages::{RETIRED, Span, insertion_point, pages_inside};
use crate::stream::PinnedBuffer;
use crate::sys;
use crate::view::range_bounds;
use crate::vmm::access::ReadWrite;
use crate::vmm::physical::PhysicalAllocation;

/// What an evicted range's bytes are, in errors.
pub(super) const EVICTED: &str =
    "are evicted: their bytes are in host memory until VirtualBuffer::restore maps them again";

/// Refuses `[start, end)` where it shares a byte with an evicted range of `evicted` (sorted,
/// disjoint), naming that range.
pub(super) fn check_not_evicted(
    evicted: &[(usize, usize)],
    start: usize,
    end: usize,
) -> Result<(), Error> {
    if start >= end {
        return Ok(());
    }
    let index = evicted.partition_point(|e| e.1 <= start);
    match evicted.get(index) {
        Some(&(s, e)) if s < end => Err(Error::PageRange {
            start: s,
            end: e,
            problem: EVICTED,
        }),
        _ => Ok(()),
    }
}

/// The pages of `table` inside `[start, end)`, checked for an eviction before any driver call: at
/// least one, none retired, every one granted and owned by the buffer (not a share).
pub(super) fn evictable_pieces(
    table: &Table,
    start: usize,
    end: usize,
) -> Result<Vec<Piece>, Error> {
    let span = pages_inside(&table.pages, start, end)?;
    let pages = table.pages.get(span).unwrap_or_default();
    if pages.is_empty() {
        return Err(Error::PageRange {
            start,
            end,
            problem: "hold no page to evict",
        });
    }
    let mut pieces = Vec::with_capacity(pages.len());
    for page in pages {
        let problem = if page.retired {
            Some(RETIRED)
        } else if !page.granted {
            Some("are mapped but not granted (undoing a failed grant failed): not readable")
        } else if matches!(page.memory, Memory::Shared(_)) {
            Some("are a shared page, whose memory its other shares keep: evicting it frees nothing")
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(Error::PageRange {
                start: page.start(),
                end: page.end(),
                problem,
            });
        }
        pieces.push(Piece {
            offset: page.offset,
            size: page.memory.size(),
            device: page.device,
        });
    }
    Ok(pieces)
}

/// Refuses `pieces` unless each is still an evicted range of `table` (a handle restored already is
/// not restored again).
pub(super) fn check_still_evicted(table: &Table, pieces: &[Piece]) -> Result<(), Error> {
    match pieces
        .iter()
        .find(|p| !table.evicted.contains(&(p.offset, p.end())))
    {
        Some(piece) => Err(Error::PageRange {
            start: piece.offset,
            end: piece.end(),
            problem: "are not evicted (the handle was restored already?)",
        }),
        None => Ok(()),
    }
}

/// One evicted page: where it was, its size and its device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Piece {
    pub(super) offset: usize,
    pub(super) size: usize,
    pub(super) device: Device,
}

impl Piece {
    pub(super) fn end(&self) -> usize {
        self.offset.saturating_add(self.size)
    }
}

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

impl<M: crate::vmm::access::AccessMode> VirtualBuffer<M> {
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
        self.lock()
            .evicted
            .iter()
            .fold(0usize, |sum, e| sum.saturating_add(e.1.saturating_sub(e.0)))
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
        self.reclaim_all_finished();
        let pieces = self.evictable(start, end)?;
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
        let (evicted, refused) = self.unmap_evicted(&pieces);
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

    /// The pages inside `[start, end)`, checked for an eviction before any driver call.
    fn evictable(&mut self, start: usize, end: usize) -> Result<Vec<Piece>, Error> {
        evictable_pieces(self.table_mut(), start, end)
    }

    /// Unmaps and releases the pages of `pieces`, in order, marking each range evicted; stops at
    /// the first refused unmap. The pieces evicted, and the refusal.
    fn unmap_evicted(&mut self, pieces: &[Piece]) -> (Vec<Piece>, Option<crate::DriverError>) {
        let base = self.base;
        let table = self.table_mut();
        let mut evicted = Vec::with_capacity(pieces.len());
        for piece in pieces {
            let Some(index) = table.pages.iter().position(|p| p.offset == piece.offset) else {
                continue;
            };
            bump(&mut table.stats.unmap_calls);
            // SAFETY: the page's whole mapping, made by `map_at`, unmapped once: it leaves the
            // table below. It is neither retired nor shared (checked), no view lives (`&mut
            // self`), every copy through one finished before it returned (the copy to host above
            // too), and every scope that lent one has waited for its work.
            let unmapped = check(unsafe {
                sys::cuMemUnmap(base.wrapping_add(piece.offset as u64), piece.size)
            });
            if let Err(error) = unmapped {
                return (evicted, Some(error));
            }
            let page = table.pages.remove(index);
            bump(&mut table.stats.pages_released);
            bump(&mut table.stats.pages_evicted);
            // Ignored, as in `drop`: the page is unmapped and gone either way (see `evict`).
            let _ = page.memory.release_code();
            mark_evicted(table, core::slice::from_ref(piece));
            evicted.push(*piece);
        }
        (evicted, None)
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
        self.reclaim_all_finished();
        check_still_evicted(self.table_mut(), &evicted.pieces)?;
        let memories = self.memories_for(&evicted.pieces)?;
        {
            let mut table = self.lock();
            let mut mapped = 0usize;
            for (piece, memory) in evicted.pieces.iter().zip(memories) {
                let index =
                    insertion_point(&table.pages, piece.offset, piece.end()).and_then(|index| {
                        self.map_at(
                            &mut table,
                            index,
                            piece.offset,
                            Memory::Own(memory),
                            piece.device,
                        )
                    });
                if let Err(error) = index {
                    drop(table);
                    // The refused piece too: where undoing its grant failed, its page stayed.
                    let tried = mapped.saturating_add(1);
                    let base = self.base;
                    let pieces = evicted.pieces.get(..tried).unwrap_or(&evicted.pieces);
                    undo_restore(base, self.table_mut(), pieces);
                    return Err(error);
                }
                mapped = mapped.saturating_add(1);
            }
            clear_evicted(&mut table, &evicted.pieces);
        }
        let mut at = 0usize;
        for piece in &evicted.pieces {
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
                let base = self.base;
                let table = self.table_mut();
                undo_restore(base, table, &evicted.pieces);
                mark_evicted(table, &evicted.pieces);
                return Err(error);
            }
            at = to;
        }
        let table = self.table_mut();
        for _ in &evicted.pieces {
            bump(&mut table.stats.pages_restored);
        }
        Ok(())
    }
}

/// Marks the ranges of `pieces` evicted in `table` (kept sorted and disjoint): no view, lend or new
/// page reaches them until [`clear_evicted`].
pub(super) fn mark_evicted(table: &mut Table, pieces: &[Piece]) {
    for piece in pieces {
        let at = table.evicted.partition_point(|e| e.0 < piece.offset);
        table.evicted.insert(at, (piece.offset, piece.end()));
    }
}

/// Takes the evicted marks of `pieces` off `table`: their ranges are mapped again, or the eviction
/// was undone.
pub(super) fn clear_evicted(table: &mut Table, pieces: &[Piece]) {
    table
        .evicted
        .retain(|e| !pieces.iter().any(|p| (p.offset, p.end()) == *e));
}

/// Unmaps and releases the pages just mapped at `pieces` by a restore that failed (host-waiting or
/// stream-ordered, each with its copies finished or none queued); a retired page of an earlier
/// mapping at the same offset is left to its release. Errors are ignored (a page the driver
/// refuses to unmap stays in the buffer, and the next unmap or the drop tries it again).
pub(super) fn undo_restore(base: u64, table: &mut Table, pieces: &[Piece]) {
    for piece in pieces {
        if let Some(index) = table
            .pages
            .iter()
            .position(|p| p.offset == piece.offset && !p.retired)
        {
            let _ = unmap_span(base, table, index..index.saturating_add(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{EVICTED, check_not_evicted};
    use crate::Error;

    #[test]
    fn evicted_ranges_are_refused_by_name() {
        let evicted = [(4, 8), (12, 16)];
        assert_eq!(check_not_evicted(&evicted, 0, 4), Ok(()));
        assert_eq!(check_not_evicted(&evicted, 8, 12), Ok(()));
        assert_eq!(
            check_not_evicted(&evicted, 6, 7),
            Err(Error::PageRange {
                start: 4,
                end: 8,
                problem: EVICTED
            })
        );
        assert_eq!(
            check_not_evicted(&evicted, 9, 20),
            Err(Error::PageRange {
                start: 12,
                end: 16,
                problem: EVICTED
            })
        );
        assert_eq!(check_not_evicted(&evicted, 5, 5), Ok(()), "an empty range");
        assert_eq!(check_not_evicted(&[], 0, 100), Ok(()));
    }
}
