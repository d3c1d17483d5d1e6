use super::simd::{widen_rows, Simd};
use super::{run_block, Block, Isa, State, Step, KT};
use crate::attention::softmax::EXP2_POLY;
use crate::dtype::KvDtype;
use std::arch::x86_64::*;

mod vnni;

/// The AVX-512F micro-kernels; `VNNI`: q8_0 keys by integer dot products
/// (`vnni`) instead of widening them to f32.
#[derive(Clone, Copy)]
pub(crate) struct Avx512<const VNNI: bool>;

/// Runs one block with the AVX-512F micro-kernels.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn block_avx512(b: &Block<'_>, st: &mut State<'_>) {
    // SAFETY: the caller checked avx512f; the block comes from a validated geometry.
    unsafe { run_block::<Avx512<false>>(b, st) }
}

/// [`block_avx512`] with q8_0 keys by VNNI integer dot products.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn block_avx512_vnni(b: &Block<'_>, st: &mut State<'_>) {
    // SAFETY: the caller checked avx512f, bw and vnni; the block comes from a validated geometry.
    unsafe { run_block::<Avx512<true>>(b, st) }
}

/// Lane `i` of the result is the horizontal sum of `v[i]`: a transpose-add
/// tree (30 shuffles, 30 adds for 16 vectors instead of 16 full reductions).
#[inline(always)]
unsafe fn hsum16(v: &[__m512; 16]) -> __m512 {
    // SAFETY (whole fn): register-only AVX-512F ops; the caller runs with AVX-512F.
    unsafe {
        let mut s = [_mm512_setzero_ps(); 8];
        for (i, si) in s.iter_mut().enumerate() {
            let (a, b) = (v[2 * i], v[2 * i + 1]);
            *si = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
        }
        let mut u = [_mm512_setzero_ps(); 4];
        for (i, ui) in u.iter_mut().enumerate() {
            let a = _mm512_castps_pd(s[2 * i]);
            let b = _mm512_castps_pd(s[2 * i + 1]);
            *ui = _mm512_add_ps(
                _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
            );
        }
        // 0b10_00_10_00 picks 128-bit blocks [0, 2 | 0, 2]; 0b11_01_11_01 picks [1, 3 | 1, 3].
        let w0 = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b1000_1000>(u[0], u[1]),
            _mm512_shuffle_f32x4::<0b1101_1101>(u[0], u[1]),
        );
        let w1 = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b1000_1000>(u[2], u[3]),
            _mm512_shuffle_f32x4::<0b1101_1101>(u[2], u[3]),
        );
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b1000_1000>(w0, w1),
            _mm512_shuffle_f32x4::<0b1101_1101>(w0, w1),
        )
    }
}

#[inline(always)]
fn tail_mask(n: usize) -> __mmask16 {
    if n >= 16 {
        0xFFFF
    } else {
        ((1u32 << n) - 1) as __mmask16
    }
}

/// Bytes ahead of the current K / V line that the kernels prefetch (one
/// line per line consumed, issued inside the FMA loops), into L2 (T1).
/// Measured with 32-key tiles (decode ctx 8192, 1 thread, cold): T0 at 16,
/// 32 or 64 KiB ahead 6.8-7.0 ms, NTA 7.0 ms; T1 at 16-32 KiB 4.4-4.5 ms,
/// 48 KiB 4.8 ms; T2 4.6 ms (read floor 3.0 ms). Prefetching into L1 fills
/// its few miss buffers; adding a second, short-distance T0 prefetch (1 or
/// 4 KiB) on top of T1 made no measurable difference. With 64-key tiles
/// this is one tile (32 KiB) ahead (the decode step, `super::stored`,
/// prefetches the same distance; a V distance of 2 tiles measured no better).
const PF_BYTES: usize = 4 * KT * 128;

#[inline(always)]
unsafe fn prefetch(p: *const f32) {
    // SAFETY: a prefetch is a hint that never faults; the address is only computed.
    unsafe { _mm_prefetch::<_MM_HINT_T1>(p.cast::<i8>().wrapping_add(PF_BYTES)) };
}

