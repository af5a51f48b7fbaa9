//! The capability report (`Device::capabilities`, `peer::pair_capabilities`) against the driver's
//! own answers to raw `cuDeviceGetAttribute` and `cuDeviceCanAccessPeer` calls, and the IMEX
//! channel against a listing of its directory made here. Each GPU test prints every attribute it
//! read, so a run records what the machine can do (dma-buf, RDMA with VMM, fabric, host NUMA).
//! The IMEX test needs no GPU.

mod common;

use cuda_vmm::device::{IMEX_CHANNEL_DIRECTORY, imex_channel};
use cuda_vmm::peer::{can_access_peer, p2p_attributes, pair_capabilities};
use cuda_vmm::vmm::HandleKinds;

unsafe extern "C" {
    fn cuDeviceGetAttribute(value: *mut i32, attribute: i32, device: i32) -> u32;
}

/// `cuDeviceGetAttribute`, raw: the value, or `None` where the driver does not know the attribute
/// (`CUDA_ERROR_INVALID_VALUE`); any other refusal fails the test.
fn raw_attribute(device: i32, attribute: i32) -> Option<i32> {
    let mut value = 0;
    // SAFETY: `value` is writable for the call; `device` is an ordinal the driver listed.
    let code = unsafe { cuDeviceGetAttribute(&raw mut value, attribute, device) };
    match code {
        0 => Some(value),
        1 => None,
        other => panic!(
            "cuDeviceGetAttribute({attribute}): {}",
            common::code_name(other)
        ),
    }
}

/// The attributes the report reads, by number, with their names.
const ATTRIBUTES: [(i32, &str); 10] = [
    (102, "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED"),
    (103, "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED"),
    (110, "GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED"),
    (116, "GPU_DIRECT_RDMA_SUPPORTED"),
    (124, "DMA_BUF_SUPPORTED"),
    (128, "HANDLE_TYPE_FABRIC_SUPPORTED"),
    (134, "HOST_NUMA_ID"),
    (141, "HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED"),
    (143, "HOST_NUMA_MULTINODE_IPC_SUPPORTED"),
    (145, "HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED"),
];

#[test]
fn the_report_is_the_drivers_attributes() {
    const TEST: &str = "the_report_is_the_drivers_attributes";
    let Some(devices) = common::devices_or_skip(TEST, 1) else {
        return;
    };
    for device in devices {
        let caps = device.capabilities().unwrap();
        let raw = |attribute| raw_attribute(device.as_raw(), attribute);
        let yes = |attribute| raw(attribute).is_some_and(|v| v != 0);
        for (attribute, name) in ATTRIBUTES {
            println!(
                "{device:?}: CU_DEVICE_ATTRIBUTE_{name} ({attribute}) = {}",
                raw(attribute)
                    .map_or_else(|| "unknown to this driver".to_owned(), |v| v.to_string())
            );
        }
        println!("{device:?}: {caps:?}");
        assert_eq!(caps.device, device);
        assert_eq!(caps.vmm, yes(102));
        assert_eq!(caps.posix_fd_handles, yes(103));
        assert_eq!(caps.gpu_direct_rdma_with_vmm, yes(110));
        assert_eq!(caps.gpu_direct_rdma, yes(116));
        assert_eq!(caps.dma_buf, yes(124));
        assert_eq!(caps.fabric_handles, yes(128));
        assert_eq!(
            caps.host_numa_node,
            raw(134).and_then(|v| u16::try_from(v).ok())
        );
        assert_eq!(caps.host_numa_memory, yes(141));
        assert_eq!(caps.host_numa_multinode_ipc, yes(143));
        assert_eq!(caps.host_memory, yes(145));
        assert_eq!(caps.imex_channel, imex_channel());
        assert_eq!(caps.fabric_usable(), yes(128) && imex_channel().is_some());
        assert_eq!(caps.dma_buf_export(), yes(102) && yes(124));
        let kinds = caps.handle_kinds();
        assert_eq!(kinds.contains(HandleKinds::POSIX_FD), yes(103));
        assert_eq!(kinds.contains(HandleKinds::FABRIC), caps.fabric_usable());
        // The device's own queries agree with the report.
        assert_eq!(device.supports_dma_buf().unwrap(), caps.dma_buf);
        assert_eq!(
            device.supports_gpu_direct_rdma().unwrap(),
            caps.gpu_direct_rdma
        );
        assert_eq!(
            device.supports_host_numa_multinode_ipc().unwrap(),
            caps.host_numa_multinode_ipc
        );
    }
}

/// Every ordered pair's report is `can_access_peer` and `p2p_attributes`; a device and itself have
/// no link. The pair part needs two GPUs and skips visibly with one.
#[test]
fn pair_reports_are_the_drivers_answers() {
    const TEST: &str = "pair_reports_are_the_drivers_answers";
    let Some(devices) = common::devices_or_skip(TEST, 1) else {
        return;
    };
    let first = devices[0];
    let itself = pair_capabilities(first, first).unwrap();
    assert!(!itself.peer_access);
    assert_eq!(itself.attributes, None);
    if devices.len() < 2 {
        common::skip(&format!(
            "SKIPPED {TEST} (pairs of devices): needs 2 CUDA devices, the driver reports 1"
        ));
        return;
    }
    for &from in &devices {
        for &to in devices.iter().filter(|&&to| to != from) {
            let pair = pair_capabilities(from, to).unwrap();
            println!("{pair:?}");
            assert_eq!((pair.from, pair.to), (from, to));
            assert_eq!(
                pair.peer_access,
                can_access_peer(from, to).unwrap().is_some()
            );
            assert_eq!(pair.attributes, Some(p2p_attributes(from, to).unwrap()));
        }
    }
}

/// Needs no GPU: the IMEX channel is the lowest `channel<N>` character device of the directory,
/// as listed here, and the process's answer does not change.
#[cfg(unix)]
#[test]
fn the_imex_channel_is_the_lowest_channel_device() {
    use std::os::unix::fs::FileTypeExt;
    let listed = std::fs::read_dir(IMEX_CHANNEL_DIRECTORY).map_or(Vec::new(), |entries| {
        entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_char_device()))
            .filter_map(|e| {
                e.file_name()
                    .to_str()?
                    .strip_prefix("channel")?
                    .parse::<u32>()
                    .ok()
            })
            .collect()
    });
    let found = imex_channel();
    println!(
        "{IMEX_CHANNEL_DIRECTORY}: channels {listed:?}; imex_channel() = {found:?} (fabric \
         handles {} on this machine)",
        if found.is_some() {
            "can be tried"
        } else {
            "are refused before any allocation"
        }
    );
    assert_eq!(found, listed.iter().copied().min());
    assert_eq!(imex_channel(), found, "asked once per process");
}
