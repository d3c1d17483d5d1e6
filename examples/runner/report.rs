//! What the runner prints: the demo's table, and the `--dump` JSON.

use std::fmt::Write as _;

use crate::args::Args;
use crate::decode::Outcome;
use crate::model::fork_token;

pub(crate) fn per_s(n: usize, s: f64) -> f64 {
    if s > 0.0 {
        n as f64 / s
    } else {
        f64::INFINITY
    }
}

/// `f"{v:,.0f}"`.
pub(crate) fn thousands(v: f64) -> String {
    if !v.is_finite() {
        return "inf".into();
    }
    let digits = format!("{:.0}", v);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub(crate) fn table(a: &Args, o: &Outcome) -> String {
    let mib = 1.0 / f64::from(1u32 << 20);
    let rows = [
        (
            "sequences x decode tokens",
            format!("{} x {} (shared prefix {})", a.seqs, a.decode, a.prefix),
        ),
        (
            "prefill",
            format!("{} tokens/s", thousands(per_s(a.prefix, o.prefill_s))),
        ),
        (
            "decode",
            format!(
                "{} tokens/s",
                thousands(per_s(a.seqs * a.decode, o.decode_s))
            ),
        ),
        (
            "KV bytes held (pools)",
            format!("{:.2} MiB", o.kv_bytes as f64 * mib),
        ),
        (
            "KV bytes in live cells",
            format!("{:.2} MiB", o.live_bytes as f64 * mib),
        ),
        (
            "N unshared copies would need",
            format!("{:.2} MiB", o.unshared_bytes as f64 * mib),
        ),
        (
            "pools / unshared",
            format!("{:.2}x", o.kv_bytes as f64 / o.unshared_bytes as f64),
        ),
        ("cells shared by forks", o.shared_cells.to_string()),
        (
            "peak pool slots (flat / ring)",
            format!("{} / {}", o.peak_flat, o.peak_ring),
        ),
    ];
    let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut s = format!("| {:<w$} | {:<36} |\n", "metric", "value");
    let _ = writeln!(s, "|{}|{}|", "-".repeat(w + 2), "-".repeat(38));
    for (k, v) in &rows {
        let _ = writeln!(s, "| {k:<w$} | {v:<36} |");
    }
    s
}

pub(crate) fn json_f32(v: f32) -> String {
    if v.is_finite() {
        format!("{v:e}")
    } else {
        "null".into()
    }
}

pub(crate) fn dump_json(a: &Args, o: &Outcome) -> String {
    let list =
        |xs: &mut dyn Iterator<Item = String>| format!("[{}]", xs.collect::<Vec<_>>().join(", "));
    let generated = list(
        &mut o
            .generated
            .iter()
            .map(|g| list(&mut g.iter().map(usize::to_string))),
    );
    let hidden = list(
        &mut o
            .hidden
            .chunks_exact(a.hidden)
            .map(|row| list(&mut row.iter().map(|&v| json_f32(v)))),
    );
    let fork = list(&mut (0..a.seqs).map(|i| fork_token(a, i).to_string()));
    format!(
        concat!(
            "{{\"config\": {{\"n_layers\": {}, \"window\": {}, \"hidden\": {}, \"n_q_heads\": {}, ",
            "\"n_kv_heads\": {}, \"head_dim\": {}, \"vocab\": {}, \"seed\": {}}},\n",
            "\"n_seqs\": {}, \"prefix\": {}, \"decode\": {}, \"chunk\": {},\n",
            "\"prefill_tokens_per_s\": {}, \"decode_tokens_per_s\": {},\n",
            "\"kv_bytes\": {}, \"kv_live_bytes\": {}, \"unshared_bytes\": {}, \"shared_cells\": {},\n",
            "\"peak_slots_flat\": {}, \"peak_slots_ring\": {},\n",
            "\"fork_tokens\": {},\n\"generated\": {},\n\"hidden\": {}}}\n"
        ),
        a.layers,
        a.window,
        a.hidden,
        a.q_heads,
        a.kv_heads,
        a.head_dim,
        a.vocab,
        a.seed,
        a.seqs,
        a.prefix,
        a.decode,
        a.chunk,
        json_num(per_s(a.prefix, o.prefill_s)),
        json_num(per_s(a.seqs * a.decode, o.decode_s)),
        o.kv_bytes,
        o.live_bytes,
        o.unshared_bytes,
        o.shared_cells,
        o.peak_flat,
        o.peak_ring,
        fork,
        generated,
        hidden,
    )
}

pub(crate) fn json_num(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.1}")
    } else {
        "null".into()
    }
}
