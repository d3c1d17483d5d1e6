//! The pipelined decode step over K/V rows as stored, generic over the vector
//! ISA: the scores of the next tile (4 query rows × `KB` keys per block) then
//! `P · V` of the previous tile, in groups of `PG` keys so the K and V streams
//! are in flight together, every stored value widened in registers right where
//! it is used. Float32 pools take it too (their loader is a plain load).

use super::simd::{LBf16, Load, Simd, LF16, LF32, LQ8};
use super::{Step, KT};
use crate::dtype::KvDtype;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};

/// Keys per group of the pipelined decode step. Decode ctx 8192, 1 thread,
/// cold (alternating runs, medians): 4 keys 3.2-3.5 ms, 8 keys 3.4-3.8 ms,
/// 16 keys 3.2-3.9 ms, unpipelined 3.6-4.2 ms (read floor 2.5-3.0 ms).
const PG: usize = 4;

/// Prefetches, into L2, each cache line of the row a tile (`KT` rows of
/// `rb` bytes) ahead of `row`: once per line, at the start of the key group
/// that reads `row` (a prefetch per loaded vector spent load slots on lines
/// already requested).
#[inline(always)]
fn prefetch_row_ahead(row: *const u8, rb: usize) {
    let at = row.wrapping_add(KT * rb);
    let mut o = 0;
    while o < rb {
        // SAFETY: a prefetch never faults; the address is only computed.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(o).cast::<i8>())
        };
        o += 64;
    }
}

/// Runs `s` with the loaders of its K and V dtypes.
///
/// # Safety
/// As [`Isa::scores_pv_stored`](super::Isa::scores_pv_stored): `s.nr <= 4`,
/// `s.hd % S::W == 0` (and `% 32` for q8_0); the CPU supports `S`.
#[inline(always)]
pub(super) unsafe fn scores_pv_stored<S: Simd>(s: Step) {
    // SAFETY: forwarded contract.
    unsafe {
        match s.kd {
            KvDtype::Float32 => with_v::<S, LF32>(s),
            KvDtype::Float16 => with_v::<S, LF16>(s),
            KvDtype::Bfloat16 => with_v::<S, LBf16>(s),
            KvDtype::Q8_0 => with_v::<S, LQ8>(s),
        }
    }
}

#[inline(always)]
unsafe fn with_v<S: Simd, K: Load>(s: Step) {
    // SAFETY: forwarded contract.
    unsafe {
        match s.vd {
            KvDtype::Float32 => with_rows::<S, K, LF32>(s),
            KvDtype::Float16 => with_rows::<S, K, LF16>(s),
            KvDtype::Bfloat16 => with_rows::<S, K, LBf16>(s),
            KvDtype::Q8_0 => with_rows::<S, K, LQ8>(s),
        }
    }
}

#[inline(always)]
unsafe fn with_rows<S: Simd, K: Load, V: Load>(s: Step) {
    // SAFETY: forwarded contract (nr <= 4).
    unsafe {
        match s.nr {
            1 => rows::<S, 1, K, V>(s),
            2 => rows::<S, 2, K, V>(s),
            3 => rows::<S, 3, K, V>(s),
            _ => rows::<S, 4, K, V>(s),
        }
    }
}

/// The step for `R == s.nr` rows: each K and V value is loaded and widened
/// once and used by all `R` query rows (the GQA group's heads, or a short
/// step's tokens), each with its own accumulators.
#[inline(always)]
unsafe fn rows<S: Simd, const R: usize, K: Load, V: Load>(s: Step) {
    let (hd, krb, vrb) = (s.hd, s.kd.row_bytes(s.hd), s.vd.row_bytes(s.hd));
    let qp: [*const f32; 4] = core::array::from_fn(|i| s.qs.wrapping_add(i.min(R - 1) * hd));
    // V in pairs of registers where whole pairs tile the row: each broadcast
    // probability then feeds two FMAs, and a q8_0 block's scale is widened
    // once per pair.
    let pairs = hd.is_multiple_of(2 * S::W);
    let mut g = 0;
    // SAFETY (whole loop): key rows clamped into k / v, offsets < hd, R rows
    // of p / acc / sc (contract of `scores_pv_stored`).
    unsafe {
        while g < s.nk.max(s.nkp) {
            for j in g..s.nk.min(g + PG) {
                prefetch_row_ahead(s.k.add(j * krb), krb);
            }
            for j in g..s.nkp.min(g + PG) {
                prefetch_row_ahead(s.v.add(j * vrb), vrb);
            }
            let mut j0 = g;
            while j0 < s.nk.min(g + PG) {
                let kp: [*const u8; 4] =
                    core::array::from_fn(|i| s.k.wrapping_add((j0 + i).min(s.nk - 1) * krb));
                let mut sums = [0.0f32; 16];
                if K::Q8 && S::INT8 && !s.q8.is_null() {
                    S::q8_dots::<R>(s.q8, &kp, hd, &mut sums);
                } else {
                    let mut a = [S::zero(); 16];
                    let mut d = 0;
                    while d < hd {
                        let q: [S::R; R] = core::array::from_fn(|i| S::loadu(qp[i].add(d)));
                        for jj in 0..S::KB {
                            let kv = K::load::<S>(kp[jj], d);
                            for i in 0..R {
                                a[i * S::KB + jj] = S::fmadd(q[i], kv, a[i * S::KB + jj]);
                            }
                        }
                        d += S::W;
                    }
                    S::hsum(&a, &mut sums);
                }
                // Element stores: a slice copy of KB floats here became a
                // memcpy call per row.
                let nj = S::KB.min(s.nk - j0);
                for i in 0..R {
                    for jj in 0..S::KB {
                        if jj < nj {
                            s.sc.add(i * KT + j0 + jj).write(sums[i * S::KB + jj]);
                        }
                    }
                }
                j0 += S::KB;
            }
            if g < s.nkp {
                let n = (s.nkp - g).min(PG);
                let mut d = 0;
                while pairs && d < hd {
                    let mut a0: [S::R; R] =
                        core::array::from_fn(|i| S::loadu(s.acc.add(i * hd + d)));
                    let mut a1: [S::R; R] =
                        core::array::from_fn(|i| S::loadu(s.acc.add(i * hd + d + S::W)));
                    for j in g..g + n {
                        let (x0, x1) = V::load2::<S>(s.v.add(j * vrb), d);
                        for i in 0..R {
                            let p = S::set1(*s.p.add(i * KT + j));
                            a0[i] = S::fmadd(p, x0, a0[i]);
                            a1[i] = S::fmadd(p, x1, a1[i]);
                        }
                    }
                    for i in 0..R {
                        S::storeu(s.acc.add(i * hd + d), a0[i]);
                        S::storeu(s.acc.add(i * hd + d + S::W), a1[i]);
                    }
                    d += 2 * S::W;
                }
                while d < hd {
                    let mut a: [S::R; R] =
                        core::array::from_fn(|i| S::loadu(s.acc.add(i * hd + d)));
                    for j in g..g + n {
                        let x = V::load::<S>(s.v.add(j * vrb), d);
                        for (i, ai) in a.iter_mut().enumerate() {
                            *ai = S::fmadd(S::set1(*s.p.add(i * KT + j)), x, *ai);
                        }
                    }
                    for (i, ai) in a.iter().enumerate() {
                        S::storeu(s.acc.add(i * hd + d), *ai);
                    }
                    d += S::W;
                }
            }
            g += PG;
        }
    }
}
