//! Loading device code (`cuModuleLoadData`) and launching kernels (`cuLaunchKernel`).

use core::ffi::{CStr, c_void};
use core::fmt;
use core::ptr;
use core::sync::atomic::{AtomicU64, Ordering};

use crate::device::{Context, Device};
use crate::error::{Error, Result, check};
use crate::sys;
use crate::wait::{self, Returns};

/// The fewest bytes [`Module::load_ptx`] hands the driver: shorter text is NUL-padded to this length,
/// so that whatever the driver reads of the first bytes to recognise a binary header (a magic, and at
/// most a version and a size after it) stays inside the input.
const MIN_IMAGE_BYTES: usize = 16;

/// Whether every byte of `text` is PTX text: tab, LF, CR or printable ASCII (`0x20..=0x7E`).
///
/// # Errors
/// [`Error::NotPtxText`] for the first byte that is not.
fn check_ptx_text(text: &[u8]) -> Result<(), Error> {
    match text
        .iter()
        .enumerate()
        .find(|&(_, &byte)| !matches!(byte, b'\t' | b'\n' | b'\r' | 0x20..=0x7e))
    {
        None => Ok(()),
        Some((offset, &byte)) => Err(Error::NotPtxText { offset, byte }),
    }
}

/// A module of device code loaded into a context, unloaded on drop.
///
/// # Ownership
/// The module owns a clone of the [`Context`] it was loaded into (see
/// [Clones share one retain](Context#clones-share-one-retain)), so the context stays retained while the
/// module is loaded and the module has no lifetime: an engine can keep it in the struct that owns its
/// context, its streams and its memory. Its kernels ([`Function`]) borrow the module, so it is not
/// unloaded while one of them can still be launched.
pub struct Module {
    raw: sys::CUmodule,
    context: Context,
    /// Unique among the modules of the process (a `CUmodule` handle may be reused once unloaded): a
    /// parked graph's kernels are rebound only to the modules they came from
    /// ([`Rebind::module`](crate::stream::Rebind::module)).
    id: u64,
}

/// The id of the next module loaded.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

// SAFETY: a `CUmodule` is a handle to a driver object of the module's context, not to thread-local
// state. The driver API is thread-safe and takes a module on any thread where its context is current:
// every call on the module makes it current first (`load_ptx` and `load_image` before
// `cuModuleLoadData`, `function` before `cuModuleGetFunction`, `drop` before `cuModuleUnload`, which
// it skips where the bind fails), and `device` calls no driver function. The module has no interior
// state of its own, and the `Context` it holds is `Send` and `Sync`.
unsafe impl Send for Module {}
// SAFETY: as for `Send`: the only method that calls the driver through `&self`, `function`, binds the
// context first and makes one thread-safe call (`cuModuleGetFunction`), which may run on several
// threads at once.
unsafe impl Sync for Module {}

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Module")
            .field("raw", &self.raw)
            .field("id", &self.id)
            .field("device", &self.context.device())
            .finish()
    }
}

