"""Fully sharded training (PyTorch FSDP2) for readers too large for one GPU (t5-3b, t5-11b).

Each transformer block is its own `fully_shard` unit: its parameters, gradients and optimizer
state live 1/world on each rank and are gathered only while the block runs. The few parameters
outside the blocks (the shared embedding, tied to the LM head, and the final norms: under 1% of
t5-11b) stay replicated, and their gradients are averaged by hand, because sharding a tied
embedding would need the embedding and head in one unit with the root's hooks, which the reader's
own calls (encode, generate, scoring) bypass.

Checkpoints are sharded with torch.distributed.checkpoint: each rank writes its part into the
same temporary folder (`.step-N.<random>.tmp`, named by rank 0); once all have finished, the
ranks checksum a share of its files each for the manifest (fid.training.checkpoint), and rank 0 writes
the manifest and renames the folder into place.

The reader is never whole on one rank: `fid train-reader` builds it sharded from the meta
device and each rank reads its own slices of the start weights; best_dev is written by all
ranks together (fid.training.sharded_weights).

Works with gloo on CPU (tested with 2 processes) and nccl on GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor

from fid.models.bucketed_encoder import BUCKETS_METHOD


def shard(model: nn.Module, units: Sequence[nn.Module]) -> list[nn.Parameter]:
    """Applies `fully_shard` to each unit; returns the parameters left replicated.

    Each unit is its own FSDP root (no sharded parent), and a root left to the default
    (`reshard_after_forward=None`) keeps its parameters gathered after its forward: the whole
    model would stay gathered through the step and dev evaluation. Every unit therefore
    reshards after its forward, explicitly, and holds its full weights only while it runs.
    """
    for unit in units:
        if not isinstance(unit, FSDPModule):  # a reader built sharded comes here sharded
            fully_shard(unit, reshard_after_forward=True)
            # An encoder block's call over all length buckets is a forward of the unit too:
            # gathered once for all buckets (fid.models.bucketed_encoder).
            if hasattr(unit, BUCKETS_METHOD):
                register_fsdp_forward_method(unit, BUCKETS_METHOD)
    return [p for p in model.parameters() if not isinstance(p, DTensor)]


@contextlib.contextmanager
def kept_gathered(units: Iterable[nn.Module]) -> Iterator[None]:
    """Holds each sharded unit's full weights through the block: one all-gather per unit.

    For generation: transformers' generate runs every decoder block once per new token, and a
    unit that reshards after its forward is gathered again at every token (a 20-token answer:
    20 all-gathers of each decoder block). Costs the units' full weights for the while.
    """
    sharded = [unit for unit in units if isinstance(unit, FSDPModule)]
    for unit in sharded:
        unit.set_reshard_after_forward(False)
        unit.unshard()
    try:
        yield
    finally:
        for unit in sharded:
            unit.reshard()
            unit.set_reshard_after_forward(True)


def set_gradient_sync(units: Iterable[nn.Module], enabled: bool) -> None:
    """Off during non-final accumulation micro-steps: gradients then reduce-scatter once."""
    for unit in units:
        if isinstance(unit, FSDPModule):
            unit.set_requires_gradient_sync(enabled)


def held_gradient_bytes(model: nn.Module, units: Iterable[nn.Module]) -> int:
    """Bytes of gradients this rank holds now: its gradient shards and the replicated tensors'
    gradients, plus the UNSHARDED gradients FSDP keeps for a unit between micro-batches while
    the unit's gradient sync is off (FSDP2's per-parameter unsharded gradient, read where this
    torch has it: a measurement aid for tests and benchmarks)."""

    def size(tensor) -> int:
        if tensor is None:
            return 0
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        return local.numel() * local.element_size()

    held = sum(size(p.grad) for p in model.parameters())
    for unit in units:
        state = unit._get_fsdp_state() if isinstance(unit, FSDPModule) else None
        group = getattr(state, "_fsdp_param_group", None)
        for param in getattr(group, "fsdp_params", []):
            unsharded = getattr(param, "_unsharded_param", None)
            held += size(getattr(unsharded, "grad", None))
            held += size(getattr(param, "unsharded_accumulated_grad", None))
    return held


def average_replicated_gradients(parameters: Sequence[nn.Parameter]) -> None:
    """All-reduce (mean) the gradients of the parameters outside the sharded units."""
    world = dist.get_world_size()
    for parameter in parameters:
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad)
            parameter.grad.div_(world)


def clip_grad_norm(parameters: Sequence[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Global gradient-norm clipping over sharded (DTensor) and replicated gradients.

    Returns:
        The total norm before clipping (the same on every rank).
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    device = grads[0].device if grads else torch.device("cpu")
    sharded_sq = torch.zeros((), device=device)
    replicated_sq = torch.zeros((), device=device)
    for grad in grads:
        if isinstance(grad, DTensor):
            sharded_sq += grad.to_local().float().pow(2).sum()
        else:
            replicated_sq += grad.float().pow(2).sum()
    dist.all_reduce(sharded_sq)  # each rank holds a disjoint shard: the sum is the total
    total = (sharded_sq + replicated_sq).sqrt()
    coefficient = min(1.0, max_norm / (float(total) + 1e-6))
    for grad in grads:
        grad.mul_(coefficient)
    return total


def save_sharded(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Every rank writes its shards of the model and optimizer into `folder`."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(folder))


def load_sharded(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )
