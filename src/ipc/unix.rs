//! The Unix transport of an [`ExportedAllocation`]: the descriptor sent and received as `SCM_RIGHTS`
//! ancillary data over a Unix socket (through rustix), or taken from another process with
//! `pidfd_getfd`.

use core::mem::MaybeUninit;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, OwnedFd};

use rustix::io::Errno;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use super::{ExportInfo, ExportedAllocation};
use crate::error::Error;

/// How many file descriptors one received message may carry before the kernel truncates it: room for
/// more than the one expected, so that extra ones arrive (and are closed) rather than vanish.
const MAX_RECEIVED_FDS: usize = 8;

impl ExportedAllocation {
    /// `sendmsg` — send the description and, as `SCM_RIGHTS` ancillary data, a duplicate of the
    /// descriptor, in one message over a connected Unix socket (stream or sequenced-packet). The
    /// receiver gets its own descriptor: `self` may be dropped right after.
    ///
    /// `MSG_NOSIGNAL` is set: a peer that has gone away is an error, not a `SIGPIPE`.
    ///
    /// # Errors
    /// [`Error::Os`] where the kernel refuses (`EPIPE` where the peer has closed its end,
    /// `ENOTSOCK`, `EOPNOTSUPP` for a socket that cannot carry descriptors); [`Error::InvalidMessage`]
    /// where the socket took only part of the message.
    #[doc(alias = "sendmsg")]
    #[doc(alias = "SCM_RIGHTS")]
    pub fn send(&self, socket: impl AsFd) -> Result<(), Error> {
        let bytes = self.info.to_bytes();
        let fds = [self.fd.as_fd()];
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(Error::Overflow {
                what: "ancillary data of one file descriptor",
            });
        }
        let sent = rustix::io::retry_on_intr(|| {
            rustix::net::sendmsg(
                &socket,
                &[IoSlice::new(&bytes)],
                &mut control,
                SendFlags::NOSIGNAL,
            )
        })
        .map_err(|e| os("sendmsg", e))?;
        if sent != bytes.len() {
            return Err(Error::InvalidMessage {
                what: "the socket took only part of the message",
            });
        }
        Ok(())
    }

    /// `recvmsg` — receive what [`send`](ExportedAllocation::send) sent: one message holding a
    /// description and exactly one descriptor (received close-on-exec).
    ///
    /// Everything is checked before it is returned, and so before any driver call: the message's
    /// length and fields ([`ExportInfo::from_bytes`]), that no data or ancillary data was truncated,
    /// and that exactly one descriptor came. Descriptors of a refused message are closed. Blocks until
    /// a message or the end of the connection arrives.
    ///
    /// # Errors
    /// [`Error::InvalidMessage`] for the end of the connection, a short, long or malformed message, no
    /// descriptor or more than one; as [`ExportInfo::from_bytes`] for the fields;
    /// [`Error::Os`] where the kernel refuses.
    #[doc(alias = "recvmsg")]
    #[doc(alias = "SCM_RIGHTS")]
    pub fn receive(socket: impl AsFd) -> Result<ExportedAllocation, Error> {
        // One byte more than a description: on a stream socket (which keeps no message boundary
        // and so sets no `MSG_TRUNC`) a longer message is seen to be too long, not cut short and
        // accepted. Found by fuzzing (`fuzz/fuzz_targets/receive.rs`).
        let mut bytes = [0u8; ExportInfo::ENCODED_LEN + 1];
        let mut space =
            [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_RECEIVED_FDS))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let message = rustix::io::retry_on_intr(|| {
            rustix::net::recvmsg(
                &socket,
                &mut [IoSliceMut::new(&mut bytes)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            )
        })
        .map_err(|e| os("recvmsg", e))?;
        // Own every descriptor that came, so that each is closed on any error below.
        let mut fds: Vec<OwnedFd> = Vec::new();
        for ancillary in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = ancillary {
                fds.extend(received);
            }
        }
        let bad = |what| Err(Error::InvalidMessage { what });
        if message.bytes == 0 && fds.is_empty() {
            return bad("the connection ended before a message came");
        }
        if message.flags.contains(ReturnFlags::CTRUNC) {
            return bad("ancillary data was truncated: more than one file descriptor was sent");
        }
        if message.flags.contains(ReturnFlags::TRUNC) {
            return bad("the message is longer than a shared-allocation description");
        }
        if message.bytes > ExportInfo::ENCODED_LEN {
            return bad("the message is longer than a shared-allocation description");
        }
        if message.bytes != ExportInfo::ENCODED_LEN {
            return bad("the message is shorter than a shared-allocation description");
        }
        let info =
            ExportInfo::from_bytes(bytes.get(..ExportInfo::ENCODED_LEN).unwrap_or_default())?;
        let mut fds = fds.into_iter();
        match (fds.next(), fds.next()) {
            (Some(fd), None) => Ok(ExportedAllocation { fd, info }),
            (None, _) => bad("expected exactly one file descriptor, none came"),
            (Some(_), Some(_)) => bad("expected exactly one file descriptor, several came"),
        }
    }

    /// `pidfd_open` and `pidfd_getfd` — take a duplicate of descriptor `fd` of process `pid`, an
    /// exported allocation described by `info` (passed some other way, for example as
    /// [`ExportInfo::to_bytes`] through a pipe). The alternative to [`receive`](ExportedAllocation::receive)
    /// where there is no socket between the processes.
    ///
    /// The exporting process must keep its [`ExportedAllocation`] (the descriptor) open until this has
    /// returned. The kernel allows this only to a process that may `ptrace` the exporter
    /// (`PTRACE_MODE_ATTACH_REALCREDS`): where the Yama `ptrace_scope` setting or a container's
    /// seccomp profile restricts that, it answers `EPERM`, and [`receive`](ExportedAllocation::receive)
    /// is the way. Linux 5.6 and later.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a `pid` or `fd` no process could have (checked before any
    /// system call); [`Error::Os`]: `ESRCH` for no such process, `EBADF` where the process has no
    /// such descriptor, `EPERM` where the kernel does not allow it, `ENOSYS` on an older kernel.
    #[cfg(target_os = "linux")]
    #[doc(alias = "pidfd_getfd")]
    #[doc(alias = "pidfd_open")]
    pub fn take_from_process(
        pid: u32,
        fd: i32,
        info: ExportInfo,
    ) -> Result<ExportedAllocation, Error> {
        let pid = i32::try_from(pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .ok_or(Error::InvalidArgument { what: "process id" })?;
        if fd < 0 {
            return Err(Error::InvalidArgument {
                what: "file descriptor",
            });
        }
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
            .map_err(|e| os("pidfd_open", e))?;
        let fd = rustix::process::pidfd_getfd(
            &pidfd,
            fd,
            rustix::process::PidfdGetfdFlags::empty(),
        )
        .map_err(|e| {
            os(
                "pidfd_getfd (refused with EPERM where ptrace of the exporter is not allowed)",
                e,
            )
        })?;
        Ok(ExportedAllocation { fd, info })
    }
}

