//! [`Comm::scope`], [`CommScope`] and its collectives: the work NCCL queues on a communicator's
//! stream, on views lent to a scope that waits for it.

use core::cell::Cell;
use core::ffi::c_int;
use core::fmt;
use core::marker::PhantomData;

use ::cudarc::driver::DeviceSlice as CudarcSlice;
use bytemuck::Pod;

use super::api::{self, RawStream};
use super::comm::Comm;
use super::group::join_group;
use super::handle::{ABORTED, SUSPENDED, in_group};
use super::{CHECK_EVERY, NcclType, ReduceOp, Source};
use crate::error::Error;
use crate::interop::cudarc::sealed::LentAddress;
use crate::interop::cudarc::{Lent, LentMut, Scope as CudarcScope};
use crate::stream::{ScopedRead, ScopedWrite};

/// The scope of [`Comm::scope`]: it lends views to the collectives queued on the communicator's
/// stream, and waits for that stream before the scope returns.
///
/// # Lifetimes
/// As [`cudarc::Scope`](crate::interop::cudarc::Scope): `'scope` is the scope itself (until the stream has been
/// waited for), `'env` what it borrows from outside (the communicator, the views). Both are
/// invariant.
pub struct CommScope<'scope, 'env: 'scope> {
    pub(super) inner: &'scope CudarcScope<'scope, 'env>,
    pub(super) comm: &'env Comm,
    /// Invariant in `'env`, as the cudarc scope.
    pub(super) _env: PhantomData<&'env mut &'env ()>,
}

impl fmt::Debug for CommScope<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommScope")
            .field("comm", self.comm)
            .finish_non_exhaustive()
    }
}

