"""The GGUF tokenizer of each family's vocabulary kind against the Hugging Face implementations,
offline: SmolLM2's byte-level vocabulary under every split pattern `tokenizer.ggml.pre` names, and
a Llama-style SentencePiece model trained here, with and without its dummy prefix."""

import os

import pytest
from offgraph_kv import EngineError
from offgraph_kv._native import GgufTokenizerCore

from . import family_vocabs as fv


@pytest.fixture(scope="session")
def byte_level(smollm2_gguf_path, tmp_path_factory):
    """`({pre: engine tokenizer}, reference)` over one vocabulary, written once per name."""
    vocab = fv.with_boundary_merges(fv.smollm2_vocab(smollm2_gguf_path))
    where = tmp_path_factory.mktemp("byte_level")
    engines = {
        pre: GgufTokenizerCore.open(fv.write_byte_level(str(where / f"{pre}.gguf"), vocab, pre))
        for pre in fv.SPLITS
    }
    return engines, fv.ByteLevelReference(vocab)


@pytest.fixture(scope="session")
def sentencepiece(tmp_path_factory):
    """`{dummy_prefix: (engine tokenizer, sentencepiece model, vocabulary)}`."""
    where = tmp_path_factory.mktemp("sentencepiece")
    out = {}
    for prefix in (True, False):
        sp = fv.train_sentencepiece(prefix)
        vocab = fv.sentencepiece_vocab(sp)
        path = fv.write_sentencepiece(str(where / f"prefix_{prefix}.gguf"), vocab, prefix)
        out[prefix] = (GgufTokenizerCore.open(path), sp, vocab)
    return out


def _differences(engine, reference, texts, special):
    bad = []
    for text in texts:
        want = reference(text)
        got = engine.encode(text, add_special_tokens=special)
        if got != want:
            bad.append((text[:50], got[:16], want[:16]))
    return bad


@pytest.mark.parametrize("pre", list(fv.SPLITS))
def test_byte_level_split_equals_hugging_face(byte_level, pre):
    engines, reference = byte_level
    engine, ref = engines[pre], reference.under(pre)
    texts = fv.corpus()
    bad = _differences(engine, lambda t: ref.encode(t, add_special_tokens=False).ids, texts, False)
    assert not bad, f"{pre}: {len(bad)} of {len(texts)} differ, first: {bad[:3]}"
    for text in fv.EDGES:
        ids = ref.encode(text, add_special_tokens=False).ids
        assert engine.decode(ids) == ref.decode(ids, skip_special_tokens=False), (pre, text)


def test_byte_level_patterns_differ_where_expected(byte_level):
    """The boundary merges make the splits visible in the ids: each pattern family encodes the
    edge cases differently from the others, and aliases of one pattern identically."""
    text = "".join(fv.EDGES)
    ids = {
        pre: engine.encode(text, add_special_tokens=False) for pre, engine in byte_level[0].items()
    }
    assert ids["llama-bpe"] == ids["llama3"]
    assert ids["qwen2"] == ids["deepseek-r1-qwen"]
    families = ["smollm", "llama-bpe", "qwen2", "qwen35", "gpt-4o", "tekken"]
    assert len({tuple(ids[f]) for f in families}) == len(families)


@pytest.mark.parametrize("prefix", [True, False], ids=["dummy_prefix", "no_prefix"])
def test_sentencepiece_equals_sentencepiece_and_hugging_face(sentencepiece, prefix):
    engine, sp, vocab = sentencepiece[prefix]
    texts = fv.corpus()
    plain = [t for t in texts if "<s>" not in t and "</s>" not in t]
    # SentencePiece itself: the ground truth for text without control tokens in it.
    bad = _differences(engine, sp.encode, plain, False)
    assert not bad, f"sentencepiece: {len(bad)} of {len(plain)} differ, first: {bad[:3]}"
    # Llama 2's tokenizer.json layout, and BOS: control tokens written in the text stay whole,
    # each stretch of text between them takes its own dummy prefix.
    ref = fv.sentencepiece_reference(vocab, prefix)
    bos = vocab["bos_token_id"]
    bad = _differences(engine, lambda t: [bos, *ref.encode(t).ids], texts, True)
    assert not bad, f"tokenizers: {len(bad)} of {len(texts)} differ, first: {bad[:3]}"
    for text in fv.EDGES:
        ids = ref.encode(text).ids
        assert engine.decode(ids) == ref.decode(ids, skip_special_tokens=False), text
        assert engine.decode(ids, skip_special_tokens=True) == sp.decode(ids), text


def test_sentencepiece_equals_transformers_gguf_reading(sentencepiece):
    """transformers' own tokenizer of such a file (Phi-3's, merges ordered by the file's scores)."""
    engine, _, vocab = sentencepiece[True]
    ref = fv.gguf_sentencepiece_reference(vocab)
    texts = fv.corpus()
    bad = _differences(engine, lambda t: ref.encode(t, add_special_tokens=False).ids, texts, False)
    assert not bad, f"{len(bad)} of {len(texts)} differ, first: {bad[:3]}"


def test_sentencepiece_metadata(sentencepiece):
    engine, sp, vocab = sentencepiece[True]
    assert engine.vocab_size == sp.get_piece_size()
    assert (engine.bos_token_id, engine.eos_token_id) == (sp.bos_id(), sp.eos_id())
    assert engine.add_bos and engine.encode("a")[0] == sp.bos_id()
    assert engine.token_to_id("<0x0A>") == sp.piece_to_id("<0x0A>")
    assert engine.token_bytes(sp.piece_to_id("<0xE2>")) == b"\xe2"
    assert engine.is_special(sp.bos_id()) and not engine.is_special(sp.piece_to_id("<0x41>"))


def test_open_refuses_a_file_without_a_tokenizer(tmp_path):
    path = str(tmp_path / "empty.gguf")
    fv.write_metadata_only(path, lambda w: None)
    with pytest.raises(EngineError, match="tokenizer.ggml.model"):
        GgufTokenizerCore.open(path)
    with pytest.raises(EngineError, match="missing.gguf"):
        GgufTokenizerCore.open(os.path.join(str(tmp_path), "missing.gguf"))
