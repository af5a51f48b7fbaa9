//! The owned layer: device memory that lives in a struct field for hours, with every rule of the
//! borrowed layer kept.
//!
//! The borrowed layer ([`VirtualReservation`](crate::VirtualReservation), [`Region`](crate::vmm::Region),
//! [`Mapping`](crate::Mapping), [`Access`](crate::Access)) proves the driver's ordering rules with
//! lifetimes: a mapping borrows its reservation and its memory, so it cannot be stored beside them in
//! one struct. The owned layer holds the same driver objects by ownership instead, as std's `OwnedFd`
//! holds a descriptor beside `BorrowedFd<'fd>`:
//!
//! - [`VirtualBuffer`] owns one reservation, every page (physical allocation) mapped into it, and the
//!   contexts of its access set. Mapping a page into an unmapped range (`grow`, `map_page`,
//!   `map_shared`) takes `&self`, since it disturbs no view; every change that could (an unmap, a
//!   shrink, a change of the access set) takes `&mut self`, so no view survives it; views borrow the
//!   buffer. It is `'static` and `Send`, and its `Drop` waits for its retires, then unmaps, releases
//!   and frees in the driver's order.
//! - [`ScopedBuffer`] is a `VirtualBuffer` lent to one [`scope`](crate::scope) for all of it: its
//!   pages grow, are lent to queued work ([`DeviceInFlight`](crate::stream::DeviceInFlight),
//!   [`Rewritable`](crate::stream::Rewritable))
//!   and retire while the work runs, released after an event on every stream of the scope, with no
//!   host wait. Every lend of its views is checked again, so a retired page reaches no later work.
//! - A buffer's reserve ([`VirtualBuffer::reserve_ahead`], [`ReserveOptions`]) takes the driver
//!   calls off the thread that grows it: a worker thread creates, maps and grants pages ahead of
//!   need at the next vacant slots, and unmaps and releases retired pages once their events have
//!   completed. A page of the reserve is no page of the buffer (no view reaches it); a grow onto
//!   it makes no driver call. Its bound is the user's, it shows in [`BufferStats`], and
//!   [`VirtualBuffer::trim`] (or the drop) gives it back, to the byte.
//! - [`ClaimedRange`] ([`VirtualBuffer::claim_bytes_mut`]) holds a writable range through a shared
//!   borrow of the buffer, exclusive at run time, so a graph that writes the range lives while the
//!   buffer grows.
//! - [`OwnedMapping`] owns one physical allocation mapped into a [`SharedReservation`], and a share
//!   of that reservation (an `Arc`), so it can live in a `Vec` or a struct field. The reservation
//!   records the mapped ranges at run time, so two owned mappings never overlap; grants and views are
//!   the borrowed layer's [`Access`](crate::Access), borrowed from the mapping.
//!   [`OwnedMapping::keep_grant`] stores a mapping with its grant ([`GrantedMapping`]), whose views
//!   need no new grant; [`GrantedMapping::slice_joined`] (and `slice_joined_mut`) gives one view
//!   over several granted mappings that lie back to back in one reservation, checked at run time.
//! - [`SharedPage`] is one physical allocation shared by reference count: every clone and every
//!   mapping of it ([`SharedReservation::map_shared`]) holds a share, and the last one releases the
//!   memory. Each mapping of the page is an address range with its own grant, so a prefix written
//!   once can be mapped read-only into many sequences' reservations, beside the pages each one
//!   writes. [`OwnedMapping::unmap`] gives back what the mapping held ([`Unmapped`]): its own
//!   memory, or its share of the page.
//!
//! Both layers hand out the same views, [`DeviceSlice`](crate::DeviceSlice) and
//! [`DeviceSliceMut`](crate::DeviceSliceMut), so copies and kernel launches are written once.
//!
//! # Sleeping an engine's memory
//! An engine that sleeps (to free the GPU for another model, say) keeps its address ranges, so that
//! every pointer it handed out, and every graph it would capture again, stays valid:
//! [`VirtualBuffer::evict`] copies the bytes of a range's pages to pinned host memory, then unmaps
//! and releases the pages: free device memory rises by exactly those bytes, and the reservation
//! stays. While the range is evicted no view, lend or new page reaches it (`&mut self` for the
//! views; [`Error::PageRange`](crate::Error::PageRange), naming the bytes, for everything checked at
//! run time). [`VirtualBuffer::restore`] creates, maps and grants new pages at the same addresses
//! and copies the bytes back; where it fails (out of memory, say) it hands the [`Evicted`] back
//! ([`NotRestored`]), so no byte is lost. Pinning host memory is the slow part (`cuMemHostAlloc` of
//! 1 GiB takes longer than copying it over the host link many times), so an engine that sleeps and
//! wakes often pins once: [`VirtualBuffer::evict_into`] takes the pinned memory it is given
//! (refused before any driver call where it is too short), and
//! [`VirtualBuffer::restore_host`] gives it back for the next eviction.
//!
//! A graph borrows what it captured, so it does not live across an eviction: it is parked
//! ([`ParkedGraph`](crate::stream::ParkedGraph)), which keeps its instantiation and borrows
//! nothing, and rebound after the restore over memory that covers every range it touches (refused,
//! naming the evicted bytes, while the range is evicted).
//!
//! Inside an engine's one long scope the same happens without a host wait.
//! [`ScopedBuffer::evict`] marks the range evicted at once (the same refusals, also for every
//! handle lent before), queues the copies to pinned host memory on a stream of the scope, after the
//! work queued there, and retires the pages behind them: an event on every stream of the scope, so
//! the pages are unmapped and released, and free memory rises, only once the copies and every
//! earlier use on any stream have completed (at a later call, `reclaim`, or the buffer's drop). It
//! returns an [`EvictedInFlight`], which gives the host nothing while the copies may run: its
//! `wait` gives the [`Evicted`], at once after the scope; its drop waits before freeing the pinned
//! memory, and forgetting it only leaks. [`ScopedBuffer::restore`] maps new pages at the same
//! addresses once the old ones are released (refused in a [`NotRestored`] before) and queues the
//! copies back on its stream; the buffer keeps the pinned bytes until those copies have completed.
//! Work on that stream after the restore reads the bytes; work on another stream is ordered after
//! it by an event, as for any queued write.

mod buffer;
mod granted;
mod mapping;
mod pages;
mod shared;

pub use buffer::{
    BufferStats, ClaimedRange, Evicted, EvictedInFlight, ExportableBuffer, NotRestored, PageInfo,
    PageOptions, ReserveOptions, ScopedBuffer, VirtualBuffer,
};
pub use granted::GrantedMapping;
pub use mapping::{OwnedMapping, SharedReservation};
pub use shared::{SharedPage, Unmapped};
