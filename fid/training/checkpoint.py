"""Training checkpoints: atomic, complete, resumable, loadable with `weights_only=True`.

Layout of a state folder:

    step-N/            one complete checkpoint per saved step (the last K are kept)
        model.safetensors       weights (shared tensors stored once)
        training_state.pt       optimizer, scheduler, scaler, RNG states, data position, best
                                dev metric, the run's config: plain types and tensors only
        manifest.json           {"format", "checksum", "files": {path: {"bytes", <checksum>}}}
    latest -> step-N   relative symlink to the newest step (never to best_dev)
    best_dev/          the model (in its final, loadable format) with the best dev metric
    metrics.jsonl, tensorboard/, train.log

Each `step-N` folder is built under a temporary name and renamed when complete, and its last
file, `manifest.json`, lists every other file with its size and checksum. Resume takes the
highest N, whatever `latest` says, that verifies against its manifest and loads; a damaged one
(a disk or copy that flipped or lost bytes, a file edited by hand) is skipped with a warning, and
the run goes on from the one before it, so it ends as if it had never been damaged.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import re
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model
from torch import nn

from fid.errors import CheckpointError
from fid.runtime import distributed
from fid.runtime.fileio import atomic_directory, warn_if_short_of_space
from fid.training.manifest import (
    MANIFEST,
    check_checksums,
    check_listing,
    read_manifest,
    seal_checkpoint,
)

logger = logging.getLogger(__name__)

# What a damaged file raises while it loads: a bad header or pickle, a short read, a broken zip
# (RuntimeError), a state dict that does not fit the model or optimizer (ValueError, KeyError).
_LOAD_ERRORS = (
    SafetensorError, pickle.UnpicklingError, EOFError, OSError, RuntimeError, ValueError,
    KeyError, TypeError, IndexError,
)  # fmt: skip
# training_state.pt: what every checkpoint holds, and the progress fields without which a resume
# would restart the data or forget best_dev (TrainingProgress's defaults would hide their loss).
_STATE_KEYS = ("progress", "optimizer", "scheduler", "scaler", "rng", "config")
_PROGRESS_KEYS = ("step", "epoch", "batch_in_epoch", "best_metric", "best_step")


_STEP_DIR = re.compile(r"^step-(\d+)$")
SHARDED_DIR = (
    "sharded"  # FSDP checkpoints: model and optimizer shards (torch.distributed.checkpoint)
)


@dataclass
class TrainingProgress:
    """Where a run stands: optimizer steps done and the data position of the next batch."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    best_metric: float | None = None
    best_step: int | None = None
    # Micro-batches above this many tokens are split in two: lowered after a step ran out of
    # memory (fid.training.step_oom_recovery), kept so a resumed run splits its steps alike.
    # None: no limit (checkpoints of an older fid have no entry).
    micro_batch_token_limit: int | None = None


def checkpoint_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """About the bytes one checkpoint takes: the weights, and the optimizer's state (AdamW:
    two moments per weight, in the weights' precision)."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    moments = 2 if isinstance(optimizer, torch.optim.AdamW | torch.optim.Adam) else 1
    return weights * (1 + moments)


def warn_if_checkpoints_do_not_fit(
    state_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, keep: int
) -> None:
    """Warns before training when the state folder's disk lacks room for the kept checkpoints,
    the one being written and best_dev (weights only)."""
    one = checkpoint_bytes(model, optimizer)
    needed = one * (keep + 1) + one // 3
    warn_if_short_of_space(state_dir, needed, f"training ({keep + 1} checkpoints of its state)")


def rng_state() -> dict[str, Any]:
    """Every RNG this rank draws from (dropout, sampling), as plain types and tensors: on a GPU
    its own device's generator only (a rank draws on its device alone, and a resume on a
    machine with another GPU count must find a state for it, never one per device)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # the current device's (set by setup)
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        # one device's state (or a list of every device's, as older checkpoints saved it)
        torch.cuda.set_rng_state(cuda[torch.cuda.current_device() % len(cuda)]
                                 if isinstance(cuda, list) else cuda)  # fmt: skip


