//! What `ExportedAllocation::receive` and `take_from_process` accept, with no GPU and no driver call:
//! every refusal happens before a driver could see what was received, and leaves no descriptor open.
//!
//! One test function, so that the count of this process's open descriptors is not moved by another
//! test running at the same time.

#![cfg(target_os = "linux")]

use std::io::{IoSlice, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use cuda_vmm::{Error, ipc::ExportInfo, ipc::ExportedAllocation};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

/// Sends `bytes` with `fds` as `SCM_RIGHTS` in one message, as a misbehaving peer could.
fn send_raw(socket: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(16))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
    }
    let sent = rustix::net::sendmsg(
        socket,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .expect("sendmsg");
    assert_eq!(sent, bytes.len());
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

fn invalid_message(result: Result<ExportedAllocation, Error>, case: &str) {
    match result {
        Err(Error::InvalidMessage { what }) => println!("{case}: refused: {what}"),
        other => panic!("{case}: expected InvalidMessage, got {other:?}"),
    }
}

#[test]
fn received_messages_are_checked_before_any_driver_call() {
    let info = ExportInfo::new(4 << 20, 0, 2 << 20).unwrap();
    let good = info.to_bytes();
    let (pipe_read, pipe_write) = std::io::pipe().unwrap();
    let (pipe_read, pipe_write) = (OwnedFd::from(pipe_read), OwnedFd::from(pipe_write));
    let before = open_fds();

    // A well-formed message: the description and a working duplicate of the descriptor.
    {
        let (a, b) = UnixStream::pair().unwrap();
        let sent = ExportedAllocation::from_parts(pipe_write.try_clone().unwrap(), info);
        sent.send(&a).unwrap();
        drop(sent);
        let received = ExportedAllocation::receive(&b).unwrap();
        assert_eq!(received.info(), info);
        let (fd, _) = received.into_parts();
        std::fs::File::from(fd).write_all(b"x").unwrap();
        let mut byte = [0u8; 1];
        std::fs::File::from(pipe_read.try_clone().unwrap())
            .read_exact(&mut byte)
            .unwrap();
        assert_eq!(&byte, b"x", "the received descriptor is the sent one");
    }

    let (a, b) = UnixStream::pair().unwrap();
    // No descriptor.
    send_raw(&a, &good, &[]);
    invalid_message(ExportedAllocation::receive(&b), "no descriptor");
    // Two descriptors: both arrive and are closed.
    send_raw(&a, &good, &[pipe_read.as_fd(), pipe_write.as_fd()]);
    invalid_message(ExportedAllocation::receive(&b), "two descriptors");
    // More descriptors than the receive buffer holds: the kernel truncates, and says so.
    let many: Vec<BorrowedFd<'_>> = (0..12).map(|_| pipe_write.as_fd()).collect();
    send_raw(&a, &good, &many);
    invalid_message(ExportedAllocation::receive(&b), "twelve descriptors");
    // A short message with a descriptor.
    send_raw(&a, &good[..20], &[pipe_write.as_fd()]);
    invalid_message(ExportedAllocation::receive(&b), "short message");
    // Each field spoiled, with a descriptor.
    for (at, case) in [
        (0, "magic"),
        (8, "version"),
        (12, "handle type"),
        (36, "reserved"),
    ] {
        let mut bytes = good;
        bytes[at] ^= 0x5a;
        send_raw(&a, &bytes, &[pipe_write.as_fd()]);
        invalid_message(ExportedAllocation::receive(&b), case);
    }
    // A size that is not a multiple of the granularity, and a zero size.
    let mut unaligned = good;
    unaligned[16] = 1;
    send_raw(&a, &unaligned, &[pipe_write.as_fd()]);
    assert!(matches!(
        ExportedAllocation::receive(&b),
        Err(Error::NotAligned { .. })
    ));
    let mut zero = good;
    zero[16..24].fill(0);
    send_raw(&a, &zero, &[pipe_write.as_fd()]);
    assert!(matches!(
        ExportedAllocation::receive(&b),
        Err(Error::ZeroSize { .. })
    ));
    // A device ordinal the driver cannot represent.
    let mut device = good;
    device[32..36].copy_from_slice(&u32::MAX.to_le_bytes());
    send_raw(&a, &device, &[pipe_write.as_fd()]);
    assert!(matches!(
        ExportedAllocation::receive(&b),
        Err(Error::InvalidArgument { .. })
    ));
    // The peer goes away.
    drop(a);
    invalid_message(ExportedAllocation::receive(&b), "end of connection");
    drop(b);
    // Sending to a peer that has gone away is an error, not a SIGPIPE.
    let (a, b) = UnixStream::pair().unwrap();
    drop(b);
    let lone = ExportedAllocation::from_parts(pipe_write.try_clone().unwrap(), info);
    assert!(matches!(lone.send(&a), Err(Error::Os { .. })));
    drop((a, lone));

    assert_eq!(
        open_fds(),
        before,
        "every descriptor of a refused message was closed"
    );

    take_from_process(&pipe_read, &pipe_write, info);
}

/// `pidfd_getfd`: arguments no process could have are refused before any system call; this process's
/// own descriptor can be taken, unless the kernel refuses (which must be an error).
fn take_from_process(pipe_read: &OwnedFd, pipe_write: &OwnedFd, info: ExportInfo) {
    let me = std::process::id();
    assert!(matches!(
        ExportedAllocation::take_from_process(0, 3, info),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        ExportedAllocation::take_from_process(me, -1, info),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        ExportedAllocation::take_from_process(me, 1 << 30, info),
        Err(Error::Os { .. })
    ));
    match ExportedAllocation::take_from_process(me, pipe_write.as_raw_fd(), info) {
        Ok(taken) => {
            assert_eq!(taken.info(), info);
            std::fs::File::from(taken.into_parts().0)
                .write_all(b"y")
                .unwrap();
            let mut byte = [0u8; 1];
            std::fs::File::from(pipe_read.try_clone().unwrap())
                .read_exact(&mut byte)
                .unwrap();
            assert_eq!(&byte, b"y");
        }
        Err(e @ Error::Os { .. }) => println!("pidfd_getfd refused here: {e}"),
        Err(e) => panic!("pidfd_getfd: unexpected error {e:?}"),
    }
}
