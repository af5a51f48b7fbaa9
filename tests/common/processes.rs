//! Two processes in one test: this test binary started again as the child of a test, its standard
//! input its end of a Unix socket pair, and the one-byte steps both sides take in order.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cuda_vmm::{Context, Device};

/// Starts this test binary again as the child of `test` in `role` (the value of the environment
/// variable `var`), with `socket` as its standard input.
pub fn spawn_child(var: &str, test: &str, role: &str, socket: UnixStream) -> Child {
    let exe = std::env::current_exe().expect("current_exe");
    let mut command = Command::new(exe);
    command
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(var, role)
        .stdin(Stdio::from(OwnedFd::from(socket)));
    let child = command
        .spawn()
        .unwrap_or_else(|e| panic!("{test}: spawning the child: {e}"));
    // `command` held the parent's copy of the child's end; dropping it lets the parent see the end
    // of the connection when the child exits.
    drop(command);
    child
}

pub fn send_byte(socket: impl AsFd, byte: u8) {
    let n = rustix::io::retry_on_intr(|| rustix::io::write(&socket, &[byte])).expect("write");
    assert_eq!(n, 1);
}

pub fn receive_byte(socket: impl AsFd) -> u8 {
    let mut byte = [0u8; 1];
    let n = rustix::io::retry_on_intr(|| rustix::io::read(&socket, &mut byte)).expect("read");
    assert_eq!(n, 1, "the other process ended the connection");
    byte[0]
}

pub fn expect_byte(socket: impl AsFd, expected: u8) {
    let got = receive_byte(socket);
    assert_eq!(got as char, expected as char, "step out of order");
}

pub fn wait_success(mut child: Child, test: &str) {
    let status = child.wait().expect("wait");
    assert!(status.success(), "{test}: the child failed: {status}");
}

/// The device's free memory once it equals `expected`, or after ten seconds: a process's exit
/// returns its device memory to the driver shortly after `wait` returns, not necessarily before.
pub fn settled_free(ctx: &Context, expected: usize) -> usize {
    let start = Instant::now();
    loop {
        let (free, _) = ctx.memory_info().unwrap();
        if free == expected || start.elapsed() > Duration::from_secs(10) {
            return free;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A device with POSIX-fd shareable memory and its context, or `None` after saying why the test is
/// skipped.
pub fn shareable_gpu_or_skip(test: &str) -> Option<(Device, Context)> {
    let (device, ctx) = super::gpu_or_skip(test)?;
    if !device.supports_posix_fd_handles().unwrap() {
        super::skip(&format!(
            "SKIPPED {test}: {device:?} cannot export memory as a POSIX file descriptor"
        ));
        return None;
    }
    Some((device, ctx))
}
