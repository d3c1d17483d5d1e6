"""How close the native engine's logits on GGUF files are to the float32 transformers model they
were made from, beside llama.cpp's on the same files: the yardstick of issue 38. Run by hand,
outside CI (it needs a llama.cpp build and llama-cpp-python).

The checkpoint's own tokenizer turns the GPL-3 text into ids; the first ``--positions`` (256) of
them go, as ids, to all three runners, so tokenizers play no part. Per file it prints top-1
agreement with the transformers model and mean KL(hf || x) over the positions, for the engine
(okv, float32 KV) and for llama.cpp (through llama-cpp-python, its default f16 KV unless
``--llama-kv f32``), side by side, as a Markdown table, and the mean of okv's KL minus
llama.cpp's position by position with twice its standard error (negative: okv is closer).

    python benches/family_kl.py HF_DIR a-f16.gguf a-q8_0.gguf
    # quantize an F16 file with llama-quantize first, then compare it and every output:
    python benches/family_kl.py HF_DIR --quantize a-f16.gguf --types Q4_K_M,Q2_K,IQ4_XS \\
        --out-dir /tmp/quants a-q8_0.gguf

llama.cpp is reached through a second Python that has llama-cpp-python (``--llama-python`` or
``$LLAMA_PYTHON``), which runs this file with ``--llama-worker``; the shared library it loads is
``$LLAMA_CPP_LIB_PATH`` (a directory holding ``libllama.so``) when set. The quantizer is
``--llama-quantize`` or ``$LLAMA_QUANTIZE``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

GPL3 = "/usr/share/common-licenses/GPL-3"


def llama_worker(gguf: str, ids_path: str, out_path: str, kv: str) -> None:
    """Runs inside the llama-cpp-python interpreter: writes llama.cpp's logits for the ids."""
    import numpy as np
    from llama_cpp import GGML_TYPE_F16, GGML_TYPE_F32, Llama

    ids = np.load(ids_path).tolist()
    kv_type = GGML_TYPE_F32 if kv == "f32" else GGML_TYPE_F16
    n_ctx = max(512, len(ids))
    llm = Llama(
        gguf, logits_all=True, n_ctx=n_ctx, n_batch=n_ctx, n_threads=2, verbose=False,
        type_k=kv_type, type_v=kv_type,
    )  # fmt: skip
    llm.eval(ids)
    np.save(out_path, np.asarray(llm.scores[: len(ids)], dtype=np.float32))


def llama_logits(python: str, gguf: Path, ids: list[int], kv: str):
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        ids_path, out_path = Path(tmp, "ids.npy"), Path(tmp, "logits.npy")
        np.save(ids_path, np.asarray(ids, dtype=np.int64))
        cmd = [python, __file__, "--llama-worker", str(gguf), str(ids_path), str(out_path), kv]
        if subprocess.run(cmd).returncode != 0:  # llama.cpp refuses the file: its error is shown
            return None
        return np.load(out_path)


