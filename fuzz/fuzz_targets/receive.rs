//! `ExportedBuffer::receive` and `ExportedAllocation::receive` over a Unix socket pair, fed what a
//! misbehaving peer could send: arbitrary bytes, in one message or split in two, with an arbitrary
//! number of descriptors (0 to 24) on either part, over a stream or a sequenced-packet socket.
//!
//! A crash is a panic, an accepted message whose descriptors do not match its description, or a
//! descriptor left open: the count of `/proc/self/fd` must be the same before and after every input.
//!
//! Input: byte 0 picks the socket kind (bit 0), the receiver (bit 1), which part carries the
//! descriptors (bit 2) and whether the message is split (bit 3); byte 1 is the number of descriptors
//! (mod 25); byte 2 is where the split falls (a fraction of the rest); the rest is the message.

#![no_main]

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use cuda_vmm::ipc::{BufferInfo, ExportInfo, ExportedAllocation, ExportedBuffer};
use libfuzzer_sys::fuzz_target;
use rustix::net::{
    AddressFamily, SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};

const MAX_FDS: usize = 24;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// One `sendmsg` of `bytes` with `fds` as `SCM_RIGHTS`; a refusal (a zero-length message with
/// descriptors on a stream socket, say) is the peer's problem, not the receiver's.
fn send(socket: &OwnedFd, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
    }
    let _ = rustix::net::sendmsg(
        socket,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
    );
}

fn exchange(data: &[u8], fd: BorrowedFd<'_>) {
    let [flags, count, split, message @ ..] = data else {
        return;
    };
    let packet = flags & 1 != 0;
    let whole_buffer = flags & 2 == 0;
    let fds_on_second = flags & 4 != 0;
    let split_message = flags & 8 != 0;
    let fds: Vec<BorrowedFd<'_>> = vec![fd; usize::from(*count) % (MAX_FDS + 1)];
    let kind = if packet {
        SocketType::SEQPACKET
    } else {
        SocketType::STREAM
    };
    let (sender, receiver) =
        rustix::net::socketpair(AddressFamily::UNIX, kind, SocketFlags::CLOEXEC, None)
            .expect("socketpair");
    if split_message {
        let at = message.len() * usize::from(*split) / 256;
        let (first, second) = message.split_at(at);
        let (a, b): (&[BorrowedFd<'_>], &[BorrowedFd<'_>]) = if fds_on_second {
            (&[], &fds)
        } else {
            (&fds, &[])
        };
        send(&sender, first, a);
        send(&sender, second, b);
    } else {
        send(&sender, message, &fds);
    }
    drop(sender); // the end of the connection: a receive waiting for more returns
    if whole_buffer {
        let decoded = BufferInfo::from_bytes(message);
        match ExportedBuffer::receive(&receiver) {
            Ok(received) => {
                let (fds, info) = received.into_parts();
                assert_eq!(fds.len(), info.pieces().len(), "one descriptor per piece");
                // Only what was sent is accepted: the whole message, or its first part where the
                // socket kept the parts apart.
                let sent = [
                    Some(message),
                    message.get(..message.len() * usize::from(*split) / 256),
                ];
                assert!(
                    sent.iter()
                        .flatten()
                        .any(|m| BufferInfo::from_bytes(m).as_ref() == Ok(&info)),
                    "an accepted description that was not sent: {info:?} (whole: {decoded:?})"
                );
            }
            Err(_) => {}
        }
    } else if let Ok(received) = ExportedAllocation::receive(&receiver) {
        let (_fd, info) = received.into_parts();
        let sent = [
            Some(message),
            message.get(..message.len() * usize::from(*split) / 256),
        ];
        assert!(
            sent.iter()
                .flatten()
                .any(|m| ExportInfo::from_bytes(m) == Ok(info)),
            "an accepted allocation description that was not sent: {info:?}"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let (read_end, write_end) = rustix::pipe::pipe().expect("pipe");
    let before = open_fds();
    exchange(data, write_end.as_fd());
    assert_eq!(open_fds(), before, "a descriptor was left open");
    drop((read_end, write_end));
});