def step_checkpoints(state_dir: str | Path) -> list[tuple[int, Path]]:
    """The `step-N` checkpoints in a state folder, oldest first.

    Each was complete when it was renamed into place; whether it still is, only verifying it
    tells (`load_newest_checkpoint`): one that lost a file is listed, not silently passed over.
    """
    state_dir = Path(state_dir)
    if not state_dir.is_dir():
        return []
    found = []
    for path in state_dir.iterdir():
        match = _STEP_DIR.match(path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    return sorted(found)


def write_training_state(
    folder: Path,
    optimizer: torch.optim.Optimizer | None,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler | None,
    progress: TrainingProgress,
    config: dict[str, Any],
    rng_states: list[dict[str, Any]] | None,
) -> None:
    """training_state.pt: everything but the weights (and, when sharded, the optimizer)."""
    torch.save(
        {
            "progress": vars(progress).copy(),
            "optimizer": None if optimizer is None else optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": None if scaler is None else scaler.state_dict(),
            "rng": rng_states if rng_states is not None else [rng_state()],
            "config": config,
        },
        folder / "training_state.pt",
    )


def save_checkpoint(
    state_dir: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler | None,
    progress: TrainingProgress,
    config: dict[str, Any],
    keep_last: int,
    rng_states: list[dict[str, Any]] | None = None,
) -> Path:
    """Writes `step-N` atomically, points `latest` at it and prunes old step checkpoints.

    `rng_states` holds every rank's RNG states (index = rank); default: this process's.
    """
    state_dir = Path(state_dir)
    target = state_dir / f"step-{progress.step}"
    with atomic_directory(target) as tmp:
        save_model(model, str(tmp / "model.safetensors"))
        write_training_state(tmp, optimizer, scheduler, scaler, progress, config, rng_states)
        seal_checkpoint(tmp)
    publish_checkpoint(state_dir, target, keep_last)
    return target


def publish_checkpoint(state_dir: Path, target: Path, keep_last: int) -> None:
    """Points `latest` at a complete `step-N` folder and prunes all but the last `keep_last`
    up to it.

    Checkpoints newer than `target` are those a resume skipped as damaged: the run has gone on
    from an older one, so they are pruned too (kept, they would count among the last K and
    push out the good ones).
    """
    _point_latest(state_dir, target.name)
    step = int(_STEP_DIR.match(target.name).group(1))
    checkpoints = step_checkpoints(state_dir)
    kept = [path for n, path in checkpoints if n <= step][-keep_last:]
    for _, old in checkpoints:
        if old not in kept:
            shutil.rmtree(old, ignore_errors=True)
    logger.info("saved checkpoint %s", target)


def _point_latest(state_dir: Path, name: str) -> None:
    # A unique temporary link (two runs on one folder never share it), named as the sweep of
    # orphans expects: `.latest.<random>.tmp`.
    while True:
        tmp = state_dir / f".latest.{secrets.token_hex(4)}.tmp"
        try:
            os.symlink(name, tmp)  # relative: stays valid when the folder moves
            break
        except FileExistsError:
            continue
    try:
        os.replace(tmp, state_dir / "latest")
    finally:
        tmp.unlink(missing_ok=True)


def read_training_state(folder: Path, mmap: bool = False) -> dict[str, Any]:
    """training_state.pt, checked for what a resume needs (`mmap`: tensors not read yet).

    Raises:
        CheckpointError: a file that does not load, or one without every entry.
    """
    path = folder / "training_state.pt"
    try:
        state = torch.load(path, weights_only=True, map_location="cpu", mmap=mmap)
    except _LOAD_ERRORS as error:
        raise CheckpointError(f"{path}: does not load ({_first_line(error)})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: holds a {type(state).__name__}, expected a dict")
    missing = [key for key in _STATE_KEYS if key not in state]
    if missing:
        raise CheckpointError(f"{path}: no {', '.join(missing)} entry; expected {_STATE_KEYS}")
    sharded = (folder / SHARDED_DIR).is_dir()  # the optimizer's state is in the shards
    if not sharded and not isinstance(state["optimizer"], dict):
        raise CheckpointError(
            f"{path}: the optimizer entry is {type(state['optimizer']).__name__}, expected the "
            "optimizer's state dict"
        )
    progress = state["progress"]
    if not isinstance(progress, dict) or not set(_PROGRESS_KEYS) <= progress.keys():
        found = sorted(progress) if isinstance(progress, dict) else type(progress).__name__
        raise CheckpointError(
            f"{path}: the progress entry holds {found}, expected {_PROGRESS_KEYS}"
        )
    if not isinstance(state["rng"], list) or not state["rng"]:
        raise CheckpointError(f"{path}: the rng entry is not a list of each rank's RNG states")
    return state


def _first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def load_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler | None,
    rank: int = 0,
) -> TrainingProgress:
    """Restores everything `save_checkpoint` wrote; returns the run's progress.

    Each rank restores its own RNG states; a run resumed with more ranks than it was saved
    with gives the extra ranks those of rank % saved ranks. It does not verify the checksums
    (`verify_checkpoint` does).

    Raises:
        CheckpointError: a file that does not load, or a state without what it must hold
            (what was loaded before the error is then partly restored).
    """
    path = Path(path)
    state = read_training_state(path)
    try:
        _load_tensors(path, state, model, optimizer)
    except torch.OutOfMemoryError:
        raise  # no fault of the checkpoint: an older one would not fit either
    except _LOAD_ERRORS as error:
        raise CheckpointError(f"{path}: does not load ({_first_line(error)})") from None
    scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and state["scaler"] is not None:
        scaler.load_state_dict(state["scaler"])
    states = state["rng"]
    if len(states) <= rank:
        logger.warning("checkpoint saved by %d ranks: rank %d reuses rank %d's RNG state",
                       len(states), rank, rank % len(states))  # fmt: skip
    set_rng_state(states[rank % len(states)])
    return TrainingProgress(**state["progress"])


