//! A whole [`VirtualBuffer`](crate::VirtualBuffer) shared between processes: every page's
//! description in one [`BufferInfo`] and one descriptor per page, sent in one `SCM_RIGHTS` message
//! ([`ExportedBuffer`]). The description and its wire format are `buffer/info.rs`.

use core::fmt;
use core::mem::MaybeUninit;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketType,
};

use super::unix::os;
use crate::error::Error;

mod info;

use info::wants_more;
pub use info::{BufferInfo, BufferPiece};

/// An exported buffer: one POSIX file descriptor per page (std [`OwnedFd`]s, closed on drop), in the
/// order of its [`BufferInfo`]'s pieces. Made by
/// [`ExportableBuffer::export`](crate::owned::ExportableBuffer::export), sent with
/// [`send`](ExportedBuffer::send), received with [`receive`](ExportedBuffer::receive), imported with
/// [`VirtualBuffer::import`](crate::VirtualBuffer::import).
///
/// As for one allocation, each descriptor is a reference to its page's memory of its own, and
/// closing it releases nothing that was imported from it.
///
/// # Examples
/// ```no_run
/// use cuda_vmm::ipc::ExportedBuffer;
/// use cuda_vmm::{ReadWrite, VirtualBuffer};
///
/// # fn main() -> cuda_vmm::Result<()> {
/// # let socket = std::os::unix::net::UnixStream::pair().unwrap().0;
/// # let device = cuda_vmm::Device::get(0)?;
/// let received = ExportedBuffer::receive(&socket)?; // checked, no driver call
/// let buffer = VirtualBuffer::import(&received, &[device], ReadWrite)?;
/// drop(received); // the buffer holds its own references to the memory
/// # Ok(())
/// # }
/// ```
pub struct ExportedBuffer {
    fds: Vec<OwnedFd>,
    info: BufferInfo,
}

impl fmt::Debug for ExportedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fds: Vec<i32> = self.fds.iter().map(AsRawFd::as_raw_fd).collect();
        f.debug_struct("ExportedBuffer")
            .field("fds", &fds)
            .field("info", &self.info)
            .finish()
    }
}

