"""Does a job's layout fit the SLURM partition it is sent to? Checked before anything is
submitted, from what `sinfo` says of the partition's nodes (no job, no queue wait).

A layout that cannot run is otherwise learned late: a job asking more CPUs, memory or GPUs per
node than the partition's nodes have, more nodes than it holds, or a time limit above its
MaxTime waits in the queue forever ("PartitionConfig", "Resources") or is refused at submission
after other jobs ran; a GPU job sent to a CPU-only partition (the cluster's default, when a rule
names none) starts and dies at its first CUDA call.

Only the standard library: the workflow calls it while Snakemake plans the run.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

SINFO_FORMAT = "%P|%D|%c|%m|%G|%l"  # partition, nodes, CPUs/node, MB/node, GRES, MaxTime
_GPU_GRES = re.compile(r"gpu(?::([^:(,]+))?:(\d+)")


@dataclass(frozen=True)
class NodeGroup:
    """Nodes of one partition alike in CPUs, memory and GPUs (one line of `sinfo`)."""

    partition: str
    nodes: int
    cpus: int
    mem_mb: int
    gpus: dict[str | None, int]  # GPU type (None: untyped) -> GPUs per node
    max_minutes: float  # inf: no limit
    default: bool  # the partition jobs go to when they name none


@dataclass(frozen=True)
class Layout:
    """What one job of a rule asks of each node, from the rule's resources."""

    rule: str
    partition: str | None
    nodes: int
    cpus_per_node: int
    mem_mb: int
    gpus_per_node: int
    gpu_type: str | None
    minutes: int


def gres_gpus(gres: str | None) -> tuple[str | None, int]:
    """("a100", 8) for "gpu:a100:8", (None, 8) for "gpu:8", (None, 0) for none."""
    if not gres:
        return None, 0
    found = _GPU_GRES.fullmatch(gres)
    if not found:
        return None, 0
    return found.group(1), int(found.group(2))


def layout_of(rule: str, resources: dict) -> Layout:
    """A rule's per-node request: `mpi` jobs ask tasks_per_node x cpus_per_task CPUs on each of
    `nodes`; others one node with `threads` CPUs (the plugin's --cpus-per-task)."""
    gpu_type, gpus = gres_gpus(resources.get("gres"))
    if "mpi" in resources:
        nodes = resources.get("nodes", 1)
        cpus = resources["tasks_per_node"] * resources["cpus_per_task"]
    else:
        nodes, cpus = 1, resources.get("threads", 1)
    return Layout(
        rule=rule,
        partition=resources.get("slurm_partition"),
        nodes=nodes,
        cpus_per_node=cpus,
        mem_mb=resources.get("mem_mb", 0),
        gpus_per_node=gpus,
        gpu_type=gpu_type,
        minutes=resources.get("runtime", 0),
    )


def parse_sinfo(text: str) -> list[NodeGroup]:
    """`sinfo -h -o SINFO_FORMAT` lines as node groups (the default partition is starred)."""
    groups = []
    for line in text.splitlines():
        if not line.strip():
            continue
        partition, nodes, cpus, mem, gres, limit = line.split("|")
        gpus: dict[str | None, int] = {}
        for found in _GPU_GRES.finditer(gres):
            gpus[found.group(1)] = gpus.get(found.group(1), 0) + int(found.group(2))
        groups.append(
            NodeGroup(
                partition=partition.rstrip("*"),
                nodes=int(nodes),
                cpus=int(cpus.rstrip("+")),
                mem_mb=int(re.sub(r"\D", "", mem) or 0),
                gpus=gpus,
                max_minutes=_minutes(limit),
                default=partition.endswith("*"),
            )
        )
    return groups


def _minutes(limit: str) -> float:
    """SLURM's time format ([days-]hours:minutes:seconds, minutes:seconds, "infinite")."""
    if limit in ("infinite", "UNLIMITED", "n/a", ""):
        return float("inf")
    days, _, clock = limit.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    hours, minutes, seconds = parts
    return (int(days or 0) * 24 + hours) * 60 + minutes + seconds / 60


