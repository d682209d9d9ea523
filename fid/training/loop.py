"""The one training loop that every model of the project is trained with.

setup (optimizer, schedule, resume) -> loop (accumulate, clip, step, log, evaluate, save)
-> final checkpoint. What is trained is a `TrainTask`: it owns the model, the batches of an
epoch, the loss of a batch, dev evaluation and the final save format; the loop owns everything
else. Resuming from the newest complete checkpoint restores weights, optimizer, schedule, loss
scaler, RNG states and the data position, so an interrupted run ends bitwise equal to an
uninterrupted one on CPU. A step that runs out of memory is redone with its micro-batches split
(fid.training.oom).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from fid.config import ConfigError, TrainingConfig
from fid.errors import InputError
from fid.runtime import distributed, slurm_job
from fid.runtime.console import CONSOLE
from fid.runtime.fileio import (
    atomic_directory,
    atomic_write_json,
    fsync_files,
    recover_directory,
    temporary_directory,
)
from fid.runtime.logs import MetricsWriter, PeakMemory
from fid.runtime.precision import autocast, deterministic_kernels
from fid.runtime.progress import progress as progress_lines
from fid.runtime.signals import STOP_SIGNALS, Preempted
from fid.training import replicas, sharding
from fid.training.accumulation import accumulate_gradients
from fid.training.checkpoint import (
    SHARDED_DIR,
    TrainingProgress,
    load_newest_checkpoint,
    publish_checkpoint,
    rng_state,
    save_checkpoint,
    warn_if_checkpoints_do_not_fit,
    write_training_state,
)
from fid.training.manifest import seal_checkpoint, seal_shared_checkpoint
from fid.training.oom import StepRecovery
from fid.training.optim import build_optimizer, build_scheduler
from fid.training.resume import (
    check_resume_config,
    check_resume_inputs,
    saved_config,
)
from fid.training.stop_budget import StopBudget
from fid.training.update import apply_update, finite_everywhere, stop_if_diverged

logger = logging.getLogger(__name__)


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
        run that ran out of memory is compared with (fid.training.oom)."""

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


