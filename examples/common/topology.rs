//! The device table, the capability report of every device (what it can do beyond one process,
//! and the path an engine takes from it), and the device × device peer tables, shared by
//! `examples/topology.rs` and `examples/tour.rs` (each includes it with
//! `#[path = "common/topology.rs"] mod topology;`).
//!
//! Written for any number of devices: every table has one row per device or per ordered pair.

use cuda_vmm::{
    Device, Error, Granularity, allocation_granularity, device::Capabilities, peer::P2PAttributes,
    peer::PairCapabilities, peer::pair_capabilities,
};

/// Prints the per-device table, every device's capability report and the paths it offers, and, with
/// two or more devices, the peer-access matrix, a line on it and the P2P attributes of every
/// ordered pair.
///
/// # Errors
/// The first driver error of a query.
pub(crate) fn print(devices: &[Device]) -> Result<(), Error> {
    print_devices(devices)?;
    print_capabilities(devices)?;
    if devices.len() < 2 {
        println!(
            "\n  the device x device peer matrix needs two devices; found {}",
            devices.len()
        );
        return Ok(());
    }

    let n = devices.len();
    // pairs[i][j]: the report of the direction GPU i -> GPU j (cuDeviceCanAccessPeer and the P2P
    // attributes, `peer::pair_capabilities`); for i == j, no link.
    let mut pairs = Vec::with_capacity(n);
    for &from in devices {
        let row = devices
            .iter()
            .map(|&to| pair_capabilities(from, to))
            .collect::<Result<Vec<_>, _>>()?;
        pairs.push(row);
    }
    let links: Vec<Vec<bool>> = pairs
        .iter()
        .map(|row| row.iter().map(|pair| pair.peer_access).collect())
        .collect();

    print_matrix(
        "peer access: can the row's GPU access the column's GPU's memory? (cuDeviceCanAccessPeer)",
        "directional: an answer for i -> j says nothing about j -> i",
        devices,
        |i, j| yes_no(links[i][j]).to_owned(),
    );
    println!(
        "\n  copy_between with Route::Auto goes direct (one cuMemcpyDtoD over the link) only where the \
         source view is open to the destination's GPU (a VMM grant naming it, or a peer view under a \
         PeerAccess guard), which needs a 'yes' above; everywhere else it stages through pinned host \
         memory."
    );
    print_pairs(&pairs);
    Ok(())
}

/// One row per device: what `Device::capabilities` reports (each a driver attribute, with no trial
/// allocation; the IMEX channel a device file of the machine), then the path each device offers
/// an engine that moves memory beyond one process.
fn print_capabilities(devices: &[Device]) -> Result<(), Error> {
    let reports = devices
        .iter()
        .map(|&device| device.capabilities())
        .collect::<Result<Vec<_>, _>>()?;
    println!(
        "\n  what each device can do beyond one process (Device::capabilities: device attributes, \
         no trial allocation)"
    );
    println!(
        "    {:<4} {:<8} {:<6} {:<12} {:<5} {:<8} {:<7} {:<4} {:<14} NUMA multi-node IPC",
        "GPU",
        "POSIX fd",
        "fabric",
        "IMEX channel",
        "RDMA",
        "RDMA+VMM",
        "dma-buf",
        "host",
        "host NUMA"
    );
    for caps in &reports {
        let channel = caps
            .imex_channel
            .map_or_else(|| "none".to_owned(), |c| format!("channel{c}"));
        let numa = match (caps.host_numa_memory, caps.host_numa_node) {
            (true, Some(node)) => format!("yes (node {node})"),
            (true, None) => "yes".to_owned(),
            (false, _) => "no".to_owned(),
        };
        println!(
            "    {:<4} {:<8} {:<6} {:<12} {:<5} {:<8} {:<7} {:<4} {:<14} {}",
            caps.device.ordinal(),
            yes_no(caps.posix_fd_handles),
            yes_no(caps.fabric_handles),
            channel,
            yes_no(caps.gpu_direct_rdma),
            yes_no(caps.gpu_direct_rdma_with_vmm),
            yes_no(caps.dma_buf),
            yes_no(caps.host_memory),
            numa,
            yes_no(caps.host_numa_multinode_ipc)
        );
    }
    println!("\n  the paths each device offers (picked from the report above):");
    for caps in &reports {
        for line in paths(caps) {
            println!("    GPU {}: {line}", caps.device.ordinal());
        }
    }
    Ok(())
}

/// The ways `caps`' device shares its VMM memory beyond one process: with other processes of this
/// machine, with other machines over `NVLink`, and with a network adapter.
fn paths(caps: &Capabilities) -> [String; 3] {
    let processes = if caps.posix_fd_handles {
        "other processes of this machine: POSIX file descriptors (ShareableAllocation<PosixFd>, \
         ExportableBuffer)"
            .to_owned()
    } else {
        "other processes of this machine: none (no POSIX-fd handles)".to_owned()
    };
    let nodes = match (caps.fabric_handles, caps.imex_channel) {
        (true, Some(channel)) => format!(
            "other machines over NVLink: fabric handles (ShareableAllocation<Fabric>, IMEX \
             channel {channel})"
        ),
        (true, None) => "other machines over NVLink: none here: fabric handles need an IMEX \
                         channel, and this machine has none (refused before any allocation)"
            .to_owned(),
        (false, _) => "other machines over NVLink: none (no fabric handles)".to_owned(),
    };
    let network = if caps.dma_buf_export() {
        format!(
            "a network adapter: dma-buf descriptors of VirtualBuffer ranges \
             (VirtualBuffer::export_dma_buf){}",
            if caps.gpu_direct_rdma_with_vmm {
                ", pages made GPUDirect RDMA capable (PageOptions::with_rdma)"
            } else {
                ""
            }
        )
    } else if caps.gpu_direct_rdma {
        "a network adapter: GPUDirect RDMA without dma-buf (the adapter's peer-memory module)"
            .to_owned()
    } else {
        "a network adapter: none directly: stage through host memory".to_owned()
    };
    [processes, nodes, network]
}

