//! Exportable buffers: every page of a [`VirtualBuffer`] made with the same allocation options
//! ([`PageOptions`]: shareable handle kinds, the RDMA flag); an [`ExportableBuffer`], whose pages are
//! made exportable as POSIX file descriptors, exported whole as one [`ExportedBuffer`]; and imported
//! by another process as an owned buffer of its own.

use core::fmt;
use core::ops::{Deref, DerefMut};
use std::os::fd::AsFd;

use super::page::{Memory, PageOptions};
use super::{BUDGET, VirtualBuffer};
use crate::device::Device;
use crate::error::Error;
use crate::ipc::{BufferInfo, BufferPiece, ExportedBuffer, check_importable, export_fd, import_fd};
use crate::owned::pages::check_new_range;
use crate::vmm::access::{AccessMode, ReadWrite};
use crate::vmm::physical::{HandleKinds, PhysicalAllocation};

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
    /// A buffer to export is an [`ExportableBuffer`]: a `VirtualBuffer` has no `export`.
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
    /// let options = PageOptions::new().with_rdma(true);
    /// let buffer = VirtualBuffer::with_options(1 << 30, &[device], ReadWrite, options)?;
    /// buffer.grow(device, 2 << 20)?; // a GPUDirect RDMA capable page
    /// assert_eq!(buffer.page_options(), options);
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

    /// `cuMemImportFromShareableHandle`, `cuMemMap`, `cuMemSetAccess` — a buffer of this process
    /// holding another process's exported buffer: a reservation of the exporter's budget (at an
    /// address of this process's own), every page imported and mapped at its offset, granted to
    /// `devices` in `mode`. The pages are the same memory as the exporter's: writes through either
    /// buffer are read through the other.
    ///
    /// The buffer owns its imported pages like any others (unmapped and released on drop, each an
    /// own reference to the memory, which the exporter's release does not end). Its new pages are
    /// made with [`PageOptions::posix_fd`], the options of the imported ones (so the same
    /// granularity). It is a plain `VirtualBuffer`, with no `export`: the driver does not export
    /// imported memory again (`cuMemExportToShareableHandle` answers `CUDA_ERROR_INVALID_VALUE`).
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
                table.check_vacant(piece.offset(), piece.end())?;
                let memory = import_fd(
                    fd.as_fd(),
                    piece.size(),
                    piece.device_ordinal(),
                    piece.granularity(),
                )?;
                table.map(
                    piece.offset(),
                    Memory::Own(memory),
                    device,
                    &buffer.access,
                    M::FLAGS,
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

/// A [`VirtualBuffer`] whose pages are all created exportable as POSIX file descriptors, and so the
/// only buffer with [`export`](ExportableBuffer::export): a plain `VirtualBuffer` has none, so a
/// buffer whose pages were made without a shareable handle kind is never exported (the driver would
/// refuse each page: `cuMemExportToShareableHandle` of memory made without `requestedHandleTypes`).
///
/// It is the buffer itself: it dereferences to its [`VirtualBuffer`] for everything else (grow,
/// views, scopes, evict and restore: restored pages are made exportable too), and
/// [`into_inner`](ExportableBuffer::into_inner) gives the plain buffer back. Pages mapped into it
/// from elsewhere ([`map_shared`](VirtualBuffer::map_shared) of a page whose memory was made
/// otherwise, or imported from another process) are the types' blind spot: `export` refuses them at
/// run time, before any driver call.
///
/// # Examples
/// ```no_run
/// use cuda_vmm::{Device, ReadWrite, VirtualBuffer, owned::ExportableBuffer};
///
/// # fn main() -> cuda_vmm::Result<()> {
/// # let (socket, peer) = std::os::unix::net::UnixStream::pair().unwrap();
/// let device = Device::get(0)?;
/// let buffer = ExportableBuffer::new(1 << 30, &[device], ReadWrite)?;
/// buffer.grow(device, 2 << 20)?; // a VirtualBuffer method, through Deref
/// buffer.export()?.send(&socket)?;
/// // In the other process:
/// let imported = VirtualBuffer::receive(&peer, &[device], ReadWrite)?;
/// assert_eq!(imported.mapped_bytes(), 2 << 20);
/// # Ok(())
/// # }
/// ```
///
/// A plain buffer has no `export`:
/// ```compile_fail,E0599
/// # fn main() -> cuda_vmm::Result<()> {
/// # let device = cuda_vmm::Device::get(0)?;
/// let buffer = cuda_vmm::VirtualBuffer::new(1 << 30, &[device], cuda_vmm::ReadWrite)?;
/// buffer.grow(device, 2 << 20)?;
/// let exported = buffer.export()?; // its pages were not made exportable
/// # Ok(())
/// # }
/// ```
pub struct ExportableBuffer<M: AccessMode = ReadWrite>(VirtualBuffer<M>);

impl<M: AccessMode> fmt::Debug for ExportableBuffer<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ExportableBuffer").field(&self.0).finish()
    }
}

impl<M: AccessMode> Deref for ExportableBuffer<M> {
    type Target = VirtualBuffer<M>;
    fn deref(&self) -> &VirtualBuffer<M> {
        &self.0
    }
}

impl<M: AccessMode> DerefMut for ExportableBuffer<M> {
    fn deref_mut(&mut self) -> &mut VirtualBuffer<M> {
        &mut self.0
    }
}

impl<M: AccessMode> From<ExportableBuffer<M>> for VirtualBuffer<M> {
    fn from(buffer: ExportableBuffer<M>) -> VirtualBuffer<M> {
        buffer.0
    }
}

