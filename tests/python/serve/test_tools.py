"""The tool-call syntaxes parsed back into OpenAI calls, without a model: each syntax whole and
fed in random splits gives the same content and calls (the stream's argument deltas add up to
the whole reply's arguments); text that only looks like a call stays content; which syntax a
template teaches."""

from __future__ import annotations

import json
import random
import re

import pytest
from offgraph_kv.serve.tools import ToolCallParser, syntax_for

WEATHER = {"city": "Paris", "unit": "C", "days": [1, 2], "q": 'a "b" } <tool_call>'}
W = json.dumps(WEATHER)

# (syntax, reply, content, [(name, arguments as a JSON value)])
CASES = [
    (
        "hermes",
        f'<tool_call>\n{{"name": "weather", "arguments": {W}}}\n</tool_call>',
        None,
        [("weather", WEATHER)],
    ),
    (
        "hermes",
        f'Let me look.\n<tool_call>{{"arguments": {W}, "name": "weather"}}</tool_call>'
        f'\n<tool_call>\n{{"name": "time", "arguments": {{}}}}\n</tool_call>',
        "Let me look.",
        [("weather", WEATHER), ("time", {})],
    ),
    ("hermes", '<tool_call>{"name": "time"}</tool_call>', None, [("time", {})]),
    (
        "hermes",
        '<tool_call>{"name": "w", "arguments": "{\\"a\\": 1}"}</tool_call>',
        None,
        [("w", {"a": 1})],
    ),
    (
        "hermes",
        "Use <tool_call> tags like <b>this</b>.",
        "Use <tool_call> tags like <b>this</b>.",
        [],
    ),
    (
        "hermes",
        "No calls here, just text < and > <tool",
        "No calls here, just text < and > <tool",
        [],
    ),
    ("hermes", "  padded text  ", "  padded text  ", []),
    ("llama3", f'{{"name": "weather", "parameters": {W}}}', None, [("weather", WEATHER)]),
    (
        "llama3",
        f'<|python_tag|>{{"type": "function", "name": "weather", "parameters": {W}}}; '
        '{"name": "time", "parameters": {}}',
        None,
        [("weather", WEATHER), ("time", {})],
    ),
    ("llama3", '{"colour": "blue"}', '{"colour": "blue"}', []),
    ("llama3", "Paris is sunny {today}.", "Paris is sunny {today}.", []),
    (
        "mistral",
        f'[TOOL_CALLS][{{"name": "weather", "arguments": {W}}}, '
        '{"name": "time", "arguments": {}}]',
        None,
        [("weather", WEATHER), ("time", {})],
    ),
    (
        "mistral",
        f"Sure.[TOOL_CALLS]weather[ARGS]{W}[TOOL_CALLS]time[ARGS]{{}}",
        "Sure.",
        [("weather", WEATHER), ("time", {})],
    ),
    ("mistral", "[TOOL_CALLS] oh no, not a call", "[TOOL_CALLS] oh no, not a call", []),
]


def run(syntax: str, pieces: list[str], max_calls: int | None = None):
    p = ToolCallParser(syntax, max_calls)
    events = []
    for piece in pieces:
        events += p.feed(piece)
    events += p.finish()
    content = "".join(e[1] for e in events if e[0] == "content")
    calls: dict[int, list] = {}
    for e in events:
        if e[0] == "call":
            assert e[1] == len(calls) and e[2].startswith("call_")
            calls[e[1]] = [e[3], ""]
        elif e[0] == "args":
            calls[e[1]][1] += e[2]
    assert content == p.content
    assert [(c.name, c.arguments) for c in p.calls] == [tuple(v) for v in calls.values()]
    return (content or None if calls else content), [(n, json.loads(a)) for n, a in calls.values()]


