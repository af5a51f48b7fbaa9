//! dma-buf export of a range of a [`VirtualBuffer`]: the range checked against the page table
//! before any driver call, then one `cuMemGetHandleForAddressRange` per chunk, each descriptor's
//! size checked. The types and the driver call are the `ipc` module's
//! ([`DmaBufExport`](crate::ipc::DmaBufExport)).

#![cfg(unix)]

use core::ops::RangeBounds;

use super::{BUDGET, VirtualBuffer};
use crate::device::Device;
use crate::error::Error;
use crate::ipc::{DmaBufChunk, DmaBufExport, DmaBufLayout, export_range};
use crate::sys;
use crate::view::range_bounds;
use crate::vmm::access::AccessMode;
use crate::vmm::physical::AllocationOptions;

/// What a chunk is made of, for the plan: `[start, end)` of the buffer and what the driver asks of
/// the allocations one descriptor spans (one device, identical allocation options).
type Planned = (usize, usize, (Device, AllocationOptions));

impl<M: AccessMode> VirtualBuffer<M> {
    /// `cuMemGetHandleForAddressRange` — export the pages of the byte range `bytes` (counted from
    /// the base) as dma-buf file descriptors, one per chunk as `layout` says, for a network
    /// adapter to register (`ibv_reg_dmabuf_mr`, libfabric, UCX, NIXL): a [`DmaBufExport`] that
    /// borrows the buffer, so no page of the range is unmapped, shrunk, retired or evicted, and
    /// the access set is not changed, while it lives.
    ///
    /// Checked before any driver call, against the page table: the range is not empty, begins and
    /// ends on page boundaries (a descriptor covers whole physical allocations; register a
    /// sub-range of a chunk at its offset), and every byte of it is on a mapped, granted page that
    /// is neither evicted nor retired. Then, per device of the range's pages, with attribute
    /// queries only: dma-buf support (`CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`), and, on a device
    /// whose VMM memory can be made `GPUDirect` RDMA capable, that every page of it was
    /// ([`PageOptions::with_rdma`](crate::owned::PageOptions::with_rdma)): a network adapter's
    /// access needs it. Then one export per chunk, in the context of the chunk's device where the
    /// access set has it; each descriptor's size, as the kernel reports it, must be its chunk's, so
    /// a descriptor that covers less (the silent first-chunk-only bug) is refused, not returned.
    ///
    /// # Errors
    /// Before any driver call: [`Error::OutOfBounds`] for a range outside the budget,
    /// [`Error::ZeroSize`] for an empty one, [`Error::PageRange`] naming evicted, unmapped,
    /// retired or ungranted bytes, or a page the range would cut. Before any export:
    /// [`Error::Unsupported`] (attribute 124) where a page's device has no dma-buf support;
    /// [`Error::PageRange`] naming a page not made RDMA capable on a device that can make it so.
    /// Then the driver's error (`CUDA_ERROR_INVALID_VALUE`, `CUDA_ERROR_NOT_SUPPORTED`), or
    /// [`Error::PageRange`] where a descriptor's size is not its chunk's (a
    /// [`DmaBufLayout::PerRun`] the driver covers only in part); the descriptors made so far are
    /// closed.
    ///
    /// # Examples
    /// ```no_run
    /// use cuda_vmm::{Device, ReadWrite, VirtualBuffer, ipc::DmaBufLayout, owned::PageOptions};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let options = PageOptions::new().with_rdma(device.supports_gpu_direct_rdma_with_vmm()?);
    /// let cache = VirtualBuffer::with_options(1 << 30, &[device], ReadWrite, options)?;
    /// for _ in 0..5 {
    ///     cache.grow(device, 2 << 20)?; // five pages, made separately
    /// }
    /// let export = cache.export_dma_buf(..10 << 20, DmaBufLayout::PerPage)?;
    /// for chunk in export.chunks() {
    ///     // ibv_reg_dmabuf_mr(pd, 0, chunk.size(), chunk.address(), chunk.fd(), access)
    ///     println!("{:?}", chunk);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuMemGetHandleForAddressRange")]
    #[doc(alias = "dma_buf")]
    pub fn export_dma_buf(
        &self,
        bytes: impl RangeBounds<usize>,
        layout: DmaBufLayout,
    ) -> Result<DmaBufExport<'_>, Error> {
        let (start, end) = range_bounds(bytes, self.budget, BUDGET)?;
        if start == end {
            return Err(Error::ZeroSize {
                what: "dma-buf range",
            });
        }
        let pages: Vec<Planned> = {
            let mut table = self.lock();
            table.usable(start, end)?;
            let pages = table
                .pages_in(start, end)?
                .filter_map(|p| {
                    let key = (p.device()?, p.allocation()?.options());
                    Some((p.offset(), p.end(), key))
                })
                .collect();
            // Before any export: whoever imports a descriptor may keep the memory after this
            // buffer lets it go, so it is never made a page again (marked also where the export
            // fails: the memory is then only released, as a buffer with no reserve releases it).
            table.mark_exported(start, end);
            pages
        };
        // The pages stay as they are from here on: every change of them takes `&mut self`, and
        // the lock is let go only so that growth elsewhere in the buffer need not wait.
        check_devices(&pages)?;
        let mut chunks = Vec::new();
        for (chunk_start, chunk_end, (device, _)) in plan(&pages, layout) {
            let context = self.context_of(device).or_else(|_| self.first_context())?;
            context.bind_to_thread()?;
            let size = chunk_end.saturating_sub(chunk_start);
            let address = self.base.wrapping_add(chunk_start as u64);
            let (fd, reported) = export_range(address, size)?;
            if reported != size as u64 {
                return Err(Error::PageRange {
                    start: chunk_start,
                    end: chunk_end,
                    problem: "were exported by the driver as a dma-buf of another size (refused, \
                              the descriptor closed: export them with DmaBufLayout::PerPage)",
                });
            }
            chunks.push(DmaBufChunk::new(fd, chunk_start, size, address, device));
        }
        Ok(DmaBufExport::new(chunks, start..end))
    }
}

