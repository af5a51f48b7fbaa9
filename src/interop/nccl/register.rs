//! Memory registered with a communicator: [`Registration`] (`ncclCommRegister`, local) and
//! [`Window`] (`ncclCommWindowRegister`, collective), each borrowing its memory for as long as it
//! is registered.

use core::ffi::c_void;
use core::fmt;
use core::ops::{Range, RangeBounds};
use core::ptr;
use std::rc::Rc;

use bytemuck::Pod;

use super::api::{self, RawWindow, WIN_COLL_SYMMETRIC};
use super::comm::Comm;
use super::group::no_foreign_group;
use super::handle::{Core, in_group, not_capturing};
use crate::device::Device;
use crate::error::Error;
use crate::owned::{GrantedMapping, VirtualBuffer};
use crate::view::{DeviceSlice, DeviceSliceMut, range_bounds};
use crate::vmm::{AccessMode, HandleKinds, ReadWrite};

/// `NCCL_WIN_REQUIRED_ALIGNMENT`: a window's first byte is a multiple of it.
pub(crate) const WINDOW_ALIGNMENT: usize = 4096;

/// The most physical allocations one window may span (NCCL 2.27's limit for a window's segments).
pub(crate) const WINDOW_MAX_PIECES: usize = 8192;

/// How many local registrations a communicator made and deregistered
/// ([`Comm::registration_stats`]): equal once every [`Registration`] is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegistrationStats {
    /// Successful `ncclCommRegister` calls.
    pub registered: u64,
    /// Successful `ncclCommDeregister` calls.
    pub deregistered: u64,
}

/// Bytes of a [`VirtualBuffer`] registered with a communicator (`ncclCommRegister`), so that its
/// collectives on them can skip NCCL's staging copies.
///
/// It borrows the buffer exclusively and lends it on ([`buffer`](Registration::buffer) for every
/// `&self` operation, growth included, and [`slice_bytes_mut`](Registration::slice_bytes_mut) for
/// writable views), so that nothing unmaps, shrinks or regrants the registered pages while it
/// lives; and it borrows the communicator. Its `Drop` deregisters (`ncclCommDeregister`): a view
/// lent to a scope borrows the registration, so that happens only after the scope has waited for
/// the work that used it. [`deregister`](Registration::deregister) returns the error.
///
/// Neither `Send` nor `Sync`, as its communicator.
///
/// # Lifetimes
/// `'mem` is the borrow of the buffer, `'comm` the borrow of the communicator.
///
/// # Examples
/// The buffer cannot be unmapped while registered:
/// ```compile_fail,E0499
/// # use cuda_vmm::{Device, ReadWrite, VirtualBuffer, interop::nccl::Comm};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let stream = cudarc::driver::CudaContext::new(0)?.new_stream()?;
/// # let comm = Comm::from_devices(&[stream])?.remove(0);
/// # let mut buffer = VirtualBuffer::new(1 << 30, &[Device::get(0)?], ReadWrite)?;
/// let registration = comm.register(&mut buffer, ..)?;
/// buffer.unmap(..)?; // NCCL still holds the pages
/// drop(registration);
/// # Ok(())
/// # }
/// ```
pub struct Registration<'mem, 'comm, M: AccessMode = ReadWrite> {
    buffer: &'mem mut VirtualBuffer<M>,
    comm: &'comm Comm,
    /// The handle `ncclCommRegister` gave; null once deregistered.
    handle: *mut c_void,
    bytes: Range<usize>,
}

impl<M: AccessMode> fmt::Debug for Registration<'_, '_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("bytes", &self.bytes)
            .field("comm", self.comm)
            .finish_non_exhaustive()
    }
}

impl Comm {
    /// How many local registrations of this communicator were made and deregistered so far.
    #[must_use]
    pub fn registration_stats(&self) -> RegistrationStats {
        RegistrationStats {
            registered: self.core.registered.get(),
            deregistered: self.core.deregistered.get(),
        }
    }
}

