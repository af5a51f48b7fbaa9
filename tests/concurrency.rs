//! Many threads mapping, granting, copying and unmapping disjoint regions of one shared reservation,
//! with shared and private physical memory, at once. Relies on exactly the Send/Sync facts of
//! `tests/static_facts.rs`: `Region` is `Send`; `PhysicalAllocation` and `Context` are `Sync`.

mod common;

use cuda_vmm::{
    Granularity, PhysicalAllocation, ReadOnly, ReadWrite, VirtualReservation,
    allocation_granularity, vmm::Region,
};

const THREADS: usize = 16;
const ROUNDS: u32 = 50;

#[test]
fn threads_share_reservations_and_allocations() {
    let Some((device, ctx)) = common::gpu_or_skip("threads_share_reservations_and_allocations")
    else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let shared_data = common::pattern(g / 4, 0x5eed);
    let shared = PhysicalAllocation::new(device, g).unwrap();
    {
        let mut r = VirtualReservation::new(g, 0).unwrap();
        let mut region = r.region();
        let mut m = region.map(&shared).unwrap();
        m.grant(&ctx, ReadWrite)
            .unwrap()
            .slice_mut::<u32>()
            .unwrap()
            .copy_from_host(&shared_data)
            .unwrap();
    }
    let private: Vec<PhysicalAllocation> = (0..THREADS)
        .map(|_| PhysicalAllocation::new(device, g).unwrap())
        .collect();
    let (free_before, _) = ctx.memory_info().unwrap();

    // One reservation, two granules per thread: one for its own memory, one for an alias of the shared.
    let mut reservation = VirtualReservation::new(2 * g * THREADS, 0).unwrap();
    let mut rest = reservation.region();
    let mut regions: Vec<Region<'_>> = Vec::new();
    for _ in 0..THREADS {
        let (mine, tail) = rest.split_at(2 * g).unwrap();
        regions.push(mine);
        rest = tail;
    }

    std::thread::scope(|s| {
        for (t, (region, own)) in regions.into_iter().zip(&private).enumerate() {
            let (ctx, shared, shared_data) = (&ctx, &shared, &shared_data);
            s.spawn(move || {
                let (mut own_region, mut alias_region) = region.split_at(g).unwrap();
                for round in 0..ROUNDS {
                    let data = common::pattern(g / 4, (t as u32) << 16 | round);
                    let mut mine = own_region.map(own).unwrap();
                    let mut alias = alias_region.map(shared).unwrap();
                    {
                        let mut rw = mine.grant(ctx, ReadWrite).unwrap();
                        let mut view = rw.slice_mut::<u32>().unwrap();
                        view.copy_from_host(&data).unwrap();
                        assert_eq!(
                            view.to_vec().unwrap(),
                            data,
                            "thread {t} round {round}: own data"
                        );
                        let ro = alias.grant(ctx, ReadOnly).unwrap();
                        let mut head = vec![0u32; 1024];
                        ro.slice::<u32>()
                            .unwrap()
                            .slice(..1024)
                            .unwrap()
                            .copy_to_host(&mut head)
                            .unwrap();
                        assert_eq!(
                            head,
                            shared_data[..1024],
                            "thread {t} round {round}: shared data"
                        );
                    }
                    own_region = mine.unmap().unwrap();
                    alias_region = alias.unmap().unwrap();
                }
            });
        }
    });
    reservation.free().unwrap();
    let (free_after, _) = ctx.memory_info().unwrap();
    assert_eq!(
        free_after,
        free_before,
        "leaked {} bytes",
        free_before.abs_diff(free_after)
    );
    println!("{THREADS} threads x {ROUNDS} rounds: no error, no leak, data intact");
}
