//! A graph replayed over a [`ScopedBuffer`]'s pages: the buffer given to a
//! [`ScopedRebind`](crate::stream::ScopedRebind), whose ranges its page table claims for the scope
//! and admits at every replay (the rules are the stream layer's
//! [`ScopedGraph`](crate::stream::ScopedGraph)'s).

use crate::error::Error;
use crate::stream::{Claim, Lender, ScopedRebind};
use crate::vmm::access::{AccessMode, ReadWrite};

use super::super::VirtualBuffer;
use super::ScopedBuffer;

impl<'scope> ScopedRebind<'scope> {
    /// Give `buffer`, lent to this scope: every range the graph touches in its reservation is
    /// claimed for the scope by [`finish`](ScopedRebind::finish), for writing where the graph
    /// writes it (only in a [`ReadWrite`] buffer), for reading elsewhere, and admitted at every
    /// replay. Written ranges that overlap or touch are one claim, read back
    /// ([`read_back`](ScopedBuffer::read_back)) or reused whole. Pages the graph does not touch
    /// grow and retire as before.
    ///
    /// # Examples
    /// A graph captured once over a page of the cache, replayed every step while the cache maps and
    /// retires other pages, then refused once its own page is retired:
    /// ```no_run
    /// use cuda_vmm::{Context, Device, Error, PinnedBuffer, ReadWrite, Stream, VirtualBuffer};
    /// use cuda_vmm::stream::Graph;
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let page = 2 << 20;
    /// let mut cache = VirtualBuffer::new(64 * page, &[device], ReadWrite)?;
    /// cache.grow(device, page)?;
    /// let context = Context::new(device)?;
    /// let mut stream = Stream::new(&context)?;
    /// let step = PinnedBuffer::from_slice(&context, &vec![7u32; page / 4])?;
    /// let parked = {
    ///     let mut kv = cache.slice_bytes_mut::<u32>(..page)?;
    ///     Graph::capture(&mut stream, |c| c.copy_from_host(&mut kv, &step).map(drop))?.park()
    /// };
    /// cuda_vmm::scope(|s| {
    ///     let work = s.on(&stream);
    ///     let cache = cache.in_scope(s);
    ///     let mut graph = parked.in_scope().buffer(&cache).reads_host(&step).finish()?;
    ///     for _ in 0..4 {
    ///         work.launch_scoped_graph(&mut graph)?; // admitted: page 0 is live
    ///         let at = cache.grow(device, page)?; // no host wait, no re-capture
    ///         cache.retire(at..at + page)?;
    ///     }
    ///     cache.retire(..page)?; // released after the replays queued so far
    ///     let refused = work.launch_scoped_graph(&mut graph).unwrap_err();
    ///     assert!(matches!(refused, Error::PageRange { start: 0, .. }));
    ///     Ok(())
    /// })?;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use = "the scoped graph is made by `finish`"]
    pub fn buffer<M: AccessMode>(self, buffer: &ScopedBuffer<'scope, M>) -> ScopedRebind<'scope> {
        let pages: &'scope VirtualBuffer<M> = buffer.buffer;
        let start = pages.base;
        let end = start.saturating_add(pages.budget as u64);
        if pages.context_of(self.device()).is_err() {
            return self.unreachable(start, end);
        }
        self.lender(Lender {
            pages,
            streams: buffer.streams,
            start,
            end,
            writable: M::FLAGS == ReadWrite::FLAGS,
        })
    }
}

// The page table of a buffer lent to a scope claims a graph's ranges for it.
impl<M: AccessMode> Claim for VirtualBuffer<M> {
    fn claim_all(&self, ranges: &[(u64, u64, bool)]) -> Result<u64, Error> {
        let offsets = ranges
            .iter()
            .map(|&(start, end, write)| {
                let bytes =
                    usize::try_from(end.saturating_sub(start)).map_err(|_| Error::Overflow {
                        what: "graph range",
                    })?;
                let (start, end) = self.offsets(start, bytes)?;
                Ok((start, end, write))
            })
            .collect::<Result<Vec<_>, Error>>()?;
        self.lock().claim_all(&offsets)
    }
}