impl ExportedBuffer {
    /// An exported buffer from descriptors and their description, received some other way: one
    /// descriptor per piece, in the pieces' order. Nothing is checked against the driver here.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] where the number of descriptors is not the number of pieces (the
    /// descriptors are closed then).
    ///
    /// # Examples
    /// ```no_run
    /// # use cuda_vmm::ipc::{BufferInfo, BufferPiece, ExportedBuffer};
    /// # fn main() -> cuda_vmm::Result<()> {
    /// # let fd: std::os::fd::OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
    /// let info = BufferInfo::new(2 << 20, vec![BufferPiece::new(0, 2 << 20, 0, 2 << 20)?])?;
    /// let exported = ExportedBuffer::from_parts(vec![fd], info)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_parts(fds: Vec<OwnedFd>, info: BufferInfo) -> Result<ExportedBuffer, Error> {
        if fds.len() != info.pieces().len() {
            return Err(Error::LengthMismatch {
                expected: info.pieces().len(),
                found: fds.len(),
            });
        }
        Ok(ExportedBuffer { fds, info })
    }

    /// The descriptors and the description.
    ///
    /// # Examples
    /// ```no_run
    /// # fn main() -> cuda_vmm::Result<()> {
    /// # let socket = std::os::unix::net::UnixStream::pair().unwrap().0;
    /// let (fds, info) = cuda_vmm::ipc::ExportedBuffer::receive(&socket)?.into_parts();
    /// assert_eq!(fds.len(), info.pieces().len());
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn into_parts(self) -> (Vec<OwnedFd>, BufferInfo) {
        (self.fds, self.info)
    }

    /// What an importer needs besides the descriptors.
    #[must_use]
    pub fn info(&self) -> &BufferInfo {
        &self.info
    }

    /// Each piece with its descriptor, in address order.
    pub(crate) fn pieces(&self) -> impl Iterator<Item = (&BufferPiece, BorrowedFd<'_>)> {
        self.info
            .pieces()
            .iter()
            .zip(self.fds.iter().map(AsFd::as_fd))
    }

    /// `sendmsg` — send the description and, as `SCM_RIGHTS` ancillary data, a duplicate of every
    /// descriptor, in one message over a connected Unix socket (stream or sequenced-packet). The
    /// receiver gets its own descriptors: `self` may be dropped right after. `MSG_NOSIGNAL` is set.
    ///
    /// # Errors
    /// [`Error::Os`] where the kernel refuses (`EPIPE`, `ENOTSOCK`, `ETOOMANYREFS`, ...);
    /// [`Error::InvalidMessage`] where the socket took only part of the message.
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::{Device, ReadWrite, owned::ExportableBuffer};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// # let socket = std::os::unix::net::UnixStream::pair().unwrap().0;
    /// let device = Device::get(0)?;
    /// let buffer = ExportableBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// buffer.grow(device, 2 << 20)?;
    /// buffer.export()?.send(&socket)?; // one message, one descriptor per page
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "sendmsg")]
    #[doc(alias = "SCM_RIGHTS")]
    pub fn send(&self, socket: impl AsFd) -> Result<(), Error> {
        let bytes = self.info.to_bytes();
        let fds: Vec<BorrowedFd<'_>> = self.fds.iter().map(AsFd::as_fd).collect();
        let mut space =
            [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(BufferInfo::MAX_PIECES))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(Error::Overflow {
                what: "ancillary data of an exported buffer's descriptors",
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

    /// `recvmsg` — receive what [`send`](ExportedBuffer::send) sent: one message holding a
    /// description and one descriptor per piece (received close-on-exec).
    ///
    /// Everything is checked before it is returned, and so before any driver call: the
    /// description ([`BufferInfo::from_bytes`]), that neither data nor ancillary data was
    /// truncated, and that exactly as many descriptors came as the description has pieces. Every
    /// descriptor of a refused message is closed. On a stream socket the rest of a message the
    /// kernel split is read on (up to [`BufferInfo::MAX_ENCODED_LEN`] bytes); on a packet socket
    /// the message is one packet. Blocks until a message or the end of the connection arrives.
    ///
    /// # Errors
    /// [`Error::InvalidMessage`] for the end of the connection, a short, long or malformed message,
    /// truncated ancillary data, or a number of descriptors other than the number of pieces; as
    /// [`BufferInfo::from_bytes`] for the fields; [`Error::Os`] where the kernel refuses.
    ///
    /// # Examples
    /// ```no_run
    /// # fn main() -> cuda_vmm::Result<()> {
    /// # let socket = std::os::unix::net::UnixStream::pair().unwrap().0;
    /// let received = cuda_vmm::ipc::ExportedBuffer::receive(&socket)?;
    /// println!("{} pages", received.info().pieces().len());
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "recvmsg")]
    #[doc(alias = "SCM_RIGHTS")]
    pub fn receive(socket: impl AsFd) -> Result<ExportedBuffer, Error> {
        // One byte more than the longest message, so that a longer one is seen to be too long.
        let mut bytes = vec![0u8; BufferInfo::MAX_ENCODED_LEN.saturating_add(1)];
        // Own every descriptor that comes, so that each is closed on any error below.
        let mut fds: Vec<OwnedFd> = Vec::new();
        let stream = rustix::net::sockopt::socket_type(&socket)
            .map_err(|e| os("getsockopt(SO_TYPE)", e))?
            == SocketType::STREAM;
        let mut received = 0usize;
        while let Some(rest) = bytes.get_mut(received..) {
            let mut space = [MaybeUninit::<u8>::uninit();
                rustix::cmsg_space!(ScmRights(BufferInfo::MAX_PIECES))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let message = rustix::io::retry_on_intr(|| {
                rustix::net::recvmsg(
                    &socket,
                    &mut [IoSliceMut::new(rest)],
                    &mut control,
                    RecvFlags::CMSG_CLOEXEC,
                )
            })
            .map_err(|e| os("recvmsg", e))?;
            for ancillary in control.drain() {
                if let RecvAncillaryMessage::ScmRights(more) = ancillary {
                    fds.extend(more);
                }
            }
            if message.flags.contains(ReturnFlags::CTRUNC) {
                return Err(Error::InvalidMessage {
                    what: "ancillary data was truncated: more descriptors than a buffer has pieces",
                });
            }
            if message.flags.contains(ReturnFlags::TRUNC) {
                return Err(Error::InvalidMessage {
                    what: "the message is longer than any exported-buffer description",
                });
            }
            if message.bytes == 0 {
                if received == 0 && fds.is_empty() {
                    return Err(Error::InvalidMessage {
                        what: "the connection ended before a message came",
                    });
                }
                break;
            }
            received = received.saturating_add(message.bytes);
            if !stream || !wants_more(bytes.get(..received).unwrap_or_default()) {
                break;
            }
        }
        let message = bytes.get(..received).unwrap_or_default();
        let info = BufferInfo::from_bytes(message)?;
        if fds.len() != info.pieces().len() {
            return Err(Error::InvalidMessage {
                what: "the number of descriptors is not the number of pieces",
            });
        }
        Ok(ExportedBuffer { fds, info })
    }
}
