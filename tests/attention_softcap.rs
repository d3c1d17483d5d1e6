//! Attention logit soft-capping (`AttendOptions::softcap`) against an f64
//! reference (softmax of `cap · tanh(score / cap)` over the visible keys), for
//! decode and prefill, GQA, flat / ring-window / cell layouts, every KV dtype
//! pair, every native ISA this CPU runs, XNNPACK and `auto`; a cap far above
//! the scores changes nothing; bad caps are refused with `out` untouched.
//! Pool rows outside the read runs are NaN, so a read of one shows up as NaN.
#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

mod common;

use common::pool::Pool;
use common::{native_isas, visible_rows, Rng};
use offgraph_kv::attention::{attend, attend_into, AttendOptions, Backend, NativeIsa};
use offgraph_kv::{AttendSpec, CacheError, KeyLayout, KvDtype, KvRows, MaskKind, Run, Runs};

/// (backend, ISA) runs of one call: every native ISA, XNNPACK where built
/// (float32 pools only), and `auto`.
fn variants(k: KvDtype, v: KvDtype) -> Vec<(Backend, NativeIsa)> {
    let mut out: Vec<_> = native_isas()
        .into_iter()
        .map(|i| (Backend::Native, i))
        .collect();
    if Backend::Xnnpack.available() && k == KvDtype::Float32 && v == KvDtype::Float32 {
        out.push((Backend::Xnnpack, NativeIsa::Auto));
    }
    out.push((Backend::Auto, NativeIsa::Auto));
    out
}

/// f64 attention over the decoded pools with every score capped (`cap`).
fn reference(
    q: &[f32],
    nq: usize,
    spec: &AttendSpec<'_>,
    (k, v): (&[f32], &[f32]),
    cap: Option<f64>,
) -> Vec<f64> {
    let (hd, t) = (spec.head_dim, spec.n_tokens());
    let g = nq / spec.n_kv_heads;
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = vec![0f64; q.len()];
    for i in 0..t {
        let rows = visible_rows(spec, i);
        for h in 0..nq {
            let base = (h / g) * spec.slots;
            let qr = &q[(h * t + i) * hd..][..hd];
            let scores: Vec<f64> = rows
                .iter()
                .map(|&s| {
                    let kr = &k[(base + s) * hd..][..hd];
                    let x = qr
                        .iter()
                        .zip(kr)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum::<f64>()
                        * scale;
                    cap.map_or(x, |c| c * (x / c).tanh())
                })
                .collect();
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let z: f64 = w.iter().sum();
            let o = &mut out[(h * t + i) * hd..][..hd];
            for (&s, wj) in rows.iter().zip(&w) {
                let vr = &v[(base + s) * hd..][..hd];
                for d in 0..hd {
                    o[d] += wj / z * f64::from(vr[d]);
                }
            }
        }
    }
    out
}

/// q as the integer-dot paths see it: q8_0 rounding per 32 values.
fn q8_rounded(q: &[f32]) -> Vec<f32> {
    q.chunks(32)
        .flat_map(|blk| {
            let d = blk.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            blk.iter().map(move |v| (v * id).round() * d)
        })
        .collect()
}

/// The ISA `auto` runs on this CPU (as `select_isa` picks it); others as given.
fn auto_resolved(isa: NativeIsa) -> NativeIsa {
    if isa != NativeIsa::Auto {
        return isa;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let f = offgraph_kv::cpu::features();
        if f.avx512f && f.avx512bw && f.avx512vnni {
            return NativeIsa::Avx512Vnni;
        }
        if f.avx512f {
            return NativeIsa::Avx512;
        }
        if f.avx2_fma_f16c() {
            return NativeIsa::Avx2Int8;
        }
    }
    NativeIsa::Scalar
}

/// Whether `isa` scores q8_0 keys by integer dots against a q8_0-rounded
/// q: every row or none, by the ISA and head_dim alone (batch invariance:
/// a row's path does not depend on how many rows share its block).
fn int8_row(isa: NativeIsa, spec: &AttendSpec<'_>) -> bool {
    let int8 = match auto_resolved(isa) {
        NativeIsa::Avx512Vnni => spec.head_dim.is_multiple_of(64),
        NativeIsa::Avx2Int8 => true,
        _ => false,
    };
    int8 && spec.k.dtype == KvDtype::Q8_0
}

