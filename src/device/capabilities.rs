//! What a device can do, in one report, without a trial allocation: [`Device::capabilities`].
//!
//! An engine that moves memory beyond one GPU picks its path from a handful of device attributes:
//! VMM itself, POSIX file descriptors (processes of one machine), fabric handles and an IMEX
//! channel (multi-node `NVLink`), `GPUDirect` RDMA and dma-buf (a network adapter reading and
//! writing device memory), host-NUMA memory. Each is one `cuDeviceGetAttribute`, asked here
//! together; the IMEX channel is a device file of the process's machine, looked for without any
//! driver call. The peer access of a pair of devices is [`peer::pair_capabilities`]'s.
//!
//! [`peer::pair_capabilities`]: crate::peer::pair_capabilities

use std::sync::OnceLock;

use super::Device;
use crate::error::Result;
use crate::sys;

/// What a device can do with VMM memory beyond one process, as its attributes say
/// ([`Device::capabilities`]). Every field is a read of the driver's attributes, except
/// [`imex_channel`](Capabilities::imex_channel), a property of the machine; none is a trial
/// allocation. An attribute this driver does not know reads as `false`.
///
/// # Examples
/// ```no_run
/// use cuda_vmm::Device;
///
/// # fn main() -> cuda_vmm::Result<()> {
/// let caps = Device::get(0)?.capabilities()?;
/// if caps.dma_buf_export() {
///     println!("a NIC can register this device's VMM pages through dma-buf");
/// }
/// if !caps.fabric_usable() {
///     println!("no multi-node NVLink here: fabric handles {}, IMEX channel {:?}",
///              caps.fabric_handles, caps.imex_channel);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
// A report of independent yes-or-no attributes, one field each: no state machine hides in them.
#[allow(clippy::struct_excessive_bools)]
pub struct Capabilities {
    /// The device the report is of.
    pub device: Device,
    /// The VMM API (`CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`, 102).
    pub vmm: bool,
    /// Memory exportable as a POSIX file descriptor, to processes of this machine
    /// (`CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`, 103).
    pub posix_fd_handles: bool,
    /// Memory exportable as a fabric handle, within an IMEX domain
    /// (`CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED`, 128). The driver creates such memory
    /// only for a process with an IMEX channel ([`imex_channel`](Capabilities::imex_channel)).
    pub fabric_handles: bool,
    /// The lowest IMEX channel whose device file exists on this machine
    /// (`/dev/nvidia-caps-imex-channels/channel<N>`, see [`imex_channel`](super::imex_channel)):
    /// `None` where there is none, and the driver refuses fabric-shareable memory
    /// (`CUDA_ERROR_NOT_PERMITTED`).
    pub imex_channel: Option<u32>,
    /// `GPUDirect` RDMA: a network adapter may read and write the device's memory
    /// (`CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`, 116).
    pub gpu_direct_rdma: bool,
    /// VMM memory can be created `GPUDirect` RDMA capable
    /// ([`AllocationOptions::with_rdma`](crate::vmm::AllocationOptions::with_rdma);
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`, 110).
    pub gpu_direct_rdma_with_vmm: bool,
    /// Address ranges export as dma-buf file descriptors (`cuMemGetHandleForAddressRange`;
    /// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`, 124): what `ibv_reg_dmabuf_mr` and libfabric's
    /// and UCX's dma-buf registrations take.
    pub dma_buf: bool,
    /// VMM memory located on the host with no NUMA node
    /// (`CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`, 145; CUDA 13.0 and later).
    pub host_memory: bool,
    /// VMM memory located on a host NUMA node
    /// (`CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`, 141).
    pub host_numa_memory: bool,
    /// The host NUMA node closest to the device (`CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID`, 134), as
    /// [`Device::host_numa_node`].
    pub host_numa_node: Option<u16>,
    /// Host-NUMA memory shared between the nodes of a multi-node system
    /// (`CU_DEVICE_ATTRIBUTE_HOST_NUMA_MULTINODE_IPC_SUPPORTED`, 143).
    pub host_numa_multinode_ipc: bool,
}

impl Capabilities {
    /// Whether fabric-shareable memory can be made here: the device supports fabric handles and
    /// an IMEX channel exists. The driver may still refuse a process that cannot open the channel
    /// (`CUDA_ERROR_NOT_PERMITTED`); the allocation checks say so.
    #[must_use]
    pub fn fabric_usable(&self) -> bool {
        self.fabric_handles && self.imex_channel.is_some()
    }

    /// Whether a range of a [`VirtualBuffer`](crate::VirtualBuffer) of this device exports as
    /// dma-buf file descriptors (VMM and dma-buf support; `VirtualBuffer::export_dma_buf` on
    /// Unix).
    #[must_use]
    pub fn dma_buf_export(&self) -> bool {
        self.vmm && self.dma_buf
    }
}

impl Device {
    /// `cuDeviceGetAttribute` — the device's [`Capabilities`]: ten attributes and the
    /// machine's IMEX channel, with no allocation. An attribute the driver does not know (an older
    /// driver) reads as `false`.
    ///
    /// # Errors
    /// The driver's error other than `CUDA_ERROR_INVALID_VALUE` for an unknown attribute.
    ///
    /// # Examples
    /// ```no_run
    /// # fn main() -> cuda_vmm::Result<()> {
    /// for device in cuda_vmm::Device::all()? {
    ///     println!("{:?}", device.capabilities()?);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    #[doc(alias = "cuDeviceGetAttribute")]
    pub fn capabilities(self) -> Result<Capabilities> {
        Ok(Capabilities {
            device: self,
            vmm: self.has(sys::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)?,
            posix_fd_handles: self.supports_posix_fd_handles()?,
            fabric_handles: self.supports_fabric_handles()?,
            imex_channel: imex_channel(),
            gpu_direct_rdma: self.supports_gpu_direct_rdma()?,
            gpu_direct_rdma_with_vmm: self.supports_gpu_direct_rdma_with_vmm()?,
            dma_buf: self.supports_dma_buf()?,
            host_memory: self.supports_host_memory()?,
            host_numa_memory: self.supports_host_numa_memory()?,
            host_numa_node: self.host_numa_node()?,
            host_numa_multinode_ipc: self.supports_host_numa_multinode_ipc()?,
        })
    }

