"""Distributed runs: who am I, and collectives that are no-ops in a single process.

`init_from_env()` reads the launcher's variables and returns a frozen `DistInfo`; it changes
nothing. `setup(info)` then starts the process group (nccl on GPU, gloo on CPU) and binds the
rank to its device. Supported launchers:
- torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT;
- SLURM with one `srun` task per GPU: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, and the first
  host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST) as master, expanded with python-hostlist;
  the port comes from FID_MASTER_PORT or is derived from SLURM_JOB_ID;
- otherwise a single process.

Every helper below works unchanged when no process group exists (Atlas's convention), so each
code path also runs in one CPU process.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import socket
from collections.abc import Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

# Who this process is, read from the launcher's variables without torch (fid.runtime.launcher);
# re-exported for the code that starts a run.
from fid.runtime.launcher import (  # noqa: F401
    DistInfo,
    DistributedError,
    init_from_env,
    slurm_port,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")
# How long a collective waits for the slowest rank. The ranks wait in a barrier while rank 0
# alone writes and checksums a checkpoint, exports best_dev or merges weight shards: for t5-3b
# and t5-11b that is tens of GB on a shared file system, past torch's NCCL default of 10
# minutes (at 600 s the waiting ranks were aborted and the run killed, and every rerun failed
# at the same export). 30 minutes, torch's own default for gloo; FID_COLLECTIVE_TIMEOUT_S sets
# it (a longer file system, or a quicker end for a rank that died).
DEFAULT_TIMEOUT_S = 1800
TIMEOUT_ENV = "FID_COLLECTIVE_TIMEOUT_S"


def collective_timeout_s() -> int:
    """FID_COLLECTIVE_TIMEOUT_S, else DEFAULT_TIMEOUT_S.

    Raises:
        DistributedError: a value that is not a whole number of seconds >= 1.
    """
    value = os.environ.get(TIMEOUT_ENV, "").strip()
    if not value:
        return DEFAULT_TIMEOUT_S
    if not value.isdigit() or int(value) < 1:
        raise DistributedError(f"{TIMEOUT_ENV}={value!r}: expected whole seconds >= 1")
    return int(value)


def setup(info: DistInfo, timeout_s: int | None = None) -> torch.device:
    """Starts the process group (when distributed) and returns this rank's device.

    A rank that dies makes the others' collectives fail after `timeout_s` (None:
    collective_timeout_s()) instead of hanging.
    On a GPU the group is bound to the rank's device (`device_id`), before any collective.

    Raises:
        DistributedError: more ranks on this node than GPUs it shows (two ranks on one GPU:
            NCCL stops at the first collective).
    """
    device = rank_device(info.local_rank, torch.cuda.device_count())
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if info.is_distributed and not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if device.type == "cuda" else "gloo",
            init_method=f"tcp://{info.master_addr}:{info.master_port}",
            rank=info.rank,
            world_size=info.world_size,
            timeout=datetime.timedelta(seconds=timeout_s or collective_timeout_s()),
            device_id=device if device.type == "cuda" else None,
        )
        logger.info(
            "rank %d of %d (%s) on %s, master %s:%d",
            info.rank, info.world_size, info.launcher, device, info.master_addr, info.master_port,
        )  # fmt: skip
        if device.type == "cuda":
            check_distinct_gpus(all_gather_objects((socket.gethostname(), _gpu_id(device))))
    return device


def _gpu_id(device: torch.device) -> str:
    """The GPU's identity across processes (its UUID; the PCI bus id on older torch)."""
    properties = torch.cuda.get_device_properties(device)
    return str(getattr(properties, "uuid", None) or properties.pci_bus_id)


def check_distinct_gpus(gpus: Sequence[tuple[str, str]]) -> None:
    """Refuses ranks that share a GPU: `gpus` holds each rank's (host, GPU id).

    Raises:
        DistributedError: naming the ranks and the fix (two ranks on one GPU stop NCCL or
            run out of its memory).
    """
    first: dict[tuple[str, str], int] = {}
    for rank, gpu in enumerate(gpus):
        if gpu in first:
            raise DistributedError(
                f"ranks {first[gpu]} and {rank} share GPU {gpu[1]} on {gpu[0]}: each rank "
                "needs a GPU of its own. Hint: start at most one rank per GPU (resources "
                "processes / tasks_per_node), or give each task its own (srun "
                "--gpus-per-task=1)"
            )
        first[gpu] = rank


