//! The typed arguments of a kernel queued on a [`ScopedStream`]: [`KernelArg`] and [`KernelArgs`].

use core::ffi::c_void;

use bytemuck::Pod;

use crate::device::Device;
use crate::error::Error;
use crate::sys;
use crate::view::{DeviceSlice, DeviceSliceMut};

use super::lend::{DeviceInFlight, ScopedRead, ScopedWrite, sealed};
#[cfg(doc)]
use super::scope::ScopedStream;

/// What [`KernelArg::into_param`] gives: the parameter, the launch's output, the count of a lend in
/// progress and the bytes of the view.
pub(super) type Param<'scope, A> = (
    <A as KernelArg<'scope>>::Param,
    <A as KernelArg<'scope>>::Output,
    sealed::Counted<'scope>,
    Option<sealed::Touch>,
);

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
    /// The parameter, what the launch returns, the count of a lend in progress, held until the
    /// kernel is queued, and the bytes of the view (none for a plain value); the view lent to work
    /// on the token's stream.
    #[doc(hidden)]
    fn into_param(self, token: sealed::Token) -> Result<Param<'scope, Self>, Error>;
}

impl<T: Pod> sealed::Arg for T {}
impl<T: Pod> KernelArg<'_> for T {
    type Output = ();
    type Param = T;
    fn check(&self, _: Device) -> Result<(), Error> {
        Ok(())
    }
    fn into_param(self, _: sealed::Token) -> Result<Param<'static, Self>, Error> {
        Ok((self, (), sealed::Counted(None, Vec::new()), None))
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
                ScopedRead::<'scope, T>::check_reach(self, device)
            }
            fn into_param(self, token: sealed::Token) -> Result<Param<'scope, Self>, Error> {
                let (view, _, counted) = ScopedRead::<'scope, T>::lend(self, token)?.into_parts();
                let touch = sealed::Touch::device::<T>(view.as_raw_ptr(), view.len(), false);
                Ok((view.as_raw_ptr(), (), counted, Some(touch)))
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

/// `KernelArg` for the writable view forms: the address, and the [`DeviceInFlight`] of the write.
macro_rules! write_arg {
    ($($ty:ty),*) => {$(
        impl<'scope, T: Pod> sealed::Arg for $ty {}
        impl<'scope, T: Pod> KernelArg<'scope> for $ty {
            type Output = DeviceInFlight<'scope, T>;
            type Param = sys::CUdeviceptr;
            fn check(&self, device: Device) -> Result<(), Error> {
                ScopedWrite::<'scope, T>::check_reach(self, device)
            }
            fn into_param(self, token: sealed::Token) -> Result<Param<'scope, Self>, Error> {
                let lent = ScopedWrite::<'scope, T>::lend_mut(self, token)?;
                let written = lent.written();
                let (view, _, counted) = lent.into_parts();
                let touch = sealed::Touch::device::<T>(view.as_raw_ptr(), view.len(), true);
                Ok((view.as_raw_ptr(), written, counted, Some(touch)))
            }
        }
    )*};
}
write_arg!(
    DeviceSliceMut<'scope, T>,
    &'scope mut DeviceSliceMut<'_, T>,
    &mut super::rewritable::Rewritable<'scope, T>
);

/// The arguments of a kernel launched on a [`ScopedStream`]: a tuple (of up to 12) of
/// [`KernelArg`]s, `()` for none. Sealed.
pub trait KernelArgs<'scope>: sealed::Args {
    /// What the launch returns: the tuple of each argument's [`KernelArg::Output`].
    type Output;
    /// `Err` unless `device` reaches every view's memory.
    #[doc(hidden)]
    fn check(&self, device: Device) -> Result<(), Error>;
    /// Calls `launch` with one pointer per argument, each at the argument's value, alive for the
    /// call, and the bytes of each view argument; the views lent to work on the token's stream.
    #[doc(hidden)]
    fn launch_with(
        self,
        token: sealed::Token,
        launch: impl FnOnce(&mut [*mut c_void], &[Option<sealed::Touch>]) -> Result<(), Error>,
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
        _: sealed::Token,
        launch: impl FnOnce(&mut [*mut c_void], &[Option<sealed::Touch>]) -> Result<(), Error>,
    ) -> Result<(), Error> {
        launch(&mut [], &[])
    }
}

macro_rules! kernel_args {
    ($(($($arg:ident $value:ident $out:ident $held:ident $touch:ident),+))*) => {$(
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
                token: sealed::Token,
                launch: impl FnOnce(&mut [*mut c_void], &[Option<sealed::Touch>]) -> Result<(), Error>,
            ) -> Result<Self::Output, Error> {
                let ($($value,)+) = self;
                // Each count is held until the kernel is queued: dropped at the end of this body.
                $(let (mut $value, $out, $held, $touch) = $arg::into_param($value, token)?;)+
                launch(&mut [$((&raw mut $value).cast::<c_void>()),+], &[$($touch),+])?;
                drop(($($held,)+));
                Ok(($($out,)+))
            }
        }
    )*};
}

kernel_args! {
    (A a oa ha ta)
    (A a oa ha ta, B b ob hb tb)
    (A a oa ha ta, B b ob hb tb, C c oc hc tc)
    (A a oa ha ta, B b ob hb tb, C c oc hc tc, D d od hd td)
    (A a oa ha ta, B b ob hb tb, C c oc hc tc, D d od hd td, E e oe he te)
    (A a oa ha ta, B b ob hb tb, C c oc hc tc, D d od hd td, E e oe he te, F f of hf tf)
    (A a oa ha ta, B b ob hb tb, C c oc hc tc, D d od hd td, E e oe he te, F f of hf tf, G g og hg tg)
    (A a oa ha ta, B b ob hb tb, C c oc hc tc, D d od hd td, E e oe he te, F f of hf tf, G g og hg tg, H h oh hh th)
    (A a oa ha ta, B b ob hb tb, C c oc hc tc, D d od hd td, E e oe he te, F f of hf tf, G g og hg tg, H h oh hh th, I i oi hi ti)
    (A a oa ha ta, B b ob hb tb, C c oc hc tc, D d od hd td, E e oe he te, F f of hf tf, G g og hg tg, H h oh hh th, I i oi hi ti, J j oj hj tj)
    (A a oa ha ta, B b ob hb tb, C c oc hc tc, D d od hd td, E e oe he te, F f of hf tf, G g og hg tg, H h oh hh th, I i oi hi ti, J j oj hj tj, K k ok hk tk)
    (A a oa ha ta, B b ob hb tb, C c oc hc tc, D d od hd td, E e oe he te, F f of hf tf, G g og hg tg, H h oh hh th, I i oi hi ti, J j oj hj tj, K k ok hk tk, L l ol hl tl)
}
