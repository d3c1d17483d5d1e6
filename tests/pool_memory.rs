//! The pools' memory model: a reservation keeps every pool's address across
//! growth (a view taken early reads rows written later), `clear` and a cell
//! cache's `trim` give pages back, and the copy-growth fallback passes the
//! same behaviour suite (`suite!` runs it once per memory).

mod common;

use common::Rng;
use offgraph_kv::kv::Pool;
use offgraph_kv::{
    attend, AttendOptions, CacheConfig, CacheError, KvCellCache, KvDtype, KvSequenceCache,
    LayerConfig, LayerPolicy, PoolMemory,
};

const HEADS: usize = 2;
const DIM: usize = 32;

fn cfg(policy: LayerPolicy, capacity: usize, dtype: KvDtype) -> CacheConfig {
    let mut c = CacheConfig::new(capacity, 2, vec![LayerConfig::new(policy, HEADS, DIM)]);
    c.max_step = 64;
    c.initial_capacity = 4;
    c.k_dtype = dtype;
    c.v_dtype = dtype;
    c
}

fn rows(rng: &mut Rng, t: usize) -> Vec<f32> {
    (0..HEADS * t * DIM).map(|_| rng.f32()).collect()
}

fn opts() -> AttendOptions {
    AttendOptions {
        threads: Some(1),
        ..AttendOptions::default()
    }
}

/// Runs `steps` (token counts) through a fresh-seeded sequence cache and
/// returns the attention output of every step and layer.
fn run_seq(cache: &mut KvSequenceCache, steps: &[usize], seed: u64) -> Vec<Vec<f32>> {
    let mut rng = Rng::new(seed);
    let mut outs = Vec::new();
    for &n in steps {
        cache.begin_step(n).unwrap();
        for layer in 0..2 {
            let (k, v) = (rows(&mut rng, n), rows(&mut rng, n));
            let q: Vec<f32> = (0..2 * HEADS * n * DIM).map(|_| rng.f32()).collect();
            let spec = cache.update(layer, &k, &v).unwrap();
            outs.push(attend(&q, [2 * HEADS, n, DIM], &spec, &opts()).unwrap());
        }
    }
    outs
}

const DTYPES: [KvDtype; 4] = [
    KvDtype::Float32,
    KvDtype::Float16,
    KvDtype::Bfloat16,
    KvDtype::Q8_0,
];

fn clear_then_refill_attends_alike(mem: PoolMemory) {
    for dtype in DTYPES {
        for policy in [LayerPolicy::Flat, LayerPolicy::Ring { window: 40 }] {
            let steps = [37, 1, 1, 64, 1, 30, 1];
            let mut c = KvSequenceCache::with_memory(cfg(policy, 512, dtype), mem).unwrap();
            let first = run_seq(&mut c, &steps, 7);
            let peak = c.nbytes_total();
            assert!(peak > 0);
            c.clear();
            assert_eq!(c.nbytes_total(), 0, "clear drops the high-water mark");
            let again = run_seq(&mut c, &steps, 7);
            assert_eq!(first, again, "{dtype:?} {policy:?}: refill after clear");
            assert_eq!(c.nbytes_total(), peak);
            let mut fresh = KvSequenceCache::with_memory(cfg(policy, 512, dtype), mem).unwrap();
            assert_eq!(run_seq(&mut fresh, &steps, 7), first);
        }
    }
}

/// nbytes is the rows' bytes at the high-water mark, whatever the memory;
/// reserved_bytes covers at least that; a rewind keeps both.
fn nbytes_counts_rows(mem: PoolMemory) {
    let mut c =
        KvSequenceCache::with_memory(cfg(LayerPolicy::Flat, 1000, KvDtype::Float32), mem).unwrap();
    assert_eq!(c.pool_memory(), mem);
    run_seq(&mut c, &[50, 1, 1], 3);
    let per_row = HEADS * DIM * 4 * 2; // K and V, float32
    assert_eq!(c.nbytes_total(), 2 * 52 * per_row);
    assert_eq!(c.nbytes(0).unwrap(), 52 * per_row);
    match mem {
        PoolMemory::Reserve => assert_eq!(c.reserved_bytes(), 2 * 1000 * per_row),
        PoolMemory::Grow => assert_eq!(c.reserved_bytes(), 2 * 64 * per_row),
    }
    c.rewind(10).unwrap();
    assert_eq!(c.nbytes_total(), 2 * 52 * per_row, "a rewind keeps pages");
    c.clear();
    assert_eq!(c.nbytes_total(), 0);
    if mem == PoolMemory::Grow {
        assert_eq!(c.pool(0).unwrap().slots(), 4, "clear shrinks a grown pool");
    }
}

