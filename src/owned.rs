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

mod buffer;
mod granted;
mod mapping;
mod pages;
mod shared;

pub use buffer::{
    BufferStats, Evicted, EvictedInFlight, ExportableBuffer, NotRestored, PageInfo, PageOptions,
    ScopedBuffer, VirtualBuffer,
};
pub use granted::GrantedMapping;
pub use mapping::{OwnedMapping, SharedReservation};
pub use shared::{SharedPage, Unmapped};
