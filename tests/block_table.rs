//! Block tables against a real driver: a kernel reads a scoped buffer's blocks through one argument
//! (`BlockTable`), built only from views the scope lent, uploaded by queued work and refreshed
//! between launches without a host wait; a page a table names, retired while a kernel that uses
//! the table runs, is released only after that kernel, and the table's next launch is refused with
//! the page's bytes named; and a decode loop appends on one stream and gathers the whole history,
//! read back block by block, through the table on another; a kernel writes blocks through a table
//! of `Rewritable`s, read back on another stream. Every test skips visibly without a GPU.
//! The tests take one lock, since they measure free memory.

mod common;

use std::ffi::CString;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use common::{gpu_or_skip, pattern};
use cuda_vmm::stream::BlockTable;
use cuda_vmm::{
    Context, Device, DeviceBuffer, Error, Event, Granularity, Module, PinnedBuffer, ReadWrite,
    Stream, VirtualBuffer, align_size, allocation_granularity,
};

/// `spin_gather(u32 *out, const u32 *const *table, u32 blocks, u32 len, u64 ns)`: waits `ns`
/// nanoseconds, then `out[b * len + i] = table[b][i]`.
const GATHER_PTX: &str = include_str!("../examples/kernels/spin_gather.ptx");
const GRID: (u32, u32, u32) = (64, 1, 1);
const BLOCK: (u32, u32, u32) = (256, 1, 1);
/// Long enough that a release which did not wait for the kernel shows.
const SPIN: Duration = Duration::from_millis(300);
/// Values of each block.
const LEN: usize = 1024;
/// Steps of the decode loop.
const STEPS: usize = 6;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

fn gather_module(ctx: &Context) -> Module {
    Module::load_ptx(ctx, &CString::new(GATHER_PTX).expect("PTX has no NUL byte")).unwrap()
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap()
}

fn granularity(device: Device) -> usize {
    allocation_granularity(device, Granularity::Minimum).unwrap()
}

fn free_memory(ctx: &Context) -> usize {
    ctx.memory_info().unwrap().0
}

/// Maps, retires and releases one page, so that free memory is measured after the driver's
/// first-call bookkeeping.
fn warm_up(ctx: &Context) {
    let device = ctx.device();
    let g = granularity(device);
    let stream = Stream::new(ctx).unwrap();
    let mut buffer = VirtualBuffer::new(g, &[device], ReadWrite).unwrap();
    buffer.grow(device, g).unwrap();
    buffer.retire_after(&stream, ..).unwrap();
    stream.synchronize().unwrap();
    buffer.reclaim().unwrap();
    buffer.free().unwrap();
}