def read_partitions(timeout_s: float = 30) -> list[NodeGroup]:
    """The cluster's partitions as `sinfo` reports them (OSError/CalledProcessError when it
    cannot be asked)."""
    result = subprocess.run(
        # -a: hidden partitions and those of other groups too (a job may name one)
        ["sinfo", "-a", "-h", "-o", SINFO_FORMAT],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=True,
    )
    return parse_sinfo(result.stdout)


def layout_problems(layout: Layout, groups: list[NodeGroup]) -> list[str]:
    """Why a job of this layout cannot run in its partition ([] when some nodes fit).

    A list of partitions (`gpu,gpu_long`: SLURM starts the job in the first that can) fits when
    one of them fits; otherwise each one's problems are said.
    """
    if layout.partition is None:
        default = [g for g in groups if g.default]
        if not default:
            return ["names no slurm_partition and the cluster has no default partition"]
        return _partition_problems(layout, default[0].partition, groups)
    names = [name for name in layout.partition.split(",") if name]
    each = [_partition_problems(layout, name, groups) for name in names]
    if any(not problems for problems in each):
        return []
    return [problem for problems in each for problem in problems]


def _partition_problems(layout: Layout, name: str, groups: list[NodeGroup]) -> list[str]:
    where = [g for g in groups if g.partition == name]
    if not where:
        known = sorted({g.partition for g in groups})
        return [f"partition {name!r} does not exist (sinfo shows {', '.join(known)})"]
    said = f"partition {name!r}" + (
        "" if layout.partition else " (the default: no slurm_partition)"
    )
    problems = []
    if layout.gpus_per_node and not any(g.gpus for g in where):
        problems.append(f"asks for GPUs but {said} has none: name a GPU partition")
    fitting = [g for g in where if _fits(layout, g)]
    if not problems and sum(g.nodes for g in fitting) < layout.nodes:
        problems.append(
            f"asks {layout.nodes} node(s) with {_ask(layout)}; {said} has "
            f"{sum(g.nodes for g in fitting)} such node(s) ({_offer(where)})"
        )
    longest = max(g.max_minutes for g in where)
    if layout.minutes > longest:
        problems.append(f"runtime {layout.minutes} min exceeds {said}'s MaxTime {longest:.0f} min")
    return problems


def layouts_refused(layouts: list[Layout], groups: list[NodeGroup]) -> list[str]:
    """One message per job layout that cannot run on the cluster (`resources.RULE: ...`)."""
    messages = []
    for layout in layouts:
        problems = layout_problems(layout, groups)
        if problems:
            messages.append(
                f"resources.{layout.rule}: a job of this rule cannot run on this cluster: "
                f"{'; '.join(problems)}"
            )
    return messages


def _fits(layout: Layout, group: NodeGroup) -> bool:
    if group.cpus < layout.cpus_per_node or group.mem_mb < layout.mem_mb:
        return False
    if layout.gpus_per_node == 0:
        return True
    if layout.gpu_type is None:
        return sum(group.gpus.values()) >= layout.gpus_per_node
    return group.gpus.get(layout.gpu_type, 0) >= layout.gpus_per_node


def _ask(layout: Layout) -> str:
    gpus = ""
    if layout.gpus_per_node:
        gpus = f", {layout.gpus_per_node} GPU(s)" + (
            f" of type {layout.gpu_type}" if layout.gpu_type else ""
        )
    return f"{layout.cpus_per_node} CPUs, {layout.mem_mb} MB{gpus} each"


def _offer(groups: list[NodeGroup]) -> str:
    def one(g: NodeGroup) -> str:
        gpus = ", ".join(f"{n} {t or 'untyped'} GPU(s)" for t, n in g.gpus.items()) or "no GPUs"
        return f"{g.nodes} x {g.cpus} CPUs, {g.mem_mb} MB, {gpus}"

    return "; ".join(one(g) for g in groups)
