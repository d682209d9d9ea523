"""Atomic writes: a reader of any output sees the old file, the new file, or nothing.

Every file is written to a temporary name in the same folder and moved into place with
`os.replace`, which is atomic on POSIX file systems; folders are built under a temporary name and
renamed. A crash (or SIGKILL) at any point leaves no half-written output under the final name.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


def _default_mode(directory: bool) -> int:
    """The permissions a plain open()/mkdir() would give (mkstemp/mkdtemp use 0600/0700)."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yields a temporary file path that replaces `path` when the block ends without error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    os.chmod(tmp, _default_mode(directory=False))
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Writes `text` to `path` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def atomic_write_json(path: str | Path, data: Any) -> None:
    """Writes `data` as indented JSON to `path` atomically."""
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def atomic_write_jsonl(path: str | Path, records: Iterable[Any]) -> None:
    """Writes one JSON document per line to `path` atomically."""
    with atomic_path(path) as tmp, open(tmp, "w") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def temporary_directory(path: str | Path) -> Path:
    """A new empty folder beside `path`, to be renamed to it: `.NAME.XXXXXXXX.tmp`.

    The name is unique (two runs never share one), and its shape is the one that a sweep of
    orphans left by killed runs looks for.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.chmod(tmp, _default_mode(directory=True))
    return tmp


def fsync_files(folder: Path) -> None:
    """Flushes every file under `folder` to disk (before the folder is renamed into place),
    each with the permissions a plain open() gives under the umask: some writers create
    their files 0600 (safetensors), which colleagues on a shared cluster could not read."""
    mode = _default_mode(directory=False)
    for file in folder.rglob("*"):
        if file.is_file() and not file.is_symlink():
            os.chmod(file, mode | (file.stat().st_mode & 0o111))
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())


@contextlib.contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yields a temporary folder that replaces the folder `path` when the block succeeds.

    An existing folder at `path` is moved aside first and deleted only after the new one is in
    place, so at every instant either the old or the new folder can be found (see
    `recover_directory`).
    """
    path = Path(path)
    tmp = temporary_directory(path)
    try:
        yield tmp
        fsync_files(tmp)
        old = path.with_name(f".{path.name}.old")
        if path.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def recover_directory(path: str | Path) -> None:
    """Puts back a folder that a crash inside `atomic_directory` left moved aside."""
    path = Path(path)
    old = path.with_name(f".{path.name}.old")
    if not path.exists() and old.exists():
        os.replace(old, path)


@contextlib.contextmanager
def atomic_paths(*paths: str | Path) -> Iterator[list[Path]]:
    """Yields one temporary path per output; they replace `paths` together when the block
    ends without error, so that the outputs of one command appear together or not at all.

    Every temporary is written (and flushed) before the first is moved into place; a folder in
    the way of an output fails before anything is written. Should a move still fail, the
    outputs already moved are removed again.
    """
    paths = [Path(path) for path in paths]
    tmps: list[Path] = []
    try:
        for path in paths:
            if path.is_dir():
                raise IsADirectoryError(
                    errno.EISDIR, "a folder is in the way of this output", str(path)
                )
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            os.close(fd)
            tmps.append(Path(tmp))
            os.chmod(tmp, _default_mode(directory=False))
        yield list(tmps)
        for tmp in tmps:
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())
        moved: list[Path] = []
        try:
            for tmp, path in zip(tmps, paths, strict=True):
                os.replace(tmp, path)
                moved.append(path)
        except BaseException:
            for path in moved:
                path.unlink(missing_ok=True)
            raise
        for parent in dict.fromkeys(path.parent for path in paths):
            _fsync_dir(parent)
    finally:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)


def check_writable(folders: Iterable[str | Path]) -> None:
    """Creates each folder (and its parents) and a probe file in it, then removes the probe:
    a command checks where it will write before any heavy work, so that a read-only or full
    file system, or a folder without permission, is reported at once, not after hours.

    Raises:
        OSError: the first folder that cannot be written, named in the error.
    """
    for folder in dict.fromkeys(Path(f) for f in folders):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".fid-write-probe.", dir=folder)
            try:
                os.write(fd, b"x")  # a full disk fails on data, not on an empty file
            finally:
                os.close(fd)
                os.unlink(probe)
        except OSError as error:
            raise OSError(error.errno, error.strerror, str(folder)) from None


def free_bytes(folder: str | Path) -> int | None:
    """Bytes free for this user where `folder` (or its nearest existing parent) lives."""
    folder = Path(folder).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def warn_if_short_of_space(folder: str | Path, needed: int, what: str) -> None:
    """Logs a warning, before the work, when `folder`'s disk has less free space than `needed`
    bytes (an estimate, and file systems may report free space loosely: not an error)."""
    free = free_bytes(folder)
    if free is not None and free < needed:
        logging.getLogger(__name__).warning(
            "%s: %.2f GB free, %s needs about %.2f GB. Hint: free space there first",
            folder, free / 1e9, what, needed / 1e9,
        )  # fmt: skip