/// Four blocks written into a page; a table of three of them, in another order, gathered by a
/// kernel; the table refreshed with two others (no host wait) and gathered again on the same
/// stream. Each gather holds exactly the blocks of its upload. An upload of a block of another
/// length, or of more blocks than the capacity, and a launch on another stream, are refused.
#[test]
fn a_kernel_reads_blocks_through_a_table_refreshed_between_launches() {
    let _serial = serial();
    let Some((device, ctx)) =
        gpu_or_skip("a_kernel_reads_blocks_through_a_table_refreshed_between_launches")
    else {
        return;
    };
    let g = granularity(device);
    let bytes = LEN * 4;
    let module = gather_module(&ctx);
    let gather = module.function(c"spin_gather").unwrap();
    let data: Vec<Vec<u32>> = (0..4).map(|b| pattern(LEN, 40 + b)).collect();
    let uploads: Vec<PinnedBuffer<u32>> = data
        .iter()
        .map(|d| PinnedBuffer::from_slice(&ctx, d).unwrap())
        .collect();
    let mut out = DeviceBuffer::<u32>::zeroed(&ctx, 6 * LEN).unwrap();
    let (mut first, rest) = out.as_mut_slice().split_at_mut(3 * LEN).unwrap();
    let (mut second, mut spare) = rest.split_at_mut(2 * LEN).unwrap();
    let mut first_host = PinnedBuffer::<u32>::zeroed(&ctx, 3 * LEN).unwrap();
    let mut second_host = PinnedBuffer::<u32>::zeroed(&ctx, 2 * LEN).unwrap();
    let mut table = BlockTable::<u32>::new(&ctx, 3, LEN, 2).unwrap();
    let (work, other) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut cache = VirtualBuffer::new(2 * g, &[device], ReadWrite).unwrap();
    cache.grow(device, g).unwrap();

    cuda_vmm::scope(|s| {
        let (w, other) = (s.on(&work), s.on(&other));
        let kv = cache.in_scope(s);
        let mut blocks = Vec::new();
        for (b, upload) in uploads.iter().enumerate() {
            let mut slot = kv.write::<u32>(b * bytes..(b + 1) * bytes)?;
            blocks.push(w.copy_from_host(&mut slot, upload)?);
        }
        let short = kv.read::<u32>(8 * bytes..8 * bytes + 4)?;
        let mut table = table.in_scope(w);
        assert!(matches!(
            table.upload([short]),
            Err(Error::LengthMismatch {
                expected: LEN,
                found: 1
            })
        ));
        assert!(matches!(
            table.upload(blocks.iter().copied()),
            Err(Error::OutOfBounds { len: 3, .. })
        ));
        table.upload([blocks[3], blocks[0], blocks[2]])?;
        // SAFETY: `spin_gather(u32*, const u32* const*, u32, u32, u64)`: it reads `LEN` values
        // through each of the first 3 addresses of the table and writes `3 * LEN` values of `out`.
        let (gathered, (), (), (), ()) = unsafe {
            w.launch(
                &gather,
                GRID,
                BLOCK,
                (&mut first, &table, 3u32, LEN as u32, 0u64),
            )?
        };
        w.copy_to_host(&mut first_host, gathered)?;
        assert!(
            matches!(
                // SAFETY: as above; refused before the launch.
                unsafe {
                    other.launch(
                        &gather,
                        GRID,
                        BLOCK,
                        (&mut spare, &table, 1u32, LEN as u32, 0u64),
                    )
                },
                Err(Error::StreamRefused { .. })
            ),
            "a launch on another stream than the table's"
        );
        table.upload([blocks[1], blocks[3]])?;
        // SAFETY: as above, 2 blocks.
        let (gathered, (), (), (), ()) = unsafe {
            w.launch(
                &gather,
                GRID,
                BLOCK,
                (&mut second, &table, 2u32, LEN as u32, 0u64),
            )?
        };
        w.copy_to_host(&mut second_host, gathered)?;
        Ok(())
    })
    .unwrap();
    assert_eq!(
        first_host.to_vec(),
        [data[3].clone(), data[0].clone(), data[2].clone()].concat(),
        "the first upload's blocks, in its order"
    );
    assert_eq!(
        second_host.to_vec(),
        [data[1].clone(), data[3].clone()].concat(),
        "the refreshed table's blocks"
    );
    cache.free().unwrap();
}

/// A table names a block of a 64 MiB page; a 300 ms kernel gathers through it; the page is retired
/// meanwhile. The retire returns while the kernel runs, nothing is released until it has finished
/// (reclaim finds nothing, free memory does not move), then exactly the page's bytes come back. The
/// table's next launch is refused, naming the block's bytes. The kernel read the block's values.
#[test]
fn a_page_a_table_names_is_released_only_after_the_kernel_that_used_it() {
    let _serial = serial();
    let Some((device, ctx)) =
        gpu_or_skip("a_page_a_table_names_is_released_only_after_the_kernel_that_used_it")
    else {
        return;
    };
    let g = granularity(device);
    let big = align_size(64 << 20, g).unwrap();
    let bytes = LEN * 4;
    let module = gather_module(&ctx);
    let gather = module.function(c"spin_gather").unwrap();
    let (kept, doomed) = (pattern(LEN, 61), pattern(LEN, 67));
    let kept_in = PinnedBuffer::from_slice(&ctx, &kept).unwrap();
    let doomed_in = PinnedBuffer::from_slice(&ctx, &doomed).unwrap();
    let mut out = DeviceBuffer::<u32>::zeroed(&ctx, 4 * LEN).unwrap();
    let (mut first, mut again) = out.as_mut_slice().split_at_mut(2 * LEN).unwrap();
    let mut host = PinnedBuffer::<u32>::zeroed(&ctx, 2 * LEN).unwrap();
    let mut table = BlockTable::<u32>::new(&ctx, 4, LEN, 2).unwrap();
    let work = Stream::new(&ctx).unwrap();
    let done = Event::new(&ctx).unwrap();
    warm_up(&ctx);
    let free_at_start = free_memory(&ctx);
    let mut cache = VirtualBuffer::new(2 * big, &[device], ReadWrite).unwrap();
    cache.grow(device, big).unwrap();
    cache.grow(device, big).unwrap();

    let mut released = 0usize;
    let mut ran_on = false;
    cuda_vmm::scope(|s| {
        let w = s.on(&work);
        let kv = cache.in_scope(s);
        let mut a = kv.write::<u32>(0..bytes)?;
        let mut b = kv.write::<u32>(big..big + bytes)?;
        let a = w.copy_from_host(&mut a, &kept_in)?;
        let b = w.copy_from_host(&mut b, &doomed_in)?;
        let mut table = table.in_scope(w);
        table.upload([a, b])?;
        // SAFETY: `spin_gather(u32*, const u32* const*, u32, u32, u64)`: it reads `LEN` values
        // through each of the first 2 addresses of the table and writes `2 * LEN` values of `out`.
        let (gathered, (), (), (), ()) = unsafe {
            w.launch(
                &gather,
                GRID,
                BLOCK,
                (&mut first, &table, 2u32, LEN as u32, nanos(SPIN)),
            )?
        };
        w.copy_to_host(&mut host, gathered)?;
        w.record(&done)?;

        assert_eq!(kv.retire(big..2 * big)?, 1);
        ran_on = !done.is_complete()?;
        let free_retired = free_memory(&ctx);
        assert_eq!(kv.reclaim()?, 0, "released while the kernel runs");
        assert_eq!(
            free_memory(&ctx),
            free_retired,
            "memory moved while the kernel runs"
        );
        match unsafe {
            // SAFETY: as above; refused before the launch.
            w.launch(
                &gather,
                GRID,
                BLOCK,
                (&mut again, &table, 2u32, LEN as u32, 0u64),
            )
        } {
            Err(Error::PageRange { start, end, .. }) => {
                assert_eq!((start, end), (big, 2 * big), "the retired page, named");
            }
            other => panic!("a launch through a table naming a retired page: {other:?}"),
        }
        done.synchronize()?; // the test's own wait, standing in for time passing
        released = kv.reclaim()?;
        assert_eq!(
            free_memory(&ctx),
            free_retired + big,
            "the page's bytes came back"
        );
        Ok(())
    })
    .unwrap();
    assert!(ran_on, "the retire waited for the kernel on the host");
    assert_eq!(released, 1);
    assert_eq!(
        host.to_vec(),
        [kept, doomed].concat(),
        "the kernel read both blocks"
    );
    cache.free().unwrap();
    assert_eq!(free_memory(&ctx), free_at_start, "leaked");
}

