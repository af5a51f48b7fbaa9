//! Exportable buffers: every page of a [`VirtualBuffer`] made with the same allocation options
//! ([`PageOptions`]: shareable handle kinds, the RDMA flag), exported whole as one
//! [`ExportedBuffer`], and imported by another process as an owned buffer of its own.

use std::os::fd::AsFd;

use super::{BUDGET, Memory, VirtualBuffer};
use crate::device::Device;
use crate::error::Error;
use crate::ipc::{BufferInfo, BufferPiece, ExportedBuffer, check_importable, export_fd, import_fd};
use crate::owned::pages::{Span, check_new_range, insertion_point};
use crate::vmm::access::AccessMode;
use crate::vmm::physical::{AllocationOptions, HandleKinds};

/// What every page of a [`VirtualBuffer`] is created with, whatever its device: the kinds of
/// shareable handle it can be exported as (`requestedHandleTypes`) and whether it is `GPUDirect`
/// RDMA capable (`allocFlags.gpuDirectRDMACapable`). Given to
/// [`VirtualBuffer::with_options`], which checks it once against every device of the access set.
///
/// # Examples
/// ```
/// use cuda_vmm::owned::PageOptions;
/// use cuda_vmm::vmm::HandleKinds;
///
/// let options = PageOptions::posix_fd().with_rdma(true);
/// assert!(options.handle_kinds().contains(HandleKinds::POSIX_FD));
/// assert!(options.rdma());
/// assert_eq!(PageOptions::new(), PageOptions::default());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PageOptions {
    handle_kinds: HandleKinds,
    rdma: bool,
}

impl PageOptions {
    /// Plain pages: not exportable, not RDMA-flagged (what [`VirtualBuffer::new`] uses).
    #[must_use]
    pub const fn new() -> PageOptions {
        PageOptions {
            handle_kinds: HandleKinds::NONE,
            rdma: false,
        }
    }

    /// Pages exportable as POSIX file descriptors, so that [`VirtualBuffer::export`] can share
    /// them with another process of the machine.
    ///
    /// # Examples
    /// ```
    /// # use cuda_vmm::{owned::PageOptions, vmm::HandleKinds};
    /// assert_eq!(PageOptions::posix_fd().handle_kinds(), HandleKinds::POSIX_FD);
    /// ```
    #[must_use]
    pub const fn posix_fd() -> PageOptions {
        PageOptions::new().with_handle_kinds(HandleKinds::POSIX_FD)
    }

    /// The same options, exportable as every kind of `kinds`; replaces the kinds asked for before.
    ///
    /// # Examples
    /// ```
    /// # use cuda_vmm::{owned::PageOptions, vmm::HandleKinds};
    /// let options = PageOptions::new().with_handle_kinds(HandleKinds::POSIX_FD | HandleKinds::FABRIC);
    /// assert!(options.handle_kinds().contains(HandleKinds::FABRIC));
    /// ```
    #[must_use]
    pub const fn with_handle_kinds(self, kinds: HandleKinds) -> PageOptions {
        PageOptions {
            handle_kinds: kinds,
            rdma: self.rdma,
        }
    }

    /// The same options, `GPUDirect` RDMA capable or not.
    ///
    /// # Examples
    /// ```
    /// # use cuda_vmm::owned::PageOptions;
    /// assert!(PageOptions::new().with_rdma(true).rdma());
    /// ```
    #[must_use]
    pub const fn with_rdma(self, rdma: bool) -> PageOptions {
        PageOptions {
            handle_kinds: self.handle_kinds,
            rdma,
        }
    }

    /// The kinds of shareable handle every page can be exported as.
    #[must_use]
    pub const fn handle_kinds(&self) -> HandleKinds {
        self.handle_kinds
    }

    /// Whether every page is asked `GPUDirect` RDMA capable.
    #[must_use]
    pub const fn rdma(&self) -> bool {
        self.rdma
    }

    /// The allocation options of a page of `device`'s memory made with these options.
    ///
    /// # Examples
    /// ```no_run
    /// # use cuda_vmm::{Device, owned::PageOptions, vmm::{HandleKinds, Location}};
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let options = PageOptions::posix_fd().for_device(device);
    /// assert_eq!(options.location, Location::Device(device));
    /// assert!(options.handle_kinds().contains(HandleKinds::POSIX_FD));
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn for_device(self, device: Device) -> AllocationOptions {
        AllocationOptions::device(device)
            .with_handle_kinds(self.handle_kinds)
            .with_rdma(self.rdma)
    }
}

