"""FiD-format questions: loading with validation, reader batches, batching orders.

A question file is a json list or jsonl of records
`{id?, question, answers?, target?, ctxs: [{id, title, text, score?, ...}, ...]}` (the format of
facebookresearch/FiD). Validation names the file, the record (and line for jsonl) and the field.
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fid.errors import InputError

logger = logging.getLogger(__name__)


class DataError(InputError):
    """A data file is missing or does not hold what the format promises."""


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


def read_utf8(path: Path, expected: str) -> str:
    """The text of a file, or a DataError naming it (and the byte) when it is not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DataError(
            f"{path}: not UTF-8 text ({error.reason} at byte {error.start}): expected {expected}"
        ) from None


def _read_records(path: Path) -> list[tuple[str, Any]]:
    """Reads a json list or a jsonl file into (location, record) pairs."""
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    text = read_utf8(path, "a FiD-format question file (json or jsonl)")
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as error:
            raise DataError(
                f"{path}: invalid JSON at line {error.lineno} column {error.colno}: {error.msg}"
            ) from None
        return [(f"record {i}", record) for i, record in enumerate(records)]
    pairs = []
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(
                f"{path}: line {line_number}: invalid JSON at column {error.colno}: {error.msg}"
            ) from None
        pairs.append((f"record {len(pairs)} (line {line_number})", record))
    return pairs


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


def passage_text(question: str, ctx: dict[str, Any]) -> str:
    """The reader input of one passage, as in the original FiD."""
    return f"question: {question} title: {ctx['title']} context: {ctx['text']}"


@dataclass
class ReaderBatch:
    """A batch of B questions with N passage slots of at most L tokens each.

    Attributes:
        question_ids: B record ids.
        input_ids: (B, N, L) token ids, right-padded; padding slots are all padding.
        attention_mask: (B, N, L) 1 for real tokens.
        passage_mask: (B, N) True for real passages (False for slots of a question that has
            fewer than N passages).
        ctx_indices: for each question, the indices into its `ctxs` of passages 0..n-1.
        labels: (B, A) target ids with EOS, -100 where padded; None when not training.
    """

    question_ids: list[str]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    passage_mask: torch.Tensor
    ctx_indices: list[list[int]]
    labels: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> ReaderBatch:
        """The same batch with its tensors on `device`."""
        return ReaderBatch(
            question_ids=self.question_ids,
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            passage_mask=self.passage_mask.to(device),
            ctx_indices=self.ctx_indices,
            labels=None if self.labels is None else self.labels.to(device),
        )

    @property
    def n_tokens(self) -> int:
        """Real passage tokens in the batch."""
        return int(self.attention_mask.sum())


