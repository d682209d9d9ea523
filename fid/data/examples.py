"""FiD-format questions: loading with validation, reader batches, batching orders.

A question file is a json list or jsonl of records
`{id?, question, answers?, target?, ctxs: [{id, title, text, score?, ...}, ...]}` (the format of
facebookresearch/FiD), or compact retrieval lists (fid.data.retrieval_lists: passage ids and
scores, the text read from a passage store). Validation names the file, the record (and line)
and the field. Compact lists load as `ListExamples`, which build each `Example` (reading its
passages' text) only when it is asked for: a process holds the text of one batch, not of the
whole split.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from fid.data.json_records import JsonSyntaxError, parse_json_records
from fid.data.passage_store import PassageStore, open_passages
from fid.data.retrieval_lists import (
    RetrievalLists,
    is_compact_lists,
    read_lists,
    repeated_passages,
)
from fid.errors import DataError
from fid.text_files import read_text

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
    text = read_text(path, "FiD-format questions (json or jsonl)")
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
    has_answer = ctx.get("has_answer")
    if has_answer is not None and not isinstance(has_answer, bool):
        # bool("no") is True: a string flag would count as a hit in every metric
        raise DataError(
            f"{where}: ctxs[{index}].has_answer must be true or false (a JSON boolean) or "
            f"null, found {has_answer!r:.40}"
        )
    score = ctx.get("score")
    if score is not None:
        try:
            float(score)
        except (TypeError, ValueError):
            raise DataError(
                f"{where}: ctxs[{index}].score must be a number, got {score!r}"
            ) from None
    return ctx


def _question_fields(
    record: Any, where: str, require_answers: bool
) -> tuple[str, list[str], str | None]:
    """(question, answers, target) of a record, checked; DataError naming the field."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected an object, got {type(record).__name__}")
    question = record.get("question")
    if not isinstance(question, str) or not question.strip():
        found = "missing" if "question" not in record else repr(question)
        raise DataError(f"{where}: field 'question' must be a non-empty string, found {found}")
    answers = record.get("answers", [])
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
        raise DataError(f"{where}: field 'answers' must be a list of strings, got {answers!r:.80}")
    target = record.get("target")
    if target is not None and not isinstance(target, str):
        raise DataError(f"{where}: field 'target' must be a string, got {target!r:.80}")
    if require_answers and target is None and not answers:
        raise DataError(
            f"{where}: training needs a 'target' or a non-empty 'answers' list in every record"
        )
    return question, list(answers), target


def _check_new_id(id_: str, location: str, first_seen: dict[str, str], path: Path) -> None:
    if id_ in first_seen:
        # Outputs (predictions, scores, distillation targets) are keyed by question id.
        raise DataError(
            f"{path}: {location}: duplicate id {id_!r} (first in {first_seen[id_]}); "
            "question ids must be unique"
        )
    first_seen[id_] = location


def load_examples(
    path: str | Path,
    require_answers: bool = False,
    passages: PassageStore | str | Path | None = None,
) -> Sequence[Example]:
    """Loads and validates a FiD-format question file or compact retrieval lists.

    Args:
        path: a json list or jsonl file of FiD records, or compact lists.
        require_answers: every record must have a target or at least one answer (training).
        passages: the passage store that compact lists' ids refer to, or its folder (or TSV),
            opened only for compact lists (FiD records carry their text).

    Returns:
        The examples in file order: a list, or `ListExamples` for compact lists.

    Raises:
        DataError: naming the file, the record (and line) and the field that is wrong, or both
            records of an id that occurs twice; compact lists without a passage store, or with
            the store of another corpus.
    """
    path = Path(path)
    if is_compact_lists(path):
        return _load_list_examples(path, require_answers, passages)
    examples = []
    first_seen: dict[str, str] = {}  # id -> the location of its record
    repeated: list[tuple[str, str]] = []  # (question id, a passage id its list repeats)
    for position, (location, record) in enumerate(_read_records(path)):
        where = f"{path}: {location}"
        if isinstance(record, dict) and "id" in record:
            where += f" (id {record['id']!r})"
        question, answers, target = _question_fields(record, where, require_answers)
        ctxs = record.get("ctxs")
        if not isinstance(ctxs, list) or not ctxs:
            found = "missing" if "ctxs" not in record else f"{ctxs!r:.40}"
            raise DataError(
                f"{where}: field 'ctxs' must be a non-empty list of passages, found {found}. "
                "Hint: run a retrieval step first, or give each question its passages."
            )
        ctxs = [_check_ctx(ctx, where, i) for i, ctx in enumerate(ctxs)]
        id_ = str(record.get("id", position))
        passage_ids = [str(ctx["id"]) for ctx in ctxs if "id" in ctx]
        if len(set(passage_ids)) < len(passage_ids):
            repeated.append((id_, next(i for i in passage_ids if passage_ids.count(i) > 1)))
        _check_new_id(id_, location, first_seen, path)
        examples.append(
            Example(
                id=id_, question=question, answers=answers, target=target, ctxs=ctxs,
                record=record,
            )
        )  # fmt: skip
    if not examples:
        raise DataError(f"{path}: no question records found")
    if repeated:
        _warn_repeated(path, len(repeated), *repeated[0])
    return examples


