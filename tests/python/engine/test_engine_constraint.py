"""Constrained decoding in BatchGenerator on SmolLM2 (native engine): a JSON schema, any JSON
object, a regex and a Lark grammar each give output that matches, ending with ``"stop"`` as soon
as the grammar is complete (no end token spent); masks computed during the forward or after it
give the same tokens; max_new_tokens cuts a constrained reply; a constrained and a free request
in one batch each give the tokens they give alone (greedy and seeded: the engine is
batch-invariant, docs/guarantees.md); a constraint that cannot compile, or a non-constraint, is
refused and queues nothing."""

from __future__ import annotations

import json
import re

import pytest
from offgraph_kv import InvalidArgumentError
from offgraph_kv.batch import BatchGenerator, Constraint

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def chat(tok, text: str) -> list[int]:
    return tok.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", False)


def fresh(engine) -> BatchGenerator:
    return BatchGenerator(engine, n_cells=1024, max_batch_tokens=128)


def run_one(engine, prompt, new, constraint=None):
    gen = fresh(engine)
    rid = gen.add(prompt, new, engine.eos_token_ids, constraint=constraint)
    out = gen.run()[rid]
    return out, gen


@pytest.fixture(scope="module")
def person(smollm2_engine):
    """The schema-constrained reply, alone on a fresh generator, and its finish reason."""
    gen = fresh(smollm2_engine)
    prompt = chat(smollm2_engine.tokenizer, "Describe a person as JSON.")
    rid = gen.add(
        prompt, 48, smollm2_engine.eos_token_ids, constraint=Constraint.json_schema(PERSON)
    )
    while gen.has_work:
        gen.step()
    reason = gen.request_info(rid)["finish_reason"]
    return prompt, gen.pop_finished()[rid], reason


def test_a_json_schema_reply_validates_and_stops_when_complete(smollm2_engine, person):
    _, out, reason = person
    text = smollm2_engine.tokenizer.decode(out)
    value = json.loads(text)
    assert set(value) == {"name", "age"}
    assert isinstance(value["name"], str) and len(value["name"]) <= 16
    assert isinstance(value["age"], int) and 0 <= value["age"] <= 120
    assert reason == "stop" and len(out) < 48
    assert not set(out) & set(smollm2_engine.eos_token_ids)  # complete: no end token spent


def test_json_object_regex_and_lark(smollm2_engine):
    tok = smollm2_engine.tokenizer
    out, _ = run_one(smollm2_engine, chat(tok, "Give me JSON."), 96, Constraint.json_object())
    text = tok.decode(out).removesuffix("<|im_end|>")
    assert isinstance(json.loads(text), dict), text
    out, _ = run_one(
        smollm2_engine, chat(tok, "A phone number?"), 16, Constraint.regex(r"\d{3}-\d{4}")
    )
    assert re.fullmatch(r"\d{3}-\d{4}", tok.decode(out)), tok.decode(out)
    lark = Constraint.lark('start: "yes" | "no"')
    out, _ = run_one(smollm2_engine, chat(tok, "Is the sea blue?"), 8, lark)
    assert tok.decode(out) in ("yes", "no")


def test_masks_during_or_after_the_forward_agree(smollm2_engine, person):
    prompt, constrained, _ = person
    gen = fresh(smollm2_engine)
    gen.masks.overlap = False
    rid = gen.add(
        prompt, 48, smollm2_engine.eos_token_ids, constraint=Constraint.json_schema(PERSON)
    )
    assert gen.run()[rid] == constrained


def test_length_cuts_a_constrained_reply(smollm2_engine, person):
    prompt, constrained, _ = person
    gen = fresh(smollm2_engine)
    rid = gen.add(
        prompt, 4, smollm2_engine.eos_token_ids, constraint=Constraint.json_schema(PERSON)
    )
    while gen.has_work:
        gen.step()
    assert gen.request_info(rid)["finish_reason"] == "length"
    assert gen.pop_finished()[rid] == constrained[:4]


@pytest.mark.parametrize("temperature, seed", [(0.0, None), (0.8, 7)])
def test_constrained_and_free_in_one_batch_each_equal_alone(
    smollm2_engine, person, temperature, seed
):
    prompt, constrained, _ = person
    eos = smollm2_engine.eos_token_ids
    free_prompt = chat(smollm2_engine.tokenizer, "Tell me about the sea.")
    kw = dict(temperature=temperature, seed=seed)

    def alone(p, n, constraint=None):
        gen = fresh(smollm2_engine)
        rid = gen.add(p, n, eos, constraint=constraint, **kw)
        return gen.run()[rid]

    c_alone = constrained if seed is None else alone(prompt, 48, Constraint.json_schema(PERSON))
    f_alone = alone(free_prompt, 24)
    gen = fresh(smollm2_engine)
    rc = gen.add(prompt, 48, eos, constraint=Constraint.json_schema(PERSON), **kw)
    rf = gen.add(free_prompt, 24, eos, **kw)
    out = gen.run()
    assert out[rc] == c_alone and out[rf] == f_alone
    assert len(f_alone) == 24  # the free request ran beside the whole constrained reply
    json.loads(smollm2_engine.tokenizer.decode(out[rc]))


@pytest.mark.parametrize(
    "build",
    [
        lambda: Constraint.json_schema({"type": "sound"}),
        lambda: Constraint.json_schema({"type": "string", "format": "colour"}, strict=True),
        lambda: Constraint.json_schema("{not json"),
        lambda: Constraint.regex("[a-"),
        lambda: Constraint.lark("start: missing_rule"),
    ],
)
def test_a_bad_constraint_is_refused_when_built(build):
    with pytest.raises(InvalidArgumentError):
        build()


def test_a_non_constraint_queues_nothing(smollm2_engine):
    gen = fresh(smollm2_engine)
    with pytest.raises(InvalidArgumentError, match="constraint"):
        gen.add([1, 2, 3], 4, constraint={"type": "json_object"})
    assert not gen.has_work and gen.stats["waiting"] == 0
    assert gen.add([1, 2, 3], 1) == 0  # the refused request took no id