/// `2^x` lane-wise, like `super::exp2`: NaN and x below -150 give 0 (between
/// -150 and -126 a denormal instead of 0).
#[inline(always)]
unsafe fn exp2_ps(x: __m512) -> __m512 {
    // SAFETY (whole fn): register-only AVX-512F ops; the caller runs with AVX-512F.
    unsafe {
        // max_ps returns the second operand when x is NaN.
        let x = _mm512_max_ps(x, _mm512_set1_ps(-160.0));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
        let f = _mm512_mul_ps(_mm512_sub_ps(x, n), _mm512_set1_ps(std::f32::consts::LN_2));
        let [first, rest @ ..] = EXP2_POLY;
        let mut p = _mm512_set1_ps(first);
        for c in rest {
            p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
        }
        _mm512_scalef_ps(p, n)
    }
}

/// Dot products of 4 query rows with 4 key rows (`out[i * 4 + jj]`), K
/// prefetched ahead when `pf`.
///
/// # Safety
/// Every pointer addresses a whole row of `hd` floats; AVX-512F.
#[inline(always)]
unsafe fn block4x4(qp: &[*const f32; 4], kp: &[*const f32; 4], hd: usize, pf: bool) -> [f32; 16] {
    let full = hd / 16;
    let tm = tail_mask(hd % 16);
    // SAFETY (whole fn): offsets stay below hd; the tail uses masked loads
    // that touch only the row's own elements.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); 16];
        for c in 0..full {
            let o = c * 16;
            let q = [
                _mm512_loadu_ps(qp[0].add(o)),
                _mm512_loadu_ps(qp[1].add(o)),
                _mm512_loadu_ps(qp[2].add(o)),
                _mm512_loadu_ps(qp[3].add(o)),
            ];
            for jj in 0..4 {
                let kv = _mm512_loadu_ps(kp[jj].add(o));
                if pf {
                    prefetch(kp[jj].add(o));
                }
                for i in 0..4 {
                    acc[i * 4 + jj] = _mm512_fmadd_ps(q[i], kv, acc[i * 4 + jj]);
                }
            }
        }
        if tm != 0 {
            let o = full * 16;
            let q = [
                _mm512_maskz_loadu_ps(tm, qp[0].add(o)),
                _mm512_maskz_loadu_ps(tm, qp[1].add(o)),
                _mm512_maskz_loadu_ps(tm, qp[2].add(o)),
                _mm512_maskz_loadu_ps(tm, qp[3].add(o)),
            ];
            for jj in 0..4 {
                let kv = _mm512_maskz_loadu_ps(tm, kp[jj].add(o));
                for i in 0..4 {
                    acc[i * 4 + jj] = _mm512_fmadd_ps(q[i], kv, acc[i * 4 + jj]);
                }
            }
        }
        let mut out = [0.0f32; 16];
        _mm512_storeu_ps(out.as_mut_ptr(), hsum16(&acc));
        out
    }
}

impl<const VNNI: bool> Isa for Avx512<VNNI> {
    #[inline(always)]
    unsafe fn decode_rows(dtype: KvDtype, src: *const u8, n_rows: usize, hd: usize, dst: *mut f32) {
        // SAFETY: the trait contract; the register path only for whole vectors.
        unsafe { widen_rows::<Self>(dtype, src, n_rows, hd, dst) }
    }

    #[inline(always)]
    fn stored_ok(nr: usize, hd: usize) -> bool {
        nr <= 4 && hd.is_multiple_of(16)
    }

    // The float scratch-tile kernels give the stored step's bits (the same
    // loads, FMA chains and `hsum16`), so only VNNI, whose q8_0 key scores
    // are integer dots on the stored step alone, runs every block that way.
    const STORED_GROUPS: bool = VNNI;

    #[inline(always)]
    fn q8_row_bytes(hd: usize) -> usize {
        vnni::row_stride(hd)
    }

    #[inline(always)]
    unsafe fn quantize_q(qs: *const f32, nr: usize, hd: usize, out: *mut u8) -> *const u8 {
        if !VNNI || !hd.is_multiple_of(64) {
            return std::ptr::null();
        }
        // SAFETY: the trait contract (4 * nr * hd bytes cover vnni's layout).
        unsafe { vnni::quantize(qs, nr, hd, out) };
        out
    }

