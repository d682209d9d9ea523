"""Paired bootstrap interval and p-value of a difference in per-question scores (e.g. exact
match of an accelerated reader minus the plain reader's on the same questions)."""

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
    diff = _differences(ours, theirs)
    if len(diff) == 0:
        return 0.0, 0.0
    means = _resampled_means(diff, rounds, seed)
    tail = 100 * (1 - level) / 2
    return float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


def paired_bootstrap_p_value(
    ours: np.ndarray, theirs: np.ndarray, rounds: int = 10_000, seed: int = 0
) -> float:
    """Two-sided bootstrap p-value of "mean(ours - theirs) = 0", from the resamples that
    `paired_bootstrap_interval` draws (same `rounds` and `seed`), so the two agree: the 95%
    interval excludes 0 about when p < 0.05.

    p = 2 min(#{resampled means <= 0} + 1, #{>= 0} + 1) / (rounds + 1), at most 1: twice the
    share of resamples on the far side of 0, counted with the add-one correction so that no
    finite number of resamples claims p = 0 (Davison & Hinkley 1997, eq. 4.11).

    Args:
        ours, theirs: (Q,) per-question scores of two systems on the same questions, same order.

    Returns:
        p in (0, 1]; 1 for no questions or identical scores.
    """
    diff = _differences(ours, theirs)
    if len(diff) == 0 or not diff.any():
        return 1.0
    means = _resampled_means(diff, rounds, seed)
    far = min(int((means <= 0).sum()), int((means >= 0).sum()))
    return min(1.0, 2 * (far + 1) / (rounds + 1))


def _differences(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    diff = np.asarray(ours, dtype=np.float64) - np.asarray(theirs, dtype=np.float64)
    if diff.shape != np.shape(ours) or diff.ndim != 1:
        raise ValueError(
            f"expected two (Q,) score arrays, got {np.shape(ours)}, {np.shape(theirs)}"
        )
    return diff


def _resampled_means(diff: np.ndarray, rounds: int, seed: int) -> np.ndarray:
    """(rounds,) means of `diff` over resamples of its questions, with replacement."""
    rng = np.random.default_rng(seed)
    means = np.empty(rounds)
    for start in range(0, rounds, 1000):  # (1000, Q) resampled rows at a time
        size = min(1000, rounds - start)
        means[start : start + size] = diff[rng.integers(0, len(diff), (size, len(diff)))].mean(1)
    return means