impl Comm {
    /// `ncclCommRegister` — register the bytes `bytes` of `buffer` (counted from its base, all
    /// mapped) with this communicator, for as long as the [`Registration`] lives.
    ///
    /// # Errors
    /// Before NCCL is called: [`Error::NcclRefused`] inside a [`group`](super::group);
    /// [`Error::StreamCapturing`] while the communicator's stream, a blocking stream of its context
    /// (any thread's per-thread default stream among them), or a
    /// [`Graph::capture`](crate::stream::Graph::capture) of this thread captures (a capture of
    /// another non-blocking stream is not seen: the driver has no query for it);
    /// [`Error::OutOfBounds`], [`Error::PageRange`] where the range is outside the budget or not
    /// all mapped ([`VirtualBuffer::slice_bytes`]); [`Error::ZeroSize`] for an empty range;
    /// [`Error::NoPeerAccess`] where the communicator's device is not in the buffer's access set.
    /// Then [`Error::NcclUnavailable`] or [`Error::Nccl`].
    #[doc(alias = "ncclCommRegister")]
    pub fn register<'mem, 'comm, M: AccessMode>(
        &'comm self,
        buffer: &'mem mut VirtualBuffer<M>,
        bytes: impl RangeBounds<usize>,
    ) -> Result<Registration<'mem, 'comm, M>, Error> {
        if in_group() {
            return Err(Error::NcclRefused {
                call: "ncclCommRegister",
                why: "it was asked inside an NCCL group",
            });
        }
        let (start, end) = range_bounds(bytes, buffer.budget(), "registered bytes")?;
        if start == end {
            return Err(Error::ZeroSize {
                what: "registered bytes",
            });
        }
        // Every byte mapped and granted, and the communicator's device in the access set: checked
        // as for a view, without the buffer's lock (the borrow is exclusive).
        let ptr = buffer.registrable(start, end, self.device)?;
        let api = api::api("ncclCommRegister")?;
        let register = api::function(api.comm_register, "ncclCommRegister")?;
        // Checked now, so that a registration is never made that could not be undone.
        api::function(api.comm_deregister, "ncclCommDeregister")?;
        self.core.live("ncclCommRegister")?;
        not_capturing(self.stream.cu_stream().cast())?;
        let mut handle: *mut c_void = ptr::null_mut();
        // SAFETY: the bytes `[ptr, ptr + end - start)` are mapped and granted to the communicator's
        // device (checked), and stay so while the registration lives: it borrows the buffer
        // exclusively and lends on no operation that unmaps or regrants; `handle` is writable for
        // the call, and NCCL writes it before returning (`ncclCommRegister` launches nothing in its
        // own thread, also on a non-blocking communicator).
        let code = unsafe {
            register(
                self.core.raw,
                ptr as *mut c_void,
                end - start,
                &raw mut handle,
            )
        };
        self.core.finish(code, "ncclCommRegister")?;
        self.core
            .registered
            .set(self.core.registered.get().saturating_add(1));
        Ok(Registration {
            buffer,
            comm: self,
            handle,
            bytes: start..end,
        })
    }
}

impl<M: AccessMode> Registration<'_, '_, M> {
    /// The registered bytes, from the buffer's base.
    #[must_use]
    pub fn bytes(&self) -> Range<usize> {
        self.bytes.clone()
    }

    /// The buffer, for every operation that takes `&self`: [`grow`](VirtualBuffer::grow) and
    /// [`map_page`](VirtualBuffer::map_page) (new pages beside the registered ones), read-only views.
    #[must_use]
    pub fn buffer(&self) -> &VirtualBuffer<M> {
        self.buffer
    }

    /// `ncclCommDeregister` — deregister now, and return NCCL's error.
    ///
    /// # Errors
    /// [`Error::Nccl`] for NCCL's refusal (the registration is gone from this crate's view either
    /// way), [`Error::NcclUnavailable`].
    #[doc(alias = "ncclCommDeregister")]
    pub fn deregister(mut self) -> Result<(), Error> {
        self.release()
    }

    fn release(&mut self) -> Result<(), Error> {
        let handle = core::mem::replace(&mut self.handle, ptr::null_mut());
        if handle.is_null() {
            return Ok(());
        }
        let shared = &self.comm.core;
        if shared.aborted.get() {
            // `ncclCommAbort` freed the registration with the communicator.
            return Ok(());
        }
        let api = api::api("ncclCommDeregister")?;
        let deregister = api::function(api.comm_deregister, "ncclCommDeregister")?;
        // Not redundant, though NCCL's deregistration sets the communicator's device itself: it
        // asks the runtime for the thread's device first and sets that one again at its end, and
        // a thread with no current context reads device 0, whose primary context would then be
        // made (and its memory taken) on a communicator of another device. Bound first, the
        // device it reads and sets again is the communicator's.
        shared.bind()?;
        // SAFETY: the handle `ncclCommRegister` gave for this communicator, deregistered once. No work
        // uses the bytes: views of them borrow `self`, and the scopes they were lent to have waited.
        let code = unsafe { deregister(shared.raw, handle) };
        shared.finish(code, "ncclCommDeregister")?;
        shared
            .deregistered
            .set(shared.deregistered.get().saturating_add(1));
        Ok(())
    }
}