impl<M: AccessMode> ExportableBuffer<M> {
    /// `cuMemAddressReserve` — as [`VirtualBuffer::new`], for a buffer whose pages are all created
    /// exportable as POSIX file descriptors ([`PageOptions::posix_fd`]), checked once against every
    /// device of the access set as [`VirtualBuffer::with_options`] checks them.
    ///
    /// # Errors
    /// As [`VirtualBuffer::with_options`]: [`Error::Unsupported`] where a device does not export
    /// POSIX file descriptors, then as [`VirtualBuffer::new`].
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::{Device, ReadWrite, owned::{ExportableBuffer, PageOptions}};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let buffer = ExportableBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// assert_eq!(buffer.page_options(), PageOptions::posix_fd());
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuMemAddressReserve")]
    pub fn new(budget: usize, devices: &[Device], mode: M) -> Result<ExportableBuffer<M>, Error> {
        ExportableBuffer::with_options(budget, devices, mode, PageOptions::posix_fd())
    }

    /// `cuMemAddressReserve` — as [`VirtualBuffer::with_options`], for options that make every
    /// page exportable as a POSIX file descriptor (and possibly more: fabric handles, the RDMA
    /// flag).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] where `options`' handle kinds lack
    /// [`HandleKinds::POSIX_FD`], before any driver call; then as
    /// [`VirtualBuffer::with_options`].
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::{Device, ReadWrite, owned::{ExportableBuffer, PageOptions}};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let options = PageOptions::posix_fd().with_rdma(true);
    /// let buffer = ExportableBuffer::with_options(1 << 30, &[device], ReadWrite, options)?;
    /// assert!(ExportableBuffer::with_options(1 << 30, &[device], ReadWrite, PageOptions::new()).is_err());
    /// # drop(buffer);
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
    ) -> Result<ExportableBuffer<M>, Error> {
        if !options.handle_kinds().contains(HandleKinds::POSIX_FD) {
            return Err(Error::InvalidArgument {
                what: "page options of an exportable buffer without HandleKinds::POSIX_FD: its \
                       pages could not be exported as POSIX file descriptors",
            });
        }
        VirtualBuffer::with_options(budget, devices, mode, options).map(ExportableBuffer)
    }

    /// The plain buffer, which no longer exports.
    #[must_use]
    pub fn into_inner(self) -> VirtualBuffer<M> {
        self.0
    }

    /// `cuMemUnmap`, `cuMemRelease`, `cuMemAddressFree` — as [`VirtualBuffer::free`].
    ///
    /// # Errors
    /// As [`VirtualBuffer::free`].
    #[doc(alias = "cuMemAddressFree")]
    pub fn free(self) -> Result<(), Error> {
        self.0.free()
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
    /// Before any driver call: [`Error::PageRange`] naming a page whose memory was not created
    /// exportable as a POSIX file descriptor. Every page this buffer creates is, so such a page came
    /// from elsewhere: a [`SharedPage`](crate::owned::SharedPage) mapped with
    /// [`map_shared`](VirtualBuffer::map_shared) whose memory was made without a POSIX-fd handle
    /// kind, or that was imported from another process (the driver does not export imported memory
    /// again: `CUDA_ERROR_INVALID_VALUE`), or a page of a buffer put in place with `DerefMut` (a
    /// `mem::swap`). [`Error::ZeroSize`] where no page is left to export;
    /// [`Error::InvalidArgument`] for more than [`BufferInfo::MAX_PIECES`] pages (the descriptors of
    /// one message). Then the driver's error; the descriptors made so far are closed.
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::{Device, ReadWrite, owned::ExportableBuffer};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// # let (socket, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
    /// let device = Device::get(0)?;
    /// let buffer = ExportableBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// for _ in 0..5 {
    ///     buffer.grow(device, 2 << 20)?;
    /// }
    /// buffer.export()?.send(&socket)?; // five descriptors in one message
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuMemExportToShareableHandle")]
    pub fn export(&self) -> Result<ExportedBuffer, Error> {
        let table = self.0.lock();
        let pages: Vec<(usize, usize, Device, &PhysicalAllocation)> = table
            .unretired_pages()
            .filter_map(|p| Some((p.offset(), p.end(), p.device()?, p.allocation()?)))
            .collect();
        let mut pieces = Vec::with_capacity(pages.len());
        for &(start, end, device, memory) in &pages {
            if !memory
                .options()
                .handle_kinds()
                .contains(HandleKinds::POSIX_FD)
            {
                return Err(Error::PageRange {
                    start,
                    end,
                    problem: "are a page that is not exportable as a POSIX file descriptor \
                              (a shared page made without a POSIX-fd handle kind, or imported \
                              from another process, which is not exported again)",
                });
            }
            pieces.push(BufferPiece::new(
                start,
                memory.size(),
                device.ordinal(),
                memory.granularity(),
            )?);
        }
        let info = BufferInfo::new(self.0.budget, pieces)?;
        let fds = pages
            .iter()
            .map(|&(_, _, _, memory)| export_fd(memory))
            .collect::<Result<Vec<_>, Error>>()?;
        ExportedBuffer::from_parts(fds, info)
    }
}

#[cfg(test)]
mod tests {
    use super::{ExportableBuffer, PageOptions};
    use crate::error::Error;
    use crate::vmm::HandleKinds;
    use crate::vmm::ReadWrite;

    #[test]
    fn an_exportable_buffer_needs_posix_fd_pages_before_any_driver_call() {
        // No device is named: the options are refused before the access set is looked at.
        for options in [
            PageOptions::new(),
            PageOptions::new().with_rdma(true),
            PageOptions::new().with_handle_kinds(HandleKinds::FABRIC),
        ] {
            assert!(matches!(
                ExportableBuffer::with_options(2 << 20, &[], ReadWrite, options),
                Err(Error::InvalidArgument { .. })
            ));
        }
    }
}
