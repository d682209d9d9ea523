"""Retrieval metrics: DPR's top-k accuracy (pure Python, no torch), in percent.

A question counts as answered at k when one of its first k passages contains a gold answer by
DPR's has-answer rule (fid.metrics.has_answer).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from fid.metrics.answers import UNIT
from fid.metrics.has_answer import AnswerMatcher
from fid.runtime.progress import progress

logger = logging.getLogger(__name__)


def topk_accuracy(hits: Sequence[Sequence[bool]], ks: Sequence[int]) -> dict[int, float]:
    """Retrieval top-k accuracy (in percent) as reported by DPR and FiD-KD.

    Args:
        hits: hits[q][r] says whether the passage at rank r (0 = best) of question q contains an
            answer. A question with fewer than k passages counts with the ones it has.
        ks: the cut-offs, each >= 1.

    Returns:
        {k: percent of questions with at least one hit in their first k passages}.

    Raises:
        ValueError: no questions, or a k below 1.
    """
    if len(hits) == 0:
        raise ValueError("no questions to score")
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"top-k cut-offs must be integers >= 1, got {k!r}")
    # The rank of each question's first hit decides every k at once.
    first_hits = [next((rank for rank, hit in enumerate(row) if hit), None) for row in hits]
    return {
        k: 100 * sum(rank is not None and rank < k for rank in first_hits) / len(hits) for k in ks
    }


def answer_hits(
    answers: Sequence[Sequence[str]],
    ctxs: Sequence[Sequence[dict]],
    mode: str = "string",
    recompute: bool = False,
) -> dict[int, list[bool]]:
    """Which ranked passages hold an answer, for each question that has answers.

    Args:
        answers: each question's gold answers (questions without any are left out).
        ctxs: each question's ranked passages; their `has_answer` flag (a bool, checked when
            the file was read) is used unless missing, null or `recompute`, else DPR's rule is applied to the passage text.
        mode: "string" (DPR) or "regex" (answers are patterns).

    Returns:
        {question's position: hits[r], whether the passage at rank r (0 = best) holds an answer}.
    """
    hits = {}
    pairs = progress(
        enumerate(zip(answers, ctxs, strict=True)), desc="has-answer", unit="questions",
        total=len(answers), log=logger,
    )  # fmt: skip
    for position, (gold, ranked) in pairs:
        if not gold:
            continue
        matcher = AnswerMatcher(gold, mode)
        hits[position] = [
            c["has_answer"]
            if c.get("has_answer") is not None and not recompute
            else matcher.matches(c["text"])
            for c in ranked
        ]
    return hits


def retrieval_accuracy(
    answers: Sequence[Sequence[str]],
    ctxs: Sequence[Sequence[dict]],
    ks: Sequence[int],
    mode: str = "string",
    recompute: bool = False,
) -> dict:
    """Top-k accuracy of ranked passages, over the questions that have answers.

    Args:
        answers, ctxs, mode, recompute: as in `answer_hits`.
        ks: the ranks reported.

    Returns:
        {"accuracy": {"k": percent or None}, "unit": "percent", "n_scored", "n_unlabeled"}.
    """
    hits = list(answer_hits(answers, ctxs, mode, recompute).values())
    accuracy = topk_accuracy(hits, ks) if hits else dict.fromkeys(ks)
    return {
        "accuracy": {str(k): value for k, value in accuracy.items()},
        "unit": UNIT,
        "n_scored": len(hits),
        "n_unlabeled": len(answers) - len(hits),
    }


def describe_retrieval_accuracy(metrics: dict) -> str:
    """The log form of `retrieval_accuracy`' result: "top-1 40.0%, top-5 62.5% over 200
    questions" (full-corpus retrieval: a passage among the top k holds an answer)."""
    table = ", ".join(
        f"top-{k} {value:.1f}%" for k, value in metrics["accuracy"].items() if value is not None
    )
    return f"{table} over {metrics['n_scored']} questions"
