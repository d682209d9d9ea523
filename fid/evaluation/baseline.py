"""`fid eval-baseline`: the exact match of always giving the most common training answer.

A floor for the reader's exact match: a reader that learned nothing from its passages but the
answers' distribution scores about this much.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

from fid.data.questions import load_questions
from fid.errors import DataError
from fid.metrics.answers import answer_metrics
from fid.runtime.console import CONSOLE
from fid.runtime.fileio import atomic_write_json

logger = logging.getLogger(__name__)


def eval_baseline(train_path: Path, questions_path: Path, output_path: Path) -> dict:
    """Scores the most common training answer (each question's first gold answer, counted over
    the training questions) as the prediction for every question of `questions_path`.

    Returns:
        answer_metrics' result with the answer, its training count and the question count.

    Raises:
        DataError: no training question has an answer.
    """
    counts = Counter(q["answers"][0] for q in load_questions(train_path) if q["answers"])
    if not counts:
        raise DataError(f"{train_path}: no training question has an answer")
    answer, count = counts.most_common(1)[0]
    questions = load_questions(questions_path)
    metrics = answer_metrics([answer] * len(questions), [q["answers"] for q in questions])
    metrics.update(answer=answer, train_count=count, n_questions=len(questions))
    atomic_write_json(output_path, metrics)
    logger.info("most common training answer %r: EM %.2f%% on %s",
                answer, metrics["exact_match"] or 0.0, questions_path, extra=CONSOLE)  # fmt: skip
    return metrics
