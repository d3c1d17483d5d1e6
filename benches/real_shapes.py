"""Random-weight GGUF files of real model shapes, written with the `gguf` package (no weights are
shipped for these sizes, and speed does not depend on the weights' values).

Each file is written straight as Q8_0 (random int8 quants under one small f16 scale, norms F32
ones): every matrix Q8_0, the norms F32, which is the layout `llama-quantize ... Q8_0` gives, so
it serves as the Q8_0 file itself and as the source the other types are requantized from
(`--allow-requantize`). Written a tensor at a time: memory stays near the largest tensor (the 8B
shape's 0.56 GB output matrix), disk at the file's own size.

The tokenizer is a synthetic byte-level (`gpt2`) vocabulary of the model's vocab size: one control
token, the 256 byte symbols, then two- and three-symbol tokens, each with its merge. Both this
engine and llama.cpp load it; the benchmarks feed token ids, never text.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

QK8_0 = 32
Q8_0_BLOCK = 34  # f16 scale + 32 int8 quants
# Scale of every block: int8 quants (std ~74) times this give weights of std ~0.02.
SCALE = np.float16(0.02 / 74)


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    ff: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool  # the token embedding doubles as the output matrix
    pre: str  # tokenizer.ggml.pre
    rope_base: float

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


SHAPES = {
    "1.7b": Shape("SmolLM2-1.7B shape", 2048, 24, 8192, 32, 32, 49152, True, "smollm", 130000.0),
    "8b": Shape("Llama-3-8B shape", 4096, 32, 14336, 32, 8, 128256, False, "llama-bpe", 500000.0),
}


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def vocabulary(size: int) -> tuple[list[str], list[int], list[str]]:
    """Tokens, their types and merges of a byte-level vocabulary of exactly `size` tokens."""
    alpha = byte_alphabet()
    tokens = ["<|endoftext|>", *alpha]
    merges: list[str] = []
    pairs = [(a, b) for a in alpha for b in alpha]
    for a, b in pairs:
        if len(tokens) >= size:
            break
        tokens.append(a + b)
        merges.append(f"{a} {b}")
    for a, b in pairs:
        for c in alpha:
            if len(tokens) >= size:
                break
            tokens.append(a + b + c)
            merges.append(f"{a + b} {c}")
        if len(tokens) >= size:
            break
    if len(tokens) != size:
        raise ValueError(f"vocabulary: cannot build {size} tokens")
    types = [3] + [1] * (size - 1)  # control, then normal
    return tokens, types, merges


def matrices(s: Shape) -> list[tuple[str, int, int]]:
    """(name, rows, columns) of every matrix, in file order."""
    kv = s.kv_heads * s.head_dim
    out = [("token_embd.weight", s.vocab, s.hidden)]
    for i in range(s.layers):
        b = f"blk.{i}."
        out += [
            (b + "attn_q.weight", s.hidden, s.hidden),
            (b + "attn_k.weight", kv, s.hidden),
            (b + "attn_v.weight", kv, s.hidden),
            (b + "attn_output.weight", s.hidden, s.hidden),
            (b + "ffn_gate.weight", s.ff, s.hidden),
            (b + "ffn_up.weight", s.ff, s.hidden),
            (b + "ffn_down.weight", s.hidden, s.ff),
        ]
    if not s.tied:
        out.append(("output.weight", s.vocab, s.hidden))
    return out


def norms(s: Shape) -> list[str]:
    return [f"blk.{i}.{n}_norm.weight" for i in range(s.layers) for n in ("attn", "ffn")] + [
        "output_norm.weight"
    ]


def q8_0_rows(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """`rows` rows of random Q8_0 blocks, as bytes."""
    width = cols // QK8_0 * Q8_0_BLOCK
    buf = np.frombuffer(bytearray(rng.bytes(rows * width)), dtype=np.uint8)
    blocks = buf.reshape(-1, Q8_0_BLOCK)
    blocks[:, :2] = np.frombuffer(SCALE.tobytes(), dtype=np.uint8)
    return buf.reshape(rows, width)


def write_q8_0(s: Shape, path: Path, seed: int = 0) -> None:
    """Writes `s` as a Q8_0 GGUF at `path`, through a temporary name (a cut-off write leaves
    nothing under `path`)."""
    tmp = path.with_suffix(".part")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name(s.name)
    w.add_context_length(8192)
    w.add_embedding_length(s.hidden)
    w.add_block_count(s.layers)
    w.add_feed_forward_length(s.ff)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(s.rope_base)
    w.add_rope_dimension_count(s.head_dim)
    w.add_vocab_size(s.vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    tokens, types, merges = vocabulary(s.vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(s.pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_add_bos_token(False)
    mats = matrices(s)
    q8 = gguf.GGMLQuantizationType.Q8_0
    for name, rows, cols in mats:
        width = cols // QK8_0 * Q8_0_BLOCK
        w.add_tensor_info(name, (rows, width), np.uint8, rows * width, q8)
    for name in norms(s):
        w.add_tensor_info(name, (s.hidden,), np.float32, s.hidden * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for _, rows, cols in mats:
        w.write_tensor_data(q8_0_rows(rng, rows, cols))
    for _ in norms(s):
        w.write_tensor_data(np.ones(s.hidden, dtype=np.float32))
    w.close()
    os.replace(tmp, path)


# Byte width of each fixed-size GGUF metadata value type (8: string and 9: array vary).
_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def tensor_bytes(path: Path) -> dict[str, int]:
    """Each tensor's bytes in a GGUF file, from its header alone (gguf-py's reader parses every
    vocabulary entry into arrays: seconds on a 128k vocabulary)."""
    import struct

    with open(path, "rb") as f:
        magic, _version, n_tensors, n_kv = struct.unpack("<IIQQ", f.read(24))
        if magic != gguf.GGUF_MAGIC:
            raise ValueError(f"{path}: not a GGUF file")

        def u(fmt: str) -> int:
            return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]

        def skip(kind: int) -> None:
            if kind in _SCALAR:
                f.seek(_SCALAR[kind], 1)
            elif kind == 8:
                f.seek(u("Q"), 1)
            elif kind == 9:
                sub, n = u("I"), u("Q")
                if sub in _SCALAR:
                    f.seek(_SCALAR[sub] * n, 1)
                else:
                    for _ in range(n):
                        skip(sub)
            else:
                raise ValueError(f"{path}: unknown metadata type {kind}")

        for _ in range(n_kv):
            f.seek(u("Q"), 1)
            skip(u("I"))
        out = {}
        for _ in range(n_tensors):
            name = f.read(u("Q")).decode()
            dims = [u("Q") for _ in range(u("I"))]
            kind = u("I")
            f.seek(8, 1)
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)]
            out[name] = int(np.prod(dims)) // block * size
        return out


def bytes_per_token(path: Path) -> int:
    """Weight bytes one decoded token reads: every tensor but the token embedding (of which it
    reads one row), unless the embedding is tied as the output matrix (no `output.weight`)."""
    t = tensor_bytes(path)
    tied = "output.weight" not in t
    return sum(n for name, n in t.items() if tied or name != "token_embd.weight")
