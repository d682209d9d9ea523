"""How a command's end becomes an exit status and a message.

0: done. 1 (EXIT_ERROR): bad input, reported in one line naming the file, record or key (any
`fid.errors.InputError`, a missing path, a write that failed, GPU memory), or a bug in fid,
which keeps its traceback. 75 (EXIT_PREEMPTED, EX_TEMPFAIL): a training run stopped on a
signal after writing a checkpoint; the same command resumes it.

A write that fails (a full disk or quota, a read-only file system, no permission, an I/O
error) is the user's to fix whatever library wrote: `write_failure` finds its cause in the
exception chain, or in the message of the libraries that drop the errno (safetensors' "os error
28", numpy's short write, torch.save's stream writer), and the message names the path, the
cause and the hint that fits it.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

EXIT_ERROR = 1
# EX_TEMPFAIL: the job stopped cleanly on a signal and resumes when run again.
EXIT_PREEMPTED = 75

# Flags that name what a command writes (for errors that do not name the file, like ENOSPC).
OUTPUT_FLAGS = ("output", "predictions", "metrics", "record", "state_dir", "state_root")
# OSErrors that a user fixes: a path that is missing or of the wrong kind, no permission.
_INPUT_OS_ERRORS = (
    FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError,
)  # fmt: skip

# What to do about a write that failed, by its cause.
WRITE_HINTS = {
    errno.ENOSPC: "free space there (or give a folder on a disk with room) and run it again",
    errno.EDQUOT: "the disk quota is full: free space in it (or ask for more) and run it again",
    errno.EROFS: "that file system is read-only: give a folder on a writable one",
    errno.EACCES: "no permission to write there: give a folder you can write to",
    errno.EPERM: "no permission to write there: give a folder you can write to",
    errno.EIO: "the disk or file system reported an I/O error: check it, then run it again",
}
# Libraries that drop the errno: (their message, the cause it means; None: unknown).
_LIBRARY_MESSAGES = (
    (re.compile(r"\(os error (\d+)\)"), "errno"),  # safetensors (Rust's io::Error)
    (re.compile(r"\[Errno (\d+)\]"), "errno"),  # an OSError quoted in another (shutil.Error)
    (re.compile(r"\d+ requested and \d+ written"), errno.ENOSPC),  # numpy's tofile / save
    # torch.save's zip writer: "failed writing ... file write failed", "unexpected pos A vs B"
    (re.compile(r"PytorchStreamWriter failed writing|file write failed|unexpected pos \d+ vs"),
     None),
)  # fmt: skip
# Below this much free space, a write that failed without saying why is taken for a full disk.
_NEARLY_FULL_BYTES = 1 << 20


@dataclass(frozen=True)
class WriteFailure:
    """The cause of a write that failed: an errno (None when the library did not say) and
    the file named by the error, if any."""

    errno: int | None
    filename: str | None

    @property
    def cause(self) -> str:
        return os.strerror(self.errno) if self.errno is not None else "a write failed"

    @property
    def hint(self) -> str:
        if self.errno is not None:
            return WRITE_HINTS[self.errno]
        return "check that there is free space and that the folder is writable, then run it again"


def write_failure(error: BaseException) -> WriteFailure | None:
    """The failed write behind `error`, searched through its causes and contexts, or None."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in WRITE_HINTS:
            return WriteFailure(error.errno, error.filename and str(error.filename))
        for pattern, cause in _LIBRARY_MESSAGES:
            found = pattern.search(str(error))
            if found and cause == "errno":
                if int(found.group(1)) in WRITE_HINTS:
                    return WriteFailure(int(found.group(1)), None)
            elif found:
                return WriteFailure(cause, None)
        error = error.__cause__ or error.__context__
    return None


def is_input_error(error: BaseException) -> bool:
    """Whether an error is the input's fault (one line, exit 1) rather than a bug in fid.

    Every exception class fid defines (DataError, ConfigError, CheckpointError, ... all subclass
    `fid.errors.InputError` or come from an input check) is an input error; so are missing
    paths, writes that failed (`write_failure`) and running out of GPU memory.
    """
    module = type(error).__module__
    if module == "fid" or module.startswith("fid."):
        return True
    if isinstance(error, _INPUT_OS_ERRORS) or write_failure(error) is not None:
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(error, torch.cuda.OutOfMemoryError)


def input_error_message(error: BaseException, args: argparse.Namespace) -> str:
    """One line that names the file (a failed write often names none: then the outputs)."""
    failure = write_failure(error)
    outputs = [str(value) for flag in OUTPUT_FLAGS if (value := getattr(args, flag, None))]
    if failure is not None and _unreadable_input(failure, outputs):
        return f"{failure.filename}: {failure.cause}. Hint: make it readable"
    if failure is not None and failure.errno is None and _nearly_full(outputs):
        failure = WriteFailure(errno.ENOSPC, failure.filename)
    if failure is not None:
        where = failure.filename or ", ".join(outputs) or "the outputs"
        return (
            f"{where}: {failure.cause} (writing {', '.join(outputs) or 'the outputs'}: nothing "
            f"is left under their final names). Hint: {failure.hint}"
        )
    if not isinstance(error, OSError):
        if type(error).__module__.startswith("fid"):
            return str(error)
        return f"{type(error).__name__}: {error}. Hint: lower the batch size or passage count"
    if error.strerror is None:
        return str(error)
    return f"{error.filename or ', '.join(outputs) or 'the outputs'}: {error.strerror}"


def _unreadable_input(failure: WriteFailure, outputs: list[str]) -> bool:
    """No permission on a file that no output holds: an input that cannot be read."""
    return (
        failure.errno in (errno.EACCES, errno.EPERM)
        and failure.filename is not None
        and not any(failure.filename.startswith(output) for output in outputs)
    )


def _nearly_full(outputs: list[str]) -> bool:
    """Whether a disk the outputs are written to has (almost) no room left."""
    from fid.runtime.fileio import free_bytes

    free = [free_bytes(Path(output).parent) for output in outputs]
    return any(f is not None and f < _NEARLY_FULL_BYTES for f in free)
