"""Mixed precision: what a `precision` knob means on a device, and its autocast context.

"auto" is bf16 on a GPU and fp32 on a CPU. bf16 on a CPU is fast only where the CPU computes it
natively (AVX-512 with BF16, AMX): on an AVX2-only CPU torch falls back to a scalar bf16 matrix
product, measured here (AMD EPYC, AVX2, torch 2.13) 27x slower than fp32 for a 256x512x512
product and 5.6x slower per training step of the demo's tiny T5 (benchmarks/reader_speed.py:
0.54 s fp32 vs 3.0 s bf16 at N = 10). "auto" therefore never picks bf16 on a CPU, and an
explicit bf16 there is logged with that warning.
"""

from __future__ import annotations

import contextlib
import functools
import logging

import torch

logger = logging.getLogger(__name__)

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def resolve_precision(precision: str, device: torch.device) -> str:
    """The concrete precision ("fp32", "bf16" or "fp16") of a knob's value on `device`."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: expected one of {PRECISIONS}")
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return precision


@functools.cache
def cpu_computes_bf16() -> bool:
    """Whether this CPU has native bf16 matrix products (AVX-512 BF16 or AMX tiles)."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


@functools.cache
def _warn_slow_bf16() -> None:
    logger.warning(
        "precision bf16 on a CPU without native bf16 (%s, no AVX-512 BF16 or AMX): matrix "
        "products run several times slower than fp32 here. Hint: precision auto or fp32",
        torch.backends.cpu.get_cpu_capability(),
    )


def autocast(device: torch.device, precision: str):
    """The mixed-precision context of a precision setting ("auto", "fp32", "bf16", "fp16").

    Raises:
        ValueError: fp16 on a device other than CUDA.
    """
    precision = resolve_precision(precision, device)
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "fp16" and device.type != "cuda":
        raise ValueError("precision fp16 needs a CUDA device; use bf16 or fp32 on CPU")
    if precision == "bf16" and device.type == "cpu" and not cpu_computes_bf16():
        _warn_slow_bf16()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)
