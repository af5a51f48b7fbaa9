//! Reads after writes inside one scope, against a real driver: bytes that queued work wrote in a
//! `ScopedBuffer` are read back as one view (`ScopedBuffer::read_back`), ordered after every write,
//! on the writer's stream or on another one behind an event the crate records; the write claims end
//! there, so the writes' handles are refused afterwards, with the bytes named; and a freed block is
//! lent again for writing (`ScopedBuffer::reuse`) behind its last reader, also by 16 threads at
//! once; a page's slots lent in one call (`ScopedBuffer::write_chunks`) are each a write of their
//! own; and 10 000 rounds of these paths and block tables, with faults injected, leak nothing.
//! Every test skips visibly without a GPU. The tests take one lock, since they time kernels and
//! measure free memory.

mod common;

use std::ffi::CString;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use common::{gpu_or_skip, pattern};
use cuda_vmm::stream::Rewritable;
use cuda_vmm::{
    Context, Device, Error, Event, Granularity, Module, PinnedBuffer, ReadWrite, Stream,
    VirtualBuffer, allocation_granularity,
};

/// `spin_add_one(u32 *dst, const u32 *src, u32 n, u64 ns)`: waits `ns` nanoseconds, then
/// `dst[i] = src[i] + 1`.
const SPIN_PTX: &str = include_str!("../examples/kernels/spin_add_one.ptx");
const GRID: (u32, u32, u32) = (64, 1, 1);
const BLOCK: (u32, u32, u32) = (256, 1, 1);
/// Long enough that a read on another stream not ordered after the kernel reads its bytes before
/// the kernel has written them.
const SPIN: Duration = Duration::from_millis(300);

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

fn spin_module(ctx: &Context) -> Module {
    Module::load_ptx(ctx, &CString::new(SPIN_PTX).expect("PTX has no NUL byte")).unwrap()
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap()
}

fn plus_one(data: &[u32]) -> Vec<u32> {
    data.iter().map(|x| x.wrapping_add(1)).collect()
}

fn granularity(device: Device) -> usize {
    allocation_granularity(device, Granularity::Minimum).unwrap()
}

/// The bytes a `PageRange` error names.
fn page_range<T>(result: &Result<T, Error>) -> Option<(usize, usize)> {
    match result {
        Err(Error::PageRange { start, end, .. }) => Some((*start, *end)),
        _ => None,
    }
}

/// A sequence's history, written a token slot at a time on one stream and read back whole on the
/// same stream, twice (a step, then the next one with one more slot): every value is the one
/// written. The writes' handles are refused once read back, naming their bytes, and so are a plain
/// read and a new write of those bytes; a slot not read back is still written.
#[test]
fn history_is_read_back_on_the_writers_stream() {
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("history_is_read_back_on_the_writers_stream") else {
        return;
    };
    let g = granularity(device);
    let slot = 4096usize; // bytes of one token's K/V
    let per = slot / 4;
    let tokens: Vec<Vec<u32>> = (0..6).map(|t| pattern(per, 100 + t)).collect();
    let uploads: Vec<PinnedBuffer<u32>> = tokens
        .iter()
        .map(|t| PinnedBuffer::from_slice(&ctx, t).unwrap())
        .collect();
    let mut step4 = PinnedBuffer::<u32>::zeroed(&ctx, 4 * per).unwrap();
    let mut step5 = PinnedBuffer::<u32>::zeroed(&ctx, 5 * per).unwrap();
    let work = Stream::new(&ctx).unwrap();
    let mut cache = VirtualBuffer::new(4 * g, &[device], ReadWrite).unwrap();
    cache.grow(device, g).unwrap();

    cuda_vmm::scope(|s| {
        let w = s.on(&work);
        let kv = cache.in_scope(s);
        let mut slots = Vec::new();
        for (t, upload) in uploads.iter().enumerate().take(4) {
            let mut kv_slot = kv.write::<u32>(t * slot..(t + 1) * slot)?;
            w.copy_from_host(&mut kv_slot, upload)?;
            slots.push(kv_slot);
        }
        let mut spare = kv.write::<u32>(5 * slot..6 * slot)?;
        let history = kv.read_back::<u32>(0..4 * slot, w)?;
        w.copy_to_host(&mut step4, history)?;

        assert_eq!(
            page_range(&w.copy_from_host(&mut slots[1], &uploads[1])),
            Some((slot, 2 * slot)),
            "a write through a handle read back"
        );
        assert_eq!(
            page_range(&kv.read::<u32>(0..8)),
            Some((0, 8)),
            "a plain read of written bytes"
        );
        assert_eq!(
            page_range(&kv.write::<u32>(3 * slot..5 * slot)),
            Some((3 * slot, 4 * slot)),
            "a write over bytes read back"
        );
        assert_eq!(
            page_range(&kv.read_back::<u32>(4 * slot..5 * slot + 4, w)),
            Some((5 * slot, 6 * slot)),
            "a read back that cuts a write"
        );
        w.copy_from_host(&mut spare, &uploads[5])?; // not read back: still lent for writing

        // The next step: one more token, and the whole history again.
        let mut next = kv.write::<u32>(4 * slot..5 * slot)?;
        w.copy_from_host(&mut next, &uploads[4])?;
        let history = kv.read_back::<u32>(0..5 * slot, w)?;
        w.copy_to_host(&mut step5, history)?;
        Ok(())
    })
    .unwrap();
    let expected: Vec<u32> = tokens.concat();
    assert_eq!(
        step4.to_vec(),
        expected[..4 * per],
        "the first step's history"
    );
    assert_eq!(
        step5.to_vec(),
        expected[..5 * per],
        "the second step's history"
    );
    cache.free().unwrap();
}

