"""Training checkpoints: atomic, complete, resumable, loadable with `weights_only=True`.

Layout of a state folder:

    step-N/            one complete checkpoint per saved step (the last K are kept)
        model.safetensors       weights (shared tensors stored once)
        training_state.pt       optimizer, scheduler, scaler, RNG states, data position, best
                                dev metric, the run's config: plain types and tensors only
    latest -> step-N   relative symlink to the newest step (never to best_dev)
    best_dev/          the model (in its final, loadable format) with the best dev metric
    metrics.jsonl, tensorboard/, train.log

Each `step-N` folder is built under a temporary name and renamed when complete, so any
`step-N` that exists is whole: resume picks the highest N, whatever `latest` says.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model
from torch import nn

from fid.fileio import atomic_directory

logger = logging.getLogger(__name__)

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


def rng_state() -> dict[str, Any]:
    """Every RNG the loop draws from (dropout, sampling), as plain types and tensors."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def step_checkpoints(state_dir: str | Path) -> list[tuple[int, Path]]:
    """The complete `step-N` checkpoints in a state folder, oldest first."""
    state_dir = Path(state_dir)
    if not state_dir.is_dir():
        return []
    found = []
    for path in state_dir.iterdir():
        match = _STEP_DIR.match(path.name)
        if match and (path / "training_state.pt").is_file():
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
    publish_checkpoint(state_dir, target, keep_last)
    return target


def publish_checkpoint(state_dir: Path, target: Path, keep_last: int) -> None:
    """Points `latest` at a complete `step-N` folder and prunes the oldest ones."""
    _point_latest(state_dir, target.name)
    for _, old in step_checkpoints(state_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    logger.info("saved checkpoint %s", target)


def _point_latest(state_dir: Path, name: str) -> None:
    tmp = state_dir / ".latest.tmp"
    tmp.unlink(missing_ok=True)
    os.symlink(name, tmp)  # relative: stays valid when the folder moves
    os.replace(tmp, state_dir / "latest")


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
    with gives the extra ranks those of rank % saved ranks.
    """
    path = Path(path)
    state = torch.load(path / "training_state.pt", weights_only=True, map_location="cpu")
    if (path / SHARDED_DIR).is_dir():
        from fid.training.sharding import load_sharded

        load_sharded(path / SHARDED_DIR, model, optimizer)
    else:
        load_model(model, str(path / "model.safetensors"), strict=True)
        optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and state["scaler"] is not None:
        scaler.load_state_dict(state["scaler"])
    states = state["rng"]
    if len(states) <= rank:
        logger.warning("checkpoint saved by %d ranks: rank %d reuses rank %d's RNG state",
                       len(states), rank, rank % len(states))  # fmt: skip
    set_rng_state(states[rank % len(states)])
    return TrainingProgress(**state["progress"])
