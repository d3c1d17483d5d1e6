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

/// Prefetches, into L2, the bytes of values `d..` of the row a tile (`KT`
/// rows of `rb` bytes) ahead, issued beside each load as it is consumed.
/// Decode ctx 8192, 1 thread, cold: T1 at 16-32 KiB ahead 4.4-4.5 ms, 48 KiB
/// 4.8 ms, T0 6.8-7.0 ms (it fills L1's few miss buffers), T2 4.6 ms.
#[inline(always)]
fn prefetch_ahead(row: *const u8, rb: usize, d: usize, hd: usize) {
    let at = row.wrapping_add(KT * rb + d * rb / hd);
    // SAFETY: a prefetch never faults; the address is only computed.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        _mm_prefetch::<_MM_HINT_T1>(at.cast::<i8>())
    };
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

/// The step for `R == s.nr` rows.
#[inline(always)]
unsafe fn rows<S: Simd, const R: usize, K: Load, V: Load>(s: Step) {
    let (hd, krb, vrb) = (s.hd, s.kd.row_bytes(s.hd), s.vd.row_bytes(s.hd));
    let qp: [*const f32; 4] = core::array::from_fn(|i| s.qs.wrapping_add(i.min(R - 1) * hd));
    let mut g = 0;
    // SAFETY (whole loop): key rows clamped into k / v, offsets < hd, R rows
    // of p / acc / sc (contract of `scores_pv_stored`).
    unsafe {
        while g < s.nk.max(s.nkp) {
            let mut j0 = g;
            while j0 < s.nk.min(g + PG) {
                let kp: [*const u8; 4] =
                    core::array::from_fn(|i| s.k.wrapping_add((j0 + i).min(s.nk - 1) * krb));
                let mut sums = [0.0f32; 16];
                if K::Q8 && S::INT8 && !s.q8.is_null() {
                    S::q8_dots::<R>(s.q8, &kp, hd, &mut sums);
                    for r in &kp[..S::KB] {
                        for o in (0..krb).step_by(64) {
                            prefetch_ahead(r.wrapping_add(o), krb, 0, hd);
                        }
                    }
                } else {
                    let mut a = [S::zero(); 16];
                    let mut d = 0;
                    while d < hd {
                        let q: [S::R; R] = core::array::from_fn(|i| S::loadu(qp[i].add(d)));
                        for jj in 0..S::KB {
                            let kv = K::load::<S>(kp[jj], d);
                            prefetch_ahead(kp[jj], krb, d, hd);
                            for i in 0..R {
                                a[i * S::KB + jj] = S::fmadd(q[i], kv, a[i * S::KB + jj]);
                            }
                        }
                        d += S::W;
                    }
                    S::hsum(&a, &mut sums);
                }
                for i in 0..R {
                    for jj in 0..S::KB.min(s.nk - j0) {
                        *s.sc.add(i * KT + j0 + jj) = sums[i * S::KB + jj];
                    }
                }
                j0 += S::KB;
            }
            if g < s.nkp {
                let n = (s.nkp - g).min(PG);
                let mut d = 0;
                while d < hd {
                    let mut a: [S::R; R] =
                        core::array::from_fn(|i| S::loadu(s.acc.add(i * hd + d)));
                    for j in g..g + n {
                        let x = V::load::<S>(s.v.add(j * vrb), d);
                        prefetch_ahead(s.v.add(j * vrb), vrb, d, hd);
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
