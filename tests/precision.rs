//! Low-precision pools end to end: rows written through the byte layer are
//! stored in the formats' bytes (q8_0 against a quantizer written here from
//! GGML's definition), and attention over them matches an f64 reference
//! computed over the rounded rows, for every K/V dtype pair, flat, ring and
//! cell steps, grouped-query heads, every native ISA this CPU runs. XNNPACK
//! serves float32 pools and refuses the others with `BackendError`.
#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

mod common;

use common::{visible_rows, Rng};
use offgraph_kv::attention::{attend, AttendOptions, Backend, NativeIsa};
use offgraph_kv::kv::Side;
use offgraph_kv::{
    AttendSpec, CacheConfig, CacheError, KvCellCache, KvDtype, KvRows, KvSequenceCache,
    LayerConfig, LayerPolicy, RowsIn,
};

fn isas() -> Vec<NativeIsa> {
    let mut v = vec![NativeIsa::Scalar];
    #[cfg(target_arch = "x86_64")]
    {
        if offgraph_kv::cpu::features().avx512f {
            v.push(NativeIsa::Avx512);
        }
        if offgraph_kv::cpu::features().avx512vnni && offgraph_kv::cpu::features().avx512bw {
            v.push(NativeIsa::Avx512Vnni);
        }
        if offgraph_kv::cpu::features().avx2 && offgraph_kv::cpu::features().fma {
            v.push(NativeIsa::Avx2);
            v.push(NativeIsa::Avx2Int8);
        }
    }
    v
}

fn pairs() -> Vec<(KvDtype, KvDtype)> {
    KvDtype::ALL
        .iter()
        .flat_map(|&k| KvDtype::ALL.iter().map(move |&v| (k, v)))
        .collect()
}

/// IEEE half bits to f64, from the format's definition.
fn half(h: u16) -> f64 {
    let (sign, e, m) = (h >> 15, ((h >> 10) & 31) as i32, (h & 1023) as f64);
    let mag = if e == 0 {
        m * 2f64.powi(-24)
    } else {
        (1.0 + m / 1024.0) * 2f64.powi(e - 15)
    };
    if sign == 1 {
        -mag
    } else {
        mag
    }
}

