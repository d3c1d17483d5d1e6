//! q8_0 keys: integer dots against the register widening of the same ISA,
//! interleaved call by call so drift in a shared machine's load hits both
//! alike (criterion runs one after the other): VNNI (`NativeIsa::Avx512Vnni`)
//! against `NativeIsa::Avx512` where the CPU has AVX-512 VNNI, else AVX2
//! `vpmaddubsw` (`NativeIsa::Avx2Int8`) against `NativeIsa::Avx2`.
//!
//! Decode, 8 KV / 32 query heads x 128, q8_0 K and V, contexts 2048 and 8192,
//! 1 and 2 threads; each call after a 96 MiB cache flush; the order of the
//! two alternates. Prints the median of each and their ratio.
#![allow(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]

use offgraph_kv::attention::{attend_into, AttendOptions, Backend, NativeIsa};
use offgraph_kv::dtype::encode;
use offgraph_kv::{KvDtype, KvRows};
use std::hint::black_box;
use std::time::Instant;

mod common;
use common::{causal_spec, data, read_sum};

const ROUNDS: usize = 101;

fn pool(values: &[f32]) -> Vec<u8> {
    let mut b = vec![0u8; KvDtype::Q8_0.row_bytes(values.len())];
    assert!(encode(KvDtype::Q8_0, values, &mut b));
    b
}

fn median(mut x: Vec<f64>) -> f64 {
    x.sort_by(f64::total_cmp);
    x[x.len() / 2]
}

fn main() {
    let (isas, names) = if offgraph_kv::cpu::features().avx512vnni {
        (
            [NativeIsa::Avx512, NativeIsa::Avx512Vnni],
            ["widen", "vnni"],
        )
    } else if offgraph_kv::cpu::features().avx2 {
        (
            [NativeIsa::Avx2, NativeIsa::Avx2Int8],
            ["widen", "avx2 int8"],
        )
    } else {
        eprintln!("no AVX-512 VNNI or AVX2 on this CPU: nothing to compare");
        return;
    };
    let flush = vec![1.0f32; 24 << 20];
    let (n_kv, n_q, hd) = (8, 32, 128);
    for ctx in [2048usize, 8192] {
        let (k, v) = (
            pool(&data(n_kv * ctx * hd, 1)),
            pool(&data(n_kv * ctx * hd, 2)),
        );
        let q = data(n_q * hd, 3);
        let positions = [ctx - 1];
        let rows = |bytes| KvRows {
            dtype: KvDtype::Q8_0,
            bytes,
        };
        let spec = causal_spec(rows(&k), rows(&v), (n_kv, hd), ctx, &positions);
        let mut out = vec![0f32; q.len()];
        for threads in [1usize, 2] {
            let mut times = [Vec::new(), Vec::new()];
            for round in 0..ROUNDS {
                for o in 0..2 {
                    let i = (o + round) % 2;
                    let opts = AttendOptions {
                        threads: Some(threads),
                        backend: Backend::Native,
                        native_isa: isas[i],
                        ..Default::default()
                    };
                    black_box(read_sum(&flush));
                    let t = Instant::now();
                    attend_into(&q, [n_q, 1, hd], &spec, &opts, &mut out).unwrap();
                    times[i].push(t.elapsed().as_secs_f64() * 1e3);
                }
            }
            let [w, n] = times.map(median);
            println!(
                "q8_0 ctx {ctx} threads {threads}: {} {w:.3} ms, {} {n:.3} ms, {}/{} {:.2}",
                names[0],
                names[1],
                names[1],
                names[0],
                n / w
            );
        }
    }
}