/// A page's token slots lent in one call (`ScopedBuffer::write_chunks`): each chunk is a write of
/// its own, written, read back and refused afterwards alone; a call over claimed bytes or a hole
/// claims nothing (a later call over the same bytes succeeds), a chunk of zero is refused, and the
/// last chunk is shorter where the chunk does not divide the range.
#[test]
fn a_page_lent_in_chunks_is_written_and_read_back_a_chunk_at_a_time() {
    let _serial = serial();
    let Some((device, ctx)) =
        gpu_or_skip("a_page_lent_in_chunks_is_written_and_read_back_a_chunk_at_a_time")
    else {
        return;
    };
    let g = granularity(device);
    let slot = 4096usize;
    let per = slot / 4;
    let tokens: Vec<Vec<u32>> = (0..3).map(|t| pattern(per, 300 + t)).collect();
    let uploads: Vec<PinnedBuffer<u32>> = tokens
        .iter()
        .map(|t| PinnedBuffer::from_slice(&ctx, t).unwrap())
        .collect();
    let mut first_two = PinnedBuffer::<u32>::zeroed(&ctx, 2 * per).unwrap();
    let mut third = PinnedBuffer::<u32>::zeroed(&ctx, per).unwrap();
    let mut tail = PinnedBuffer::<u32>::zeroed(&ctx, g / 4 % 1000).unwrap();
    let work = Stream::new(&ctx).unwrap();
    let mut cache = VirtualBuffer::new(4 * g, &[device], ReadWrite).unwrap();
    cache.grow(device, g).unwrap();
    let stats = cache.stats();

    cuda_vmm::scope(|s| {
        let w = s.on(&work);
        let kv = cache.in_scope(s);
        let mut slots = kv.write_chunks::<u32>(..g, per)?;
        assert_eq!(slots.len(), g / slot, "one lend per slot of the page");
        assert!(slots.iter().all(|t| t.len() == per));
        for (t, upload) in uploads.iter().enumerate() {
            w.copy_from_host(&mut slots[t], upload)?;
        }
        // The bytes are claimed, chunk by chunk.
        assert_eq!(
            page_range(&kv.write::<u32>(slot..slot + 8)),
            Some((slot, slot + 8)),
            "a write inside a chunk"
        );
        // A hole: nothing claimed, so the same bytes are lent once mapped.
        assert_eq!(
            page_range(&kv.write_chunks::<u32>(g..2 * g, per)),
            Some((g, 2 * g)),
            "chunks over a hole"
        );
        assert!(matches!(
            kv.write_chunks::<u32>(g..2 * g, 0),
            Err(Error::ZeroSize { .. })
        ));
        kv.map_page(g, device, g)?;
        assert_eq!(
            page_range(&kv.write_chunks::<u32>(g - slot..g + slot, per)),
            Some((g - slot, g)),
            "chunks over claimed bytes"
        );
        let odd = kv.write_chunks::<u32>(g..2 * g, 1000)?;
        let short = g / 4 % 1000;
        assert_eq!(odd.len(), (g / 4).div_ceil(1000));
        assert_eq!(odd.last().map(Rewritable::len), Some(short));
        let mut last = odd
            .into_iter()
            .last()
            .ok_or(Error::ZeroSize { what: "chunks" })?;
        w.memset(&mut last, 0x5a)?;
        // Each chunk is read back alone; a read back across a chunk's end is refused.
        let history = kv.read_back::<u32>(..2 * slot, w)?;
        w.copy_to_host(&mut first_two, history)?;
        assert_eq!(
            page_range(&w.copy_from_host(&mut slots[1], &uploads[1])),
            Some((slot, 2 * slot)),
            "a chunk read back is no longer lent for writing"
        );
        assert_eq!(
            page_range(&kv.read_back::<u32>(2 * slot..2 * slot + 8, w)),
            Some((2 * slot, 3 * slot)),
            "a read back that cuts a chunk"
        );
        w.copy_from_host(&mut slots[2], &uploads[2])?; // not read back: still lent for writing
        let third_back = kv.read_back::<u32>(2 * slot..3 * slot, w)?;
        w.copy_to_host(&mut third, third_back)?;
        let tail_back = kv.read_back::<u32>(2 * g - 4 * short..2 * g, w)?;
        w.copy_to_host(&mut tail, tail_back)?;
        Ok(())
    })
    .unwrap();
    assert_eq!(
        first_two.to_vec(),
        [&tokens[0][..], &tokens[1][..]].concat()
    );
    assert_eq!(third.to_vec(), tokens[2]);
    assert_eq!(
        tail.to_vec(),
        vec![0x5a5a_5a5a; g / 4 % 1000],
        "the short last chunk"
    );
    assert_eq!(
        cache.stats().map_calls,
        stats.map_calls + 1,
        "a refused call made a driver call"
    );
    cache.free().unwrap();
}