/// The kernel's refusal of `what`, as the crate's error.
pub(super) fn os(what: &'static str, errno: Errno) -> Error {
    Error::Os {
        what,
        errno: errno.raw_os_error(),
    }
}

#[cfg(test)]
mod tests {
    use super::{ExportInfo, ExportedAllocation};
    use crate::error::Error;
    use core::mem::MaybeUninit;
    use std::io::IoSlice;
    use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
    use std::os::unix::net::UnixStream;

    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

    /// How many of this process's descriptors refer to the pipe that `fd` is an end of. Not all
    /// of them: the other tests of this binary run on other threads and open and close their own
    /// meanwhile (a GPU run's, the driver's), which once made a count of `/proc/self/fd` differ.
    fn fds_of_pipe(fd: BorrowedFd<'_>) -> usize {
        let pipe = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
            .filter(|link| *link == pipe)
            .count()
    }

    /// Regression (found by `fuzz/fuzz_targets/receive.rs`): on a stream socket a message longer
    /// than a description was cut to its first 40 bytes and accepted, the rest left in the socket.
    #[test]
    fn a_long_message_on_a_stream_socket_is_refused() {
        let good = ExportInfo::new(2 << 20, 0, 2 << 20).unwrap().to_bytes();
        let (pipe_read, pipe_write) = std::io::pipe().unwrap();
        let fd = OwnedFd::from(pipe_write);
        let before = fds_of_pipe(fd.as_fd());
        assert_eq!(before, 2, "the pipe's two ends");
        for extra in [0usize, 1, 100] {
            let (a, b) = UnixStream::pair().unwrap();
            let mut message = good.to_vec();
            message.extend(std::iter::repeat_n(0xa9u8, extra));
            let fds = [fd.as_fd()];
            let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
            rustix::net::sendmsg(
                &a,
                &[IoSlice::new(&message)],
                &mut control,
                SendFlags::NOSIGNAL,
            )
            .unwrap();
            drop(a);
            let received = ExportedAllocation::receive(&b);
            if extra == 0 {
                assert_eq!(
                    received.unwrap().info(),
                    ExportInfo::from_bytes(&good).unwrap()
                );
            } else {
                assert!(
                    matches!(received, Err(Error::InvalidMessage { .. })),
                    "{extra} bytes too many: {received:?}"
                );
            }
        }
        assert_eq!(
            fds_of_pipe(fd.as_fd()),
            before,
            "every received descriptor was closed"
        );
        drop((pipe_read, fd));
    }
}