/// trim gives back pages of free cells only: survivors attend as before,
/// and the high-water mark falls to the highest live cell.
fn trim_keeps_live_cells(mem: PoolMemory) {
    for dtype in DTYPES {
        let mut c =
            KvCellCache::with_memory(cfg(LayerPolicy::Flat, 4096, dtype), 1024, 8, mem).unwrap();
        let mut rng = Rng::new(11);
        let seqs: Vec<_> = (0..4).map(|_| c.cells_mut().seq_new().unwrap()).collect();
        // 4 sequences x 200 tokens, interleaved 50 at a time.
        for chunk in 0..4 {
            for &s in &seqs {
                let ids = vec![s; 50];
                let pos: Vec<usize> = (chunk * 50..chunk * 50 + 50).collect();
                c.begin_step(&ids, &pos).unwrap();
                for layer in 0..2 {
                    c.update(layer, &rows(&mut rng, 50), &rows(&mut rng, 50))
                        .unwrap();
                }
            }
        }
        let survivor = seqs[1];
        let q: Vec<f32> = (0..2 * HEADS * DIM).map(|_| rng.f32()).collect();
        let (k1, v1) = (rows(&mut rng, 1), rows(&mut rng, 1));
        let step = |c: &mut KvCellCache| {
            c.begin_step(&[survivor], &[200]).unwrap();
            let spec = c.update(0, &k1, &v1).unwrap();
            let out = attend(&q, [2 * HEADS, 1, DIM], &spec, &opts()).unwrap();
            c.cells_mut().seq_rm(survivor, 200, None).unwrap();
            out
        };
        let before = step(&mut c);
        let high = c.nbytes_total();
        for &s in [seqs[0], seqs[2], seqs[3]].iter() {
            c.cells_mut().seq_free(s).unwrap();
        }
        c.trim().unwrap();
        // The step's own cell moves (lowest free first), so the sum order of
        // the softmax may differ: equal up to rounding.
        let after = step(&mut c);
        for (a, b) in after.iter().zip(&before) {
            assert!(
                (a - b).abs() <= 1e-5,
                "{dtype:?}: trim changed a live row: {a} vs {b}"
            );
        }
        // Cells were taken lowest-free-first, so the survivor's last cell is
        // below 4 x 200: the high-water mark fell.
        assert!(c.nbytes_total() < high, "{dtype:?}");
        c.clear();
        assert_eq!(c.nbytes_total(), 0);
    }
}

/// A config whose reservation cannot fit the address space still builds
/// (the pools grow by copying) and serves steps; a pool whose bytes overflow
/// `usize` is an error, not an abort.
fn huge_depths(mem: PoolMemory) {
    let mut c = CacheConfig::new(
        1 << 31,
        1,
        vec![LayerConfig::new(LayerPolicy::Flat, 64, 4096)],
    );
    c.initial_capacity = 1;
    c.max_step = 4;
    let mut kv = KvSequenceCache::with_memory(c, mem).unwrap();
    assert_eq!(
        kv.pool_memory(),
        PoolMemory::Grow,
        "2 PiB cannot be reserved"
    );
    kv.begin_step(2).unwrap();
    let r = vec![0.5f32; 64 * 2 * 4096];
    kv.update(0, &r, &r).unwrap();
    assert_eq!(kv.nbytes_total(), 2 * 64 * 2 * 4096 * 4);
    let err = Pool::with_memory(
        usize::MAX / 2,
        8,
        1,
        1 << 20,
        KvDtype::Float32,
        KvDtype::Float32,
        mem,
    )
    .unwrap_err();
    assert!(matches!(err, CacheError::OutOfCapacity(_)), "{err:?}");
}

