"""One optimizer update from the accumulated gradients, and the steps that make none.

A step makes no update when its loss is not finite on some rank or its gradient norm is not
finite (bf16, fp32: the update is skipped, so that one bad batch cannot write NaN into every
weight) or when fp16's loss scaler finds an overflow (GradScaler skips it and lowers the scale). A skipped step still counts: its
data is consumed, the step counter and the learning-rate schedule advance (README, "Training").
The loop counts them (metrics.jsonl's `skipped_steps`) and stops the run with one error after
`max_skipped_steps_in_a_row` in a row: a run that diverged, whose last good checkpoint is kept.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from fid.errors import InputError
from fid.runtime import distributed
from fid.training import sharding


class TrainingDiverged(InputError):
    """Too many optimizer steps in a row made no update (non-finite losses, fp16 overflows)."""


def apply_update(
    optimizer: torch.optim.Optimizer,
    scheduler,
    scaler: torch.amp.GradScaler | None,
    parameters: Sequence[nn.Parameter],
    clip_grad_norm: float | None,
    sharded: bool,
    finite: bool,
) -> tuple[torch.Tensor | None, bool]:
    """Clips and applies the accumulated gradients (or skips them), then steps the schedule.

    Args:
        parameters: the trained parameters (sharded ones are DTensors under FSDP).
        finite: whether the step's loss was finite on every rank; without a loss scaler a
            step whose loss or gradient norm is not finite is skipped (its gradients dropped).

    Returns:
        (the gradient norm before clipping, None with a loss scaler and no clipping; whether
        the weights were updated).
    """
    grad_norm, updated = None, finite
    if scaler is not None:
        scaler.unscale_(optimizer)
    # Without a loss scaler the norm is taken even with no clipping (an infinite limit scales
    # nothing): a finite loss with a non-finite gradient makes no update either. It is the
    # same on every rank (replicas' gradients are averaged, FSDP's norm is a collective one).
    limit = clip_grad_norm if clip_grad_norm is not None else None if scaler else math.inf
    if limit is not None and sharded:
        grad_norm = sharding.clip_grad_norm(parameters, limit)
    elif limit is not None:
        grad_norm = torch.nn.utils.clip_grad_norm_(parameters, limit)
    if scaler is not None:  # it skips an overflowing step itself, and lowers its scale
        scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        updated = scaler.get_scale() >= scale
    else:
        updated = finite and bool(torch.isfinite(grad_norm))
        if updated:
            optimizer.step()
    with warnings.catch_warnings():
        # a skipped first step advances the schedule on purpose (a step that counts), which
        # torch takes for a call in the wrong order and warns about: that warning alone is off
        warnings.filterwarnings("ignore", re.escape("Detected call of `lr_scheduler.step()`"))
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, updated


def finite_everywhere(loss: torch.Tensor, device: torch.device) -> bool:
    """Whether the step's loss is finite on every rank (all ranks skip alike)."""
    return not distributed.any_rank(not bool(torch.isfinite(loss)), device)


def stop_if_diverged(in_a_row: int, limit: int, step: int, state_dir: Path) -> None:
    """Raises once `limit` steps in a row made no update, naming the last good checkpoint.

    Raises:
        TrainingDiverged: the state folder is intact: lower the learning rate (or clip, or train
            in bf16/fp32) and run again to resume from the checkpoint.
    """
    if in_a_row < limit:
        return
    from fid.training.checkpoint import step_checkpoints

    saved = step_checkpoints(state_dir)
    last = f"{saved[-1][1]} (step {saved[-1][0]})" if saved else "none yet (a fresh start)"
    raise TrainingDiverged(
        f"step {step}: {in_a_row} optimizer steps in a row made no update (a loss that is not "
        f"finite, or an fp16 overflow): the run diverged; the last good checkpoint is {last}, "
        "kept. Hint: lower lr or clip_grad_norm (or use bf16 or fp32), then run the same command "
        "again to resume (max_skipped_steps_in_a_row sets the limit)"
    )
