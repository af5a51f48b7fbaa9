//! [`VirtualBuffer::split_growth`]: a buffer's growth apart from its views, so that a graph (or any
//! borrow) holding a writable view leaves `grow` and `map_page` available.

use core::fmt;
use core::ops::RangeBounds;

use bytemuck::Pod;

use super::{BufferStats, PageInfo, VirtualBuffer};
use crate::device::Device;
use crate::error::Error;
use crate::view::{DeviceSlice, DeviceSliceMut, Reach};
use crate::vmm::access::{AccessMode, ReadWrite};

impl<M: AccessMode> VirtualBuffer<M> {
    /// Splits the buffer, for as long as the two handles live, into its growth ([`Growth`]: map
    /// pages into unmapped ranges, a `Copy` handle) and its views ([`Views`]: read-only and writable
    /// views of mapped pages, as the buffer's own). No driver call.
    ///
    /// A writable view borrows the [`Views`] exclusively, not the buffer, so a graph that captured
    /// writes to a range (and borrows the view for as long as it lives) leaves
    /// [`Growth::grow`] and [`Growth::map_page`] available: a new page goes only where nothing is
    /// mapped, so it disturbs no captured address. What changes mapped pages (unmap, shrink,
    /// retire, evict, access changes) takes the buffer by `&mut` and waits until both handles are
    /// gone.
    ///
    /// # Examples
    /// A graph writes the first page, and is replayed while the buffer grows:
    /// ```no_run
    /// use cuda_vmm::stream::Graph;
    /// use cuda_vmm::{Context, Device, ReadWrite, Stream, VirtualBuffer};
    ///
    /// # fn main() -> cuda_vmm::Result<()> {
    /// let device = Device::get(0)?;
    /// let context = Context::new(device)?;
    /// let page = 2 << 20;
    /// let mut cache = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// cache.grow(device, page)?;
    /// let mut stream = Stream::new(&context)?;
    /// let (growth, mut views) = cache.split_growth();
    /// let mut first = views.slice_bytes_mut::<u8>(..page)?;
    /// let graph = Graph::capture(&mut stream, |c| {
    ///     c.memset(&mut first, 7)?;
    ///     Ok(())
    /// })?;
    /// for _ in 0..4 {
    ///     growth.grow(device, page)?; // while the graph lives
    ///     cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph))?;
    /// }
    /// drop(graph);
    /// assert_eq!(growth.mapped_bytes(), 5 * page);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// A page under the graph's view is not unmapped while the handles live:
    /// ```compile_fail,E0499
    /// # use cuda_vmm::{Device, ReadWrite, VirtualBuffer};
    /// # fn main() -> cuda_vmm::Result<()> {
    /// # let device = Device::get(0)?;
    /// let mut cache = VirtualBuffer::new(1 << 30, &[device], ReadWrite)?;
    /// cache.grow(device, 2 << 20)?;
    /// let (growth, mut views) = cache.split_growth();
    /// let view = views.slice_bytes_mut::<u8>(..2 << 20)?;
    /// cache.shrink()?; // the view's page
    /// growth.grow(device, 2 << 20)?;
    /// drop(view);
    /// # Ok(())
    /// # }
    /// ```
    pub fn split_growth(&mut self) -> (Growth<'_, M>, Views<'_, M>) {
        let buffer: &VirtualBuffer<M> = self;
        (Growth { buffer }, Views { buffer })
    }
}

/// The growth of a [`VirtualBuffer`] split from its views ([`VirtualBuffer::split_growth`]): maps
/// pages into unmapped ranges, and reads the buffer's counts. A `Copy` handle.
///
/// # Lifetimes
/// `'buf` is the exclusive borrow of the buffer that the split holds, shared by the two handles.
#[derive(Clone, Copy)]
pub struct Growth<'buf, M: AccessMode = ReadWrite> {
    buffer: &'buf VirtualBuffer<M>,
}

impl<M: AccessMode> fmt::Debug for Growth<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Growth").field(self.buffer).finish()
    }
}