/// Row `r` of a pool, decoded from the formats' definitions.
fn widen_row(pool: KvRows<'_>, r: usize, hd: usize) -> Vec<f64> {
    let rb = pool.dtype.row_bytes(hd);
    let b = &pool.bytes[r * rb..][..rb];
    match pool.dtype {
        KvDtype::Float32 => b
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
            .collect(),
        KvDtype::Float16 => b
            .chunks(2)
            .map(|c| half(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        KvDtype::Bfloat16 => b
            .chunks(2)
            .map(|c| f32::from_bits(((c[1] as u32) << 24) | ((c[0] as u32) << 16)) as f64)
            .collect(),
        KvDtype::Q8_0 => b
            .chunks(34)
            .flat_map(|blk| {
                let d = half(u16::from_le_bytes([blk[0], blk[1]]));
                blk[2..].iter().map(move |&q| d * (q as i8) as f64)
            })
            .collect(),
    }
}

/// GGML `quantize_row_q8_0_ref` for one row, written from its definition.
fn ggml_q8_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for blk in x.chunks(32) {
        let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        // fp16 of d by exhaustive nearest-even search over halves (slow but obviously right).
        let mut best = 0u16;
        let mut best_err = f64::INFINITY;
        for h in 0u16..0x7c00 {
            let err = (half(h) - d as f64).abs();
            if err < best_err || (err == best_err && h % 2 == 0) {
                best = h;
                best_err = err;
            }
        }
        out.extend_from_slice(&best.to_le_bytes());
        for v in blk {
            out.push(((v * id).round() as i8) as u8);
        }
    }
    out
}

fn reference(
    q: &[f32],
    nq: usize,
    spec: &AttendSpec<'_>,
    vis: &dyn Fn(usize) -> Vec<usize>,
) -> Vec<f64> {
    let (t, hd, nkv) = (spec.n_tokens(), spec.head_dim, spec.n_kv_heads);
    let g = nq / nkv;
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = vec![0f64; q.len()];
    for i in 0..t {
        let rows = vis(i);
        for h in 0..nq {
            let kvh = h / g;
            let qr = &q[(h * t + i) * hd..][..hd];
            let scores: Vec<f64> = rows
                .iter()
                .map(|&s| {
                    let k = widen_row(spec.k, kvh * spec.slots + s, hd);
                    qr.iter().zip(&k).map(|(a, b)| *a as f64 * b).sum::<f64>() * scale
                })
                .collect();
            if scores.is_empty() {
                continue;
            }
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let z: f64 = w.iter().sum();
            let o = &mut out[(h * t + i) * hd..][..hd];
            for (&s, wj) in rows.iter().zip(&w) {
                let v = widen_row(spec.v, kvh * spec.slots + s, hd);
                for d in 0..hd {
                    o[d] += wj / z * v[d];
                }
            }
        }
    }
    out
}

/// q rows as the VNNI path sees them: GGML's Q8_0 rounding per 32 values
/// (`d = max|x| / 127`, `round(x / d)`), with the scale kept in f32.
fn q8_fake_quantized(q: &[f32]) -> Vec<f32> {
    q.chunks(32)
        .flat_map(|blk| {
            let d = blk.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            blk.iter().map(move |v| (v * id).round() * d)
        })
        .collect()
}

/// Whether `isa` scores this call's q8_0 keys by integer dots: q8_0 K, and
/// VNNI with head_dim a multiple of 64 or the AVX2 integer path (head_dim a
/// multiple of 32, as q8_0 is), for every block of query rows alike (batch
/// invariance: a row's path does not depend on how many rows share it).
fn int8_scores(isa: NativeIsa, spec: &AttendSpec<'_>) -> bool {
    let isa_int8 = match isa {
        NativeIsa::Avx512Vnni => spec.head_dim.is_multiple_of(64),
        NativeIsa::Avx2Int8 => true,
        _ => false,
    };
    isa_int8 && spec.k.dtype == KvDtype::Q8_0
}

fn check(name: &str, q: &[f32], nq: usize, spec: &AttendSpec<'_>) {
    let hd = spec.head_dim;
    let exact = reference(q, nq, spec, &|i| visible_rows(spec, i));
    // The integer path computes exactly attention of the Q8_0-rounded q (the
    // error GGML accepts), so it is held to the same float tolerance against
    // that reference.
    let want_q8 = reference(&q8_fake_quantized(q), nq, spec, &|i| visible_rows(spec, i));
    let want = &exact;
    let scale = want.iter().fold(0f64, |a, x| a.max(x.abs())).max(1e-30);
    let shape = [nq, spec.n_tokens(), hd];
    for isa in isas() {
        let want = if int8_scores(isa, spec) {
            &want_q8
        } else {
            &exact
        };
        for th in [1, 2] {
            let opts = AttendOptions {
                threads: Some(th),
                backend: Backend::Native,
                native_isa: isa,
                ..AttendOptions::default()
            };
            let got = attend(q, shape, spec, &opts).unwrap();
            for (idx, (g, w)) in got.iter().zip(want).enumerate() {
                let err = (*g as f64 - w).abs() / scale;
                assert!(
                    err <= 2e-5,
                    "{name} {isa:?} threads {th}: out[{idx}] = {g}, want {w} (rel err {err:e})"
                );
            }
        }
    }
    // Auto serves every dtype; XNNPACK float32 only, refusing the rest by name.
    let auto = attend(q, shape, spec, &AttendOptions::default()).unwrap();
    assert_eq!(auto.len(), q.len());
    if Backend::Xnnpack.available() {
        let opts = AttendOptions {
            backend: Backend::Xnnpack,
            ..AttendOptions::default()
        };
        let r = attend(q, shape, spec, &opts);
        if spec.k.dtype == KvDtype::Float32 && spec.v.dtype == KvDtype::Float32 {
            let got = r.unwrap();
            for (g, w) in got.iter().zip(want) {
                assert!((*g as f64 - w).abs() / scale <= 2e-5, "{name} xnnpack");
            }
        } else {
            let e = r.unwrap_err();
            assert!(
                matches!(&e, CacheError::Backend(m) if m.contains("float32")),
                "{name}: {e}"
            );
        }
    }
}

fn data(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.f32() * 3.0).collect()
}