impl<'scope, 'env> CommScope<'scope, 'env> {
    /// The communicator.
    #[must_use]
    pub fn comm(&self) -> &'env Comm {
        self.comm
    }

    /// The cudarc scope on the communicator's stream, for cudarc's copies and kernels on views lent
    /// here.
    #[must_use]
    pub fn cudarc(&self) -> &'scope CudarcScope<'scope, 'env> {
        self.inner
    }

    /// Lends `view` for reading to the collectives of this scope, as
    /// [`cudarc::Scope::lend`](crate::interop::cudarc::Scope::lend).
    ///
    /// # Errors
    /// As [`cudarc::Scope::lend`](crate::interop::cudarc::Scope::lend).
    pub fn lend<T: Pod>(&self, view: impl ScopedRead<'scope, T>) -> Result<Lent<'scope, T>, Error> {
        self.inner.lend(view)
    }

    /// Lends `view` for writing, exclusively, to the collectives of this scope, as
    /// [`cudarc::Scope::lend_mut`](crate::interop::cudarc::Scope::lend_mut).
    ///
    /// # Errors
    /// As [`cudarc::Scope::lend_mut`](crate::interop::cudarc::Scope::lend_mut).
    pub fn lend_mut<T: Pod>(
        &self,
        view: impl ScopedWrite<'scope, T>,
    ) -> Result<LentMut<'scope, T>, Error> {
        self.inner.lend_mut(view)
    }

    pub(super) fn raw_stream(&self) -> RawStream {
        self.comm.stream.cu_stream().cast()
    }

    /// The addresses of the lent values of one collective, on the communicator's stream (the
    /// scope's), from one capture check; never-mapped ranges while the stream captures a graph
    /// (the scope then returns [`Error::StreamRefused`]).
    pub(super) fn addresses<const N: usize>(&self, lent: [LentAddress; N]) -> [u64; N] {
        self.inner.collective_addresses(lent)
    }

    /// `ncclAllReduce` — reduce `send` of every rank with `op`, into `recv` of every rank. Queued on
    /// the communicator's stream; inside a [`group`](super::group), launched at its end.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] where `recv` is not as long as `send`, before NCCL is called;
    /// [`Error::Nccl`] for NCCL's refusal.
    #[doc(alias = "ncclAllReduce")]
    pub fn all_reduce<T: NcclType>(
        &self,
        send: &impl Source<'scope, T>,
        recv: &mut LentMut<'scope, T>,
        op: ReduceOp,
    ) -> Result<(), Error> {
        same_len(send.len(), recv.len())?;
        let [src, dst] = self.addresses([send.lent_address(), recv.lent_address()]);
        self.all_reduce_raw::<T>(src, dst, recv.len(), op)
    }

    /// `ncclAllReduce` in place: `buffer` of every rank reduced with `op`, into `buffer`.
    ///
    /// # Errors
    /// As [`all_reduce`](CommScope::all_reduce).
    #[doc(alias = "ncclAllReduce")]
    pub fn all_reduce_in_place<T: NcclType>(
        &self,
        buffer: &mut LentMut<'scope, T>,
        op: ReduceOp,
    ) -> Result<(), Error> {
        let [ptr] = self.addresses([buffer.lent_address()]);
        self.all_reduce_raw::<T>(ptr, ptr, buffer.len(), op)
    }

    fn all_reduce_raw<T: NcclType>(
        &self,
        src: u64,
        dst: u64,
        count: usize,
        op: ReduceOp,
    ) -> Result<(), Error> {
        let api = api::api("ncclAllReduce")?;
        let f = api::function(api.all_reduce, "ncclAllReduce")?;
        self.comm.core.live("ncclAllReduce")?;
        join_group(&self.comm.core, "ncclAllReduce")?;
        // SAFETY: `src` and `dst` are the addresses of views lent to this scope for its stream, each
        // `count` elements of `T` (or of a never-mapped range as large), mapped until the scope has
        // waited for the stream the work is queued on; the data type is `T`'s.
        let code = unsafe {
            f(
                src as *const _,
                dst as *mut _,
                count,
                T::DATA_TYPE,
                op.raw(),
                self.comm.core.raw,
                self.raw_stream(),
            )
        };
        self.comm.core.finish(code, "ncclAllReduce")
    }

    /// `ncclBroadcast` — `send` of rank `root` copied into `recv` of every rank. Only the root's
    /// `send` is read; other ranks may pass `None`.
    ///
    /// # Errors
    /// Before NCCL is called: [`Error::OutOfBounds`] for a root outside the clique,
    /// [`Error::NcclRefused`] where the root passes no `send`, [`Error::LengthMismatch`] where
    /// `send` is not as long as `recv`. [`Error::Nccl`] for NCCL's refusal.
    #[doc(alias = "ncclBroadcast")]
    pub fn broadcast<T: NcclType>(
        &self,
        send: Option<&dyn Source<'scope, T>>,
        recv: &mut LentMut<'scope, T>,
        root: usize,
    ) -> Result<(), Error> {
        let (src, dst) = if let Some(send) = send {
            same_len(send.len(), recv.len())?;
            let [src, dst] = self.addresses([send.lent_address(), recv.lent_address()]);
            (Some(src), dst)
        } else {
            let [dst] = self.addresses([recv.lent_address()]);
            (None, dst)
        };
        if self.comm.rank == root && src.is_none() {
            return Err(Error::NcclRefused {
                call: "ncclBroadcast",
                why: "the root rank passed no send buffer",
            });
        }
        self.broadcast_raw::<T>(src.unwrap_or(dst), dst, recv.len(), root)
    }

    /// `ncclBroadcast` in place: `buffer` of rank `root` copied into `buffer` of every rank.
    ///
    /// # Errors
    /// As [`broadcast`](CommScope::broadcast).
    #[doc(alias = "ncclBroadcast")]
    pub fn broadcast_in_place<T: NcclType>(
        &self,
        buffer: &mut LentMut<'scope, T>,
        root: usize,
    ) -> Result<(), Error> {
        let [ptr] = self.addresses([buffer.lent_address()]);
        self.broadcast_raw::<T>(ptr, ptr, buffer.len(), root)
    }

    fn broadcast_raw<T: NcclType>(
        &self,
        src: u64,
        dst: u64,
        count: usize,
        root: usize,
    ) -> Result<(), Error> {
        let root = self.root(root)?;
        let api = api::api("ncclBroadcast")?;
        let f = api::function(api.broadcast, "ncclBroadcast")?;
        self.comm.core.live("ncclBroadcast")?;
        join_group(&self.comm.core, "ncclBroadcast")?;
        // SAFETY: as in `all_reduce_raw`: lent addresses of `count` elements each.
        let code = unsafe {
            f(
                src as *const _,
                dst as *mut _,
                count,
                T::DATA_TYPE,
                root,
                self.comm.core.raw,
                self.raw_stream(),
            )
        };
        self.comm.core.finish(code, "ncclBroadcast")
    }

    /// `ncclAllGather` — `send` of every rank, in rank order, into `recv` of every rank: `recv` is
    /// the clique's size times as long as `send`.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] for any other `recv` length, before NCCL is called;
    /// [`Error::Nccl`] for NCCL's refusal.
    #[doc(alias = "ncclAllGather")]
    pub fn all_gather<T: NcclType>(
        &self,
        send: &impl Source<'scope, T>,
        recv: &mut LentMut<'scope, T>,
    ) -> Result<(), Error> {
        same_len(count(send.len(), self.comm.size)?, recv.len())?;
        let [src, dst] = self.addresses([send.lent_address(), recv.lent_address()]);
        let api = api::api("ncclAllGather")?;
        let f = api::function(api.all_gather, "ncclAllGather")?;
        self.comm.core.live("ncclAllGather")?;
        join_group(&self.comm.core, "ncclAllGather")?;
        // SAFETY: as in `all_reduce_raw`; `recv` holds `size` times `send.len()` elements (checked).
        let code = unsafe {
            f(
                src as *const _,
                dst as *mut _,
                send.len(),
                T::DATA_TYPE,
                self.comm.core.raw,
                self.raw_stream(),
            )
        };
        self.comm.core.finish(code, "ncclAllGather")
    }

    /// `ncclReduceScatter` — `send` of every rank reduced with `op`, and block `r` of the result
    /// into `recv` of rank `r`: `send` is the clique's size times as long as `recv`.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] for any other `send` length, before NCCL is called;
    /// [`Error::Nccl`] for NCCL's refusal.
    #[doc(alias = "ncclReduceScatter")]
    pub fn reduce_scatter<T: NcclType>(
        &self,
        send: &impl Source<'scope, T>,
        recv: &mut LentMut<'scope, T>,
        op: ReduceOp,
    ) -> Result<(), Error> {
        same_len(count(recv.len(), self.comm.size)?, send.len())?;
        let [src, dst] = self.addresses([send.lent_address(), recv.lent_address()]);
        let api = api::api("ncclReduceScatter")?;
        let f = api::function(api.reduce_scatter, "ncclReduceScatter")?;
        self.comm.core.live("ncclReduceScatter")?;
        join_group(&self.comm.core, "ncclReduceScatter")?;
        // SAFETY: as in `all_reduce_raw`; `send` holds `size` times `recv.len()` elements (checked).
        let code = unsafe {
            f(
                src as *const _,
                dst as *mut _,
                recv.len(),
                T::DATA_TYPE,
                op.raw(),
                self.comm.core.raw,
                self.raw_stream(),
            )
        };
        self.comm.core.finish(code, "ncclReduceScatter")
    }

    fn root(&self, root: usize) -> Result<c_int, Error> {
        if root >= self.comm.size {
            return Err(Error::OutOfBounds {
                what: "clique",
                start: root,
                end: root.saturating_add(1),
                len: self.comm.size,
            });
        }
        c_int::try_from(root).map_err(|_| Error::InvalidArgument { what: "root rank" })
    }
}

