"""A run's disk plan: what each stage will hold on disk, against the free space of the file
system it writes to, checked before the first job (rules/disk.smk builds the rows).

A row is one stage's files once the run is done (downloads, the BM25 index, a round's
embeddings, a training state with its kept checkpoints...). What a row still needs is its
planned bytes less what its folder already holds, so a resumed or half-done run asks only for
the rest. Rows are grouped by the file system their folder lands on (the nearest existing
parent's device): `results/` on a scratch space and `resources/` on a project space are
checked apart.

Imports neither torch nor transformers: the workflow builds the plan each time it loads.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DiskRow:
    """One stage's files once the run is done.

    Attributes:
        stage: what writes them ("downloads", "iter0 embeddings", "state iter0/reader").
        folder: where (relative to the working folder, or absolute).
        planned: bytes it will hold; None where the plan cannot tell (a download without
            `bytes` in the config): shown as "?", not counted.
        basis: how `planned` was counted ("21,015,324 passages x 256 dims x 2 B").
    """

    stage: str
    folder: str
    planned: int | None
    basis: str


def folder_bytes(path: str | Path) -> int:
    """Bytes of the files under `path` (0 where it does not exist); links are not followed."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:  # removed while walking (a job of this run)
                continue
    return total


def _existing_parent(path: Path) -> Path:
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def _mount_point(path: Path) -> Path:
    """The top folder of the file system `path` (which exists) is on."""
    device = path.stat().st_dev
    while path.parent != path and path.parent.stat().st_dev == device:
        path = path.parent
    return path


@dataclass(frozen=True)
class FileSystem:
    """A file system the plan writes to: a folder on it (the first row's), its free bytes and
    what the run still needs there."""

    where: Path
    free: int
    needed: int


def file_systems(rows: list[DiskRow], resumed: bool = True) -> list[FileSystem]:
    """Each file system the rows write to, with the bytes its rows still need (planned less
    what their folders hold already, where `resumed`: a row's folder is its own) and its free
    bytes now."""
    found: dict[int, tuple[Path, int]] = {}
    for row in rows:
        parent = _existing_parent(Path(row.folder))
        device = parent.stat().st_dev
        where, needed = found.get(device, (parent, 0))
        held = folder_bytes(row.folder) if resumed else 0
        still = max(0, (row.planned or 0) - held)
        found[device] = (where, needed + still)
    return [
        FileSystem(_mount_point(where), shutil.disk_usage(where).free, needed)
        for where, needed in found.values()
    ]


def short(systems: list[FileSystem]) -> list[FileSystem]:
    """The file systems without room for what the run still needs there."""
    return [fs for fs in systems if fs.needed > fs.free]


def format_size(size: int | None) -> str:
    """1.23 GiB, 45.6 MiB, 7.8 KiB; "?" for None."""
    if size is None:
        return "?"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if size >= scale:
            return f"{size / scale:.{2 if unit == 'GiB' else 1}f} {unit}"
    return f"{size / 2**10:.1f} KiB"


def format_plan(rows: list[DiskRow], systems: list[FileSystem]) -> str:
    """The plan as a table: one line a stage, its total, then each file system's need and free
    space."""
    width = max([len(row.stage) for row in rows] + [5])
    lines = [f"{'stage':<{width}}  {'planned':>10}  folder  (counted as)"]
    for row in rows:
        lines.append(
            f"{row.stage:<{width}}  {format_size(row.planned):>10}  {row.folder}  ({row.basis})"
        )
    total = sum(row.planned or 0 for row in rows)
    lines.append(f"{'total':<{width}}  {format_size(total):>10}")
    for fs in systems:
        verdict = "fits" if fs.needed <= fs.free else "DOES NOT FIT"
        lines.append(f"  {fs.where}: still needs {format_size(fs.needed)}, "
                     f"{format_size(fs.free)} free: {verdict}")  # fmt: skip
    return "\n".join(lines)