/// A decode loop in one scope, on two streams: each step appends one block (a token's K/V) on
/// `append`, reads every block of the history back for `attend` (ordered after the appends by the
/// crate's events), uploads them into the table and gathers them on `attend`; the host never waits
/// inside the loop. Every step's gather holds exactly the history so far; at the end the sequence's
/// page is retired and released once the gathers have run, to the byte.
#[test]
fn a_decode_loop_appends_on_one_stream_and_gathers_the_history_on_another() {
    let _serial = serial();
    let Some((device, ctx)) =
        gpu_or_skip("a_decode_loop_appends_on_one_stream_and_gathers_the_history_on_another")
    else {
        return;
    };
    let g = granularity(device);
    let bytes = LEN * 4;
    let module = gather_module(&ctx);
    let gather = module.function(c"spin_gather").unwrap();
    let tokens: Vec<Vec<u32>> = (0..STEPS).map(|t| pattern(LEN, 300 + t as u32)).collect();
    let uploads: Vec<PinnedBuffer<u32>> = tokens
        .iter()
        .map(|t| PinnedBuffer::from_slice(&ctx, t).unwrap())
        .collect();
    let mut outs: Vec<DeviceBuffer<u32>> = (1..=STEPS)
        .map(|k| DeviceBuffer::zeroed(&ctx, k * LEN).unwrap())
        .collect();
    let mut out_views: Vec<_> = outs.iter_mut().map(DeviceBuffer::as_mut_slice).collect();
    let mut hosts: Vec<PinnedBuffer<u32>> = (1..=STEPS)
        .map(|k| PinnedBuffer::zeroed(&ctx, k * LEN).unwrap())
        .collect();
    let mut table = BlockTable::<u32>::new(&ctx, STEPS, LEN, 2).unwrap();
    let (append, attend) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    warm_up(&ctx);
    let free_at_start = free_memory(&ctx);
    let mut cache = VirtualBuffer::new(2 * g, &[device], ReadWrite).unwrap();
    cache.grow(device, g).unwrap();

    let mut released = 0usize;
    cuda_vmm::scope(|s| {
        let (append, attend) = (s.on(&append), s.on(&attend));
        let kv = cache.in_scope(s);
        let mut table = table.in_scope(attend);
        let steps = uploads
            .iter()
            .zip(out_views.iter_mut())
            .zip(hosts.iter_mut());
        for (step, ((upload, step_out), down)) in steps.enumerate() {
            let mut slot = kv.write::<u32>(step * bytes..(step + 1) * bytes)?;
            append.copy_from_host(&mut slot, upload)?;
            let history = (0..=step)
                .map(|b| kv.read_back::<u32>(b * bytes..(b + 1) * bytes, attend))
                .collect::<Result<Vec<_>, _>>()?;
            table.upload(history)?;
            let blocks = u32::try_from(step + 1).unwrap();
            // SAFETY: `spin_gather(u32*, const u32* const*, u32, u32, u64)`: it reads `LEN` values
            // through each of the first `blocks` addresses and writes `blocks * LEN` values.
            let (gathered, (), (), (), ()) = unsafe {
                attend.launch(
                    &gather,
                    GRID,
                    BLOCK,
                    (step_out, &table, blocks, LEN as u32, 0u64),
                )?
            };
            attend.copy_to_host(down, gathered)?;
        }
        assert_eq!(kv.retire(..)?, 1);
        attend.synchronize()?; // the test's own wait, standing in for time passing
        append.synchronize()?;
        released = kv.reclaim()?;
        Ok(())
    })
    .unwrap();
    assert_eq!(
        released, 1,
        "the sequence's page, released after the gathers"
    );
    for (step, host) in hosts.iter().enumerate() {
        assert_eq!(
            host.to_vec(),
            tokens[..=step].concat(),
            "step {step}: the whole history"
        );
    }
    cache.free().unwrap();
    assert_eq!(free_memory(&ctx), free_at_start, "leaked");
}