/// The reference each output value of a `(backend, isa)` run is held to:
/// `q8` for rows scored by integer dots, else `exact`.
fn expected(
    (backend, isa): (Backend, NativeIsa),
    nq: usize,
    spec: &AttendSpec<'_>,
    exact: &[f64],
    q8: &[f64],
) -> Vec<f64> {
    let (t, hd) = (spec.n_tokens(), spec.head_dim);
    let mut out = exact.to_vec();
    for h in 0..nq {
        for i in 0..t {
            if backend != Backend::Xnnpack && int8_row(isa, spec) {
                let o = (h * t + i) * hd;
                out[o..o + hd].copy_from_slice(&q8[o..o + hd]);
            }
        }
    }
    out
}

fn max_abs(x: &[f64]) -> f64 {
    x.iter().fold(0f64, |a, v| a.max(v.abs())).max(1e-30)
}

/// One layout's keys and the random data over it.
struct Case {
    name: &'static str,
    nq: usize,
    n_kv: usize,
    hd: usize,
    slots: usize,
    positions: Vec<usize>,
    keys: Keys,
    /// Rows (slot indices) that hold data; the rest are NaN.
    live: Vec<usize>,
}

enum Keys {
    Runs(Runs, usize, MaskKind),
    Cells(Vec<usize>, Vec<Run>, usize),
}

impl Case {
    fn spec<'a>(&'a self, k: KvRows<'a>, v: KvRows<'a>) -> AttendSpec<'a> {
        AttendSpec {
            k,
            v,
            n_kv_heads: self.n_kv,
            head_dim: self.hd,
            slots: self.slots,
            positions: &self.positions,
            keys: match &self.keys {
                Keys::Runs(read, base, mask) => KeyLayout::Runs {
                    read: *read,
                    read_base_pos: *base,
                    mask: *mask,
                },
                Keys::Cells(offsets, runs, read_len) => KeyLayout::Cells {
                    offsets,
                    runs,
                    read_len: *read_len,
                },
            },
        }
    }

    fn t(&self) -> usize {
        self.positions.len()
    }
}

fn cases() -> Vec<Case> {
    // Decode, a GQA group of 4 (the register decode step), flat causal.
    let flat = Case {
        name: "decode gqa4 flat",
        nq: 8,
        n_kv: 2,
        hd: 64,
        slots: 310,
        positions: vec![299],
        keys: Keys::Runs(Runs::one(Run::new(0, 300)), 0, MaskKind::Causal),
        live: (0..300).collect(),
    };
    // Decode, a group of 8 and one KV head over long keys: the key split
    // (2 threads) and its merge of partial states.
    let split = Case {
        name: "decode gqa8 key split",
        nq: 8,
        n_kv: 1,
        hd: 128,
        slots: 1150,
        positions: vec![1129],
        keys: Keys::Runs(Runs::one(Run::new(20, 1110)), 20, MaskKind::Causal),
        live: (20..1130).collect(),
    };
    // Prefill over a wrapped ring with a sliding window (two read runs).
    let (depth, end_pos, t) = (90usize, 400usize, 17usize);
    let read = Runs::ring(end_pos - depth, depth, depth);
    assert_eq!(read.len(), 2, "the ring wraps");
    let ring = Case {
        name: "prefill ring window",
        nq: 4,
        n_kv: 2,
        hd: 32,
        slots: depth + 3,
        positions: (end_pos - t..end_pos).collect(),
        live: read
            .as_slice()
            .iter()
            .flat_map(|r| r.start..r.end())
            .collect(),
        keys: Keys::Runs(read, end_pos - depth, MaskKind::Window(70)),
    };
    // head_dim 40: the kernels' partial-vector tails (no q8_0 at 40).
    let odd = Case {
        name: "prefill hd40 causal",
        nq: 6,
        n_kv: 3,
        hd: 40,
        slots: 140,
        positions: (120..130).collect(),
        keys: Keys::Runs(Runs::one(Run::new(0, 130)), 0, MaskKind::Causal),
        live: (0..130).collect(),
    };
    // Cells: a fork sharing a prefix, gapped runs, a token that sees nothing.
    let shared = [Run::new(0, 5), Run::new(9, 12)];
    let mut runs = Vec::new();
    let mut offsets = vec![0usize];
    runs.extend_from_slice(&shared);
    runs.push(Run::new(40, 30));
    offsets.push(runs.len());
    runs.extend_from_slice(&shared);
    runs.push(Run::new(80, 20));
    offsets.push(runs.len());
    runs.extend((0..12).map(|i| Run::new(1 + 9 * i, 4)));
    offsets.push(runs.len());
    offsets.push(runs.len()); // sees nothing
    let mut live: Vec<usize> = runs.iter().flat_map(|r| r.start..r.end()).collect();
    live.sort_unstable();
    live.dedup();
    let cells = Case {
        name: "cells",
        nq: 8,
        n_kv: 2,
        hd: 64,
        slots: 120,
        positions: vec![100, 101, 102, 103],
        keys: Keys::Cells(offsets, runs, 110),
        live,
    };
    vec![flat, split, ring, odd, cells]
}