/// One row per device: name, VMM support and the two allocation granularities.
fn print_devices(devices: &[Device]) -> Result<(), Error> {
    let mut rows = Vec::with_capacity(devices.len());
    for &device in devices {
        let vmm = device.supports_vmm()?;
        // Granularity is a VMM property: a device without VMM support has none to report.
        let granularity = if vmm {
            format!(
                "{} / {}",
                bytes(allocation_granularity(device, Granularity::Minimum)?),
                bytes(allocation_granularity(device, Granularity::Recommended)?)
            )
        } else {
            "n/a".to_owned()
        };
        rows.push((device.ordinal(), device.name()?, yes_no(vmm), granularity));
    }
    let name_width = rows
        .iter()
        .map(|r| r.1.len())
        .chain(["name".len()])
        .max()
        .unwrap_or(0);
    println!("\n  devices ({}):", devices.len());
    println!(
        "    {:<4} {:<name_width$}  {:<4} granularity (minimum / recommended)",
        "GPU", "name", "VMM"
    );
    for (ordinal, name, vmm, granularity) in rows {
        println!("    {ordinal:<4} {name:<name_width$}  {vmm:<4} {granularity}");
    }
    Ok(())
}

/// A device × device matrix: rows and columns are GPUs, the diagonal is `-`.
fn print_matrix(
    title: &str,
    legend: &str,
    devices: &[Device],
    cell: impl Fn(usize, usize) -> String,
) {
    let n = devices.len();
    let labels: Vec<String> = devices
        .iter()
        .map(|d| format!("GPU {}", d.ordinal()))
        .collect();
    let cells: Vec<Vec<String>> = (0..n)
        .map(|i| {
            (0..n)
                .map(|j| if i == j { "-".to_owned() } else { cell(i, j) })
                .collect()
        })
        .collect();
    let width = labels
        .iter()
        .chain(cells.iter().flatten())
        .map(String::len)
        .max()
        .unwrap_or(0);
    println!("\n  {title}");
    println!("  {legend}");
    print!("    {:<width$}", "");
    for label in &labels {
        print!("  {label:>width$}");
    }
    println!();
    for (label, row) in labels.iter().zip(&cells) {
        print!("    {label:<width$}");
        for cell in row {
            print!("  {cell:>width$}");
        }
        println!();
    }
}

/// One row per ordered pair: peer access and the driver's P2P attributes of that direction, from
/// its report.
fn print_pairs(pairs: &[Vec<PairCapabilities>]) {
    println!(
        "\n  P2P attributes of each direction (cuDeviceGetP2PAttribute); lower rank is faster"
    );
    println!(
        "    {:<16} {:<11} {:<9} {:<16} {:<14} CUDA array access",
        "from -> to", "peer access", "perf rank", "access supported", "native atomics"
    );
    let mut disagreements = Vec::new();
    let mut count = 0usize;
    for pair in pairs.iter().flatten() {
        // A device and itself: no link, no attributes.
        let Some(P2PAttributes {
            performance_rank,
            access_supported,
            native_atomics,
            cuda_array_access,
            ..
        }) = pair.attributes
        else {
            continue;
        };
        count += 1;
        let name = format!("GPU {} -> GPU {}", pair.from.ordinal(), pair.to.ordinal());
        println!(
            "    {name:<16} {:<11} {performance_rank:<9} {:<16} {:<14} {}",
            yes_no(pair.peer_access),
            yes_no(access_supported),
            yes_no(native_atomics),
            yes_no(cuda_array_access)
        );
        if access_supported != pair.peer_access {
            disagreements.push(name);
        }
    }
    if disagreements.is_empty() {
        println!(
            "  checked: cuDeviceCanAccessPeer and ACCESS_SUPPORTED agree for all {count} ordered pairs"
        );
    } else {
        println!(
            "  note: cuDeviceCanAccessPeer and ACCESS_SUPPORTED disagree for {}; PeerAccess::enable \
             follows cuDeviceCanAccessPeer (the PeerLink)",
            disagreements.join(", ")
        );
    }
}

fn yes_no(value: bool) -> &'static str {
    if value { "yes" } else { "no" }
}

/// A byte count in the largest binary unit that divides it exactly.
fn bytes(n: usize) -> String {
    match n {
        0 => "0 B".to_owned(),
        n if n.is_multiple_of(1 << 30) => format!("{} GiB", n >> 30),
        n if n.is_multiple_of(1 << 20) => format!("{} MiB", n >> 20),
        n if n.is_multiple_of(1 << 10) => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}
