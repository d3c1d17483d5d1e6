//! Decode attention against its byte floor, every dtype, in one run.
//!
//! T = 1, 8 KV heads, 32 query heads, head_dim 128, contexts 2048 and 8192,
//! 1 and 2 threads, cold (a 96 MiB read before every call) and warm (the
//! call repeated, its bytes left in cache). Each round times the kernel and
//! the floor back to back, the order alternating, so load drifting on a
//! shared machine hits both alike; the table gives medians and their ratio.
//!
//! The floor is `common::read_kv`'s streaming read (the widest vector loads
//! the CPU has, K and V side by side, prefetched into L2 as the kernel does)
//! of exactly the bytes the kernel reads, split over the same threads as the
//! kernel splits its KV heads; its 2-thread form runs on a helper thread
//! started once (as the kernel's worker pool is), so neither pays a thread
//! start per call. Warm rows also give GFLOP/s (4 flops per query row, key
//! and head value: `q·k` and `p·v`) against the FMA peak measured in the
//! same run (a register-only FMA loop on the same threads).
//!
//! `DECODE_BENCH_ROUNDS` (default 41) sets the rounds; `ATTN_BENCH_QUICK=1`
//! runs 5 and only ctx 2048 (CI's smoke form).
#![allow(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]

use offgraph_kv::attention::{attend_into, AttendOptions, Backend, NativeIsa};
use offgraph_kv::{KvDtype, KvRows};
use std::hint::black_box;
use std::sync::mpsc;
use std::time::Instant;

mod common;
use common::{causal_spec, data, floor_isa, fma_peak, pool, read_kv, read_sum};

const N_KV: usize = 8;
const N_Q: usize = 32;
const HD: usize = 128;

/// The first `n` bytes of `words` as rows of `dtype`.
fn rows(dtype: KvDtype, words: &[f32], n: usize) -> KvRows<'_> {
    KvRows {
        dtype,
        bytes: &KvRows::from_f32(words).bytes[..n],
    }
}

fn median(mut x: Vec<f64>) -> f64 {
    x.sort_by(f64::total_cmp);
    x[x.len() / 2]
}

/// A helper thread started once that reads its half of the floor on request.
struct Helper {
    tx: mpsc::Sender<(usize, usize, usize, usize)>,
    rx: mpsc::Receiver<f32>,
}

impl Helper {
    fn new() -> Helper {
        let (tx, req) = mpsc::channel::<(usize, usize, usize, usize)>();
        let (ans, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for (k, v, n, _) in req {
                // SAFETY: the requester keeps both ranges alive until it has the answer.
                let (k, v) = unsafe {
                    (
                        std::slice::from_raw_parts(k as *const f32, n),
                        std::slice::from_raw_parts(v as *const f32, n),
                    )
                };
                if ans.send(read_kv(k, v, 1)).is_err() {
                    return;
                }
            }
        });
        Helper { tx, rx }
    }

    /// The floor over `threads` (1 or 2): the second half on the helper.
    fn floor(&self, k: &[f32], v: &[f32], threads: usize) -> f32 {
        if threads == 1 {
            return read_kv(k, v, 1);
        }
        // Halves on 64-float (256-byte) boundaries, as read_kv splits.
        let h = (k.len() / 2) & !63;
        let (k2, v2) = (&k[h..], &v[h..]);
        self.tx
            .send((k2.as_ptr() as usize, v2.as_ptr() as usize, k2.len(), 0))
            .unwrap();
        let a = read_kv(&k[..h], &v[..h], 1);
        a + self.rx.recv().unwrap()
    }
}

