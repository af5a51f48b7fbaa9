//! Point-to-point transfers on lent views: [`CommScope::send`] and [`CommScope::recv`], what an
//! engine moves KV caches and activations between ranks with (a prefill rank sending a sequence's
//! cache to a decode rank, a pipeline stage handing its activations on).
//!
//! They follow the collectives' rules: queued on the communicator's stream, on views lent to the
//! scope that waits for it (the sent view readable, [`Lent`](crate::interop::cudarc::Lent) or
//! [`LentMut`]; the received one writable, [`LentMut`] only), joined to the enclosing
//! [`group`](super::group) with the collectives, refused on an aborted communicator.

use core::ffi::c_int;

use ::cudarc::driver::DeviceSlice as CudarcSlice;

use super::api;
use super::group::join_group;
use super::handle::in_group;
use super::scope::CommScope;
use super::{NcclType, Source};
use crate::error::Error;
use crate::interop::cudarc::LentMut;

/// Why a transfer between a rank and itself is refused outside a group.
const SELF_OUTSIDE_GROUP: &str = "a rank sends to (or receives from) itself only inside an NCCL \
                                  group that holds both halves (nccl::group): alone, the transfer \
                                  waits for its other half for ever";

impl<'scope> CommScope<'scope, '_> {
    /// `ncclSend` — send `send` (its `len()` elements of `T`) to rank `peer`, whose
    /// [`recv`](CommScope::recv) of as many elements takes it. Queued on the communicator's
    /// stream; inside a [`group`](super::group), launched at its end.
    ///
    /// A rank that both sends and receives pairs them inside one [`group`](super::group): outside
    /// one, each rank's send waits for the other's receive, which that rank queued after its own
    /// send, and neither ends (only the communicator's [timeout](super::Comm::set_timeout) does).
    /// A send to this rank itself is refused outside a group. The element counts of the two sides
    /// are not seen here: NCCL requires them equal.
    ///
    /// # Errors
    /// Before NCCL is called: [`Error::OutOfBounds`] for a peer outside the clique,
    /// [`Error::NcclRefused`] for a send to this rank outside a group (or on an aborted or
    /// suspended communicator), [`Error::NcclUnavailable`] where NCCL lacks the function.
    /// [`Error::Nccl`] for NCCL's refusal.
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::interop::nccl::{Comm, group};
    /// use cuda_vmm::DeviceSliceMut;
    ///
    /// /// Rank `rank` of two hands its block to the other and takes the other's.
    /// fn exchange(comm: &Comm, mine: &DeviceSliceMut<'_, f32>, theirs: &mut DeviceSliceMut<'_, f32>)
    ///     -> cuda_vmm::Result<()> {
    ///     let other = 1 - comm.rank();
    ///     comm.scope(|s| {
    ///         let (mine, mut theirs) = (s.lend(mine)?, s.lend_mut(theirs)?);
    ///         group(|| {
    ///             s.send(&mine, other)?; // ncclSend
    ///             s.recv(&mut theirs, other) // ncclRecv
    ///         })
    ///     }) // waits for the stream: only then do the views' borrows end
    /// }
    /// ```
    #[doc(alias = "ncclSend")]
    pub fn send<T: NcclType>(
        &self,
        send: &impl Source<'scope, T>,
        peer: usize,
    ) -> Result<(), Error> {
        const CALL: &str = "ncclSend";
        let peer = self.peer(peer, CALL)?;
        let [src] = self.addresses([send.lent_address()]);
        let api = api::api(CALL)?;
        let f = api::function(api.send, CALL)?;
        self.comm.core.live(CALL)?;
        join_group(&self.comm.core, CALL)?;
        // SAFETY: `src` is the address of a view lent to this scope for its stream, `send.len()`
        // elements of `T` (or of a never-mapped range as large), mapped until the scope has waited
        // for the stream the send is queued on; NCCL only reads it. The data type is `T`'s.
        let code = unsafe {
            f(
                src as *const _,
                send.len(),
                T::DATA_TYPE,
                peer,
                self.comm.core.raw,
                self.raw_stream(),
            )
        };
        self.comm.core.finish(code, CALL)
    }

    /// `ncclRecv` — receive into `recv` (its `len()` elements of `T`) what rank `peer` sends with
    /// [`send`](CommScope::send). Queued on the communicator's stream; inside a
    /// [`group`](super::group), launched at its end. As [`send`](CommScope::send) for groups and
    /// for this rank itself.
    ///
    /// # Errors
    /// As [`send`](CommScope::send).
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::interop::nccl::Comm;
    /// use cuda_vmm::DeviceSliceMut;
    ///
    /// /// A decode rank takes a sequence's KV cache from the prefill rank 0.
    /// fn take_cache(comm: &Comm, cache: &mut DeviceSliceMut<'_, u8>) -> cuda_vmm::Result<()> {
    ///     comm.scope(|s| s.recv(&mut s.lend_mut(cache)?, 0))
    /// }
    /// ```
    #[doc(alias = "ncclRecv")]
    pub fn recv<T: NcclType>(
        &self,
        recv: &mut LentMut<'scope, T>,
        peer: usize,
    ) -> Result<(), Error> {
        const CALL: &str = "ncclRecv";
        let peer = self.peer(peer, CALL)?;
        let [dst] = self.addresses([recv.lent_address()]);
        let api = api::api(CALL)?;
        let f = api::function(api.recv, CALL)?;
        self.comm.core.live(CALL)?;
        join_group(&self.comm.core, CALL)?;
        // SAFETY: `dst` is the address of a view lent to this scope for writing (exclusively:
        // `LentMut`) for its stream, `recv.len()` elements of `T` (or of a never-mapped range as
        // large), mapped until the scope has waited for the stream the receive is queued on. The
        // data type is `T`'s.
        let code = unsafe {
            f(
                dst as *mut _,
                recv.len(),
                T::DATA_TYPE,
                peer,
                self.comm.core.raw,
                self.raw_stream(),
            )
        };
        self.comm.core.finish(code, CALL)
    }

    /// The peer rank of a transfer, checked: inside the clique, and this rank itself only inside a
    /// group.
    fn peer(&self, peer: usize, call: &'static str) -> Result<c_int, Error> {
        check_peer(peer, self.comm.rank, self.comm.size, in_group()).map_err(
            |refusal| match refusal {
                PeerRefusal::Outside => Error::OutOfBounds {
                    what: "clique",
                    start: peer,
                    end: peer.saturating_add(1),
                    len: self.comm.size,
                },
                PeerRefusal::SelfOutsideGroup => Error::NcclRefused {
                    call,
                    why: SELF_OUTSIDE_GROUP,
                },
                PeerRefusal::TooLarge => Error::InvalidArgument { what: "peer rank" },
            },
        )
    }
}

