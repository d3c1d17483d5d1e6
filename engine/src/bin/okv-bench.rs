//! okv-bench: prompt processing and generation rates of a GGUF model on the
//! native engine, in the shape of llama.cpp's `llama-bench` (`pp N`, `tg N`,
//! each at a depth of context already held), so the two can be run side by
//! side on the same file (benches/bench_engine.py does).
//!
//! ```text
//! okv-bench model.gguf [--threads 1,2] [--depth 0,4096] [--pp 512] [--tg 128]
//!                      [--reps 3] [--ubatch 512] [--kv-dtype float32] [--no-repack]
//!                      [--verify K]
//! okv-bench --floor 2048 [--threads 1,2] [--reps 3]
//! ```
//! Each thread count and depth first runs one untimed token (as llama-bench
//! warms up). One JSON object per line on stdout: each test's rates per repetition and
//! their median, then the process's peak resident memory, the file's size and
//! the pools' bytes.
//!
//! `--verify K` also times a speculative verification step at each depth: one
//! step scoring K + 1 tokens of a sequence with logits for every row, against
//! a one-token step, alternated in pairs; the line gives both steps' median
//! milliseconds and their ratio (a step that reads the weights once costs
//! little more than one token).
//!
//! `--floor MIB` measures the read floor instead: a streaming read of a
//! buffer of MIB MiB (far past the last-level cache) with the widest vector
//! loads the CPU has, split over the threads by the same worker pool as the
//! engine's matmuls (`offgraph_kv::workers`), so the floor's threads are the
//! decode's threads. Each repetition takes the median of 5 passes; the line
//! gives every repetition's median and the best of them, in GB/s (1e9 B/s).

use std::process::ExitCode;
use std::time::Instant;

use offgraph_kv::{KvDtype, SeqId};
use offgraph_kv_engine::Model;

struct Args {
    path: String,
    floor_mib: usize,
    threads: Vec<usize>,
    depths: Vec<usize>,
    pp: usize,
    tg: usize,
    reps: usize,
    ubatch: usize,
    kv_dtype: KvDtype,
    repack: bool,
    verify: usize,
}

const USAGE: &str = "usage: okv-bench MODEL.gguf [--threads 1,2] [--depth 0,4096] [--pp 512] [--tg 128] [--reps 3] [--ubatch 512] [--kv-dtype float32] [--no-repack] [--verify K]\n       okv-bench --floor MIB [--threads 1,2] [--reps 3]";

fn list(v: &str, flag: &str) -> Result<Vec<usize>, String> {
    v.split(',')
        .map(|x| {
            x.trim()
                .parse::<usize>()
                .map_err(|_| format!("{flag}: expected numbers separated by commas, got {v:?}"))
        })
        .collect()
}

fn one(v: &str, flag: &str) -> Result<usize, String> {
    v.parse::<usize>()
        .map_err(|_| format!("{flag}: expected a number, got {v:?}"))
}

fn parse() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        path: String::new(),
        floor_mib: 0,
        threads: vec![std::thread::available_parallelism().map_or(1, |n| n.get())],
        depths: vec![0],
        pp: 512,
        tg: 128,
        reps: 3,
        ubatch: 512,
        kv_dtype: KvDtype::Float32,
        repack: true,
        verify: 0,
    };
    while let Some(arg) = it.next() {
        let mut val = |flag: &str| it.next().ok_or_else(|| format!("{flag}: expected a value"));
        match arg.as_str() {
            "--threads" | "-t" => a.threads = list(&val("--threads")?, "--threads")?,
            "--depth" | "-d" => a.depths = list(&val("--depth")?, "--depth")?,
            "--pp" | "-p" => a.pp = one(&val("--pp")?, "--pp")?,
            "--tg" | "-n" => a.tg = one(&val("--tg")?, "--tg")?,
            "--reps" | "-r" => a.reps = one(&val("--reps")?, "--reps")?,
            "--floor" => a.floor_mib = one(&val("--floor")?, "--floor")?,
            "--ubatch" | "-ub" => a.ubatch = one(&val("--ubatch")?, "--ubatch")?,
            "--kv-dtype" => {
                a.kv_dtype = KvDtype::parse(&val("--kv-dtype")?).map_err(|e| e.to_string())?
            }
            "--no-repack" => a.repack = false,
            "--verify" => a.verify = one(&val("--verify")?, "--verify")?,
            "-h" | "--help" => return Err(String::new()),
            s if s.starts_with('-') => return Err(format!("unknown flag {s:?}")),
            s if a.path.is_empty() => a.path = s.to_owned(),
            s => return Err(format!("one model file expected, got a second: {s:?}")),
        }
    }
    if a.floor_mib > 0 {
        if !a.path.is_empty() {
            return Err("--floor takes no model file".into());
        }
        if a.threads.contains(&0) || a.reps == 0 {
            return Err("--threads and --reps must be >= 1".into());
        }
        return Ok(a);
    }
    if a.path.is_empty() {
        return Err("no model file given".into());
    }
    if a.threads.contains(&0)
        || a.reps == 0
        || a.ubatch == 0
        || (a.pp == 0 && a.tg == 0 && a.verify == 0)
    {
        return Err(
            "--threads, --reps and --ubatch must be >= 1, and one of --pp/--tg/--verify".into(),
        );
    }
    Ok(a)
}

