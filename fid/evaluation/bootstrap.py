"""Paired bootstrap interval of a difference in per-question scores (e.g. exact match of an
accelerated reader minus the plain reader's on the same questions)."""

from __future__ import annotations

import numpy as np


def paired_bootstrap_interval(
    ours: np.ndarray, theirs: np.ndarray, rounds: int = 10_000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile interval of mean(ours - theirs) over `rounds` resamples of the questions.

    Args:
        ours, theirs: (Q,) per-question scores of two systems on the same questions, same order.

    Returns:
        (low, high) in the scores' unit; (0, 0) for no questions.
    """
    diff = np.asarray(ours, dtype=np.float64) - np.asarray(theirs, dtype=np.float64)
    if diff.shape != np.shape(ours) or diff.ndim != 1:
        raise ValueError(
            f"expected two (Q,) score arrays, got {np.shape(ours)}, {np.shape(theirs)}"
        )
    if len(diff) == 0:
        return 0.0, 0.0
    rng = np.random.default_rng(seed)
    means = np.empty(rounds)
    for start in range(0, rounds, 1000):  # (1000, Q) resampled rows at a time
        size = min(1000, rounds - start)
        means[start : start + size] = diff[rng.integers(0, len(diff), (size, len(diff)))].mean(1)
    tail = 100 * (1 - level) / 2
    return float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))