def splits(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


@pytest.mark.parametrize("syntax,reply,content,calls", CASES)
def test_whole_and_streamed_in_random_splits_agree(syntax, reply, content, calls):
    assert run(syntax, [reply]) == (content, calls)
    rng = random.Random(reply)
    for _ in range(20):
        assert run(syntax, splits(reply, rng)) == (content, calls)
    assert run(syntax, list(reply)) == (content, calls)  # a character at a time


def test_arguments_stream_as_they_are_written():
    p = ToolCallParser("hermes")
    assert p.feed("<tool_call>\n{") == []
    call, first = p.feed('"name": "weather", "arguments": {"ci')
    assert call[0] == "call" and call[3] == "weather" and first == ("args", 0, '{"ci')
    assert p.feed('ty": "Paris"') == [("args", 0, 'ty": "Paris"')]
    assert p.calls[0].arguments == '{"city": "Paris"'
    p.feed("}}\n</tool_call>")
    assert p.finish() == [] and json.loads(p.calls[0].arguments) == {"city": "Paris"}


@pytest.mark.parametrize(
    "syntax,first,rest",
    [
        ("hermes", '<tool_call>{"name": "a", "arguments": {}}', '\n</tool_call><tool_call>{"n'),
        ("llama3", '{"name": "a", "parameters": {}', '}; {"name": "b", "parameters": {}}'),
        ("mistral", '[TOOL_CALLS][{"name": "a", "arguments": {}}', ', {"name": "b"'),
        ("mistral", "[TOOL_CALLS]a[ARGS]{", '}[TOOL_CALLS]b[ARGS]{"x": 1}'),
    ],
)
def test_max_calls_closes_the_reply_once_the_call_is_written(syntax, first, rest):
    p = ToolCallParser(syntax, max_calls=1)
    p.feed(first)
    assert not p.closed  # the call's object or its closing marker is still to come
    for ch in rest:
        p.feed(ch)
    assert (
        p.closed and p.finish() == [] and [(c.name, c.arguments) for c in p.calls] == [("a", "{}")]
    )


def test_a_cut_call_keeps_what_was_written():
    p = ToolCallParser("hermes")
    p.feed('<tool_call>{"name": "a", "arguments": {"x": 1')
    p.finish()
    assert [(c.name, c.arguments) for c in p.calls] == [("a", '{"x": 1')]


def test_syntax_for_templates():
    assert syntax_for(None) == ("hermes", False)
    assert syntax_for("{{ messages[0]['content'] }}") == ("hermes", False)
    qwen = "{% if tools %}{% for t in tools %}{{ t | tojson }}{% endfor %}<tool_call>{% endif %}"
    assert syntax_for(qwen) == ("hermes", True)
    llama = "{% if tools %}{{ '<|python_tag|>' }}{% endif %}"
    assert syntax_for(llama) == ("llama3", True)
    assert syntax_for("{{ '[TOOL_CALLS]' }}{{ tools }}") == ("mistral", True)
    assert syntax_for("<tool_call> mentioned, tools never rendered") == ("hermes", False)


# -- rendering and the forced-call grammar ---------------------------------------------------

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] }}"
    "{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# A template that renders tools itself, as Qwen's does (arguments must arrive as an object).
NATIVE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>{% endif %}"
    "{% for m in messages %}[{{ m.role }}]{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }} "
    "{{ c.function.arguments | tojson }}</tool_call>{% endfor %}"
    "{% if m.tool_call_id %}({{ m.tool_call_id }}){% endif %}{% endfor %}"
)
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
        },
    },
}
CALLED = {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "C"}'}
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": CALLED},
            {"id": "call_2", "type": "function", "function": {**CALLED, "arguments": "{}"}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "21"},
    {"role": "tool", "tool_call_id": "call_2", "content": "25"},
]


def render(template: str, messages, tools):
    from offgraph_kv.serve.tokens import render_chat
    from offgraph_kv.serve.tool_prompt import template_chat

    syntax, native = syntax_for(template)
    msgs, tools = template_chat(messages, tools, native, syntax)
    return render_chat(template, msgs, tools)


def test_a_template_without_tools_gets_the_fallback_block_and_hermes_turns():
    text = render(CHATML, HISTORY, [TOOL])
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert json.dumps(TOOL) in system and "<tool_call>" in system
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n'
    assert f"<|im_start|>assistant\n{call}</tool_call>\n<tool_call>" in text
    # The two results: one user turn, in call order.
    results = "<tool_response>\n21\n</tool_response>\n<tool_response>\n25\n</tool_response>"
    assert f"<|im_start|>user\n{results}<|im_end|>\n<|im_start|>assistant\n" in text
    assert "# Tools" not in render(CHATML, HISTORY, None)  # tool_choice "none": no tools