/// Why a peer rank is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PeerRefusal {
    /// At or above the clique's size.
    Outside,
    /// This rank itself, outside a group.
    SelfOutsideGroup,
    /// Beyond a C `int`.
    TooLarge,
}

/// The checks of a transfer with `peer` by rank `rank` of `size`, `grouped` or not.
fn check_peer(peer: usize, rank: usize, size: usize, grouped: bool) -> Result<c_int, PeerRefusal> {
    if peer >= size {
        return Err(PeerRefusal::Outside);
    }
    if peer == rank && !grouped {
        return Err(PeerRefusal::SelfOutsideGroup);
    }
    c_int::try_from(peer).map_err(|_| PeerRefusal::TooLarge)
}

#[cfg(test)]
mod tests {
    use super::{PeerRefusal, check_peer};

    #[test]
    fn peers_are_checked() {
        assert_eq!(check_peer(1, 0, 2, false), Ok(1));
        assert_eq!(check_peer(2, 0, 2, true), Err(PeerRefusal::Outside));
        assert_eq!(
            check_peer(0, 0, 1, false),
            Err(PeerRefusal::SelfOutsideGroup)
        );
        assert_eq!(check_peer(0, 0, 1, true), Ok(0), "itself, inside a group");
        assert_eq!(
            check_peer(1 << 40, 0, usize::MAX, false),
            Err(PeerRefusal::TooLarge)
        );
    }
}
