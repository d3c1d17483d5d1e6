"""What binds prefix-store keys to a model: a digest of its weights and of its tokenizer.

Two checkpoints of one architecture (a base model and its instruction-tuned sibling, two
fine-tunes) have equal layer layouts, so the layout alone cannot keep their rows apart. The
weights digest hashes, for every parameter tensor in ``named_parameters()`` order, its name,
shape and dtype and a strided sample of its bytes (``samples`` elements spread evenly over the
tensor, plus its last element). Any whole-tensor change (another checkpoint, another dtype, a
fine-tune, a re-quantization) changes the digest; the sample reads a few KiB per tensor, so an
8B model's digest costs milliseconds (``benches/bench_store_digest.py`` measures it).

A native engine model (:class:`~offgraph_kv.gguf_model.GgufModel`) is identified by its file's
digest (:func:`~.gguf_digest.gguf_digest`: the header, and a strided sample of every tensor's
bytes read from the file), which it computes once.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

__all__ = ["identity", "tokenizer_digest", "weights_digest"]

SAMPLES = 1024
"""Elements sampled per tensor."""


def _sample_bytes(t: Any, samples: int) -> bytes:
    import torch

    flat = t.detach().reshape(-1)
    n = int(flat.numel())
    if n == 0 or flat.device.type == "meta":
        return b""
    step = max(1, n // samples)
    picked = torch.cat([flat[::step][:samples], flat[-1:]]).contiguous().cpu()
    return picked.view(torch.uint8).numpy().tobytes()


def weights_digest(model: Any, samples: int = SAMPLES) -> bytes:
    """SHA-256 over every parameter's name, shape, dtype and a strided sample of its bytes."""
    h = hashlib.sha256(b"offgraph-kv weights v1\0")
    h.update(type(model).__name__.encode() + b"\0")
    for name, p in model.named_parameters():
        h.update(name.encode() + b"\0" + str(p.dtype).encode() + b"\0")
        h.update(struct.pack(f"<{p.dim() + 1}q", p.dim(), *p.shape))
        h.update(_sample_bytes(p, samples))
    return h.digest()


def tokenizer_digest(tokenizer: Any) -> bytes:
    """SHA-256 over a tokenizer's vocabulary (token -> id) and its special tokens."""
    h = hashlib.sha256(b"offgraph-kv tokenizer v1\0")
    vocab = tokenizer.get_vocab()
    for tok, i in sorted(vocab.items(), key=lambda x: x[1]):
        h.update(struct.pack("<q", int(i)) + str(tok).encode("utf-8", "surrogatepass") + b"\0")
    special = getattr(tokenizer, "all_special_tokens", None) or []
    h.update("\0".join(sorted(str(s) for s in special)).encode("utf-8", "surrogatepass"))
    return h.digest()


def identity(model: Any, tokenizer: Any = None) -> bytes:
    """The bytes a store's keys bind: the weights digest of a torch model or of a GgufModel's
    file (or the UTF-8 of a string / the bytes given, a name the caller vouches for), then the
    tokenizer's digest."""
    if isinstance(model, str):
        if not model:
            raise ValueError("model: an empty name identifies nothing")
        head = b"name\0" + model.encode()
    elif isinstance(model, (bytes, bytearray)):
        if not model:
            raise ValueError("model: an empty identity identifies nothing")
        head = b"bytes\0" + bytes(model)
    elif hasattr(model, "named_parameters"):
        head = b"weights\0" + weights_digest(model)
    elif callable(getattr(model, "weights_digest", None)):  # the native engine's GgufModel
        head = b"gguf\0" + bytes(model.weights_digest())
    else:
        raise TypeError(
            "model: expected a torch model, a GgufModel, a str or bytes identity, got "
            f"{type(model).__name__}"
        )
    tail = b"" if tokenizer is None else b"\0tokenizer\0" + tokenizer_digest(tokenizer)
    return hashlib.sha256(head + tail).digest()