def test_a_template_with_tools_gets_transformers_conventions():
    text = render(NATIVE, HISTORY, [TOOL])
    assert text.startswith(f"<tools>{json.dumps(TOOL)}</tools>")  # transformers' tojson
    # Arguments reach the template as an object: tojson writes it, not a quoted string.
    assert '<tool_call>get_weather {"city": "Paris", "unit": "C"}</tool_call>' in text
    assert "[tool]21(call_1)[tool]25(call_2)" in text
    # Mistral's templates take 9-character ids: a call and its result keep matching.
    mistral = render(NATIVE + "{# [TOOL_CALLS] #}", HISTORY, [TOOL])
    short = re.search(r"\[tool\]21\((\w+)\)", mistral).group(1)
    assert len(short) == 9 and short.isalnum() and short != "call_1"


class _Bytes:
    """A vocabulary of the 256 bytes and an end token: grammars checked without a model."""

    def __init__(self):
        self.tokens = [bytes([i]) for i in range(256)] + [b"\xff<end>"]
        self.eos_token_id, self.bos_token_id, self.special_token_ids = 256, None, []

    def __call__(self, text: str) -> list[int]:
        return list(text.encode())


def accepts(grammar: str, text: str) -> bool:
    import llguidance as llg

    tok = llg.LLTokenizer(llg.TokenizerWrapper(_Bytes()), n_vocab=257, eos_token=[256])
    m = llg.LLMatcher(tok, grammar, log_level=0)
    return all(m.consume_token(b) for b in text.encode()) and m.is_accepting()


# (syntax, a valid call of TOOL, an invalid one) in each syntax.
CALLS = [
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}'
        "\n</tool_call>",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    ),
    (
        "llama3",
        '{"name": "get_weather", "parameters": {"city": "Rome", "unit": "F"}}',
        '{"name": "get_time", "parameters": {}}',
    ),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "A", "unit": "C"}}]',
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "A", "unit": "K"}}]',
    ),
]


@pytest.mark.parametrize("syntax,good,bad", CALLS)
def test_the_forced_call_grammar_takes_valid_calls_only(syntax, good, bad):
    from offgraph_kv.serve.tool_prompt import Tool, call_grammar

    tools = [Tool.model_validate(TOOL)]
    grammar = call_grammar(tools, ["get_weather"], False, syntax, {})
    assert accepts(grammar, good) and not accepts(grammar, bad)
    p = ToolCallParser(syntax)
    p.feed(good)
    p.finish()
    assert [c.name for c in p.calls] == ["get_weather"] and json.loads(p.calls[0].arguments)
    two = call_grammar(tools, ["get_weather"], True, syntax, {})
    sep = {"hermes": "\n", "llama3": "; "}.get(syntax)
    if sep is not None:
        assert accepts(two, good + sep + good) and not accepts(grammar, good + sep + good)


@pytest.mark.parametrize("syntax,good,bad", CALLS)
def test_the_auto_grammar_takes_text_or_valid_calls(syntax, good, bad):
    from offgraph_kv.serve.tool_prompt import Tool, call_grammar

    tools = [Tool.model_validate(TOOL)]
    one, many = (
        call_grammar(tools, ["get_weather"], parallel, syntax, {}, lazy=True)
        for parallel in (False, True)
    )
    for text in ("", "It is sunny in Paris.", "A <tool or [TOOL] or } is text."):
        assert accepts(one, text), text
    # Llama 3 teaches a reply that is the call; the others write text before the opener.
    lead = "" if syntax == "llama3" else "Let me check.\n"
    assert accepts(one, lead + good) and not accepts(one, lead + bad)
    sep = {"hermes": "\n", "llama3": "; "}.get(syntax)
    if sep is not None:  # parallel_tool_calls false: one call at most
        assert accepts(many, lead + good + sep + good)
        assert not accepts(one, lead + good + sep + good)


@pytest.mark.parametrize("family", ["gemma3", "phi3", "qwen2"])
def test_each_family_default_template_renders_a_round_trip(family):
    from offgraph_kv.gguf_model import family_chat_defaults

    template = family_chat_defaults(family)[1]
    assert syntax_for(template) == ("hermes", False)  # none teaches tools: the fallback
    text = render(template, [*HISTORY, {"role": "assistant", "content": "21 and 25."}], [TOOL])
    assert json.dumps(TOOL) in text and "Be brief." in text
    call = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}'
    for piece in [call, "<tool_response>\n21\n</tool_response>", "21 and 25."]:
        assert piece in text, (family, piece)
    assert text.index("Be brief.") < text.index(call) < text.index("<tool_response>\n25")
