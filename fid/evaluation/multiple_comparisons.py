"""Holm's step-down correction of a family of p-values (Holm 1979, "A simple sequentially
rejective multiple test procedure", Scand. J. Statist. 6:65-70).

Written here rather than imported: it is six lines, and the libraries that hold it
(statsmodels' `multipletests`, scipy >= 1.11's `false_discovery_control` is FDR only) are not
dependencies of fid, which would add ~40 MB for one function.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def holm_adjusted(p_values: Sequence[float]) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values, in the input's order.

    With the m p-values sorted ascending, p_(1) <= ... <= p_(m), the j-th adjusted value is
    max over i <= j of min(1, (m - i + 1) p_(i)): a hypothesis is rejected at family-wise
    error rate alpha exactly when its adjusted p-value is <= alpha. It controls the family-wise
    error under any dependence between the tests (as Bonferroni does) and rejects at least
    what Bonferroni rejects.

    Args:
        p_values: (m,) p-values of the family's comparisons, each in [0, 1].

    Returns:
        (m,) adjusted p-values, in [0, 1].

    Raises:
        ValueError: a p-value outside [0, 1] (or NaN).
    """
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1 or not np.all((p >= 0) & (p <= 1)):
        raise ValueError(f"expected a list of p-values in [0, 1], got {p_values!r}")
    m = len(p)
    order = np.argsort(p, kind="stable")
    # (m,) scaled sorted p-values: the smallest times m, the next times m - 1, ...
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(scaled)  # step-down: never below an earlier one
    return adjusted
