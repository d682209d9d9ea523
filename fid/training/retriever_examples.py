"""What the retriever trains on: each question with the passages the reader scored
(DistillationExample), its `n_passages` best by the teacher score, as the original's Dataset
sorts by the reader's score and keeps the top n_context; a list for FiD records, a lazy sequence
for compact lists (a batch's passages read when it is built)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fid.data.examples import Example, ListExamples
from fid.errors import DataError
from fid.metrics.has_answer import AnswerMatcher


@dataclass
class DistillationExample:
    """A question with the passages the reader scored.

    Attributes:
        question: the question text.
        titles, texts: the N scored passages.
        teacher: (N,) reader scores.
        has_answer: N flags (None when the question has no answers).
        id: the question's id in its file (for messages).
    """

    question: str
    titles: list[str]
    texts: list[str]
    teacher: torch.Tensor
    has_answer: list[bool] | None
    id: str = ""


def distillation_example(
    example: Example, n_passages: int, score_key: str, source: str
) -> DistillationExample:
    """The scored passages of a question: the `n_passages` with the highest `score_key` (ties
    in file order), as the original's Dataset sorts by the reader's score and keeps the top
    n_context."""
    scored = [c for c in example.ctxs if c.get(score_key) is not None]
    ctxs = sorted(scored, key=lambda c: -float(c[score_key]))[:n_passages]
    if not ctxs:
        raise DataError(
            f"{source}: question {example.id!r} has no ctx with a '{score_key}' value. "
            "Hint: run `fid score-passages` on this file first."
        )
    flags = None
    if example.answers:
        matcher = AnswerMatcher(example.answers)
        flags = [
            c["has_answer"] if c.get("has_answer") is not None else matcher.matches(c["text"])
            for c in ctxs
        ]
    return DistillationExample(
        question=example.question,
        titles=[c["title"] for c in ctxs],
        texts=[c["text"] for c in ctxs],
        teacher=torch.tensor([float(c[score_key]) for c in ctxs]),
        has_answer=flags,
        id=example.id,
    )


class LazyDistillation(Sequence[DistillationExample]):
    """The distillation examples of compact lists, each built (its passages read) when indexed,
    so a process holds the text of one batch, not of the split."""

    def __init__(self, examples: ListExamples, n_passages: int, score_key: str, source: str):
        self.examples = examples
        self.args = (n_passages, score_key, source)

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, key):
        if isinstance(key, slice):
            return LazyDistillation(self.examples[key], *self.args)
        return distillation_example(self.examples[key], *self.args)

    def subset(self, indices: Sequence[int]) -> LazyDistillation:
        """A view of the examples at these indices."""
        return LazyDistillation(self.examples.subset(indices), *self.args)


def distillation_examples(
    examples: Sequence[Example], n_passages: int, score_key: str, source: str
) -> Sequence[DistillationExample]:
    """Every question's `distillation_example`: a list for FiD records, a lazy sequence for
    compact lists (checked now, from the score column alone).

    Raises:
        DataError: a question without a `score_key` value (naming it and the file).
    """
    if not isinstance(examples, ListExamples):
        return [distillation_example(e, n_passages, score_key, source) for e in examples]
    lists = examples.lists
    column = lists.columns.get(score_key)
    for q in examples.positions:
        start, end = lists.offsets[q], lists.offsets[q + 1]
        if column is None or all(column.get(p) is None for p in range(start, end)):
            raise DataError(
                f"{source}: question {lists.fields[q]['id']!r} has no passage with a "
                f"'{score_key}' value. Hint: run `fid score-passages` on this file first."
            )
    return LazyDistillation(examples, n_passages, score_key, source)
