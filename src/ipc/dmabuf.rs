//! dma-buf file descriptors of device memory (`cuMemGetHandleForAddressRange`): what a network
//! adapter's driver registers (`ibv_reg_dmabuf_mr`, libfabric's and UCX's dma-buf memory regions)
//! to read and write GPU memory with no copy through the host.
//!
//! A [`DmaBufExport`] is made by
//! [`VirtualBuffer::export_dma_buf`](crate::VirtualBuffer::export_dma_buf): one descriptor per
//! chunk of the range ([`DmaBufChunk`]), each a whole page or a run of pages as
//! [`DmaBufLayout`] says, each checked to be a dma-buf of its chunk's size. It borrows the buffer,
//! so nothing that unmaps, shrinks, retires or evicts a page, or changes the access set, compiles
//! while it lives. This file holds the types and the one driver call; the checks of the range are
//! the buffer's.
//!
//! # Why one descriptor per chunk
//! A [`VirtualBuffer`](crate::VirtualBuffer) is many physical allocations mapped back to back.
//! `cuMemGetAddressRange` of an address in it gives the one allocation holding it, and six projects
//! (torchcomms, libfabric, UCX twice, Mooncake, monarch) found in 2026 that dma-buf memory regions
//! and IPC exports built from its answer covered the first chunk only, silently: RDMA past it
//! failed with `IBV_WC_LOC_PROT_ERR` or read the wrong bytes. Here the chunks come from the
//! buffer's own page table, every byte of the range is covered by exactly one chunk, and the size
//! the kernel reports for each descriptor (`lseek(fd, 0, SEEK_END)`, the documented size query of
//! a dma-buf) is checked against its chunk before the export is returned.

use core::ffi::{c_int, c_void};
use core::fmt;
use core::marker::PhantomData;
use core::ops::Range;
use std::io::{Seek, SeekFrom};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::device::Device;
use crate::error::{Error, check};
use crate::sys;

/// How [`VirtualBuffer::export_dma_buf`](crate::VirtualBuffer::export_dma_buf) cuts a range into
/// descriptors.
///
/// The driver documents that one descriptor may span several physical allocations where they are
/// all on one device with identical allocation properties; whether a network adapter's registration
/// of such a descriptor reaches past its first allocation is the bug this crate's export guards
/// against, and the answer of a given driver is measured by `tests/dmabuf.rs`, which prints it.
/// Every descriptor's size is checked either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum DmaBufLayout {
    /// One descriptor per page of the range (each page one physical allocation): each descriptor
    /// is one allocation, the case every driver that exports VMM memory as dma-buf takes.
    #[default]
    PerPage,
    /// One descriptor per run of adjacent pages on one device made with identical allocation
    /// options: one over the whole range where every page is so. Fewer descriptors (one memory
    /// region for the adapter), where the driver allows it.
    PerRun,
}

/// One chunk of a [`DmaBufExport`]: a dma-buf file descriptor (closed on drop) of the bytes
/// `[offset, offset + size)` of the buffer, at device address [`address`](DmaBufChunk::address).
///
/// The descriptor covers exactly the chunk, from its first byte: register it with its
/// `dma-buf offset` 0 and length [`size`](DmaBufChunk::size) (`ibv_reg_dmabuf_mr(pd, 0, size,
/// address, fd, access)`), or any sub-range of it at its offset into the chunk.
pub struct DmaBufChunk {
    fd: OwnedFd,
    offset: usize,
    size: usize,
    address: u64,
    device: Device,
}

impl fmt::Debug for DmaBufChunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaBufChunk")
            .field("fd", &self.fd.as_raw_fd())
            .field("offset", &self.offset)
            .field("size", &self.size)
            .field("address", &format_args!("{:#x}", self.address))
            .field("device", &self.device)
            .finish()
    }
}

impl AsFd for DmaBufChunk {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl DmaBufChunk {
    /// The dma-buf file descriptor, borrowed: it stays open while the export lives.
    ///
    /// A duplicate of it ([`BorrowedFd::try_clone_to_owned`]) outlives the export's borrow of the
    /// buffer; what an importer then reaches once the buffer has unmapped the page is the driver's
    /// and the importer's business (device memory, never this process's Rust memory). Register
    /// from the borrowed descriptor, and deregister before the export ends.
    #[must_use]
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The chunk's first byte, counted from the buffer's base.
    #[must_use]
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The chunk's size in bytes: the dma-buf's size (checked).
    #[must_use]
    pub fn size(&self) -> usize {
        self.size
    }

    /// The device address of the chunk's first byte (the I/O virtual address an adapter may be
    /// given for it).
    #[must_use]
    pub fn address(&self) -> u64 {
        self.address
    }