/// The attribute checks of an export, per device of `pages` (each asked once): dma-buf support,
/// and where the device's VMM memory can be made RDMA capable, that every one of its pages was.
fn check_devices(pages: &[Planned]) -> Result<(), Error> {
    let mut asked: Vec<(Device, bool)> = Vec::new();
    for &(start, end, (device, options)) in pages {
        let needs_rdma = if let Some(&(_, needs)) = asked.iter().find(|a| a.0 == device) {
            needs
        } else {
            if !device.supports_dma_buf()? {
                return Err(Error::Unsupported {
                    what: "dma-buf export of device memory (cuMemGetHandleForAddressRange)",
                    device: device.as_raw(),
                    attribute: sys::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
                });
            }
            let needs = device.supports_gpu_direct_rdma_with_vmm()?;
            asked.push((device, needs));
            needs
        };
        if needs_rdma && !options.rdma() {
            return Err(Error::PageRange {
                start,
                end,
                problem: "are a page not made GPUDirect RDMA capable, on a device whose VMM \
                          memory can be: a network adapter's access needs it (make the buffer \
                          with PageOptions::with_rdma(true))",
            });
        }
    }
    Ok(())
}

/// The chunks of an export of `pages` (adjacent, in address order, covering the range): each page
/// alone, or each run of adjacent pages with the same key (device and allocation options) merged.
fn plan<K: PartialEq + Copy>(
    pages: &[(usize, usize, K)],
    layout: DmaBufLayout,
) -> Vec<(usize, usize, K)> {
    match layout {
        DmaBufLayout::PerPage => pages.to_vec(),
        DmaBufLayout::PerRun => {
            let mut runs: Vec<(usize, usize, K)> = Vec::with_capacity(pages.len());
            for &(start, end, key) in pages {
                match runs.last_mut() {
                    Some(run) if run.1 == start && run.2 == key => run.1 = end,
                    _ => runs.push((start, end, key)),
                }
            }
            runs
        }
    }
}

#[cfg(test)]
mod tests {
    use super::plan;
    use crate::ipc::DmaBufLayout;
    use proptest::prelude::*;

    #[test]
    fn runs_of_one_key_merge_and_nothing_else_does() {
        let pages = [
            (0, 2, 'a'),
            (2, 6, 'a'),
            (6, 8, 'b'),
            (8, 10, 'a'),
            (12, 14, 'a'),
        ];
        assert_eq!(plan(&pages, DmaBufLayout::PerPage), pages.to_vec());
        assert_eq!(
            plan(&pages, DmaBufLayout::PerRun),
            vec![(0, 6, 'a'), (6, 8, 'b'), (8, 10, 'a'), (12, 14, 'a')],
            "merged where adjacent and alike; a gap or another key starts a run"
        );
        assert!(plan::<u8>(&[], DmaBufLayout::PerRun).is_empty());
    }

    proptest! {
        /// Whatever the pages, the chunks cover exactly the pages' bytes, in order, each chunk
        /// made of pages of one key; per page, the chunks are the pages.
        #[test]
        fn chunks_cover_the_pages_once(parts in proptest::collection::vec((1usize..5, 0u8..3), 0..24)) {
            let mut pages = Vec::new();
            let mut at = 0;
            for (len, key) in parts {
                pages.push((at, at + len, key));
                at += len;
            }
            prop_assert_eq!(plan(&pages, DmaBufLayout::PerPage), pages.clone());
            let runs = plan(&pages, DmaBufLayout::PerRun);
            let mut reached = 0;
            for &(start, end, key) in &runs {
                prop_assert_eq!(start, reached);
                prop_assert!(end > start);
                prop_assert!(pages.iter().filter(|p| p.0 >= start && p.1 <= end).all(|p| p.2 == key));
                reached = end;
            }
            prop_assert_eq!(reached, at);
            for pair in runs.windows(2) {
                prop_assert!(pair[0].2 != pair[1].2, "two adjacent runs of one key would be one");
            }
        }
    }
}
