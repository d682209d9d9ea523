"""Data parallelism by hand: every rank holds the whole model, and the gradients of a step are
averaged once, after its last micro-batch on every rank.

DDP all-reduces gradients inside the backward of the last micro-batch. A rank that runs out
of memory there (or in any forward or backward before it) leaves the others waiting in that
all-reduce, and DDP's reducer cannot go back to a step it began. Here no collective happens
inside a forward or backward: the ranks first agree that the step fitted everywhere
(fid.training.step_oom_recovery), then `average_gradients` all-reduces. The price is that the
all-reduce no longer overlaps the backward; DDP's buckets (a second copy of every gradient) are
not held. `broadcast_weights` does what DDP's constructor did: every rank starts from rank 0's
weights.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from fid.runtime import distributed
from fid.runtime.distributed import DistributedError

# Tensors travel in flat buckets of about this size (DDP's default bucket is 25 MiB): few
# collectives, and a bounded extra copy.
_BUCKET_BYTES = 25 * 2**20


def _several_ranks() -> bool:
    return dist.is_initialized() and dist.get_world_size() > 1


def broadcast_weights(model: nn.Module) -> None:
    """Rank 0's parameters and buffers on every rank (ranks that initialised a new part, such
    as a retriever's fresh projection, each their own way then start alike).

    Raises:
        DistributedError: the ranks hold models of other shapes.
    """
    if not _several_ranks():
        return
    named = list(itertools.chain(model.named_parameters(), model.named_buffers()))
    layout = [(name, tuple(t.shape), str(t.dtype)) for name, t in named]
    if any(other != layout for other in distributed.all_gather_objects(layout)):
        raise DistributedError("the ranks built models of different shapes; a bug in fid")
    for bucket in _buckets([t.detach() for _, t in named]):
        flat = torch.cat([t.reshape(-1) for t in bucket])
        dist.broadcast(flat, src=0)
        _copy_back(bucket, flat)


def average_gradients(parameters: Sequence[nn.Parameter]) -> None:
    """Averages each parameter's gradient over the ranks: one all-reduce per bucket.

    A trained parameter without a gradient on this rank gets zeros, so that every rank reduces
    the same buckets (DDP, without `find_unused_parameters`, refused such a model).
    """
    if not _several_ranks():
        return
    world = dist.get_world_size()
    grads = []
    for parameter in parameters:
        if parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
        grads.append(parameter.grad)
    for bucket in _buckets(grads):
        flat = torch.cat([grad.reshape(-1) for grad in bucket])
        flat.div_(world)  # before the sum, as DDP does: fp16 gradients overflow no sooner
        dist.all_reduce(flat)
        _copy_back(bucket, flat)


def _copy_back(bucket: list[torch.Tensor], flat: torch.Tensor) -> None:
    for tensor, part in zip(bucket, flat.split([t.numel() for t in bucket]), strict=True):
        tensor.copy_(part.view_as(tensor))


def _buckets(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Consecutive tensors of one dtype and device, about `_BUCKET_BYTES` each."""
    buckets: list[list[torch.Tensor]] = []
    size = 0
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        last = buckets[-1] if buckets else None
        if (
            last is None
            or size + nbytes > _BUCKET_BYTES
            or (tensor.dtype, tensor.device) != (last[0].dtype, last[0].device)
        ):
            buckets.append([tensor])
            size = nbytes
        else:
            last.append(tensor)
            size += nbytes
    return buckets
