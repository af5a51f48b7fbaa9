//! Rule: an imported allocation is not used after its release.
//! Prevents: cuMemMap of a handle this process has released (a stale handle, or another allocation's).
//! Expected: E0382 (borrow of moved value `memory`).

use std::os::unix::net::UnixStream;

use cuda_vmm::{Error, ipc::ExportedAllocation, VirtualReservation};

fn map_received(socket: &UnixStream) -> Result<(), Error> {
    let memory = ExportedAllocation::receive(socket)?.import()?;
    let mut reservation = VirtualReservation::new(memory.size(), 0)?;
    memory.release()?;

    let mapping = reservation.region().map(&memory)?; // <- error[E0382]: `memory` was moved by `release`
    drop(mapping);
    Ok(())
}

fn main() {
    let (socket, _peer) = UnixStream::pair().unwrap();
    let _ = map_received(&socket);
}
