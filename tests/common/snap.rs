//! What the snapshot tests feed and read: deterministic K/V rows per layer and
//! position, configs of `H` heads x `D`, a cell sequence fed in steps, its next
//! step's attention outputs, and a forged snapshot with a valid checksum.

use offgraph_kv::kv::snapshot::crc32;
use offgraph_kv::{attend, AttendOptions, CacheConfig, KvCellCache, LayerConfig, LayerPolicy};

pub const H: usize = 2;
pub const D: usize = 4;

pub const MIXED: [LayerPolicy; 3] = [
    LayerPolicy::Flat,
    LayerPolicy::Ring { window: 8 },
    LayerPolicy::Ring { window: 5 },
];

pub fn val(layer: usize, pos: usize, h: usize, d: usize, v: bool) -> f32 {
    let x = (layer * 1009 + pos * 31 + h * 7 + d) as f32 * 0.173 + if v { 0.5 } else { 0.0 };
    x.sin()
}

/// `[H, n, D]` rows of positions `p0..p0+n` of `layer`.
pub fn rows(layer: usize, p0: usize, n: usize, v: bool) -> Vec<f32> {
    let mut out = Vec::with_capacity(H * n * D);
    for h in 0..H {
        for t in 0..n {
            for d in 0..D {
                out.push(val(layer, p0 + t, h, d, v));
            }
        }
    }
    out
}

pub fn cfg(policies: &[LayerPolicy], max_step: usize) -> CacheConfig {
    let layers = policies
        .iter()
        .map(|p| LayerConfig::new(*p, H, D))
        .collect();
    let mut c = CacheConfig::new(256, policies.len(), layers);
    c.max_step = max_step;
    c.initial_capacity = 2;
    c
}

/// Feeds `seq` positions `[from, to)` in steps of at most `step` tokens.
pub fn cell_feed(c: &mut KvCellCache, seq: u64, from: usize, to: usize, step: usize) {
    let mut p = from;
    while p < to {
        let n = step.min(to - p);
        let pos: Vec<usize> = (p..p + n).collect();
        c.begin_step(&vec![seq; n], &pos).unwrap();
        for l in 0..c.config().n_layers {
            c.update(l, &rows(l, p, n, false), &rows(l, p, n, true))
                .unwrap();
        }
        p += n;
    }
}

/// Every layer's attention output of one more token of `seq` at position `p`.
pub fn cell_step(c: &mut KvCellCache, seq: u64, p: usize) -> Vec<Vec<f32>> {
    c.begin_step(&[seq], &[p]).unwrap();
    let opts = AttendOptions {
        threads: Some(1),
        ..Default::default()
    };
    (0..c.config().n_layers)
        .map(|l| {
            let spec = c
                .update(l, &rows(l, p, 1, false), &rows(l, p, 1, true))
                .unwrap();
            attend(&rows(l + 7, p, 1, false), [H, 1, D], &spec, &opts).unwrap()
        })
        .collect()
}

/// `data` with `patch` at `at` and a valid checksum.
pub fn forged(data: &[u8], at: usize, patch: &[u8]) -> Vec<u8> {
    let mut d = data[..data.len() - 4].to_vec();
    d[at..at + patch.len()].copy_from_slice(patch);
    let c = crc32(&d);
    d.extend_from_slice(&c.to_le_bytes());
    d
}
