//! The model's matrix products: a portable loop, and the same loop compiled
//! for AVX2, so every build computes the same bits.

/// Rows of `out` (`[r, n]`) = rows of `x` (`[r, k]`) · `w` (`[k, n]`), f32
/// accumulated over k in order (no FMA, so every build computes the same
/// bits); `w` is walked in blocks of rows kept in cache.
#[inline(always)]
pub(crate) fn matmul_rows_body(x: &[f32], k: usize, w: &[f32], n: usize, out: &mut [f32]) {
    const KB: usize = 64;
    out.fill(0.0);
    for kb in (0..k).step_by(KB) {
        let ke = (kb + KB).min(k);
        let wb = &w[kb * n..ke * n];
        for (xr, or) in x.chunks_exact(k).zip(out.chunks_exact_mut(n)) {
            for (&xv, wr) in xr[kb..ke].iter().zip(wb.chunks_exact(n)) {
                for (o, &wv) in or.iter_mut().zip(wr) {
                    *o += xv * wv;
                }
            }
        }
    }
}

/// The same loop compiled for AVX2 (wider vectors, same arithmetic).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) fn matmul_rows_avx2(x: &[f32], k: usize, w: &[f32], n: usize, out: &mut [f32]) {
    matmul_rows_body(x, k, w, n, out)
}

pub(crate) fn matmul_rows(x: &[f32], k: usize, w: &[f32], n: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if offgraph_kv::cpu::features().avx2 {
        // SAFETY: the CPU supports AVX2 (checked just above).
        unsafe { matmul_rows_avx2(x, k, w, n, out) };
        return;
    }
    matmul_rows_body(x, k, w, n, out)
}

/// `x [t, k] · w [k, n]` on up to `threads` threads (split by rows, so the
/// result does not depend on the thread count).
pub(crate) fn matmul(
    x: &[f32],
    t: usize,
    k: usize,
    w: &[f32],
    n: usize,
    threads: usize,
) -> Vec<f32> {
    let mut out = vec![0.0f32; t * n];
    let threads = threads.min(t).max(1);
    if threads == 1 || t * k * n < (1 << 16) {
        matmul_rows(x, k, w, n, &mut out);
        return out;
    }
    let rows = t.div_ceil(threads);
    std::thread::scope(|s| {
        let mut parts = x.chunks(rows * k).zip(out.chunks_mut(rows * n));
        let first = parts.next();
        for (xp, op) in parts {
            s.spawn(move || matmul_rows(xp, k, w, n, op));
        }
        if let Some((xp, op)) = first {
            matmul_rows(xp, k, w, n, op);
        }
    });
    out
}
