"""The one training loop that every model of the project is trained with.

setup (distribution, optimizer, schedule, resume) -> steps (fid.training.step: accumulate,
check, update), each followed by its log line, dev evaluation and checkpoint when they are due
-> the final checkpoint. What is trained is a `TrainTask` (fid.training.task): it owns the
model, the batches of an epoch, the loss of a batch, dev evaluation and the final save format;
the loop owns everything else. Resuming from the newest complete checkpoint restores weights,
optimizer, schedule, loss scaler, RNG states and the data position, so an interrupted run ends
bitwise equal to an uninterrupted one on CPU.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fid.config import TrainingConfig
from fid.runtime import distributed, slurm_job
from fid.runtime.console import CONSOLE
from fid.runtime.fileio import atomic_directory, atomic_write_json, recover_directory
from fid.runtime.logs import MetricsWriter
from fid.runtime.precision import autocast, deterministic_kernels
from fid.runtime.progress import progress as progress_lines
from fid.runtime.signals import STOP_SIGNALS, Preempted
from fid.training import replicas
from fid.training.checkpoint import (
    TrainingProgress,
    load_newest_checkpoint,
    warn_if_checkpoints_do_not_fit,
)
from fid.training.interval_log import IntervalLog
from fid.training.manifest import seal_checkpoint, seal_shared_checkpoint
from fid.training.optim import build_optimizer, build_scheduler
from fid.training.resume import check_resume_config, check_resume_inputs, saved_config
from fid.training.saving import CheckpointWriter
from fid.training.step import OptimizerStep, StepLayout
from fid.training.stop_budget import StopBudget
from fid.training.task import BatchStream, TrainTask

logger = logging.getLogger(__name__)


def run_training(
    task: TrainTask,
    cfg: TrainingConfig,
    state_dir: str | Path,
    device: torch.device,
    precision: str,
    config_record: dict[str, Any],
) -> TrainingProgress:
    """Trains `task.model` to `cfg.max_steps`, resuming from `state_dir` if it holds a run.

    In a distributed run (a process group exists), each rank holds a replica of the model
    (sharding 'ddp': its gradients averaged after each step, fid.training.replicas) or its
    shards ('fsdp'), trains on its own micro-batches; rank 0 logs and writes checkpoints, and
    all ranks resume from the same checkpoint.

    Args:
        task: the model, data and evaluation.
        cfg: loop knobs (schedule, accumulation, cadences).
        state_dir: checkpoints, best_dev, metrics.jsonl, tensorboard/ (kept across restarts).
        device: where the model already is.
        precision: "fp32", "bf16" or "fp16".
        config_record: the run's full config, stored in each checkpoint.

    Returns:
        The final progress (step == cfg.max_steps).

    Raises:
        Preempted: after SIGUSR1/SIGTERM, once a checkpoint of the current step is written.
    """
    run = _Run(task, cfg, Path(state_dir), device, precision, config_record)
    progress = run.progress
    # The data, the model and the optimizer are loaded: they live as long as the run. Frozen,
    # they are left out of the collector's full passes, which otherwise walk their millions of
    # objects again and again (measured: 28% of a demo retriever step).
    gc.collect()
    gc.freeze()
    task.model.train()
    try:
        with STOP_SIGNALS as signals:
            first_step, started = progress.step, time.monotonic()  # resumed at
            startup_s = slurm_job.process_age_s()  # from the process's start to here
            while progress.step < cfg.max_steps:
                final = run.train_step()
                run.evaluate_if_due(final)
                saved = run.save_if_due(final)
                if distributed.any_rank(signals.received is not None, device) and not final:
                    if not saved:
                        run.writer.save()
                    logger.warning("stopping at step %d on a signal; the checkpoint is saved",
                                   progress.step)  # fmt: skip
                    raise Preempted(f"stopped by a signal at step {progress.step}",
                                    frozenset(signals.every_received), progress.step - first_step,
                                    time.monotonic() - started, startup_s)  # fmt: skip
    finally:
        gc.unfreeze()  # an in-process caller's later garbage is its own again
        run.close()
    return progress


class _Run:
    """A run's parts once set up: the distribution, the optimizer and schedule, the progress
    (resumed or new), the step (fid.training.step), the log lines, the checkpoint writer, the
    batch stream, the stop budget and the progress bar; and what follows a step when due."""

    def __init__(self, task: TrainTask, cfg: TrainingConfig, state_dir: Path,
                 device: torch.device, precision: str, config_record: dict):  # fmt: skip
        self.task, self.cfg, self.state_dir, self.device = task, cfg, state_dir, device
        self.rank, self.world_size = distributed.world()
        self.layout = StepLayout.of(task, cfg, self.world_size)  # before the optimizer
        # validates precision before any work; no weight casts kept in training, nor in a
        # sharded model's dev generation (precision.autocast)
        self.amp = autocast(device, precision, keep_casts=False)
        self.eval_amp = autocast(device, precision, keep_casts=not self.layout.sharded)
        if cfg.deterministic:
            deterministic_kernels()
        optimizer, self.scheduler, scaler = _optimization(task.model, cfg, precision, state_dir)
        self.progress = _start(task, cfg, state_dir, (optimizer, self.scheduler, scaler),
                               config_record, self.layout)  # fmt: skip
        self.step = OptimizerStep(task, cfg, self.layout, device, self.amp, optimizer,
                                  self.scheduler, scaler, self.progress, state_dir)  # fmt: skip
        self.metrics = None
        if self.rank == 0:
            tensorboard = state_dir / "tensorboard" if cfg.tensorboard else None
            self.metrics = MetricsWriter(state_dir / "metrics.jsonl", tensorboard,
                                         self.progress.step)  # fmt: skip
        self.log = IntervalLog(self.metrics, device, cfg.max_steps)
        self.writer = CheckpointWriter(state_dir, task.model, optimizer, self.scheduler, scaler,
                                       self.progress, config_record, cfg.keep_last_checkpoints,
                                       self.layout.sharded)  # fmt: skip
        self.stream = BatchStream(task, self.progress)
        # what a stop at SLURM's early signal costs, against its lead (fid.runtime.slurm_job)
        self.budget = StopBudget(slurm_job.signal_lead_s() if self.rank == 0 else None)
        # rank 0's steps: a bar on a terminal, else a line (steps, rate, ETA, loss) at most
        # every FID_PROGRESS_INTERVAL_S seconds, also on a workflow job's console
        self.bar = progress_lines(total=cfg.max_steps, initial=self.progress.step, desc="train",
                                  unit="steps", log=logger)  # fmt: skip
        self.last_save = time.monotonic()

    def train_step(self) -> bool:
        """One optimizer step and its log line when due; whether it was the last."""
        started = time.perf_counter()
        self.log.step_starts()
        batches = self.stream.take_step(self.cfg.gradient_accumulation_steps, self.rank,
                                        self.world_size)  # fmt: skip
        result = self.step.run(batches)
        self.progress.step += 1
        self.bar.update(1)
        self.budget.step(time.perf_counter() - started)
        self.log.add(result, time.perf_counter() - started)
        final = self.progress.step == self.cfg.max_steps
        if _every(self.cfg.log_every_steps, self.progress.step) or final:
            values = self.log.write(self.progress.step, self.scheduler.get_last_lr()[0],
                                    self.progress.epoch)  # fmt: skip
            # shown with the next progress line (refreshing now would print one)
            self.bar.set_postfix(loss=f"{values['loss']:.3f}", refresh=False)
        return final

    def evaluate_if_due(self, final: bool) -> None:
        if final or _every(self.cfg.eval_every_steps, self.progress.step):
            started = time.perf_counter()
            _evaluate(self.task, self.progress, self.metrics, self.eval_amp, self.state_dir,
                      self.layout.sharded)  # fmt: skip
            self.budget.evaluation(time.perf_counter() - started)

    def save_if_due(self, final: bool) -> bool:
        """Saves at the end, every save_every_steps and every save_every_minutes (rank 0's
        clock decides: every rank saves at the same step, a save holds collectives)."""
        cfg = self.cfg
        timed = bool(cfg.save_every_minutes) and distributed.main_rank_flag(
            time.monotonic() - self.last_save >= 60 * cfg.save_every_minutes, self.device
        )
        if not (final or timed or _every(cfg.save_every_steps, self.progress.step)):
            return False
        started = time.perf_counter()
        self.writer.save()
        self.budget.save(time.perf_counter() - started)
        self.last_save = time.monotonic()
        return True

    def close(self) -> None:
        self.bar.close()
        if self.metrics is not None:
            self.metrics.close()


def _every(cadence: int | None, step: int) -> bool:
    """Whether `step` is on a cadence of steps (0 or None: never)."""
    return bool(cadence) and step % cadence == 0


def _optimization(model: nn.Module, cfg: TrainingConfig, precision: str, state_dir: Path):
    """(optimizer, schedule, fp16's loss scaler or None); rank 0 warns when the checkpoints
    they make will not fit on the state folder's file system."""
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay, cfg.decay_biases_and_norms)
    scheduler = build_scheduler(
        optimizer, cfg.scheduler, cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio
    )
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
    if distributed.is_main():
        warn_if_checkpoints_do_not_fit(state_dir, model, optimizer, cfg.keep_last_checkpoints)
    return optimizer, scheduler, scaler