impl Module {
    /// `cuModuleLoadData` — load PTX text into `context`; the driver compiles it for the device.
    ///
    /// Only text is accepted: every byte before the terminating NUL must be a tab, LF, CR or printable
    /// ASCII (`0x20..=0x7E`), checked before the driver is called. `cuModuleLoadData` also takes
    /// cubin (ELF) and fatbin images, recognised by their first bytes (`7F 45 4C 46`, `50 ED 55 BA`,
    /// or a fatbin wrapper's `B1 43 62 46`), and reads those as far as their headers say, not to the
    /// NUL: a `&CStr` starting like a fatbin header made the driver read past its end (a `SIGSEGV`,
    /// measured on an H200). Each of those magics holds a byte that is not text, so the driver can
    /// only take checked text for PTX, which it reads to the NUL. Text with other bytes, such as
    /// UTF-8 in a comment or a `.file` path, is refused too: remove them first. Binary images can be
    /// loaded only through the `unsafe` [`load_image`](Module::load_image).
    ///
    /// Text shorter than 16 bytes (with its NUL) is copied into a NUL-padded 16-byte buffer first: a
    /// precaution, since how many bytes the driver reads to recognise an image is not documented.
    ///
    /// # Errors
    /// [`Error::NotPtxText`] for the first byte that is not text (nothing reaches the driver); the
    /// driver's error otherwise, e.g. [`DriverError::INVALID_PTX`](crate::DriverError::INVALID_PTX)
    /// for text it cannot compile.
    #[doc(alias = "cuModuleLoadData")]
    pub fn load_ptx(context: &Context, ptx: &CStr) -> Result<Module, Error> {
        check_ptx_text(ptx.to_bytes())?;
        let text = ptx.to_bytes_with_nul();
        let mut padded = [0u8; MIN_IMAGE_BYTES];
        let image = if text.len() < MIN_IMAGE_BYTES {
            padded
                .iter_mut()
                .zip(text)
                .for_each(|(to, &from)| *to = from);
            padded.as_ptr()
        } else {
            text.as_ptr()
        };
        context.bind_to_thread()?;
        let mut raw: sys::CUmodule = ptr::null_mut();
        // SAFETY: `raw` is writable. `image` is NUL-terminated text (checked above), alive for the call
        // and readable for at least `MIN_IMAGE_BYTES`: every binary image's magic holds a byte that is
        // not text, so the driver reads it as PTX, up to the NUL. A context is current (bound above).
        check(unsafe { sys::cuModuleLoadData(&raw mut raw, image.cast::<c_void>()) })?;
        Ok(Module {
            raw,
            context: context.clone(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// `cuModuleLoadData` — load a device code image of any kind the driver takes (PTX text, a cubin
    /// or a fatbin) into `context`, unchecked.
    ///
    /// For PTX prefer [`load_ptx`](Module::load_ptx), which checks the text and needs no `unsafe`.
    ///
    /// # Errors
    /// The driver's error, e.g. [`DriverError::INVALID_IMAGE`](crate::DriverError::INVALID_IMAGE) for
    /// an image it cannot read, or
    /// [`DriverError::NO_BINARY_FOR_GPU`](crate::DriverError::NO_BINARY_FOR_GPU) where none of a
    /// fatbin's images suits the device.
    ///
    /// # Safety
    /// `image` must point to one whole image, readable and unchanged until the call returns for every
    /// byte the driver reads of it:
    /// - PTX text: up to and including its terminating NUL, and at least 16 bytes in all (how far the
    ///   driver reads to recognise a binary header is not documented);
    /// - a cubin (ELF) or a fatbin: every byte its headers say it spans. The driver trusts the sizes in
    ///   them: a header that claims more than there is makes it read past the end (a `SIGSEGV`,
    ///   measured on an H200), so load only images made whole by NVIDIA's tools.
    #[doc(alias = "cuModuleLoadData")]
    pub unsafe fn load_image(context: &Context, image: *const c_void) -> Result<Module, Error> {
        context.bind_to_thread()?;
        let mut raw: sys::CUmodule = ptr::null_mut();
        // SAFETY: `raw` is writable; the caller guarantees `image` for every byte the driver reads; a
        // context is current (bound just above).
        check(unsafe { sys::cuModuleLoadData(&raw mut raw, image) })?;
        Ok(Module {
            raw,
            context: context.clone(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// The device the module was loaded for.
    #[must_use]
    pub fn device(&self) -> Device {
        self.context.device()
    }

    /// The module's id, unique among the modules of the process.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// `cuModuleGetFunction` — the kernel named `name`, looked up with the module's context current
    /// (bound first, as for every call on the module).
    ///
    /// # Errors
    /// `CUDA_ERROR_NOT_FOUND` where the module has no such kernel; the driver's error where the
    /// module's context cannot be made current.
    #[doc(alias = "cuModuleGetFunction")]
    pub fn function(&self, name: &CStr) -> Result<Function<'_>> {
        self.context.bind_to_thread()?;
        let mut raw: sys::CUfunction = ptr::null_mut();
        // SAFETY: `raw` is writable; `self.raw` is a module loaded in `self.context`, which is current
        // (bound just above); `name` is NUL-terminated and alive for the call.
        check(unsafe { sys::cuModuleGetFunction(&raw mut raw, self.raw, name.as_ptr()) })?;
        Ok(Function { raw, module: self })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // Errors are ignored: `drop` cannot return them, and a module the driver refuses to unload
        // cannot be unloaded later.
        if self.context.bind_to_thread().is_ok() {
            // SAFETY: `self.raw` was loaded in this (current) context and is unloaded once; every
            // `Function` borrows the module, so none is alive, and launches wait for completion.
            let _ = unsafe { sys::cuModuleUnload(self.raw) };
        }
    }
}

/// A kernel of a loaded [`Module`].
///
/// # Lifetimes
/// `'module` is the borrow of the module the kernel belongs to, which stays loaded while the kernel
/// lives.
pub struct Function<'module> {
    raw: sys::CUfunction,
    /// The module, which must stay loaded, and through it the context the kernel runs in.
    module: &'module Module,
}

// SAFETY: a `CUfunction` is a handle to a driver object of its module, which stays loaded while the
// borrow of it lives; like the module's, it is not tied to a thread. The driver takes it on any thread
// where its context is current, and both launches make that context current first: `launch` through
// `wait::synchronous`, which binds the module's context before `cuLaunchKernel`, and
// `ScopedStream::launch` through `admit_work`, which binds the stream's context, the same primary
// context (the launch refuses a kernel of another device before it). `device` and `raw` call no driver
// function. The `&Module` it holds is `Send` because `Module` is `Sync`.
unsafe impl Send for Function<'_> {}
// SAFETY: as for `Send`: a `&Function` only launches (each launch binds the context first and makes
// thread-safe driver calls, which may run on several threads at once) or reads the handle and device.
unsafe impl Sync for Function<'_> {}

impl fmt::Debug for Function<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Function")
            .field("raw", &self.raw)
            .field("device", &self.module.device())
            .finish()
    }
}

impl Function<'_> {
    /// The device the kernel runs on: every address given to [`launch`](Function::launch) must be
    /// reachable from it.
    #[must_use]
    pub fn device(&self) -> Device {
        self.module.device()
    }

    /// The id of the module the kernel belongs to ([`Module`]'s, unique in the process).
    pub(crate) fn module_id(&self) -> u64 {
        self.module.id()
    }

    /// The raw `CUfunction`, for launches on a stream (`ScopedStream::launch`); valid while the
    /// module is loaded, which a borrow of `self` guarantees.
    pub(crate) fn raw(&self) -> sys::CUfunction {
        self.raw
    }

    /// `cuLaunchKernel` — run the kernel on `grid` × `block` threads in its module's context, and wait
    /// until it has finished.
    ///
    /// `params` holds one pointer per kernel parameter, each pointing at that parameter's value (as
    /// `cuLaunchKernel` takes them).
    ///
    /// # Errors
    /// [`Error::ZeroSize`] for an empty grid or block; the driver's error otherwise, including a fault
    /// of the kernel itself.
    ///
    /// # Safety
    /// - `params` must match the kernel's parameter list in number, order and types.
    /// - Every address the kernel reads or writes must be device memory reachable from this context's
    ///   device, alive until the launch returns, and not written by anything else meanwhile: for VMM
    ///   memory, granted to this device; for another device's `cuMemAlloc` memory, under a
    ///   [`PeerAccess`](crate::PeerAccess) whose `from` is this context and whose `to` owns the
    ///   memory, alive until the launch returns. Views hand out their addresses with `as_raw_ptr` and
    ///   carry these borrows: take the addresses from views kept alive across the call (a peer view
    ///   from [`DeviceBuffer::peer_slice`](crate::DeviceBuffer::peer_slice) borrows its guard).
    #[doc(alias = "cuLaunchKernel")]
    pub unsafe fn launch(
        &self,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        params: &mut [*mut c_void],
    ) -> Result<(), Error> {
        if [grid.0, grid.1, grid.2, block.0, block.1, block.2].contains(&0) {
            return Err(Error::ZeroSize {
                what: "kernel grid or block",
            });
        }
        let params = params.as_mut_ptr();
        // The launch returns at once: the wait after it makes the kernel finished before anything it
        // uses can go away, also where the launch failed after being queued.
        wait::synchronous(self.module.context.as_raw(), Returns::Early, || {
            // SAFETY: `self.raw` is a kernel of a loaded module (borrowed), in the current context
            // (`synchronous` binds it); the caller guarantees the parameters and every address the
            // kernel touches; `params` is alive for the call, which copies the parameter values
            // before returning.
            unsafe {
                sys::cuLaunchKernel(
                    self.raw,
                    grid.0,
                    grid.1,
                    grid.2,
                    block.0,
                    block.1,
                    block.2,
                    0,
                    ptr::null_mut(),
                    params,
                    ptr::null_mut(),
                )
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::check_ptx_text;
    use crate::error::Error;

    #[test]
    fn binary_magics_are_refused_at_their_first_non_text_byte() {
        // fatbin (the input that crashed the driver), cubin (ELF), fatbin wrapper.
        let cases: [(&[u8], usize, u8); 3] = [
            (&[0x50, 0xed, 0x55, 0xba, 0x01, 0x00, 0x10, 0x00], 1, 0xed),
            (&[0x7f, 0x45, 0x4c, 0x46, 0x02, 0x01, 0x01], 0, 0x7f),
            (&[0xb1, 0x43, 0x62, 0x46, 0x01, 0x00], 0, 0xb1),
        ];
        for (image, offset, byte) in cases {
            assert_eq!(
                check_ptx_text(image),
                Err(Error::NotPtxText { offset, byte }),
                "{image:02x?}"
            );
        }
    }

    #[test]
    fn bytes_outside_ascii_text_are_refused() {
        let text = b".version 7.0\n// caf\xc3\xa9\n";
        assert_eq!(
            check_ptx_text(text),
            Err(Error::NotPtxText {
                offset: 19,
                byte: 0xc3
            })
        );
        for byte in (0x00..=0x08)
            .chain(0x0b..=0x0c)
            .chain(0x0e..=0x1f)
            .chain(0x7f..=0xff)
        {
            assert_eq!(
                check_ptx_text(&[b' ', byte]),
                Err(Error::NotPtxText { offset: 1, byte }),
                "{byte:#04x}"
            );
        }
    }

    #[test]
    fn ptx_text_is_accepted() {
        assert_eq!(
            check_ptx_text(b".version 7.0\r\n.target sm_52\n\t.address_size 64\n"),
            Ok(())
        );
        assert_eq!(check_ptx_text(b""), Ok(()));
        let every_text_byte: Vec<u8> = [b'\t', b'\n', b'\r']
            .into_iter()
            .chain(0x20..=0x7e)
            .collect();
        assert_eq!(check_ptx_text(&every_text_byte), Ok(()));
        assert_eq!(
            check_ptx_text(include_bytes!("../examples/kernels/add_one.ptx")),
            Ok(())
        );
    }
}