def _warn_repeated(path: Path, n_questions: int, question: str, passage: str) -> None:
    logger.warning(
        "%s: %d question(s) name a passage more than once in their list (e.g. question %r, "
        "passage %r): each copy is read, scored and trained on as a passage of its own. "
        "Hint: remove the repeats where the lists were made", path, n_questions, question,
        passage,
    )  # fmt: skip


def _load_list_examples(
    path: Path, require_answers: bool, passages: PassageStore | str | Path | None
) -> ListExamples:
    if isinstance(passages, str | Path):
        passages = open_passages(passages)
    if passages is None:
        raise DataError(
            f"{path}: holds compact retrieval lists (passage ids without text). Hint: pass "
            "--passages with the passage store (fid build-passage-store) or TSV they index."
        )
    lists = read_lists(path)
    passages.check_lists(lists.corpus, str(path))
    first_seen: dict[str, str] = {}
    for q, record in enumerate(lists.fields):
        location = f"question {q} (line {q + 2})"
        where = f"{path}: {location}"
        _question_fields(record, where, require_answers)
        record["id"] = str(record.get("id", q))
        _check_new_id(record["id"], location, first_seen, path)
    if not len(lists):
        raise DataError(f"{path}: no question records found")
    n_repeating, first = repeated_passages(lists)
    if first is not None:
        _warn_repeated(path, n_repeating, lists.fields[first[0]]["id"], first[1])
    return ListExamples(lists, passages, str(path))


class ListExamples(Sequence[Example]):
    """The examples of compact lists, each built (its passages read) when it is indexed.

    Args:
        lists: the lists.
        passages: the store their ids refer to.
        source: the file they came from (for messages).
        positions: the questions of `lists` this sequence holds (all by default): slices and
            `subset` are views that read nothing.
    """

    def __init__(
        self,
        lists: RetrievalLists,
        passages: PassageStore,
        source: str,
        positions: Sequence[int] | None = None,
    ):
        self.lists = lists
        self.passages = passages
        self.source = source
        self.positions = range(len(lists)) if positions is None else positions

    def __len__(self) -> int:
        return len(self.positions)

    @overload
    def __getitem__(self, key: int) -> Example: ...
    @overload
    def __getitem__(self, key: slice) -> ListExamples: ...
    def __getitem__(self, key):
        if isinstance(key, slice):
            return ListExamples(self.lists, self.passages, self.source, self.positions[key])
        q = self.positions[key]
        fields = self.lists.fields[q]
        ctxs = self.lists.ctx_fields(q)
        texts = self.passages.get([ctx["id"] for ctx in ctxs], self.source)
        for ctx, passage in zip(ctxs, texts, strict=True):
            ctx["title"], ctx["text"] = passage.title, passage.text
        return Example(
            id=fields["id"], question=fields["question"], answers=list(fields.get("answers", [])),
            target=fields.get("target"), ctxs=ctxs, record=fields,
        )  # fmt: skip

    def subset(self, indices: Sequence[int]) -> ListExamples:
        """A view of the examples at these indices (of this sequence)."""
        return ListExamples(
            self.lists, self.passages, self.source, [self.positions[i] for i in indices]
        )


def without_passages(examples: Sequence[Example]) -> Sequence[Example]:
    """The examples for what needs no passage (answers, ids): compact lists' examples without
    their ctxs (reading no text), FiD records as they are."""
    if not isinstance(examples, ListExamples):
        return examples
    out = []
    for q in examples.positions:
        fields = examples.lists.fields[q]
        out.append(
            Example(
                id=fields["id"], question=fields["question"],
                answers=list(fields.get("answers", [])), target=fields.get("target"), ctxs=[],
                record=fields,
            )
        )  # fmt: skip
    return out


def take(examples: Sequence[Example], indices: Sequence[int]) -> Sequence[Example]:
    """The examples at `indices`: a lazy view for compact lists, a list otherwise."""
    if isinstance(examples, ListExamples):
        return examples.subset(indices)
    return [examples[i] for i in indices]


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