/// Tests of this file run one at a time: two of them read the process's
/// resident memory, which another test's pools would move meanwhile.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

macro_rules! suite {
    ($name:ident, $mem:expr) => {
        mod $name {
            use super::*;
            #[test]
            fn clear_then_refill_attends_alike() {
                let _serial = super::serial();
                super::clear_then_refill_attends_alike($mem)
            }
            #[test]
            fn nbytes_counts_rows() {
                let _serial = super::serial();
                super::nbytes_counts_rows($mem)
            }
            #[test]
            fn trim_keeps_live_cells() {
                let _serial = super::serial();
                super::trim_keeps_live_cells($mem)
            }
            #[test]
            fn huge_depths() {
                let _serial = super::serial();
                super::huge_depths($mem)
            }
        }
    };
}

suite!(reserve, PoolMemory::Reserve);
suite!(grow, PoolMemory::Grow);

/// Growth across many boundaries keeps every pool's address, and a view (the
/// shared buffer) taken at the first step reads rows written thousands of
/// steps later.
#[test]
fn reservation_keeps_addresses_and_views_see_later_rows() {
    let _serial = serial();
    let mut c = KvSequenceCache::with_memory(
        cfg(LayerPolicy::Flat, 1 << 14, KvDtype::Float32),
        PoolMemory::Reserve,
    )
    .unwrap();
    let mut rng = Rng::new(5);
    c.begin_step(1).unwrap();
    for layer in 0..2 {
        c.update(layer, &rows(&mut rng, 1), &rows(&mut rng, 1))
            .unwrap();
    }
    let base: Vec<usize> = (0..2)
        .map(|l| c.pool(l).unwrap().k().bytes.as_ptr() as usize)
        .collect();
    let (early_k, _) = c.pool(1).unwrap().buffers();
    let mut last = Vec::new();
    for _ in 1..10_000 {
        c.begin_step(1).unwrap();
        for layer in 0..2 {
            last = rows(&mut rng, 1);
            c.update(layer, &last, &rows(&mut rng, 1)).unwrap();
        }
    }
    for (l, &b) in base.iter().enumerate() {
        assert_eq!(c.pool(l).unwrap().k().bytes.as_ptr() as usize, b);
    }
    // Head 1's row 9999 of layer 1, through the buffer taken at step 1.
    let slots = c.pool(1).unwrap().slots();
    let at = (slots + 9_999) * DIM * 4;
    let got: Vec<f32> = early_k.as_bytes()[at..at + DIM * 4]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(got, last[DIM..]);
    drop(c);
    // The view outlives the cache.
    assert_eq!(early_k.as_bytes()[at..at + 4], last[DIM].to_le_bytes());
}