#[test]
fn sequence_flat_and_ring_every_pair() {
    let (nkv, ratio) = (2, 4);
    // head_dim 40: not a multiple of 16, so the AVX-512 kernel takes its portable widening.
    for (hd, (kd, vd)) in pairs()
        .into_iter()
        .map(|p| (64, p))
        .chain(pairs().into_iter().map(|p| (40, p)))
    {
        if hd % 32 != 0 && (kd == KvDtype::Q8_0 || vd == KvDtype::Q8_0) {
            continue;
        }
        for policy in [LayerPolicy::Flat, LayerPolicy::Ring { window: 7 }] {
            let mut rng = Rng::new(7 + kd.code() as u64 * 4 + vd.code() as u64);
            let mut cfg = CacheConfig::new(64, 1, vec![LayerConfig::new(policy, nkv, hd)])
                .with_dtypes(kd, vd);
            cfg.max_step = 5;
            cfg.initial_capacity = 2;
            let mut c = KvSequenceCache::new(cfg).unwrap();
            for (step, t) in [5usize, 1, 3, 1, 5, 1, 1].into_iter().enumerate() {
                c.begin_step(t).unwrap();
                let k = data(&mut rng, nkv * t * hd);
                let v = data(&mut rng, nkv * t * hd);
                let spec = c.update(0, &k, &v).unwrap();
                let q = data(&mut rng, nkv * ratio * t * hd);
                check(
                    &format!("{}/{} hd {hd} {policy:?} step {step}", kd.name(), vd.name()),
                    &q,
                    nkv * ratio,
                    &spec,
                );
            }
        }
    }
}

#[test]
fn cell_steps_every_pair() {
    let (nkv, ratio, hd) = (1, 2, 32);
    for (kd, vd) in pairs() {
        let mut rng = Rng::new(100 + kd.code() as u64 * 4 + vd.code() as u64);
        let layers = vec![
            LayerConfig::new(LayerPolicy::Flat, nkv, hd),
            LayerConfig::new(LayerPolicy::Ring { window: 4 }, nkv, hd),
        ];
        let mut cfg = CacheConfig::new(64, 2, layers).with_dtypes(kd, vd);
        cfg.max_step = 6;
        cfg.initial_capacity = 1;
        let mut c = KvCellCache::new(cfg, 64, 4).unwrap();
        let a = c.cells_mut().seq_new().unwrap();
        c.begin_step(&[a, a, a, a, a], &[0, 1, 2, 3, 4]).unwrap();
        for layer in 0..2 {
            let k = data(&mut rng, nkv * 5 * hd);
            let v = data(&mut rng, nkv * 5 * hd);
            c.update(layer, &k, &v).unwrap();
        }
        let b = c.cells_mut().seq_clone(a, None).unwrap();
        for step in 0..4 {
            c.begin_step(&[a, b], &[5 + step, 5 + step]).unwrap();
            for layer in 0..2 {
                let k = data(&mut rng, nkv * 2 * hd);
                let v = data(&mut rng, nkv * 2 * hd);
                let spec = c.update(layer, &k, &v).unwrap();
                let q = data(&mut rng, nkv * ratio * 2 * hd);
                check(
                    &format!(
                        "cells {}/{} layer {layer} step {step}",
                        kd.name(),
                        vd.name()
                    ),
                    &q,
                    nkv * ratio,
                    &spec,
                );
            }
        }
    }
}

