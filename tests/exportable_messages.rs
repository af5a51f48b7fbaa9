//! What `ExportedBuffer::receive` accepts, with no GPU and no driver call: arbitrary bytes and
//! arbitrary numbers of descriptors, sent over stream and sequenced-packet Unix sockets. Malformed
//! input always gets an `Error`, never a panic; an accepted message has exactly one descriptor per
//! piece; and no case leaves a descriptor open (the count of `/proc/self/fd` is the same before and
//! after every case).
//!
//! One test function, so that the count of this process's open descriptors is not moved by another
//! test running at the same time. The same is fuzzed with cargo-fuzz in `fuzz/` (the `receive`
//! target), where the sanitizer build is available; these property tests run everywhere.

#![cfg(target_os = "linux")]

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use cuda_vmm::Error;
use cuda_vmm::ipc::{BufferInfo, BufferPiece, ExportedBuffer};
use proptest::prelude::*;
use rustix::net::{
    AddressFamily, SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};

/// Sends `bytes` with `fds` as `SCM_RIGHTS` in one message, as a misbehaving peer could.
fn send_raw(socket: &OwnedFd, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(16))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
    }
    // A zero-length message on a stream socket carries nothing (the kernel drops its descriptors);
    // either way the receiver must refuse.
    let _ = rustix::net::sendmsg(
        socket,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    );
}

fn pair(packet: bool) -> (OwnedFd, OwnedFd) {
    let kind = if packet {
        SocketType::SEQPACKET
    } else {
        SocketType::STREAM
    };
    rustix::net::socketpair(AddressFamily::UNIX, kind, SocketFlags::CLOEXEC, None)
        .expect("socketpair")
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// A well-formed description of `pages` pieces of 2 MiB pages.
fn description(pages: usize) -> BufferInfo {
    let g = 2 << 20;
    let pieces = (0..pages)
        .map(|i| BufferPiece::new(2 * i * g, g, 0, g).unwrap())
        .collect();
    BufferInfo::new(2 * pages.max(1) * g, pieces).unwrap()
}

/// Sends `bytes` with `fd_count` duplicates of `fd` over a fresh pair, closes the sending end, and
/// receives. The result, with the pair closed.
fn exchange(
    packet: bool,
    bytes: &[u8],
    fd: BorrowedFd<'_>,
    fd_count: usize,
) -> Result<ExportedBuffer, Error> {
    let (a, b) = pair(packet);
    let fds: Vec<BorrowedFd<'_>> = (0..fd_count).map(|_| fd).collect();
    send_raw(&a, bytes, &fds);
    drop(a); // the end of the connection: a receive waiting for the rest of a message returns
    ExportedBuffer::receive(&b)
}

/// A well-formed encoding of 1 to 6 pieces, with some bytes flipped and possibly cut short or
/// lengthened.
fn near_valid() -> impl Strategy<Value = Vec<u8>> {
    (
        1usize..7,
        proptest::collection::vec((any::<usize>(), any::<u8>()), 0..3),
        -2isize..3,
    )
        .prop_map(|(pages, flips, cut)| {
            let mut bytes = description(pages).to_bytes();
            let len = bytes.len();
            for (at, byte) in flips {
                bytes[at % len] ^= byte;
            }
            if cut < 0 {
                bytes.truncate(len - cut.unsigned_abs());
            } else {
                bytes.extend(std::iter::repeat_n(0u8, cut.unsigned_abs()));
            }
            bytes
        })
}

fn check_case(
    packet: bool,
    bytes: &[u8],
    fd: BorrowedFd<'_>,
    fd_count: usize,
) -> Result<(), TestCaseError> {
    let before = open_fds();
    let decoded = BufferInfo::from_bytes(bytes);
    let result = exchange(packet, bytes, fd, fd_count);
    match (&decoded, &result) {
        (Ok(info), Ok(received)) => {
            prop_assert_eq!(received.info(), info);
            prop_assert_eq!(fd_count, info.pieces().len());
        }
        (Ok(info), Err(_)) => {
            prop_assert_ne!(fd_count, info.pieces().len(), "a good message was refused");
        }
        (Err(_), Ok(received)) => {
            prop_assert!(false, "a malformed message was accepted: {received:?}");
        }
        (Err(_), Err(_)) => {}
    }
    drop(result);
    prop_assert_eq!(open_fds(), before, "a descriptor was left open");
    Ok(())
}

#[test]
fn received_buffer_messages_are_checked_and_leak_no_descriptor() {
    let (pipe_read, pipe_write) = std::io::pipe().unwrap();
    let (pipe_read, pipe_write) = (OwnedFd::from(pipe_read), OwnedFd::from(pipe_write));
    let fd = pipe_write.as_fd();

    // Well-formed messages of 1 and 5 pieces are accepted on both kinds of socket, and their
    // descriptors work.
    for (packet, pages) in [(false, 1), (false, 5), (true, 5)] {
        let before = open_fds();
        let info = description(pages);
        let received = exchange(packet, &info.to_bytes(), fd, pages).unwrap();
        assert_eq!(received.info(), &info);
        let (fds, _) = received.into_parts();
        assert_eq!(fds.len(), pages);
        drop(fds);
        assert_eq!(open_fds(), before);
    }
    // Counts that differ by one, and no descriptor at all.
    for (count, case) in [(4, "one too few"), (6, "one too many"), (0, "none")] {
        match exchange(false, &description(5).to_bytes(), fd, count) {
            Err(Error::InvalidMessage { what }) => println!("{case}: refused: {what}"),
            other => panic!("{case}: expected InvalidMessage, got {other:?}"),
        }
    }
    // The longest message (253 pieces) is accepted; it needs 253 descriptors, which the helper
    // cannot send, so its refusal for the count is what is seen here.
    assert!(matches!(
        exchange(false, &description(253).to_bytes(), fd, 16),
        Err(Error::InvalidMessage { .. })
    ));

    let before = open_fds();
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases: 512,
        ..proptest::test_runner::Config::default()
    });
    // Arbitrary bytes and descriptor counts.
    runner
        .run(
            &(
                any::<bool>(),
                proptest::collection::vec(any::<u8>(), 0..300),
                0usize..10,
            ),
            |(packet, bytes, count)| check_case(packet, &bytes, fd, count),
        )
        .unwrap();
    // Near-valid messages, with descriptor counts around the right one.
    runner
        .run(
            &(any::<bool>(), near_valid(), 0usize..8),
            |(packet, bytes, count)| check_case(packet, &bytes, fd, count),
        )
        .unwrap();
    assert_eq!(open_fds(), before, "every descriptor was closed");
    drop((pipe_read, pipe_write));
}
