//! What the attention benches share: deterministic data and the streaming-read
//! floor they compare against.
#![allow(dead_code, clippy::indexing_slicing, clippy::unwrap_used)]

/// One sequence's causal read of pool rows `0..ctx` (every head `ctx` slots deep).
pub fn causal_spec<'a>(
    k: offgraph_kv::KvRows<'a>,
    v: offgraph_kv::KvRows<'a>,
    (n_kv_heads, head_dim): (usize, usize),
    ctx: usize,
    positions: &'a [usize],
) -> offgraph_kv::AttendSpec<'a> {
    use offgraph_kv::{KeyLayout, MaskKind, Run, Runs};
    offgraph_kv::AttendSpec {
        k,
        v,
        n_kv_heads,
        head_dim,
        slots: ctx,
        positions,
        keys: KeyLayout::Runs {
            read: Runs::one(Run::new(0, ctx)),
            read_base_pos: 0,
            mask: MaskKind::Causal,
        },
    }
}

pub fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761).max(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

/// Sum with 32 independent lanes so the loop is bound by loads, not add latency
/// (the cache flush; the floor is [`read_kv`]).
pub fn read_sum(x: &[f32]) -> f32 {
    let mut acc = [0f32; 32];
    let mut it = x.chunks_exact(32);
    for c in &mut it {
        for i in 0..32 {
            acc[i] += c[i];
        }
    }
    acc.iter().sum::<f32>() + it.remainder().iter().sum::<f32>()
}

/// Bytes ahead of the current line that the floor prefetches into L2, as the
/// kernel does (one 64-key tile of 128 floats).
#[cfg(target_arch = "x86_64")]
const PF_BYTES: usize = 32 << 10;

/// Reads two equal-length byte streams side by side (K and V, as the kernel
/// does) with AVX-512 loads into 8 independent accumulators, prefetching
/// ahead into L2. Returns a sum so nothing is optimised away.
///
/// # Safety
/// AVX-512F; `k` and `v` hold `n` bytes each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn stream2_avx512(k: *const u8, v: *const u8, n: usize) -> f32 {
    use std::arch::x86_64::*;
    // SAFETY: every load is below n bytes of its stream; prefetches never fault.
    unsafe {
        let mut a = [_mm512_setzero_ps(); 8];
        let mut o = 0;
        while o + 256 <= n {
            for l in 0..4 {
                _mm_prefetch::<_MM_HINT_T1>(k.wrapping_add(o + PF_BYTES + 64 * l).cast());
                _mm_prefetch::<_MM_HINT_T1>(v.wrapping_add(o + PF_BYTES + 64 * l).cast());
            }
            for l in 0..4 {
                a[l] = _mm512_add_ps(a[l], _mm512_loadu_ps(k.add(o + 64 * l).cast()));
                a[4 + l] = _mm512_add_ps(a[4 + l], _mm512_loadu_ps(v.add(o + 64 * l).cast()));
            }
            o += 256;
        }
        let mut s = a[0];
        for x in &a[1..] {
            s = _mm512_add_ps(s, *x);
        }
        let mut tail = 0.0f32;
        while o < n {
            tail += (*k.add(o) as f32) + (*v.add(o) as f32);
            o += 1;
        }
        _mm512_reduce_add_ps(s) + tail
    }
}

/// [`stream2_avx512`] with AVX loads (CPUs without AVX-512): 8 independent
/// 256-bit accumulators over 128 bytes of K and 128 of V per step.
///
/// # Safety
/// AVX; `k` and `v` hold `n` bytes each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn stream2_avx2(k: *const u8, v: *const u8, n: usize) -> f32 {
    use std::arch::x86_64::*;
    // SAFETY: every load is below n bytes of its stream; prefetches never fault.
    unsafe {
        let mut a = [_mm256_setzero_ps(); 8];
        let mut o = 0;
        while o + 128 <= n {
            for l in 0..2 {
                _mm_prefetch::<_MM_HINT_T1>(k.wrapping_add(o + PF_BYTES + 64 * l).cast());
                _mm_prefetch::<_MM_HINT_T1>(v.wrapping_add(o + PF_BYTES + 64 * l).cast());
            }
            for l in 0..4 {
                a[l] = _mm256_add_ps(a[l], _mm256_loadu_ps(k.add(o + 32 * l).cast()));
                a[4 + l] = _mm256_add_ps(a[4 + l], _mm256_loadu_ps(v.add(o + 32 * l).cast()));
            }
            o += 128;
        }
        let mut s = a[0];
        for x in &a[1..] {
            s = _mm256_add_ps(s, *x);
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), s);
        let mut tail = 0.0f32;
        while o < n {
            tail += (*k.add(o) as f32) + (*v.add(o) as f32);
            o += 1;
        }
        lanes.iter().sum::<f32>() + tail
    }
}