/// A 300 ms kernel writes a slot on one stream, after an upload to the slot before it; both slots
/// are read back as one view for another stream, whose download then reads them. The read back
/// returns while the kernel runs (no host wait), and the download sees the kernel's values (it
/// waited for the crate's event): without the wait it would copy the zeros the slot held before.
/// The view is refused on a third stream.
#[test]
fn history_is_read_back_across_two_streams() {
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("history_is_read_back_across_two_streams") else {
        return;
    };
    let g = granularity(device);
    let n = g / 8;
    let half = n * 4;
    let module = spin_module(&ctx);
    let kernel = module.function(c"spin_add_one").unwrap();
    let data = pattern(n, 17);
    let host_in = PinnedBuffer::from_slice(&ctx, &data).unwrap();
    let mut host_out = PinnedBuffer::<u32>::zeroed(&ctx, 2 * n).unwrap();
    let mut refused_out = PinnedBuffer::<u32>::zeroed(&ctx, 2 * n).unwrap();
    let (append, attend, third) = (
        Stream::new(&ctx).unwrap(),
        Stream::new(&ctx).unwrap(),
        Stream::new(&ctx).unwrap(),
    );
    let kernel_done = Event::new(&ctx).unwrap();
    let n32 = u32::try_from(n).unwrap();
    let mut cache = VirtualBuffer::new(4 * g, &[device], ReadWrite).unwrap();
    cache.grow(device, g).unwrap();
    // Zeros in the kernel's slot, written and waited for by a scope of their own.
    cuda_vmm::scope(|s| {
        let mut slot = cache.in_scope(s).write::<u32>(half..2 * half)?;
        s.on(&append).memset(&mut slot, 0)?;
        Ok(())
    })
    .unwrap();

    let mut ran_on = false;
    cuda_vmm::scope(|s| {
        let (append, attend, third) = (s.on(&append), s.on(&attend), s.on(&third));
        let kv = cache.in_scope(s);
        let mut src = kv.write::<u32>(0..half)?;
        let mut dst = kv.write::<u32>(half..2 * half)?;
        let uploaded = append.copy_from_host(&mut src, &host_in)?;
        // SAFETY: `spin_add_one(u32*, const u32*, u32, u64)`, `n` values of each view.
        unsafe {
            append.launch(&kernel, GRID, BLOCK, (&mut dst, uploaded, n32, nanos(SPIN)))?;
        }
        append.record(&kernel_done)?;
        let history = kv.read_back::<u32>(0..2 * half, attend)?;
        ran_on = !kernel_done.is_complete()?;
        attend.copy_to_host(&mut host_out, history)?;
        assert!(
            matches!(
                third.copy_to_host(&mut refused_out, history),
                Err(Error::StreamRefused { .. })
            ),
            "a view read back for one stream, lent to another"
        );
        Ok(())
    })
    .unwrap();
    assert!(ran_on, "the read back waited for the kernel on the host");
    let mut expected = data.clone();
    expected.extend(plus_one(&data));
    assert_eq!(
        host_out.to_vec(),
        expected,
        "the download read the kernel's bytes"
    );
    assert!(
        refused_out.iter().all(|&v| v == 0),
        "the refused download ran"
    );
    cache.free().unwrap();
}

