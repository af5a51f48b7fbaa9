//! Physical memory on GPU 0, mapped and granted to every device that can reach it.
//!
//! - (a) The chapter's pattern: one physical allocation mapped at two addresses (two reservations), each
//!   mapping granted to every device; GPU 0 writes through one address and each other GPU reads through
//!   the other, and back.
//! - (b) The better pattern: one reservation, one mapping, granted to every device in one
//!   `grant_all`. Every device sees the memory at the same numeric address: GPU 0 writes there,
//!   each other GPU reads there, and the `add_one` kernel runs on each other GPU reading the memory
//!   at that address. Then a revocable grant (`grant_revocable`) opens the mapping to one peer at a
//!   time and is revoked.
//! - The fallback: `copy_between` from GPU 0's view into a buffer of each other GPU, with
//!   `Route::Direct` (over the link, for the granted GPUs; refused for the others) and `Route::Staged`
//!   (same bytes), and `Route::Auto` (which reports its path).
//!
//! No context peer access (`PeerAccess`) is enabled anywhere: it does not open VMM mappings. A VMM
//! mapping is opened to a device by a grant (`cuMemSetAccess`) alone.
//!
//! Needs two devices with VMM support; with fewer it says what it found. Run with
//! `./with-libcuda cargo run --example cross_gpu_vmm_roundtrip`.

// Each example is its own crate, and this one uses only part of the shared module: not
// `exit_code_with_cause` or `verify_debug`.
#[allow(dead_code)]
mod common;

use std::process::ExitCode;

use common::{AddOne, ExampleResult, check, pattern, two_or_more_devices_or_none, verify};
use cuda_vmm::{
    Context, Device, DeviceBuffer, DeviceSlice, Error, Granularity, PhysicalAllocation, ReadWrite,
    VirtualReservation, align_size, allocation_granularity, copy_between, peer::CopyPath,
    peer::Route, peer::can_access_peer,
};

/// The chapter's request for pattern (a), rounded up to the granularity.
const CHAPTER_BYTES: usize = 4096;

/// The request for pattern (b): 20 MiB, so that the staged copy moves two full chunks of
/// `STAGING_CHUNK_BYTES` (8 MiB) and a partial one.
const SHARED_BYTES: usize = 20 << 20;

fn main() -> ExitCode {
    common::exit_code("cross_gpu_vmm_roundtrip", run())
}

fn run() -> ExampleResult {
    println!("cross_gpu_vmm_roundtrip: GPU 0's physical memory, mapped for every device");
    let Some(devices) = two_or_more_devices_or_none(
        "there is no cross-GPU mapping to make",
        "the P2P path is skipped",
    )?
    else {
        return Ok(());
    };
    for &device in &devices {
        if !device.supports_vmm()? {
            println!(
                "GPU {} has no VMM support: this example needs it on every device; skipped",
                device.ordinal()
            );
            return Ok(());
        }
    }
    let contexts: Vec<Context> = devices
        .iter()
        .map(|&d| Context::new(d))
        .collect::<Result<_, _>>()?;
    let home = &contexts[0];

    // A grant opens a mapping to a device only where that device can reach the memory's device: grant
    // GPU 0's memory to GPU 0 and every device that can access GPU 0. The others still get the data,
    // through the staged fallback below.
    let mut granted: Vec<&Context> = vec![home];
    for context in &contexts[1..] {
        let gpu = context.device().ordinal();
        if can_access_peer(context.device(), home.device())?.is_some() {
            println!("  GPU {gpu} can access GPU 0: it is granted GPU 0's memory");
            granted.push(context);
        } else {
            println!(
                "  GPU {gpu} cannot access GPU 0: not granted; it gets the data by the staged copy"
            );
        }
    }
    println!(
        "  no PeerAccess is enabled in this example: VMM mappings are opened by cuMemSetAccess alone"
    );

    let granularity = allocation_granularity(home.device(), Granularity::Minimum)?;
    if granted.len() > 1 {
        two_addresses(&granted, granularity)?;
    } else {
        println!("\n(a) skipped: no other device can access GPU 0's memory");
    }
    one_address(&contexts, &granted, granularity)?;
    println!("\ncross_gpu_vmm_roundtrip: every check passed");
    Ok(())
}