/// Random-looking token ids below `vocab` (llama-bench feeds random tokens too).
fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Skip the first ids (special tokens), stay below the vocab.
            (100 + x % (vocab.saturating_sub(100).max(1) as u64)) as u32
        })
        .collect()
}

/// Prefills `ids` at positions `p0..` of `seq` in chunks of `ubatch`, logits for the last row only.
fn prefill(
    m: &Model,
    kc: &mut offgraph_kv::KvCellCache,
    seq: SeqId,
    ids: &[u32],
    p0: usize,
    ubatch: usize,
) -> offgraph_kv_engine::Result<()> {
    for (c, part) in ids.chunks(ubatch).enumerate() {
        let start = p0 + c * ubatch;
        let pos: Vec<usize> = (start..start + part.len()).collect();
        let seqs = vec![seq; part.len()];
        m.forward(kc, part, &seqs, &pos, &[part.len() - 1])?;
    }
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn peak_rss_kib() -> Option<u64> {
    rss_kib("VmHWM:")
}

/// A `/proc/self/status` memory line (`VmHWM:` peak, `VmRSS:` now), KiB.
fn rss_kib(key: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn run(a: &Args) -> offgraph_kv_engine::Result<()> {
    let t_open = Instant::now();
    let opts = offgraph_kv_engine::model::OpenOptions {
        repack: a.repack && offgraph_kv_engine::model::OpenOptions::from_env().repack,
    };
    let mut model = Model::open_with(&a.path, opts)?;
    let open_s = t_open.elapsed().as_secs_f64();
    let open_rss = rss_kib("VmRSS:").unwrap_or(0);
    let vocab = model.config().vocab;
    let max_depth = a.depths.iter().copied().max().unwrap_or(0);
    let n_cells = max_depth + a.pp.max(a.tg).max(a.verify) + 1;
    let step = a.ubatch.min(a.pp.max(1)).max(a.verify + 1);
    let mut kc = model.new_cache(n_cells, 4, step, a.kv_dtype, a.kv_dtype)?;
    let mut pool_bytes = 0usize;
    for &threads in &a.threads {
        model.set_threads(threads);
        for &depth in &a.depths {
            kc.clear();
            let seq = kc.cells_mut().seq_new()?;
            prefill(&model, &mut kc, seq, &tokens(depth, vocab, 7), 0, step)?;
            // One untimed token first, as llama-bench warms up: every weight
            // page is then mapped, so the first repetition pays no faults.
            model.forward(&mut kc, &tokens(1, vocab, 3), &[seq], &[depth], &[0])?;
            kc.cells_mut().seq_rm(seq, depth, None)?;
            for (test, n) in [("pp", a.pp), ("tg", a.tg)] {
                if n == 0 {
                    continue;
                }
                let mut rates = Vec::with_capacity(a.reps);
                for rep in 0..a.reps {
                    let ids = tokens(n, vocab, 11 + rep as u64);
                    let t0 = Instant::now();
                    if test == "pp" {
                        prefill(&model, &mut kc, seq, &ids, depth, step)?;
                    } else {
                        for (i, &id) in ids.iter().enumerate() {
                            model.forward(&mut kc, &[id], &[seq], &[depth + i], &[0])?;
                        }
                    }
                    rates.push(n as f64 / t0.elapsed().as_secs_f64());
                    pool_bytes = pool_bytes.max(kc.nbytes_total());
                    kc.cells_mut().seq_rm(seq, depth, None)?;
                }
                let each: Vec<String> = rates.iter().map(|r| format!("{r:.3}")).collect();
                let med = median(&mut rates);
                println!(
                    "{{\"test\": \"{test}{n}\", \"depth\": {depth}, \"threads\": {threads}, \"kv_dtype\": \"{}\", \"tokens_per_s\": [{}], \"median\": {med:.3}}}",
                    a.kv_dtype.name(),
                    each.join(", ")
                );
            }
            if a.verify > 0 {
                verify_cost(&model, &mut kc, seq, depth, a)?;
            }
        }
    }
    let file = std::fs::metadata(&a.path).map(|m| m.len()).unwrap_or(0);
    println!(
        "{{\"peak_rss_kib\": {}, \"file_bytes\": {file}, \"pool_bytes\": {pool_bytes}, \"pool_reserved_bytes\": {}, \"open_s\": {open_s:.3}, \"rss_after_open_kib\": {open_rss}, \"rss_kib\": {}, \"packed_bytes\": {}}}",
        peak_rss_kib().unwrap_or(0),
        kc.reserved_bytes(),
        rss_kib("VmRSS:").unwrap_or(0),
        model.packed_bytes()
    );
    Ok(())
}

/// Timed pairs per repetition of `--verify`.
const PAIRS: usize = 4;

/// One JSON line: a step verifying `a.verify` drafted tokens (K + 1 rows
/// scored) against a one-token step, both at `depth` of `seq`.
fn verify_cost(
    m: &Model,
    kc: &mut offgraph_kv::KvCellCache,
    seq: SeqId,
    depth: usize,
    a: &Args,
) -> offgraph_kv_engine::Result<()> {
    let vocab = m.config().vocab;
    let k1 = a.verify + 1;
    let pos: Vec<usize> = (depth..depth + k1).collect();
    let rows: Vec<usize> = (0..k1).collect();
    let (mut one, mut many) = (Vec::new(), Vec::new());
    for rep in 0..a.reps {
        let ids = tokens(k1, vocab, 23 + rep as u64);
        let (mut t_one, mut t_many) = (0.0, 0.0);
        for _ in 0..PAIRS {
            let t0 = Instant::now();
            m.forward(kc, &ids[..1], &[seq], &[depth], &[0])?;
            t_one += t0.elapsed().as_secs_f64();
            kc.cells_mut().seq_rm(seq, depth, None)?;
            let t0 = Instant::now();
            m.forward(kc, &ids, &vec![seq; k1], &pos, &rows)?;
            t_many += t0.elapsed().as_secs_f64();
            kc.cells_mut().seq_rm(seq, depth, None)?;
        }
        one.push(t_one * 1e3 / PAIRS as f64);
        many.push(t_many * 1e3 / PAIRS as f64);
    }
    let fmt = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (e1, ek) = (fmt(&one), fmt(&many));
    let (m1, mk) = (median(&mut one), median(&mut many));
    println!(
        "{{\"test\": \"verify{}\", \"depth\": {depth}, \"threads\": {}, \"kv_dtype\": \"{}\", \"one_token_ms\": [{e1}], \"verify_ms\": [{ek}], \"one_token_median_ms\": {m1:.2}, \"verify_median_ms\": {mk:.2}, \"ratio\": {:.3}}}",
        a.verify,
        m.threads(),
        a.kv_dtype.name(),
        mk / m1
    );
    Ok(())
}

/// Bytes of each SIMD step of the floor's read (four 64-byte lines).
const STEP: usize = 256;

/// Reads `n` bytes from `p` with AVX-512 loads into four accumulators.
///
/// # Safety
/// AVX-512F; `p` holds `n` bytes, `n` a multiple of [`STEP`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn read_avx512(p: *const u8, n: usize) -> u64 {
    use std::arch::x86_64::*;
    // SAFETY: every load lies below `p + n`.
    unsafe {
        let mut a = [_mm512_setzero_si512(); 4];
        let mut o = 0;
        while o + STEP <= n {
            for (i, acc) in a.iter_mut().enumerate() {
                let v = _mm512_loadu_si512(p.add(o + 64 * i).cast());
                *acc = _mm512_add_epi64(*acc, v);
            }
            o += STEP;
        }
        let s = _mm512_add_epi64(_mm512_add_epi64(a[0], a[1]), _mm512_add_epi64(a[2], a[3]));
        _mm512_reduce_add_epi64(s) as u64
    }
}

/// Reads `n` bytes from `p` with AVX2 loads into eight accumulators.
///
/// # Safety
/// AVX2; `p` holds `n` bytes, `n` a multiple of [`STEP`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn read_avx2(p: *const u8, n: usize) -> u64 {
    use std::arch::x86_64::*;
    // SAFETY: every load lies below `p + n`.
    unsafe {
        let mut a = [_mm256_setzero_si256(); 8];
        let mut o = 0;
        while o + STEP <= n {
            for (i, acc) in a.iter_mut().enumerate() {
                let v = _mm256_loadu_si256(p.add(o + 32 * i).cast());
                *acc = _mm256_add_epi64(*acc, v);
            }
            o += STEP;
        }
        let mut lanes = [0u64; 4];
        for acc in a {
            _mm256_storeu_si256(lanes.as_mut_ptr().cast(), acc);
            let s: u64 = lanes.iter().fold(0u64, |x, &y| x.wrapping_add(y));
            lanes = [s, 0, 0, 0];
        }
        lanes[0]
    }
}