/// A block a caching allocator freed, lent again for writing in the same scope: written on one
/// stream, read back for another where a 300 ms kernel reads it, then reused on the first stream
/// and overwritten at once. The reuse returns while the kernel runs (no host wait), and the kernel
/// still reads the first bytes (the new upload waited for it): without the wait it would read the
/// second. Every earlier handle of the block is refused afterwards, naming its bytes, and a reuse
/// that cuts a write is refused before anything changes.
#[test]
fn a_freed_block_is_reused_behind_its_last_reader() {
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("a_freed_block_is_reused_behind_its_last_reader") else {
        return;
    };
    let g = granularity(device);
    let n = g / 8;
    let half = n * 4;
    let module = spin_module(&ctx);
    let kernel = module.function(c"spin_add_one").unwrap();
    let (first, second) = (pattern(n, 23), pattern(n, 29));
    let first_in = PinnedBuffer::from_slice(&ctx, &first).unwrap();
    let second_in = PinnedBuffer::from_slice(&ctx, &second).unwrap();
    let mut kernel_out = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let mut block_out = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let mut refused_out = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let (append, attend) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let kernel_done = Event::new(&ctx).unwrap();
    let n32 = u32::try_from(n).unwrap();
    let mut cache = VirtualBuffer::new(4 * g, &[device], ReadWrite).unwrap();
    cache.grow(device, g).unwrap();

    let mut ran_on = false;
    cuda_vmm::scope(|s| {
        let (append, attend) = (s.on(&append), s.on(&attend));
        let kv = cache.in_scope(s);
        let mut block = kv.write::<u32>(0..half)?;
        append.copy_from_host(&mut block, &first_in)?;
        let seen = kv.read_back::<u32>(0..half, attend)?;
        let mut out = kv.write::<u32>(half..2 * half)?;
        // SAFETY: `spin_add_one(u32*, const u32*, u32, u64)`, `n` values of each view.
        unsafe {
            attend.launch(&kernel, GRID, BLOCK, (&mut out, seen, n32, nanos(SPIN)))?;
        }
        attend.record(&kernel_done)?;

        assert_eq!(
            page_range(&kv.reuse::<u32>(half..half + 4096, append)),
            Some((half, 2 * half)),
            "a reuse that cuts a write"
        );
        let mut again = kv.reuse::<u32>(0..half, append)?;
        ran_on = !kernel_done.is_complete()?;
        append.copy_from_host(&mut again, &second_in)?;

        assert_eq!(
            page_range(&append.copy_from_host(&mut block, &first_in)),
            Some((0, half)),
            "the first owner's write handle"
        );
        assert_eq!(
            page_range(&attend.copy_to_host(&mut refused_out, seen)),
            Some((0, half)),
            "a read handle made before the reuse"
        );
        let now = kv.read_back::<u32>(0..half, append)?;
        append.copy_to_host(&mut block_out, now)?;
        let result = kv.read_back::<u32>(half..2 * half, attend)?;
        attend.copy_to_host(&mut kernel_out, result)?;
        Ok(())
    })
    .unwrap();
    assert!(ran_on, "the reuse waited for the kernel on the host");
    assert_eq!(
        kernel_out.to_vec(),
        plus_one(&first),
        "the kernel read the first owner's bytes"
    );
    assert_eq!(block_out.to_vec(), second, "the second owner's bytes");
    assert!(
        refused_out.iter().all(|&v| v == 0),
        "the refused download ran"
    );
    cache.free().unwrap();
}