class ReaderCollator:
    """Turns examples (and optional targets) into a `ReaderBatch`.

    Args:
        tokenizer: a Hugging Face tokenizer of the reader.
        n_passages: passage slots per question (top by score; missing ones are masked).
        passage_max_tokens: tokens kept per passage input (truncated beyond).
        answer_max_tokens: when set, targets are padded or truncated to exactly this length.
        pad_to_max_length: pad L to `passage_max_tokens` instead of the batch's longest.
    """

    def __init__(
        self,
        tokenizer,
        n_passages: int,
        passage_max_tokens: int,
        answer_max_tokens: int | None = None,
        pad_to_max_length: bool = False,
    ):
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the reader's tokenizer needs a pad token and an EOS token")
        self.tokenizer = tokenizer
        self.n_passages = n_passages
        self.passage_max_tokens = passage_max_tokens
        self.answer_max_tokens = answer_max_tokens
        self.pad_to_max_length = pad_to_max_length

    def _encode(self, texts: list[str], max_tokens: int) -> list[list[int]]:
        # No special tokens: the original encoded passages without EOS.
        encoded = self.tokenizer(
            texts, add_special_tokens=False, truncation=True, max_length=max_tokens
        )["input_ids"]
        return [list(ids) for ids in encoded]

    def encode_targets(self, targets: Sequence[str]) -> torch.Tensor:
        """(B, A) label ids: answer tokens + EOS, -100 where padded."""
        eos = self.tokenizer.eos_token_id
        limit = self.answer_max_tokens
        rows = [
            ids[: limit - 1] + [eos] if limit else ids + [eos]
            for ids in self._encode(list(targets), max_tokens=10_000)
        ]
        width = limit or max(len(row) for row in rows)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        for i, row in enumerate(rows):
            labels[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        return labels

    def __call__(
        self, examples: Sequence[Example], targets: Sequence[str] | None = None
    ) -> ReaderBatch:
        ctx_indices = [top_passages(example, self.n_passages) for example in examples]
        texts = [
            passage_text(example.question, example.ctxs[i])
            for example, indices in zip(examples, ctx_indices, strict=True)
            for i in indices
        ]
        encoded = iter(self._encode(texts, self.passage_max_tokens))
        n_slots = self.n_passages
        rows = [[next(encoded) for _ in indices] for indices in ctx_indices]
        longest = max(len(ids) for row in rows for ids in row)
        length = self.passage_max_tokens if self.pad_to_max_length else longest
        pad = self.tokenizer.pad_token_id
        input_ids = torch.full((len(examples), n_slots, length), pad, dtype=torch.long)
        attention_mask = torch.zeros((len(examples), n_slots, length), dtype=torch.long)
        passage_mask = torch.zeros((len(examples), n_slots), dtype=torch.bool)
        for b, row in enumerate(rows):
            for n, ids in enumerate(row):
                input_ids[b, n, : len(ids)] = torch.tensor(ids, dtype=torch.long)
                attention_mask[b, n, : len(ids)] = 1
                passage_mask[b, n] = len(ids) > 0
        return ReaderBatch(
            question_ids=[example.id for example in examples],
            input_ids=input_ids,
            attention_mask=attention_mask,
            passage_mask=passage_mask,
            ctx_indices=ctx_indices,
            labels=None if targets is None else self.encode_targets(targets),
        )

    def question_token_counts(self, examples: Sequence[Example], chunk: int = 256) -> list[int]:
        """Passage tokens each question contributes to a batch (for token-budget batching)."""
        counts = []
        for start in range(0, len(examples), chunk):
            part = examples[start : start + chunk]
            texts = [
                passage_text(example.question, example.ctxs[i])
                for example in part
                for i in top_passages(example, self.n_passages)
            ]
            lengths = iter(len(ids) for ids in self._encode(texts, self.passage_max_tokens))
            for example in part:
                n = len(top_passages(example, self.n_passages))
                counts.append(sum(next(lengths) for _ in range(n)))
        return counts


def epoch_batches(
    n_examples: int,
    batch_size: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    token_counts: Sequence[int] | None = None,
    max_tokens: int | None = None,
) -> list[list[int]]:
    """The batches of one epoch as lists of example indices, reproducible from (seed, epoch).

    With `max_tokens`, questions are grouped so that a batch's passage tokens stay within the
    budget: the epoch's shuffled order is cut into pools of ~100 batches, each pool is sorted by
    length and cut greedily (so batches hold questions of similar size), and the batches are
    shuffled again. A question longer than the budget forms a batch of its own.
    """
    order = list(range(n_examples))
    rng = random.Random(f"{seed}/epoch/{epoch}")
    if shuffle:
        rng.shuffle(order)
    if max_tokens is None:
        return [order[i : i + batch_size] for i in range(0, n_examples, batch_size)]
    if token_counts is None or len(token_counts) != n_examples:
        raise ValueError("token-budget batching needs one token count per example")
    mean = max(1.0, sum(token_counts) / max(1, n_examples))
    pool_size = max(1, math.ceil(100 * max_tokens / mean))
    batches: list[list[int]] = []
    for start in range(0, n_examples, pool_size):
        pool = sorted(order[start : start + pool_size], key=lambda i: token_counts[i])
        batch: list[int] = []
        used = 0
        for index in pool:
            if batch and used + token_counts[index] > max_tokens:
                batches.append(batch)
                batch, used = [], 0
            batch.append(index)
            used += token_counts[index]
        if batch:
            batches.append(batch)
    if shuffle:
        rng.shuffle(batches)
    return batches
