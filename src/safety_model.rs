//! The safety model: every rule this crate's types enforce, the driver failure each one prevents,
//! and the compile-fail case in `ui-tests/` that proves it; the rules the types cannot express are
//! listed too, with the run-time check that stands in for them.
//!
//! This module holds no items: it is documentation only. The text below is `ui-tests/README.md`,
//! the one table of rules (`tests/rule_table.rs` checks that it names every case and only cases
//! that exist). Start with the types of the crate root: [`VirtualBuffer`](crate::VirtualBuffer),
//! [`VirtualReservation`](crate::VirtualReservation) and [`scope`](crate::scope).
//!
#![doc = include_str!("../ui-tests/README.md")]
