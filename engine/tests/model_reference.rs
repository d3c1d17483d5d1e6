//! The engine's logits against transformers float32 loaded from the same GGUF
//! files (fixture: `fixtures/make_model_fixture.py`): top-1 agreement and the
//! KL divergence of the reference's top-5 distribution (with the rest of the
//! mass as one bucket) from the engine's, over 128 positions of real text.

mod common;

use offgraph_kv::KvDtype;
use offgraph_kv_engine::Model;
use std::path::Path;

struct Reference {
    ids: Vec<u32>,
    /// Per position, the reference's top-5 `(id, log-prob)`, best first.
    top: Vec<Vec<(usize, f64)>>,
}

fn parse_err(line: &str) -> String {
    format!("bad fixture line: {:.60}", line)
}

fn reference(arch: &str) -> Result<Reference, String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/model_reference.txt");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut lines = text
        .lines()
        .skip_while(|l| !l.starts_with(&format!("model {arch} ")));
    lines
        .next()
        .ok_or_else(|| format!("no model {arch} in the fixture"))?;
    let ids_line = lines.next().ok_or("no ids line")?;
    let ids = ids_line
        .strip_prefix("ids ")
        .ok_or_else(|| parse_err(ids_line))?
        .split(' ')
        .map(|s| s.parse::<u32>().map_err(|_| parse_err(ids_line)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut top = Vec::new();
    for line in lines.take_while(|l| l.starts_with("top ")) {
        let row = line
            .split(' ')
            .skip(1)
            .map(|pair| {
                let (i, v) = pair.split_once(':').ok_or_else(|| parse_err(line))?;
                Ok((
                    i.parse().map_err(|_| parse_err(line))?,
                    v.parse().map_err(|_| parse_err(line))?,
                ))
            })
            .collect::<Result<Vec<_>, String>>()?;
        top.push(row);
    }
    if top.len() != ids.len() {
        return Err(format!("{} ids but {} top rows", ids.len(), top.len()));
    }
    Ok(Reference { ids, top })
}

/// Top-1 agreement and mean KL over the positions; prints both.
/// How far below the reference's best an engine's choice may be (nats):
/// the largest gap seen on the kernels was 0.52 (Gemma 3).
const NEAR_TIE_NATS: f64 = 0.75;

/// Top-1 agreement, mean KL, and the misses that are not a near-tie (the
/// engine's choice not in the reference's top 5, or more than
/// [`NEAR_TIE_NATS`] below the reference's best there).
fn compare(name: &str, path: &Path, exact: bool) -> Result<(f64, f64, usize), String> {
    let mut model = Model::open(path).map_err(|e| e.to_string())?;
    model.set_exact_matmul(exact);
    let r = reference(model.config().arch.name())?;
    let t = r.ids.len();
    let mut cache = model
        .new_cache(t, 1, t, KvDtype::Float32, KvDtype::Float32)
        .map_err(|e| e.to_string())?;
    let seq = cache.cells_mut().seq_new().map_err(|e| e.to_string())?;
    let positions: Vec<usize> = (0..t).collect();
    let rows: Vec<usize> = (0..t).collect();
    let logits = model
        .forward(&mut cache, &r.ids, &vec![seq; t], &positions, &rows)
        .map_err(|e| e.to_string())?;
    let vocab = model.config().vocab;
    let (mut agree, mut kl_sum, mut wild) = (0usize, 0.0f64, 0usize);
    for (row, top) in logits.chunks_exact(vocab).zip(&r.top) {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
        let lse = max
            + row
                .iter()
                .map(|&v| (v as f64 - max).exp())
                .sum::<f64>()
                .ln();
        let argmax = row
            .iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |b, (i, &v)| if v > b.1 { (i, v) } else { b },
            )
            .0;
        if top.first().is_some_and(|&(i, _)| i == argmax) {
            agree += 1;
        } else {
            let best = top.first().map_or(f64::NEG_INFINITY, |&(_, lp)| lp);
            let near = top
                .iter()
                .any(|&(i, lp)| i == argmax && best - lp <= NEAR_TIE_NATS);
            wild += usize::from(!near);
            let ours = row[argmax] as f64 - lse;
            println!(
                "  miss: reference top-2 {:?}, engine {argmax} at {ours:.4}",
                &top[..2]
            );
        }
        let (mut kl, mut p_in, mut q_in) = (0.0f64, 0.0f64, 0.0f64);
        for &(i, lp) in top {
            let lq = *row.get(i).ok_or("fixture id beyond the vocabulary")? as f64 - lse;
            kl += lp.exp() * (lp - lq);
            p_in += lp.exp();
            q_in += lq.exp();
        }
        let (p_rest, q_rest) = ((1.0 - p_in).max(1e-12), (1.0 - q_in).max(1e-12));
        kl += p_rest * (p_rest / q_rest).ln();
        kl_sum += kl;
    }
    let top1 = agree as f64 / t as f64;
    let kl = kl_sum / t as f64;
    let mode = if exact { "f32 activations" } else { "kernels" };
    println!(
        "{name} ({mode}): {t} positions, top-1 agreement {:.2}%, mean KL (top-5 + rest) {kl:.3e}",
        top1 * 100.0
    );
    Ok((top1, kl, wild))
}

/// The forward itself, on f32 activations: what remains is float rounding.
fn exact_forward(name: &str, path: &Path) {
    let (top1, kl, _) = compare(name, path, true).unwrap();
    assert!(top1 >= 0.98, "top-1 agreement {top1}");
    assert!(kl <= 0.01, "mean KL {kl}");
}

/// The engine as it runs, on the kernels' quantized activations (Q8 blocks,
/// as llama.cpp computes): the KL bound holds; top-1 agreement is lower,
/// every miss a near-tie of the reference within a few tenths of a nat
/// (printed and asserted). Which near-ties flip follows the f32 summation
/// order of the kernels: taking batched blocks two a register moved Gemma 3
/// from 95.3% to 93.0% while its KL fell (6.8e-3 to 6.5e-3), so the bound
/// leaves room under the measured levels (93-96%).
fn kernel_forward(name: &str, path: &Path) {
    let (top1, kl, wild) = compare(name, path, false).unwrap();
    assert_eq!(wild, 0, "misses that are not near-ties of the reference");
    assert!(top1 >= 0.9, "top-1 agreement {top1}");
    assert!(kl <= 0.01, "mean KL {kl}");
}

#[test]
fn smollm2_matches_transformers() {
    exact_forward("SmolLM2-135M", &common::smollm2_gguf());
    kernel_forward("SmolLM2-135M", &common::smollm2_gguf());
}

#[test]
fn gemma3_matches_transformers() {
    exact_forward("Gemma 3 270M", &common::gemma3_gguf());
    kernel_forward("Gemma 3 270M", &common::gemma3_gguf());
}
