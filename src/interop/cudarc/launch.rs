//! [`ScopedStream::launch_cudarc`]: a cudarc kernel ([`CudaFunction`], compiled by NVRTC or loaded
//! from a module) queued on a stream of [`crate::scope`], with this crate's typed arguments.

use core::sync::atomic::Ordering;

use ::cudarc::driver::{CudaContext, CudaFunction, LaunchConfig};

use super::{SAME_DRIVER, driver_within_cudarc, same_driver};
use crate::device::Device;
use crate::error::{DriverError, Error};
use crate::stream::{KernelArgs, ScopedStream};

impl<'scope> ScopedStream<'scope> {
    /// `cuLaunchKernel` — queue the cudarc kernel `function` on this stream of
    /// [`crate::scope`], on `config`'s grid and block with its dynamic shared memory, with `args`:
    /// the same typed arguments ([`KernelArgs`]), checks and lends as
    /// [`launch`](ScopedStream::launch) — views lent for the rest of the scope (a scoped buffer's
    /// views checked again and counted by its retires, a [`Rewritable`](crate::stream::Rewritable)
    /// bound to its stream, a [`BlockTable`](crate::stream::BlockTable) admitted view by view),
    /// plain values as they are. Returns what `launch` returns. The kernel is borrowed for the rest
    /// of the scope, so its module stays loaded until the scope's wait.
    ///
    /// The launch is this crate's own `cuLaunchKernel` (cudarc's
    /// [`CudaFunction::cu_function`] gives the handle, and no cudarc call is made): cudarc's event
    /// tracking plays no part, and the scope's wait covers the kernel.
    ///
    /// # Errors
    /// Once per process, before any of cudarc's handles reaches this crate's driver calls, as a
    /// cudarc [`scope`](super::scope) checks it: [`Error::CudarcOlderThanDriver`] where the driver
    /// is newer than the CUDA version cudarc was built for, and [`Error::StreamRefused`] where
    /// cudarc loaded another driver library than the one this crate links. Then, as
    /// [`launch`](ScopedStream::launch): [`Error::ZeroSize`] for an empty grid or block,
    /// [`Error::NoPeerAccess`], a view's lend refused, [`Error::StreamCapturing`], all before any
    /// driver call. cudarc does not say which context a [`CudaFunction`] was loaded in, so the
    /// device check of `launch` is left to the driver, which refuses a kernel of another context
    /// with an error.
    ///
    /// # Safety
    /// As [`launch`](ScopedStream::launch): `args` match the kernel's parameters in number, order
    /// and types (a view is a `u64` device address), and the kernel touches only the views' values
    /// it is given, writing only the writable ones. And `function` was loaded in this stream's
    /// device's primary context (cudarc's [`CudaContext::new`](::cudarc::driver::CudaContext::new)
    /// retains it), with `config.shared_mem_bytes` what it expects.
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::{Context, Device, PinnedBuffer, ReadWrite, Stream, VirtualBuffer};
    /// use cudarc::driver::{CudaContext, LaunchConfig};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ptx = cudarc::nvrtc::Ptx::from_src("");
    /// let device = Device::get(0)?;
    /// let context = Context::new(device)?;
    /// let cudarc = CudaContext::new(0)?; // the same primary context
    /// // add_one(unsigned *dst, const unsigned *src, unsigned n), compiled by NVRTC
    /// let add_one = cudarc.load_module(ptx)?.load_function("add_one")?;
    /// let mut cache = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// let input = PinnedBuffer::from_slice(&context, &[1u32; 1024])?;
    /// let mut output = PinnedBuffer::<u32>::zeroed(&context, 1024)?;
    /// let stream = Stream::new(&context)?;
    /// cuda_vmm::scope(|s| {
    ///     let work = s.on(&stream);
    ///     let kv = cache.in_scope(s);
    ///     let at = kv.grow(device, 2 << 20)?;
    ///     let mut src = kv.write::<u32>(at..at + 4096)?;
    ///     let mut dst = kv.write::<u32>(at + 4096..at + 8192)?;
    ///     let src = work.copy_from_host(&mut src, &input)?;
    ///     // SAFETY: `add_one` takes two u32 pointers and a count, and touches 1024 values of each.
    ///     let (added, (), ()) = unsafe {
    ///         work.launch_cudarc(&add_one, LaunchConfig::for_num_elems(1024), (&mut dst, src, 1024u32))?
    ///     };
    ///     work.copy_to_host(&mut output, added)?;
    ///     Ok(())
    /// })?;
    /// assert!(output.iter().all(|&v| v == 2));
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuLaunchKernel")]
    pub unsafe fn launch_cudarc<A: KernelArgs<'scope>>(
        &self,
        function: &'scope CudaFunction,
        config: LaunchConfig,
        args: A,
    ) -> Result<A::Output, Error> {
        cudarc_is_this_driver(self.device())?;
        // SAFETY: the caller's contract (`# Safety`), which is `launch_raw`'s; the module stays
        // loaded while `function`, which holds it, is borrowed, for `'scope`. Its handle is one of
        // this crate's driver (checked above), the same opaque type on both sides.
        unsafe {
            self.launch_raw(
                function.cu_function().cast(),
                config.grid_dim,
                config.block_dim,
                config.shared_mem_bytes,
                args,
            )
        }
    }
}

/// `Ok` where cudarc's driver library is this crate's, checked once per process as a cudarc scope's
/// entry checks it: the driver no newer than cudarc's enum of codes, then cudarc's primary context
/// of `device` compared with this crate's.
fn cudarc_is_this_driver(device: Device) -> Result<(), Error> {
    if SAME_DRIVER.load(Ordering::Acquire) == 1 {
        return Ok(());
    }
    driver_within_cudarc()?;
    let theirs = CudaContext::new(device.ordinal()).map_err(|e| {
        DriverError::from_raw(e.0 as u32).map_or(
            Error::StreamRefused {
                why: "cudarc could not retain the device's primary context",
            },
            Error::Driver,
        )
    })?;
    same_driver(device, theirs.cu_ctx().addr())
}
