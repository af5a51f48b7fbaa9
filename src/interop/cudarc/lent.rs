//! What a cudarc scope lends: [`Lent`] and [`LentMut`], and cudarc's traits for them
//! ([`DevicePtr`], [`DevicePtrMut`], [`PushKernelArg`]), each asking the scope's state before it
//! gives cudarc the view's address.

use core::fmt;
#[cfg(feature = "nccl")]
use core::ptr;
use std::sync::Arc;

use ::cudarc::driver::{
    CudaStream, DevicePtr, DevicePtrMut, DeviceSlice as CudarcSlice, LaunchArgs, PushKernelArg,
    SyncOnDrop,
};
use bytemuck::Pod;

use super::state::State;
#[cfg(doc)]
use super::{Scope, scope};
use crate::view::DeviceSlice;

/// A view lent for reading to the work queued on a [`scope`]'s cudarc stream: cudarc's
/// [`DevicePtr`] for its copies and libraries, and `&lent` as a kernel argument ([`PushKernelArg`]).
/// Made by [`Scope::lend`]; it borrows the view for the rest of the scope.
///
/// # Lifetimes
/// `'scope` is the scope's: invariant, so the value can neither leave the closure nor hold a borrow
/// that ends before the scope's wait.
pub struct Lent<'scope, T> {
    /// The view's address, kept in the value so that a kernel argument can point at it.
    ptr: u64,
    /// What a refused operation gets instead: a never-mapped range at least as large.
    never_mapped: u64,
    /// The view, borrowed for the scope.
    view: DeviceSlice<'scope, T>,
    state: &'scope State<'scope>,
}

/// A view lent for writing, exclusively, to the work queued on a [`scope`]'s cudarc stream: cudarc's
/// [`DevicePtr`] and [`DevicePtrMut`], and `&lent` (read) or `&mut lent` (written) as a kernel
/// argument. Made by [`Scope::lend_mut`] from a writable view; it borrows it exclusively for the
/// rest of the scope.
///
/// # Lifetimes
/// As [`Lent`].
pub struct LentMut<'scope, T> {
    ptr: u64,
    never_mapped: u64,
    /// The writable view's memory, lent exclusively for the scope (seen as read-only, as a queued
    /// write of [`crate::stream::ScopedStream`] returns it).
    view: DeviceSlice<'scope, T>,
    state: &'scope State<'scope>,
}

impl<'scope, T: Pod> Lent<'scope, T> {
    /// `view`, lent in the scope of `state`; `never_mapped` is what a refused operation gets.
    pub(super) fn new(
        view: DeviceSlice<'scope, T>,
        never_mapped: u64,
        state: &'scope State<'scope>,
    ) -> Self {
        Lent {
            ptr: view.as_raw_ptr(),
            never_mapped,
            view,
            state,
        }
    }
}

impl<'scope, T: Pod> LentMut<'scope, T> {
    /// As [`Lent::new`], for a view lent for writing.
    pub(super) fn new(
        view: DeviceSlice<'scope, T>,
        never_mapped: u64,
        state: &'scope State<'scope>,
    ) -> Self {
        LentMut {
            ptr: view.as_raw_ptr(),
            never_mapped,
            view,
            state,
        }
    }
}

#[cfg(feature = "nccl")]
impl<T> Lent<'_, T> {
    /// What a collective of the NCCL scope takes of the value.
    pub(crate) fn lent_address(&self) -> sealed::LentAddress {
        sealed::LentAddress {
            ptr: self.ptr,
            never_mapped: self.never_mapped,
            state: ptr::from_ref(self.state).cast(),
        }
    }
}

#[cfg(feature = "nccl")]
impl<T> LentMut<'_, T> {
    /// As [`Lent::lent_address`].
    pub(crate) fn lent_address(&self) -> sealed::LentAddress {
        sealed::LentAddress {
            ptr: self.ptr,
            never_mapped: self.never_mapped,
            state: ptr::from_ref(self.state).cast(),
        }
    }
}

impl<T> Clone for Lent<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Lent<'_, T> {}

impl<T: Pod> fmt::Debug for Lent<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Lent").field(&self.view).finish()
    }
}

