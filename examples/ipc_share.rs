//! Two processes share one buffer of device memory. The parent allocates memory created shareable
//! (`ShareableAllocation<PosixFd>`), writes a pattern, exports it as a POSIX file descriptor and sends
//! it, with the size and device an importer needs, over a Unix socket (`SCM_RIGHTS`) to a child: this
//! same program, started again with `--child`, its standard input being its end of the socket. The
//! child imports the memory, maps and grants it, checks the parent's bytes, writes its own and says
//! so; the parent reads the child's bytes through its own mapping of the same memory.
//!
//! Without a GPU it says why there is nothing to share and exits successfully.
//!
//! Run with `./with-libcuda cargo run --example ipc_share`.

// Each example is its own crate, and this one uses only part of the shared module.
#[allow(dead_code)]
mod common;

#[cfg(unix)]
fn main() -> std::process::ExitCode {
    if std::env::args().nth(1).as_deref() == Some("--child") {
        return common::exit_code("ipc_share (child)", shared::child());
    }
    common::exit_code("ipc_share", shared::parent())
}

#[cfg(not(unix))]
fn main() {
    println!("ipc_share: passing file descriptors between processes needs a Unix system.");
}

#[cfg(unix)]
mod shared {
    use std::os::fd::{AsFd, OwnedFd};
    use std::os::unix::net::UnixStream;
    use std::process::{Command, Stdio};

    use crate::common::{self, ExampleResult, pattern, verify};
    use cuda_vmm::{
        Context, Granularity, ReadWrite, VirtualReservation, allocation_granularity,
        ipc::ExportedAllocation, ipc::PosixFd, ipc::ShareableAllocation,
    };

    pub(crate) fn parent() -> ExampleResult {
        println!("ipc_share: two processes share one buffer");
        let Some(devices) = common::devices_or_none("there is no memory to share")? else {
            return Ok(());
        };
        let device = devices[0];
        if !device.supports_posix_fd_handles()? {
            println!(
                "GPU 0 cannot export memory as a POSIX file descriptor \
                 (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED is 0): nothing to share."
            );
            return Ok(());
        }
        let context = Context::new(device)?;
        let size = allocation_granularity(device, Granularity::Minimum)?;
        let n = size / 4;

        let memory = ShareableAllocation::<PosixFd>::new(device, size)?;
        let mut reservation = VirtualReservation::new(size, 0)?;
        let mut region = reservation.region();
        let mut mapping = region.map(&memory)?;
        let mut access = mapping.grant(&context, ReadWrite)?;
        access.slice_mut::<u32>()?.copy_from_host(&pattern(n, 1))?;
        println!("parent: wrote {n} values into {size} bytes of GPU 0 memory");

        let (socket, child_end) = UnixStream::pair()?;
        let mut child = Command::new(std::env::current_exe()?)
            .arg("--child")
            .stdin(Stdio::from(OwnedFd::from(child_end)))
            .spawn()?;
        let exported = memory.export()?;
        println!("parent: exported as {exported:?}");
        exported.send(&socket)?;
        drop(exported); // the child received its own descriptor
        let status = child.wait()?;
        if !status.success() {
            return Err(format!("the child failed: {status}").into());
        }
        verify(
            "parent: reads the child's bytes through its own mapping",
            &access.slice::<u32>()?.to_vec()?,
            &pattern(n, 2),
        )?;
        mapping.unmap()?;
        reservation.free()?;
        memory.release()?;
        println!("ipc_share: one buffer, two processes, both directions checked");
        Ok(())
    }

    pub(crate) fn child() -> ExampleResult {
        let socket = std::io::stdin();
        let exported = ExportedAllocation::receive(socket.as_fd())?;
        println!("child: received {exported:?}");
        let memory = exported.import()?;
        drop(exported);
        let cuda_vmm::vmm::Location::Device(device) = memory.location() else {
            return Err("the shared memory is not device memory".into());
        };
        let context = Context::new(device)?;
        let n = memory.size() / 4;
        let mut reservation = VirtualReservation::new(memory.size(), 0)?;
        let mut region = reservation.region();
        let mut mapping = region.map(&memory)?;
        let mut access = mapping.grant(&context, ReadWrite)?;
        verify(
            "child: reads the parent's bytes",
            &access.slice::<u32>()?.to_vec()?,
            &pattern(n, 1),
        )?;
        access.slice_mut::<u32>()?.copy_from_host(&pattern(n, 2))?;
        println!("child: wrote its own {n} values");
        Ok(())
    }
}
