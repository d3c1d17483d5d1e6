//! Batch and layout invariance of attention: a query row's output is the
//! same bits whatever other rows share the call (other tokens, other
//! sequences, the chunk of a prefill it sits in), however many threads run
//! it, and wherever its keys' rows lie in the pools (contiguous, between
//! other sequences' rows, out of position order, wrapped around a ring), for
//! every KV dtype and every native ISA this CPU runs. Rows that no run names
//! are NaN, so reading one shows up.
#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

mod common;

use common::pool::Pool;
use common::{native_isas, Rng};
use offgraph_kv::attention::{attend, AttendOptions, NativeIsa};
use offgraph_kv::{AttendSpec, KeyLayout, KvDtype, MaskKind, Run, Runs};

const HD: usize = 64;
const N_KV: usize = 2;
/// Keys of the sequence under test: positions `0..N` (a few 64-key tiles).
const N: usize = 150;
const SLOTS: usize = 400;

/// (K, V) dtype pairs: each dtype for both, and a mixed pair.
const DTYPES: [(KvDtype, KvDtype); 5] = [
    (KvDtype::Float32, KvDtype::Float32),
    (KvDtype::Float16, KvDtype::Float16),
    (KvDtype::Bfloat16, KvDtype::Bfloat16),
    (KvDtype::Q8_0, KvDtype::Q8_0),
    (KvDtype::Float16, KvDtype::Q8_0),
];

/// A pool in one dtype, `[N_KV, SLOTS, HD]`: row `cell` of head `h` holds
/// the key (value) of position `pos` where `cells[pos] == cell`, NaN elsewhere.
fn pool(dtype: KvDtype, rows: &[Vec<f32>], cells: &[usize]) -> Pool {
    let mut values = vec![f32::NAN; N_KV * SLOTS * HD];
    for h in 0..N_KV {
        for (pos, &cell) in cells.iter().enumerate() {
            let dst = (h * SLOTS + cell) * HD;
            values[dst..dst + HD].copy_from_slice(&rows[h * N + pos]);
        }
    }
    Pool::new(dtype, &values)
}

fn random_rows(rng: &mut Rng, n: usize, amp: f32) -> Vec<Vec<f32>> {
    (0..n)
        .map(|_| (0..HD).map(|_| amp * rng.f32()).collect())
        .collect()
}

/// Query `[n_q, T, HD]` from per-token rows `[n_q * HD]`.
fn q_of(tokens: &[&Vec<f32>], n_q: usize) -> Vec<f32> {
    let t = tokens.len();
    let mut q = vec![0f32; n_q * t * HD];
    for (i, row) in tokens.iter().enumerate() {
        for h in 0..n_q {
            q[(h * t + i) * HD..][..HD].copy_from_slice(&row[h * HD..][..HD]);
        }
    }
    q
}

/// Token `i`'s output rows `[n_q * HD]` of an output `[n_q, T, HD]`, as bits.
fn token_bits(out: &[f32], n_q: usize, t: usize, i: usize) -> Vec<u32> {
    (0..n_q)
        .flat_map(|h| out[(h * t + i) * HD..][..HD].iter().map(|x| x.to_bits()))
        .collect()
}

fn opts(isa: NativeIsa, threads: usize) -> AttendOptions {
    AttendOptions {
        threads: Some(threads),
        native_isa: isa,
        ..AttendOptions::default()
    }
}

/// The cells layouts of the sequence's positions `0..N`.
fn layouts(rng: &mut Rng) -> Vec<(&'static str, Vec<usize>)> {
    let mut shuffled: Vec<usize> = (0..SLOTS).collect();
    for i in (1..SLOTS).rev() {
        shuffled.swap(i, rng.range(0, i));
    }
    // Runs of a few cells in position order, the runs out of order.
    let mut blocks: Vec<usize> = (0..N).collect();
    for c in blocks.chunks_mut(13) {
        c.reverse();
    }
    vec![
        ("contiguous", (0..N).collect()),
        ("interleaved", (0..N).map(|p| 2 * p + 1).collect()),
        ("shuffled", shuffled[..N].to_vec()),
        ("reversed blocks", blocks.iter().map(|&p| p + 7).collect()),
        ("ring wrap", (0..N).map(|p| (p + 61) % N).collect()),
    ]
}

/// Token runs in position order: the cells of `positions`, consecutive
/// cells coalesced.
fn runs_of(cells: &[usize], positions: impl Iterator<Item = usize>) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::new();
    for p in positions {
        let c = cells[p];
        match out.last_mut() {
            Some(r) if r.start + r.len == c => r.len += 1,
            _ => out.push(Run::new(c, 1)),
        }
    }
    out
}

