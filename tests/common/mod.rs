//! Shared helpers for the integration tests: a seeded PRNG (no extra deps),
//! the pool rows a query of an attention spec sees (what the float64
//! references attend over), the native ISAs this CPU runs, and pools in
//! every KV dtype ([`pool`]).
#![allow(dead_code)]

pub mod pool;
pub mod snap;

/// splitmix64: small, fast, and good enough to drive random operation sequences.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % ((hi - lo + 1) as u64)) as usize
    }

    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// The slot rows token `i` sees, in order.
pub fn visible_rows(spec: &offgraph_kv::AttendSpec<'_>, i: usize) -> Vec<usize> {
    match spec.keys {
        offgraph_kv::KeyLayout::Runs {
            read,
            read_base_pos,
            mask,
        } => {
            let mut rows = Vec::new();
            let mut r = 0;
            for run in read.as_slice() {
                for s in run.start..run.end() {
                    if mask.visible(spec.positions[i], read_base_pos + r) {
                        rows.push(s);
                    }
                    r += 1;
                }
            }
            rows
        }
        offgraph_kv::KeyLayout::Cells { offsets, runs, .. } => runs[offsets[i]..offsets[i + 1]]
            .iter()
            .flat_map(|r| r.start..r.end())
            .collect(),
    }
}

/// Every native attention ISA this CPU runs.
pub fn native_isas() -> Vec<offgraph_kv::attention::NativeIsa> {
    use offgraph_kv::attention::NativeIsa;
    let mut v = vec![NativeIsa::Scalar];
    #[cfg(target_arch = "x86_64")]
    {
        let f = offgraph_kv::cpu::features();
        if f.avx512f {
            v.push(NativeIsa::Avx512);
        }
        if f.avx512f && f.avx512bw && f.avx512vnni {
            v.push(NativeIsa::Avx512Vnni);
        }
        if f.avx2_fma_f16c() {
            v.push(NativeIsa::Avx2);
            v.push(NativeIsa::Avx2Int8);
        }
    }
    v
}
