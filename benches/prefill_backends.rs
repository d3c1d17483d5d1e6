//! Prefill attention, native against XNNPACK, against the FMA bound, in one
//! run: T = 128 and 512 query tokens at the end of an 8,192-token causal
//! context, 8 KV heads, 32 query heads, head_dim 128, float32 pools (the
//! only dtype XNNPACK serves), 1 and 2 threads. The two backends alternate
//! call by call; medians. The FMA bound is the call's flops (4 per query row,
//! visible key and head value) at the register-only FMA peak measured here.
//!
//! `PREFILL_BENCH_ROUNDS` (default 5); `ATTN_BENCH_QUICK=1` runs T = 128 at
//! ctx 2048, 2 rounds (CI's smoke form).
#![allow(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]

use offgraph_kv::attention::{attend_into, AttendOptions, Backend};
use offgraph_kv::KvRows;
use std::time::Instant;

mod common;
use common::{causal_spec, data, fma_peak};

fn median(mut x: Vec<f64>) -> f64 {
    x.sort_by(f64::total_cmp);
    x[x.len() / 2]
}

fn main() {
    if !Backend::Xnnpack.available() {
        eprintln!("XNNPACK backend not built (cargo feature `xnnpack`): nothing to compare");
        return;
    }
    let quick = std::env::var_os("ATTN_BENCH_QUICK").is_some();
    let rounds: usize = std::env::var("PREFILL_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if quick { 2 } else { 5 });
    let (n_kv, n_q, hd) = (8usize, 32usize, 128usize);
    let ctx = if quick { 2048 } else { 8192 };
    let ts: &[usize] = if quick { &[128] } else { &[128, 512] };
    let k = data(n_kv * ctx * hd, 1);
    let v = data(n_kv * ctx * hd, 2);
    let peak = [fma_peak(1), fma_peak(2)];
    println!(
        "FMA peak {:.1} GFLOP/s (1 thread), {:.1} (2 threads); ctx {ctx}; {rounds} rounds",
        peak[0], peak[1]
    );
    println!("| T | threads | native ms | xnnpack ms | xnnpack / native | FMA bound ms | native / bound | xnnpack / bound |");
    println!("|---|---|---|---|---|---|---|---|");
    for &t in ts {
        let positions: Vec<usize> = (ctx - t..ctx).collect();
        let spec = causal_spec(
            KvRows::from_f32(&k),
            KvRows::from_f32(&v),
            (n_kv, hd),
            ctx,
            &positions,
        );
        let q = data(n_q * t * hd, 3);
        let mut out = vec![0f32; q.len()];
        // Visible keys summed over the T causal rows.
        let keys: usize = positions.iter().map(|p| p + 1).sum();
        let flops = 4.0 * (n_q * keys * hd) as f64;
        for threads in [1usize, 2] {
            let mut times = [Vec::new(), Vec::new()];
            for round in 0..rounds + 1 {
                for o in 0..2 {
                    let which = (o + round) % 2;
                    let opts = AttendOptions {
                        threads: Some(threads),
                        backend: [Backend::Native, Backend::Xnnpack][which],
                        ..Default::default()
                    };
                    let s = Instant::now();
                    attend_into(&q, [n_q, t, hd], &spec, &opts, &mut out).unwrap();
                    if round > 0 {
                        times[which].push(s.elapsed().as_secs_f64() * 1e3);
                    }
                }
            }
            let [n, x] = times.map(median);
            let bound = flops / peak[threads - 1] / 1e6;
            println!(
                "| {t} | {threads} | {n:.1} | {x:.1} | {:.2} | {bound:.1} | {:.2} | {:.2} |",
                x / n,
                n / bound,
                x / bound
            );
        }
    }
}
