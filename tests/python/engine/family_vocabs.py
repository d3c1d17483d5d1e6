"""Metadata-only GGUF files carrying the families' tokenizers, and the Hugging Face tokenizers they
must match, all built offline: byte-level ones from SmolLM2's vocabulary and merges under each
family's split pattern, SentencePiece ones from a model trained here on the GPL's text."""

import io

import gguf
import numpy as np
import sentencepiece as spm
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer
from transformers.integrations.gguf.reader import read_gguf_metadata
from transformers.tokenization_utils_base import generate_merges

GPL3 = "/usr/share/common-licenses/GPL-3"

# The split patterns as the models' own tokenizer.json files spell them.
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTION}"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTION}"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# `tokenizer.ggml.pre` -> the pattern (None: the GPT-2 split the byte-level tokenizer has built in).
SPLITS = {
    "smollm": None,
    "llama-bpe": _LLAMA3,
    "llama3": _LLAMA3,
    "qwen2": _QWEN2,
    "deepseek-r1-qwen": _QWEN2,
    "qwen35": _QWEN35,
    "gpt-4o": _GPT4O,
    "tekken": _TEKKEN,
}

EDGES = [
    "",
    " ",
    "  leading and trailing  ",
    "trailing spaces   \nand tabs\t\t\n\t",
    "many     spaces\tand\ttabs  \t x",
    "\n\n\nnewlines\r\nand CRLF\r\n\r\n\r\nruns\n\n\n\n",
    " \n \r\n\t\n  \n",
    "digits 1 12 123 1234 12345 123456 1234567 and 3.14159, 10,000.5 x2y34z",
    "don't I'M we'll they've she's DON'T WE'LL THEY'VE SHE'S You'Re i'D",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D ' s '\u017f",
    "punctuation!!! ??? ... --- ;;; (((nested))) a/b//c\n//\n",
    "!!\n\n?!\r\n.\n x",
    "café naïve résumé e\u0301 combining a\u0301\u0302b \u0301x (x\u0301)",
    "HelloWorld HELLOworld helloWORLD ǅa ʰʰA ΣΊΣΥΦΟΣ σίσυφος",
    "日本語のテキストと中文文本",
    "한국어 텍스트 и русский текст, ελληνικά",
    "emoji 😀 👩‍👩‍👧‍👦 🇫🇷 ✨",
    "مرحبا بالعالم",
    "rare \U0001f9ec\U0001fab8 and \u2028 separators \u00a0nbsp\u3000ideo",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<s>hello</s> <s> x</s>",
    "x" * 300,
    "𝟘𝟙𝟚 ٣٤٥ ½ Ⅻ",
]


def corpus() -> list[str]:
    with open(GPL3, encoding="utf-8") as f:
        text = f.read()
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    return [text, *paragraphs[:60], *EDGES]


