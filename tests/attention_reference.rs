//! attend() against an f64 reference over random shapes, every key layout and
//! every backend / native ISA this CPU runs. Pool rows outside the read runs are
//! NaN in every case, so any read of them shows up as a NaN output.
#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

mod common;

use common::visible_rows;
use offgraph_kv::attention::{attend, AttendOptions, Backend, NativeIsa};
use offgraph_kv::{AttendSpec, KeyLayout, KvDtype, KvRows, MaskKind, Run, Runs};

/// splitmix64: a seeded PRNG without dependencies.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
    fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// Every (backend, ISA) combination runnable here.
fn variants() -> Vec<(Backend, NativeIsa)> {
    let mut v = vec![(Backend::Native, NativeIsa::Scalar)];
    #[cfg(target_arch = "x86_64")]
    {
        if offgraph_kv::cpu::features().avx512f {
            v.push((Backend::Native, NativeIsa::Avx512));
        }
        if offgraph_kv::cpu::features().avx2 && offgraph_kv::cpu::features().fma {
            v.push((Backend::Native, NativeIsa::Avx2));
        }
    }
    if Backend::Xnnpack.available() {
        v.push((Backend::Xnnpack, NativeIsa::Auto));
    }
    v.push((Backend::Auto, NativeIsa::Auto));
    v
}

/// Row `r` of a pool as f32, decoded from the formats' definitions (not the crate's decoder).
fn widen_row(pool: KvRows<'_>, r: usize, hd: usize) -> Vec<f32> {
    let rb = pool.dtype.row_bytes(hd);
    let b = &pool.bytes[r * rb..][..rb];
    let half = |lo: u8, hi: u8| {
        let h = u16::from_le_bytes([lo, hi]);
        let (sign, e, m) = ((h >> 15) as i32, ((h >> 10) & 31) as i32, (h & 1023) as f64);
        let mag = if e == 0 {
            m * 2f64.powi(-24)
        } else {
            (1.0 + m / 1024.0) * 2f64.powi(e - 15)
        };
        (if sign == 1 { -mag } else { mag }) as f32
    };
    match pool.dtype {
        KvDtype::Float32 => b
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        KvDtype::Float16 => b.chunks(2).map(|c| half(c[0], c[1])).collect(),
        KvDtype::Bfloat16 => b
            .chunks(2)
            .map(|c| f32::from_bits(((c[1] as u32) << 24) | ((c[0] as u32) << 16)))
            .collect(),
        KvDtype::Q8_0 => b
            .chunks(34)
            .flat_map(|blk| {
                let d = half(blk[0], blk[1]);
                blk[2..].iter().map(move |&q| d * (q as i8) as f32)
            })
            .collect(),
    }
}

