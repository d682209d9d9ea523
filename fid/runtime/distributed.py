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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 600


class DistributedError(RuntimeError):
    """The launcher's environment describes an impossible or inconsistent run."""


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands in the run.

    Attributes:
        rank: global rank, 0..world_size-1.
        local_rank: rank on this node (selects the GPU).
        world_size: processes in the run.
        master_addr, master_port: the rendezvous of rank 0.
        launcher: "single", "torchrun" or "slurm".
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    launcher: str = "single"

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise DistributedError(f"{name}={env[name]!r} is not an integer") from None


def slurm_port(env: Mapping[str, str]) -> int:
    """FID_MASTER_PORT, else a port in 15000-34999 derived from the job id (so concurrent jobs
    on one node rarely collide), else 29500."""
    if "FID_MASTER_PORT" in env:
        return _int(env, "FID_MASTER_PORT")
    if "SLURM_JOB_ID" in env:
        return 15000 + _int(env, "SLURM_JOB_ID") % 20000
    return 29500


def init_from_env(env: Mapping[str, str] | None = None) -> DistInfo:
    """Describes the run from the environment (torchrun first, then SLURM, else single).

    Raises:
        DistributedError: for inconsistent variables, e.g. a WORLD_SIZE that differs from
            SLURM_NTASKS, or a rank outside 0..world_size-1.
    """
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        info = DistInfo(
            rank=_int(env, "RANK"),
            local_rank=_int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0,
            world_size=_int(env, "WORLD_SIZE"),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_int(env, "MASTER_PORT") if "MASTER_PORT" in env else 29500,
            launcher="torchrun",
        )
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        import hostlist

        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        if not nodes:
            raise DistributedError("SLURM_PROCID is set but neither SLURM_STEP_NODELIST nor "
                                   "SLURM_JOB_NODELIST names the nodes")  # fmt: skip
        info = DistInfo(
            rank=_int(env, "SLURM_PROCID"),
            local_rank=_int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
            world_size=_int(env, "SLURM_NTASKS"),
            master_addr=hostlist.expand_hostlist(nodes)[0],
            master_port=slurm_port(env),
            launcher="slurm",
        )
        if "WORLD_SIZE" in env and _int(env, "WORLD_SIZE") != info.world_size:
            raise DistributedError(
                f"WORLD_SIZE={env['WORLD_SIZE']} does not match SLURM_NTASKS="
                f"{info.world_size}: the job's task layout and the run disagree"
            )
    else:
        return DistInfo()
    if info.world_size < 1 or not 0 <= info.rank < info.world_size:
        raise DistributedError(
            f"rank {info.rank} is not within a world of {info.world_size} processes "
            f"({info.launcher} variables)"
        )
    if info.local_rank < 0 or info.local_rank > info.rank:
        raise DistributedError(f"local rank {info.local_rank} is impossible for rank {info.rank}")
    return info


def setup(info: DistInfo, timeout_s: int = DEFAULT_TIMEOUT_S) -> torch.device:
    """Starts the process group (when distributed) and returns this rank's device.

    A rank that dies makes the others' collectives fail after `timeout_s` instead of hanging.
    """
    if torch.cuda.is_available():
        device = torch.device("cuda", info.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if info.is_distributed and not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if device.type == "cuda" else "gloo",
            init_method=f"tcp://{info.master_addr}:{info.master_port}",
            rank=info.rank,
            world_size=info.world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        logger.info(
            "rank %d of %d (%s) on %s, master %s:%d",
            info.rank, info.world_size, info.launcher, device, info.master_addr, info.master_port,
        )  # fmt: skip
    return device


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
        dist.barrier()


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
