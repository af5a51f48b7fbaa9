//! Rule: a receive (ncclRecv) writes only a view lent for writing (`LentMut`); a view lent for reading is only sent.
//! Prevents: NCCL writing into memory granted PROT_READ, or into bytes other lends of the scope read meanwhile.
//! Expected: E0308 (`recv` takes a `LentMut`, the view was lent as a `Lent`).

use cuda_vmm::interop::nccl::Comm;
use cuda_vmm::DeviceSlice;

fn receive_into_read_only(comm: &Comm, view: &DeviceSlice<'_, f32>) -> Result<(), cuda_vmm::Error> {
    comm.scope(|s| -> Result<(), cuda_vmm::Error> {
        let mut lent = s.lend(view)?;
        s.recv(&mut lent, 0) // <- error[E0308]: a view lent for reading is not written
    })
}

fn main() {
    let _ = receive_into_read_only;
}
