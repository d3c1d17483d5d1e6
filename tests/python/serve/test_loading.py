"""``serve.loading``: a GGUF model is read through a float32 conversion kept on disk, and that
conversion is the GGUF's model and tokenizer: equal logits and equal token ids."""

from __future__ import annotations

import os

import torch
from offgraph_kv.serve import loading

TEXT = "The bakery opens at seven. <|im_start|>user\nHello, wörld! 123 rye loaves"


def test_a_kept_conversion_loads_as_the_gguf_itself(smollm2_135m, monkeypatch):
    model, tok = smollm2_135m  # the session's load: through the kept conversion
    where, gguf, _ = loading.resolve("smollm2-135m")
    kept = loading.converted(where, gguf)
    assert kept is not None and os.path.isfile(os.path.join(kept, "converted"))
    assert loading.converted(where, gguf) == kept  # made once, found after
    monkeypatch.setenv(loading.CACHE_ENV, "off")
    assert loading.converted(where, gguf) is None
    direct, direct_tok, name = loading.load("smollm2-135m")  # the GGUF itself
    assert name == "smollm2-135m"
    ids = direct_tok(TEXT)["input_ids"]
    assert tok(TEXT)["input_ids"] == ids
    with torch.no_grad():
        a = direct(torch.tensor([ids])).logits
        b = model(torch.tensor([ids])).logits
    assert torch.equal(a, b)