#[test]
fn q8_0_rows_are_ggml_blocks_and_halves_round_from_every_input_type() {
    let hd = 64;
    let mut rng = Rng::new(3);
    let mut cfg = CacheConfig::new(8, 1, vec![LayerConfig::new(LayerPolicy::Flat, 1, hd)])
        .with_dtypes(KvDtype::Q8_0, KvDtype::Float16);
    cfg.max_step = 2;
    let mut c = KvSequenceCache::new(cfg).unwrap();
    c.begin_step(2).unwrap();
    let mut k = data(&mut rng, 2 * hd);
    k[5] = 0.0;
    k[hd..hd + 32].iter_mut().for_each(|x| *x = 0.0); // an all-zero block: d = 0, q = 0
    let v = data(&mut rng, 2 * hd);
    c.update(0, &k, &v).unwrap();
    let p = c.pool(0).unwrap();
    for t in 0..2 {
        assert_eq!(
            p.k_row(0, t).unwrap(),
            ggml_q8_0(&k[t * hd..][..hd]).as_slice()
        );
        let vb = p.v_row(0, t).unwrap();
        for d in 0..hd {
            let h = u16::from_le_bytes([vb[2 * d], vb[2 * d + 1]]);
            let x = v[t * hd + d] as f64;
            // Nearest half, ties to even: no half is strictly closer.
            let e = (half(h) - x).abs();
            assert!(e <= (half(h ^ 1) - x).abs() || h & 1 == 0);
            assert!(e <= (half(h + 1) - x).abs() && e <= (half(h.wrapping_sub(1)) - x).abs());
        }
    }
    // float16 input rows into a q8_0 / float16 pool: exact widening then one rounding.
    let mut c2 = KvSequenceCache::new(
        CacheConfig::new(8, 1, vec![LayerConfig::new(LayerPolicy::Flat, 1, hd)])
            .with_dtypes(KvDtype::Q8_0, KvDtype::Float16),
    )
    .unwrap();
    c2.begin_step(1).unwrap();
    let halves: Vec<u16> = (0..hd).map(|i| 0x3c00 + i as u16 * 7).collect();
    c2.update_rows(0, RowsIn::F16(&halves), RowsIn::F16(&halves))
        .unwrap();
    let p2 = c2.pool(0).unwrap();
    let widened: Vec<f32> = halves.iter().map(|&h| half(h) as f32).collect();
    assert_eq!(p2.k_row(0, 0).unwrap(), ggml_q8_0(&widened).as_slice());
    let stored: Vec<u16> = p2
        .v_row(0, 0)
        .unwrap()
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    assert_eq!(stored, halves);
    assert_eq!(p2.row_bytes(Side::K), 68);
    assert_eq!(p2.row_bytes(Side::V), 128);
}

#[test]
fn refusals_change_nothing() {
    // q8_0 needs head_dim % 32 == 0, for K or V alone.
    for (kd, vd) in [
        (KvDtype::Q8_0, KvDtype::Float32),
        (KvDtype::Float16, KvDtype::Q8_0),
    ] {
        let cfg = CacheConfig::new(8, 1, vec![LayerConfig::new(LayerPolicy::Flat, 1, 48)])
            .with_dtypes(kd, vd);
        let e = cfg.validate().unwrap_err();
        assert!(
            matches!(&e, CacheError::InvalidConfig(m) if m.contains("q8_0") && m.contains("48"))
        );
        assert!(KvSequenceCache::new(cfg.clone()).is_err());
        assert!(KvCellCache::new(cfg, 8, 2).is_err());
    }
    // Wrong row counts in any input type write nothing.
    let cfg = CacheConfig::new(8, 1, vec![LayerConfig::new(LayerPolicy::Flat, 2, 32)])
        .with_dtype(KvDtype::Bfloat16);
    let mut c = KvSequenceCache::new(cfg).unwrap();
    c.begin_step(1).unwrap();
    let good = vec![1.5f32; 64];
    c.update(0, &good, &good).unwrap();
    let before = c.pool(0).unwrap().k().bytes.to_vec();
    let short = vec![0x4000u16; 32];
    let e = c
        .update_rows(0, RowsIn::Bf16(&short), RowsIn::Bf16(&short))
        .unwrap_err();
    assert!(matches!(e, CacheError::Shape(_)));
    assert_eq!(c.pool(0).unwrap().k().bytes, before.as_slice());
    // K and V, 2 heads, 1 row written, 32 values of 2 bytes.
    assert_eq!(c.nbytes_total(), 2 * 2 * 32 * 2);
}