def write_metadata_only(path: str, fill) -> str:
    """A GGUF with only metadata: `fill(writer)` adds the tokenizer keys."""
    w = gguf.GGUFWriter(path, arch="llama")
    fill(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def smollm2_vocab(gguf_path: str, size: int = 16384) -> dict:
    """SmolLM2's tokenizer keys as the reference's GGUF reader returns them, cut to the first
    `size` tokens and the merges among them (its tokens come in merge order, so the cut is a
    smaller vocabulary of the same kind, quicker to write)."""
    keys = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type")
    meta, _ = read_gguf_metadata(gguf_path, keys)
    tokens = list(meta["tokenizer.ggml.tokens"])[:size]
    kept = set(tokens)
    merges = [
        m
        for m in meta["tokenizer.ggml.merges"]
        if m.replace(" ", "") in kept and all(p in kept for p in m.split(" "))
    ]
    return {
        "tokens": tokens,
        "merges": merges,
        "token_type": [int(t) for t in meta["tokenizer.ggml.token_type"]][:size],
        "bos_token_id": int(meta["tokenizer.ggml.bos_token_id"]),
        "eos_token_id": int(meta["tokenizer.ggml.eos_token_id"]),
    }


# Characters at the boundaries the patterns disagree on: digits, the space, newline, CR and tab,
# the apostrophe, the slash, punctuation, letters of contractions and of either case, a mark.
_BOUNDARY = "0123456789 \n\r\t'/!?.stdmlrevnoSTDMLREVNOHWax\u0301"


def with_boundary_merges(vocab: dict) -> dict:
    """The vocabulary with merges, ranked first, of every pair of boundary characters, so that a
    piece boundary drawn differently changes the ids."""
    alphabet = bytes_to_unicode()
    spell = ["".join(alphabet[b] for b in c.encode()) for c in _BOUNDARY]
    tokens = list(vocab["tokens"])
    known, first = set(tokens), []

    def merge(a: str, b: str) -> None:
        if a + b not in known:
            tokens.append(a + b)
            known.add(a + b)
        if f"{a} {b}" not in first:
            first.append(f"{a} {b}")

    for c in spell:  # a multi-byte character's own token, from its bytes
        for i in range(1, len(c)):
            merge(c[:i], c[i])
    for a in spell:
        for b in spell:
            merge(a, b)
    listed = set(first)
    merges = first + [m for m in vocab["merges"] if m not in listed]
    types = vocab["token_type"] + [1] * (len(tokens) - len(vocab["tokens"]))
    return {**vocab, "tokens": tokens, "merges": merges, "token_type": types}


def write_byte_level(path: str, vocab: dict, pre: str) -> str:
    def fill(w: gguf.GGUFWriter) -> None:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(vocab["tokens"])
        w.add_token_types(vocab["token_type"])
        w.add_token_merges(vocab["merges"])
        w.add_bos_token_id(vocab["bos_token_id"])
        w.add_eos_token_id(vocab["eos_token_id"])
        w.add_add_bos_token(False)

    return write_metadata_only(path, fill)


class ByteLevelReference:
    """The reference byte-level tokenizer of one vocabulary, built once; `under(pre)` sets its
    pre-tokenizer as the models' tokenizer.json files set it for that name's pattern."""

    def __init__(self, vocab: dict) -> None:
        self.backend, _ = convert_gguf_tokenizer("llama", {"tokenizer_type": "gpt2", **vocab})
        self.gpt2 = self.backend.pre_tokenizer

    def under(self, pre: str) -> Tokenizer:
        pattern = SPLITS[pre]
        self.backend.pre_tokenizer = (
            self.gpt2
            if pattern is None
            else pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
        )
        return self.backend


def train_sentencepiece(dummy_prefix: bool) -> spm.SentencePieceProcessor:
    """A Llama-style SentencePiece BPE model trained on the GPL's text: byte fallback, digits
    split, whitespace kept as is, no normalization."""
    with open(GPL3, encoding="utf-8") as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=2500,
        model_type="bpe",
        byte_fallback=True,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        remove_extra_whitespaces=False,
        add_dummy_prefix=dummy_prefix,
        normalization_rule_name="identity",
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def sentencepiece_vocab(sp: spm.SentencePieceProcessor) -> dict:
    """The tokenizer keys llama.cpp's converter writes for a SentencePiece model."""
    n = sp.get_piece_size()

    def kind(i: int) -> int:
        for test, t in (
            (sp.is_unknown, gguf.TokenType.UNKNOWN),
            (sp.is_control, gguf.TokenType.CONTROL),
            (sp.is_byte, gguf.TokenType.BYTE),
            (sp.is_unused, gguf.TokenType.UNUSED),
        ):
            if test(i):
                return int(t)
        return int(gguf.TokenType.NORMAL)

    return {
        "tokens": [sp.id_to_piece(i) for i in range(n)],
        "scores": [float(np.float32(sp.get_score(i))) for i in range(n)],
        "token_type": [kind(i) for i in range(n)],
        "bos_token_id": sp.bos_id(),
        "eos_token_id": sp.eos_id(),
        "unk_token_id": sp.unk_id(),
    }


def write_sentencepiece(path: str, vocab: dict, space_prefix: bool) -> str:
    def fill(w: gguf.GGUFWriter) -> None:
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(vocab["tokens"])
        w.add_token_scores(vocab["scores"])
        w.add_token_types(vocab["token_type"])
        w.add_bos_token_id(vocab["bos_token_id"])
        w.add_eos_token_id(vocab["eos_token_id"])
        w.add_unk_token_id(vocab["unk_token_id"])
        w.add_add_bos_token(True)
        w.add_add_space_prefix(space_prefix)

    return write_metadata_only(path, fill)


def sentencepiece_reference(vocab: dict, dummy_prefix: bool) -> Tokenizer:
    """The SentencePiece model as Llama 2's tokenizer.json has it: BPE with byte fallback over
    the vocabulary in merge order, spaces as `▁` (and one in front when the model adds a dummy
    prefix) by the normalizer, no pre-tokenizer, the control tokens added, and a decoder that
    takes the dummy prefix off again."""
    ids = {t: i for i, t in enumerate(vocab["tokens"])}
    bpe = models.BPE(
        vocab=ids,
        merges=generate_merges(ids),
        unk_token=vocab["tokens"][vocab["unk_token_id"]],
        fuse_unk=True,
        byte_fallback=True,
    )
    tok = Tokenizer(bpe)
    spaces = [normalizers.Replace(" ", "\u2581")]
    if dummy_prefix:
        spaces.insert(0, normalizers.Prepend("\u2581"))
    tok.normalizer = normalizers.Sequence(spaces)
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if dummy_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(steps)
    specials = [vocab["unk_token_id"], vocab["bos_token_id"], vocab["eos_token_id"]]
    tok.add_special_tokens([AddedToken(vocab["tokens"][i], special=True) for i in specials])
    return tok


def gguf_sentencepiece_reference(vocab: dict) -> Tokenizer:
    """What transformers builds from such a file for Phi-3 (a normalizer's dummy prefix, merges
    ordered by score)."""
    backend, _ = convert_gguf_tokenizer("phi3", {"tokenizer_type": "llama", **vocab})
    return backend
