"""Who this process is in a run, from the launcher's variables alone (no torch, so that the
commands that run no model start fast): torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), else SLURM's task variables when `srun` starts one task per GPU (SLURM_PROCID,
SLURM_NTASKS, SLURM_LOCALID, and the first host of SLURM_STEP_NODELIST, else
SLURM_JOB_NODELIST, expanded with python-hostlist; the port from FID_MASTER_PORT or the job
id), else a single process. fid.runtime.distributed starts the process group from it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


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


# A job's rendezvous port: below Linux's ephemeral range (32768-60999 by default), which the
# kernel hands out to outgoing connections, so that one of those cannot hold the port a job
# wants; 15000-34999 overlapped it.
PORT_LOW, PORT_HIGH = 10000, 32767


def slurm_port(env: Mapping[str, str]) -> int:
    """FID_MASTER_PORT, else a port in PORT_LOW-PORT_HIGH derived from the job id (so
    concurrent jobs on one node rarely collide), else 29500. The workflow never passes a
    FID_MASTER_PORT on to its jobs (rules/slurm.smk): one port for every job would collide."""
    if "FID_MASTER_PORT" in env:
        return _int(env, "FID_MASTER_PORT")
    if "SLURM_JOB_ID" in env:
        return PORT_LOW + _int(env, "SLURM_JOB_ID") % (PORT_HIGH - PORT_LOW + 1)
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
