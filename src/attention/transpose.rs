//! Transpose of a chunk of pool rows into the XNNPACK backend's `Vᵀ` scratch.
//!
//! The source is read cold from the pool, so this pass is the V half of the
//! backend's memory traffic: it has to run at streaming speed. Element-wise
//! stores at a stride of `n` floats do not (they cost ~3× the read), so full
//! tiles go through in-register transposes: 16×16 with AVX-512, 8×8 with AVX2,
//! chosen at run time; edges and other CPUs take the blocked scalar loop.
// Tile offsets stay inside the slices' checked lengths (see `transpose`).
#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]

/// `dst[d * n + j] = src[j * hd + d]` for an `n × hd` row-major `src`.
/// Callers pass `src.len() >= n * hd` and `dst.len() >= n * hd`; shorter
/// slices panic on the bounds check below rather than read out of bounds.
///
/// On x86 the tile pass also prefetches `next` into L2, spread over its rows:
/// the backend passes the next chunk's K, so that stream overlaps this one
/// instead of stalling the next K operator (which reads it cold otherwise).
pub(super) fn transpose(src: &[f32], n: usize, hd: usize, dst: &mut [f32], next: &[f32]) {
    let (src, dst) = (&src[..n * hd], &mut dst[..n * hd]);
    #[cfg(target_arch = "x86_64")]
    {
        let mut job = x86::Job {
            src,
            n,
            hd,
            dst,
            next,
        };
        let cpu = crate::cpu::features();
        if cpu.avx512f {
            // SAFETY: avx512f detected; both slices hold n * hd floats.
            let done = unsafe { x86::tiles16(&mut job) };
            return edges(src, n, hd, job.dst, done);
        }
        if cpu.avx {
            // SAFETY: avx detected; both slices hold n * hd floats.
            let done = unsafe { x86::tiles8(&mut job) };
            return edges(src, n, hd, job.dst, done);
        }
        scalar(src, n, hd, job.dst, 0, n, 0, hd);
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = next;
        scalar(src, n, hd, dst, 0, n, 0, hd);
    }
}

/// The part the tile pass left: columns `done.1..hd` of rows `0..done.0`, and
/// rows `done.0..n`.
fn edges(src: &[f32], n: usize, hd: usize, dst: &mut [f32], done: (usize, usize)) {
    let (nj, nd) = done;
    scalar(src, n, hd, dst, 0, nj, nd, hd);
    scalar(src, n, hd, dst, nj, n, 0, hd);
}