/// (a) The chapter's pattern: one physical allocation on GPU 0 mapped in two reservations, so at two
/// addresses; both mappings granted to every device in `granted` (GPU 0 first).
fn two_addresses(granted: &[&Context], granularity: usize) -> ExampleResult {
    println!("\n(a) one physical allocation, two reservations, two addresses");
    let home = granted[0].device();
    let size = align_size(CHAPTER_BYTES, granularity)?;
    let physical = PhysicalAllocation::new(home, size)?;
    let mut reservation_a = VirtualReservation::new(size, 0)?;
    let mut reservation_b = VirtualReservation::new(size, 0)?;
    // Both mappings borrow `physical` (shared: aliases are allowed) and their own reservation.
    let mut mapping_a = reservation_a.region().map(&physical)?;
    let mut mapping_b = reservation_b.region().map(&physical)?;
    {
        let mut access_a = mapping_a.grant_all(granted, ReadWrite)?;
        let mut access_b = mapping_b.grant_all(granted, ReadWrite)?;
        let (a, b) = (access_a.as_raw_ptr(), access_b.as_raw_ptr());
        println!(
            "  {size} B of GPU 0 mapped at A = {a:#x} and B = {b:#x}, each granted to GPUs {}",
            ordinals(&access_a.devices())
        );
        check(
            a != b,
            "  the driver picked two different addresses: each access path uses its own",
        )?;

        for peer in &granted[1..] {
            let gpu = peer.device().ordinal();
            let input = pattern(size / 4, 0xa000 + gpu as u32);
            access_a.slice_mut_on::<u32>(home)?.copy_from_host(&input)?;
            verify(
                &format!("  GPU 0 wrote through A, GPU {gpu} read through B"),
                &access_b.slice_on::<u32>(peer.device())?.to_vec()?,
                &input,
            )?;
            let reply = pattern(size / 4, 0xb000 + gpu as u32);
            access_b
                .slice_mut_on::<u32>(peer.device())?
                .copy_from_host(&reply)?;
            verify(
                &format!("  GPU {gpu} wrote through B, GPU 0 read through A"),
                &access_a.slice_on::<u32>(home)?.to_vec()?,
                &reply,
            )?;
        }
        // Every copy has finished when it returns: nothing uses the mappings past this point.
    }

    // Teardown: mappings, then reservations, then the memory; any other order does not compile.
    mapping_b.unmap()?;
    mapping_a.unmap()?;
    reservation_b.free()?;
    reservation_a.free()?;
    physical.release()?;
    println!(
        "  teardown: unmap B, unmap A, free both reservations, release the memory: reported success"
    );
    Ok(())
}

/// (b) One reservation, one mapping, one address for every device in `granted` (GPU 0 first), a
/// kernel on each peer reading it, revocable grants, and the fallback copies to every other device
/// in `contexts`.
fn one_address(contexts: &[Context], granted: &[&Context], granularity: usize) -> ExampleResult {
    println!("\n(b) one reservation, one mapping, one address on every granted device");
    let home = granted[0].device();
    let size = align_size(SHARED_BYTES, granularity)?;
    let len = size / size_of::<u32>();
    let physical = PhysicalAllocation::new(home, size)?;
    let mut reservation = VirtualReservation::new(size, 0)?;
    let mut mapping = reservation.region().map(&physical)?;
    let input = pattern(len, 0x5eed);
    let plus_one: Vec<u32> = input.iter().map(|x| x.wrapping_add(1)).collect();

    {
        let mut access = mapping.grant_all(granted, ReadWrite)?;
        let address = access.as_raw_ptr();
        println!(
            "  grant_all (one cuMemSetAccess): {size} B of GPU 0 at {address:#x}, read-write for GPUs {}",
            ordinals(&access.devices())
        );
        for device in access.devices() {
            let at = access.slice_on::<u32>(device)?.as_raw_ptr();
            check(
                at == address,
                &format!("  GPU {} sees the memory at {at:#x}", device.ordinal()),
            )?;
        }

        access.slice_mut_on::<u32>(home)?.copy_from_host(&input)?;
        println!("  GPU 0 wrote {size} B at {address:#x}");
        for peer in &granted[1..] {
            let gpu = peer.device().ordinal();
            let view = access.slice_on::<u32>(peer.device())?;
            verify(
                &format!("  GPU {gpu} read {address:#x} (copy on GPU {gpu})"),
                &view.to_vec()?,
                &input,
            )?;
            let kernel = AddOne::load(peer)?;
            let mut out = DeviceBuffer::<u32>::zeroed(peer, len)?;
            // SAFETY: `out` is a buffer just allocated on this GPU, so it does not overlap `view`
            // (GPU 0's physical memory); nothing else writes either while the kernel runs: this
            // example has one thread, and every copy of the crate has finished when it returns.
            unsafe { kernel.run(&mut out.as_mut_slice(), &view) }?;
            verify(
                &format!(
                    "  add_one on GPU {gpu} read {address:#x} (GPU 0's memory), wrote GPU {gpu}'s buffer"
                ),
                &out.as_slice().to_vec()?,
                &plus_one,
            )?;
        }

        fallback(contexts, &access.slice_on::<u32>(home)?, &input)?;
    }

    // A revocable grant: opened to one peer, revoked when it ends. The mapping is borrowed by the
    // revocable grant, so no view of it outlives the revocation.
    for peer in &granted[1..] {
        let gpu = peer.device().ordinal();
        let only_peer = [*peer];
        let scoped = mapping.grant_revocable(&only_peer, ReadWrite)?;
        verify(
            &format!(
                "  grant_revocable to GPU {gpu} alone: GPU {gpu} reads {address:#x}",
                address = scoped.as_raw_ptr()
            ),
            &scoped.slice::<u32>()?.to_vec()?,
            &input,
        )?;
        scoped.revoke()?;
        println!(
            "  revoke(): GPU {gpu} synchronised, its access set back to none (cuMemSetAccess): reported success"
        );
    }
    {
        let access = mapping.grant(granted[0], ReadWrite)?;
        verify(
            "  granted to GPU 0 alone again: the memory still holds what GPU 0 wrote",
            &access.slice::<u32>()?.to_vec()?,
            &input,
        )?;
        if let Some(peer) = granted.get(1) {
            let gpu = peer.device().ordinal();
            match access.slice_on::<u32>(peer.device()) {
                Err(Error::DeviceMismatch { .. }) => println!(
                    "  a view for GPU {gpu} from GPU 0's grant: refused (DeviceMismatch): ok"
                ),
                Ok(_) => return Err(format!("GPU 0's grant gave a view for GPU {gpu}").into()),
                Err(e) => return Err(e.into()),
            }
        }
    }

    let region = mapping.unmap()?;
    println!(
        "  teardown: unmap: reported success ({} B at {:#x} free to map again)",
        region.len(),
        region.start()
    );
    reservation.free()?;
    physical.release()?;
    println!("  teardown: free the reservation, release the memory: reported success");
    Ok(())
}