impl<T: Pod> fmt::Debug for LentMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LentMut").field(&self.view).finish()
    }
}

impl<T: Pod> CudarcSlice<T> for Lent<'_, T> {
    fn len(&self) -> usize {
        self.view.len()
    }

    /// The legacy default stream of the scope's context, which cudarc asks for the view's context:
    /// not the scope's stream, and refused the view's address. Queue work on [`Scope::stream`].
    fn stream(&self) -> &Arc<CudaStream> {
        self.state.marker()
    }
}

impl<T: Pod> CudarcSlice<T> for LentMut<'_, T> {
    fn len(&self) -> usize {
        self.view.len()
    }

    /// The legacy default stream of the scope's context, which cudarc asks for the view's context:
    /// not the scope's stream, and refused the view's address. Queue work on [`Scope::stream`].
    fn stream(&self) -> &Arc<CudaStream> {
        self.state.marker()
    }
}

impl<T: Pod> DevicePtr<T> for Lent<'_, T> {
    /// The view's address for an operation on the scope's stream; a never-mapped address (and a
    /// refusal the scope returns) otherwise. The guard is empty: the scope waits for the stream.
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        self.state.address(stream, self.ptr, self.never_mapped)
    }
}

impl<T: Pod> DevicePtr<T> for LentMut<'_, T> {
    /// As for [`Lent`].
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        self.state.address(stream, self.ptr, self.never_mapped)
    }
}

impl<T: Pod> DevicePtrMut<T> for LentMut<'_, T> {
    /// As `device_ptr`: the view's address for an operation on the scope's stream, a never-mapped
    /// address otherwise.
    fn device_ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        self.state.address(stream, self.ptr, self.never_mapped)
    }
}

// SAFETY: pushes a pointer to `arg.ptr` through cudarc's own implementation for `&'b u64` (a
// `DeviceRepr`): a `u64` device address that lives in `arg`, borrowed for `'b`, which outlives the
// builder (`'b: 'a`), as that implementation requires. The kernel receives the view's address; the
// view is borrowed for `'scope` (`'scope: 'b`), until the scope has waited for its stream. What the
// pointer's use needs beyond this is the condition that `LaunchArgs::launch` (which is `unsafe`)
// adds for lent arguments: the launch runs on the scope's stream, not captured into a graph (module
// documentation), and the kernel only reads a read-only argument, within its `len()` values.
unsafe impl<'a, 'b: 'a, T: Pod> PushKernelArg<&'b Lent<'_, T>> for LaunchArgs<'a> {
    #[inline]
    fn arg(&mut self, arg: &'b Lent<'_, T>) -> &mut Self {
        <Self as PushKernelArg<&'b u64>>::arg(self, &arg.ptr)
    }
}

// SAFETY: as for `&Lent`: a read-only argument made from a writable lent view.
unsafe impl<'a, 'b: 'a, T: Pod> PushKernelArg<&'b LentMut<'_, T>> for LaunchArgs<'a> {
    #[inline]
    fn arg(&mut self, arg: &'b LentMut<'_, T>) -> &mut Self {
        <Self as PushKernelArg<&'b u64>>::arg(self, &arg.ptr)
    }
}

// SAFETY: as for `&Lent`; the view is lent exclusively, so the kernel may write its `len()` values.
unsafe impl<'a, 'b: 'a, T: Pod> PushKernelArg<&'b mut LentMut<'_, T>> for LaunchArgs<'a> {
    #[inline]
    fn arg(&mut self, arg: &'b mut LentMut<'_, T>) -> &mut Self {
        let ptr: &'b u64 = &arg.ptr;
        <Self as PushKernelArg<&'b u64>>::arg(self, ptr)
    }
}

/// What the NCCL scope's collectives take of a lent value, in a module of its own: a public type
/// that only this crate can name.
#[cfg(feature = "nccl")]
pub(crate) mod sealed {
    /// A lent value's address, its never-mapped address, and the scope it was lent in
    /// (`Scope::collective_addresses`).
    #[derive(Debug, Clone, Copy)]
    pub struct LentAddress {
        pub(crate) ptr: u64,
        pub(crate) never_mapped: u64,
        /// The lending scope's state, compared by address only.
        pub(crate) state: *const (),
    }
}
