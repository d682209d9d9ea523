"""Answer metrics: SQuAD-normalized exact match and token F1 (pure Python, no torch).

Normalization as in the SQuAD v1.1 evaluation script and facebookresearch/FiD: lowercase,
remove punctuation, remove the articles a/an/the, collapse whitespace. A prediction is scored
against every gold answer and the best score counts.

Units: `exact_match` and `f1_score` score one question, 0 to 1 (SQuAD's script); everything the
project writes or logs is in percent, 0 to 100: the means of `answer_metrics`, the top-k
accuracy of `retrieval_accuracy`, the per-question scores of a predictions file (so their mean
is the metrics file's value) and the training's dev metrics. The metrics files say so
(`"unit": "percent"`) and log lines label the values ("EM 6.31%", `describe_*` below).
"""

from __future__ import annotations

import logging
import re
import string
from collections import Counter
from collections.abc import Sequence

logger = logging.getLogger(__name__)

UNIT = "percent"

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lowercase, strip punctuation and articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, answers: Sequence[str]) -> float:
    """1.0 if the normalized prediction equals any normalized gold answer, else 0.0."""
    normalized = normalize_answer(prediction)
    return float(any(normalized == normalize_answer(answer) for answer in answers))


def _token_f1(prediction: str, answer: str) -> float:
    predicted = normalize_answer(prediction).split()
    gold = normalize_answer(answer).split()
    if not predicted or not gold:
        # Both empty (e.g. the answer is "the") count as a match, as in SQuAD's script.
        return float(predicted == gold)
    common = sum((Counter(predicted) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision = common / len(predicted)
    recall = common / len(gold)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, answers: Sequence[str]) -> float:
    """Best token-overlap F1 of the prediction against the gold answers (0.0 if none)."""
    return max((_token_f1(prediction, answer) for answer in answers), default=0.0)


def answer_metrics(predictions: Sequence[str], answers: Sequence[Sequence[str]]) -> dict:
    """Mean exact match and F1 (in percent) over the questions that have gold answers.

    Returns:
        {"exact_match", "f1", "unit": "percent", "n_scored", "n_unlabeled"}; the means are None
        when no question has an answer.
    """
    scored = [(p, a) for p, a in zip(predictions, answers, strict=True) if a]
    n = len(scored)
    return {
        "exact_match": 100 * sum(exact_match(p, a) for p, a in scored) / n if n else None,
        "f1": 100 * sum(f1_score(p, a) for p, a in scored) / n if n else None,
        "unit": UNIT,
        "n_scored": n,
        "n_unlabeled": len(predictions) - n,
    }


def describe_answer_metrics(metrics: dict) -> str:
    """The log form of `answer_metrics`' result: "EM 6.31%, F1 10.20% over 300 questions"."""
    return (
        f"EM {metrics['exact_match']:.2f}%, F1 {metrics['f1']:.2f}% "
        f"over {metrics['n_scored']} questions"
    )
