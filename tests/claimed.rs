//! Claimed ranges of a `VirtualBuffer` against a real driver: a graph that writes a claimed range
//! replayed while the buffer grows under it (`grow` through `&self` while the graph lives), each
//! replay counted; what a live claim refuses (read views, overlapping claims, rebinds that read its
//! bytes) and what it lets through (disjoint claims, other bytes, growth); a forgotten claim let
//! go by the next exclusive borrow; and a parked graph rebound over a claim. Every test skips
//! visibly without a GPU.

mod common;

use std::ffi::CString;

use common::{COUNT_PTX, gpu_or_skip};
use cuda_vmm::stream::Graph;
use cuda_vmm::{
    Context, Error, Granularity, Module, ReadWrite, Stream, VirtualBuffer, allocation_granularity,
};

fn load(ctx: &Context) -> Module {
    Module::load_ptx(ctx, &CString::new(COUNT_PTX).unwrap()).unwrap()
}

/// The bytes a refusal names as claimed.
fn held(result: Result<impl Sized, Error>) -> (usize, usize) {
    match result.map(drop) {
        Err(Error::PageRange {
            start,
            end,
            problem,
        }) if problem.contains("ClaimedRange") => (start, end),
        other => panic!("expected the claimed bytes named, got {other:?}"),
    }
}

/// One graph counts into the claimed first page; between its replays the buffer grows by a page
/// seven times, and each new page is written through a claim of its own and read back, while the
/// claimed page refuses a read view. After the graph and the claim are gone, the counter reads the
/// number of replays.
#[test]
fn a_graph_over_a_claimed_range_replays_while_the_buffer_grows() {
    let Some((device, ctx)) =
        gpu_or_skip("a_graph_over_a_claimed_range_replays_while_the_buffer_grows")
    else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let n = g / 4;
    let module = load(&ctx);
    let count = module.function(c"count").unwrap();
    let cache = VirtualBuffer::new(16 * g, &[device], ReadWrite).unwrap();
    cache.grow(device, g).unwrap();
    let mut stream = Stream::new(&ctx).unwrap();
    let mut claim = cache.claim_bytes_mut::<u32>(..g).unwrap();
    assert_eq!((claim.bytes(), claim.len()), (0..g, n));
    claim.view().copy_from_host(&vec![0; n]).unwrap();
    {
        let mut view = claim.view();
        let graph = Graph::capture(&mut stream, |c| {
            // SAFETY: count(u32*) adds one to the first value of the view.
            unsafe { c.launch(&count, (1, 1, 1), (1, 1, 1), (&mut view,))? };
            Ok(())
        })
        .unwrap();
        for step in 1..8usize {
            cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph)).unwrap();
            let at = cache.grow(device, g).unwrap();
            assert_eq!(at, step * g, "the buffer grew while the graph lives");
            let page = vec![u32::try_from(step).unwrap() + 100; n];
            let mut grown = cache.claim_bytes_mut::<u32>(at..at + g).unwrap();
            grown.view().copy_from_host(&page).unwrap();
            drop(grown);
            assert_eq!(
                cache
                    .slice_bytes::<u32>(at..at + g)
                    .unwrap()
                    .to_vec()
                    .unwrap(),
                page
            );
            assert_eq!(held(cache.slice_bytes::<u32>(..g)), (0, g));
        }
        cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph)).unwrap();
    }
    assert_eq!(
        claim.view().to_vec().unwrap()[0],
        8,
        "eight replays counted"
    );
    drop(claim);
    assert_eq!(
        cache.slice_bytes::<u32>(..4).unwrap().to_vec().unwrap(),
        vec![8]
    );
    assert_eq!(cache.pages().len(), 8);
    cache.free().unwrap();
}

