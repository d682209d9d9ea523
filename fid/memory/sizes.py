"""Sizes as users write them ("80GiB", "40 GB", "512MiB", 1024) and as fid prints them.

Its own module, importing neither torch nor transformers, so that code that must stay light
(a workflow reading `gpu_memory` when it loads) can read sizes as `fid plan-memory` does.
"""

from __future__ import annotations

import re

from fid.errors import ConfigError

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip


def parse_size(text: str | int, what: str = "--gpu-memory") -> int:
    """Bytes of a size like "80GiB", "80 GB", "512MiB", "1024" or 1024 (an int is bytes).

    Raises:
        ConfigError: not a positive number with a known unit.
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS or float(match.group(1)) <= 0:
        raise ConfigError(
            f"{what} = {text!r} is not a size: expected a positive number with a unit, e.g. "
            "80GiB, 40GB or 512MiB"
        )
    return int(float(match.group(1)) * _UNITS[unit])


def format_bytes(size: int) -> str:
    return f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"