    #[inline(always)]
    unsafe fn scores_pv_stored(s: Step) {
        // SAFETY: forwarded contract (stored_ok held: nr <= 4, hd % 16 == 0).
        unsafe { super::stored::scores_pv_stored::<Self>(s) }
    }

    #[inline(always)]
    unsafe fn scores(qs: *const f32, nr: usize, k: *const f32, nk: usize, hd: usize, sc: *mut f32) {
        let mut r0 = 0;
        while r0 < nr {
            // The first row block streams the tile: it prefetches ahead.
            let pf = r0 == 0;
            // Rows/keys past the edge repeat the last valid one (valid memory,
            // results dropped), so the 4×4 block shape is fixed.
            let qp: [*const f32; 4] =
                core::array::from_fn(|i| qs.wrapping_add((r0 + i).min(nr - 1) * hd));
            let mut j0 = 0;
            while j0 < nk {
                let kp: [*const f32; 4] =
                    core::array::from_fn(|i| k.wrapping_add((j0 + i).min(nk - 1) * hd));
                // SAFETY: every pointer addresses a whole row of hd floats inside
                // qs / k (contract of `scores`).
                let sums = unsafe { block4x4(&qp, &kp, hd, pf) };
                for i in 0..4.min(nr - r0) {
                    for jj in 0..4.min(nk - j0) {
                        // SAFETY: r0+i < nr and j0+jj < nk <= KT: inside sc's nr*KT floats.
                        unsafe { *sc.add((r0 + i) * KT + j0 + jj) = sums[i * 4 + jj] };
                    }
                }
                j0 += 4;
            }
            r0 += 4;
        }
    }

    #[inline(always)]
    unsafe fn pv(p: *const f32, nr: usize, v: *const f32, nk: usize, hd: usize, acc: *mut f32) {
        let mut r0 = 0;
        while r0 < nr {
            let pr = p.wrapping_add(r0 * KT);
            let ar = acc.wrapping_add(r0 * hd);
            // SAFETY: rows r0..r0+R (R <= nr - r0) of p and acc, all nk rows of v,
            // per the contract of `pv`.
            unsafe {
                match nr - r0 {
                    1 => pv_rows::<1>(pr, v, nk, hd, ar, r0 == 0),
                    2 => pv_rows::<2>(pr, v, nk, hd, ar, r0 == 0),
                    3 => pv_rows::<3>(pr, v, nk, hd, ar, r0 == 0),
                    _ => pv_rows::<4>(pr, v, nk, hd, ar, r0 == 0),
                }
            }
            r0 += 4;
        }
    }

    #[inline(always)]
    unsafe fn softmax_row(row: &mut [f32; KT], va: usize, vb: usize, m_old: f32) -> (f32, f32) {
        const NV: usize = KT / 16;
        // Lanes [va, vb) of the KT-lane row (KT <= 64).
        let bits: u64 = (u64::MAX >> (64 - vb)) & !((1u64 << va) - 1);
        let rp = row.as_mut_ptr();
        // SAFETY: row holds KT = 16·NV floats; register ops otherwise; the
        // caller runs with AVX-512F (trait contract).
        unsafe {
            let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
            let mut s = [ninf; NV];
            let mut mx = ninf;
            for (v, sv) in s.iter_mut().enumerate() {
                let k = (bits >> (16 * v)) as __mmask16;
                *sv = _mm512_mask_loadu_ps(ninf, k, rp.add(16 * v));
                mx = _mm512_max_ps(mx, *sv);
            }
            let mn = m_old.max(_mm512_reduce_max_ps(mx));
            let mb = _mm512_set1_ps(mn);
            let mut sum = _mm512_setzero_ps();
            for (v, sv) in s.iter().enumerate() {
                let p = exp2_ps(_mm512_sub_ps(*sv, mb));
                sum = _mm512_add_ps(sum, p);
                _mm512_storeu_ps(rp.add(16 * v), p);
            }
            (mn, _mm512_reduce_add_ps(sum))
        }
    }
}

