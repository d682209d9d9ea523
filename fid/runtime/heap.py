"""Freed tensor memory goes back to the system at once on a CPU (glibc's malloc).

glibc serves an allocation above its mmap threshold (128 KiB at start) with its own mapping,
unmapped when freed; but each such free of a block up to 32 MiB raises the threshold to that
block's size, after which blocks of that size come from the heap, where a freed block stays
resident until the heap's top is free. A training step frees activations of many sizes in
another order than it made them: measured here, the peak resident size of a tiny reader's
step was 1.2x (no checkpointing) to 1.6x (checkpointing) the tensors it held
(benchmarks/memory/memory_plan.py). A fixed threshold (which also turns the raising off) keeps every
block of 256 KiB or more in its own mapping, and the resident size equals the tensors'.

It costs kernel time: each such block is mapped, faulted in page by page and unmapped afresh.
Measured (benchmarks/memory/allocator.py; t5-small shape, 10 passages, one thread, a loaded
machine): a train step's system time is 47% of its user time (3.9 s for 8.2 s, 1.9 million
minor faults; generation 31%) against 7% with glibc's own setting (resident peak 1.19x the
tensors); tcmalloc or jemalloc that keep freed pages spend <1% but hold 1.13-1.36x; purging
ones (jemalloc's decay, malloc_trim after each step, huge pages) 8-56%. None kept the peak
within 10% of the tensors with system time under 5% (issue 46.3), so the plan's accuracy wins.
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
