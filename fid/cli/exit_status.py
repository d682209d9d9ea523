"""How a command's end becomes an exit status and a message.

0: done. 1 (EXIT_ERROR): bad input, reported in one line naming the file, record or key (any
`fid.errors.InputError`, a missing or unwritable path, a full disk, GPU memory), or a bug in
fid, which keeps its traceback. 75 (EXIT_PREEMPTED, EX_TEMPFAIL): a training run stopped on a
signal after writing a checkpoint; the same command resumes it.
"""

from __future__ import annotations

import argparse
import errno
import sys

EXIT_ERROR = 1
# EX_TEMPFAIL: the job stopped cleanly on a signal and resumes when run again.
EXIT_PREEMPTED = 75

# Flags that name what a command writes (for errors that do not name the file, like ENOSPC).
OUTPUT_FLAGS = ("output", "predictions", "metrics", "record", "state_dir")
# OSErrors that a user fixes: a path that is missing or of the wrong kind, no permission, no space.
_INPUT_OS_ERRORS = (
    FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError,
)  # fmt: skip
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def is_input_error(error: BaseException) -> bool:
    """Whether an error is the input's fault (one line, exit 1) rather than a bug in fid.

    Every exception class fid defines (DataError, ConfigError, CheckpointError, ... all subclass
    `fid.errors.InputError` or come from an input check) is an input error; so are missing or
    unwritable paths, a full disk and running out of GPU memory.
    """
    module = type(error).__module__
    if module == "fid" or module.startswith("fid."):
        return True
    if isinstance(error, _INPUT_OS_ERRORS):
        return True
    if isinstance(error, OSError) and error.errno in _NO_SPACE:
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(error, torch.cuda.OutOfMemoryError)


def input_error_message(error: BaseException, args: argparse.Namespace) -> str:
    """One line that names the file (OSErrors raised by writes often carry no file name)."""
    if not isinstance(error, OSError):
        if type(error).__module__.startswith("fid"):
            return str(error)
        return f"{type(error).__name__}: {error}. Hint: lower the batch size or passage count"
    if error.strerror is None:
        return str(error)
    outputs = [str(value) for flag in OUTPUT_FLAGS if (value := getattr(args, flag, None))]
    where = error.filename or ", ".join(outputs) or "the outputs"
    message = f"{where}: {error.strerror}"
    if error.errno in _NO_SPACE:
        message += (
            f" (writing {', '.join(outputs)}: nothing is left under their final names). "
            "Hint: free space there and run the command again"
        )
    return message