/// Resident memory of this process, in bytes (Linux).
#[cfg(target_os = "linux")]
fn rss() -> usize {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// `clear` and `trim` give committed pages back: resident memory drops by
/// most of what the rows took.
#[cfg(target_os = "linux")]
#[test]
fn clear_and_trim_lower_resident_memory() {
    let _serial = serial();
    const MIB: usize = 1 << 20;
    let mut c = CacheConfig::new(8192, 1, vec![LayerConfig::new(LayerPolicy::Flat, 8, 128)]);
    c.max_step = 512;
    let mut kv = KvSequenceCache::with_memory(c.clone(), PoolMemory::Reserve).unwrap();
    let r = vec![0.25f32; 8 * 512 * 128];
    let before = rss();
    for _ in 0..16 {
        kv.begin_step(512).unwrap();
        kv.update(0, &r, &r).unwrap();
    }
    let rows = 2 * 8 * 8192 * 128 * 4; // 64 MiB of K and V
    let full = rss();
    assert!(
        full >= before + rows * 9 / 10,
        "{} MiB committed",
        (full - before) / MIB
    );
    kv.clear();
    let after = rss();
    assert!(
        full - after >= rows * 9 / 10,
        "clear gave back {} MiB",
        (full - after) / MIB
    );

    // A cell cache: 8 sequences of 1024 cells, 7 freed, trimmed.
    let mut kc = KvCellCache::with_memory(c, 8192, 8, PoolMemory::Reserve).unwrap();
    let seqs: Vec<_> = (0..8).map(|_| kc.cells_mut().seq_new().unwrap()).collect();
    for &s in &seqs {
        for chunk in 0..2 {
            let pos: Vec<usize> = (chunk * 512..chunk * 512 + 512).collect();
            kc.begin_step(&vec![s; 512], &pos).unwrap();
            kc.update(0, &r, &r).unwrap();
        }
    }
    let full = rss();
    for &s in &seqs[1..] {
        kc.cells_mut().seq_free(s).unwrap();
    }
    kc.trim().unwrap();
    let after = rss();
    assert!(
        full - after >= rows * 7 / 8 * 9 / 10,
        "trim gave back {} MiB",
        (full - after) / MIB
    );
}

/// Whether the page holding `p` is resident (Linux `mincore`).
#[cfg(target_os = "linux")]
fn resident(p: *const u8) -> bool {
    let page = 4096usize;
    let lo = (p as usize) & !(page - 1);
    let mut v = 0u8;
    // SAFETY: one page of a live mapping, one status byte out.
    let rc = unsafe { libc::mincore(lo as *mut libc::c_void, page, &mut v) };
    assert_eq!(rc, 0, "mincore");
    v & 1 == 1
}

/// A reservation commits each head's first page up front and every later
/// page before the row that first writes it, at a step that differs per
/// head: rows written token by token never meet a fresh page, and the heads
/// do not all take their next page in the same step.
#[cfg(target_os = "linux")]
#[test]
fn pages_are_committed_ahead_of_rows_at_staggered_steps() {
    let _serial = serial();
    const H: usize = 16;
    const D: usize = 128; // float16: 256-byte rows, 16 to a 4 KiB page
    const DEPTH: usize = 4096;
    let f16 = KvDtype::Float16;
    let mut pool = Pool::with_memory(H, D, 1, DEPTH, f16, f16, PoolMemory::Reserve).unwrap();
    if pool.memory() != PoolMemory::Reserve {
        return; // the OS refused; the fallback has no pages to commit
    }
    let rb = 2 * D;
    let base = |side: usize, pool: &Pool| {
        if side == 0 {
            pool.k().bytes.as_ptr()
        } else {
            pool.v().bytes.as_ptr()
        }
    };
    let at = |pool: &Pool, side: usize, h: usize, row: usize| {
        // SAFETY: inside the reservation (h < H, row < DEPTH).
        unsafe { base(side, pool).add((h * DEPTH + row) * rb) }
    };
    for side in 0..2 {
        for h in 0..H {
            assert!(resident(at(&pool, side, h, 0)), "first page of head {h}");
        }
    }
    let row = vec![0.5f32; H * D];
    let mut steps_committing = std::collections::BTreeSet::new();
    for t in 0..200 {
        for side in 0..2 {
            for h in 0..H {
                if t % 16 == 0 {
                    assert!(
                        resident(at(&pool, side, h, t)),
                        "row {t} of head {h} found its page fresh"
                    );
                }
            }
        }
        let ahead: Vec<bool> = (0..2 * H)
            .map(|r| t + 1 < DEPTH && resident(at(&pool, r / H, r % H, (t / 16 + 1) * 16)))
            .collect();
        pool.ensure(t + 1).unwrap();
        pool.write_rows(&row, &row, 1, 0, t, 1).unwrap();
        for (r, &was) in ahead.iter().enumerate() {
            if !was && resident(at(&pool, r / H, r % H, (t / 16 + 1) * 16)) {
                steps_committing.insert(t % 16);
            }
        }
        // Nothing is committed further than the next page.
        for side in 0..2 {
            for h in 0..H {
                assert!(
                    !resident(at(&pool, side, h, (t / 16 + 2) * 16)),
                    "two pages ahead"
                );
            }
        }
    }
    assert!(
        steps_committing.len() >= 4,
        "heads take their next page at {steps_committing:?} of each page's 16 steps"
    );
}
