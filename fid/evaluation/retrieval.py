"""`fid eval-retrieval`: top-k accuracy of retrieved lists (DPR's has-answer rule)."""

from __future__ import annotations

import logging
from pathlib import Path

from fid.config import EvalRetrievalConfig
from fid.data.examples import load_examples
from fid.errors import DataError, InputError
from fid.metrics.retrieval import describe_retrieval_accuracy, retrieval_accuracy
from fid.runtime.fileio import atomic_write_json

logger = logging.getLogger(__name__)


def eval_retrieval(cfg: EvalRetrievalConfig, questions_path: Path, output_path: Path) -> dict:
    """Writes the top-k accuracy of a FiD-format file's ranked ctxs to `output_path` (json).

    Returns:
        The metrics (`fid.metrics.retrieval.retrieval_accuracy`).

    Raises:
        DataError: a malformed question file, or an answer that is no valid regex (regex mode).
    """
    examples = load_examples(questions_path)
    try:
        metrics = retrieval_accuracy(
            [e.answers for e in examples],
            [e.ctxs for e in examples],
            cfg.ks,
            cfg.has_answer_mode,
            cfg.recompute_has_answer,
        )
    except InputError as error:  # an answer of the file is no valid regex (has_answer_mode)
        raise DataError(f"{questions_path}: {error}") from None
    atomic_write_json(output_path, metrics)
    if metrics["n_scored"] == 0:
        logger.warning("no question has gold answers: nothing to score (%s)", questions_path)
    else:
        logger.info("retrieval accuracy: %s", describe_retrieval_accuracy(metrics))
    return metrics