fn main() {
    let quick = std::env::var_os("ATTN_BENCH_QUICK").is_some();
    let rounds: usize = std::env::var("DECODE_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if quick { 5 } else { 41 });
    // `DECODE_BENCH_CTX` / `DECODE_BENCH_THREADS` (comma lists) narrow the grid.
    let pick = |var: &str, all: &[usize]| -> Vec<usize> {
        std::env::var(var)
            .ok()
            .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
            .unwrap_or_else(|| all.to_vec())
    };
    let ctxs = pick(
        "DECODE_BENCH_CTX",
        if quick { &[2048] } else { &[2048, 8192] },
    );
    let thread_counts = pick("DECODE_BENCH_THREADS", &[1, 2]);
    let flush = vec![1.0f32; 24 << 20];
    let helper = Helper::new();
    let peak = [fma_peak(1), fma_peak(2)];
    println!(
        "floor: {} stream read; FMA peak {:.1} GFLOP/s (1 thread), {:.1} (2 threads); {rounds} rounds",
        floor_isa(),
        peak[0],
        peak[1]
    );
    println!("| ctx | threads | cache | dtype | kernel ms | floor ms | kernel / floor | GFLOP/s | / FMA peak |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for &ctx in &ctxs {
        let kf = data(N_KV * ctx * HD, 1);
        let vf = data(N_KV * ctx * HD, 2);
        let q = data(N_Q * HD, 3);
        let positions = [ctx - 1];
        let mut out = vec![0f32; q.len()];
        let pools: Vec<_> = KvDtype::ALL
            .iter()
            .map(|&d| (d, pool(d, &kf), pool(d, &vf)))
            .collect();
        for &threads in &thread_counts {
            for warm in [false, true] {
                for (dtype, k, v) in &pools {
                    let n = dtype.row_bytes(HD) * N_KV * ctx;
                    let (kw, vw) = (&k[..n / 4], &v[..n / 4]);
                    let spec = causal_spec(
                        rows(*dtype, k, n),
                        rows(*dtype, v, n),
                        (N_KV, HD),
                        ctx,
                        &positions,
                    );
                    let opts = AttendOptions {
                        threads: Some(threads),
                        backend: Backend::Native,
                        ..Default::default()
                    };
                    let mut variants = vec![(dtype.name().to_string(), opts)];
                    // q8_0 keys by the other path of this CPU beside the default.
                    if *dtype == KvDtype::Q8_0 {
                        let vnni = offgraph_kv::cpu::features().avx512vnni;
                        let other = if vnni {
                            ("q8_0_widen", NativeIsa::Avx512)
                        } else {
                            ("q8_0_int8", NativeIsa::Avx2Int8)
                        };
                        if vnni || offgraph_kv::cpu::features().avx2 {
                            let o = AttendOptions {
                                native_isa: other.1,
                                ..opts
                            };
                            variants.push((other.0.to_string(), o));
                        }
                    }
                    for (name, opts) in &variants {
                        let mut t = [Vec::new(), Vec::new()];
                        for round in 0..rounds + 1 {
                            for o in 0..2 {
                                let which = (o + round) % 2;
                                if !warm {
                                    black_box(read_sum(&flush));
                                } else if which == 0 {
                                    attend_into(&q, [N_Q, 1, HD], &spec, opts, &mut out).unwrap();
                                } else {
                                    black_box(helper.floor(kw, vw, threads));
                                }
                                let s = Instant::now();
                                if which == 0 {
                                    attend_into(&q, [N_Q, 1, HD], &spec, opts, &mut out).unwrap();
                                } else {
                                    black_box(helper.floor(kw, vw, threads));
                                }
                                // The first round warms code paths and pages.
                                if round > 0 {
                                    t[which].push(s.elapsed().as_secs_f64() * 1e3);
                                }
                            }
                        }
                        let [km, fm] = t.map(median);
                        let flops = 4.0 * (N_Q * ctx * HD) as f64;
                        let gf = flops / km / 1e6;
                        println!(
                            "| {ctx} | {threads} | {} | {name} | {km:.3} | {fm:.3} | {:.2} | {gf:.1} | {:.2} |",
                            if warm { "warm" } else { "cold" },
                            km / fm,
                            gf / peak[threads - 1],
                        );
                    }
                }
            }
        }
    }
}