impl Registration<'_, '_, ReadWrite> {
    /// A writable view of the bytes `bytes` of the buffer, as
    /// [`VirtualBuffer::slice_bytes_mut`]; it borrows the registration exclusively.
    ///
    /// # Errors
    /// As [`VirtualBuffer::slice_bytes_mut`].
    pub fn slice_bytes_mut<T: Pod>(
        &mut self,
        bytes: impl RangeBounds<usize>,
    ) -> Result<DeviceSliceMut<'_, T>, Error> {
        self.buffer.slice_bytes_mut(bytes)
    }
}

impl<M: AccessMode> Drop for Registration<'_, '_, M> {
    fn drop(&mut self) {
        // A refused deregistration leaves NCCL's entry until the communicator is destroyed, which
        // frees it; nothing can be done about it here.
        let _ = self.release();
    }
}

mod sealed {
    pub trait Memory {}
}

/// What a [`Window`] is registered over: memory whose pages this crate can prove exportable as
/// POSIX file descriptors, which NCCL exports to the other ranks. Sealed.
///
/// Implemented for [`GrantedMapping<ReadWrite>`] (its memory's
/// [`options`](crate::PhysicalAllocation::options) say which handle kinds it has) and for
/// [`VirtualBuffer<ReadWrite>`] (its [`page_options`](VirtualBuffer::page_options): every page it
/// creates has them; its pieces are the pages the window's bytes span, all mapped).
pub trait WindowMemory: sealed::Memory {
    /// The memory's size in bytes, which window ranges are counted in.
    #[doc(hidden)]
    fn window_len(&self) -> usize;

    /// The facts a window over `bytes` (inside [`window_len`](WindowMemory::window_len)) is
    /// checked against.
    #[doc(hidden)]
    fn window_pieces(&self, bytes: Range<usize>) -> Result<WindowPieces, Error>;

    /// A writable view of `bytes` (whole `T`s, checked by the caller).
    #[doc(hidden)]
    fn window_view_mut<T: Pod>(
        &mut self,
        bytes: Range<usize>,
    ) -> Result<DeviceSliceMut<'_, T>, Error>;

    /// A read-only view of `bytes` (whole `T`s, checked by the caller).
    #[doc(hidden)]
    fn window_view<T: Pod>(&self, bytes: Range<usize>) -> Result<DeviceSlice<'_, T>, Error>;
}

/// What [`WindowMemory::window_pieces`] tells: the memory's first address and size, how many
/// physical allocations the window's bytes span, whether every one of them is exportable as a
/// POSIX file descriptor, and which devices it is granted to.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowPieces {
    base: u64,
    size: usize,
    pieces: usize,
    exportable: bool,
    devices: Vec<Device>,
}

/// `bytes` as a range of `T`s (whole elements: checked by [`Window::elements`]).
fn elements<T>(bytes: &Range<usize>) -> Range<usize> {
    let size = size_of::<T>().max(1);
    bytes.start / size..bytes.end / size
}

impl sealed::Memory for GrantedMapping<ReadWrite> {}

impl WindowMemory for GrantedMapping<ReadWrite> {
    fn window_len(&self) -> usize {
        self.mapping().size()
    }

    fn window_pieces(&self, _bytes: Range<usize>) -> Result<WindowPieces, Error> {
        let view = self.slice::<u8>()?;
        Ok(WindowPieces {
            base: view.as_raw_ptr(),
            size: view.len(),
            pieces: 1,
            exportable: self
                .mapping()
                .memory()
                .options()
                .handle_kinds()
                .contains(HandleKinds::POSIX_FD),
            devices: self.devices(),
        })
    }

    fn window_view_mut<T: Pod>(
        &mut self,
        bytes: Range<usize>,
    ) -> Result<DeviceSliceMut<'_, T>, Error> {
        self.slice_mut()?.into_slice_mut(elements::<T>(&bytes))
    }

    fn window_view<T: Pod>(&self, bytes: Range<usize>) -> Result<DeviceSlice<'_, T>, Error> {
        self.slice()?.slice(elements::<T>(&bytes))
    }
}

impl sealed::Memory for VirtualBuffer<ReadWrite> {}

