"""Freed tensor memory goes back to the system at once on a CPU (glibc's malloc).

glibc serves an allocation above its mmap threshold (128 KiB at start) with its own mapping,
unmapped when freed; but each such free of a block up to 32 MiB raises the threshold to that
block's size, after which blocks of that size come from the heap, where a freed block stays
resident until the heap's top is free. A training step frees activations of many sizes in
another order than it made them: measured here, the peak resident size of a tiny reader's
step was 1.2x (no checkpointing) to 1.6x (checkpointing) the tensors it held
(benchmarks/memory/memory_plan.py). A fixed threshold (which also turns the raising off) keeps every
block of 256 KiB or more in its own mapping, and the resident size equals the tensors'.
"""

from __future__ import annotations

import ctypes
import os
import sys

FIXED_MMAP_THRESHOLD = 256 << 10  # bytes; smaller blocks are too many to map each
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


def return_freed_memory(threshold: int = FIXED_MMAP_THRESHOLD) -> bool:
    """Fixes glibc's mmap threshold at `threshold` bytes for this process, unless the user set
    MALLOC_MMAP_THRESHOLD_ (glibc's own variable) or the C library is not glibc. Returns
    whether it was set."""
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
