"""Whether a run may resume its checkpoint under the current config.

Every checkpoint stores the config it was trained with. A run resumed under other values of the
knobs that set the data, the shapes, the optimisation or the choice of best_dev would be neither
the old run nor the new one, and nothing would say so: those changes are refused, each key named
with its old and new value. Knobs that set only when things are logged, evaluated or saved, or
how fast and in how much memory the same computation runs, may change (a warning names them).
Every key of every training config is in exactly one list (a test checks it); a key in neither
is refused, so a knob added without a decision is safe.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from pathlib import Path
from typing import Any

import torch

from fid.config import ConfigError

logger = logging.getLogger(__name__)

REFUSED = frozenset({
    # TrainingConfig: data order, batches, optimisation and schedule
    "seed", "max_steps", "batch_size_per_device", "max_tokens_per_batch",
    "gradient_accumulation_steps", "lr", "weight_decay", "scheduler", "warmup_steps",
    "min_lr_ratio", "clip_grad_norm",
    "sharding",  # the checkpoint's format (sharded or whole) follows it
    "precision",  # the numerics of every step, and whether a loss scaler exists
    # ReaderTrainConfig: inputs, targets, model; dev metrics that best_dev is compared on
    "n_passages", "passage_max_tokens", "target_max_tokens", "dropout",
    "eval_max_questions", "max_new_tokens", "num_beams",
    "light_tokens", "cross_attention_every",  # the model variant (fid.models.reader_variants)
    # RetrieverTrainConfig: inputs, model, loss; the metric best_dev is chosen on
    "score_key", "question_max_tokens", "pooling", "projection_dim", "shared_encoder",
    "input_format", "query_prefix", "passage_prefix", "normalize", "project_tokens",
    "objective", "kl_reduction", "decay_biases_and_norms",
    "reader_temperature", "retriever_temperature", "in_batch_negatives", "select_on",
    "train_n_passages",
})  # fmt: skip

WARNED = frozenset({
    # cadences and bookkeeping
    "log_every_steps", "eval_every_steps", "save_every_steps", "save_every_minutes",
    "keep_last_checkpoints", "tensorboard",
    "eval_k",  # which ranks dev reports; the one best_dev is chosen on is `select_on`
    # the same computation, faster or in less memory (equal up to rounding)
    "activation_checkpointing", "attention", "encoder_buckets", "pack_passages",
    "pad_to_max_length", "batch_size", "eval_batch_size", "fsdp_gradient_sync",
    "deterministic",  # the same sums in a fixed order
    "max_skipped_steps_in_a_row",  # when a diverged run stops
})  # fmt: skip

_ABSENT = object()  # a key the checkpoint's config (an older version) does not have


def input_fingerprints(inputs: dict[str, str | Path]) -> dict[str, dict[str, Any]]:
    """Path, size and sha256 of each data file a run trains on (name -> fingerprint).

    A run resumed on other data would be neither run, and the file's path says nothing (the
    same path may hold new data; a copy elsewhere is the same data), so the content decides.
    Hashing reads each file once (sha256 runs at ~1.2 GB/s here: seconds at NQ scale).
    """
    fingerprints = {}
    for name, path in inputs.items():
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while block := handle.read(1 << 24):
                digest.update(block)
        size = Path(path).stat().st_size
        fingerprints[name] = {"path": str(path), "bytes": size, "sha256": digest.hexdigest()}
    return fingerprints


def check_resume_inputs(
    saved: dict[str, dict[str, Any]] | None, current: dict[str, dict[str, Any]], source: str | Path
) -> None:
    """Refuses to resume a checkpoint trained on other data files (by content).

    Args:
        saved: `input_fingerprints` stored with the checkpoint (None: an older fid recorded none).
        current: the fingerprints of this run's inputs.
        source: the checkpoint, for messages.

    Raises:
        ConfigError: naming each input whose content changed, with both paths.
    """
    changed = [
        f"{name}: {saved[name]['path']} ({saved[name]['bytes']} bytes) -> {now['path']} "
        f"({now['bytes']} bytes, other content)"
        for name, now in current.items()
        if saved and name in saved and saved[name].get("sha256") != now["sha256"]
    ]
    if changed:
        raise ConfigError(
            f"{source} was trained on other data; resuming on {'; '.join(changed)} would mix "
            "two runs. Hint: give the run its original files, or start afresh with another "
            "--state-dir"
        )


def saved_config(checkpoint: str | Path) -> dict[str, Any]:
    """The config stored in a checkpoint, read without loading its tensors (memory-mapped)."""
    state = torch.load(
        Path(checkpoint) / "training_state.pt", weights_only=True, mmap=True, map_location="cpu"
    )
    return state["config"]


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return _ABSENT


def check_resume_config(saved: dict[str, Any], current: Any, source: str | Path) -> list[str]:
    """Compares a checkpoint's config with the current one.

    Args:
        saved: the config stored in the checkpoint (`config_to_dict` of the run that wrote it;
            keys renamed since are read under their new names).
        current: the current config dataclass.
        source: the checkpoint, for messages.

    Returns:
        The allowed changes, as `key: old -> new` (the caller warns). Keys of the checkpoint
        that the current config no longer has are ignored.

    Raises:
        ConfigError: naming every refused change with its old and new value.
    """
    renamed = getattr(type(current), "renamed_keys", {})
    saved = {renamed.get(key, key): value for key, value in saved.items()}
    refused, allowed = [], []
    for field in dataclasses.fields(current):
        new = getattr(current, field.name)
        if field.name in saved:
            old = saved[field.name]
            shown = repr(old)
        else:  # a knob newer than the checkpoint: its run had the default
            old = _default(field)
            shown = "(absent" + ("" if old is _ABSENT else f", default {old!r}") + ")"
        if old == new:
            continue
        change = f"{field.name}: {shown} -> {new!r}"
        (allowed if field.name in WARNED else refused).append(change)
    if refused:
        raise ConfigError(
            f"{source} was trained with another config; resuming under {'; '.join(refused)} "
            f"would mix two runs. Hint: restore those values, or start afresh with another "
            f"--state-dir"
        )
    return allowed