impl WindowMemory for VirtualBuffer<ReadWrite> {
    fn window_len(&self) -> usize {
        self.budget()
    }

    fn window_pieces(&self, bytes: Range<usize>) -> Result<WindowPieces, Error> {
        // Every byte mapped ([`Error::PageRange`] names a hole), and granted.
        self.slice_bytes::<u8>(bytes.clone())?;
        let pieces = self
            .pages()
            .filter(|p| !p.retired && p.offset < bytes.end && bytes.start < p.offset + p.size)
            .count();
        Ok(WindowPieces {
            base: self.base(),
            size: self.budget(),
            pieces,
            exportable: self
                .page_options()
                .handle_kinds()
                .contains(HandleKinds::POSIX_FD),
            devices: self.devices(),
        })
    }

    fn window_view_mut<T: Pod>(
        &mut self,
        bytes: Range<usize>,
    ) -> Result<DeviceSliceMut<'_, T>, Error> {
        self.slice_bytes_mut(bytes)
    }

    fn window_view<T: Pod>(&self, bytes: Range<usize>) -> Result<DeviceSlice<'_, T>, Error> {
        self.slice_bytes(bytes)
    }
}

/// Bytes registered as a window of a communicator (`ncclCommWindowRegister`, collective): memory
/// that NCCL's symmetric kernels reach on every rank.
///
/// It borrows its memory exclusively and gives views of the window's bytes
/// ([`slice`](Window::slice), [`slice_mut`](Window::slice_mut)); it holds the communicator's NCCL
/// handle (not a borrow: registering took `&mut Comm`), which outlives it. Dropping it deregisters
/// (`ncclCommWindowDeregister`), which is collective too: drop the windows of a clique in the same
/// order on every rank. Neither `Send` nor `Sync`.
///
/// # Lifetimes
/// `'mem` is the borrow of the memory.
pub struct Window<'mem, W: WindowMemory = GrantedMapping<ReadWrite>> {
    memory: &'mem mut W,
    core: Rc<Core>,
    /// The window; null once deregistered.
    raw: RawWindow,
    /// The window's bytes, from the memory's start.
    bytes: Range<usize>,
    /// The window's addresses, as recorded in the communicator.
    addresses: (u64, u64),
}

impl<W: WindowMemory> fmt::Debug for Window<'_, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Window")
            .field("bytes", &self.bytes)
            .field("start", &format_args!("{:#x}", self.addresses.0))
            .finish_non_exhaustive()
    }
}

/// The checks of a window over `bytes` of memory described by `pieces`, for a communicator on
/// a device that is granted the memory or not (`granted`), whose windows cover `windows`; the
/// window's addresses.
pub(crate) fn check_window(
    pieces: &WindowPieces,
    bytes: Range<usize>,
    granted: bool,
    windows: &[(u64, u64)],
) -> Result<(u64, u64), Error> {
    const CALL: &str = "ncclCommWindowRegister";
    if bytes.is_empty() {
        return Err(Error::ZeroSize {
            what: "window size",
        });
    }
    let overflow = Error::Overflow {
        what: "window address",
    };
    let start = u64::try_from(bytes.start)
        .ok()
        .and_then(|s| pieces.base.checked_add(s))
        .ok_or(overflow.clone())?;
    let end = u64::try_from(bytes.len())
        .ok()
        .and_then(|len| start.checked_add(len))
        .ok_or(overflow)?;
    if start % WINDOW_ALIGNMENT as u64 != 0 {
        return Err(Error::NotAligned {
            what: "window address",
            value: usize::try_from(start).unwrap_or(usize::MAX),
            granularity: WINDOW_ALIGNMENT,
        });
    }
    if pieces.pieces > WINDOW_MAX_PIECES {
        return Err(Error::NcclRefused {
            call: CALL,
            why: "the memory spans more than 8192 physical allocations, NCCL's limit for a window",
        });
    }
    if !pieces.exportable {
        return Err(Error::NcclRefused {
            call: CALL,
            why: "the memory is not exportable as a POSIX file descriptor (make it with \
                  AllocationOptions::with_handle_kinds(HandleKinds::POSIX_FD)), which NCCL \
                  exports to the other ranks",
        });
    }
    if !granted {
        return Err(Error::NcclRefused {
            call: CALL,
            why: "the memory is not granted to the communicator's device",
        });
    }
    if windows.iter().any(|&(s, e)| s < end && start < e) {
        return Err(Error::NcclRefused {
            call: CALL,
            why: "a window of this communicator covers some of these bytes already",
        });
    }
    Ok((start, end))
}

