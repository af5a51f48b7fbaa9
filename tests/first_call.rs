//! A reservation can be a process's first driver call: it initialises the driver itself (the driver
//! answers `CUDA_ERROR_NOT_INITIALIZED` to `cuMemAddressReserve` before `cuInit`). A process of its own,
//! so that nothing has initialised the driver before.

mod common;

use cuda_vmm::{Error, VirtualReservation};

#[test]
fn a_reservation_can_come_first() {
    // 2 MiB: the allocation granularity of every device with VMM support so far.
    match VirtualReservation::new(2 << 20, 0) {
        Ok(reservation) => {
            println!("reserved {reservation:?} before anything else");
            reservation.free().unwrap();
        }
        Err(Error::Driver(e)) if e.is_no_gpu() => {
            common::skip(&format!(
                "SKIPPED a_reservation_can_come_first: no CUDA device ({e})"
            ));
        }
        Err(e) => panic!("a first reservation failed: {e}"),
    }
}