def rank_device(local_rank: int, cuda_devices: int) -> torch.device:
    """The device of the rank with this local rank: its own GPU (the node's ranks keep every
    GPU visible and each takes the one of its local rank, or each sees only its own), else
    the CPU.

    Raises:
        DistributedError: a local rank without a GPU of its own.
    """
    if cuda_devices == 0:
        return torch.device("cpu")
    if cuda_devices == 1:
        # One GPU shown to each rank (srun --gpus-per-task=1, a site's wrapper setting
        # CUDA_VISIBLE_DEVICES per task): the rank's own. Two ranks given the same one are
        # refused once the group is up (`check_distinct_gpus`).
        return torch.device("cuda", 0)
    if local_rank >= cuda_devices:
        raise DistributedError(
            f"local rank {local_rank} but this node shows {cuda_devices} GPU(s): each rank "
            "needs a GPU of its own (two ranks on one GPU stop NCCL at the first collective). "
            "Hint: start at most one rank per GPU (resources processes / tasks_per_node), or "
            "hide the GPUs (CUDA_VISIBLE_DEVICES=) to run the ranks on the CPU"
        )
    return torch.device("cuda", local_rank)


def cleanup() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def world() -> tuple[int, int]:
    """(rank, world size) of the current process group; (0, 1) without one."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main() -> bool:
    return world()[0] == 0


def barrier() -> None:
    if dist.is_initialized():
        # NCCL's barrier on the rank's own GPU (else it guesses one, and may hang)
        cuda = dist.get_backend() == "nccl"
        dist.barrier(device_ids=[torch.cuda.current_device()] if cuda else None)


_split_work = True


@contextlib.contextmanager
def every_rank_does_all():
    """Within this block `shard_indices` gives every rank all items (and `gather_in_order`
    passes them through): for sharded (FSDP) models, whose ranks must run the same forward
    calls in lockstep."""
    global _split_work
    previous, _split_work = _split_work, False
    try:
        yield
    finally:
        _split_work = previous


def in_lockstep() -> bool:
    """Inside `every_rank_does_all` with several ranks: each forward call is every rank's
    (a sharded model's collectives), so no rank may run one that the others do not."""
    return not _split_work and world()[1] > 1


def shard_indices(n: int) -> list[int]:
    """This rank's share of n items: every world_size-th item (nothing lost or repeated)."""
    rank, size = world()
    if not _split_work:
        return list(range(n))
    return list(range(rank, n, size))


def gather_in_order(n: int, local: Sequence[T]) -> list[T]:
    """Reassembles per-rank results of `shard_indices(n)` into input order on every rank."""
    rank, size = world()
    if size == 1 or not _split_work:
        return list(local)
    parts: list[Any] = [None] * size
    dist.all_gather_object(parts, list(local))
    ordered: list[Any] = [None] * n
    for r, part in enumerate(parts):
        for position, item in zip(range(r, n, size), part, strict=True):
            ordered[position] = item
    return ordered


def gather_to_main(n: int, local: Sequence[T]) -> list[T] | None:
    """Reassembles per-rank results of `shard_indices(n)` into input order on rank 0 only.

    For results that only rank 0 writes (scores, predictions): the other ranks never hold the
    whole set (`gather_in_order` gives it to every rank) and get None.
    """
    rank, size = world()
    if size == 1 or not _split_work:
        return list(local)
    parts: list[Any] | None = [None] * size if rank == 0 else None
    dist.gather_object(list(local), parts, dst=0)
    if parts is None:
        return None
    ordered: list[Any] = [None] * n
    for r, part in enumerate(parts):
        for position, item in zip(range(r, n, size), part, strict=True):
            ordered[position] = item
    return ordered


def all_gather_objects(value: T) -> list[T]:
    """Every rank's `value`, indexed by rank."""
    rank, size = world()
    if size == 1:
        return [value]
    parts: list[Any] = [None] * size
    dist.all_gather_object(parts, value)
    return parts


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank if `flag` is True on any rank."""
    if not dist.is_initialized():
        return flag
    tensor = torch.tensor([int(flag)], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())


def broadcast_object(value: T) -> T:
    """Rank 0's `value` on every rank (picklable objects; `value` itself without a group).

    For decisions that every rank must take alike because the branch they choose holds
    collectives: one rank deciding differently from its own numbers would hang the others.
    """
    if not dist.is_initialized():
        return value
    box: list[Any] = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def main_rank_flag(flag: bool, device: torch.device) -> bool:
    """Rank 0's `flag` on every rank: one small tensor broadcast, cheap enough for every step."""
    if not dist.is_initialized():
        return flag
    tensor = torch.tensor([int(flag)], device=device)
    dist.broadcast(tensor, src=0)
    return bool(tensor.item())


def sum_over_ranks(values: Sequence[float], device: torch.device) -> list[float]:
    """The element-wise sum of `values` over all ranks (float64; `values` without a group)."""
    if not dist.is_initialized():
        return [float(v) for v in values]
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.tolist()