/// Sixteen threads share one scoped buffer in one scope, each with its own stream and page: every
/// round a thread writes its block on its stream (a first write, then a reuse of the block), reads
/// it back for its neighbour's stream, where a download reads it, and the next round's reuse
/// orders the new write after that download. Twenty rounds each; every download holds its round's
/// bytes, and the pages are retired and released at the end.
#[test]
fn sixteen_threads_write_read_back_and_reuse_in_one_scope() {
    const THREADS: usize = 16;
    const ROUNDS: usize = 20;
    let _serial = serial();
    let Some((device, ctx)) = gpu_or_skip("sixteen_threads_write_read_back_and_reuse_in_one_scope")
    else {
        return;
    };
    let g = granularity(device);
    let n = 1024usize;
    let block = n * 4;
    let inputs: Vec<PinnedBuffer<u32>> = (0..THREADS * ROUNDS)
        .map(|i| PinnedBuffer::from_slice(&ctx, &pattern(n, 13 * i as u32)).unwrap())
        .collect();
    let mut outputs: Vec<PinnedBuffer<u32>> = (0..THREADS * ROUNDS)
        .map(|_| PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap())
        .collect();
    let streams: Vec<Stream> = (0..THREADS).map(|_| Stream::new(&ctx).unwrap()).collect();
    let mut cache = VirtualBuffer::new(THREADS * g, &[device], ReadWrite).unwrap();

    cuda_vmm::scope(|s| {
        let kv = cache.in_scope(s);
        let mut chunks: Vec<&mut [PinnedBuffer<u32>]> = outputs.chunks_mut(ROUNDS).collect();
        std::thread::scope(|t| {
            let workers: Vec<_> = chunks
                .drain(..)
                .zip(inputs.chunks(ROUNDS))
                .enumerate()
                .map(|(i, (outs, ins))| {
                    let (own, next) = (&streams[i], &streams[(i + 1) % THREADS]);
                    t.spawn(move || -> Result<(), Error> {
                        let (on, neighbour) = (s.on(own), s.on(next));
                        let at = kv.grow(device, g)?;
                        for (round, (out, input)) in outs.iter_mut().zip(ins).enumerate() {
                            let mut slot = if round == 0 {
                                kv.write::<u32>(at..at + block)?
                            } else {
                                kv.reuse::<u32>(at..at + block, on)?
                            };
                            on.copy_from_host(&mut slot, input)?;
                            let back = kv.read_back::<u32>(at..at + block, neighbour)?;
                            neighbour.copy_to_host(&mut *out, back)?;
                        }
                        assert_eq!(kv.retire(at..at + g)?, 1);
                        Ok(())
                    })
                })
                .collect();
            workers
                .into_iter()
                .try_for_each(|w| w.join().expect("a worker panicked"))
        })
    })
    .unwrap();
    for (i, (out, input)) in outputs.iter().zip(&inputs).enumerate() {
        assert_eq!(
            out.to_vec(),
            input.to_vec(),
            "thread {} round {}",
            i / ROUNDS,
            i % ROUNDS
        );
    }
    cache.reclaim().unwrap();
    assert_eq!(cache.retired_bytes(), 0, "every retire's work has finished");
    cache.free().unwrap();
}

/// `spin_gather(u32 *out, const u32 *const *table, u32 blocks, u32 len, u64 ns)`.
const GATHER_PTX: &str = include_str!("../examples/kernels/spin_gather.ptx");