/// The widest loads this CPU has, by name and reader.
fn floor_reader() -> (&'static str, fn(&[u8]) -> u64) {
    #[cfg(target_arch = "x86_64")]
    {
        let f = offgraph_kv::cpu::features();
        if f.avx512f {
            // SAFETY: AVX-512F detected; the slice bounds the reads.
            return ("avx512", |b| unsafe { read_avx512(b.as_ptr(), b.len()) });
        }
        if is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 detected; the slice bounds the reads.
            return ("avx2", |b| unsafe { read_avx2(b.as_ptr(), b.len()) });
        }
    }
    ("scalar", |b| {
        b.chunks_exact(8).fold(0u64, |s, c| {
            s.wrapping_add(u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        })
    })
}

/// The floor: GB/s of a streaming read of `mib` MiB on each thread count.
fn floor(a: &Args) -> Result<(), String> {
    const PASSES: usize = 5;
    let bytes = a.floor_mib << 20;
    // Written, not zeroed: zero pages would all map one shared page.
    let mut buf: Vec<u8> = (0..bytes + 64).map(|i| (i as u8) | 1).collect();
    let off = buf.as_ptr().align_offset(64).min(64);
    let data = buf.get_mut(off..off + bytes).ok_or("--floor: buffer")?;
    let (isa, read) = floor_reader();
    for &threads in &a.threads {
        let span = |p: usize| (bytes / STEP * p / threads) * STEP;
        let sink = std::sync::atomic::AtomicU64::new(0);
        let part = |p: usize| {
            let b = data.get(span(p)..span(p + 1)).unwrap_or(&[]);
            sink.fetch_add(read(b), std::sync::atomic::Ordering::Relaxed);
        };
        // One pass first so the pool's threads exist and the pages are warm in the TLB.
        offgraph_kv::workers::run(threads, &part).map_err(|()| "--floor: a reader panicked")?;
        let mut medians = Vec::with_capacity(a.reps);
        for _ in 0..a.reps {
            let mut gbs = Vec::with_capacity(PASSES);
            for _ in 0..PASSES {
                let t0 = Instant::now();
                offgraph_kv::workers::run(threads, &part)
                    .map_err(|()| "--floor: a reader panicked")?;
                gbs.push(bytes as f64 / t0.elapsed().as_secs_f64() / 1e9);
            }
            medians.push(median(&mut gbs));
        }
        std::hint::black_box(sink.load(std::sync::atomic::Ordering::Relaxed));
        let best = medians.iter().copied().fold(f64::NAN, f64::max);
        let each: Vec<String> = medians.iter().map(|r| format!("{r:.2}")).collect();
        println!(
            "{{\"test\": \"floor\", \"mib\": {}, \"threads\": {threads}, \"isa\": \"{isa}\", \"gb_per_s\": [{}], \"best\": {best:.2}}}",
            a.floor_mib,
            each.join(", ")
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("okv-bench: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    if args.floor_mib > 0 {
        return match floor(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("okv-bench: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("okv-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