/// `len` elements of each of `of` ranks.
fn count(len: usize, of: usize) -> Result<usize, Error> {
    len.checked_mul(of).ok_or(Error::Overflow {
        what: "elements of all ranks",
    })
}

fn same_len(expected: usize, found: usize) -> Result<(), Error> {
    if expected == found {
        Ok(())
    } else {
        Err(Error::LengthMismatch { expected, found })
    }
}

impl Comm {
    /// [`cudarc::scope`](crate::interop::cudarc::scope) on the communicator's stream: lend views
    /// with [`CommScope::lend`] and [`CommScope::lend_mut`] and queue collectives on them; when `f`
    /// returns or panics, the scope polls the stream's work and the communicator's asynchronous
    /// error until the stream is idle, aborts the communicator on an error or past its
    /// [timeout](Comm::set_timeout), and waits for the stream then (see [Asynchronous
    /// errors](super#asynchronous-errors-hangs-and-aborts)).
    ///
    /// # Errors
    /// Before `f` runs: [`Error::StreamRefused`] inside a [`group`](super::group) (the group would
    /// launch the work after this scope's wait), [`Error::NcclRefused`] on an aborted communicator,
    /// or as [`cudarc::scope`](crate::interop::cudarc::scope). After it: a refusal of a lent view
    /// and `f`'s error as [`cudarc::scope`](crate::interop::cudarc::scope); [`Error::Nccl`] for an
    /// asynchronous error (`call` `"ncclCommGetAsyncError"`) or a timeout (code 8, `ncclTimeout`),
    /// the communicator then aborted; the wait's error; the asynchronous error polled after the
    /// wait. Whatever it returns, the work queued on the stream has finished.
    ///
    /// # Panics
    /// Resumes a panic of `f`, after waiting for the stream.
    ///
    /// # Examples
    /// A window cannot be registered while a scope uses the communicator:
    /// ```compile_fail,E0502
    /// # use cuda_vmm::interop::nccl::Comm;
    /// # use cuda_vmm::owned::GrantedMapping;
    /// fn register_mid_scope(mut comm: Comm, memory: &mut GrantedMapping) -> cuda_vmm::Result<()> {
    ///     comm.scope(|_s| -> cuda_vmm::Result<()> {
    ///         let _window = comm.register_window(memory, ..)?; // collective, mid-scope
    ///         Ok(())
    ///     })
    /// }
    /// ```
    pub fn scope<'env, F, R, E>(&'env self, f: F) -> Result<R, E>
    where
        F: for<'scope> FnOnce(&CommScope<'scope, 'env>) -> Result<R, E>,
        E: From<Error>,
    {
        if in_group() {
            return Err(Error::StreamRefused {
                why: "the scope was opened inside an NCCL group, whose work is launched at the \
                      group's end, after this scope's wait; open the scopes first, the group inside",
            }
            .into());
        }
        if self.core.aborted.get() {
            return Err(Error::NcclRefused {
                call: "Comm::scope",
                why: ABORTED,
            }
            .into());
        }
        if self.core.suspended.get() {
            return Err(Error::NcclRefused {
                call: "Comm::scope",
                why: SUSPENDED,
            }
            .into());
        }
        // The first check comes after one interval: an error of work that ends sooner is read by
        // the check after the wait, at no cost to the polls.
        let next_check = Cell::new(CHECK_EVERY);
        let between = |waited| self.between_polls(waited, &next_check);
        // The cudarc scope's wait polls the stream, on return and while a panic of `f` unwinds,
        // before any lent borrow ends.
        let value = crate::interop::cudarc::scope_polled(
            &self.stream,
            &between,
            |inner| -> Result<R, E> {
                f(&CommScope {
                    inner,
                    comm: self,
                    _env: PhantomData,
                })
            },
        )?;
        self.async_error()?;
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_checked() {
        assert_eq!(same_len(3, 3), Ok(()));
        assert_eq!(
            same_len(3, 4),
            Err(Error::LengthMismatch {
                expected: 3,
                found: 4
            })
        );
    }
}