/// The decode blocks read each stored K and V value once for every query row
/// of a block (the GQA group's heads of one or more tokens): every group size
/// from 1 to 8 (odd ones included), short steps of 1-3 tokens, key counts
/// that end mid-tile and mid-group, head_dim 128 (whole register pairs) and 40
/// (single registers), flat and ring layers, every K/V dtype pair, every ISA
/// this CPU runs, 1 and 2 threads, against the f64 reference.
#[test]
fn grouped_blocks_every_group_size_and_short_step() {
    for (kd, vd) in pairs() {
        let q8 = kd == KvDtype::Q8_0 || vd == KvDtype::Q8_0;
        for (idx, ratio) in [1usize, 2, 3, 4, 5, 8].into_iter().enumerate() {
            for hd in [128usize, 40] {
                if hd % 32 != 0 && q8 {
                    continue;
                }
                let nkv = 1 + ratio % 2;
                let policy = if idx % 2 == 0 {
                    LayerPolicy::Flat
                } else {
                    LayerPolicy::Ring { window: 37 }
                };
                let seed = 1000 + (kd.code() as u64 * 4 + vd.code() as u64) * 64 + ratio as u64;
                let mut rng = Rng::new(seed + hd as u64);
                let mut cfg = CacheConfig::new(256, 1, vec![LayerConfig::new(policy, nkv, hd)])
                    .with_dtypes(kd, vd);
                cfg.max_step = 67;
                let mut c = KvSequenceCache::new(cfg).unwrap();
                // 67 + 66 = 133 keys: two whole 64-key tiles and 5 over, then
                // steps of 1, 3 and 2 tokens.
                for (step, t) in [67usize, 66, 1, 3, 2].into_iter().enumerate() {
                    c.begin_step(t).unwrap();
                    let k = data(&mut rng, nkv * t * hd);
                    let v = data(&mut rng, nkv * t * hd);
                    let spec = c.update(0, &k, &v).unwrap();
                    if step < 2 {
                        continue;
                    }
                    let q = data(&mut rng, nkv * ratio * t * hd);
                    check(
                        &format!(
                            "{}/{} group {ratio} hd {hd} {policy:?} T {t}",
                            kd.name(),
                            vd.name()
                        ),
                        &q,
                        nkv * ratio,
                        &spec,
                    );
                }
            }
        }
    }
}

/// Cell steps with every group size: each token's block is its own group of
/// query heads reading its sequence's cells.
#[test]
fn grouped_cell_steps_every_group_size() {
    let (nkv, hd) = (2, 128);
    for (kd, vd) in pairs() {
        for ratio in [1usize, 3, 4, 8] {
            let mut rng = Rng::new(5000 + kd.code() as u64 * 4 + vd.code() as u64 + ratio as u64);
            let layers = vec![LayerConfig::new(LayerPolicy::Flat, nkv, hd)];
            let mut cfg = CacheConfig::new(256, 2, layers).with_dtypes(kd, vd);
            cfg.max_step = 70;
            let mut c = KvCellCache::new(cfg, 256, 4).unwrap();
            let a = c.cells_mut().seq_new().unwrap();
            let pos: Vec<usize> = (0..70).collect();
            c.begin_step(&[a; 70], &pos).unwrap();
            c.update(
                0,
                &data(&mut rng, nkv * 70 * hd),
                &data(&mut rng, nkv * 70 * hd),
            )
            .unwrap();
            let b = c.cells_mut().seq_clone(a, None).unwrap();
            for step in 0..2 {
                c.begin_step(&[a, b, b], &[70 + step, 70 + 2 * step, 71 + 2 * step])
                    .unwrap();
                let spec = c
                    .update(
                        0,
                        &data(&mut rng, nkv * 3 * hd),
                        &data(&mut rng, nkv * 3 * hd),
                    )
                    .unwrap();
                let q = data(&mut rng, nkv * ratio * 3 * hd);
                check(
                    &format!(
                        "cells {}/{} group {ratio} step {step}",
                        kd.name(),
                        vd.name()
                    ),
                    &q,
                    nkv * ratio,
                    &spec,
                );
            }
        }
    }
}