/// `scatter(u32 *const *table, const u32 *src, u32 blocks, u32 len)`: `table[b][i] = src[b * len + i]`.
const SCATTER_PTX: &str = include_str!("../examples/kernels/scatter.ptx");

/// A kernel writes three blocks of a scoped buffer through a table of their `Rewritable`s
/// (`upload_mut`), on one stream; the blocks are read back for another stream, whose downloads see
/// the kernel's values (the read back is ordered after the table's stream). Once read back, the
/// table's next launch is refused, naming a block's bytes.
#[test]
fn a_kernel_writes_blocks_through_a_table_and_they_are_read_back_elsewhere() {
    let _serial = serial();
    let Some((device, ctx)) =
        gpu_or_skip("a_kernel_writes_blocks_through_a_table_and_they_are_read_back_elsewhere")
    else {
        return;
    };
    let g = granularity(device);
    let bytes = LEN * 4;
    let module = Module::load_ptx(
        &ctx,
        &CString::new(SCATTER_PTX).expect("PTX has no NUL byte"),
    )
    .unwrap();
    let scatter = module.function(c"scatter").unwrap();
    let data = pattern(3 * LEN, 83);
    let input = PinnedBuffer::from_slice(&ctx, &data).unwrap();
    let mut src = DeviceBuffer::<u32>::zeroed(&ctx, 3 * LEN).unwrap();
    let mut src_view = src.as_mut_slice();
    let mut downloads: Vec<PinnedBuffer<u32>> = (0..3)
        .map(|_| PinnedBuffer::zeroed(&ctx, LEN).unwrap())
        .collect();
    let mut table = BlockTable::<u32>::new(&ctx, 3, LEN, 2).unwrap();
    let (work, down) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut cache = VirtualBuffer::new(2 * g, &[device], ReadWrite).unwrap();
    cache.grow(device, g).unwrap();

    cuda_vmm::scope(|s| {
        let (w, d) = (s.on(&work), s.on(&down));
        let kv = cache.in_scope(s);
        let uploaded = w.copy_from_host(&mut src_view, &input)?;
        // Blocks 2, 0 and 5 of the page, in that order.
        let slots = [2usize, 0, 5]
            .map(|b| kv.write::<u32>(b * bytes..(b + 1) * bytes))
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        let mut table = table.in_scope(w);
        table.upload_mut(slots)?;
        // SAFETY: `scatter(u32* const*, const u32*, u32, u32)`: it writes `LEN` values through each
        // of the table's 3 writable blocks and reads `3 * LEN` values of `src`.
        unsafe { w.launch(&scatter, GRID, BLOCK, (&table, uploaded, 3u32, LEN as u32))? };
        for (b, download) in [2usize, 0, 5].into_iter().zip(downloads.iter_mut()) {
            let back = kv.read_back::<u32>(b * bytes..(b + 1) * bytes, d)?;
            d.copy_to_host(download, back)?;
        }
        // SAFETY: as above; refused before the launch.
        match unsafe { w.launch(&scatter, GRID, BLOCK, (&table, uploaded, 3u32, LEN as u32)) } {
            Err(Error::PageRange { start, end, .. }) => {
                assert_eq!(
                    (start, end),
                    (2 * bytes, 3 * bytes),
                    "the first block, named"
                );
            }
            other => panic!("a write through a table of blocks read back: {other:?}"),
        }
        Ok(())
    })
    .unwrap();
    for (i, download) in downloads.iter().enumerate() {
        assert_eq!(
            download.to_vec(),
            data[i * LEN..(i + 1) * LEN],
            "block {i} of the table, as the kernel wrote it"
        );
    }
    cache.free().unwrap();
}