/// The blocked scalar transpose of rows `j_lo..j_hi`, columns `d_lo..d_hi`.
#[allow(clippy::too_many_arguments)]
fn scalar(
    src: &[f32],
    n: usize,
    hd: usize,
    dst: &mut [f32],
    j_lo: usize,
    j_hi: usize,
    d_lo: usize,
    d_hi: usize,
) {
    const B: usize = 16;
    let mut j0 = j_lo;
    while j0 < j_hi {
        let j1 = (j0 + B).min(j_hi);
        let mut d0 = d_lo;
        while d0 < d_hi {
            let d1 = (d0 + B).min(d_hi);
            for j in j0..j1 {
                let row = &src[j * hd..j * hd + hd];
                for d in d0..d1 {
                    dst[d * n + j] = row[d];
                }
            }
            d0 = d1;
        }
        j0 = j1;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// One transpose: `n × hd` `src` into `hd × n` `dst` (both `n * hd`
    /// floats), prefetching `next`.
    pub(super) struct Job<'a> {
        pub(super) src: &'a [f32],
        pub(super) n: usize,
        pub(super) hd: usize,
        pub(super) dst: &'a mut [f32],
        pub(super) next: &'a [f32],
    }

    /// Walks the full `w × w` tiles, prefetching `next` an equal share per
    /// row of tiles; returns the rows and columns covered. `tile(s, o)`
    /// transposes the tile at `s` (row stride `hd`) to `o` (row stride `n`).
    #[inline(always)]
    fn tiles(
        w: usize,
        job: &mut Job<'_>,
        mut tile: impl FnMut(*const f32, *mut f32),
    ) -> (usize, usize) {
        let (n, hd) = (job.n, job.hd);
        let (nj, nd) = (n / w * w, hd / w * w);
        let (s, o) = (job.src.as_ptr(), job.dst.as_mut_ptr());
        let mut pf = Prefetch::new(job.next, nj / w);
        for j0 in (0..nj).step_by(w) {
            pf.step();
            for d0 in (0..nd).step_by(w) {
                // SAFETY: rows j0..j0+w and columns d0..d0+w lie inside both
                // src (n × hd) and dst (hd × n), which hold n * hd floats.
                tile(unsafe { s.add(j0 * hd + d0) }, unsafe {
                    o.add(d0 * n + j0)
                });
            }
        }
        pf.rest();
        (nj, nd)
    }

    /// Full 16×16 tiles; returns the rows and columns they covered.
    ///
    /// # Safety
    /// avx512f is available.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tiles16(job: &mut Job<'_>) -> (usize, usize) {
        let (n, hd) = (job.n, job.hd);
        tiles(16, job, |s, o| {
            // SAFETY: `tiles` passes the corners of a full tile of both matrices.
            unsafe {
                let mut r = [_mm512_setzero_ps(); 16];
                for (i, v) in r.iter_mut().enumerate() {
                    *v = _mm512_loadu_ps(s.add(i * hd));
                }
                transpose16(&mut r);
                for (i, v) in r.iter().enumerate() {
                    _mm512_storeu_ps(o.add(i * n), *v);
                }
            }
        })
    }

    /// In-register 16×16 transpose: lane pairs, then 2×2 blocks, then
    /// 128-bit quarters in two rounds.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn transpose16(r: &mut [__m512; 16]) {
        let mut t = [_mm512_setzero_ps(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        for i in 0..4 {
            let b = 4 * i;
            r[b] = _mm512_shuffle_ps::<0x44>(t[b], t[b + 2]);
            r[b + 1] = _mm512_shuffle_ps::<0xEE>(t[b], t[b + 2]);
            r[b + 2] = _mm512_shuffle_ps::<0x44>(t[b + 1], t[b + 3]);
            r[b + 3] = _mm512_shuffle_ps::<0xEE>(t[b + 1], t[b + 3]);
        }
        for h in 0..2 {
            let b = 8 * h;
            for c in 0..4 {
                t[b + c] = _mm512_shuffle_f32x4::<0x88>(r[b + c], r[b + 4 + c]);
                t[b + 4 + c] = _mm512_shuffle_f32x4::<0xDD>(r[b + c], r[b + 4 + c]);
            }
        }
        for c in 0..8 {
            r[c] = _mm512_shuffle_f32x4::<0x88>(t[c], t[8 + c]);
            r[8 + c] = _mm512_shuffle_f32x4::<0xDD>(t[c], t[8 + c]);
        }
    }

    /// Full 8×8 tiles; returns the rows and columns they covered.
    ///
    /// # Safety
    /// avx is available.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn tiles8(job: &mut Job<'_>) -> (usize, usize) {
        let (n, hd) = (job.n, job.hd);
        tiles(8, job, |s, o| {
            // SAFETY: `tiles` passes the corners of a full tile of both matrices.
            unsafe {
                let mut r = [_mm256_setzero_ps(); 8];
                for (i, v) in r.iter_mut().enumerate() {
                    *v = _mm256_loadu_ps(s.add(i * hd));
                }
                let mut t = [_mm256_setzero_ps(); 8];
                for i in 0..4 {
                    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
                    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
                }
                for b in [0, 4] {
                    r[b] = _mm256_shuffle_ps::<0x44>(t[b], t[b + 2]);
                    r[b + 1] = _mm256_shuffle_ps::<0xEE>(t[b], t[b + 2]);
                    r[b + 2] = _mm256_shuffle_ps::<0x44>(t[b + 1], t[b + 3]);
                    r[b + 3] = _mm256_shuffle_ps::<0xEE>(t[b + 1], t[b + 3]);
                }
                for c in 0..4 {
                    let lo = _mm256_permute2f128_ps::<0x20>(r[c], r[4 + c]);
                    let hi = _mm256_permute2f128_ps::<0x31>(r[c], r[4 + c]);
                    _mm256_storeu_ps(o.add(c * n), lo);
                    _mm256_storeu_ps(o.add((4 + c) * n), hi);
                }
            }
        })
    }

    /// L2 prefetch of a slice's cache lines, an equal share per step.
    struct Prefetch<'a> {
        lines: std::slice::ChunksExact<'a, f32>,
        per: usize,
    }

    impl<'a> Prefetch<'a> {
        fn new(next: &'a [f32], steps: usize) -> Self {
            let lines = next.chunks_exact(16);
            let per = lines.len().div_ceil(steps.max(1));
            Self { lines, per }
        }

        #[inline(always)]
        fn step(&mut self) {
            for line in self.lines.by_ref().take(self.per) {
                // SAFETY: a prefetch of an address inside `next` has no other effect.
                unsafe { _mm_prefetch::<_MM_HINT_T1>(line.as_ptr().cast()) };
            }
        }

        fn rest(&mut self) {
            while self.lines.len() > 0 {
                self.step();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(src: &[f32], n: usize, hd: usize) -> Vec<f32> {
        let mut out = vec![0.0; n * hd];
        for j in 0..n {
            for d in 0..hd {
                out[d * n + j] = src[j * hd + d];
            }
        }
        out
    }

    #[test]
    fn matches_reference_on_every_path_and_edge() {
        for (n, hd) in [
            (256, 128),
            (37, 64),
            (16, 16),
            (8, 24),
            (5, 3),
            (100, 80),
            (1, 128),
        ] {
            let src: Vec<f32> = (0..n * hd).map(|i| i as f32).collect();
            let want = reference(&src, n, hd);
            let mut got = vec![-1.0; n * hd];
            transpose(&src, n, hd, &mut got, &src);
            assert_eq!(got, want, "dispatched n={n} hd={hd}");
            let mut got = vec![-1.0; n * hd];
            scalar(&src, n, hd, &mut got, 0, n, 0, hd);
            assert_eq!(got, want, "scalar n={n} hd={hd}");
            #[cfg(target_arch = "x86_64")]
            for (isa, run) in [
                (
                    "avx512f",
                    x86::tiles16 as unsafe fn(&mut x86::Job<'_>) -> (usize, usize),
                ),
                ("avx", x86::tiles8),
            ] {
                let ok = match isa {
                    "avx512f" => crate::cpu::features().avx512f,
                    _ => crate::cpu::features().avx,
                };
                if !ok {
                    continue;
                }
                let mut got = vec![-1.0; n * hd];
                let mut job = x86::Job {
                    src: &src,
                    n,
                    hd,
                    dst: &mut got,
                    next: &src,
                };
                // SAFETY: the feature was detected; both slices hold n * hd floats.
                let done = unsafe { run(&mut job) };
                edges(&src, n, hd, &mut got, done);
                assert_eq!(got, want, "{isa} n={n} hd={hd}");
            }
        }
    }
}
