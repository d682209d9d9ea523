"""Batched reader inference: answer generation and passage scoring over a question set.

Questions are processed in batches of similar total length (sorted by their passage tokens), so
little padding is wasted; results come back in the input order.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from tqdm import tqdm

from fid.data import Example, ReaderCollator
from fid.evaluation import exact_match, f1_score
from fid.reader import FiDReader

logger = logging.getLogger(__name__)


def _length_sorted_batches(
    collator: ReaderCollator, examples: Sequence[Example], batch_size: int
) -> list[list[int]]:
    """Batches of example indices, longest questions first (a too-large batch fails early)."""
    counts = collator.question_token_counts(examples)
    order = sorted(range(len(examples)), key=lambda i: -counts[i])
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def _progress(batches: list, desc: str) -> Iterator:
    return iter(tqdm(batches, desc=desc, unit="batch", disable=not sys.stderr.isatty()))


def generate_answers(
    reader: FiDReader,
    tokenizer,
    collator: ReaderCollator,
    examples: Sequence[Example],
    batch_size: int,
    max_answer_tokens: int,
    num_beams: int,
    device: torch.device,
) -> list[str]:
    """Generated answer strings, one per example, in input order."""
    predictions: list[str | None] = [None] * len(examples)
    batches = _length_sorted_batches(collator, examples, batch_size)
    for indices in _progress(batches, "generate"):
        batch = collator([examples[i] for i in indices]).to(device)
        output = reader.generate(
            batch.input_ids, batch.attention_mask, max_answer_tokens, num_beams
        )
        texts = tokenizer.batch_decode(output, skip_special_tokens=True)
        for i, text in zip(indices, texts, strict=True):
            predictions[i] = text.strip()
    return predictions


def prediction_records(examples: Sequence[Example], predictions: Sequence[str]) -> list[dict]:
    """Per-question results: the prediction and, for labeled questions, its EM and F1."""
    records = []
    for example, prediction in zip(examples, predictions, strict=True):
        record: dict[str, Any] = {
            "id": example.id,
            "question": example.question,
            "prediction": prediction,
            "answers": example.answers,
        }
        if example.answers:
            record["exact_match"] = exact_match(prediction, example.answers)
            record["f1"] = f1_score(prediction, example.answers)
        records.append(record)
    return records


def score_passages(
    reader: FiDReader,
    collator: ReaderCollator,
    examples: Sequence[Example],
    batch_size: int,
    mode: str,
    device: torch.device,
) -> list[dict[int, float]]:
    """Reader scores of the passages each question's reader input holds.

    Returns:
        For each example, {index into its ctxs: score} for the passages the reader read.
    """
    scores: list[dict[int, float] | None] = [None] * len(examples)
    batches = _length_sorted_batches(collator, examples, batch_size)
    for indices in _progress(batches, "score"):
        batch = collator([examples[i] for i in indices]).to(device)
        values = reader.passage_scores(batch.input_ids, batch.attention_mask, mode).cpu()
        for row, i in enumerate(indices):
            read = batch.ctx_indices[row]
            scores[i] = {ctx: float(values[row, n]) for n, ctx in enumerate(read)}
            if any(math.isnan(v) for v in scores[i].values()):
                raise RuntimeError(f"question {examples[i].id}: a read passage got no score")
    return scores


def with_reader_scores(
    example: Example, scores: dict[int, float], mode: str, n_passages: int
) -> dict[str, Any]:
    """The example's record with `reader_score` in every ctx: a float for the passages the
    reader read, None for the others (so no stale score survives), and `reader_scoring`
    metadata saying how they were scored."""
    record = dict(example.record)
    record["ctxs"] = [
        {**ctx, "reader_score": scores.get(i)} for i, ctx in enumerate(example.record["ctxs"])
    ]
    record["reader_scoring"] = {"mode": mode, "n_passages": n_passages, "n_scored": len(scores)}
    return record
