"""A Gemma-style SentencePiece tokenizer made offline for the fixture text (BPE, byte fallback, no
dummy prefix, Gemma's special ids 0-4) whose pieces are SmolLM2's tokens for that text, its
transformers tokenizer, and an embedding of SmolLM2's rows for those pieces: the Gemma 2 variant
then reads the text much as SmolLM2 does and still predicts it."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import torch

# Gemma's ids: <pad> 0, <eos> 1, <bos> 2, <unk> 3, <mask> 4; the turn markers follow.
SPECIALS = ["<mask>", "<start_of_turn>", "<end_of_turn>"]
_SPACE = "\u2581"
_BYTE, _NORMAL = 6, 1  # SentencePiece piece types


def _template(text: str) -> bytes:
    """A SentencePiece BPE model trained on ``text`` with Gemma's settings and special ids."""
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text.splitlines()), model_writer=buf, model_type="bpe",
        vocab_size=400, pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>",
        eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>", user_defined_symbols=SPECIALS,
        byte_fallback=True, add_dummy_prefix=False, remove_extra_whitespaces=False,
        normalization_rule_name="identity", split_digits=True, allow_whitespace_only_pieces=True,
        character_coverage=1.0, num_threads=1, minloglevel=2,
    )  # fmt: skip
    return buf.getvalue()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _fields(proto: bytes):
    """The top-level (field number, raw bytes) of a serialized protobuf message."""
    at = 0
    while at < len(proto):
        start, key, shift = at, 0, 0
        while True:
            byte = proto[at]
            at += 1
            key |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        wire = key & 7
        if wire == 0:
            while proto[at] & 0x80:
                at += 1
            at += 1
        elif wire == 2:
            size, shift = 0, 0
            while True:
                byte = proto[at]
                at += 1
                size |= (byte & 0x7F) << shift
                shift += 7
                if byte < 0x80:
                    break
            at += size
        else:
            at += 4 if wire == 5 else 8
        yield key >> 3, proto[start:at]


def _piece(text: str, score: float, kind: int) -> bytes:
    raw = text.encode("utf-8")
    body = b"\x0a" + _varint(len(raw)) + raw + b"\x15" + struct.pack("<f", score)
    body += b"\x18" + _varint(kind)
    return b"\x0a" + _varint(len(body)) + body


def build(text: str, smol_tokenizer) -> bytes:
    """The serialized SentencePiece model: the trained template's specials and byte pieces, then
    every SmolLM2 token the text uses (with the pieces they merge from), spelled as SentencePiece
    spells them and scored in SmolLM2's merge order, so both split the text alike."""
    sp_template = _template(text)
    vocab = smol_tokenizer.get_vocab()
    merges = json.loads(smol_tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    parts = {"".join(m): m for m in merges}
    keep: set[str] = set()
    todo = [t for t in smol_tokenizer.convert_ids_to_tokens(smol_tokenizer(text)["input_ids"])]
    while todo:
        token = todo.pop()
        if token not in keep and token in vocab:
            keep.add(token)
            todo.extend(parts.get(token, ()))
    unbyte = {c: b for b, c in _byte_level().items()}
    pieces = {}
    for token in sorted(keep, key=vocab.__getitem__):
        try:
            spelled = bytes(unbyte[c] for c in token).decode("utf-8")
        except (KeyError, UnicodeDecodeError):
            continue  # a special token or part of a character: bytes cover it
        pieces.setdefault(spelled.replace(" ", _SPACE), -float(vocab[token]))
    out, specials = bytearray(), []
    for number, raw in _fields(sp_template):
        if number != 1:
            out += raw
            continue
        specials.append(raw)
    # The template's first pieces are the specials and the 256 bytes, in Gemma's order.
    head = specials[: 4 + len(SPECIALS) + 256]
    normal = [_piece(p, score, _NORMAL) for p, score in pieces.items()]
    return b"".join(head) + b"".join(normal) + bytes(out)


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
    of the first SmolLM2 token of it. Bytes take their byte token's row, halved where a piece
    has it too (SentencePiece never emits that byte; equal rows would tie in the logits);
    specials take distinct SmolLM2 specials (<end_of_turn> a scaled copy of <eos>'s row)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=model)
    smol = smol_tokenizer.get_vocab()
    table = _byte_level()
    specials = {
        "<pad>": (smol["<repo_name>"], 1.0), "<unk>": (smol["<reponame>"], 1.0),
        "<mask>": (smol["<file_sep>"], 1.0), "<bos>": (smol["<|endoftext|>"], 1.0),
        "<eos>": (smol["<|im_end|>"], 1.0), "<start_of_turn>": (smol["<|im_start|>"], 1.0),
        "<end_of_turn>": (smol["<|im_end|>"], 0.9),
    }  # fmt: skip
    rows: list[tuple[int, float]] = []
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
            rows.append((smol[spelled], 1.0))
        else:
            ids = smol_tokenizer(raw.decode("utf-8", "replace"))["input_ids"]
            rows.append((ids[0] if ids else smol["<|endoftext|>"], 1.0))
    normal = {row for i, (row, _) in enumerate(rows) if not sp.is_byte(i)}
    rows = [(row, 0.5 if sp.is_byte(i) and row in normal else scale)
            for i, (row, scale) in enumerate(rows)]  # fmt: skip
    index = torch.tensor([row for row, _ in rows])
    scales = torch.tensor([scale for _, scale in rows]).unsqueeze(1)
    return smol_embed[index] * scales


def save(out: Path, model: bytes, tokenizer) -> None:
    """The SentencePiece model where the converter reads it, and the special pieces listed in
    tokenizer_config.json as Gemma's own checkpoints list them (the converter types them from
    there; transformers 5 no longer writes the list)."""
    (out / "tokenizer.model").write_bytes(model)
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["added_tokens_decoder"] = {
        str(i): {"content": t.content, "special": True, "lstrip": False, "rstrip": False,
                 "normalized": False, "single_word": False}
        for i, t in tokenizer.added_tokens_decoder.items()
    }  # fmt: skip
    path.write_text(json.dumps(config))