/// The widest vector loads this CPU has: what [`read_kv`] streams with.
pub fn floor_isa() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if offgraph_kv::cpu::features().avx512f {
            return "avx512";
        }
        if offgraph_kv::cpu::features().avx {
            return "avx";
        }
    }
    "scalar"
}

/// One thread's share of the floor: its K and V bytes read side by side.
fn stream2(k: &[u8], v: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if k.len() == v.len() && offgraph_kv::cpu::features().avx512f {
        // SAFETY: AVX-512F detected; both slices hold k.len() bytes.
        return unsafe { stream2_avx512(k.as_ptr(), v.as_ptr(), k.len()) };
    }
    #[cfg(target_arch = "x86_64")]
    if k.len() == v.len() && offgraph_kv::cpu::features().avx {
        // SAFETY: AVX detected; both slices hold k.len() bytes.
        return unsafe { stream2_avx2(k.as_ptr(), v.as_ptr(), k.len()) };
    }
    let words = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    read_sum(&words(k)) + read_sum(&words(v))
}

fn as_bytes(x: &[f32]) -> &[u8] {
    // SAFETY: u8 has no invalid values and alignment 1; same allocation.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<u8>(), std::mem::size_of_val(x)) }
}

/// The streaming-read floor: K and V (as f32 words, whatever they store) read
/// once, split over `threads` like the kernel splits KV heads (contiguous
/// ranges, the caller's thread being one of them), each thread reading its K
/// and V ranges side by side with the widest SIMD loads the CPU has
/// ([`floor_isa`]: AVX-512, else AVX).
pub fn read_kv(k: &[f32], v: &[f32], threads: usize) -> f32 {
    let (k, v) = (as_bytes(k), as_bytes(v));
    if threads == 1 {
        return stream2(k, v);
    }
    // Split on 256-byte boundaries so each share is whole SIMD steps.
    let share = |n: usize, t: usize| (n * t / threads) & !255;
    let range = |n: usize, t: usize| {
        let end = if t + 1 == threads { n } else { share(n, t + 1) };
        share(n, t)..end
    };
    std::thread::scope(|s| {
        let hs: Vec<_> = (1..threads)
            .map(|t| {
                let (kk, vv) = (&k[range(k.len(), t)], &v[range(v.len(), t)]);
                s.spawn(move || stream2(kk, vv))
            })
            .collect();
        let first = stream2(&k[range(k.len(), 0)], &v[range(v.len(), 0)]);
        first + hs.into_iter().map(|h| h.join().unwrap()).sum::<f32>()
    })
}

/// GFLOP/s of a register-only FMA loop (10 independent 8-lane chains) on
/// `threads` threads: the best of 5 runs, the arithmetic ceiling that warm
/// and prefill rows are compared against.
pub fn fma_peak(threads: usize) -> f64 {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn spin(n: usize) -> f32 {
        use std::arch::x86_64::*;
        // SAFETY: AVX2 and FMA detected by the caller; registers only.
        unsafe {
            let mut a = [_mm256_set1_ps(1.0); 10];
            let (m, c) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
            for _ in 0..n {
                for x in &mut a {
                    *x = _mm256_fmadd_ps(*x, m, c);
                }
            }
            let mut s = [0f32; 8];
            _mm256_storeu_ps(
                s.as_mut_ptr(),
                a.iter().fold(c, |x, y| _mm256_add_ps(x, *y)),
            );
            s.iter().sum()
        }
    }
    #[cfg(target_arch = "x86_64")]
    if offgraph_kv::cpu::features().avx2 && offgraph_kv::cpu::features().fma {
        let n = 2_000_000usize;
        let flops = (n * 10 * 16 * threads) as f64;
        let mut best = 0f64;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            std::thread::scope(|s| {
                let hs: Vec<_> = (1..threads)
                    // SAFETY: AVX2 and FMA detected above.
                    .map(|_| s.spawn(move || std::hint::black_box(unsafe { spin(n) })))
                    .collect();
                // SAFETY: AVX2 and FMA detected above.
                std::hint::black_box(unsafe { spin(n) });
                hs.into_iter().for_each(|h| {
                    h.join().unwrap();
                });
            });
            best = best.max(flops / t.elapsed().as_secs_f64() / 1e9);
        }
        return best;
    }
    f64::NAN
}

/// A pool of `dtype` rows in f32 words (4-byte aligned storage for its bytes).
pub fn pool(dtype: offgraph_kv::KvDtype, values: &[f32]) -> Vec<f32> {
    let n = dtype.row_bytes(values.len());
    let mut words = vec![0f32; n.div_ceil(4)];
    // SAFETY: the f32 vector holds at least n bytes; u8 has no invalid values.
    let bytes = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), n) };
    assert!(offgraph_kv::dtype::encode(dtype, values, bytes));
    words
}