/// Random K and V pools of a case (NaN outside its live rows) and a query
/// `amp` times the unit scale (scores of roughly `amp / 3` spread).
fn data(c: &Case, rng: &mut Rng, amp: f32) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let n = c.n_kv * c.slots * c.hd;
    let (mut k, mut v) = (vec![f32::NAN; n], vec![f32::NAN; n]);
    for h in 0..c.n_kv {
        for &s in &c.live {
            for d in 0..c.hd {
                k[(h * c.slots + s) * c.hd + d] = rng.f32();
                v[(h * c.slots + s) * c.hd + d] = rng.f32();
            }
        }
    }
    let q = (0..c.nq * c.t() * c.hd).map(|_| rng.f32() * amp).collect();
    (q, k, v)
}

fn opts(backend: Backend, isa: NativeIsa, threads: usize, softcap: Option<f32>) -> AttendOptions {
    AttendOptions {
        threads: Some(threads),
        backend,
        native_isa: isa,
        softcap,
        ..AttendOptions::default()
    }
}

/// Scores of magnitude ~20 with a cap of 5: the cap reshapes the softmax,
/// and every backend / ISA / dtype pair matches the capped reference.
#[test]
fn small_cap_matches_the_capped_reference() {
    let mut rng = Rng::new(38);
    let cap = 5.0f32;
    for c in cases() {
        let (q, k32, v32) = data(&c, &mut rng, 30.0);
        for kd in KvDtype::ALL {
            for vd in KvDtype::ALL {
                if kd.check_head_dim(c.hd).is_err() || vd.check_head_dim(c.hd).is_err() {
                    continue;
                }
                let (kp, vp) = (Pool::new(kd, &k32), Pool::new(vd, &v32));
                let spec = c.spec(kp.rows(), vp.rows());
                let kv = (&kp.decoded[..], &vp.decoded[..]);
                let want = reference(&q, c.nq, &spec, kv, Some(f64::from(cap)));
                let plain = reference(&q, c.nq, &spec, kv, None);
                let q8 = q8_rounded(&q);
                let want_q8 = reference(&q8, c.nq, &spec, kv, Some(f64::from(cap)));
                let scale = max_abs(&want);
                let moved = want
                    .iter()
                    .zip(&plain)
                    .fold(0f64, |a, (x, y)| a.max((x - y).abs()));
                assert!(
                    moved > 0.05 * scale,
                    "{}: a cap of 5 should move the output, moved {moved:e}",
                    c.name
                );
                for (backend, isa) in variants(kd, vd) {
                    let want = expected((backend, isa), c.nq, &spec, &want, &want_q8);
                    for th in [1, 2] {
                        let got = attend(
                            &q,
                            [c.nq, c.t(), c.hd],
                            &spec,
                            &opts(backend, isa, th, Some(cap)),
                        )
                        .unwrap_or_else(|e| {
                            panic!("{} {kd:?}/{vd:?} {backend:?}/{isa:?}: {e}", c.name)
                        });
                        for (idx, (g, w)) in got.iter().zip(&want).enumerate() {
                            let err = (f64::from(*g) - w).abs() / scale;
                            assert!(
                                err <= 2e-5,
                                "{} {kd:?}/{vd:?} {backend:?}/{isa:?} threads {th}: out[{idx}] = {g}, want {w} (rel err {err:e})",
                                c.name
                            );
                        }
                    }
                }
            }
        }
    }
}