/// `acc[i] += Σ_j p[i*KT + j] · v[j]` for `R <= 4` rows, 64 columns per
/// pass held in 4·R registers, so each V line is loaded once for all R rows
/// (and, for R = 4, a decode GQA group of 4 reads V from L2 exactly once);
/// masked 16-column tail. `pf`: prefetch ahead of V.
#[inline(always)]
unsafe fn pv_rows<const R: usize>(
    p: *const f32,
    v: *const f32,
    nk: usize,
    hd: usize,
    acc: *mut f32,
    pf: bool,
) {
    // SAFETY (whole fn): p has R rows of KT floats, v has nk rows of hd floats,
    // acc has R rows of hd floats; every offset below is < those bounds, the
    // tail uses masked loads/stores.
    unsafe {
        let mut d = 0;
        while d + 64 <= hd {
            let mut a = [[_mm512_setzero_ps(); 4]; R];
            for (i, ai) in a.iter_mut().enumerate() {
                for (c, x) in ai.iter_mut().enumerate() {
                    *x = _mm512_loadu_ps(acc.add(i * hd + d + 16 * c));
                }
            }
            for j in 0..nk {
                let vr = v.add(j * hd + d);
                let x: [__m512; 4] = core::array::from_fn(|c| _mm512_loadu_ps(vr.add(16 * c)));
                if pf {
                    for c in 0..4 {
                        prefetch(vr.add(16 * c));
                    }
                }
                for (i, ai) in a.iter_mut().enumerate() {
                    let pb = _mm512_set1_ps(*p.add(i * KT + j));
                    for c in 0..4 {
                        ai[c] = _mm512_fmadd_ps(pb, x[c], ai[c]);
                    }
                }
            }
            for (i, ai) in a.iter().enumerate() {
                for (c, x) in ai.iter().enumerate() {
                    _mm512_storeu_ps(acc.add(i * hd + d + 16 * c), *x);
                }
            }
            d += 64;
        }
        while d < hd {
            let m = tail_mask(hd - d);
            let mut a = [_mm512_setzero_ps(); R];
            for (i, x) in a.iter_mut().enumerate() {
                *x = _mm512_maskz_loadu_ps(m, acc.add(i * hd + d));
            }
            for j in 0..nk {
                let x = _mm512_maskz_loadu_ps(m, v.add(j * hd + d));
                for (i, ai) in a.iter_mut().enumerate() {
                    *ai = _mm512_fmadd_ps(_mm512_set1_ps(*p.add(i * KT + j)), x, *ai);
                }
            }
            for (i, x) in a.iter().enumerate() {
                _mm512_mask_storeu_ps(acc.add(i * hd + d), m, *x);
            }
            d += 16;
        }
    }
}

impl<const VNNI: bool> Simd for Avx512<VNNI> {
    type R = __m512;
    const W: usize = 16;
    const KB: usize = 4;
    // SAFETY (every method): AVX-512F per the trait contract; pointers as documented.
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn loadu(p: *const f32) -> __m512 {
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn storeu(p: *mut f32, x: __m512) {
        unsafe { _mm512_storeu_ps(p, x) }
    }
    #[inline(always)]
    unsafe fn set1(x: f32) -> __m512 {
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn hsum(acc: &[__m512; 16], out: &mut [f32; 16]) {
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), hsum16(acc)) }
    }
    #[inline(always)]
    unsafe fn f16(p: *const u8) -> __m512 {
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
    #[inline(always)]
    unsafe fn bf16(p: *const u8) -> __m512 {
        unsafe {
            let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(h))
        }
    }
    #[inline(always)]
    unsafe fn q8_scale(d: u16) -> __m512 {
        unsafe { _mm512_cvtph_ps(_mm256_set1_epi16(d as i16)) }
    }
    #[inline(always)]
    unsafe fn q8_mul(scale: __m512, q: *const u8) -> __m512 {
        unsafe {
            let q = _mm_loadu_si128(q.cast());
            _mm512_mul_ps(scale, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)))
        }
    }
    const INT8: bool = VNNI;
    #[inline(always)]
    unsafe fn q8_dots<const R: usize>(
        q8: *const u8,
        kp: &[*const u8; 4],
        hd: usize,
        out: &mut [f32; 16],
    ) {
        unsafe { vnni::dots::<R>(q8, kp, hd, out) }
    }
}
