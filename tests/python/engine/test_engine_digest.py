"""The native engine's model identity: a GGUF file's digest (header, metadata, tensor infos and a
strided sample of every tensor's bytes). Two files differ, one file (and a copy of it) is the
same, a change in a sampled tensor window or in the metadata changes it; what a prefix store
binds (``identity``) follows; bad input is refused with a typed error."""

from __future__ import annotations

import mmap
import os
import shutil

import pytest
from offgraph_kv import EngineError
from offgraph_kv.gguf_model import GgufModel
from offgraph_kv.store import MemoryBackend, PrefixStore
from offgraph_kv.store.gguf_digest import gguf_digest, layout
from offgraph_kv.store.identity import identity


def _flip(path: str, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x01]))


def _layout(path: str) -> tuple[int, int, list[int]]:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return layout(buf, os.path.getsize(path), path)


def test_two_files_differ_and_one_file_is_itself(gemma_engine, smollm2_engine, smollm2_gguf_path):
    a, b = gemma_engine.weights_digest(), smollm2_engine.weights_digest()
    assert len(a) == len(b) == 32 and a != b
    assert gguf_digest(smollm2_gguf_path) == b  # computed once per model, equal to the file's
    assert GgufModel(smollm2_gguf_path, threads=1).weights_digest() == b
    assert identity(gemma_engine) != identity(smollm2_engine)
    assert identity(smollm2_engine) == identity(GgufModel(smollm2_gguf_path, threads=1))
    # A str identity naming the same file is another identity: a caller's name is not a digest.
    assert identity(smollm2_engine) != identity(smollm2_gguf_path)
    store = PrefixStore(MemoryBackend(), model=smollm2_engine)
    assert store.identity == identity(smollm2_engine)


def test_a_change_in_a_sampled_window_or_the_header_changes_it(tmp_path, smollm2_gguf_path):
    copy = str(tmp_path / "copy.gguf")
    shutil.copyfile(smollm2_gguf_path, copy)
    want = gguf_digest(smollm2_gguf_path)
    assert gguf_digest(copy) == want  # where the file lives is not its identity
    header, start, offsets = _layout(copy)
    assert 0 < header <= start and len(offsets) > 10
    mid = sorted(offsets)[len(offsets) // 2]
    _flip(copy, start + mid)  # the first byte of a tensor: the first window of its sample
    changed = gguf_digest(copy)
    assert changed != want
    _flip(copy, start + mid)
    assert gguf_digest(copy) == want
    _flip(copy, header - 9)  # the last tensor info: the high byte of its type
    assert gguf_digest(copy) not in (want, changed)


def test_bad_input_is_refused(tmp_path, smollm2_gguf_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all, just some bytes" * 4)
    with pytest.raises(EngineError, match="bad magic"):
        gguf_digest(junk)
    truncated = tmp_path / "truncated.gguf"
    with open(smollm2_gguf_path, "rb") as f:
        truncated.write_bytes(f.read(4096))  # inside the metadata
    with pytest.raises(EngineError, match="truncated"):
        gguf_digest(truncated)
    (tmp_path / "tiny.gguf").write_bytes(b"GGUF")
    with pytest.raises(EngineError):
        gguf_digest(tmp_path / "tiny.gguf")
    with pytest.raises(FileNotFoundError):
        gguf_digest(tmp_path / "missing.gguf")
    for samples in (0, -1, True, 2.5, "8"):
        with pytest.raises(ValueError):
            gguf_digest(smollm2_gguf_path, samples=samples)
    with pytest.raises(TypeError):
        identity(object())
