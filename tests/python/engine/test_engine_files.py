"""Files the engine refuses, each with a typed EngineError before any tensor is read; and the
forward releasing the GIL."""

import threading
import time

import gguf
import numpy as np
import offgraph_kv as okv
import pytest
from offgraph_kv.gguf_model import EngineError, GgufModel


def _tiny(path, arch: str, tensors: bool = True) -> None:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    if tensors:
        w.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_refusals_are_typed(tmp_path, smollm2_gguf_path):
    cases = {}
    cases["missing"] = tmp_path / "nope.gguf"
    text = tmp_path / "text.gguf"
    text.write_text("not a gguf file at all\n" * 10)
    cases["text"] = text
    with open(smollm2_gguf_path, "rb") as f:
        head = f.read(1 << 20)
    for n in (3, 24, 4096, 1 << 20):
        p = tmp_path / f"cut{n}.gguf"
        p.write_bytes(head[:n])
        cases[f"truncated at {n}"] = p
    _tiny(tmp_path / "mamba.gguf", "mamba")
    cases["unsupported architecture"] = tmp_path / "mamba.gguf"
    _tiny(tmp_path / "hollow.gguf", "llama")
    cases["llama without its tensors"] = tmp_path / "hollow.gguf"
    for what, path in cases.items():
        with pytest.raises(EngineError) as e:
            GgufModel(path)
        assert isinstance(e.value, okv.CacheError), what
        assert str(e.value), what
    with pytest.raises(okv.InvalidArgumentError):
        GgufModel(smollm2_gguf_path, threads=0)


def test_forward_releases_the_gil(smollm2_engine):
    ids = list(range(10, 10 + 256))
    ticks = []
    done = threading.Event()

    def count():
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    t = threading.Thread(target=count)
    t.start()
    try:
        start = time.perf_counter()
        smollm2_engine.logits(ids)
        end = time.perf_counter()
    finally:
        done.set()
        t.join()
    during = [x for x in ticks if start < x < end]
    # A forward that held the GIL would let the counter run at most once or twice.
    assert len(during) >= 5, (len(during), end - start)


def test_logits_refusals_change_nothing(smollm2_engine):
    ids = [1, 2, 3, 4]
    before = smollm2_engine.logits(ids)
    with pytest.raises(okv.InvalidArgumentError):
        smollm2_engine.logits([smollm2_engine.vocab_size])
    with pytest.raises(okv.InvalidArgumentError):
        smollm2_engine.logits([])
    with pytest.raises(okv.ConfigError):
        smollm2_engine.logits(ids, kv_dtype="int4")
    np.testing.assert_array_equal(smollm2_engine.logits(ids), before)