impl<M: AccessMode> VirtualBuffer<M> {
    /// `cuMemAddressReserve` — as [`new`](VirtualBuffer::new), for a buffer whose pages are all
    /// created (`cuMemCreate`) with `options`: exportable as its handle kinds, RDMA capable where
    /// it says so.
    ///
    /// The options are checked once, here, before any driver call that changes anything, against
    /// every device of the access set (its attributes: POSIX-fd handles, fabric handles and their
    /// probe, `GPUDirect` RDMA with VMM), as
    /// [`PhysicalAllocation::with_options`](crate::PhysicalAllocation::with_options) checks them; a page of another device is checked
    /// when it is created. The budget must be a multiple of each device's granularity for these
    /// options.
    ///
    /// # Errors
    /// [`Error::Unsupported`] where a device's attribute for an option is 0; [`Error::Refused`]
    /// where the fabric probe fails; otherwise as [`new`](VirtualBuffer::new).
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::{Device, ReadWrite, VirtualBuffer, owned::PageOptions};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let buffer = VirtualBuffer::with_options(1 << 30, &[device], ReadWrite, PageOptions::posix_fd())?;
    /// buffer.grow(device, 2 << 20)?; // an exportable page
    /// let exported = buffer.export()?;
    /// assert_eq!(exported.info().pieces().len(), 1);
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuMemAddressReserve")]
    #[doc(alias = "requestedHandleTypes")]
    pub fn with_options(
        budget: usize,
        devices: &[Device],
        mode: M,
        options: PageOptions,
    ) -> Result<VirtualBuffer<M>, Error> {
        let _ = mode;
        for &device in devices {
            options.for_device(device).check_supported()?;
        }
        VirtualBuffer::reserve(budget, devices, options)
    }

    /// What every page this buffer creates is made with.
    #[must_use]
    pub fn page_options(&self) -> PageOptions {
        self.options
    }

    /// `cuMemExportToShareableHandle` — export every page of the buffer as a POSIX file
    /// descriptor, with one description of them all ([`BufferInfo`]: the budget and each page's
    /// offset, size, device and granularity): an [`ExportedBuffer`], sent in one message with
    /// [`ExportedBuffer::send`].
    ///
    /// Retired pages (about to be released) and evicted ranges (no memory) are left out: the
    /// importer sees holes there. Each descriptor is a reference to its page's memory of its own:
    /// the memory stays allocated while it is open, in any process, and while another process has
    /// it imported, even after this buffer has unmapped and released the page.
    ///
    /// # Errors
    /// Before any driver call: [`Error::PageRange`] naming a page not created exportable as a POSIX
    /// file descriptor (a buffer made without [`PageOptions::posix_fd`], a
    /// [`SharedPage`](crate::owned::SharedPage) whose memory was not created exportable, or a page
    /// imported from another process, which is not exported again); [`Error::ZeroSize`] where no page
    /// is left to export; [`Error::InvalidArgument`] for more than [`BufferInfo::MAX_PIECES`] pages
    /// (the descriptors of one message). Then the driver's error; the descriptors made so far are
    /// closed.
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::{Device, ReadWrite, VirtualBuffer, owned::PageOptions};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// # let (socket, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
    /// let device = Device::get(0)?;
    /// let buffer = VirtualBuffer::with_options(1 << 30, &[device], ReadWrite, PageOptions::posix_fd())?;
    /// for _ in 0..5 {
    ///     buffer.grow(device, 2 << 20)?;
    /// }
    /// buffer.export()?.send(&socket)?; // five descriptors in one message
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuMemExportToShareableHandle")]
    pub fn export(&self) -> Result<ExportedBuffer, Error> {
        let table = self.lock();
        let pages: Vec<&super::Page> = table.pages.iter().filter(|p| !p.retired).collect();
        let mut pieces = Vec::with_capacity(pages.len());
        for page in &pages {
            let memory = page.memory.allocation();
            if !memory
                .options()
                .handle_kinds()
                .contains(HandleKinds::POSIX_FD)
            {
                return Err(Error::PageRange {
                    start: page.start(),
                    end: page.end(),
                    problem: "are a page that is not exportable as a POSIX file descriptor \
                              (made without PageOptions::posix_fd(), or imported from another \
                              process, which is not exported again)",
                });
            }
            pieces.push(BufferPiece::new(
                page.offset,
                memory.size(),
                page.device.ordinal(),
                memory.granularity(),
            )?);
        }
        let info = BufferInfo::new(self.budget, pieces)?;
        let fds = pages
            .iter()
            .map(|page| export_fd(page.memory.allocation()))
            .collect::<Result<Vec<_>, Error>>()?;
        ExportedBuffer::from_parts(fds, info)
    }

