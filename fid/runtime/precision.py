"""Mixed precision: what a `precision` knob means on a device, and its autocast context.

"auto" is bf16 on a GPU. On a CPU it is fp32, except for inference (generation, passage and
question embedding) on a CPU that computes bf16 natively (AVX-512 BF16 or AMX) with a model at
least CPU_BF16_MIN_WIDTH wide: there bf16 autocast pays (benchmarks/reader/cpu_bf16.py). Training and
the teacher's passage scores stay fp32 on a CPU (their config says so, or "auto" gives it).
Without native bf16, torch falls back to a scalar bf16 matrix product, measured here (AMD EPYC,
AVX2, torch 2.13) 27x slower than fp32 for a 256x512x512 product and 5.6x slower per training
step of the demo's tiny T5 (benchmarks/reader/reader_speed.py: 0.54 s fp32 vs 3.0 s bf16 at N = 10):
an explicit bf16 there is logged with that warning.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os

import torch

logger = logging.getLogger(__name__)

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
# The narrowest model (hidden size) whose CPU inference "auto" runs in bf16 where the CPU
# computes it natively (benchmarks/reader/cpu_bf16.py, one thread, greedy answers, same ids as fp32):
# from d_model 384 on bf16 was faster at 5 and at 100 passages (1.13x / 2.09x; 512: 1.27x /
# 2.34x); at 128 and 256 it was faster at 100 passages but slower at 5 (0.80x, 0.89x).
CPU_BF16_MIN_WIDTH = 384


def resolve_precision(
    precision: str, device: torch.device, inference_width: int | None = None
) -> str:
    """The concrete precision ("fp32", "bf16" or "fp16") of a knob's value on `device`.

    Args:
        precision: "auto", "fp32", "bf16" or "fp16".
        device: where the model runs.
        inference_width: for inference (generation, embedding), the model's hidden size: on
            a CPU with native bf16, "auto" is bf16 from CPU_BF16_MIN_WIDTH on. None (training,
            teacher scores): "auto" is fp32 on a CPU.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: expected one of {PRECISIONS}")
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if cuda_computes_bf16(device) else "fp32"
    wide = inference_width is not None and inference_width >= CPU_BF16_MIN_WIDTH
    return "bf16" if wide and cpu_computes_bf16() else "fp32"


@functools.cache
def cuda_computes_bf16(device: torch.device) -> bool:
    """Whether the GPU has bf16 arithmetic (Ampere and later); said once where it has not:
    "auto" is then fp32 (bf16 on a V100 or T4 is emulated, slow, and fp16 needs a loss
    scaler that FSDP cannot use)."""
    if not torch.cuda.is_available():  # planning a GPU run from elsewhere: today's GPUs
        return True
    native = bool(torch.cuda.is_bf16_supported(including_emulation=False))
    if not native:
        logger.warning(
            "precision auto: %s has no bf16 arithmetic (before Ampere): fp32. Hint: set "
            "precision: fp16 for speed (training: not with FSDP)",
            torch.cuda.get_device_name(device),
        )
    return native


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


def autocast(device: torch.device, precision: str, keep_casts: bool = True):
    """The mixed-precision context of a precision setting ("auto", "fp32", "bf16", "fp16").

    `keep_casts`: autocast's cache of its low-precision copy of each fp32 weight, kept until the
    context exits (torch's default). Training turns it off:
    - under FSDP a unit's gathered weights are leaves, so the cache kept a bf16 copy of every
      sharded block after it resharded: a forward ended holding half the model's fp32 bytes on
      every rank (t5-11b: ~22 GB), a dev evaluation throughout;
    - a cached copy used by several buckets sums its gradient in bf16 before the one cast back,
      uncached uses each cast their own to fp32: DDP (cached) and FSDP (not) trained different
      weights. Uncached, every use casts again (a bandwidth-bound copy, small beside the step).
    Generation keeps it where the weights are whole: the decoder runs once per token, and
    recasting its weights every token would multiply what a memory-bound step reads.

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
    return torch.autocast(device_type=device.type, dtype=dtype, cache_enabled=keep_casts)


def deterministic_kernels() -> None:
    """Deterministic kernels from here on: cuBLAS with a fixed workspace (read when its first
    handle is made, so before the first product on the GPU), and every op that has a
    deterministic version uses it (an op without one raises instead of varying)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