def quantize(binary: str, f16: Path, types: list[str], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f16.stem.removesuffix("-f16").removesuffix("-F16")
    outs = []
    for t in types:
        out = out_dir / f"{stem}-{t.lower()}.gguf"
        run = subprocess.run([binary, str(f16), str(out), t, "2"], capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"llama-quantize {t} failed:\n{run.stderr[-2000:]}")
        outs.append(out)
    return outs


def describe(gguf: Path) -> tuple[str, str]:
    """The file type the header names, and how many tensors of each type it holds."""
    from gguf import GGUFReader, LlamaFileType

    r = GGUFReader(gguf)
    field = r.fields.get("general.file_type")
    ftype = "?"
    if field is not None:
        code = int(field.contents())
        try:
            ftype = LlamaFileType(code).name.removeprefix("MOSTLY_")
        except ValueError:
            ftype = str(code)
    counts = Counter(t.tensor_type.name for t in r.tensors)
    return ftype, " ".join(f"{k}:{v}" for k, v in counts.most_common())


def compare(want, have):
    """(top-1 agreement, KL(want || have) per position) of two [positions, vocab] logit arrays."""
    import numpy as np

    def log_softmax(x):
        x = np.asarray(x, dtype=np.float64)
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    p, q = log_softmax(want), log_softmax(have)
    return float((p.argmax(-1) == q.argmax(-1)).mean()), (np.exp(p) * (p - q)).sum(-1)


def paired_gap(okv_kl, ref_kl) -> str:
    """Mean of okv's KL minus llama.cpp's, position by position, with twice its standard error:
    both run the same positions, so the pairs cancel what the text itself makes hard. Positions
    are taken as independent, which they are not quite: the error is a scale, not a test."""
    d = okv_kl - ref_kl
    return f"{d.mean():+.6f} ± {2 * d.std(ddof=1) / len(d) ** 0.5:.6f}"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--llama-worker":
        llama_worker(*sys.argv[2:6])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("hf_dir", type=Path, help="transformers checkpoint (weights and tokenizer)")
    ap.add_argument("ggufs", type=Path, nargs="*", help="GGUF files made from it")
    ap.add_argument("--quantize", type=Path, help="an F16 GGUF to quantize with llama-quantize")
    ap.add_argument("--types", default="", help="comma-separated llama-quantize types")
    ap.add_argument("--out-dir", type=Path, help="where quantized files go (default: beside F16)")
    ap.add_argument("--llama-quantize", default=os.environ.get("LLAMA_QUANTIZE"))
    ap.add_argument("--llama-python", default=os.environ.get("LLAMA_PYTHON"))
    ap.add_argument("--llama-kv", choices=("f16", "f32"), default="f16")
    ap.add_argument("--positions", type=int, default=256)
    ap.add_argument("--text", default=GPL3)
    args = ap.parse_intermixed_args()
    if not args.llama_python:
        ap.error("--llama-python (or $LLAMA_PYTHON): a Python with llama-cpp-python")

    ggufs = list(args.ggufs)
    if args.quantize:
        ggufs.insert(0, args.quantize)
        types = [t for t in args.types.split(",") if t]
        if types and not args.llama_quantize:
            ap.error("--types needs --llama-quantize (or $LLAMA_QUANTIZE)")
        out_dir = args.out_dir or args.quantize.parent
        ggufs += quantize(args.llama_quantize, args.quantize, types, out_dir)
    if not ggufs:
        ap.error("no GGUF files given")

    import torch
    from offgraph_kv import EngineError
    from offgraph_kv.gguf_model import GgufModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    tokenizer = AutoTokenizer.from_pretrained(args.hf_dir)
    ids = tokenizer(Path(args.text).read_text(encoding="utf-8"))["input_ids"][: args.positions]
    model = AutoModelForCausalLM.from_pretrained(args.hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0].double().numpy()
    del model

    print(f"checkpoint {args.hf_dir.name}: {len(ids)} positions of {Path(args.text).name}; "
          f"okv KV float32, llama.cpp (llama-cpp-python) KV {args.llama_kv}")  # fmt: skip
    print()
    print("| file | type | tensor types | okv top-1 | okv KL | llama.cpp top-1 | llama.cpp KL "
          "| KL okv − llama.cpp (± 2 SE) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for gguf in ggufs:
        ftype, tensors = describe(gguf)
        ref_logits = llama_logits(args.llama_python, gguf, ids, args.llama_kv)
        ref = None if ref_logits is None else compare(want, ref_logits)
        ref_cells = "failed | -" if ref is None else f"{ref[0]:.4f} | {ref[1].mean():.6f}"
        try:
            okv = compare(want, GgufModel(str(gguf), threads=2).logits(ids))
            cells = f"{okv[0]:.4f} | {okv[1].mean():.6f}"
            gap = "-" if ref is None else paired_gap(okv[1], ref[1])
        except EngineError as e:  # the engine refuses the file: say why, keep going
            cells, gap = f"refused ({str(e)[:48]}) | -", "-"
        print(f"| {gguf.name} | {ftype} | {tensors} | {cells} | {ref_cells} | {gap} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
