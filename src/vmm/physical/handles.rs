//! What an allocation can be exported as: [`HandleKinds`], and what a device's report says it
//! allows. The checks before `cuMemCreate` are `support.rs`.

use core::fmt;
use core::ops::{BitOr, BitOrAssign};

use crate::device::Capabilities;
use crate::sys;

/// A set of kinds of shareable handle an allocation can be exported as: the
/// `CUmemAllocationHandleType` bits of `CUmemAllocationProp::requestedHandleTypes`.
///
/// Made from the constants and `|`; it holds no bit this crate does not name.
///
/// ```
/// use cuda_vmm::vmm::HandleKinds;
///
/// let both = HandleKinds::POSIX_FD | HandleKinds::FABRIC;
/// assert!(both.contains(HandleKinds::POSIX_FD));
/// assert!(!HandleKinds::POSIX_FD.contains(both));
/// assert!(HandleKinds::NONE.is_empty());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct HandleKinds(u32);

impl HandleKinds {
    /// No handle kind: the memory is not exportable (`CU_MEM_HANDLE_TYPE_NONE`).
    pub const NONE: HandleKinds = HandleKinds(sys::CU_MEM_HANDLE_TYPE_NONE);
    /// A POSIX file descriptor (`CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`), shared between
    /// processes of one machine.
    pub const POSIX_FD: HandleKinds = HandleKinds(sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    /// A fabric handle (`CU_MEM_HANDLE_TYPE_FABRIC`), shared within an IMEX domain (one or several
    /// machines linked by `NVLink`).
    pub const FABRIC: HandleKinds = HandleKinds(sys::CU_MEM_HANDLE_TYPE_FABRIC);

    /// The kinds with their names, for `Debug` and the checks.
    const NAMED: [(HandleKinds, &'static str); 2] = [
        (HandleKinds::POSIX_FD, "POSIX_FD"),
        (HandleKinds::FABRIC, "FABRIC"),
    ];

    /// Whether every kind of `other` is in `self` (`true` for an empty `other`).
    #[must_use]
    pub const fn contains(self, other: HandleKinds) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether the set holds no kind.
    #[must_use]
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The kinds of both sets.
    #[must_use]
    pub const fn union(self, other: HandleKinds) -> HandleKinds {
        HandleKinds(self.0 | other.0)
    }

    /// The `CUmemAllocationHandleType` bits, for driver calls this crate does not wrap.
    #[must_use]
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// The set of `raw`'s bits, which the caller takes from the constants of `sys`.
    pub(crate) const fn from_raw(raw: u32) -> HandleKinds {
        HandleKinds(raw)
    }
}

impl BitOr for HandleKinds {
    type Output = HandleKinds;
    fn bitor(self, other: HandleKinds) -> HandleKinds {
        self.union(other)
    }
}

impl BitOrAssign for HandleKinds {
    fn bitor_assign(&mut self, other: HandleKinds) {
        *self = self.union(other);
    }
}

impl fmt::Debug for HandleKinds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HandleKinds(")?;
        if self.is_empty() {
            f.write_str("NONE")?;
        }
        let mut first = true;
        for (kind, name) in HandleKinds::NAMED {
            if self.contains(kind) {
                if !first {
                    f.write_str(" | ")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        f.write_str(")")
    }
}

impl Capabilities {
    /// The kinds of shareable handle the device's memory can be created with, as its report says:
    /// [`HandleKinds::POSIX_FD`] where the device supports POSIX file descriptors,
    /// [`HandleKinds::FABRIC`] where it supports fabric handles and the machine has an IMEX channel
    /// ([`fabric_usable`](Capabilities::fabric_usable)). What
    /// [`AllocationOptions::with_handle_kinds`](super::AllocationOptions::with_handle_kinds) and
    /// [`PageOptions::with_handle_kinds`](crate::owned::PageOptions::with_handle_kinds) can ask for
    /// here without a refusal from the checks (the fabric probe may still refuse a process that
    /// cannot open the channel).
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::vmm::HandleKinds;
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let caps = cuda_vmm::Device::get(0)?.capabilities()?;
    /// let across_nodes = caps.handle_kinds().contains(HandleKinds::FABRIC);
    /// println!("share across nodes with fabric handles: {across_nodes}");
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn handle_kinds(&self) -> HandleKinds {
        let mut kinds = HandleKinds::NONE;
        if self.posix_fd_handles {
            kinds |= HandleKinds::POSIX_FD;
        }
        if self.fabric_usable() {
            kinds |= HandleKinds::FABRIC;
        }
        kinds
    }
}

#[cfg(test)]
mod tests {
    use super::HandleKinds;

    const ALL: [HandleKinds; 4] = [
        HandleKinds::NONE,
        HandleKinds::POSIX_FD,
        HandleKinds::FABRIC,
        HandleKinds::POSIX_FD.union(HandleKinds::FABRIC),
    ];

    #[test]
    fn the_bits_are_the_drivers() {
        assert_eq!(HandleKinds::NONE.bits(), 0);
        assert_eq!(HandleKinds::POSIX_FD.bits(), 1);
        assert_eq!(HandleKinds::FABRIC.bits(), 8);
        assert_eq!((HandleKinds::POSIX_FD | HandleKinds::FABRIC).bits(), 9);
        assert_eq!(HandleKinds::default(), HandleKinds::NONE);
    }

    #[test]
    fn contains_is_the_subset_relation() {
        for a in ALL {
            for b in ALL {
                assert_eq!(
                    a.contains(b),
                    a.bits() & b.bits() == b.bits(),
                    "{a:?} {b:?}"
                );
                assert!((a | b).contains(a) && (a | b).contains(b));
                assert_eq!(a | b, b | a);
            }
            assert!(a.contains(HandleKinds::NONE));
            assert_eq!(a | a, a);
            assert_eq!(a.is_empty(), a == HandleKinds::NONE);
        }
        assert!(!HandleKinds::POSIX_FD.contains(HandleKinds::FABRIC));
        assert!(!HandleKinds::FABRIC.contains(HandleKinds::POSIX_FD));
        assert!(!HandleKinds::NONE.contains(HandleKinds::POSIX_FD));
    }

    #[test]
    fn or_assign_adds_kinds() {
        let mut kinds = HandleKinds::NONE;
        kinds |= HandleKinds::FABRIC;
        assert_eq!(kinds, HandleKinds::FABRIC);
        kinds |= HandleKinds::POSIX_FD;
        assert!(kinds.contains(HandleKinds::POSIX_FD | HandleKinds::FABRIC));
    }

    #[test]
    fn debug_names_each_kind() {
        assert_eq!(format!("{:?}", HandleKinds::NONE), "HandleKinds(NONE)");
        assert_eq!(format!("{:?}", HandleKinds::FABRIC), "HandleKinds(FABRIC)");
        assert_eq!(
            format!("{:?}", HandleKinds::FABRIC | HandleKinds::POSIX_FD),
            "HandleKinds(POSIX_FD | FABRIC)"
        );
    }
}
