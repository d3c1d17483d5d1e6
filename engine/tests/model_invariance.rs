//! Batch and layout invariance on the real models, on the default
//! (quantized) matmul path: a sequence's logits are the same bits alone, in
//! a chunked prefill of any chunk size, in a step shared with other
//! sequences and forks, and after a storm of other sequences has scattered
//! its cells through the pool (holes, cells out of position order). Greedy
//! text at temperature 0 then never depends on what else the server ran.

mod common;

use offgraph_kv::{KvCellCache, KvDtype, SeqId};
use offgraph_kv_engine::Model;

/// Prompts from the ids of a real text.
fn prompt(model: &Model, n: usize, skip: usize) -> Vec<u32> {
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3").unwrap();
    let start = text.find("Preamble").unwrap();
    let ids = model.tokenizer().encode(&text[start..start + 4000], false);
    ids[skip..skip + n].to_vec()
}

fn cache(model: &Model, dtype: KvDtype) -> KvCellCache {
    model.new_cache(256, 8, 64, dtype, dtype).unwrap()
}

/// One step of `(sequence, token, position)` entries, logits of every one.
fn step(model: &Model, kc: &mut KvCellCache, entries: &[(SeqId, u32, usize)]) -> Vec<Vec<f32>> {
    let toks: Vec<u32> = entries.iter().map(|e| e.1).collect();
    let seqs: Vec<SeqId> = entries.iter().map(|e| e.0).collect();
    let pos: Vec<usize> = entries.iter().map(|e| e.2).collect();
    let rows: Vec<usize> = (0..entries.len()).collect();
    let l = model.forward(kc, &toks, &seqs, &pos, &rows).unwrap();
    l.chunks(model.config().vocab)
        .map(<[f32]>::to_vec)
        .collect()
}

/// Prefills `ids` from position `from` on `seq` in chunks of `chunk`; every token's logits.
fn prefill(
    model: &Model,
    kc: &mut KvCellCache,
    seq: SeqId,
    ids: &[u32],
    from: usize,
    chunk: usize,
) -> Vec<Vec<f32>> {
    let mut all = Vec::new();
    for (c, part) in ids.chunks(chunk).enumerate() {
        let e: Vec<_> = part
            .iter()
            .enumerate()
            .map(|(i, &t)| (seq, t, from + c * chunk + i))
            .collect();
        all.extend(step(model, kc, &e));
    }
    all
}

/// The sequence's logits for its prompt and then its decode tokens, one per step.
struct Trace {
    prompt: Vec<Vec<f32>>,
    decode: Vec<Vec<f32>>,
}

fn alone(model: &Model, dtype: KvDtype, ids: &[u32], next: &[u32]) -> Trace {
    let mut kc = cache(model, dtype);
    let s = kc.cells_mut().seq_new().unwrap();
    let prompt = prefill(model, &mut kc, s, ids, 0, 64);
    let decode = next
        .iter()
        .enumerate()
        .map(|(i, &t)| step(model, &mut kc, &[(s, t, ids.len() + i)]).remove(0))
        .collect();
    Trace { prompt, decode }
}

/// Asserts `got` and `want` are the same bits, naming the first difference.
fn same_bits(what: &str, got: &[Vec<f32>], want: &[Vec<f32>]) {
    assert_eq!(got.len(), want.len(), "{what}: row count");
    for (r, (g, w)) in got.iter().zip(want).enumerate() {
        let diff = g
            .iter()
            .zip(w)
            .enumerate()
            .filter(|(_, (a, b))| a.to_bits() != b.to_bits())
            .map(|(i, (a, b))| (i, (a - b).abs()))
            .fold(None, |m: Option<(usize, f32, usize)>, (i, d)| match m {
                Some((j, e, n)) if e >= d => Some((j, e, n + 1)),
                Some((_, _, n)) => Some((i, d, n + 1)),
                None => Some((i, d, 1)),
            });
        if let Some((i, d, n)) = diff {
            panic!(
                "{what}: row {r} differs in {n} logits, the most at {i} by {d:e} ({} vs {})",
                g[i], w[i]
            );
        }
    }
}