fn reference(q: &[f32], shape: [usize; 3], spec: &AttendSpec<'_>, scale: f64) -> Vec<f64> {
    let [nq, t, hd] = shape;
    let g = nq / spec.n_kv_heads;
    let mut out = vec![0f64; q.len()];
    for i in 0..t {
        let rows = visible_rows(spec, i);
        for h in 0..nq {
            let kvh = h / g;
            let qr = &q[(h * t + i) * hd..][..hd];
            let row = |pool: KvRows<'_>, s: usize| widen_row(pool, kvh * spec.slots + s, hd);
            let scores: Vec<f64> = rows
                .iter()
                .map(|&s| {
                    let k = row(spec.k, s);
                    qr.iter()
                        .zip(&k)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let z: f64 = w.iter().sum();
            let o = &mut out[(h * t + i) * hd..][..hd];
            for (&s, wj) in rows.iter().zip(&w) {
                let v = row(spec.v, s);
                for d in 0..hd {
                    o[d] += wj / z * v[d] as f64;
                }
            }
        }
    }
    out
}

/// Pools of NaN with the rows in `live` (slot indices) filled with data.
fn pools(
    rng: &mut Rng,
    n_kv: usize,
    slots: usize,
    hd: usize,
    live: &[usize],
) -> (Vec<f32>, Vec<f32>) {
    let mut k = vec![f32::NAN; n_kv * slots * hd];
    let mut v = vec![f32::NAN; n_kv * slots * hd];
    for h in 0..n_kv {
        for &s in live {
            for d in 0..hd {
                k[(h * slots + s) * hd + d] = rng.unit();
                v[(h * slots + s) * hd + d] = rng.unit();
            }
        }
    }
    (k, v)
}

fn check_all(name: &str, q: &[f32], shape: [usize; 3], spec: &AttendSpec<'_>, threads: &[usize]) {
    let hd = shape[2];
    let scale = 1.0 / (hd as f64).sqrt();
    let want = reference(q, shape, spec, scale);
    let out_scale = want.iter().fold(0f64, |a, x| a.max(x.abs())).max(1e-30);
    for (backend, isa) in variants() {
        for &th in threads {
            let opts = AttendOptions {
                scale: None,
                threads: Some(th),
                backend,
                native_isa: isa,
                softcap: None,
            };
            let got = attend(q, shape, spec, &opts)
                .unwrap_or_else(|e| panic!("{name} {backend:?}/{isa:?} threads {th}: {e}"));
            let mut worst = 0f64;
            for (idx, (g, w)) in got.iter().zip(&want).enumerate() {
                let err = (*g as f64 - w).abs() / out_scale;
                assert!(
                    err <= 1e-5,
                    "{name} {backend:?}/{isa:?} threads {th} shape {shape:?}: out[{idx}] = {g}, want {w} (rel err {err:e})"
                );
                worst = worst.max(err);
            }
        }
    }
}

fn budget() -> usize {
    if cfg!(debug_assertions) {
        400_000
    } else {
        20_000_000
    }
}

/// A random shape whose reference cost fits the budget.
fn shape(rng: &mut Rng, t: usize, ctx_max: usize) -> (usize, usize, usize, usize) {
    loop {
        let ratio = rng.pick(&[1usize, 2, 4, 8]);
        let n_kv = 1 + rng.below(3);
        let hd = rng.pick(&[8usize, 16, 24, 40, 64, 100, 128, 160, 256]);
        let ctx = t + rng.below(ctx_max);
        if n_kv * ratio * t * ctx * hd <= budget()
            || (t == 128 && ratio == 1 && hd == 8 && n_kv == 1)
        {
            return (ratio, n_kv, hd, ctx);
        }
    }
}

fn queries(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.unit() * 2.0).collect()
}

#[test]
fn flat_and_causal_runs() {
    let mut rng = Rng(1);
    for &t in &[1usize, 3, 17, 128] {
        for _ in 0..3 {
            let (ratio, n_kv, hd, ctx) = shape(&mut rng, t, 300);
            let slots = ctx + rng.below(20);
            let live: Vec<usize> = (0..ctx).collect();
            let (k, v) = pools(&mut rng, n_kv, slots, hd, &live);
            let positions: Vec<usize> = (ctx - t..ctx).collect();
            let nq = n_kv * ratio;
            let q = queries(&mut rng, nq * t * hd);
            for mask in [MaskKind::Causal, MaskKind::None] {
                let spec = AttendSpec {
                    k: KvRows::from_f32(&k),
                    v: KvRows::from_f32(&v),
                    n_kv_heads: n_kv,
                    head_dim: hd,
                    slots,
                    positions: &positions,
                    keys: KeyLayout::Runs {
                        read: Runs::one(Run::new(0, ctx)),
                        read_base_pos: 0,
                        mask,
                    },
                };
                check_all(&format!("flat {mask:?}"), &q, [nq, t, hd], &spec, &[1, 2]);
            }
        }
    }
}

#[test]
fn ring_two_runs_window() {
    let mut rng = Rng(2);
    let mut wrapped = 0;
    for &t in &[1usize, 3, 17, 128] {
        for _ in 0..3 {
            let (ratio, n_kv, hd, _) = shape(&mut rng, t, 200);
            // A ring of `depth` slots holding the last `len` positions, wrapped.
            let window = 8 + rng.below(100);
            let depth = window + t;
            let end_pos = depth + 5 + rng.below(500); // one past the last position written
            let len = depth;
            let base = end_pos - len;
            let read = Runs::ring(base, len, depth);
            wrapped += usize::from(read.len() == 2);
            let live: Vec<usize> = read
                .as_slice()
                .iter()
                .flat_map(|r| r.start..r.end())
                .collect();
            let slots = depth + 3; // spare rows that are never read
            let (k, v) = pools(&mut rng, n_kv, slots, hd, &live);
            let positions: Vec<usize> = (end_pos - t..end_pos).collect();
            let nq = n_kv * ratio;
            let q = queries(&mut rng, nq * t * hd);
            let spec = AttendSpec {
                k: KvRows::from_f32(&k),
                v: KvRows::from_f32(&v),
                n_kv_heads: n_kv,
                head_dim: hd,
                slots,
                positions: &positions,
                keys: KeyLayout::Runs {
                    read,
                    read_base_pos: base,
                    mask: MaskKind::Window(window),
                },
            };
            check_all("ring window", &q, [nq, t, hd], &spec, &[1, 2]);
        }
    }
    assert!(
        wrapped >= 6,
        "only {wrapped} of 12 ring cases wrapped into two runs"
    );
}

/// Several sequences with gaps between their cells, a fork sharing a prefix,
/// and a token that sees nothing (zeros).
#[test]
fn cells_several_sequences() {
    let mut rng = Rng(3);
    for &t in &[1usize, 3, 17] {
        for _ in 0..3 {
            let (ratio, n_kv, hd, _) = shape(&mut rng, t, 100);
            let read_len = 40 + rng.below(150);
            let slots = read_len + 7;
            let mut offsets = vec![0usize];
            let mut runs = Vec::new();
            let shared = vec![Run::new(0, 5), Run::new(9, 3 + rng.below(10))];
            for i in 0..t {
                match i % 4 {
                    // A fork: the shared prefix plus its own tail.
                    0 | 1 => {
                        runs.extend_from_slice(&shared);
                        let s = 30 + rng.below(read_len - 35);
                        runs.push(Run::new(s, 1 + rng.below(read_len - s)));
                    }
                    // Gapped runs of another sequence.
                    2 => {
                        let mut s = rng.below(4);
                        while s < read_len {
                            let l = (1 + rng.below(6)).min(read_len - s);
                            runs.push(Run::new(s, l));
                            s += l + 1 + rng.below(8);
                        }
                    }
                    // Sees nothing.
                    _ => {}
                }
                offsets.push(runs.len());
            }
            let mut live: Vec<usize> = runs.iter().flat_map(|r| r.start..r.end()).collect();
            live.sort_unstable();
            live.dedup();
            let (k, v) = pools(&mut rng, n_kv, slots, hd, &live);
            let positions: Vec<usize> = (0..t).map(|i| 100 + i).collect();
            let nq = n_kv * ratio;
            let q = queries(&mut rng, nq * t * hd);
            let spec = AttendSpec {
                k: KvRows::from_f32(&k),
                v: KvRows::from_f32(&v),
                n_kv_heads: n_kv,
                head_dim: hd,
                slots,
                positions: &positions,
                keys: KeyLayout::Cells {
                    offsets: &offsets,
                    runs: &runs,
                    read_len,
                },
            };
            check_all("cells", &q, [nq, t, hd], &spec, &[1, 2]);
        }
    }
}

/// One KV head and long keys with more threads than row blocks: the key split
/// and the merge of partial softmax states.
#[test]
fn key_split_decode() {
    let mut rng = Rng(4);
    let (n_kv, hd, ctx, t) = (1usize, 64usize, 2100usize, 1usize);
    let slots = ctx + 50;
    let live: Vec<usize> = (30..30 + ctx).collect();
    let (k, v) = pools(&mut rng, n_kv, slots, hd, &live);
    let positions = vec![ctx - 1];
    for ratio in [1usize, 4] {
        let nq = n_kv * ratio;
        let q = queries(&mut rng, nq * t * hd);
        for mask in [MaskKind::Causal, MaskKind::Window(700)] {
            let spec = AttendSpec {
                k: KvRows::from_f32(&k),
                v: KvRows::from_f32(&v),
                n_kv_heads: n_kv,
                head_dim: hd,
                slots,
                positions: &positions,
                keys: KeyLayout::Runs {
                    read: Runs::one(Run::new(30, ctx)),
                    read_base_pos: 0,
                    mask,
                },
            };
            check_all("key split", &q, [nq, t, hd], &spec, &[1, 2, 3]);
        }
    }
}

/// Tokens that see no key (causal with every key in the future, a zero window)
/// get zeros, not NaN.
#[test]
fn empty_visibility_gives_zeros() {
    let mut rng = Rng(5);
    let (n_kv, hd, slots) = (2usize, 16usize, 40usize);
    let live: Vec<usize> = (10..30).collect();
    let (k, v) = pools(&mut rng, n_kv, slots, hd, &live);
    let positions = vec![3usize, 4];
    let q = queries(&mut rng, 4 * 2 * hd);
    for mask in [MaskKind::Causal, MaskKind::Window(0)] {
        let spec = AttendSpec {
            k: KvRows::from_f32(&k),
            v: KvRows::from_f32(&v),
            n_kv_heads: n_kv,
            head_dim: hd,
            slots,
            positions: &positions,
            keys: KeyLayout::Runs {
                read: Runs::one(Run::new(10, 20)),
                read_base_pos: 50,
                mask,
            },
        };
        for (backend, isa) in variants() {
            let opts = AttendOptions {
                backend,
                native_isa: isa,
                ..Default::default()
            };
            let out = attend(&q, [4, 2, hd], &spec, &opts).unwrap();
            assert!(
                out.iter().all(|x| *x == 0.0),
                "{mask:?} {backend:?}: {out:?}"
            );
        }
    }
}

/// An explicit scale is honoured.
#[test]
fn explicit_scale() {
    let mut rng = Rng(6);
    let (n_kv, hd, slots, ctx) = (1usize, 32usize, 64usize, 50usize);
    let live: Vec<usize> = (0..ctx).collect();
    let (k, v) = pools(&mut rng, n_kv, slots, hd, &live);
    let positions = vec![ctx - 1];
    let q = queries(&mut rng, 2 * hd);
    let spec = AttendSpec {
        k: KvRows::from_f32(&k),
        v: KvRows::from_f32(&v),
        n_kv_heads: n_kv,
        head_dim: hd,
        slots,
        positions: &positions,
        keys: KeyLayout::Runs {
            read: Runs::one(Run::new(0, ctx)),
            read_base_pos: 0,
            mask: MaskKind::Causal,
        },
    };
    let want = reference(&q, [2, 1, hd], &spec, 0.7);
    for (backend, isa) in variants() {
        let opts = AttendOptions {
            scale: Some(0.7),
            backend,
            native_isa: isa,
            ..Default::default()
        };
        let got = attend(&q, [2, 1, hd], &spec, &opts).unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!((*g as f64 - w).abs() < 1e-5, "{backend:?}: {g} vs {w}");
        }
    }
}