    /// `cuDeviceGetAttribute` — whether address ranges of the device export as dma-buf file
    /// descriptors (`CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`, CUDA 11.7 and later; `false` where the
    /// driver is older).
    ///
    /// # Errors
    /// The driver's error, if any.
    #[doc(alias = "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED")]
    pub fn supports_dma_buf(self) -> Result<bool> {
        self.has(sys::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)
    }

    /// `cuDeviceGetAttribute` — whether a network adapter may read and write the device's memory
    /// (`CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`, CUDA 11.3 and later). VMM memory needs
    /// its own flag besides ([`supports_gpu_direct_rdma_with_vmm`](Device::supports_gpu_direct_rdma_with_vmm)).
    ///
    /// # Errors
    /// The driver's error, if any.
    #[doc(alias = "CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED")]
    pub fn supports_gpu_direct_rdma(self) -> Result<bool> {
        self.has(sys::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED)
    }

    /// `cuDeviceGetAttribute` — whether host-NUMA memory can be shared between the nodes of a
    /// multi-node system (`CU_DEVICE_ATTRIBUTE_HOST_NUMA_MULTINODE_IPC_SUPPORTED`, CUDA 12.4 and
    /// later).
    ///
    /// # Errors
    /// The driver's error, if any.
    #[doc(alias = "CU_DEVICE_ATTRIBUTE_HOST_NUMA_MULTINODE_IPC_SUPPORTED")]
    pub fn supports_host_numa_multinode_ipc(self) -> Result<bool> {
        self.has(sys::CU_DEVICE_ATTRIBUTE_HOST_NUMA_MULTINODE_IPC_SUPPORTED)
    }
}

/// Where the driver's IMEX channel device files are (`channel0`, `channel1`, ...): the driver opens
/// one of them for every fabric-shareable allocation, and refuses the allocation
/// (`CUDA_ERROR_NOT_PERMITTED`) where the process has none.
pub const IMEX_CHANNEL_DIRECTORY: &str = "/dev/nvidia-caps-imex-channels";

/// The lowest IMEX channel of this machine: the number `N` of the lowest
/// `/dev/nvidia-caps-imex-channels/channel<N>` that is a character device, or `None` where there is
/// none (no IMEX service, or a container that was given no channel). No driver call: a directory
/// listing, made once per process (channels are created by the system, not while a process runs).
///
/// Fabric-shareable memory needs one: without it, [`ShareableAllocation::<Fabric>::new`], the
/// fabric handle kind of [`AllocationOptions`] and a fabric import are refused with
/// [`Error::NoImexChannel`](crate::Error::NoImexChannel) before any allocation. A channel that
/// exists but that the process may not open is left to the driver's refusal.
///
/// [`ShareableAllocation::<Fabric>::new`]: crate::ipc::ShareableAllocation::new
/// [`AllocationOptions`]: crate::vmm::AllocationOptions
///
/// # Examples
/// ```
/// match cuda_vmm::device::imex_channel() {
///     Some(channel) => println!("IMEX channel {channel}: fabric handles can be tried"),
///     None => println!("no IMEX channel: no fabric-shareable memory in this process"),
/// }
/// ```
#[must_use]
pub fn imex_channel() -> Option<u32> {
    static FOUND: OnceLock<Option<u32>> = OnceLock::new();
    *FOUND.get_or_init(|| lowest_channel(IMEX_CHANNEL_DIRECTORY))
}

/// The lowest `channel<N>` character device in `directory`.
#[cfg(unix)]
fn lowest_channel(directory: &str) -> Option<u32> {
    use std::os::unix::fs::FileTypeExt;
    std::fs::read_dir(directory)
        .ok()?
        .filter_map(core::result::Result::ok)
        .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_char_device()))
        .filter_map(|entry| channel_number(entry.file_name().to_str()?))
        .min()
}

/// No IMEX channels off Unix.
#[cfg(not(unix))]
fn lowest_channel(_directory: &str) -> Option<u32> {
    None
}

/// `N` of a file named `channel<N>` (decimal digits only).
fn channel_number(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("channel")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::{channel_number, lowest_channel};

    #[test]
    fn channel_files_are_named_by_their_number() {
        assert_eq!(channel_number("channel0"), Some(0));
        assert_eq!(channel_number("channel2047"), Some(2047));
        assert_eq!(channel_number("channel"), None);
        assert_eq!(channel_number("channel+1"), None);
        assert_eq!(channel_number("channel1a"), None);
        assert_eq!(channel_number("chan0"), None);
        assert_eq!(channel_number("channel99999999999"), None, "too large");
    }

    #[cfg(unix)]
    #[test]
    fn only_character_devices_count() {
        let dir = std::env::temp_dir().join(format!("cuda-vmm-imex-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A regular file named like a channel is not a channel.
        std::fs::write(dir.join("channel0"), b"").unwrap();
        assert_eq!(lowest_channel(dir.to_str().unwrap()), None);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(lowest_channel("/nonexistent/imex"), None);
    }
}