impl<M: AccessMode> Growth<'_, M> {
    /// As [`VirtualBuffer::grow`]: maps a page after the last one, while views of other pages live.
    ///
    /// # Errors
    /// As [`VirtualBuffer::grow`].
    #[doc(alias = "cuMemMap")]
    pub fn grow(&self, device: Device, size: usize) -> Result<usize, Error> {
        self.buffer.grow(device, size)
    }

    /// As [`VirtualBuffer::map_page`]: maps a page at `offset`, where nothing is mapped.
    ///
    /// # Errors
    /// As [`VirtualBuffer::map_page`].
    #[doc(alias = "cuMemMap")]
    pub fn map_page(&self, offset: usize, device: Device, size: usize) -> Result<(), Error> {
        self.buffer.map_page(offset, device, size)
    }

    /// As [`VirtualBuffer::base`].
    #[must_use]
    pub fn base(&self) -> u64 {
        self.buffer.base()
    }

    /// As [`VirtualBuffer::end`].
    #[must_use]
    pub fn end(&self) -> usize {
        self.buffer.end()
    }

    /// As [`VirtualBuffer::mapped_bytes`].
    #[must_use]
    pub fn mapped_bytes(&self) -> usize {
        self.buffer.mapped_bytes()
    }

    /// As [`VirtualBuffer::pages`].
    #[must_use]
    pub fn pages(&self) -> impl ExactSizeIterator<Item = PageInfo> + use<M> {
        self.buffer.pages()
    }

    /// As [`VirtualBuffer::stats`].
    #[must_use]
    pub fn stats(&self) -> BufferStats {
        self.buffer.stats()
    }
}

/// The views of a [`VirtualBuffer`] split from its growth ([`VirtualBuffer::split_growth`]): the
/// buffer's read-only and writable views, each checked as the buffer's own, a writable one borrowing
/// this handle exclusively. Not `Clone`: it is the one source of views while the split lives.
///
/// # Lifetimes
/// `'buf` is the exclusive borrow of the buffer that the split holds, shared by the two handles.
pub struct Views<'buf, M: AccessMode = ReadWrite> {
    buffer: &'buf VirtualBuffer<M>,
}

impl<M: AccessMode> fmt::Debug for Views<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Views").field(self.buffer).finish()
    }
}

impl<M: AccessMode> Views<'_, M> {
    /// As [`VirtualBuffer::slice_bytes`].
    ///
    /// # Errors
    /// As [`VirtualBuffer::slice_bytes`].
    pub fn slice_bytes<T: Pod>(
        &self,
        bytes: impl RangeBounds<usize>,
    ) -> Result<DeviceSlice<'_, T>, Error> {
        self.buffer.slice_bytes(bytes)
    }

    /// As [`VirtualBuffer::slice_bytes_on`].
    ///
    /// # Errors
    /// As [`VirtualBuffer::slice_bytes_on`].
    pub fn slice_bytes_on<T: Pod>(
        &self,
        device: Device,
        bytes: impl RangeBounds<usize>,
    ) -> Result<DeviceSlice<'_, T>, Error> {
        self.buffer.slice_bytes_on(device, bytes)
    }
}

impl Views<'_, ReadWrite> {
    /// As [`VirtualBuffer::slice_bytes_mut`]: borrows this handle exclusively, so it is the only
    /// view while it lives; the [`Growth`] stays available.
    ///
    /// # Errors
    /// As [`VirtualBuffer::slice_bytes_mut`].
    pub fn slice_bytes_mut<T: Pod>(
        &mut self,
        bytes: impl RangeBounds<usize>,
    ) -> Result<DeviceSliceMut<'_, T>, Error> {
        self.buffer.writable_view(bytes)
    }
}

impl VirtualBuffer<ReadWrite> {
    /// A writable view of `bytes` through `&self`, for [`Views::slice_bytes_mut`] alone (private to
    /// this file): the exclusive borrow of the [`Views`] handle, the one source of views while the
    /// split lives, makes it the only view, as `&mut self` does for
    /// [`slice_bytes_mut`](VirtualBuffer::slice_bytes_mut).
    fn writable_view<T: Pod>(
        &self,
        bytes: impl RangeBounds<usize>,
    ) -> Result<DeviceSliceMut<'_, T>, Error> {
        let (ptr, len) = self.view_range::<T>(bytes)?;
        let context = self.first_context()?;
        // Every byte is on a mapped page granted `ReadWrite` to every device of the access set
        // (checked), and stays so while the split lives: unmapping and changing the access set take
        // `&mut` of the buffer, which the split borrows; the growth maps only where nothing is.
        Ok(DeviceSliceMut::from_granted(
            ptr,
            len,
            context,
            Reach::Owned(&self.access),
        ))
    }
}
