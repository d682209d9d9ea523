"""What is trained: the `TrainTask` protocol every trained model implements, and the stream of
its micro-batches across epochs.

Its own module so that the loop, the step (fid.training.step) and the pieces the step is made of
(accumulation, OOM recovery) all import it from below, in one direction.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from fid.errors import InputError
from fid.training.checkpoint import TrainingProgress


class TrainTask(Protocol):
    """What the loop needs from a model being trained."""

    model: nn.Module
    dev_metric: str  # key of `evaluate()`'s result; higher is better

    def epoch_batches(self, epoch: int) -> list[Any]:
        """The micro-batches of an epoch, reproducible from the epoch number."""

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """The mean loss of one micro-batch, computed by calling `model` (task.model, or its
        FSDP-sharded self)."""

    def loss_items(self, batch: Any) -> int:
        """How many items `loss(batch)` is the mean of (the reader's target tokens, the
        retriever's questions): the micro-batch's weight in its optimizer step."""

    def item_tokens(self, batch: Any) -> int:
        """The tokens of a micro-batch that its memory grows with: what the token limit of a
        run that ran out of memory is compared with (fid.training.step_oom_recovery)."""

    def split(self, batch: Any) -> list[Any]:
        """The micro-batch as two of about equal tokens whose `loss_items`-weighted losses
        give the gradient of the whole; `[batch]` when it cannot be split (one question)."""

    def question_ids(self, batch: Any) -> list[str]:
        """The ids of the micro-batch's questions (for messages)."""

    def evaluate(self) -> dict[str, float]:
        """Dev metrics over the whole dev set (called on every rank, in eval mode, without
        gradients, under autocast); each rank may take its share and gather the results."""

    def save_model(self, path: Path, every_rank: bool = False) -> None:
        """Writes the model in its final, loadable format into the folder `path`: called on
        rank 0 only, or, when the model itself is sharded, on every rank with the same `path`
        (each writes its shards; the folder is the same)."""


class BatchStream:
    """The micro-batches of successive epochs as one stream; each micro-step every rank takes
    the next `world_size` batches (its own is the rank-th), crossing epoch ends, so no batch is
    lost or seen twice whatever the world size. The position lives in `progress` (checkpointed).
    """

    def __init__(self, task: TrainTask, progress: TrainingProgress):
        self.task = task
        self.progress = progress
        self.batches = task.epoch_batches(progress.epoch)

    def take_step(self, accumulation: int, rank: int, world_size: int) -> list[Any]:
        """This rank's micro-batches of one optimizer step."""
        return [self.take(world_size)[rank] for _ in range(accumulation)]

    def take(self, count: int) -> list[Any]:
        group = []
        while len(group) < count:
            if self.progress.batch_in_epoch >= len(self.batches):
                self.progress.epoch += 1
                self.progress.batch_in_epoch = 0
                self.batches = self.task.epoch_batches(self.progress.epoch)
                if not self.batches:
                    raise InputError("an epoch without batches: the training set is empty")
            group.append(self.batches[self.progress.batch_in_epoch])
            self.progress.batch_in_epoch += 1
        return group
