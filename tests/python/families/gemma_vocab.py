"""A Gemma-style SentencePiece tokenizer trained offline on the fixture text (BPE, byte fallback, no
dummy prefix, Gemma's special ids 0-4), its transformers tokenizer, and an embedding for it taken
from SmolLM2's rows for the same strings, so the Gemma 2 variant still predicts real text."""

from __future__ import annotations

import io
from pathlib import Path

import torch

VOCAB = 4000
# Gemma's ids: <pad> 0, <eos> 1, <bos> 2, <unk> 3, <mask> 4; the turn markers follow.
SPECIALS = ["<mask>", "<start_of_turn>", "<end_of_turn>"]
_SPACE = "\u2581"


def train(text: str) -> bytes:
    """The serialized SentencePiece model, deterministic for a given text."""
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text.splitlines()), model_writer=buf, model_type="bpe",
        vocab_size=VOCAB, pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>",
        eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>", user_defined_symbols=SPECIALS,
        byte_fallback=True, add_dummy_prefix=False, remove_extra_whitespaces=False,
        normalization_rule_name="identity", split_digits=True, allow_whitespace_only_pieces=True,
        character_coverage=1.0, num_threads=1, minloglevel=2,
    )  # fmt: skip
    return buf.getvalue()


def tokenizer(model: bytes):
    """The transformers GemmaTokenizer equivalent to the SentencePiece ``model``: its vocabulary,
    and BPE merges ranked by the merged piece's id (SentencePiece merges highest score first)."""
    import sentencepiece as spm
    from transformers import GemmaTokenizer

    sp = spm.SentencePieceProcessor(model_proto=model)
    vocab = {sp.id_to_piece(i): i for i in range(sp.vocab_size())}
    ranked = []
    for piece, i in vocab.items():
        if sp.is_control(i) or sp.is_byte(i) or sp.is_unknown(i) or piece in SPECIALS:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((i, vocab[left], vocab[right], left, right))
    merges = [(left, right) for *_, left, right in sorted(ranked)]
    return GemmaTokenizer(
        vocab=vocab, merges=merges, add_bos_token=True, mask_token="<mask>",
        additional_special_tokens=SPECIALS[1:],
    )  # fmt: skip


def _byte_level() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (SmolLM2's vocabulary is written with them)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def embedding(model: bytes, smol_tokenizer, smol_embed: torch.Tensor) -> torch.Tensor:
    """One SmolLM2 row per piece: the row of the same string (spaces as SmolLM2 writes them), else
    of the first SmolLM2 token of it; bytes take their byte token; specials SmolLM2's own."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=model)
    smol = smol_tokenizer.get_vocab()
    table = _byte_level()
    specials = {
        "<pad>": 0, "<unk>": 0, "<mask>": 0,
        "<bos>": smol_tokenizer.bos_token_id or 1, "<eos>": smol_tokenizer.eos_token_id or 2,
        "<start_of_turn>": smol["<|im_start|>"], "<end_of_turn>": smol["<|im_end|>"],
    }  # fmt: skip
    rows = []
    for i in range(sp.vocab_size()):
        piece = sp.id_to_piece(i)
        if piece in specials:
            rows.append(specials[piece])
            continue
        if sp.is_byte(i):
            raw = bytes([int(piece[3:5], 16)])
        else:
            raw = piece.replace(_SPACE, " ").encode("utf-8")
        spelled = "".join(table[b] for b in raw)
        if spelled in smol:
            rows.append(smol[spelled])
        else:
            ids = smol_tokenizer(raw.decode("utf-8", "replace"))["input_ids"]
            rows.append(ids[0] if ids else 0)
    return smol_embed[torch.tensor(rows)].clone()


def save(out: Path, model: bytes) -> None:
    """The SentencePiece model where the converter reads it."""
    (out / "tokenizer.model").write_bytes(model)
