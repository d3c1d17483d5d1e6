"""``--prefix-cache-bytes``: the size of the server's host tier
(:class:`~offgraph_kv.store.HostTier`), which keeps the K/V chunks of prompts evicted from the
cell pool in process memory for later requests sharing their prefix.

Sizes are bytes, or a number with a binary suffix (``512M``, ``2G``, ``1.5GiB``). Unset, the
tier takes a quarter of the memory the machine has available at start (``MemAvailable``),
at most 8 GiB: the pool itself, the model and the other processes keep the rest. 0 turns it
off.
"""

from __future__ import annotations

import re

__all__ = ["DEFAULT_CAP", "default_bytes", "parse_size", "resolve"]

DEFAULT_CAP = 8 << 30
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"512M"`` -> 536870912; a plain number is bytes. ``ValueError`` for anything else."""
    m = _SIZE.match(str(text))
    if m is None:
        raise ValueError(f"{text!r} is not a size (bytes, or a number with K, M, G or T)")
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if value != int(value) and m.group(2) == "":
        raise ValueError(f"{text!r}: a byte count is a whole number")
    return int(value)


def available_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """``MemAvailable`` in bytes, ``None`` where the system does not say."""
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def default_bytes(available: int | None = None) -> int:
    """A quarter of the available memory, at most :data:`DEFAULT_CAP`; 0 when unknown."""
    avail = available_bytes() if available is None else available
    return 0 if not avail else min(avail // 4, DEFAULT_CAP)


def resolve(option: int | None) -> int:
    """The tier's bytes for a ``prefix_cache_bytes`` option (``None``: the default)."""
    return default_bytes() if option is None else int(option)