impl Comm {
    /// `ncclCommWindowRegister` with `NCCL_WIN_COLL_SYMMETRIC` — register the bytes `bytes` of
    /// `memory` (from its start) as a window of this communicator. Collective: every rank calls it,
    /// with the same size. Takes `&mut self`, so that no scope, group or registration of this
    /// communicator is alive meanwhile.
    ///
    /// # Errors
    /// Before NCCL is called: [`Error::NcclRefused`] inside a [`group`](super::group), also one
    /// begun outside this crate (NCCL would fill the window in only at the group's end), for
    /// memory not exportable as a POSIX file
    /// descriptor, spanning more than 8192 allocations, not granted to the communicator's device,
    /// or overlapping a window of this communicator; [`Error::StreamCapturing`] as for
    /// [`register`](Comm::register); [`Error::NotAligned`] where the first byte is
    /// not a multiple of 4096; [`Error::OutOfBounds`], [`Error::ZeroSize`] for the range. Then
    /// [`Error::NcclUnavailable`] where the loaded NCCL has no windows (before 2.27),
    /// [`Error::Nccl`] for its refusal, and [`Error::NcclRefused`] where it returned a null window.
    #[doc(alias = "ncclCommWindowRegister")]
    pub fn register_window<'mem, W: WindowMemory>(
        &mut self,
        memory: &'mem mut W,
        bytes: impl RangeBounds<usize>,
    ) -> Result<Window<'mem, W>, Error> {
        const CALL: &str = "ncclCommWindowRegister";
        if in_group() {
            return Err(Error::NcclRefused {
                call: CALL,
                why: "it was asked inside an NCCL group, which fills the window in only at its end",
            });
        }
        let (start, end) = range_bounds(bytes, memory.window_len(), "window bytes")?;
        if start == end {
            return Err(Error::ZeroSize {
                what: "window size",
            });
        }
        let pieces = memory.window_pieces(start..end)?;
        let addresses = check_window(
            &pieces,
            start..end,
            pieces.devices.contains(&self.device),
            &self.core.windows.borrow(),
        )?;
        let api = api::api(CALL)?;
        let register = api::function(api.window_register, CALL)?;
        api::function(api.window_deregister, "ncclCommWindowDeregister")?;
        self.core.live(CALL)?;
        not_capturing(self.stream.cu_stream().cast())?;
        // Collective: NCCL defers it inside a group, also one begun outside this crate.
        no_foreign_group(CALL)?;
        // On the heap: a non-blocking communicator writes the window from NCCL's thread, once the
        // registration is done (at the end of the group NCCL opens inside the call).
        let slot: *mut RawWindow = Box::into_raw(Box::new(ptr::null_mut()));
        // SAFETY: `[start, end)` is mapped, granted to the communicator's device and exportable
        // (checked), and stays so while the window lives: it borrows the memory exclusively. `slot`
        // is writable until it is freed below, which happens only once NCCL has finished (a
        // blocking call has returned, a non-blocking one has been settled).
        let code = unsafe {
            register(
                self.core.raw,
                addresses.0 as *mut c_void,
                end - start,
                slot,
                WIN_COLL_SYMMETRIC,
            )
        };
        // On an error `slot` is not freed: where NCCL refused at once it wrote nothing, and where
        // polling failed the abort stopped NCCL's thread; but a failed abort may leave it running,
        // so the 8 bytes are left to it on this error path.
        self.core.finish(code, CALL)?;
        // SAFETY: `slot` came from `Box::into_raw` above and is freed once, here; NCCL has
        // finished writing it (the call returned success, or was settled).
        let raw = *unsafe { Box::from_raw(slot) };
        if raw.is_null() {
            return Err(Error::NcclRefused {
                call: CALL,
                why: "NCCL returned success with a null window (is symmetric memory supported \
                      here?)",
            });
        }
        self.core.windows.borrow_mut().push(addresses);
        Ok(Window {
            memory,
            core: Rc::clone(&self.core),
            raw,
            bytes: start..end,
            addresses,
        })
    }
}