/// The fallback for devices that cannot reach each other: `copy_between` from `src` (GPU 0's view)
/// into a buffer of every other device, by each route.
fn fallback(contexts: &[Context], src: &DeviceSlice<'_, u32>, input: &[u32]) -> ExampleResult {
    println!("  copy_between from GPU 0's view into a buffer of each other GPU:");
    for context in contexts.iter().filter(|c| c.device() != src.device()) {
        let gpu = context.device().ordinal();
        let mut direct = DeviceBuffer::<u32>::zeroed(context, src.len())?;
        let mut staged = DeviceBuffer::<u32>::zeroed(context, src.len())?;
        let mut auto = DeviceBuffer::<u32>::zeroed(context, src.len())?;

        // The source view comes from a grant to every device that can reach GPU 0: the direct path is
        // open exactly to those.
        let open = src.reachable_from(context.device());
        match copy_between(&mut direct.as_mut_slice(), src, Route::Direct) {
            Ok(path) => check(
                open && path == CopyPath::Direct,
                &format!("    Route::Direct into GPU {gpu} (granted): took {path:?}"),
            )?,
            Err(Error::NoPeerAccess { .. }) if !open => {
                println!(
                    "    Route::Direct into GPU {gpu} (not granted): refused (NoPeerAccess): ok"
                );
                copy_between(&mut direct.as_mut_slice(), src, Route::Staged)?;
            }
            Err(e) => return Err(e.into()),
        }
        let path = copy_between(&mut staged.as_mut_slice(), src, Route::Staged)?;
        check(
            path == CopyPath::Staged,
            &format!("    Route::Staged into GPU {gpu} took {path:?}"),
        )?;
        let direct_bytes = direct.as_slice().to_vec()?;
        verify(
            &format!("    Route::Direct into GPU {gpu}: the bytes GPU 0 wrote"),
            &direct_bytes,
            input,
        )?;
        verify(
            &format!("    Route::Staged into GPU {gpu}: identical to Route::Direct"),
            &staged.as_slice().to_vec()?,
            &direct_bytes,
        )?;

        let path = copy_between(&mut auto.as_mut_slice(), src, Route::Auto)?;
        let expected = if open {
            CopyPath::Direct
        } else {
            CopyPath::Staged
        };
        check(
            path == expected,
            &format!(
                "    Route::Auto into GPU {gpu} took {path:?} (GPU 0's memory {} open to GPU {gpu})",
                if open { "is" } else { "is not" }
            ),
        )?;
        verify(
            &format!("    Route::Auto into GPU {gpu}: the bytes GPU 0 wrote"),
            &auto.as_slice().to_vec()?,
            input,
        )?;
    }
    Ok(())
}

/// "0, 1, 2" for a list of devices.
fn ordinals(devices: &[Device]) -> String {
    devices
        .iter()
        .map(|d| d.ordinal().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
