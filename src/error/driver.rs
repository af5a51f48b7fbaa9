//! [`DriverError`]: a driver result code other than `CUDA_SUCCESS`, as an integer in a newtype.
//!
//! Every driver call returns a `CUresult`. In `cuda.h` that is a C enum, but this crate never reads
//! it as a Rust `enum`: the driver is loaded at run time and may be newer than any header the crate
//! was built against, so it can return a code that no enum declares, and a Rust enum holding a
//! value outside its variants is undefined behaviour. Following rustix's `Errno`, a failure is
//! therefore an integer in a newtype, [`DriverError`]: every code is representable, the codes this
//! crate knows have names ([`DriverError::INVALID_VALUE`], ...), and an unknown one still prints its
//! number. It wraps a [`NonZeroU32`] because `0` is `CUDA_SUCCESS`, which is not an error; this
//! also makes a `Result<(), DriverError>` the size of a `u32`.
//!
//! The known codes are exactly those of the `CUresult` enum of CUDA 13.3 (`cuda.h` with
//! `CUDA_VERSION` 13030), 102 of them, in the table of `codes.rs`. Names and descriptions are what
//! `cuGetErrorName` and `cuGetErrorString` of a CUDA 13.0 driver return, verbatim (spelling
//! included). The two codes newer than that driver, `CUDA_ERROR_STREAM_DETACHED` (917, CUDA 13.1)
//! and `CUDA_ERROR_GRAPH_RECAPTURE_FAILURE` (918, CUDA 13.3), carry a description paraphrased from
//! the header's documentation instead.

use core::fmt;
use core::num::NonZeroU32;

/// A CUDA driver error: a `CUresult` other than `CUDA_SUCCESS`.
///
/// Any non-zero code can be held, including ones newer than this crate's table; [`name`] and
/// [`description`] return `None` for those, and [`Display`](fmt::Display) prints
/// `unknown CUDA error (N)`.
///
/// [`name`]: DriverError::name
/// [`description`]: DriverError::description
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DriverError(NonZeroU32);

impl DriverError {
    /// Wraps a raw `CUresult`; `None` for `0` (`CUDA_SUCCESS`).
    #[must_use]
    pub const fn from_raw(code: u32) -> Option<DriverError> {
        match NonZeroU32::new(code) {
            Some(code) => Some(DriverError(code)),
            None => None,
        }
    }

    /// Whether this error means that the machine has no usable GPU: [`NO_DEVICE`](Self::NO_DEVICE)
    /// (no GPU, or no kernel driver) or [`STUB_LIBRARY`](Self::STUB_LIBRARY) (a toolkit's stub was
    /// loaded instead of the driver). [`Error::is_no_gpu`](crate::Error::is_no_gpu) asks this of
    /// an [`Error::Driver`](crate::Error::Driver), such as [`init`](crate::init)'s error.
    #[must_use]
    pub fn is_no_gpu(self) -> bool {
        self == DriverError::NO_DEVICE || self == DriverError::STUB_LIBRARY
    }

    /// The raw `CUresult` value (never `0`).
    #[must_use]
    pub const fn code(self) -> u32 {
        self.0.get()
    }

    /// The code's name in `cuda.h`, such as `"CUDA_ERROR_INVALID_VALUE"`; `None` for a code the
    /// table does not know.
    #[must_use]
    pub fn name(self) -> Option<&'static str> {
        self.entry().map(|&(_, name, _)| name)
    }

    /// The driver's one-line description, as `cuGetErrorString` gives it (such as
    /// `"invalid argument"`); `None` for a code the table does not know.
    #[must_use]
    pub fn description(self) -> Option<&'static str> {
        self.entry().map(|&(_, _, description)| description)
    }

    /// Builds the constant for a known, non-zero code; evaluated only in const context, where a
    /// zero would fail the build.
    #[allow(
        clippy::panic,
        reason = "evaluated at compile time only: a zero fails the build"
    )]
    pub(super) const fn known(code: u32) -> DriverError {
        match NonZeroU32::new(code) {
            Some(code) => DriverError(code),
            None => panic!("CUDA_SUCCESS (0) is not an error"),
        }
    }
}

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.entry() {
            Some(&(code, name, description)) => write!(f, "{name} ({code}): {description}"),
            None => write!(f, "unknown CUDA error ({})", self.code()),
        }
    }
}

impl fmt::Debug for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "DriverError({name} = {})", self.code()),
            None => write!(f, "DriverError(unknown = {})", self.code()),
        }
    }
}

impl std::error::Error for DriverError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_formats_without_panicking() {
        for code in (0..=1000).chain([u32::MAX]) {
            let Some(error) = DriverError::from_raw(code) else {
                assert_eq!(code, 0, "only CUDA_SUCCESS maps to None");
                continue;
            };
            assert_eq!(error.code(), code);
            let display = error.to_string();
            let debug = format!("{error:?}");
            if let Some(name) = error.name() {
                assert!(name.starts_with("CUDA_ERROR_"), "{name}");
                let description = error.description().expect("known code without description");
                assert!(!description.is_empty());
                assert_eq!(display, format!("{name} ({code}): {description}"));
                assert_eq!(debug, format!("DriverError({name} = {code})"));
            } else {
                assert_eq!(error.description(), None);
                assert_eq!(display, format!("unknown CUDA error ({code})"));
                assert_eq!(debug, format!("DriverError(unknown = {code})"));
            }
        }
    }

    #[test]
    fn spot_checks() {
        let name = |code| DriverError::from_raw(code).and_then(DriverError::name);
        assert_eq!(name(1), Some("CUDA_ERROR_INVALID_VALUE"));
        assert_eq!(name(34), Some("CUDA_ERROR_STUB_LIBRARY"));
        assert_eq!(name(704), Some("CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED"));
        assert_eq!(name(999), Some("CUDA_ERROR_UNKNOWN"));
        assert_eq!(name(12345), None);

        assert_eq!(DriverError::INVALID_VALUE.code(), 1);
        assert_eq!(
            DriverError::OUT_OF_MEMORY.description(),
            Some("out of memory")
        );
        assert_eq!(DriverError::STUB_LIBRARY.code(), 34);
        assert_eq!(DriverError::PEER_ACCESS_UNSUPPORTED.code(), 217);
        assert_eq!(DriverError::TOO_MANY_PEERS.code(), 711);
        assert_eq!(DriverError::GRAPH_RECAPTURE_FAILURE.code(), 918);
        assert_eq!(DriverError::UNKNOWN.code(), 999);
        assert_eq!(
            DriverError::INVALID_VALUE.to_string(),
            "CUDA_ERROR_INVALID_VALUE (1): invalid argument"
        );
        assert_eq!(
            format!("{:?}", DriverError::INVALID_VALUE),
            "DriverError(CUDA_ERROR_INVALID_VALUE = 1)"
        );
        let unknown = DriverError::from_raw(12345).unwrap();
        assert_eq!(unknown.to_string(), "unknown CUDA error (12345)");
        assert_eq!(format!("{unknown:?}"), "DriverError(unknown = 12345)");
    }
}
