//! The typed arguments of a kernel queued on a [`ScopedStream`]: [`KernelArg`] and [`KernelArgs`].

use core::ffi::c_void;

use bytemuck::Pod;

use crate::device::Device;
use crate::error::Error;
use crate::sys;
use crate::view::{DeviceSlice, DeviceSliceMut};

use super::lend::{DeviceInFlight, ScopedWrite, lend, sealed};
#[cfg(doc)]
use super::scope::ScopedStream;
use super::scope::reachable;

/// One argument of a kernel launched on a [`ScopedStream`]: a view lent for the rest of the scope
/// (read-only: `DeviceSlice<'scope, T>`, `&'scope DeviceSlice<'_, T>`,
/// `&'scope DeviceSliceMut<'_, T>`, [`DeviceInFlight<'scope, T>`](DeviceInFlight); written:
/// `DeviceSliceMut<'scope, T>`, `&'scope mut DeviceSliceMut<'_, T>`), which the kernel receives as
/// its device address (a `u64`), or a plain value ([`Pod`]), which it receives as it is. Sealed.
pub trait KernelArg<'scope>: sealed::Arg {
    /// What the launch returns for this argument: the [`DeviceInFlight`] of a written view, `()`
    /// for the others.
    type Output;
    /// The value the kernel receives.
    #[doc(hidden)]
    type Param: Copy;
    /// `Err` unless `device` reaches the view's memory; `Ok` for a plain value.
    #[doc(hidden)]
    fn check(&self, device: Device) -> Result<(), Error>;
    /// The parameter, and what the launch returns.
    #[doc(hidden)]
    fn into_param(self) -> (Self::Param, Self::Output);
}

impl<T: Pod> sealed::Arg for T {}
impl<T: Pod> KernelArg<'_> for T {
    type Output = ();
    type Param = T;
    fn check(&self, _: Device) -> Result<(), Error> {
        Ok(())
    }
    fn into_param(self) -> (T, ()) {
        (self, ())
    }
}

/// `KernelArg` for the read-only view forms: the address, and no output.
macro_rules! read_arg {
    ($($ty:ty),*) => {$(
        impl<'scope, T: Pod> sealed::Arg for $ty {}
        impl<'scope, T: Pod> KernelArg<'scope> for $ty {
            type Output = ();
            type Param = sys::CUdeviceptr;
            fn check(&self, device: Device) -> Result<(), Error> {
                reachable(&lend::<'scope, T>(*self), device)
            }
            fn into_param(self) -> (sys::CUdeviceptr, ()) {
                (lend::<'scope, T>(self).as_raw_ptr(), ())
            }
        }
    )*};
}
read_arg!(
    DeviceSlice<'scope, T>,
    &'scope DeviceSlice<'_, T>,
    &'scope DeviceSliceMut<'_, T>,
    DeviceInFlight<'scope, T>
);

impl<T: Pod> sealed::Arg for DeviceSliceMut<'_, T> {}
impl<'scope, T: Pod> KernelArg<'scope> for DeviceSliceMut<'scope, T> {
    type Output = DeviceInFlight<'scope, T>;
    type Param = sys::CUdeviceptr;
    fn check(&self, device: Device) -> Result<(), Error> {
        reachable(&self.as_slice(), device)
    }
    fn into_param(self) -> (sys::CUdeviceptr, DeviceInFlight<'scope, T>) {
        let written = self.lend_mut();
        (written.as_raw_ptr(), DeviceInFlight { view: written })
    }
}
impl<T: Pod> sealed::Arg for &mut DeviceSliceMut<'_, T> {}
impl<'scope, T: Pod> KernelArg<'scope> for &'scope mut DeviceSliceMut<'_, T> {
    type Output = DeviceInFlight<'scope, T>;
    type Param = sys::CUdeviceptr;
    fn check(&self, device: Device) -> Result<(), Error> {
        reachable(&self.as_slice(), device)
    }
    fn into_param(self) -> (sys::CUdeviceptr, DeviceInFlight<'scope, T>) {
        let written = self.lend_mut();
        (written.as_raw_ptr(), DeviceInFlight { view: written })
    }
}

/// The arguments of a kernel launched on a [`ScopedStream`]: a tuple (of up to 12) of
/// [`KernelArg`]s, `()` for none. Sealed.
pub trait KernelArgs<'scope>: sealed::Args {
    /// What the launch returns: the tuple of each argument's [`KernelArg::Output`].
    type Output;
    /// `Err` unless `device` reaches every view's memory.
    #[doc(hidden)]
    fn check(&self, device: Device) -> Result<(), Error>;
    /// Calls `launch` with one pointer per argument, each at the argument's value, alive for the call.
    #[doc(hidden)]
    fn launch_with(
        self,
        launch: impl FnOnce(&mut [*mut c_void]) -> Result<(), Error>,
    ) -> Result<Self::Output, Error>;
}

impl sealed::Args for () {}
impl KernelArgs<'_> for () {
    type Output = ();
    fn check(&self, _: Device) -> Result<(), Error> {
        Ok(())
    }
    fn launch_with(
        self,
        launch: impl FnOnce(&mut [*mut c_void]) -> Result<(), Error>,
    ) -> Result<(), Error> {
        launch(&mut [])
    }
}

macro_rules! kernel_args {
    ($(($($arg:ident $value:ident $out:ident),+))*) => {$(
        impl<'scope, $($arg: KernelArg<'scope>),+> sealed::Args for ($($arg,)+) {}
        impl<'scope, $($arg: KernelArg<'scope>),+> KernelArgs<'scope> for ($($arg,)+) {
            type Output = ($($arg::Output,)+);
            fn check(&self, device: Device) -> Result<(), Error> {
                let ($($value,)+) = self;
                $($arg::check($value, device)?;)+
                Ok(())
            }
            fn launch_with(
                self,
                launch: impl FnOnce(&mut [*mut c_void]) -> Result<(), Error>,
            ) -> Result<Self::Output, Error> {
                let ($($value,)+) = self;
                $(let (mut $value, $out) = $arg::into_param($value);)+
                launch(&mut [$((&raw mut $value).cast::<c_void>()),+])?;
                Ok(($($out,)+))
            }
        }
    )*};
}

kernel_args! {
    (A a oa)
    (A a oa, B b ob)
    (A a oa, B b ob, C c oc)
    (A a oa, B b ob, C c oc, D d od)
    (A a oa, B b ob, C c oc, D d od, E e oe)
    (A a oa, B b ob, C c oc, D d od, E e oe, F f of)
    (A a oa, B b ob, C c oc, D d od, E e oe, F f of, G g og)
    (A a oa, B b ob, C c oc, D d od, E e oe, F f of, G g og, H h oh)
    (A a oa, B b ob, C c oc, D d od, E e oe, F f of, G g og, H h oh, I i oi)
    (A a oa, B b ob, C c oc, D d od, E e oe, F f of, G g og, H h oh, I i oi, J j oj)
    (A a oa, B b ob, C c oc, D d od, E e oe, F f of, G g og, H h oh, I i oi, J j oj, K k ok)
    (A a oa, B b ob, C c oc, D d od, E e oe, F f of, G g og, H h oh, I i oi, J j oj, K k ok, L l ol)
}
