"""AdamW with decay only where it belongs, and learning-rate schedules with warm-up."""

from __future__ import annotations

import math

import torch
from torch import nn

# Parameters of these modules are scales and shifts: decaying them towards 0 hurts (a defect of
# the original, which decayed LayerNorm weights and biases too).
_NORM_TYPES = (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d)


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: matrices and embeddings decay; biases and norm weights do not.

    A module counts as a norm when it is a torch norm layer or its class name ends in "Norm"
    (T5LayerNorm, RMSNorm). Shared (tied) parameters are listed once.
    """
    decay, no_decay, seen = [], [], set()
    for module in model.modules():
        is_norm = isinstance(module, _NORM_TYPES) or type(module).__name__.endswith("Norm")
        for name, parameter in module.named_parameters(recurse=False):
            if not parameter.requires_grad or id(parameter) in seen:
                continue
            seen.add(id(parameter))
            if is_norm or name == "bias" or parameter.ndim < 2:
                no_decay.append(parameter)
            else:
                decay.append(parameter)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(
    model: nn.Module, lr: float, weight_decay: float, decay_biases_and_norms: bool = False
) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; `decay_biases_and_norms` decays every one, as the
    original's `set_optim` does (one group), for exact comparisons with it."""
    if decay_biases_and_norms:
        params = [p for p in model.parameters() if p.requires_grad]
        groups = [{"params": params, "weight_decay": weight_decay}]
    else:
        groups = parameter_groups(model, weight_decay)
    return torch.optim.AdamW(split_sharded(groups), lr=lr)


def split_sharded(groups: list[dict]) -> list[dict]:
    """Each group split into its plain tensors and its FSDP shards (DTensors), where it holds
    both; groups without shards are returned unchanged (and so are checkpoints of them).

    Why: under FSDP the tied or small tensors stay replicated (fid.training.sharding) beside
    sharded DTensors, and AdamW's fused multi-tensor path (the default on CUDA) runs one
    `_foreach_*` kernel over a group's tensors of one device and dtype: with plain tensors and
    DTensors mixed it raises "got mixed torch.Tensor and DTensor" on the first step (seen on an
    H200, 2026-12-04; CPU's default per-tensor path hid it). AdamW steps group by group.
    """
    from torch.distributed.tensor import DTensor

    split = []
    for group in groups:
        plain = [p for p in group["params"] if not isinstance(p, DTensor)]
        sharded = [p for p in group["params"] if isinstance(p, DTensor)]
        if plain and sharded:
            split += [{**group, "params": plain}, {**group, "params": sharded}]
        else:
            split.append(group)
    return split


def lr_factor(step: int, kind: str, warmup_steps: int, max_steps: int, min_ratio: float) -> float:
    """Multiplier of the peak learning rate for the update that follows `step` updates.

    Linear warm-up from 1/warmup to 1 over `warmup_steps`, then constant, linear or cosine
    decay to `min_ratio` at `max_steps`.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if kind == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    if kind == "linear":
        return 1.0 - (1.0 - min_ratio) * progress
    if kind == "cosine":
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown scheduler {kind!r}: expected constant, linear or cosine")


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    kind: str,
    warmup_steps: int,
    max_steps: int,
    min_ratio: float,
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, kind, warmup_steps, max_steps, min_ratio)
    )
