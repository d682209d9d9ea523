"""One optimizer step as a unit: this rank's micro-batches -> gradients accumulated (a step out of
memory split and redone, fid.training.step_oom_recovery) -> averaged over the ranks -> checked
-> the update (or none) -> the schedule.

The check: a step updates the weights only when its loss is finite on every rank and its
gradient norm is finite (fp16's loss scaler checks the gradients itself). A finite loss can
still give a non-finite gradient (an overflow in a backward pass, a NaN from a 0/0 in a custom
op); applied, it would write NaN into every weight and a later "diverged" stop would name a NaN
checkpoint as the last good one. Such a step is skipped and counted like a non-finite loss
(fid.training.update), its data consumed and its schedule step taken.

Distribution (`StepLayout`): whole replicas average their gradients after the last micro-batch
(fid.training.replicas); FSDP units reduce-scatter theirs after every micro-batch (or the last
only: `fsdp_gradient_sync`) and the tensors outside the units are averaged by hand after the
last (fid.training.sharding).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fid.config import ConfigError, TrainingConfig
from fid.training import replicas, sharding
from fid.training.accumulation import accumulate_gradients
from fid.training.checkpoint import TrainingProgress
from fid.training.step_oom_recovery import StepRecovery
from fid.training.task import TrainTask
from fid.training.update import apply_update, finite_everywhere, stop_if_diverged

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepLayout:
    """How the model is spread over the ranks: sharded (FSDP units, and the tensors left
    outside them, replicated) or whole replicas."""

    world_size: int
    sharded: bool
    units: list[nn.Module] = field(default_factory=list)
    replicated: list[nn.Parameter] = field(default_factory=list)

    @classmethod
    def of(cls, task: TrainTask, cfg: TrainingConfig, world_size: int) -> StepLayout:
        """Shards the task's model where the config asks for FSDP (before an optimizer sees its
        parameters); else whole replicas, their weights broadcast from rank 0 after a resume."""
        sharded = cfg.sharding == "fsdp" and world_size > 1
        if cfg.sharding == "fsdp" and not hasattr(task, "fsdp_units"):
            raise ConfigError("sharding = 'fsdp' is supported for the reader only: use 'ddp'")
        if not sharded:
            return cls(world_size, False)
        units = task.fsdp_units()
        replicated = sharding.shard(task.model, units)
        logger.info("FSDP: %d sharded units, %d replicated tensors", len(units), len(replicated))
        return cls(world_size, True, units, replicated)


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step did.

    Attributes:
        loss: this rank's weighted loss (the step's loss is its sum over ranks / world size).
        counted: whether the step's loss and gradients were finite (it enters the logged loss).
        updated: whether the weights changed (also False for fp16's skipped overflows).
        grad_norm: the gradient norm before clipping (None with fp16 and no clipping).
    """

    loss: torch.Tensor
    counted: bool
    updated: bool
    grad_norm: torch.Tensor | None


class OptimizerStep:
    """Runs the run's optimizer steps one at a time (`run`), counting those in a row that made
    no update: too many stop the run (TrainingDiverged, naming the last good checkpoint)."""

    def __init__(self, task: TrainTask, cfg: TrainingConfig, layout: StepLayout,
                 device: torch.device, amp, optimizer: torch.optim.Optimizer, scheduler,
                 scaler: torch.amp.GradScaler | None, progress: TrainingProgress,
                 state_dir: Path):  # fmt: skip
        self.task, self.cfg, self.layout, self.device, self.amp = task, cfg, layout, device, amp
        self.optimizer, self.scheduler, self.scaler = optimizer, scheduler, scaler
        self.progress, self.state_dir = progress, Path(state_dir)
        self.parameters = [p for p in task.model.parameters() if p.requires_grad]
        # a step out of memory is redone split on every rank; FSDP's collectives inside the
        # passes cannot be coordinated so: its failures propagate
        self.recovery = StepRecovery(task, progress, device, recoverable=not layout.sharded)
        self.skipped_in_a_row = 0

    def run(self, batches: Sequence[Any]) -> StepResult:
        """Step `progress.step + 1` over this rank's micro-batches (progress is not advanced)."""
        number = self.progress.step + 1
        loss = self.recovery.run(number, batches, self._accumulate, self.parameters)
        if self.layout.sharded:
            sharding.average_replicated_gradients(self.layout.replicated)
        else:
            replicas.average_gradients(self.parameters)
        finite = finite_everywhere(loss, self.device)
        grad_norm, updated = apply_update(
            self.optimizer, self.scheduler, self.scaler, self.parameters,
            self.cfg.clip_grad_norm, self.layout.sharded, finite,
        )  # fmt: skip
        # without a loss scaler apply_update skipped a non-finite gradient; fp16's overflows
        # are the scaler's (their loss is finite: it counts)
        bad_gradient = (self.scaler is None and grad_norm is not None
                        and not bool(torch.isfinite(grad_norm)))  # fmt: skip
        counted = finite and not bad_gradient
        if finite and bad_gradient:
            logger.warning("step %d: the gradient norm is %s with a finite loss: no update",
                           number, float(grad_norm))  # fmt: skip
        self.skipped_in_a_row = 0 if updated else self.skipped_in_a_row + 1
        stop_if_diverged(self.skipped_in_a_row, self.cfg.max_skipped_steps_in_a_row, number,
                         self.state_dir)  # fmt: skip
        return StepResult(loss, counted, updated, grad_norm)

    def _accumulate(self, task: TrainTask, pieces: list[Any]) -> torch.Tensor:
        return accumulate_gradients(task, self.task.model, pieces, self.layout.world_size,
                                    self.device, self.amp, self.scaler, self._gradient_sync)  # fmt: skip

    def _gradient_sync(self, last: bool):
        # FSDP reduce-scatters after every micro-batch's backward (each rank then holds only
        # its gradient shard between micro-batches), or after the last one only
        # (`fsdp_gradient_sync: last_micro_batch`: unsharded gradients held meanwhile);
        # replicas average after the step.
        if self.layout.sharded:
            sharding.set_gradient_sync(self.layout.units, reduce_scatter_now(self.cfg, last))
        return contextlib.nullcontext()


def reduce_scatter_now(cfg: TrainingConfig, last: bool) -> bool:
    """Whether FSDP reduce-scatters after this micro-batch's backward (`fsdp_gradient_sync`)."""
    return last or cfg.fsdp_gradient_sync == "every_micro_batch"
