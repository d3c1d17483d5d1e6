"""The tokenizer face the server uses (``serve.tokens``): on a GGUF's own tokenizer it gives what
the torch path's Hugging Face tokenizer gives (chat prompts through the file's Jinja template or
Gemma 3's, stop ids, decodes), a stream never emits half a UTF-8 character, the engine choice
for MODEL is checked, and bad input is refused with a typed error."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from offgraph_kv import InvalidArgumentError
from offgraph_kv.gguf_model import GgufModel
from offgraph_kv.serve import loading
from offgraph_kv.serve.choice import Choice
from offgraph_kv.serve.tokens import GgufTokens, HfTokens, render_chat, tokens_for

SYSTEM = "You are the help desk of a small bookshop. Answer in one short sentence."
CHATS = [
    [{"role": "user", "content": "When do you open?"}],
    [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Do you sell maps?"}],
    [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Can I return a book?"},
        {"role": "assistant", "content": "Yes, within thirty days, with the receipt."},
        {"role": "user", "content": "  And without one?  "},
    ],
    [{"role": "user", "content": "Café naïve 日本語 😀 <b>tags</b>\nand a second line"}],
]


def _gguf(name: str) -> GgufModel:
    where, gguf, _ = loading.resolve(name)
    return GgufModel(os.path.join(where, gguf), threads=1)


@pytest.fixture(scope="module", params=["gemma-3-270m", "smollm2-135m"])
def faces(request):
    """``(GGUF face, Hugging Face face)`` of one model, as each engine's server sees it."""
    if request.param == "gemma-3-270m":
        hf = request.getfixturevalue("gemma3_270m_tokenizer")
        hf.chat_template = hf.chat_template or loading.GEMMA3_TEMPLATE
    else:
        _, hf = request.getfixturevalue("smollm2_135m")
    _, face, name = loading.load_native(request.param, threads=1)
    assert name == request.param
    return face, HfTokens(hf)


TOOLS = [{"type": "function", "function": {"name": "hours", "description": "Opening hours"}}]
TOOL_CHAT = [
    CHATS[0][0],
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "hours", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "9 to 5"},
]


def test_tool_turns_render_alike_on_both_engines(faces):
    gguf, hf = faces
    assert gguf.tool_syntax == hf.tool_syntax == ("hermes", False)  # the fallback block
    assert gguf.chat_ids(TOOL_CHAT, TOOLS) == hf.chat_ids(TOOL_CHAT, TOOLS)
    assert len(gguf.chat_ids(TOOL_CHAT, TOOLS)) > len(gguf.chat_ids(TOOL_CHAT)) + 50


def test_chat_prompts_stops_and_decodes_equal_hugging_face(faces):
    gguf, hf = faces
    for chat in CHATS:
        assert gguf.chat_ids(chat) == hf.chat_ids(chat), chat
    assert gguf.stop_ids == hf.stop_ids == loading.stop_token_ids(hf.tok)
    text = "The bakery opens at seven. Café 😀"
    ids = gguf.encode(text)
    assert ids == hf.encode(text)
    assert gguf.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)
    assert gguf.decode(ids) == hf.decode(ids) == text
    assert gguf.token_bytes(ids[-1]) == gguf.tok.token_bytes(ids[-1])


def test_a_stream_never_sends_half_a_character(faces):
    gguf, _ = faces
    text = "Hi 🥐 café 日本語 👩‍👩‍👧 done"
    ids = gguf.encode(text, add_special_tokens=False)
    # SmolLM2's byte-level pieces split the emoji; the test is only worth it where they do.
    split = any(b"\xf0" in gguf.token_bytes(t) and len(gguf.token_bytes(t)) < 4 for t in ids)
    for stops in ([], ["café 日"], ["never there"]):
        c = Choice(job=SimpleNamespace(logprobs=None), tok=gguf, stops=stops)  # no logprobs
        sent = []
        for t in ids:
            c.add(t)
            sent.append(c.pending())
            if c.reason is not None:
                break
        if c.reason is None:
            c.reason = "length"
            sent.append(c.pending())
        assert all("\ufffd" not in s for s in sent), sent
        want = text if not stops or stops[0] not in text else text[: text.find(stops[0])]
        assert "".join(sent) == want
    if gguf.tok.chat_template:  # SmolLM2
        assert split


def test_engine_choice_for_model(tmp_path):
    d = tmp_path / "tf"
    d.mkdir()
    (d / "config.json").write_text("{}")
    assert loading.engine_of(str(d)) == "torch"
    assert loading.engine_of("smollm2-135m") == "native"
    assert loading.engine_of("gemma-3-270m", "torch") == "torch"
    with pytest.raises(SystemExit, match="--engine torch"):
        loading.engine_of(str(d), "native")
    with pytest.raises(SystemExit, match="--engine torch"):
        loading.load_native(str(d))
    with pytest.raises(SystemExit, match="expected one of"):
        loading.engine_of("smollm2-135m", "cuda")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(SystemExit, match="bad.gguf"):
        loading.load_native(str(bad))


def test_bad_input_is_refused(faces):
    gguf, hf = faces
    n = gguf.vocab_size
    for ids in ([n], [-1], [True], ["3"], [1.0]):
        with pytest.raises(InvalidArgumentError):
            gguf.decode(ids)
    for tid in (n, -1, True, "3"):
        with pytest.raises(InvalidArgumentError):
            gguf.token_bytes(tid)
        with pytest.raises(InvalidArgumentError):
            hf.token_text(tid)
    if gguf.tok.chat_template is None:  # Gemma 3's file: the family's template or none
        with pytest.raises(ValueError, match="no chat template"):
            GgufTokens(gguf.tok).chat_ids(CHATS[0])
    with pytest.raises(ValueError, match="chat template"):
        render_chat("{% for %}", CHATS[0])
    with pytest.raises(ValueError, match="no system"):
        render_chat("{{ raise_exception('no system') }}", CHATS[0])
    with pytest.raises(ValueError):  # the sandbox: a template cannot reach Python internals
        render_chat("{{ messages.__class__.__mro__[1].__subclasses__() }}", CHATS[0])
    with pytest.raises(TypeError):
        tokens_for(object())
    assert tokens_for(None) is None and tokens_for(gguf) is gguf