    /// The device whose memory the chunk is.
    #[must_use]
    pub fn device(&self) -> Device {
        self.device
    }
}

/// A byte range of a [`VirtualBuffer`](crate::VirtualBuffer) exported as dma-buf file
/// descriptors, one per chunk ([`DmaBufLayout`]), which together cover every byte of the range
/// once, in address order. Made by
/// [`VirtualBuffer::export_dma_buf`](crate::VirtualBuffer::export_dma_buf); the descriptors are
/// closed when it is dropped.
///
/// It borrows the buffer for `'buf`: no page of it is unmapped, shrunk, retired or evicted, and
/// the access set is not changed, while it lives (each of those takes the buffer by `&mut`).
/// Growing the buffer elsewhere and its views are fine.
///
/// ```compile_fail,E0502
/// use cuda_vmm::{Device, ReadWrite, VirtualBuffer, ipc::DmaBufLayout};
///
/// # fn main() -> cuda_vmm::Result<()> {
/// let device = Device::get(0)?;
/// let mut buffer = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
/// buffer.grow(device, 2 << 20)?;
/// let export = buffer.export_dma_buf(.., DmaBufLayout::PerPage)?;
/// buffer.unmap(..)?; // the page a network adapter may be writing
/// drop(export);
/// # Ok(())
/// # }
/// ```
///
/// # Lifetimes
/// `'buf` is the shared borrow of the buffer the range is in.
pub struct DmaBufExport<'buf> {
    chunks: Vec<DmaBufChunk>,
    range: Range<usize>,
    /// The shared borrow of the buffer, at the type level only (covariant in `'buf`; `&()` is
    /// `Send` and `Sync`, so the export's auto traits are those of its descriptors).
    _buffer: PhantomData<&'buf ()>,
}

impl fmt::Debug for DmaBufExport<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaBufExport")
            .field("range", &self.range)
            .field("chunks", &self.chunks)
            .finish()
    }
}

impl<'buf> DmaBufExport<'buf> {
    /// The export of `range`, whose chunks (in address order, covering it) the caller exported
    /// from a buffer it holds borrowed for `'buf`.
    pub(crate) fn new(chunks: Vec<DmaBufChunk>, range: Range<usize>) -> DmaBufExport<'buf> {
        DmaBufExport {
            chunks,
            range,
            _buffer: PhantomData,
        }
    }

    /// The chunks, in address order: together they cover [`range`](DmaBufExport::range) once.
    #[must_use]
    pub fn chunks(&self) -> &[DmaBufChunk] {
        &self.chunks
    }

    /// The exported bytes, counted from the buffer's base.
    #[must_use]
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }
}

impl DmaBufChunk {
    /// A chunk of `size` bytes at byte `offset` of a buffer, at device address `address`, of
    /// `device`'s memory, whose descriptor `fd` the caller has checked.
    pub(crate) fn new(
        fd: OwnedFd,
        offset: usize,
        size: usize,
        address: u64,
        device: Device,
    ) -> DmaBufChunk {
        DmaBufChunk {
            fd,
            offset,
            size,
            address,
            device,
        }
    }
}

/// `cuMemGetHandleForAddressRange` — a dma-buf file descriptor of `[address, address + size)`
/// (flags 0), and the size the kernel reports for it (`lseek(fd, 0, SEEK_END)`), for the caller to
/// compare with `size`. The current context is the caller's to set.
///
/// # Errors
/// The driver's error; [`Error::InvalidMessage`] where it returned success with no descriptor;
/// [`Error::Os`] where the kernel cannot say the descriptor's size (it is closed then).
pub(crate) fn export_range(address: u64, size: usize) -> Result<(OwnedFd, u64), Error> {
    let mut fd: c_int = -1;
    // SAFETY: for `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD` the driver writes one `int` through
    // `handle`: `fd` is a live, writable `c_int`. The driver reads nothing else through a pointer;
    // the range is the caller's (it refuses a range that is not mapped); flags must be 0.
    check(unsafe {
        sys::cuMemGetHandleForAddressRange(
            (&raw mut fd).cast::<c_void>(),
            address,
            size,
            sys::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    })?;
    if fd < 0 {
        return Err(Error::InvalidMessage {
            what: "the driver exported no dma-buf file descriptor",
        });
    }
    // SAFETY: the driver has just opened `fd` for this export and handed it to the caller: it is
    // open, and nothing else in this process owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = std::fs::File::from(fd);
    // A dma-buf answers `SEEK_END` with its size (and refuses any other seek but `SEEK_SET` 0).
    let reported = file.seek(SeekFrom::End(0)).map_err(|e| Error::Os {
        what: "lseek(SEEK_END) of an exported dma-buf (its size)",
        errno: e.raw_os_error().unwrap_or(0),
    })?;
    Ok((OwnedFd::from(file), reported))
}
