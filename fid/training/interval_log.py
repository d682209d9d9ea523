"""The training lines of metrics.jsonl (and the log): one per `log_every_steps` steps, each an
average over its interval's steps.

A line's `step_time_s` is the mean of its steps' own durations and its `peak_memory_mb` the
peak of its steps: dev evaluation and checkpoint saving between two steps are left out of both
(they were counted into the next interval's figures), so a line says what a step costs.
`peak_memory_mb` is rank 0's; `rank_peaks_mb` holds every rank's, in rank order (CUDA's max
allocated on a GPU, the process's resident peak on a CPU): what the report shows per rank,
where Snakemake's benchmark of an srun job measures only the srun client.
"""

from __future__ import annotations

import logging

import torch

from fid.runtime import distributed
from fid.runtime.logs import MetricsWriter, PeakMemory
from fid.training.step import StepResult

logger = logging.getLogger("fid.training.loop")  # the lines users and tests know by this name


class IntervalLog:
    """Collects each step's result (`add`) and writes an interval's line (`write`, on every
    rank: the loss is summed over the ranks; rank 0 alone holds `metrics`)."""

    def __init__(self, metrics: MetricsWriter | None, device: torch.device, max_steps: int):
        self.metrics, self.device, self.max_steps = metrics, device, max_steps
        self.world_size = distributed.world()[1]
        self.memory = PeakMemory(device)
        self.loss = torch.zeros((), device=device)
        self._start_interval()
        self._reset_memory = False

    def _start_interval(self) -> None:
        self.loss.zero_()
        self.steps = self.counted = self.skipped = 0
        self.seconds = 0.0
        self.grad_norm: torch.Tensor | None = None

    def step_starts(self) -> None:
        """Called before each step: the peak is reset here, after whatever ran between steps."""
        if self._reset_memory:
            self.memory.reset()
            self._reset_memory = False

    def add(self, result: StepResult, seconds: float) -> None:
        if result.counted:
            self.loss += result.loss
            self.counted += 1
        self.skipped += not result.updated
        self.steps += 1
        self.seconds += seconds
        self.grad_norm = result.grad_norm

    def write(self, step: int, lr: float, epoch: int) -> dict:
        """The interval's line (written by rank 0, returned on every rank); a new interval."""
        # every item of the interval's steps alike, on all ranks
        (loss_sum,) = distributed.sum_over_ranks([float(self.loss)], self.device)
        peak = self.memory.peak_mb()  # before the gather's own small allocations
        rank_peaks = distributed.all_gather_objects(round(peak, 1))
        values = {
            "loss": loss_sum / self.world_size / max(self.counted, 1),  # its counted steps'
            "skipped_steps": self.skipped,
            "lr": lr,
            "step_time_s": self.seconds / max(self.steps, 1),
            "peak_memory_mb": peak,
            "rank_peaks_mb": rank_peaks,
            "epoch": epoch,
        }
        if self.grad_norm is not None:
            values["grad_norm"] = float(self.grad_norm)
        if self.metrics is not None:
            self.metrics.write("train", step, values)
        logger.info(
            "step %d/%d loss %.4f lr %.2e %.3f s/step peak %.0f MB",
            step, self.max_steps, values["loss"], values["lr"], values["step_time_s"],
            values["peak_memory_mb"],
        )  # fmt: skip
        self._start_interval()
        self._reset_memory = True
        return values