/// A cap far above every score changes nothing beyond rounding: the capped
/// call equals the uncapped one and the uncapped reference.
#[test]
fn huge_cap_changes_nothing() {
    let mut rng = Rng::new(2);
    for c in cases() {
        let (q, k32, v32) = data(&c, &mut rng, 3.0);
        for kd in KvDtype::ALL {
            if kd.check_head_dim(c.hd).is_err() {
                continue;
            }
            let (kp, vp) = (Pool::new(kd, &k32), Pool::new(kd, &v32));
            let spec = c.spec(kp.rows(), vp.rows());
            let kv = (&kp.decoded[..], &vp.decoded[..]);
            let plain = reference(&q, c.nq, &spec, kv, None);
            let plain_q8 = reference(&q8_rounded(&q), c.nq, &spec, kv, None);
            let scale = max_abs(&plain);
            for (backend, isa) in variants(kd, kd) {
                let want = expected((backend, isa), c.nq, &spec, &plain, &plain_q8);
                let shape = [c.nq, c.t(), c.hd];
                let uncapped = attend(&q, shape, &spec, &opts(backend, isa, 2, None)).unwrap();
                for cap in [1e6f32, f32::MAX] {
                    let got = attend(&q, shape, &spec, &opts(backend, isa, 2, Some(cap))).unwrap();
                    for (idx, ((g, u), w)) in got.iter().zip(&uncapped).zip(&want).enumerate() {
                        let what = format!(
                            "{} {kd:?} {backend:?}/{isa:?} cap {cap}: out[{idx}]",
                            c.name
                        );
                        assert!(
                            f64::from((g - u).abs()) <= 2e-6 * scale,
                            "{what} = {g}, uncapped {u}"
                        );
                        assert!(
                            (f64::from(*g) - w).abs() <= 1e-5 * scale,
                            "{what} = {g}, want {w}"
                        );
                    }
                }
            }
        }
    }
}

/// Masked keys stay masked under a cap, and a token that sees no key gets
/// exact zeros (the cells case's last token; here also a whole causal step
/// whose keys are all in the future).
#[test]
fn a_token_that_sees_nothing_gets_zeros() {
    let mut rng = Rng::new(3);
    let c = Case {
        name: "future keys",
        nq: 4,
        n_kv: 2,
        hd: 16,
        slots: 40,
        positions: vec![3, 4],
        keys: Keys::Runs(Runs::one(Run::new(10, 20)), 50, MaskKind::Causal),
        live: (10..30).collect(),
    };
    let (q, k, v) = data(&c, &mut rng, 30.0);
    let spec = c.spec(KvRows::from_f32(&k), KvRows::from_f32(&v));
    for (backend, isa) in variants(KvDtype::Float32, KvDtype::Float32) {
        let out = attend(&q, [4, 2, 16], &spec, &opts(backend, isa, 1, Some(5.0))).unwrap();
        assert!(
            out.iter().all(|x| *x == 0.0),
            "{backend:?}/{isa:?}: {out:?}"
        );
    }
    let cells = cases().into_iter().find(|c| c.name == "cells").unwrap();
    let (q, k, v) = data(&cells, &mut rng, 30.0);
    let spec = cells.spec(KvRows::from_f32(&k), KvRows::from_f32(&v));
    let hd = cells.hd;
    for (backend, isa) in variants(KvDtype::Float32, KvDtype::Float32) {
        let out = attend(&q, [8, 4, hd], &spec, &opts(backend, isa, 2, Some(5.0))).unwrap();
        for h in 0..8 {
            let row = &out[(h * 4 + 3) * hd..][..hd];
            assert!(
                row.iter().all(|x| *x == 0.0),
                "{backend:?}/{isa:?} head {h}"
            );
            let seen = &out[(h * 4) * hd..][..hd];
            assert!(seen.iter().all(|x| x.is_finite()) && seen.iter().any(|x| *x != 0.0));
        }
    }
}

/// A cap that is zero, negative, NaN or infinite is refused by name, for
/// every backend, before anything is computed: `out` keeps its contents.
#[test]
fn bad_caps_are_refused_and_out_is_untouched() {
    let mut rng = Rng::new(4);
    let c = &cases()[0];
    let (q, k, v) = data(c, &mut rng, 3.0);
    let spec = c.spec(KvRows::from_f32(&k), KvRows::from_f32(&v));
    let shape = [c.nq, c.t(), c.hd];
    for bad in [
        0.0f32,
        -0.0,
        -5.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ] {
        for (backend, isa) in variants(KvDtype::Float32, KvDtype::Float32) {
            let mut out = vec![7.5f32; q.len()];
            let r = attend_into(
                &q,
                shape,
                &spec,
                &opts(backend, isa, 2, Some(bad)),
                &mut out,
            );
            match r {
                Err(CacheError::InvalidArgument(m)) => assert!(
                    m.contains("softcap") && m.contains(&bad.to_string()),
                    "{bad} {backend:?}: {m}"
                ),
                other => {
                    panic!("cap {bad} {backend:?}/{isa:?}: expected InvalidArgument, got {other:?}")
                }
            }
            assert!(out.iter().all(|x| *x == 7.5), "cap {bad}: out was written");
        }
    }
}