/// Cell steps: the target tokens (positions `P`, window or not) against
/// the sequence's keys in each layout, alone and inside batches with other
/// tokens (which see other cells, NaN included in none), compare bit for bit.
#[test]
fn cell_steps_are_layout_and_batch_invariant() {
    let mut rng = Rng::new(0x5eed_0039);
    for g in [3usize, 6] {
        let n_q = N_KV * g;
        let keys = random_rows(&mut rng, N_KV * N, 1.0);
        let vals = random_rows(&mut rng, N_KV * N, 1.0);
        let queries: Vec<Vec<f32>> = (0..8)
            .map(|_| (0..n_q * HD).map(|_| 3.0 * rng.f32()).collect())
            .collect();
        let layouts = layouts(&mut rng);
        for &(kd, vd) in &DTYPES {
            for isa in native_isas() {
                for window in [None, Some(70usize)] {
                    // (target position, query) pairs, all compared to the first layout alone.
                    for (qi, p) in [(0usize, N - 1), (1, 100), (2, 63), (3, 64)] {
                        let first = |p: usize| window.map_or(0, |w| (p + 1).saturating_sub(w));
                        let mut want: Option<Vec<u32>> = None;
                        for (name, cells) in &layouts {
                            let kp = pool(kd, &keys, cells);
                            let vp = pool(vd, &vals, cells);
                            // Batches: the target alone, then among others at
                            // other positions (and other token indices).
                            let others = [(4usize, 20usize), (5, 149), (6, 7), (7, 120)];
                            for (bi, batch) in [0usize, 2, 4].into_iter().enumerate() {
                                let mut toks: Vec<(usize, usize)> = others[..batch].to_vec();
                                toks.insert(bi.min(toks.len()), (qi, p));
                                let at = toks.iter().position(|t| t.0 == qi).unwrap();
                                let mut offsets = vec![0usize];
                                let mut runs: Vec<Run> = Vec::new();
                                for &(_, tp) in &toks {
                                    runs.extend(runs_of(cells, first(tp)..=tp));
                                    offsets.push(runs.len());
                                }
                                let positions: Vec<usize> = toks.iter().map(|t| t.1).collect();
                                let spec = AttendSpec {
                                    k: kp.rows(),
                                    v: vp.rows(),
                                    n_kv_heads: N_KV,
                                    head_dim: HD,
                                    slots: SLOTS,
                                    positions: &positions,
                                    keys: KeyLayout::Cells {
                                        offsets: &offsets,
                                        runs: &runs,
                                        read_len: SLOTS,
                                    },
                                };
                                let rows: Vec<&Vec<f32>> =
                                    toks.iter().map(|t| &queries[t.0]).collect();
                                let q = q_of(&rows, n_q);
                                for threads in [1usize, 2] {
                                    let out = attend(
                                        &q,
                                        [n_q, toks.len(), HD],
                                        &spec,
                                        &opts(isa, threads),
                                    )
                                    .unwrap();
                                    let got = token_bits(&out, n_q, toks.len(), at);
                                    assert!(got.iter().all(|b| !f32::from_bits(*b).is_nan()));
                                    match &want {
                                        None => want = Some(got),
                                        Some(w) => assert!(
                                            *w == got,
                                            "{kd:?}/{vd:?} {isa:?} g {g} window {window:?} position {p}: \
                                             {name}, batch of {}, {threads} threads differs from contiguous alone",
                                            toks.len()
                                        ),
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Sequence steps (read runs): a token's output is the same alone, in
/// prefill chunks of several sizes and offsets, on 1 or 2 threads, and with
/// its history wrapped around a ring (two read runs), causal or windowed.
#[test]
fn sequence_steps_are_chunk_thread_and_wrap_invariant() {
    let mut rng = Rng::new(0x5eed_1039);
    for g in [1usize, 6] {
        let n_q = N_KV * g;
        let keys = random_rows(&mut rng, N_KV * N, 1.0);
        let vals = random_rows(&mut rng, N_KV * N, 1.0);
        let queries: Vec<Vec<f32>> = (0..N)
            .map(|_| (0..n_q * HD).map(|_| 3.0 * rng.f32()).collect())
            .collect();
        // Physical layouts: contiguous from slot 0, from slot 9, and wrapped.
        let wrap = 330;
        let places: [(&str, Vec<usize>, Runs); 3] = [
            ("flat", (0..N).collect(), Runs::one(Run::new(0, N))),
            (
                "offset",
                (0..N).map(|p| p + 9).collect(),
                Runs::one(Run::new(9, N)),
            ),
            (
                "ring wrap",
                (0..N).map(|p| (p + wrap) % SLOTS).collect(),
                Runs::two(
                    Run::new(wrap, SLOTS - wrap),
                    Run::new(0, N - (SLOTS - wrap)),
                ),
            ),
        ];
        for &(kd, vd) in &DTYPES {
            for isa in native_isas() {
                for mask in [MaskKind::Causal, MaskKind::Window(70)] {
                    for p in [N - 1, 64] {
                        let mut want: Option<Vec<u32>> = None;
                        for (name, cells, read) in &places {
                            let kp = pool(kd, &keys, cells);
                            let vp = pool(vd, &vals, cells);
                            // Chunks holding p: alone, and longer chunks ending at or after it.
                            for (lo, hi) in [(p, p + 1), (p - 3, p + 1), (p - 40, (p + 9).min(N))] {
                                let positions: Vec<usize> = (lo..hi).collect();
                                let spec = AttendSpec {
                                    k: kp.rows(),
                                    v: vp.rows(),
                                    n_kv_heads: N_KV,
                                    head_dim: HD,
                                    slots: SLOTS,
                                    positions: &positions,
                                    keys: KeyLayout::Runs {
                                        read: *read,
                                        read_base_pos: 0,
                                        mask,
                                    },
                                };
                                let rows: Vec<&Vec<f32>> = (lo..hi).map(|i| &queries[i]).collect();
                                let q = q_of(&rows, n_q);
                                let t = hi - lo;
                                for threads in [1usize, 2] {
                                    let out = attend(&q, [n_q, t, HD], &spec, &opts(isa, threads))
                                        .unwrap();
                                    let got = token_bits(&out, n_q, t, p - lo);
                                    assert!(got.iter().all(|b| !f32::from_bits(*b).is_nan()));
                                    match &want {
                                        None => want = Some(got),
                                        Some(w) => assert!(
                                            *w == got,
                                            "{kd:?}/{vd:?} {isa:?} g {g} {mask:?} position {p}: \
                                             {name}, chunk {lo}..{hi}, {threads} threads differs from flat alone"
                                        ),
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
