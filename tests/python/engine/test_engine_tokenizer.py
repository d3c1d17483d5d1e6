"""The GGUF's own tokenizer (built in Rust from the file's metadata) against the model's Hugging
Face tokenizer, both models: equal ids with and without special tokens, equal decodes."""

import pytest
from offgraph_kv.tools.serve_demo import QUESTIONS

GPL3 = "/usr/share/common-licenses/GPL-3"

EDGES = [
    "",
    " ",
    "  leading and trailing  ",
    "many     spaces\tand\ttabs",
    "\n\n\nnewlines\r\nand CRLF\r\n",
    "digits 1234567 and 3.14159, 10,000.5",
    "don't I'M we'll they've she's",
    "punctuation!!! ??? ... --- ;;; (((nested)))",
    "café naïve résumé e\u0301 combining",
    "日本語のテキストと中文文本",
    "emoji 😀 👩‍👩‍👧‍👦 🇫🇷 ✨",
    "مرحبا بالعالم",
    "rare \U0001f9ec\U0001fab8 and \u2028 separators",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "x" * 300,
]


def _corpus() -> list[str]:
    with open(GPL3, encoding="utf-8") as f:
        text = f.read()
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    return [text, *paragraphs[:80], *QUESTIONS, *EDGES]


@pytest.fixture(scope="module", params=["smollm2", "gemma"])
def pair(request):
    if request.param == "gemma":
        return request.getfixturevalue("gemma_engine"), request.getfixturevalue(
            "gemma3_270m_tokenizer"
        )
    _, tok = request.getfixturevalue("smollm2_135m")
    return request.getfixturevalue("smollm2_engine"), tok


def test_ids_equal_hugging_face(pair):
    engine, hf = pair
    bad = []
    corpus = _corpus()
    for text in corpus:
        for special in (True, False):
            want = hf(text, add_special_tokens=special)["input_ids"]
            got = engine.tokenizer.encode(text, add_special_tokens=special)
            if got != want:
                bad.append((text[:60], special, got[:12], want[:12]))
    assert not bad, f"{len(bad)} of {2 * len(corpus)} differ, first: {bad[:3]}"


def test_decode_equals_hugging_face(pair):
    engine, hf = pair
    for text in _corpus():
        ids = hf(text, add_special_tokens=True)["input_ids"]
        for skip in (True, False):
            assert engine.tokenizer.decode(ids, skip_special_tokens=skip) == hf.decode(
                ids, skip_special_tokens=skip
            ), (text[:60], skip)


def test_special_ids_and_template(pair):
    engine, hf = pair
    tok = engine.tokenizer
    assert tok.vocab_size == engine.vocab_size
    assert tok.bos_token_id == hf.bos_token_id
    assert tok.eos_token_id == hf.eos_token_id
    assert tok.eos_token_id in engine.eos_token_ids
    if engine.architecture == "gemma3":
        assert tok.chat_template is None  # the Gemma 3 GGUF carries none
        assert tok.token_to_id("<end_of_turn>") in engine.eos_token_ids
    else:
        assert "<|im_start|>" in tok.chat_template
        assert tok.token_to_id("<|im_end|>") in engine.eos_token_ids


def test_bad_ids_are_refused(pair):
    import offgraph_kv as okv

    engine, _ = pair
    with pytest.raises(okv.InvalidArgumentError):
        engine.tokenizer.decode([engine.vocab_size])
    with pytest.raises(okv.InvalidArgumentError):
        engine.tokenizer.decode([-1])
