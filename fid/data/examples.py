"""FiD-format questions: loading with validation, reader batches, batching orders.

A question file is a json list or jsonl of records
`{id?, question, answers?, target?, ctxs: [{id, title, text, score?, ...}, ...]}` (the format of
facebookresearch/FiD). Validation names the file, the record (and line for jsonl) and the field.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fid.data.json_records import JsonSyntaxError, parse_json_records, read_utf8
from fid.errors import DataError

logger = logging.getLogger(__name__)


@dataclass
class Example:
    """One validated question record.

    Attributes:
        id: the record's id (its position when the file gives none).
        question: the question text.
        answers: gold answers; empty for unlabeled questions.
        target: the training target when the record fixes one.
        ctxs: the passages as in the file (dicts with at least title and text).
        record: the record as read, written back with new fields by `fid score-passages`.
    """

    id: str
    question: str
    answers: list[str]
    target: str | None
    ctxs: list[dict[str, Any]]
    record: dict[str, Any]


def _read_records(path: Path) -> list[tuple[str, Any]]:
    """Reads a json list or a jsonl file into (location, record) pairs."""
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    text = read_utf8(path, "a FiD-format question file (json or jsonl)")
    try:
        parsed = parse_json_records(text)
    except JsonSyntaxError as error:
        raise DataError(f"{path}: {error.where()}") from None
    if parsed.lines is not None:
        return [(f"record {i} (line {n})", record) for i, (n, record) in enumerate(parsed.lines)]
    if isinstance(parsed.document, list):
        return [(f"record {i}", record) for i, record in enumerate(parsed.document)]
    if isinstance(parsed.document, dict):  # a jsonl file of one record
        return [("record 0 (line 1)", parsed.document)]
    raise DataError(
        f"{path}: expected a json list or jsonl of question records, found a JSON "
        f"{type(parsed.document).__name__}"
    )


def _check_ctx(ctx: Any, where: str, index: int) -> dict[str, Any]:
    if not isinstance(ctx, dict):
        raise DataError(f"{where}: ctxs[{index}] must be an object, got {type(ctx).__name__}")
    for key in ("title", "text"):
        if not isinstance(ctx.get(key), str):
            found = "missing" if key not in ctx else f"a {type(ctx[key]).__name__}"
            raise DataError(f"{where}: ctxs[{index}].{key} must be a string, found {found}")
    score = ctx.get("score")
    if score is not None:
        try:
            float(score)
        except (TypeError, ValueError):
            raise DataError(
                f"{where}: ctxs[{index}].score must be a number, got {score!r}"
            ) from None
    return ctx


def load_examples(path: str | Path, require_answers: bool = False) -> list[Example]:
    """Loads and validates a FiD-format question file.

    Args:
        path: a json list or jsonl file.
        require_answers: every record must have a target or at least one answer (training).

    Returns:
        The examples in file order.

    Raises:
        DataError: naming the file, the record (and line) and the field that is wrong, or both
            records of an id that occurs twice.
    """
    path = Path(path)
    examples = []
    first_seen: dict[str, str] = {}  # id -> the location of its record
    for position, (location, record) in enumerate(_read_records(path)):
        where = f"{path}: {location}"
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected an object, got {type(record).__name__}")
        if "id" in record:
            where += f" (id {record['id']!r})"
        question = record.get("question")
        if not isinstance(question, str) or not question.strip():
            found = "missing" if "question" not in record else repr(question)
            raise DataError(f"{where}: field 'question' must be a non-empty string, found {found}")
        answers = record.get("answers", [])
        if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
            raise DataError(
                f"{where}: field 'answers' must be a list of strings, got {answers!r:.80}"
            )
        target = record.get("target")
        if target is not None and not isinstance(target, str):
            raise DataError(f"{where}: field 'target' must be a string, got {target!r:.80}")
        if require_answers and target is None and not answers:
            raise DataError(
                f"{where}: training needs a 'target' or a non-empty 'answers' list in every record"
            )
        ctxs = record.get("ctxs")
        if not isinstance(ctxs, list) or not ctxs:
            found = "missing" if "ctxs" not in record else f"{ctxs!r:.40}"
            raise DataError(
                f"{where}: field 'ctxs' must be a non-empty list of passages, found {found}. "
                "Hint: run a retrieval step first, or give each question its passages."
            )
        ctxs = [_check_ctx(ctx, where, i) for i, ctx in enumerate(ctxs)]
        id_ = str(record.get("id", position))
        if id_ in first_seen:
            # Outputs (predictions, scores, distillation targets) are keyed by question id.
            raise DataError(
                f"{path}: {location}: duplicate id {id_!r} (first in {first_seen[id_]}); "
                "question ids must be unique"
            )
        first_seen[id_] = location
        examples.append(
            Example(
                id=id_,
                question=question,
                answers=list(answers),
                target=target,
                ctxs=ctxs,
                record=record,
            )
        )
    if not examples:
        raise DataError(f"{path}: no question records found")
    return examples


def top_passages(example: Example, n_passages: int) -> list[int]:
    """Indices of the passages the reader reads: the top `n_passages` by score.

    When any ctx lacks a score the file order is kept (files from retrievers are sorted).
    Ties keep file order.
    """
    indices = list(range(len(example.ctxs)))
    if all(ctx.get("score") is not None for ctx in example.ctxs):
        indices.sort(key=lambda i: -float(example.ctxs[i]["score"]))
    return indices[:n_passages]


def choose_target(example: Example, seed: int, epoch: int) -> str:
    """The training target: the record's `target`, else one of its answers drawn reproducibly.

    The draw depends only on (seed, epoch, example id), so a resumed run draws the same answers.
    """
    if example.target is not None:
        return example.target
    if len(example.answers) == 1:
        return example.answers[0]
    rng = random.Random(f"{seed}/{epoch}/{example.id}")
    return rng.choice(example.answers)