def _load_tensors(
    path: Path, state: dict, model: nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    if (path / SHARDED_DIR).is_dir():
        from fid.training.sharding import load_sharded

        load_sharded(path / SHARDED_DIR, model, optimizer)
    else:
        load_model(model, str(path / "model.safetensors"), strict=True)
        optimizer.load_state_dict(state["optimizer"])


def load_newest_checkpoint(
    state_dir: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler | None,
    before_load: Callable[[Path], None] | None = None,
) -> tuple[Path, TrainingProgress] | None:
    """Restores the newest checkpoint that verifies and loads; every rank must call it.

    A damaged checkpoint (a file whose size or checksum differs from the manifest, a file not
    listed, no manifest, a file that does not load, a training state without what it must
    hold) is skipped with a warning that names it and says why, and the one before it is
    tried. Checkpoints older than every one with a manifest were written by an older fid:
    they load unverified, with a warning. The ranks share the checksum work and decide
    together, so all resume from the same checkpoint.

    Args:
        state_dir: the run's state folder.
        model, optimizer, scheduler, scaler: what the checkpoint restores.
        before_load: called with a checkpoint that verified, before its tensors are loaded (a
            check of the run's config); what it raises ends the resume.

    Returns:
        The checkpoint resumed and its progress; None when `state_dir` holds no checkpoint.

    Raises:
        CheckpointError: `state_dir` holds checkpoints and none verifies and loads.
    """
    state_dir = Path(state_dir)
    rank, _ = distributed.world()
    # Rank 0's listing: every rank walks the same checkpoints in the same order.
    checkpoints = distributed.all_gather_objects(_listing(state_dir) if rank == 0 else None)[0]
    if not checkpoints:
        return None
    first_sealed = min((step for step, _, sealed in checkpoints if sealed), default=None)
    problems = []
    for index, (step, path, _) in reversed(list(enumerate(checkpoints))):
        legacy = first_sealed is None or step < first_sealed
        problem = _any_rank_problem(_check_checkpoint(path, legacy))
        if problem is None:
            if before_load is not None:
                before_load(path)
            try:
                progress = load_checkpoint(path, model, optimizer, scheduler, scaler, rank)
            except CheckpointError as error:
                problem = _any_rank_problem(str(error))
            else:
                problem = _any_rank_problem(None)
        if problem is None:
            return path, progress
        if rank == 0 and index > 0:
            logger.warning("%s; trying %s", problem, checkpoints[index - 1][1].name)
        problems.append(problem)
    raise CheckpointError(
        f"state folder {state_dir}: none of its {len(checkpoints)} checkpoints verifies and "
        f"loads ({'; '.join(problems)}). Hint: move the damaged step-N folders (or the whole "
        "state folder, to start over) aside and rerun; if they do not load into the model, "
        "rerun with the --init-model the run started from"
    )


def _listing(state_dir: Path) -> list[tuple[int, Path, bool]]:
    """(step, folder, has a manifest) of each checkpoint, oldest first."""
    return [(step, path, (path / MANIFEST).is_file()) for step, path in step_checkpoints(state_dir)]


def _any_rank_problem(problem: str | None) -> str | None:
    """The first rank's problem, on every rank (None when no rank has one)."""
    return next((p for p in distributed.all_gather_objects(problem) if p is not None), None)


def _check_checkpoint(path: Path, legacy: bool) -> str | None:
    """This rank's share of verifying a checkpoint: its problem, or None."""
    rank, world_size = distributed.world()
    try:
        manifest = read_manifest(path)
        if manifest is None and not legacy:
            raise CheckpointError(
                f"{path}: no {MANIFEST}, which every checkpoint since the first with one has"
            )
        if manifest is None:
            if rank == 0:
                logger.warning("%s: no %s (written by an older fid): its files cannot be "
                               "verified", path, MANIFEST)  # fmt: skip
        else:
            check_listing(path, manifest)
            check_checksums(path, manifest, sorted(manifest["files"])[rank::world_size])
        read_training_state(path, mmap=True)  # what a resume needs, before any tensor loads
    except CheckpointError as error:
        return str(error)
    return None
