"""`fid eval-reader`: a reader's generated answers, scored by exact match and F1."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from fid.config import EvalReaderConfig
from fid.data.examples import Example, load_examples, take, without_passages
from fid.inference.batching import reader_and_collator
from fid.inference.generation import generate_answers
from fid.metrics.answers import answer_metrics, describe_answer_metrics, exact_match, f1_score
from fid.runtime import distributed
from fid.runtime.console import CONSOLE
from fid.runtime.fileio import atomic_paths, atomic_write_json, atomic_write_jsonl
from fid.runtime.oom_injection import Injection
from fid.runtime.precision import autocast, resolve_precision

logger = logging.getLogger(__name__)

# EvalReaderConfig's passage pruning and token elimination knobs, recorded in the metrics
ACCELERATION_KEYS = tuple(f.name for f in fields(EvalReaderConfig) if f.name.startswith("keep_"))


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


def eval_reader(
    cfg, model_path: Path, questions_path: Path, predictions_path: Path, metrics_path: Path,
    device: torch.device, passages_path: Path | None = None,
) -> dict | None:  # fmt: skip
    """`fid eval-reader`: predictions (jsonl, input order) and EM/F1 metrics (json).

    Each rank generates for its share of the questions; rank 0 alone gathers the predictions,
    writes both files and returns the metrics (other ranks: None). Questions without answers
    get predictions and no metric. `passages_path`: the passage store (or TSV) of compact lists.
    """
    examples = load_examples(questions_path, passages=passages_path)
    reader, tokenizer, collator = reader_and_collator(cfg, model_path, device)
    # "auto": bf16 on a GPU, and on a CPU that computes it natively for a model wide enough
    precision = resolve_precision(cfg.precision, device, reader.t5.config.d_model)
    logger.info("generating in %s (precision: %s)", precision, cfg.precision)
    mine = take(examples, distributed.shard_indices(len(examples)))
    started, started_cpu = time.perf_counter(), time.process_time()
    with torch.no_grad(), autocast(device, precision):
        local = generate_answers(
            reader, tokenizer, collator, mine, cfg.eval_batch_size, cfg.max_new_tokens,
            cfg.num_beams, device, acceleration=cfg, command="eval-reader",
            injection=Injection.from_env(distributed.world()[0]),
        )  # fmt: skip
    # This rank's generation speed (its share of the questions): the Pareto plot's x axis
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - started_cpu
    predictions = distributed.gather_to_main(len(examples), local)
    if predictions is None:
        return None
    questions = without_passages(examples)
    metrics = answer_metrics(predictions, [example.answers for example in questions])
    metrics["n_questions"] = len(examples)
    threads = torch.get_num_threads()
    metrics["generation"] = {
        "questions_per_second": len(mine) / seconds if seconds > 0 else None,
        "cpu_seconds_per_question": cpu_seconds / len(mine) if len(mine) else None,
        # The share of its threads' time the process got: well under 1 on a loaded machine,
        # where the wall-clock figure above measures the load, not the reader (the CPU time per
        # question does not). On a GPU the host waits on the device: low there, and harmless.
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "threads": threads,
        "cpu_share": cpu_seconds / (seconds * threads) if seconds > 0 else None,
        "precision": precision,
        "acceleration": {
            key: getattr(cfg, key) for key in ACCELERATION_KEYS if getattr(cfg, key) is not None
        } if cfg.accelerated else None,
    }  # fmt: skip
    # Both files or neither: a metrics write that fails leaves no predictions behind.
    with atomic_paths(predictions_path, metrics_path) as (predictions_tmp, metrics_tmp):
        atomic_write_jsonl(predictions_tmp, prediction_records(questions, predictions))
        atomic_write_json(metrics_tmp, metrics)
    if metrics["n_scored"] == 0:
        logger.warning("no question has gold answers: wrote predictions only, no metric")
    else:
        logger.info("%s", describe_answer_metrics(metrics), extra=CONSOLE)
    return metrics
