//! The unit tests of the crate's one error type.

use super::*;
use std::error::Error as _;

#[test]
fn first_error_tries_every_item_and_keeps_the_first_error() {
    let mut tried = Vec::new();
    let first = first_error([0u32, 1, 0, 2, 0].into_iter().map(|code| {
        tried.push(code);
        check(code)
    }));
    assert_eq!(first, Err(DriverError::INVALID_VALUE));
    assert_eq!(tried, [0, 1, 0, 2, 0], "every item was tried");
    assert_eq!(first_error([Ok::<(), DriverError>(()), Ok(())]), Ok(()));
}

#[test]
fn nccl_errors_print_the_call_and_the_code() {
    let e = Error::Nccl {
        call: "ncclAllReduce",
        code: 5,
    };
    assert_eq!(
        e.to_string(),
        "ncclAllReduce failed: 5 ncclInvalidUsage: the call is invalid here (a usage error)"
    );
    assert_eq!(e.driver(), None);
    let unknown = Error::Nccl {
        call: "ncclGroupEnd",
        code: 77,
    };
    assert!(
        unknown
            .to_string()
            .contains("77 an ncclResult_t this crate does not name")
    );
    let missing = Error::NcclUnavailable {
        call: "ncclCommWindowRegister",
        why: "the loaded NCCL has no such function (it needs NCCL 2.27 or newer)",
    };
    assert!(
        missing
            .to_string()
            .starts_with("NCCL cannot serve ncclCommWindowRegister: ")
    );
}

#[test]
fn a_cudarc_older_than_the_driver_names_both_versions_and_the_feature() {
    let e = Error::CudarcOlderThanDriver {
        cudarc: 12080,
        driver: 13000,
    };
    assert_eq!(
        e.to_string(),
        "cudarc was built for CUDA 12.8 (12080), older than the driver's CUDA 13.0 (13000), \
     which can return result codes that cudarc's enum lacks (undefined behaviour inside \
     cudarc): build cudarc for CUDA 13.0 or newer (its `cuda-13000` feature or a later one)"
    );
    assert_eq!(e.driver(), None);
    assert!(!e.is_no_gpu());
}

#[test]
fn check_and_layout() {
    assert_eq!(check(0), Ok(()));
    assert_eq!(check(1), Err(DriverError::INVALID_VALUE));
    assert_eq!(check(u32::MAX).unwrap_err().code(), u32::MAX);
    assert_eq!(size_of::<DriverResult<()>>(), size_of::<u32>());
}

#[test]
fn errors_of_host_memory_and_ipc() {
    let refused = Error::Refused {
        what: "fabric-shareable memory",
        why: "no IMEX channel is accessible to this process",
        error: DriverError::NOT_PERMITTED,
    };
    assert_eq!(refused.driver(), Some(DriverError::NOT_PERMITTED));
    assert_eq!(
        refused.to_string(),
        "the driver refused fabric-shareable memory: no IMEX channel is accessible to this \
         process (CUDA_ERROR_NOT_PERMITTED (800): operation not permitted)"
    );
    let unsupported = Error::Unsupported {
        what: "host NUMA memory",
        device: 0,
        attribute: 141,
    };
    assert_eq!(
        unsupported.to_string(),
        "device 0 does not support host NUMA memory (device attribute 141 is 0 or unknown to \
         this driver)"
    );
    let imex = Error::NoImexChannel { device: 0 };
    assert!(
        imex.to_string()
            .starts_with("fabric-shareable memory of device 0 needs an IMEX channel"),
        "{imex}"
    );
    assert_eq!(imex.driver(), None);
    assert!(!imex.is_no_gpu());
    let os = Error::Os {
        what: "pidfd_getfd",
        errno: 1,
    };
    assert!(os.to_string().starts_with("pidfd_getfd failed: "), "{os}");
    let message = Error::InvalidMessage {
        what: "expected exactly one file descriptor",
    };
    assert_eq!(
        message.to_string(),
        "invalid shared-allocation message: expected exactly one file descriptor"
    );
    let location = Error::NotForLocation {
        what: "a shareable handle kind",
        location: "on the host with no NUMA node (Location::Host)",
        why: "the driver refuses any handle type there",
    };
    assert_eq!(
        location.to_string(),
        "a shareable handle kind is not offered for memory located on the host with no NUMA \
         node (Location::Host): the driver refuses any handle type there"
    );
    for error in [&unsupported, &os, &message, &location] {
        assert_eq!(error.driver(), None);
        assert!(error.source().is_none());
    }
}

