"""Systems compared question by question with reference systems (e.g. each distillation signal
against the no-teacher controls): the difference of the means, its paired bootstrap interval
and p-value, and Holm's adjustment over the whole family of comparisons made."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fid.evaluation.bootstrap import paired_bootstrap_interval, paired_bootstrap_p_value
from fid.evaluation.multiple_comparisons import holm_adjusted


@dataclass(frozen=True)
class Comparison:
    """One system against one reference on one column of per-question scores.

    Attributes:
        system, reference: the two systems' names; column: the score column (e.g. k of top-k).
        difference: mean(system - reference); low, high: its paired bootstrap 95% interval.
        p: the two-sided paired bootstrap p-value; holm: p adjusted over the family (Holm).
    """

    system: str
    reference: str
    column: int
    difference: float
    low: float
    high: float
    p: float
    holm: float = float("nan")


def compare_to_references(
    scores: dict[str, np.ndarray], references: Sequence[str]
) -> list[Comparison]:
    """Every system against every reference it is not, each pair of systems once (a reference
    against another reference only in the first one's row), column by column.

    Args:
        scores: system -> (Q, C) per-question scores, the same Q questions in the same order
            (e.g. top-k hits averaged over training seeds).
        references: the systems every other one is read against (names in `scores`).

    Returns:
        Comparisons, system by system in `scores`' order, then reference, then column; `holm`
        unset (see `with_holm`).
    """
    found, seen = [], set()
    for system, ours in scores.items():
        for reference in references:
            pair = frozenset((system, reference))
            if system == reference or pair in seen:
                continue
            seen.add(pair)
            theirs = scores[reference]
            for c in range(ours.shape[1]):
                low, high = paired_bootstrap_interval(ours[:, c], theirs[:, c])
                difference = float((ours[:, c] - theirs[:, c]).mean()) if len(ours) else 0.0
                p = paired_bootstrap_p_value(ours[:, c], theirs[:, c])
                found.append(Comparison(system, reference, c, difference, low, high, p))
    return found


def with_holm(comparisons: Sequence[Comparison]) -> list[Comparison]:
    """The comparisons with `holm` set: Holm's adjusted p-values over all of them (one family,
    so a difference that survives at 0.05 survives having made every other comparison)."""
    adjusted = holm_adjusted([c.p for c in comparisons])
    return [
        dataclasses.replace(c, holm=float(a)) for c, a in zip(comparisons, adjusted, strict=True)
    ]


def by_pair(comparisons: Sequence[Comparison]) -> dict[tuple[str, str, int], Comparison]:
    """(system, reference, column) -> comparison, each pair in both orders: the mirror of
    (a, b) is (b, a) with the difference and interval negated, the same p-values."""
    found = {}
    for c in comparisons:
        found[(c.system, c.reference, c.column)] = c
        mirror = Comparison(c.reference, c.system, c.column, -c.difference, -c.high, -c.low,
                            c.p, c.holm)  # fmt: skip
        found.setdefault((c.reference, c.system, c.column), mirror)
    return found
