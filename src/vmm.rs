//! The borrowed layer of VMM: physical memory, reserved address ranges, mappings of one into the
//! other, and the grants that open them to devices, each step borrowing the one before.
//!
//! `cuMemCreate` gives a [`PhysicalAllocation`]; `cuMemAddressReserve` a [`VirtualReservation`],
//! carved into disjoint [`Region`]s; [`Region::map`] (`cuMemMap`) a [`Mapping`] that borrows both;
//! and [`Mapping::grant`] (`cuMemSetAccess`) an [`Access`], the only source of views. The lifetimes
//! make the driver's order the only one that compiles: no memory or reservation goes away under a
//! mapping, no mapping is unmapped twice, no view exists before a grant or outlives it. The owned
//! layer ([`crate::owned`]) holds the same objects by ownership instead.
//!
//! ```text
//! PhysicalAllocation      VirtualReservation
//!          ^                      ^ (&mut, through a Region)
//!           \                    /
//!            Mapping<'va, 'mem> ---- grant ----> Access<'map, ReadWrite | ReadOnly>
//!                                                    |
//!                                                    v
//!                                  DeviceSlice<'_, T> / DeviceSliceMut<'_, T>
//! ```

pub(crate) mod access;
pub(crate) mod mapped;
pub(crate) mod mapping;
pub(crate) mod physical;
pub(crate) mod reservation;

pub use access::{Access, AccessMode, ReadOnly, ReadWrite, RevocableAccess};
pub use mapping::Mapping;
pub use physical::{
    AllocationOptions, Granularity, HandleKinds, Location, PhysicalAllocation, align_size,
    allocation_granularity,
};
pub use reservation::{Region, VirtualReservation};