/// Chunked prefill of every chunk size, then a mixed step: the sequence's
/// prompt together with another sequence's tokens, and decode steps shared
/// with a fork and the other sequence.
fn batches(model: &Model, dtype: KvDtype, ids: &[u32], next: &[u32], want: &Trace) {
    for chunk in [1usize, 3, 7, 16] {
        let mut kc = cache(model, dtype);
        let s = kc.cells_mut().seq_new().unwrap();
        let got = prefill(model, &mut kc, s, ids, 0, chunk);
        same_bits(&format!("prefill in chunks of {chunk}"), &got, &want.prompt);
    }
    let other = prompt(model, 9, 200);
    let mut kc = cache(model, dtype);
    let o = kc.cells_mut().seq_new().unwrap();
    prefill(model, &mut kc, o, &other[..4], 0, 64);
    let s = kc.cells_mut().seq_new().unwrap();
    let mut e: Vec<_> = (4..other.len()).map(|i| (o, other[i], i)).collect();
    e.extend(ids.iter().enumerate().map(|(i, &t)| (s, t, i)));
    let got = step(model, &mut kc, &e).split_off(other.len() - 4);
    same_bits("prompt in a step with another sequence", &got, &want.prompt);
    let f = kc.cells_mut().seq_clone(s, None).unwrap();
    let mut decode = Vec::new();
    for (i, &t) in next.iter().enumerate() {
        let p = ids.len() + i;
        let e = [
            (f, next[next.len() - 1 - i], p),
            (s, t, p),
            (o, t, other.len() + i),
        ];
        decode.push(step(model, &mut kc, &e).remove(1));
    }
    same_bits(
        "decode in steps with a fork and another sequence",
        &decode,
        &want.decode,
    );
}

/// A storm before and during the sequence's life: sequences of several
/// lengths come and go, so its prompt lands in holes between other
/// sequences' cells and its decode tokens in cells below its prompt's.
fn storm(model: &Model, dtype: KvDtype, ids: &[u32], next: &[u32], want: &Trace) {
    let mut kc = cache(model, dtype);
    let text = prompt(model, 40, 300);
    let mut others = Vec::new();
    for (k, len) in [5usize, 11, 3, 8].into_iter().enumerate() {
        let o = kc.cells_mut().seq_new().unwrap();
        prefill(model, &mut kc, o, &text[k..k + len], 0, 4);
        others.push((o, len));
    }
    kc.cells_mut().seq_free(others[0].0).unwrap();
    kc.cells_mut().seq_free(others[2].0).unwrap();
    let s = kc.cells_mut().seq_new().unwrap();
    let mut got = Vec::new();
    // The prompt in chunks of 5, each step shared with a survivor's token.
    for (c, part) in ids.chunks(5).enumerate() {
        let (o, len) = others[1 + 2 * (c % 2)];
        let mut e = vec![(o, text[c], len)];
        e.extend(part.iter().enumerate().map(|(i, &t)| (s, t, c * 5 + i)));
        got.extend(step(model, &mut kc, &e).split_off(1));
        let r = &mut others[1 + 2 * (c % 2)];
        r.1 += 1;
    }
    same_bits("prompt amid a storm", &got, &want.prompt);
    // Free cells below the prompt's, then a fork of a survivor takes some.
    kc.cells_mut().seq_free(others[1].0).unwrap();
    let f = kc.cells_mut().seq_clone(others[3].0, Some(4)).unwrap();
    prefill(model, &mut kc, f, &text[20..22], 4, 64);
    let mut decode = Vec::new();
    for (i, &t) in next.iter().enumerate() {
        decode.push(step(model, &mut kc, &[(s, t, ids.len() + i)]).remove(0));
    }
    same_bits("decode after a storm", &decode, &want.decode);
    let cells = kc.cells().seq_cells(s, 0).unwrap();
    let in_order = cells.windows(2).all(|w| w[0].1 < w[1].1);
    assert!(
        !in_order,
        "the storm left the cells in position order: {cells:?}"
    );
}

fn invariance(path: std::path::PathBuf) {
    let model = Model::open(path).unwrap();
    let ids = prompt(&model, 23, 0);
    let next = prompt(&model, 3, 60);
    for dtype in [KvDtype::Float32, KvDtype::Q8_0] {
        let want = alone(&model, dtype, &ids, &next);
        batches(&model, dtype, &ids, &next, &want);
        storm(&model, dtype, &ids, &next, &want);
    }
}

#[test]
fn logits_are_batch_and_layout_invariant_smollm2() {
    invariance(common::smollm2_gguf());
}

#[test]
fn logits_are_batch_and_layout_invariant_gemma3() {
    invariance(common::gemma3_gguf());
}
