//! The device table and the device × device peer tables, shared by `examples/topology.rs` and
//! `examples/tour.rs` (each includes it with `#[path = "common/topology.rs"] mod topology;`).
//!
//! Written for any number of devices: every table has one row per device or per ordered pair.

use cuda_vmm::{
    Device, Error, Granularity, allocation_granularity, peer::P2PAttributes, peer::can_access_peer,
    peer::p2p_attributes,
};

/// Prints the per-device table and, with two or more devices, the peer-access matrix, a line on
/// matrix and the P2P attributes of every ordered pair.
///
/// # Errors
/// The first driver error of a query.
pub(crate) fn print(devices: &[Device]) -> Result<(), Error> {
    print_devices(devices)?;
    if devices.len() < 2 {
        println!(
            "\n  the device x device peer matrix needs two devices; found {}",
            devices.len()
        );
        return Ok(());
    }

    let n = devices.len();
    // links[i][j]: can GPU i access GPU j's memory directly (cuDeviceCanAccessPeer)? Directional.
    let mut links = vec![vec![false; n]; n];
    for (i, &from) in devices.iter().enumerate() {
        for (j, &to) in devices.iter().enumerate() {
            if i != j {
                links[i][j] = can_access_peer(from, to)?.is_some();
            }
        }
    }

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
    print_pairs(devices, &links)
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

/// One row per ordered pair: peer access and the driver's P2P attributes of that direction.
fn print_pairs(devices: &[Device], links: &[Vec<bool>]) -> Result<(), Error> {
    println!(
        "\n  P2P attributes of each direction (cuDeviceGetP2PAttribute); lower rank is faster"
    );
    println!(
        "    {:<16} {:<11} {:<9} {:<16} {:<14} CUDA array access",
        "from -> to", "peer access", "perf rank", "access supported", "native atomics"
    );
    let mut disagreements = Vec::new();
    for (i, &from) in devices.iter().enumerate() {
        for (j, &to) in devices.iter().enumerate() {
            if i == j {
                continue;
            }
            let P2PAttributes {
                performance_rank,
                access_supported,
                native_atomics,
                cuda_array_access,
                ..
            } = p2p_attributes(from, to)?;
            let pair = format!("GPU {} -> GPU {}", from.ordinal(), to.ordinal());
            println!(
                "    {pair:<16} {:<11} {performance_rank:<9} {:<16} {:<14} {}",
                yes_no(links[i][j]),
                yes_no(access_supported),
                yes_no(native_atomics),
                yes_no(cuda_array_access)
            );
            if access_supported != links[i][j] {
                disagreements.push(pair);
            }
        }
    }
    let pairs = devices.len() * (devices.len() - 1);
    if disagreements.is_empty() {
        println!(
            "  checked: cuDeviceCanAccessPeer and ACCESS_SUPPORTED agree for all {pairs} ordered pairs"
        );
    } else {
        println!(
            "  note: cuDeviceCanAccessPeer and ACCESS_SUPPORTED disagree for {}; PeerAccess::enable \
             follows cuDeviceCanAccessPeer (the PeerLink)",
            disagreements.join(", ")
        );
    }
    Ok(())
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
