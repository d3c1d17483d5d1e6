"""llama.cpp's own `convert_hf_to_gguf.py`, taken from the llama-cpp-python sdist on PyPI (cached
after the first run) and run in a subprocess with the sdist's own gguf-py, so fixtures are made
the way the world makes GGUF files. Nothing of llama.cpp is kept in this repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.3.36"
_CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    / "offgraph-kv"
    / f"llama-cpp-python-{VERSION}"
)
# The converter script, its model classes and the gguf-py it is released with.
_MEMBERS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
_DONE = ".complete"


def converter_dir() -> Path:
    """The directory holding the converter, downloading and extracting it on first use."""
    if (_CACHE / _DONE).is_file():
        return _CACHE
    _CACHE.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=_CACHE.parent) as tmp:
        # --no-binary for the package only: its build tools (cmake) still come as wheels, which
        # pip needs to read the sdist's metadata.
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
             "llama-cpp-python", f"llama-cpp-python=={VERSION}", "-d", tmp, "-q"],
            check=True,
        )  # fmt: skip
        (sdist,) = Path(tmp).glob("llama_cpp_python-*.tar.gz")
        staged = Path(tmp) / "out"
        prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                rel = member.name.removeprefix(prefix)
                if member.name.startswith(prefix) and rel.startswith(_MEMBERS) and member.isfile():
                    member.name = rel
                    tar.extract(member, staged, filter="data")
        assert (staged / "convert_hf_to_gguf.py").is_file(), "sdist layout changed"
        (staged / _DONE).write_text(VERSION)
        if not (_CACHE / _DONE).is_file():
            shutil.rmtree(_CACHE, ignore_errors=True)
            staged.rename(_CACHE)
    return _CACHE


def start_convert(hf_dir: Path, out: Path, outtype: str, pre: str | None = None) -> Conversion:
    """Starts converting the transformers checkpoint in ``hf_dir`` to ``out`` (``f16``, ``q8_0``,
    ...) in the background; ``Conversion.wait`` returns the file. ``pre`` names the BPE
    pre-tokenizer when the converter does not know the tokenizer's hash."""
    where = converter_dir()
    env = {**os.environ, "PYTHONPATH": str(where / "gguf-py"), "HF_HUB_OFFLINE": "1"}
    script = [str(where / "convert_hf_to_gguf.py")]
    if pre is not None:
        env["FIXTURE_TOKENIZER_PRE"] = pre
        script = [str(Path(__file__).with_name("convert_main.py")), *script]
    proc = subprocess.Popen(
        [sys.executable, *script, str(hf_dir),
         "--outfile", str(out), "--outtype", outtype],
        env=env, cwd=hf_dir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    return Conversion(proc, out)


class Conversion:
    def __init__(self, proc: subprocess.Popen, out: Path):
        self._proc, self._out = proc, out

    def wait(self) -> Path:
        _, err = self._proc.communicate()
        assert self._proc.returncode == 0, err[-3000:]
        return self._out