/// One round of the new paths with faults injected (`out` holds three blocks: one gathered, two
/// for the refused launch): a write, a read back for another stream and a
/// block table uploaded from it and gathered there, refusals (a read back and a reuse that cut a
/// write, a write through a handle read back, a launch through a table naming a retired page, a
/// read back for a stream of another scope), a reuse, a retire, and a drop or a free of the buffer.
fn new_paths_round(
    ctx: &Context,
    round: u32,
    streams: (&Stream, &Stream),
    gather: &cuda_vmm::module::Function<'_>,
    table: &mut cuda_vmm::stream::BlockTable<u32>,
    out: &mut cuda_vmm::DeviceBuffer<u32>,
    host: (&mut PinnedBuffer<u32>, &mut PinnedBuffer<u32>),
) {
    let device = ctx.device();
    let g = granularity(device);
    let (input, output) = host;
    let n = input.len();
    let block = n * 4;
    let data = pattern(n, round);
    input.copy_from_slice(&data).unwrap();
    let mut cache = VirtualBuffer::new(4 * g, &[device], ReadWrite).unwrap();
    // Two pages, so that the second is retired alone.
    cache.grow(device, g).unwrap();
    cache.grow(device, g).unwrap();
    let (mut out_view, mut spare) = out.as_mut_slice().split_at_mut(n).unwrap();
    let stranger = Stream::new(ctx).unwrap();
    cuda_vmm::scope(|s| {
        let (append, attend) = (s.on(streams.0), s.on(streams.1));
        let kv = cache.in_scope(s);
        let mut first = kv.write::<u32>(0..block)?;
        append.copy_from_host(&mut first, &*input)?;
        let mut second = kv.write::<u32>(g..g + block)?;
        append.memset(&mut second, 0)?;
        assert!(
            page_range(&kv.read_back::<u32>(0..block / 2, attend)).is_some(),
            "a cut read back"
        );
        assert!(
            page_range(&kv.reuse::<u32>(0..block / 2, append)).is_some(),
            "a cut reuse"
        );
        let x_back = kv.read_back::<u32>(0..block, attend)?;
        let y_back = kv.read_back::<u32>(g..g + block, attend)?;
        assert!(
            page_range(&append.memset(&mut first, 1)).is_some(),
            "a write read back"
        );
        let mut table = table.in_scope(attend);
        table.upload([x_back, y_back])?;
        kv.retire(g..2 * g)?;
        // SAFETY: `spin_gather(u32*, const u32* const*, u32, u32, u64)`: it would read `n` values
        // through each of the 2 addresses and write `2 * n` values of `spare`; refused before.
        let refused = unsafe {
            attend.launch(
                gather,
                GRID,
                BLOCK,
                (&mut spare, &table, 2u32, n as u32, 0u64),
            )
        };
        assert!(
            page_range(&refused).is_some(),
            "a table naming a retired page"
        );
        table.upload([x_back])?;
        // SAFETY: as above: it reads `n` values through the first address, writes `n` of `out`.
        let (gathered, (), (), (), ()) = unsafe {
            attend.launch(
                gather,
                GRID,
                BLOCK,
                (&mut out_view, &table, 1u32, n as u32, 0u64),
            )?
        };
        attend.copy_to_host(&mut *output, gathered)?;
        if round.is_multiple_of(2) {
            let mut again = kv.reuse::<u32>(0..block, append)?;
            append.memset(&mut again, 0xff)?;
        } else {
            let outsider = cuda_vmm::scope(|inner| {
                let refused = kv.read_back::<u32>(0..block, inner.on(&stranger));
                Ok(matches!(refused, Err(Error::StreamRefused { .. })))
            })?;
            assert!(outsider, "a read back for a stream of another scope");
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(output.to_vec(), data, "round {round}: the gathered block");
    if round.is_multiple_of(3) {
        cache.free().unwrap();
    } // else dropped, with a retire pending or not: the same teardown.
}

/// 10 000 rounds of the new paths (writes, read backs across streams, reuses, block tables,
/// retires), with faults injected, leave free memory where it was, to the byte.
#[test]
fn new_path_rounds_with_faults_leak_nothing() {
    let _serial = serial();
    let Some((_, ctx)) = gpu_or_skip("new_path_rounds_with_faults_leak_nothing") else {
        return;
    };
    let module = Module::load_ptx(
        &ctx,
        &CString::new(GATHER_PTX).expect("PTX has no NUL byte"),
    )
    .unwrap();
    let gather = module.function(c"spin_gather").unwrap();
    let n = 1024;
    let mut table = cuda_vmm::stream::BlockTable::<u32>::new(&ctx, 2, n, 2).unwrap();
    let mut out = cuda_vmm::DeviceBuffer::<u32>::zeroed(&ctx, 3 * n).unwrap();
    let mut input = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let mut output = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
    let streams = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut round = |r: u32| {
        new_paths_round(
            &ctx,
            r,
            (&streams.0, &streams.1),
            &gather,
            &mut table,
            &mut out,
            (&mut input, &mut output),
        );
    };
    round(0);
    let settle = || {
        streams.0.synchronize().unwrap();
        streams.1.synchronize().unwrap();
    };
    settle();
    let free_before = ctx.memory_info().unwrap().0;
    let rounds = 10_000;
    let started = std::time::Instant::now();
    for r in 1..=rounds {
        round(r);
    }
    settle();
    let free_after = ctx.memory_info().unwrap().0;
    println!(
        "{rounds} rounds of the new paths in {:.1} s: free before {free_before}, after {free_after}",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        free_after,
        free_before,
        "leaked {} bytes",
        free_before.abs_diff(free_after)
    );
}
