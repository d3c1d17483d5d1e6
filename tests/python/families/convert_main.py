"""Runs llama.cpp's converter (``argv[1]``: its script; the rest: its arguments), naming the
pre-tokenizer (env ``FIXTURE_TOKENIZER_PRE``) of a tokenizer missing from the converter's table of
known tokenizer hashes, as llama.cpp's own update script does for a new model's tokenizer."""

import os
import runpy
import sys
from pathlib import Path

script = sys.argv.pop(1)
sys.path.insert(0, str(Path(script).parent))
from conversion import base  # noqa: E402

_known = base.TextModel.get_vocab_base_pre


def _named(self, tokenizer) -> str:
    try:
        return _known(self, tokenizer)
    except NotImplementedError:
        return os.environ["FIXTURE_TOKENIZER_PRE"]


base.TextModel.get_vocab_base_pre = _named
sys.argv[0] = script
runpy.run_path(script, run_name="__main__")
