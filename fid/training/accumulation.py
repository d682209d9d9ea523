"""One optimizer step's gradients from its micro-batches, every item of the step weighted
alike.

With a token budget (`max_tokens_per_batch`) micro-batches hold different numbers of questions
and target tokens, and ranks hold different shares. `loss / accumulation_steps` would average
micro-batch means, not the loss of the step's union; here each micro-batch's mean loss is
weighted by its items (target tokens for the reader, questions for the retriever) over the
step's items on all ranks (torchtune's recipe; transformers' `num_items_in_batch` fix of 2024).
The same weights keep a step whose micro-batches were split after running out of memory
(fid.training.step_oom_recovery) the gradient of the unsplit step.

With several replicas (not sharded) the micro-batches' gradients accumulate locally and
`fid.training.replicas.average_gradients` all-reduces them once the step's every micro-batch
has passed on every rank (fid.training.step_oom_recovery says why).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fid.errors import InputError
from fid.runtime import distributed
from fid.training.task import TrainTask


def accumulate_gradients(
    task: TrainTask,
    train_model: nn.Module,
    batches: list[Any],
    world_size: int,
    device: torch.device,
    amp,
    scaler: torch.amp.GradScaler | None,
    gradient_sync: Callable[[bool], contextlib.AbstractContextManager],
) -> torch.Tensor:
    """The forward and backward passes of one optimizer step over this rank's micro-batches,
    each weighted by `loss_weights`: the gradients (once the ranks' are averaged) are those of
    the mean loss over every item of the step.

    Args:
        train_model: the model to call.
        gradient_sync: the context of a micro-step, given whether it is the last one (FSDP
            reduce-scatters on the last; DDP's `no_sync()` before it).

    Returns:
        This rank's weighted loss (the step's loss is its sum over ranks / world size).
    """
    weights = loss_weights(task, batches, world_size, device)
    total = torch.zeros((), dtype=torch.float64, device=device)
    for micro_step, (batch, weight) in enumerate(zip(batches, weights, strict=True)):
        with gradient_sync(micro_step == len(batches) - 1):
            with amp:
                loss = task.loss(train_model, batch)
            scaled = loss * weight
            (scaler.scale(scaled) if scaler else scaled).backward()
        total += loss.detach() * weight
    return total


def loss_weights(
    task: TrainTask, batches: list[Any], world_size: int, device: torch.device
) -> list[float]:
    """Each micro-batch's weight in its optimizer step: its items (target tokens, questions)
    over the items of the whole step on all ranks, times the world size (DDP and FSDP average
    the ranks' gradients). Every item of the step then weighs alike: the gradient of the union,
    not a mean of micro-batch means. Equal micro-batches on one rank get 1 / accumulation
    steps, as before. One all-reduce of the counts per step.
    """
    items = [task.loss_items(batch) for batch in batches]
    (total,) = distributed.sum_over_ranks([sum(items)], device)
    if total <= 0:
        raise InputError("an optimizer step without a target token or question to learn from")
    return [n * world_size / total for n in items]
