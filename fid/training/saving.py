"""A step checkpoint written by every rank of a run, appearing complete or not at all.

Whole replicas: rank 0 writes the model, optimizer and the rest (fid.training.checkpoint).
Sharded (FSDP): every rank writes its shards into one temporary folder (rank 0 picks its unique
name); when all are done, rank 0 adds training_state.pt, the ranks checksum a share of the
files each, and rank 0 writes the manifest last and renames the folder, so `step-N` appears
complete or not at all. Each rank's RNG states are gathered into the checkpoint either way.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from torch import nn

from fid.runtime import distributed
from fid.runtime.fileio import fsync_files, temporary_directory
from fid.training import sharding
from fid.training.checkpoint import (
    SHARDED_DIR,
    TrainingProgress,
    publish_checkpoint,
    rng_state,
    save_checkpoint,
    write_training_state,
)
from fid.training.manifest import seal_shared_checkpoint


class CheckpointWriter:
    """Writes `step-N` of the run's current state into `state_dir` (`save()`, on every rank)."""

    def __init__(self, state_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler, scaler: torch.amp.GradScaler | None, progress: TrainingProgress,
                 config_record: dict, keep_last: int, sharded: bool):  # fmt: skip
        self.state_dir, self.model, self.optimizer = Path(state_dir), model, optimizer
        self.scheduler, self.scaler, self.progress = scheduler, scaler, progress
        self.config_record, self.keep_last, self.sharded = config_record, keep_last, sharded

    def save(self) -> None:
        rng_states = distributed.all_gather_objects(rng_state())
        rank = distributed.world()[0]
        if not self.sharded:
            if rank == 0:
                save_checkpoint(
                    self.state_dir, self.model, self.optimizer, self.scheduler, self.scaler,
                    self.progress, self.config_record, self.keep_last, rng_states,
                )  # fmt: skip
            distributed.barrier()
            return
        target = self.state_dir / f"step-{self.progress.step}"
        tmp = temporary_directory(target) if rank == 0 else None
        tmp = distributed.all_gather_objects(tmp)[0]
        sharding.save_sharded(tmp / SHARDED_DIR, self.model, self.optimizer)
        distributed.barrier()
        if rank == 0:
            write_training_state(tmp, None, self.scheduler, self.scaler, self.progress,
                                 self.config_record, rng_states)  # fmt: skip
        distributed.barrier()
        seal_shared_checkpoint(tmp)
        if rank == 0:
            fsync_files(tmp)
            shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp, target)
            publish_checkpoint(self.state_dir, target, self.keep_last)
        distributed.barrier()
