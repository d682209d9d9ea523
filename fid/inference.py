"""Batched reader inference: answer generation and passage scoring over a question set.

Questions are processed in batches of similar total length (sorted by their passage tokens), so
little padding is wasted; results come back in the input order.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from fid import distributed
from fid.data import Example, ReaderCollator, load_examples
from fid.evaluation import answer_metrics, describe_answer_metrics, exact_match, f1_score
from fid.fileio import atomic_paths, atomic_write_json, atomic_write_jsonl
from fid.logs import progress
from fid.reader import FiDReader

logger = logging.getLogger(__name__)


def _length_sorted_batches(
    collator: ReaderCollator, examples: Sequence[Example], batch_size: int
) -> list[list[int]]:
    """Batches of example indices, longest questions first (a too-large batch fails early)."""
    counts = collator.question_token_counts(examples)
    order = sorted(range(len(examples)), key=lambda i: -counts[i])
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def _progress(batches: list[list[int]], desc: str) -> Iterator[list[int]]:
    """The batches, with their questions counted in the progress log."""
    with progress(desc=desc, unit="questions", total=sum(map(len, batches)), log=logger) as bar:
        for batch in batches:
            yield batch
            bar.update(len(batch))


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
    """Per-question results: the prediction and, for labeled questions, its EM and F1 in
    percent (0 or 100, and 0 to 100), as in the metrics file, which holds their means."""
    records = []
    for example, prediction in zip(examples, predictions, strict=True):
        record: dict[str, Any] = {
            "id": example.id,
            "question": example.question,
            "prediction": prediction,
            "answers": example.answers,
        }
        if example.answers:
            record["exact_match"] = 100 * exact_match(prediction, example.answers)
            record["f1"] = 100 * f1_score(prediction, example.answers)
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


def _reader_and_collator(cfg, model_path: Path, device: torch.device):
    from fid.training.reader import load_reader

    reader, tokenizer = load_reader(str(model_path), cfg.encoder_buckets, cfg.pack_passages)
    reader.to(device).eval()
    reader.set_attention(cfg.attention, device)
    collator = ReaderCollator(
        tokenizer, cfg.n_passages, cfg.passage_max_tokens, pad_to_max_length=cfg.pad_to_max_length
    )
    return reader, tokenizer, collator


def evaluate_reader(
    cfg, model_path: Path, questions_path: Path, predictions_path: Path, metrics_path: Path,
    device: torch.device,
) -> dict:  # fmt: skip
    """`fid eval-reader`: predictions (jsonl, input order) and EM/F1 metrics (json).

    Each rank generates for its share of the questions; rank 0 writes both files. Questions
    without answers get predictions and no metric.
    """
    from fid.training.loop import autocast

    examples = load_examples(questions_path)
    reader, tokenizer, collator = _reader_and_collator(cfg, model_path, device)
    mine = [examples[i] for i in distributed.shard_indices(len(examples))]
    with torch.no_grad(), autocast(device, cfg.precision):
        local = generate_answers(
            reader, tokenizer, collator, mine, cfg.batch_size, cfg.max_answer_tokens,
            cfg.num_beams, device,
        )  # fmt: skip
    predictions = distributed.gather_in_order(len(examples), local)
    metrics = answer_metrics(predictions, [example.answers for example in examples])
    metrics["n_questions"] = len(examples)
    if distributed.is_main():
        # Both files or neither: a metrics write that fails leaves no predictions behind.
        with atomic_paths(predictions_path, metrics_path) as (predictions_tmp, metrics_tmp):
            atomic_write_jsonl(predictions_tmp, prediction_records(examples, predictions))
            atomic_write_json(metrics_tmp, metrics)
    if metrics["n_scored"] == 0:
        logger.warning("no question has gold answers: wrote predictions only, no metric")
    else:
        logger.info("%s", describe_answer_metrics(metrics))
    return metrics


def score_question_file(
    cfg, model_path: Path, questions_path: Path, output_path: Path, device: torch.device
) -> None:
    """`fid score-passages`: the question file with `reader_score` in every ctx (None for the
    ctxs the reader did not read). Each rank scores its share; rank 0 writes the file."""
    from fid.training.loop import autocast

    examples = load_examples(questions_path)
    reader, _, collator = _reader_and_collator(cfg, model_path, device)
    mine = [examples[i] for i in distributed.shard_indices(len(examples))]
    with torch.no_grad(), autocast(device, cfg.precision):
        local = score_passages(reader, collator, mine, cfg.batch_size, cfg.mode, device)
    scores = distributed.gather_in_order(len(examples), local)
    records = [
        with_reader_scores(example, example_scores, cfg.mode, cfg.n_passages)
        for example, example_scores in zip(examples, scores, strict=True)
    ]
    if distributed.is_main():
        atomic_write_json(output_path, records)
    logger.info("scored %d questions (%s) into %s", len(records), cfg.mode, output_path)
