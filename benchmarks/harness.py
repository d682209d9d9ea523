"""What every benchmark measures the same way: a block's wall and CPU seconds, its peak memory,
the JSON record of a run (machine, versions, git commit) and the markdown tables they print.

A benchmark runs as a script from the repository root (`python benchmarks/reader/reader_speed.py`)
and imports this module as `benchmarks.harness` after putting the repository root first on
sys.path (its first lines), so it imports the same way however it is run (`python -m
benchmarks.reader.reader_speed` works too).

    with peak_memory(device) as peak, timed(sync) as clock:
        run_the_steps()
    print(table_header(["step s", "peak MB"]))
    print(table_row([f"{clock.wall_s:.3f}", f"{peak.above_mb:.0f}"]))
    write_record(args.json, record(__file__, rows))

Peak memory on a CPU is the resident set's high-water mark (VmHWM in /proc/self/status, set back
to the current resident size by writing 5 to /proc/self/clear_refs; Linux only): psutil, which
the project uses for the machine's RAM, reads no high-water mark and cannot reset one. On CUDA it
is torch.cuda.max_memory_allocated (the tensors; the allocator's reserve and the context are
not counted).
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20
# distributions whose versions a record gives (faiss ships under several names)
VERSIONS = {"torch": ("torch",), "transformers": ("transformers",),
            "faiss": ("faiss-cpu", "faiss-gpu", "faiss-gpu-cu12", "faiss"), "fid": ("fid",)}  # fmt: skip


# ------------------------------------------------------------------------------------- time
@dataclass
class Timing:
    """Seconds a block took: wall clock, and this process's CPU (user + system)."""

    wall_s: float = 0.0
    cpu_s: float = 0.0


@contextlib.contextmanager
def timed(sync: Callable[[], object] | None = None) -> Iterator[Timing]:
    """Times the block; the Timing it yields is filled when the block ends.

    CPU seconds (time.process_time) leave out the time the process waits for a core: on a shared
    machine they are, for one-thread work, close to the wall time an idle machine would give.

    Args:
        sync: called before the clocks start and before they stop (torch.cuda.synchronize:
            CUDA kernels run after the call that queued them returns).
    """
    timing = Timing()
    if sync is not None:
        sync()
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        yield timing
    finally:
        if sync is not None:
            sync()
        timing.wall_s = time.perf_counter() - wall
        timing.cpu_s = time.process_time() - cpu


# ----------------------------------------------------------------------------------- memory
def _cuda(device: object) -> bool:
    return str(device).startswith("cuda")


def status_bytes(field: str = "VmRSS") -> int:
    """A memory line of /proc/self/status (VmRSS, VmHWM, RssAnon, ...) in bytes."""
    text = Path("/proc/self/status").read_text()
    found = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    if found is None:
        raise KeyError(f"/proc/self/status has no line {field!r}")
    return int(found.group(1)) * 1024


def memory_now(device: object = "cpu") -> int:
    """Bytes held now: the resident set on a CPU, memory allocated to tensors on CUDA."""
    if _cuda(device):
        import torch

        return torch.cuda.memory_allocated(device)
    return status_bytes("VmRSS")


def reset_peak(device: object = "cpu") -> None:
    """Starts a new peak at what is held now (CPU: VmHWM := VmRSS; CUDA: after a synchronize)."""
    if _cuda(device):
        import torch

        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    else:
        Path("/proc/self/clear_refs").write_text("5")


def memory_peak(device: object = "cpu") -> int:
    """The most bytes held since the last reset_peak (or the process's start)."""
    if _cuda(device):
        import torch

        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device)
    return status_bytes("VmHWM")


@dataclass
class Peak:
    """What a block held at its start and the most it held above that, in bytes."""

    start_bytes: int = 0
    above_bytes: int = 0

    @property
    def above_mb(self) -> float:
        return self.above_bytes / MIB


@contextlib.contextmanager
def peak_memory(device: object = "cpu") -> Iterator[Peak]:
    """Measures the block's peak memory above what was held as it started (filled at its end)."""
    reset_peak(device)
    peak = Peak(start_bytes=memory_now(device))
    try:
        yield peak
    finally:
        peak.above_bytes = memory_peak(device) - peak.start_bytes


# ----------------------------------------------------------------------------------- record
def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine() -> dict:
    """The CPU model, its cores (all, and those this process may use), the RAM, and the GPUs
    when the benchmark has imported torch (a record does not import it for them)."""
    import psutil

    found = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "ram_gb": round(psutil.virtual_memory().total / 1e9, 1),
    }
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        found["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return found


def versions() -> dict:
    """Python's version and the installed versions of torch, transformers, faiss and fid
    (None where one is not installed), read from the packages' metadata without importing them."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name, distributions in VERSIONS.items():
        found[name] = None
        for distribution in distributions:
            with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                found[name] = importlib.metadata.version(distribution)
                break
    return found


def git_commit() -> dict:
    """The repository's commit and whether tracked files differ from it (None outside git)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        except OSError:  # no git on this machine
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    changes = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": bool(changes) if changes is not None else None}


def record(script: str | Path, results: object) -> dict:
    """A run's JSON record: which benchmark (its path under benchmarks/), the command line, the
    date (UTC), machine(), versions(), git_commit() and the benchmark's own `results`."""
    path = Path(script).resolve()
    name = path.relative_to(ROOT / "benchmarks") if path.is_relative_to(ROOT) else path
    return {
        "benchmark": str(name),
        "command": shlex.join(["python", *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "versions": versions(),
        "git": git_commit(),
        "results": results,
    }


def _plain(value: object) -> object:
    """numpy scalars and arrays as Python numbers and lists; anything else (Paths) as text."""
    return value.tolist() if hasattr(value, "tolist") else str(value)


def write_record(path: Path, run: dict) -> None:
    """Writes a record as JSON, atomically (a reader sees the old file or the whole new one)."""
    from fid.runtime.fileio import atomic_write_text

    atomic_write_text(path, json.dumps(run, indent=1, default=_plain) + "\n")


# ------------------------------------------------------------------------------------ table
def table_row(cells: Sequence[object]) -> str:
    """One markdown table row: `| a | b |`."""
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def table_header(columns: Sequence[object], align: str | None = None) -> str:
    """A markdown table's header and separator lines.

    Args:
        columns: the column titles.
        align: one letter a column, "l" (the default) or "r" (right-aligned numbers).

    Raises:
        ValueError: `align` is not as long as `columns` or holds another letter.
    """
    align = align or "l" * len(columns)
    if len(align) != len(columns) or set(align) - {"l", "r"}:
        raise ValueError(f"align {align!r}: expected one of l/r for each of {len(columns)} columns")
    return table_row(columns) + "\n|" + "".join("---|" if a == "l" else "---:|" for a in align)


def table(
    columns: Sequence[object], rows: Sequence[Sequence[object]], align: str | None = None
) -> str:
    """A whole markdown table (benchmarks that measure for long print table_row as they go)."""
    return "\n".join([table_header(columns, align), *map(table_row, rows)])