/// While a claim lives: a read view of any of its bytes, and a claim that shares a byte with it,
/// are refused naming the shared bytes; claims of other bytes, and read views of them, are made;
/// a claim over a hole is refused as a view is. Once it is dropped, its bytes are viewed again.
#[test]
fn a_live_claim_refuses_every_other_view_of_its_bytes() {
    let Some((device, _ctx)) = gpu_or_skip("a_live_claim_refuses_every_other_view_of_its_bytes")
    else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let buffer = VirtualBuffer::new(4 * g, &[device], ReadWrite).unwrap();
    buffer.grow(device, 2 * g).unwrap();
    let keys = buffer.claim_bytes_mut::<u32>(0..g).unwrap();
    assert_eq!(held(buffer.slice_bytes::<u8>(g - 16..g + 16)), (g - 16, g));
    assert_eq!(
        held(buffer.claim_bytes_mut::<u32>(g / 2..g + 4096)),
        (g / 2, g)
    );
    let mut values = buffer.claim_bytes_mut::<u32>(g..2 * g).unwrap();
    values.view().copy_from_host(&vec![9; g / 4]).unwrap();
    assert_eq!(held(buffer.slice_bytes::<u32>(g..g + 4)), (g, g + 4));
    drop(values);
    assert_eq!(
        buffer
            .slice_bytes::<u32>(g..g + 4)
            .unwrap()
            .to_vec()
            .unwrap(),
        vec![9]
    );
    assert!(
        matches!(
            buffer.claim_bytes_mut::<u32>(2 * g..3 * g),
            Err(Error::PageRange { .. })
        ),
        "a hole is not claimed"
    );
    assert!(matches!(
        buffer.claim_bytes_mut::<u32>(1..5),
        Err(Error::NotWholeElements { .. })
    ));
    drop(keys);
    assert!(buffer.slice_bytes::<u8>(..).is_err(), "2g..4g is a hole");
    assert_eq!(buffer.slice_bytes::<u8>(..2 * g).unwrap().len(), 2 * g);
    buffer.free().unwrap();
}

/// A forgotten claim keeps its bytes from views through `&self`; the next exclusive borrow of the
/// buffer proves that no claim lives, and lets them go.
#[test]
fn a_forgotten_claim_is_let_go_by_the_next_exclusive_borrow() {
    let Some((device, _ctx)) =
        gpu_or_skip("a_forgotten_claim_is_let_go_by_the_next_exclusive_borrow")
    else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let mut buffer = VirtualBuffer::new(g, &[device], ReadWrite).unwrap();
    buffer.grow(device, g).unwrap();
    std::mem::forget(buffer.claim_bytes_mut::<u8>(..4096).unwrap());
    assert_eq!(held(buffer.slice_bytes::<u8>(..)), (0, 4096));
    buffer
        .slice_bytes_mut::<u8>(..4096)
        .unwrap()
        .copy_from_host(&[3; 4096])
        .unwrap();
    assert_eq!(
        buffer.slice_bytes::<u8>(..4096).unwrap().to_vec().unwrap(),
        vec![3; 4096]
    );
    buffer.free().unwrap();
}

/// A graph that counts into a claimed range, parked and rebound: the whole buffer given for reading
/// does not cover the claimed bytes (refused, naming them), the claim given for writing does; the
/// rebound graph replays while the buffer grows.
#[test]
fn a_parked_graph_is_rebound_over_a_claim_while_the_buffer_grows() {
    let Some((device, ctx)) =
        gpu_or_skip("a_parked_graph_is_rebound_over_a_claim_while_the_buffer_grows")
    else {
        return;
    };
    let g = allocation_granularity(device, Granularity::Minimum).unwrap();
    let module = load(&ctx);
    let count = module.function(c"count").unwrap();
    let cache = VirtualBuffer::new(4 * g, &[device], ReadWrite).unwrap();
    cache.grow(device, g).unwrap();
    let mut stream = Stream::new(&ctx).unwrap();
    let mut claim = cache.claim_bytes_mut::<u32>(..4096).unwrap();
    claim.view().copy_from_host(&[0; 1024]).unwrap();
    let parked = {
        let mut view = claim.view();
        Graph::capture(&mut stream, |c| {
            // SAFETY: count(u32*) adds one to the first value of the view.
            unsafe { c.launch(&count, (1, 1, 1), (1, 1, 1), (&mut view,))? };
            Ok(())
        })
        .unwrap()
        .park()
    };
    let refused = parked
        .rebind()
        .reads(&cache)
        .module(&module)
        .finish()
        .unwrap_err();
    assert_eq!(held(Err::<(), _>(refused.error().clone())), (0, 4096));
    {
        let graph = refused
            .into_graph()
            .rebind()
            .reads(&cache)
            .writes_claimed(&mut claim)
            .module(&module)
            .finish()
            .unwrap();
        for _ in 0..3 {
            cuda_vmm::scope(|s| s.on(&stream).launch_graph(&graph)).unwrap();
            cache.grow(device, g).unwrap();
        }
    }
    assert_eq!(claim.view().to_vec().unwrap()[0], 3);
    drop(claim);
    cache.free().unwrap();
}