    /// `cuMemImportFromShareableHandle`, `cuMemMap`, `cuMemSetAccess` — a buffer of this process
    /// holding another process's exported buffer: a reservation of the exporter's budget (at an
    /// address of this process's own), every page imported and mapped at its offset, granted to
    /// `devices` in `mode`. The pages are the same memory as the exporter's: writes through either
    /// buffer are read through the other.
    ///
    /// The buffer owns its imported pages like any others (unmapped and released on drop, each an
    /// own reference to the memory, which the exporter's release does not end). Its new pages are
    /// made exportable as POSIX file descriptors ([`PageOptions::posix_fd`]), like the imported
    /// ones, so it can be exported on.
    ///
    /// Before any import, every piece is checked against this process's driver: its device ordinal
    /// names a device here, whose granularity is the exporter's, and its offset and size fit the
    /// reservation; after each import, the driver's own answer for where the memory lives. On any
    /// failure nothing stays mapped: the pages imported so far are unmapped and released, and the
    /// reservation is freed. `exported`'s descriptors stay open: drop it whenever convenient.
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`] for a device ordinal this process does not have;
    /// [`Error::InvalidMessage`] for a granularity that differs here, or memory that is not device
    /// memory; [`Error::DeviceMismatch`] where the driver places a page on another device than the
    /// description; as [`with_options`](VirtualBuffer::with_options) for the budget and the access
    /// set; [`Error::NotAligned`] where this process's reservation is not aligned for a page; the
    /// driver's error otherwise (e.g. `cuMemMap`'s refusal of a size that lies).
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::{Device, ReadWrite, VirtualBuffer, ipc::ExportedBuffer};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// # let (socket, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
    /// let device = Device::get(0)?;
    /// let received = ExportedBuffer::receive(&socket)?;
    /// let mut buffer = VirtualBuffer::import(&received, &[device], ReadWrite)?;
    /// let bytes = buffer.slice_bytes::<u8>(..2 << 20)?.to_vec()?; // the exporter's bytes
    /// # drop(bytes);
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuMemImportFromShareableHandle")]
    pub fn import(
        exported: &ExportedBuffer,
        devices: &[Device],
        mode: M,
    ) -> Result<VirtualBuffer<M>, Error> {
        let info = exported.info();
        let mut pieces = Vec::with_capacity(info.pieces().len());
        for piece in info.pieces() {
            let (device, _) =
                check_importable(piece.size(), piece.device_ordinal(), piece.granularity())?;
            pieces.push(device);
        }
        let buffer =
            VirtualBuffer::with_options(info.budget(), devices, mode, PageOptions::posix_fd())?;
        {
            let mut table = buffer.lock();
            let range = (buffer.base, buffer.budget, BUDGET);
            for piece in info.pieces() {
                check_new_range(range, piece.offset(), piece.size(), piece.granularity())?;
            }
            for ((piece, fd), device) in exported.pieces().zip(pieces) {
                let index = insertion_point(&table.pages, piece.offset(), piece.end())?;
                let memory = import_fd(
                    fd.as_fd(),
                    piece.size(),
                    piece.device_ordinal(),
                    piece.granularity(),
                )?;
                buffer.map_at(
                    &mut table,
                    index,
                    piece.offset(),
                    Memory::Own(memory),
                    device,
                )?;
            }
        }
        Ok(buffer)
    }

    /// `recvmsg`, then [`import`](VirtualBuffer::import): receive an exported buffer over a Unix
    /// socket ([`ExportedBuffer::receive`], which checks the message before any driver call and
    /// closes every descriptor of a refused one) and import it. The received descriptors are closed
    /// before this returns.
    ///
    /// # Errors
    /// As [`ExportedBuffer::receive`] and [`import`](VirtualBuffer::import).
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::{Device, ReadWrite, VirtualBuffer};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let buffer = VirtualBuffer::receive(std::io::stdin(), &[device], ReadWrite)?;
    /// println!("{} bytes imported", buffer.mapped_bytes());
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "recvmsg")]
    #[doc(alias = "cuMemImportFromShareableHandle")]
    pub fn receive(
        socket: impl AsFd,
        devices: &[Device],
        mode: M,
    ) -> Result<VirtualBuffer<M>, Error> {
        let exported = ExportedBuffer::receive(socket)?;
        VirtualBuffer::import(&exported, devices, mode)
    }
}