class _BatchStream:
    """The micro-batches of successive epochs as one stream; each micro-step every rank takes
    the next `world_size` batches (its own is the rank-th), crossing epoch ends, so no batch is
    lost or seen twice whatever the world size."""

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
    state_dir = Path(state_dir)
    rank, world_size = distributed.world()
    model = task.model
    amp = autocast(device, precision)  # validates precision before any work
    if cfg.deterministic:
        deterministic_kernels()
    sharded = cfg.sharding == "fsdp" and world_size > 1
    if cfg.sharding == "fsdp" and not hasattr(task, "fsdp_units"):
        raise ConfigError("sharding = 'fsdp' is supported for the reader only: use 'ddp'")
    if sharded:
        units = task.fsdp_units()
        replicated = sharding.shard(model, units)  # before the optimizer sees the parameters
        logger.info("FSDP: %d sharded units, %d replicated tensors", len(units), len(replicated))
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay, cfg.decay_biases_and_norms)
    scheduler = build_scheduler(
        optimizer, cfg.scheduler, cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio
    )
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
    if rank == 0:
        warn_if_checkpoints_do_not_fit(state_dir, model, optimizer, cfg.keep_last_checkpoints)

    if rank == 0:
        recover_directory(state_dir / "best_dev")
    distributed.barrier()
    progress = TrainingProgress()
    # The newest checkpoint that verifies; its config is checked before any tensor is loaded,
    # so a refusal comes at once.
    resumed = load_newest_checkpoint(
        state_dir,
        model,
        optimizer,
        scheduler,
        scaler,
        lambda path: _check_resume(path, cfg, config_record, rank),
    )
    if resumed is not None:
        path, progress = resumed
        logger.info("resumed from %s (step %d of %d)", path, progress.step, cfg.max_steps)
    else:
        torch.manual_seed(cfg.seed + rank)  # dropout; the data order has its own seeded RNGs
        logger.info("starting a new run in %s", state_dir)

    if world_size > 1 and not sharded:
        # Whole replicas, their gradients averaged after each step by hand rather than by DDP
        # inside the last backward: a step out of memory on one rank is then redone by all
        # (fid.training.replicas, fid.training.oom).
        replicas.broadcast_weights(model)

    metrics = None
    if rank == 0:
        metrics = MetricsWriter(
            state_dir / "metrics.jsonl",
            state_dir / "tensorboard" if cfg.tensorboard else None,
            resume_step=progress.step,
        )
    memory = PeakMemory(device)
    parameters = [p for p in model.parameters() if p.requires_grad]
    stream = _BatchStream(task, progress)
    recovery = StepRecovery(task, progress, device, recoverable=not sharded)
    if progress.micro_batch_token_limit is not None:
        logger.info("micro-batches above %d tokens are split (the limit set after a step ran "
                    "out of memory)", progress.micro_batch_token_limit)  # fmt: skip
    interval_loss = torch.zeros((), device=device)
    interval_start, interval_steps = time.perf_counter(), 0
    interval_finite = interval_skipped = skipped_in_a_row = 0
    last_save = time.monotonic()
    # what a stop at SLURM's early signal costs, against its lead (fid.runtime.slurm_job)
    budget = StopBudget(slurm_job.signal_lead_s() if rank == 0 else None)
    # rank 0's steps: a bar on a terminal, else a line (steps, rate, ETA, loss) at most every
    # FID_PROGRESS_INTERVAL_S seconds, also on a workflow job's console
    bar = progress_lines(
        total=cfg.max_steps, initial=progress.step, desc="train", unit="steps", log=logger
    )

    def save():
        rng_states = distributed.all_gather_objects(rng_state())
        if not sharded:
            if rank == 0:
                save_checkpoint(
                    state_dir, model, optimizer, scheduler, scaler, progress, config_record,
                    cfg.keep_last_checkpoints, rng_states,
                )  # fmt: skip
            distributed.barrier()
            return
        # Every rank writes its shards into one temporary folder (rank 0 picks its unique
        # name); when all are done, rank 0 adds training_state.pt, the ranks checksum a share
        # of the files each, and rank 0 writes the manifest last and renames the folder, so
        # `step-N` appears complete or not at all.
        target = state_dir / f"step-{progress.step}"
        tmp = temporary_directory(target) if rank == 0 else None
        tmp = distributed.all_gather_objects(tmp)[0]
        sharding.save_sharded(tmp / SHARDED_DIR, model, optimizer)
        distributed.barrier()
        if rank == 0:
            write_training_state(tmp, None, scheduler, scaler, progress, config_record, rng_states)
        distributed.barrier()
        seal_shared_checkpoint(tmp)
        if rank == 0:
            fsync_files(tmp)
            shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp, target)
            publish_checkpoint(state_dir, target, cfg.keep_last_checkpoints)
        distributed.barrier()

    # The data, the model and the optimizer are loaded: they live as long as the run. Frozen,
    # they are left out of the collector's full passes, which otherwise walk their millions of
    # objects again and again (measured: 28% of a demo retriever step).
    gc.collect()
    gc.freeze()
    model.train()

    def gradient_sync(last: bool):
        # FSDP reduce-scatters on the last micro-step; replicas average after the step.
        if sharded:
            sharding.set_gradient_sync(units, last)
        return contextlib.nullcontext()

    def accumulate(step_task: TrainTask, pieces: list[Any]) -> torch.Tensor:
        return accumulate_gradients(
            step_task, model, pieces, world_size, device, amp, scaler, gradient_sync
        )

    try:
        with STOP_SIGNALS as signals:
            while progress.step < cfg.max_steps:
                step_start = time.perf_counter()
                batches = stream.take_step(cfg.gradient_accumulation_steps, rank, world_size)
                step_loss = recovery.run(progress.step + 1, batches, accumulate, parameters)
                if sharded:
                    sharding.average_replicated_gradients(replicated)
                else:
                    replicas.average_gradients(parameters)
                finite = finite_everywhere(step_loss, device)
                grad_norm, updated = apply_update(
                    optimizer, scheduler, scaler, parameters, cfg.clip_grad_norm, sharded, finite
                )
                if finite:
                    interval_loss += step_loss
                    interval_finite += 1
                skipped_in_a_row = 0 if updated else skipped_in_a_row + 1
                interval_skipped += not updated
                stop_if_diverged(skipped_in_a_row, cfg.max_skipped_steps_in_a_row,
                                 progress.step + 1, state_dir)  # fmt: skip
                progress.step += 1
                interval_steps += 1
                bar.update(1)
                budget.step(time.perf_counter() - step_start)

                final = progress.step == cfg.max_steps
                if progress.step % cfg.log_every_steps == 0 or final:
                    # every item of the interval's steps alike, on all ranks
                    (loss_sum,) = distributed.sum_over_ranks([float(interval_loss)], device)
                    values = {
                        # the interval's steps with a finite loss
                        "loss": loss_sum / world_size / max(interval_finite, 1),
                        "skipped_steps": interval_skipped,
                        "lr": scheduler.get_last_lr()[0],
                        "step_time_s": (time.perf_counter() - interval_start) / interval_steps,
                        "peak_memory_mb": memory.peak_mb(),
                        "epoch": progress.epoch,
                    }
                    if grad_norm is not None:
                        values["grad_norm"] = float(grad_norm)
                    _log_train(metrics, progress.step, cfg.max_steps, values)
                    # shown with the next progress line (refreshing now would print one)
                    bar.set_postfix(loss=f"{values['loss']:.3f}", refresh=False)
                    interval_loss.zero_()
                    interval_start, interval_steps = time.perf_counter(), 0
                    interval_finite = interval_skipped = 0
                    memory.reset()

                if final or (cfg.eval_every_steps and progress.step % cfg.eval_every_steps == 0):
                    eval_start = time.perf_counter()
                    _evaluate(task, progress, metrics, amp, state_dir, sharded)
                    budget.evaluation(time.perf_counter() - eval_start)
                saved = False
                timed = False
                if cfg.save_every_minutes:
                    # Rank 0's clock decides: every rank saves at the same step (a save holds
                    # collectives), whatever its own clock says.
                    elapsed = time.monotonic() - last_save
                    timed = distributed.main_rank_flag(
                        elapsed >= 60 * cfg.save_every_minutes, device
                    )
                if (
                    final
                    or timed
                    or (cfg.save_every_steps and progress.step % cfg.save_every_steps == 0)
                ):
                    save_start = time.perf_counter()
                    save()
                    budget.save(time.perf_counter() - save_start)
                    saved = True
                    last_save = time.monotonic()
                stop = distributed.any_rank(signals.received is not None, device)
                if stop and not final:
                    if not saved:
                        save()
                    logger.warning(
                        "stopping at step %d on a signal; the checkpoint is saved", progress.step
                    )
                    raise Preempted(f"stopped by a signal at step {progress.step}")
    finally:
        gc.unfreeze()  # an in-process caller's later garbage is its own again
        bar.close()
        if metrics is not None:
            metrics.close()
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


def _log_train(metrics: MetricsWriter | None, step: int, max_steps: int, values: dict) -> None:
    if metrics is not None:
        metrics.write("train", step, values)
    logger.info(
        "step %d/%d loss %.4f lr %.2e %.3f s/step peak %.0f MB",
        step, max_steps, values["loss"], values["lr"], values["step_time_s"],
        values["peak_memory_mb"],
    )  # fmt: skip


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
