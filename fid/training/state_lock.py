"""One run per state folder: an OS lock held for the whole run, and the sweep of what killed runs
left behind, which only the lock's holder may do.

Two runs on one `--state-dir` interleave their checkpoints and metrics, and the next resume
mixes them. Rank 0 takes `fcntl.flock` on `STATE/run.lock` for the whole run and writes its
host and pid into it; the kernel drops the lock when the process ends in any way (SIGKILL
included), so a dead holder never blocks a rerun, and the lock file itself is never deleted
(unlinking a lock file lets two later runs lock two different files). The other ranks of a run
never take the lock (on several nodes they share the file system, and one holder per run is the
point): they receive rank 0's outcome by broadcast, so a refused run ends on every rank at once
instead of waiting in its first collective.

A run killed while it builds a folder (`atomic_directory`: `.<name>.<random>.tmp`, the sharded
`.step-N.tmp`, a `.<name>.old` moved aside) leaves it there, each a full checkpoint or model.
Once the lock is held no other run can be writing them, so they are swept when a run starts and
again when it ends: every such entry of the state folder (the run's alone), and beside the
output folder only the names built from the output's own name (its siblings may be other jobs').
Only these temporary names are swept: the files of finished runs, which the holder sets aside
into `finished/<run id>/` (fid.training.states), are never touched, and the lock file stays
in place while they move, so the folder is held throughout.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

from fid.runtime import distributed
from fid.runtime.fileio import recover_directory

logger = logging.getLogger(__name__)

LOCK_FILE = "run.lock"
# flock() errors of file systems without (cluster-wide) locks, e.g. Lustre mounted without
# `-o flock`: the run goes on unlocked, with a warning, rather than not at all.
_NO_LOCKS = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}
# Any temporary entry in the state folder: `.step-N.tmp`, `.<name>.<random>.tmp`, `.latest.tmp`.
_STATE_TMP = re.compile(r"^\..+\.tmp$")

_held: set[Path] = set()  # state folders this process holds: a nested hold changes nothing


class StateInUse(ValueError):
    """Another run holds the state folder (or rank 0 could not take it)."""


def _holder(path: Path) -> str:
    """Who holds the lock, as its holder wrote it into the lock file."""
    try:
        holder = json.loads(path.read_text())
        return f"pid {holder['pid']} on host {holder['host']}, since {holder['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a run that is starting"  # locked, but its holder has not written itself yet


def _lock(state_dir: Path) -> int | None:
    """Takes the lock of `state_dir`: the open lock file, or None without file-system locks.

    Raises:
        StateInUse: when another process holds it.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StateInUse(
            f"state folder {state_dir} is in use by another run ({_holder(path)}): wait for it "
            f"to end, or give this run another --state-dir"
        ) from None
    except OSError as error:
        os.close(fd)
        if error.errno not in _NO_LOCKS:
            raise
        logger.warning("%s: the file system refuses locks (%s): nothing stops a second run on "
                       "this state folder, and leftovers are not swept", path, error)  # fmt: skip
        return None
    since = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    holder = {"host": socket.gethostname(), "pid": os.getpid(), "since": since}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
    return fd


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def sweep_leftovers(folder: str | Path, name: str | None = None) -> list[str]:
    """Removes the temporary entries that killed runs left in `folder`; only the holder of the
    state's lock may call it.

    Args:
        folder: the state folder (name None: every `.*.tmp` and stale `.*.old` in it), or the
            folder holding an output (then only those built from the output's name).
        name: the output's folder name.

    Returns:
        The names removed.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    if name is None:
        temporary, moved_aside = _STATE_TMP, re.compile(r"^\.(.+)\.old$")
    else:
        # `.<name>.<random>.tmp` with a random part without dots: `.model.v2.x1y2.tmp` belongs to
        # a sibling output `model.v2`, never to `model`.
        temporary = re.compile(rf"^\.{re.escape(name)}\.[^.]+\.tmp$")
        moved_aside = re.compile(rf"^\.({re.escape(name)})\.old$")
    removed = []
    for entry in sorted(folder.iterdir()):
        old = moved_aside.match(entry.name)
        if old and not (folder / old.group(1)).exists():
            recover_directory(folder / old.group(1))  # killed between the two renames
        elif old or temporary.match(entry.name):
            _remove(entry)
            removed.append(entry.name)
    if removed:
        logger.info("removed what killed runs left in %s: %s", folder, ", ".join(removed))
    return removed


def _sweep(state_dir: Path, output_dir: Path | None) -> None:
    sweep_leftovers(state_dir)
    if output_dir is not None:
        sweep_leftovers(output_dir.parent, output_dir.name)


@contextlib.contextmanager
def hold_state(state_dir: str | Path, output_dir: str | Path | None = None) -> Iterator[None]:
    """Holds `state_dir` for this run (rank 0 takes the lock; every rank learns the outcome),
    sweeping leftovers of killed runs when it starts and when it ends without error.

    Args:
        state_dir: the run's state folder (created when missing).
        output_dir: the folder the run exports to; the leftovers of its builds are swept too.

    Raises:
        StateInUse: on every rank, when another run holds the state folder.
    """
    state_dir = Path(state_dir).resolve()
    output_dir = None if output_dir is None else Path(output_dir).resolve()
    if state_dir in _held:
        yield
        return
    fd, failure = None, None
    if distributed.is_main():
        try:
            fd = _lock(state_dir)
            if fd is not None:
                _sweep(state_dir, output_dir)
        except (StateInUse, OSError) as error:  # told to the other ranks, raised below
            failure = error
    message = distributed.broadcast_object(None if failure is None else str(failure))
    if failure is not None:
        raise failure
    if message is not None:
        raise StateInUse(f"rank 0 could not take the state folder: {message}")
    _held.add(state_dir)
    try:
        yield
        if fd is not None:
            _sweep(state_dir, output_dir)
    finally:
        _held.discard(state_dir)
        if fd is not None:
            os.close(fd)  # releases the lock