def _start(task: TrainTask, cfg: TrainingConfig, state_dir: Path, optimization: tuple,
           config_record: dict, layout: StepLayout) -> TrainingProgress:  # fmt: skip
    """The run's progress: from the newest checkpoint that verifies (its config checked before
    any tensor is loaded, so a refusal comes at once), else a fresh start."""
    rank = distributed.world()[0]
    if rank == 0:
        recover_directory(state_dir / "best_dev")
    distributed.barrier()
    progress = TrainingProgress()
    resumed = load_newest_checkpoint(
        state_dir, task.model, *optimization,
        lambda path: _check_resume(path, cfg, config_record, rank),
    )  # fmt: skip
    if resumed is not None:
        path, progress = resumed
        logger.info("resumed from %s (step %d of %d)", path, progress.step, cfg.max_steps)
    else:
        torch.manual_seed(cfg.seed + rank)  # dropout; the data order has its own seeded RNGs
        logger.info("starting a new run in %s", state_dir)
    if layout.world_size > 1 and not layout.sharded:
        # Whole replicas, their gradients averaged after each step by hand rather than by DDP
        # inside the last backward: a step out of memory on one rank is then redone by all
        # (fid.training.replicas, fid.training.step_oom_recovery).
        replicas.broadcast_weights(task.model)
    if progress.micro_batch_token_limit is not None:
        logger.info("micro-batches above %d tokens are split (the limit set after a step ran "
                    "out of memory)", progress.micro_batch_token_limit)  # fmt: skip
    return progress


