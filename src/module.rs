//! Loading device code (`cuModuleLoadData`) and launching kernels (`cuLaunchKernel`).

use core::ffi::{CStr, c_void};
use core::fmt;
use core::marker::PhantomData;
use core::ptr;

use crate::device::Context;
use crate::error::{Error, Result, check};
use crate::sys;

/// A module of device code loaded into a context, unloaded on drop.
///
/// # Lifetimes
/// `'ctx` is the borrow of the context the module lives in.
pub struct Module<'ctx> {
    raw: sys::CUmodule,
    context: &'ctx Context,
}

impl fmt::Debug for Module<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Module")
            .field("raw", &self.raw)
            .field("device", &self.context.device())
            .finish()
    }
}

impl<'ctx> Module<'ctx> {
    /// `cuModuleLoadData` — load PTX text (or a cubin/fatbin image with a terminating NUL) into
    /// `context`; PTX is compiled for the device by the driver.
    ///
    /// # Errors
    /// The driver's error, e.g. `CUDA_ERROR_INVALID_PTX` for text the driver cannot compile.
    #[doc(alias = "cuModuleLoadData")]
    pub fn load_ptx(context: &'ctx Context, ptx: &CStr) -> Result<Module<'ctx>> {
        context.bind_to_thread()?;
        let mut raw: sys::CUmodule = ptr::null_mut();
        // SAFETY: `raw` is writable; `ptx` is a NUL-terminated image alive for the call; a context is current.
        check(unsafe { sys::cuModuleLoadData(&raw mut raw, ptx.as_ptr().cast::<c_void>()) })?;
        Ok(Module { raw, context })
    }

    /// The device the module was loaded for.
    #[must_use]
    pub fn device(&self) -> crate::Device {
        self.context.device()
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
        Ok(Function {
            raw,
            context: self.context,
            _module: PhantomData,
        })
    }
}

impl Drop for Module<'_> {
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
pub struct Function<'m> {
    raw: sys::CUfunction,
    context: &'m Context,
    /// Borrows the module, which must stay loaded: covariant; not `Send`/`Sync` (a raw handle).
    _module: PhantomData<&'m Module<'m>>,
}

impl fmt::Debug for Function<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Function")
            .field("raw", &self.raw)
            .field("device", &self.context.device())
            .finish()
    }
}

impl Function<'_> {
    /// The device the kernel runs on: every address given to [`launch`](Function::launch) must be
    /// reachable from it.
    #[must_use]
    pub fn device(&self) -> crate::Device {
        self.context.device()
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
        self.context.bind_to_thread()?;
        // SAFETY: `self.raw` is a kernel of a loaded module (borrowed); the caller guarantees the
        // parameters and every address the kernel touches; `params` is alive for the call, which copies
        // the parameter values before returning.
        check(unsafe {
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
                params.as_mut_ptr(),
                ptr::null_mut(),
            )
        })?;
        // SAFETY: the null stream is the current context's legacy default stream, always valid.
        Ok(check(unsafe { sys::cuStreamSynchronize(ptr::null_mut()) })?)
    }
}
