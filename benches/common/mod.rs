//! What the attention benches share: deterministic data and the streaming-read
//! floor they compare against.
#![allow(dead_code, clippy::indexing_slicing, clippy::unwrap_used)]

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

/// Sum with 32 independent lanes so the loop is bound by loads, not add latency.
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

/// Reads K and V (as f32 words, whatever they store), split over threads.
pub fn read_kv(k: &[f32], v: &[f32], threads: usize) -> f32 {
    if threads == 1 {
        return read_sum(k) + read_sum(v);
    }
    let (pk, pv) = (k.len().div_ceil(threads), v.len().div_ceil(threads));
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let kk = &k[(t * pk).min(k.len())..((t + 1) * pk).min(k.len())];
                let vv = &v[(t * pv).min(v.len())..((t + 1) * pv).min(v.len())];
                s.spawn(move || read_sum(kk) + read_sum(vv))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    })
}