#[test]
fn is_no_gpu_is_asked_of_the_drivers_refusal() {
    assert!(Error::Driver(DriverError::NO_DEVICE).is_no_gpu());
    assert!(Error::from(DriverError::STUB_LIBRARY).is_no_gpu());
    assert!(!Error::Driver(DriverError::INVALID_VALUE).is_no_gpu());
    assert!(!Error::NotTimed.is_no_gpu());
    assert!(
        !Error::Refused {
            what: "fabric-shareable memory",
            why: "no IMEX channel is accessible to this process",
            error: DriverError::NO_DEVICE,
        }
        .is_no_gpu(),
        "only a plain driver refusal says that there is no GPU"
    );
}

#[test]
fn not_timed_says_what_to_do() {
    assert_eq!(
        Error::NotTimed.to_string(),
        "an event made without timing (Event::new) cannot be timed: make both with Event::timed"
    );
    assert_eq!(Error::NotTimed.driver(), None);
    assert!(Error::NotTimed.source().is_none());
}

#[test]
fn error_display_source_and_conversion() {
    let driver = Error::from(DriverError::OUT_OF_MEMORY);
    let cleanup = Error::CleanupFailed {
        error: DriverError::OUT_OF_MEMORY,
        cleanup: DriverError::INVALID_VALUE,
        what: "mapping",
    };
    // (error, its whole text, or "" where only non-emptiness is checked)
    let cases = [
        (
            driver.clone(),
            "CUDA driver call failed: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory",
        ),
        (
            Error::NotAligned {
                what: "size",
                value: 4096,
                granularity: 2 << 20,
            },
            "size 4096 is not a multiple of the allocation granularity 2097152",
        ),
        (Error::ZeroSize { what: "size" }, ""),
        (
            Error::Overflow {
                what: "offset + size",
            },
            "",
        ),
        (
            Error::OutOfBounds {
                what: "mapping",
                start: 10,
                end: 20,
                len: 15,
            },
            "",
        ),
        (
            Error::LengthMismatch {
                expected: 4,
                found: 5,
            },
            "",
        ),
        (
            Error::NotWholeElements {
                bytes: 7,
                element_size: 4,
            },
            "",
        ),
        (
            Error::DeviceMismatch {
                expected: 0,
                found: 1,
            },
            "",
        ),
        (
            Error::InvalidArgument {
                what: "device ordinal",
            },
            "device ordinal cannot be represented by the driver",
        ),
        (
            Error::NotPtxText {
                offset: 1,
                byte: 0xed,
            },
            "byte 0xed at offset 1 is not PTX text (only tab, LF, CR and printable ASCII are loaded)",
        ),
        (
            cleanup.clone(),
            "CUDA_ERROR_OUT_OF_MEMORY (2): out of memory; undoing the partial mapping failed too: \
             CUDA_ERROR_INVALID_VALUE (1): invalid argument",
        ),
        (
            Error::NoPeerAccess {
                device: 1,
                owner: 0,
            },
            "device 1 has no access to the memory of the view on device 0: grant it access or \
             open peer access first, or copy with Route::Auto or Route::Staged",
        ),
        (
            Error::NoPeerLink { from: 0, to: 3 },
            "the driver reports no peer link from device 0 to device 3",
        ),
    ];
    for (error, text) in &cases {
        assert!(!error.to_string().is_empty(), "{error:?}");
        if !text.is_empty() {
            assert_eq!(error.to_string(), *text);
        }
        // Every text is whole on its own (the driver's text included), so no error also hands
        // out a source that a reporter would print a second time.
        assert!(error.source().is_none(), "{error:?}");
    }
    // The driver's refusal, where there was one: for a failed clean-up, the operation's own.
    assert_eq!(driver.driver(), Some(DriverError::OUT_OF_MEMORY));
    assert_eq!(cleanup.driver(), Some(DriverError::OUT_OF_MEMORY));
    for (error, _) in cases.iter().skip(1).filter(|(e, _)| *e != cleanup) {
        assert_eq!(error.driver(), None, "{error:?}");
    }
}

#[test]
fn no_such_device_is_no_driver_error() {
    let error = Error::NoSuchDevice {
        ordinal: 2,
        count: 2,
    };
    assert_eq!(
        error.to_string(),
        "device ordinal 2 is not below the device count 2"
    );
    assert_eq!(error.driver(), None);
    assert!(!error.is_no_gpu());
    assert!(error.source().is_none());
}

#[test]
fn page_range_display_and_source() {
    let range = Error::PageRange {
        start: 2 << 20,
        end: 4 << 20,
        problem: "are mapped already",
    };
    assert_eq!(
        range.to_string(),
        "bytes 2097152..4194304 of the reserved range are mapped already"
    );
    assert!(range.source().is_none());
    assert_eq!(range.driver(), None);

    // `CleanupFailed` itself is covered by `error_display_source_and_conversion`.
}