impl<W: WindowMemory> Window<'_, W> {
    /// The window's bytes, from the start of its memory.
    #[must_use]
    pub fn bytes(&self) -> Range<usize> {
        self.bytes.clone()
    }

    /// The raw `ncclWindow_t`, for NCCL calls this crate does not wrap; valid while `self` lives.
    #[must_use]
    pub fn as_raw(&self) -> *mut c_void {
        self.raw
    }

    /// `Ok` where the window is a whole number of `T`s from a multiple of `T`'s size.
    fn elements<T>(&self) -> Result<(), Error> {
        let size = size_of::<T>();
        if size == 0
            || !self.bytes.start.is_multiple_of(size)
            || !self.bytes.len().is_multiple_of(size)
        {
            return Err(Error::NotWholeElements {
                bytes: self.bytes.len(),
                element_size: size,
            });
        }
        Ok(())
    }

    /// A read-only view of the window's bytes as `T`s.
    ///
    /// # Errors
    /// [`Error::NotWholeElements`] where the window is not a whole number of `T`s from a multiple of
    /// `T`'s size.
    pub fn slice<T: Pod>(&self) -> Result<DeviceSlice<'_, T>, Error> {
        self.elements::<T>()?;
        self.memory.window_view::<T>(self.bytes.clone())
    }

    /// A writable view of the window's bytes as `T`s; it borrows the window exclusively.
    ///
    /// # Errors
    /// As [`slice`](Window::slice).
    pub fn slice_mut<T: Pod>(&mut self) -> Result<DeviceSliceMut<'_, T>, Error> {
        self.elements::<T>()?;
        self.memory.window_view_mut::<T>(self.bytes.clone())
    }

    /// `ncclCommWindowDeregister` — deregister now (collectively), and return NCCL's error.
    ///
    /// # Errors
    /// [`Error::Nccl`] for NCCL's refusal, [`Error::NcclUnavailable`].
    #[doc(alias = "ncclCommWindowDeregister")]
    pub fn deregister(mut self) -> Result<(), Error> {
        self.release()
    }

    fn release(&mut self) -> Result<(), Error> {
        let raw = core::mem::replace(&mut self.raw, ptr::null_mut());
        if raw.is_null() {
            return Ok(());
        }
        let addresses = self.addresses;
        self.core.windows.borrow_mut().retain(|&w| w != addresses);
        if self.core.aborted.get() {
            // `ncclCommAbort` freed the window with the communicator.
            return Ok(());
        }
        let api = api::api("ncclCommWindowDeregister")?;
        let deregister = api::function(api.window_deregister, "ncclCommWindowDeregister")?;
        self.core.bind()?;
        // SAFETY: the window `ncclCommWindowRegister` gave for this communicator (kept alive by
        // `self.core`), deregistered once; no work uses it: views of it borrow `self`, and the
        // scopes they were lent to have waited.
        let code = unsafe { deregister(self.core.raw, raw) };
        self.core.finish(code, "ncclCommWindowDeregister")
    }
}

impl<W: WindowMemory> Drop for Window<'_, W> {
    fn drop(&mut self) {
        // A refused deregistration leaves NCCL's window until the communicator is destroyed, which
        // frees it; nothing can be done about it here.
        let _ = self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(base: u64) -> WindowPieces {
        WindowPieces {
            base,
            size: 2 << 20,
            pieces: 1,
            exportable: true,
            devices: Vec::new(),
        }
    }

    #[test]
    fn windows_are_checked_before_nccl() {
        let base = 1 << 32;
        assert_eq!(
            check_window(&pieces(base), 0..4096, true, &[]),
            Ok((base, base + 4096))
        );
        assert!(matches!(
            check_window(&pieces(base), 100..4196, true, &[]),
            Err(Error::NotAligned {
                granularity: 4096,
                ..
            })
        ));
        assert!(matches!(
            check_window(&pieces(base), 0..0, true, &[]),
            Err(Error::ZeroSize { .. })
        ));
        let second = check_window(&pieces(base), 4096..8192, true, &[(base, base + 8192)]);
        assert!(
            matches!(second, Err(Error::NcclRefused { why, .. }) if why.contains("already")),
            "{second:?}"
        );
        let beside = check_window(&pieces(base), 8192..12288, true, &[(base, base + 8192)]);
        assert!(beside.is_ok(), "{beside:?}");
        let mut many = pieces(base);
        many.pieces = WINDOW_MAX_PIECES + 1;
        assert!(check_window(&many, 0..4096, true, &[]).is_err());
        many.pieces = WINDOW_MAX_PIECES;
        assert!(check_window(&many, 0..4096, true, &[]).is_ok());
        let mut private = pieces(base);
        private.exportable = false;
        assert!(matches!(
            check_window(&private, 0..4096, true, &[]),
            Err(Error::NcclRefused { why, .. }) if why.contains("POSIX")
        ));
    }
}