def _check_resume(checkpoint: Path, cfg: TrainingConfig, record: dict, rank: int) -> None:
    """Refuses to resume `checkpoint` on other data files or under changed data, shape or
    schedule knobs (on every rank alike: each reads the same file); rank 0 warns about the
    changes that are allowed."""
    saved = saved_config(checkpoint)
    if "inputs" in record:
        check_resume_inputs(saved.get("inputs"), record["inputs"], checkpoint)
    changes = check_resume_config(saved, cfg, checkpoint)
    if changes and rank == 0:
        logger.warning("resuming %s under a changed config: %s", checkpoint, "; ".join(changes))


def _evaluate(
    task: TrainTask, progress: TrainingProgress, metrics, amp, state_dir: Path, sharded: bool
) -> None:
    """Dev evaluation on every rank (each takes its share; with FSDP each runs all of it in
    lockstep); rank 0 logs and saves a new best to best_dev/ in the final format."""
    task.model.eval()
    started = time.perf_counter()
    lockstep = distributed.every_rank_does_all() if sharded else contextlib.nullcontext()
    with torch.no_grad(), amp, lockstep:
        results = task.evaluate()
    task.model.train()
    results["eval_time_s"] = time.perf_counter() - started
    value = results[task.dev_metric]
    logger.info("step %d dev %s %.2f%%", progress.step, task.dev_metric, value, extra=CONSOLE)
    if metrics is not None:
        metrics.write("dev", progress.step, results)
    if _new_best(progress, value):
        _save_best(task, state_dir / "best_dev", {"step": progress.step, **results}, sharded)
        logger.info("new best dev %s %.2f%% at step %d", task.dev_metric, value, progress.step)


def _save_best(task: TrainTask, best_dir: Path, dev_metrics: dict, sharded: bool) -> None:
    """Replaces best_dev (atomically) with the model and its dev metrics.

    Sharded, every rank writes its shards into rank 0's temporary folder and rank 0 assembles
    them (fid.training.sharded_weights): the whole model is never gathered on one rank.
    """
    main = distributed.is_main()
    if not sharded and not main:
        distributed.barrier()
        return
    with atomic_directory(best_dir) if main else contextlib.nullcontext() as tmp:
        tmp = distributed.broadcast_object(tmp) if sharded else tmp
        if sharded:
            task.save_model(tmp, every_rank=True)
        else:
            task.save_model(tmp)
        if main:
            atomic_write_json(tmp / "dev_metrics.json", dev_metrics)
        # Sealed like a step checkpoint: the export verifies it (a best_dev damaged by a kill
        # or a bad disk is never exported as the run's model).
        if sharded:
            distributed.barrier()
            seal_shared_checkpoint(tmp)
        else:
            seal_checkpoint(tmp)
    distributed.barrier()


def _new_best(progress: TrainingProgress, value: float) -> bool:
    """Records `value` as the best dev metric if it is one (ties: the later step).

    Rank 0's value decides on every rank: the branch taken on a new best holds collectives
    (FSDP's all-gather of the weights, a barrier), and ranks that each decided from their own
    float could split between the branches and hang.
    """
    value = distributed.broadcast_object(value)
    if progress.best_metric is None or value >= progress.best_metric:
        progress.best_metric, progress.best_step = value, progress.step
        return True
    return False
