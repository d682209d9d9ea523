"""The `fid` command: one subcommand per workflow step (fid/cli/parser.py lists them).

Paths come from flags; knobs come from the YAML given by `--config` (fid/config). This package is
the only place that parses arguments, sets up logging, initialises the distributed run and turns
errors into exit statuses (fid/cli/exit_status.py): a bad input ends with one clear message and
exit status 1, and no partial output.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from fid.cli.exit_status import (
    EXIT_ERROR,
    EXIT_PREEMPTED,
    OUTPUT_FLAGS,
    input_error_message,
    is_input_error,
)
from fid.cli.parser import build_parser

# stdlib only: the signal record is installed before torch is imported
from fid.runtime.signals import STOP_SIGNALS, Preempted

logger = logging.getLogger("fid")

__all__ = ["EXIT_ERROR", "EXIT_PREEMPTED", "build_parser", "command", "main"]


def _set_threads(threads: int | None) -> None:
    """Ties torch's CPU threads to what the job was given (2 busy processes on 2 cores with 2
    threads each run many times slower)."""
    if threads is None:
        threads = _threads_from_env(os.environ.get("FID_THREADS", "").strip())
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def _threads_from_env(value: str) -> int | None:
    """FID_THREADS as a thread count (unset or empty: torch's own)."""
    if not value:
        return None
    try:
        threads = int(value)
    except ValueError:
        threads = 0
    if threads < 1:
        from fid.config import ConfigError

        raise ConfigError(f"FID_THREADS = {value!r}: expected an integer >= 1 (torch's CPU "
                          "threads), or unset for torch's own")  # fmt: skip
    return threads


def main(argv: list[str] | None = None) -> int:
    """The `fid` command as a function (tests call it in-process): its exit status."""
    args = build_parser().parse_args(argv)
    if not getattr(args, "trains", False):
        return _run(args)
    # A training run: SIGUSR1/SIGTERM are recorded, not a kill, from here (before torch is
    # imported) to the end of the run; the loop stops on them with a checkpoint.
    with STOP_SIGNALS:
        return _run(args)


def command() -> None:
    """The `fid` process (console script, `python -m fid`): after a training run it ignores
    SIGUSR1/SIGTERM until it exits, so that a late one during the shutdown is no kill."""
    STOP_SIGNALS.ignore_when_released()
    sys.exit(main())


def _run(args: argparse.Namespace) -> int:
    """Runs one parsed command: its exit status (EXIT_ERROR on bad input, EXIT_PREEMPTED)."""
    from fid.cli.paths import command_paths
    from fid.runtime.fileio import check_writable
    from fid.runtime.launcher import DistributedError, init_from_env
    from fid.runtime.logs import setup_logging
    from fid.runtime.output_guard import OutputCollision, check_outputs, mark_outputs

    try:
        info = init_from_env()
    except DistributedError as error:
        setup_logging(rank=0)
        logger.error("%s", error)
        return EXIT_ERROR
    # What the outputs would replace, checked first, before the log file is opened (it may be
    # the path a typo gave): never an input, the state, or what fid did not write there.
    try:
        paths = command_paths(args)
        check_outputs(paths, replace=getattr(args, "replace", False))
    except OutputCollision as error:
        setup_logging(rank=info.rank)
        logger.error("%s", error)
        return EXIT_ERROR
    log_file = args.log_file
    if log_file is None and getattr(args, "state_dir", None) is not None:
        log_file = args.state_dir / "train.log"  # (--state-root: in the state, once found)
    # Every rank appends to the run log; other ranks log warnings only. A log named by
    # --log-file is a workflow job's: the console shows that job's progress, results and
    # warnings, and the file everything.
    job = f"{args.command} ({args.log_file})" if args.log_file is not None else None
    try:
        setup_logging(rank=info.rank, file=log_file, job=job)
    except OSError as error:  # a log in a folder that cannot be written: said, on the console
        setup_logging(rank=info.rank, job=job)
        logger.error("%s", input_error_message(error, args))
        return EXIT_ERROR
    # A command that runs no model needs neither torch nor a device (parser.MODEL_FREE); one
    # that runs torch on the CPU only, no device (parser.DEVICE_FREE).
    distributed = None
    args.device = None
    try:
        prepare = getattr(args, "prepare", None)
        if prepare is not None:  # a command's inputs checked before torch's seconds of import
            prepare(args)
        if args.runs_models or info.is_distributed:
            from fid.runtime import distributed
            from fid.runtime.heap import return_freed_memory

            return_freed_memory()  # the resident size is what the tensors hold (memory plans)
            _set_threads(args.threads)
            if args.takes_device or info.is_distributed:  # else: no CUDA context (DEVICE_FREE)
                args.device = distributed.setup(info)
        # Where the command writes, checked before any work (a read-only or full disk is
        # said at once, not at the end of a training run).
        check_writable(_written_folders(args))
        args.func(args)
        if info.rank == 0:
            mark_outputs(paths)
    except Preempted as stop:
        # The checkpoint is written: a SIGTERM from now on (SLURM sends one to the job's tasks
        # on requeue) must not turn the clean exit into a kill.
        STOP_SIGNALS.ignore()
        from fid.runtime import slurm_job

        if slurm_job.requeue_after_stop(
            info.rank == 0, stop.signals, stop.steps, stop.trained_s, stop.startup_s
        ):
            logger.warning("%s: exit %d, the job resumes when SLURM starts it again",
                           stop, EXIT_PREEMPTED)  # fmt: skip
        else:
            logger.warning("%s: exit %d; rerun the same command to resume", stop, EXIT_PREEMPTED)
        return EXIT_PREEMPTED
    except Exception as error:  # the command's end: every error gets its message and status
        if is_input_error(error):
            logger.error("%s", input_error_message(error, args))
        else:
            logger.error("%s: %s", type(error).__name__, error, exc_info=error)
            logger.error(
                "this is a bug in fid (no input check explains the error above): please report "
                "it with the command line and this traceback"
            )
        return EXIT_ERROR
    finally:
        if distributed is not None:
            distributed.cleanup()
    return 0


def _written_folders(args: argparse.Namespace) -> list[Path]:
    """The folders a command writes in: its state folders, and the folder beside each output
    (files and folders are written there under a temporary name, then renamed)."""
    folders = [getattr(args, flag, None) for flag in ("state_dir", "state_root")]
    files = [getattr(args, flag, None) for flag in (*OUTPUT_FLAGS, "log_file")]
    folders += [Path(path).parent for path in files if path is not None]
    return [Path(folder) for folder in folders if folder is not None]
