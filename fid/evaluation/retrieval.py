"""`fid eval-retrieval`: top-k accuracy of retrieved lists (DPR's has-answer rule)."""

from __future__ import annotations

import logging
from pathlib import Path

from fid.config import EvalRetrievalConfig
from fid.data.examples import load_examples
from fid.data.retrieval_lists import is_compact_lists, read_lists
from fid.errors import DataError, InputError
from fid.metrics.retrieval import answer_hits, describe_retrieval_accuracy, retrieval_accuracy
from fid.runtime.console import CONSOLE
from fid.runtime.fileio import atomic_write_json

logger = logging.getLogger(__name__)


def _ranked_ctxs(questions_path: Path, passages_path: Path | None, need_text: bool):
    """(ids, answers, ctxs) of every question. Compact lists give ctxs without text (their
    `has_answer` column is enough) unless the text is needed, which takes the passages."""
    if not is_compact_lists(questions_path) or need_text:
        examples = load_examples(questions_path, passages=passages_path)
        return [e.id for e in examples], [e.answers for e in examples], [e.ctxs for e in examples]
    lists = read_lists(questions_path)
    ctxs = [lists.ctx_fields(q) for q in range(len(lists))]
    if any(ctx.get("has_answer") is None for ranked in ctxs for ctx in ranked):
        return _ranked_ctxs(questions_path, passages_path, need_text=True)
    ids = [str(f["id"]) for f in lists.fields]
    return ids, [list(f.get("answers", [])) for f in lists.fields], ctxs


def first_hit_ranks(
    cfg: EvalRetrievalConfig, questions_path: Path, passages_path: Path | None = None
) -> dict[str, int | None]:
    """Each labeled question's rank (0 = best) of its first passage holding an answer, None
    when none of its passages does, by the has-answer rule of `fid eval-retrieval` (cfg): the
    per-question scores behind its top-k accuracy (paired comparisons of two retrievers).

    Returns:
        {question id: rank or None}, in the file's order.

    Raises:
        DataError: as `eval_retrieval`.
    """
    ids, answers, ctxs = _ranked_ctxs(questions_path, passages_path, cfg.recompute_has_answer)
    try:
        hits = answer_hits(answers, ctxs, cfg.has_answer_mode, cfg.recompute_has_answer)
    except InputError as error:  # an answer of the file is no valid regex (has_answer_mode)
        raise DataError(f"{questions_path}: {error}") from None
    return {ids[q]: next((r for r, hit in enumerate(row) if hit), None) for q, row in hits.items()}


def eval_retrieval(
    cfg: EvalRetrievalConfig,
    questions_path: Path,
    output_path: Path,
    passages_path: Path | None = None,
) -> dict:
    """Writes the top-k accuracy of ranked lists (FiD json or compact) to `output_path` (json).

    Compact lists are scored by their has_answer column; their passages' text (`passages_path`)
    is needed only to recompute it or where it is missing.

    Returns:
        The metrics (`fid.metrics.retrieval.retrieval_accuracy`).

    Raises:
        DataError: a malformed question file, or an answer that is no valid regex (regex mode).
    """
    _, answers, ctxs = _ranked_ctxs(questions_path, passages_path, cfg.recompute_has_answer)
    try:
        metrics = retrieval_accuracy(
            answers,
            ctxs,
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
        logger.info("retrieval accuracy: %s", describe_retrieval_accuracy(metrics), extra=CONSOLE)
    return metrics
