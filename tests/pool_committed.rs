//! `committed_bytes`: the memory a pool holds now. A reservation counts its
//! resident pages: the pages rows were written on (and the one committed ahead
//! of a write), less the whole pages `trim` (`release_runs`) and `clear`
//! (`release_all`) gave back; a grown pool counts its whole buffers.

#![cfg(target_os = "linux")]

use offgraph_kv::kv::Pool;
use offgraph_kv::{CacheConfig, KvDtype, KvSequenceCache, LayerConfig, LayerPolicy, PoolMemory};

const HEADS: usize = 2;
const DIM: usize = 64;
const ROW: usize = DIM * 4; // float32
const DEPTH: usize = 1024;

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap()
}

fn pool(memory: PoolMemory) -> Pool {
    Pool::with_memory(
        HEADS,
        DIM,
        16,
        DEPTH,
        KvDtype::Float32,
        KvDtype::Float32,
        memory,
    )
    .unwrap()
}

fn write(p: &mut Pool, slot: usize, n: usize) {
    let rows: Vec<f32> = (0..HEADS * n * DIM).map(|i| i as f32).collect();
    p.write_rows(&rows, &rows, n, 0, slot, n).unwrap();
}

#[test]
fn a_reservation_counts_the_pages_rows_were_written_on_less_what_was_given_back() {
    let page = page();
    let mut p = pool(PoolMemory::Reserve);
    assert_eq!(p.memory(), PoolMemory::Reserve);
    let head_sides = 2 * HEADS; // K and V of each head: a run of DEPTH rows each
    assert_eq!(p.reserved_bytes(), head_sides * DEPTH * ROW);
    // A new pool commits each head's first page (or nothing, on a kernel that
    // cannot commit ahead): never more.
    let fresh = p.committed_bytes();
    assert!(
        fresh == head_sides * page || fresh == 0,
        "fresh: {fresh} bytes"
    );

    // Rows 0..n of every head: ceil(n * ROW / page) pages per head and side,
    // plus at most the one committed ahead of the write.
    let n = 5 * page / ROW + page / ROW / 2; // five and a half pages of rows
    write(&mut p, 0, n);
    let written = p.committed_bytes();
    let touched = (n * ROW).div_ceil(page);
    assert!(
        written >= head_sides * touched * page && written <= head_sides * (touched + 1) * page,
        "{n} rows: {written} bytes committed, {touched} pages per head and side touched"
    );
    assert!(written < p.reserved_bytes() / 4);

    // A trim of rows [page rows, n): the whole pages 1..5 of every head and
    // side go back, the partly covered last page stays.
    let per_page = page / ROW;
    p.release_runs(&[(per_page, n - per_page)], per_page);
    let trimmed = p.committed_bytes();
    assert_eq!(written - trimmed, head_sides * 4 * page);

    // clear gives every page back.
    p.release_all();
    assert_eq!(p.committed_bytes(), 0);
    // Writing again commits again.
    write(&mut p, 0, per_page);
    assert!(p.committed_bytes() >= head_sides * page);
}

#[test]
fn a_grown_pool_counts_its_whole_buffers() {
    let mut p = pool(PoolMemory::Grow);
    assert_eq!(p.memory(), PoolMemory::Grow);
    assert_eq!(p.committed_bytes(), p.reserved_bytes());
    p.ensure(200).unwrap();
    write(&mut p, 0, 200);
    assert_eq!(p.committed_bytes(), p.reserved_bytes());
    assert!(p.committed_bytes() >= 2 * HEADS * 200 * ROW);
}

#[test]
fn a_cache_sums_its_pools_and_clear_gives_them_back() {
    let mut c = CacheConfig::new(
        DEPTH,
        2,
        vec![LayerConfig::new(LayerPolicy::Flat, HEADS, DIM)],
    );
    c.max_step = 256;
    let mut kv = KvSequenceCache::new(c).unwrap();
    let before = kv.committed_bytes();
    let rows: Vec<f32> = vec![1.0; HEADS * 256 * DIM];
    for _ in 0..3 {
        kv.begin_step(256).unwrap();
        for layer in 0..2 {
            kv.update(layer, &rows, &rows).unwrap();
        }
    }
    let after = kv.committed_bytes();
    if kv.pool_memory() == PoolMemory::Reserve {
        // 768 rows of 2 layers x 2 heads x K and V.
        assert!(after >= before + 2 * 2 * HEADS * 768 * ROW - 2 * 2 * HEADS * page());
        assert!(after <= kv.reserved_bytes());
        kv.clear();
        assert_eq!(kv.committed_bytes(), 0);
    } else {
        assert_eq!(after, kv.reserved_bytes());
    }
}
