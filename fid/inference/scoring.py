"""Passage scoring by the reader: the teacher of retriever distillation.

The reader's cross-attention at the first decoding step (FiD-KD's mean logit, or the attention
mass); with mode "pdist", the log-likelihood of the question's answer given each passage alone
(Atlas's perplexity distillation); with "loop", how much the answer's log-likelihood given all
the passages drops when one is left out (Atlas's leave-one-out perplexity distillation).

A batch that runs out of memory is redone in two halves, equal scores
(fid.runtime.oom_batch_halving).

`fid score-passages` writes each question file back with `reader_score` in every ctx: the
reader's score for the passages it read (`FiDReader.passage_scores`: the original's mean
pre-softmax logit, or the attention mass), None for the others, so no stale score survives.
FiD json comes back as FiD json, compact lists as compact lists with a `reader_score` column.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fid.data.examples import Example, ListExamples, load_examples, take
from fid.data.reader_batches import ReaderCollator
from fid.data.retrieval_lists import RetrievalLists, write_lists
from fid.errors import DataError
from fid.inference.batching import counted, length_sorted_batches, reader_and_collator
from fid.models.reader import FiDReader
from fid.runtime import distributed
from fid.runtime.fileio import atomic_write_json
from fid.runtime.oom_batch_halving import BatchSplitter
from fid.runtime.oom_injection import Injection
from fid.runtime.precision import autocast

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReadScores:
    """One question's reader scores, packed: `ctx_indices` (n,) int32 positions in its ctxs of
    the passages the reader read, `values` (n,) float32 their scores. Two small arrays instead
    of a dict of Python floats: ~8 bytes a passage rather than ~100, which is what rank 0
    holds for every question of a split (79k x 100 at NQ) until the file is written."""

    ctx_indices: np.ndarray
    values: np.ndarray

    def as_dict(self) -> dict[int, float]:
        return dict(zip(self.ctx_indices.tolist(), self.values.tolist(), strict=True))


def passage_scores(
    reader: FiDReader,
    collator: ReaderCollator,
    examples: Sequence[Example],
    batch_size: int,
    mode: str,
    device: torch.device,
    injection: Injection | None = None,
    per_answer_token: bool = False,
) -> list[ReadScores]:
    """Reader scores of the passages each question's reader input holds, in input order.

    A batch out of memory is redone in halves, the batch size lowered for the rest of the run
    (fid.runtime.oom_batch_halving; `injection`: its simulated failures). `per_answer_token`:
    pdist's and loop's log-likelihoods divided by the answer's length in tokens (Atlas's
    convention; ScorePassagesConfig.answer_log_likelihood "mean")."""
    scores: list[ReadScores | None] = [None] * len(examples)
    # PDist's and LOOP's answers, checked before any scoring: a question without one fails at once
    answers = [_answer(example, mode) for example in examples] if mode in ANSWER_MODES else None

    def prepare(indices):
        chosen = [examples[i] for i in indices]
        if answers is None:
            return collator(chosen)
        return collator(chosen, [answers[i] for i in indices])

    def forward(batch):
        batch = batch.to(device)
        if mode == "uniform":  # the control: no reader information, 0 for every read passage
            read = batch.attention_mask.sum(dim=-1) > 0  # (B, N) passage slots that hold one
            values = torch.zeros(read.shape).masked_fill(~read.cpu(), float("nan"))
        elif answers is None:
            values = reader.passage_scores(batch.input_ids, batch.attention_mask, mode)
        elif mode == "pdist":
            values = reader.answer_log_likelihoods(
                batch.input_ids, batch.attention_mask, batch.labels
            )
        else:
            values = reader.leave_one_out_log_likelihoods(
                batch.input_ids, batch.attention_mask, batch.labels
            )
        if answers is not None and per_answer_token:
            # (B, 1) answer tokens, EOS included: the labels' non-padding positions
            values = values / (batch.labels != -100).sum(dim=-1, keepdim=True)
        # (B, N) float: one score per passage slot; slots past a question's ctxs are padding
        return values.float().cpu(), batch.ctx_indices

    splitter = BatchSplitter(
        "score-passages", device, lambda i: f"question {examples[i].id!r}", batch_size, injection
    )
    batches = counted(length_sorted_batches(collator, examples, batch_size), "score", logger)
    for indices, (values, ctx_indices) in splitter.run(batches, prepare, forward):
        for row, i in enumerate(indices):
            read = ctx_indices[row]
            row_values = values[row, : len(read)].numpy().astype(np.float32)
            if np.isnan(row_values).any():
                raise RuntimeError(f"question {examples[i].id}: a read passage got no score")
            scores[i] = ReadScores(np.asarray(read, dtype=np.int32), row_values)
    return scores


# The modes whose teacher is the likelihood of the question's answer (Atlas's PDist, LOOP).
ANSWER_MODES = ("pdist", "loop")


def _answer(example: Example, mode: str) -> str:
    """The answer whose likelihood PDist and LOOP score: the record's `target`, else its first
    answer (one fixed answer, so that a question's teacher does not change between runs)."""
    if example.target is not None:
        return example.target
    if not example.answers:
        raise DataError(
            f"question {example.id!r}: mode {mode!r} scores the likelihood of its answer, but "
            "it has no `answers` (or `target`)"
        )
    return example.answers[0]


def with_reader_scores(
    example: Example, scores: dict[int, float], scoring: dict[str, Any]
) -> dict[str, Any]:
    """The example's record with `reader_score` in every ctx: a float for the passages the
    reader read, None for the others (so no stale score survives), and `reader_scoring`
    metadata saying how they were scored (`scoring`, and how many)."""
    record = dict(example.record)
    record["ctxs"] = [
        {**ctx, "reader_score": scores.get(i)} for i, ctx in enumerate(example.record["ctxs"])
    ]
    record["reader_scoring"] = {**scoring, "n_scored": len(scores)}
    return record


def scoring_of(cfg) -> dict[str, Any]:
    """How a ScorePassagesConfig scores, as the output records it: the mode, the passages read
    and, for the answer-likelihood modes, how the answer's tokens are totalled."""
    scoring = {"mode": cfg.mode, "n_passages": cfg.n_passages}
    if cfg.mode in ANSWER_MODES:
        scoring["answer_log_likelihood"] = cfg.answer_log_likelihood
    return scoring


def scored_lists(lists: RetrievalLists, scores: Sequence[ReadScores], scoring: dict):
    """Compact lists with a `reader_score` column (NaN, written as null, for the passages the
    reader did not read) and each question's `reader_scoring` metadata."""
    column = np.full(len(lists.passage_ids), np.nan, dtype=np.float64)  # (P,) all passages
    for q, read in enumerate(scores):
        column[lists.offsets[q] + read.ctx_indices] = read.values
    scored = lists.with_number_column("reader_score", column)
    scored.fields = [
        {**fields, "reader_scoring": {**scoring, "n_scored": len(read.values)}}
        for fields, read in zip(lists.fields, scores, strict=True)
    ]
    return scored


def score_passages(
    cfg,
    model_path: Path,
    questions_path: Path,
    output_path: Path,
    device: torch.device,
    passages_path: Path | None = None,
) -> None:
    """`fid score-passages`: the question file with `reader_score` in every ctx (None for the
    ctxs the reader did not read). Each rank scores its share; only rank 0 gathers the scores
    and writes the file, in the input's format (FiD json, or compact lists with a
    `reader_score` column: `passages_path` is then their passage store or TSV)."""
    examples = load_examples(questions_path, passages=passages_path)
    reader, _, collator = reader_and_collator(cfg, model_path, device)
    mine = take(examples, distributed.shard_indices(len(examples)))
    with torch.no_grad(), autocast(device, cfg.precision):
        local = passage_scores(
            reader, collator, mine, cfg.batch_size, cfg.mode, device,
            Injection.from_env(distributed.world()[0]),
            per_answer_token=cfg.answer_log_likelihood == "mean",
        )  # fmt: skip
    scores = distributed.gather_to_main(len(examples), local)
    if scores is not None:
        scoring = scoring_of(cfg)
        if isinstance(examples, ListExamples):
            write_lists(output_path, scored_lists(examples.lists, scores, scoring))
        else:
            records = (
                with_reader_scores(example, read.as_dict(), scoring)
                for example, read in zip(examples, scores, strict=True)
            )
            atomic_write_json(output_path, list(records))
    logger.info("scored %d questions (%s) into %s", len(examples), cfg.mode, output_path)
