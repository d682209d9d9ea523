"""A workflow job's console: the few lines a person watching `snakemake` wants from each job.

Several jobs and Snakemake share one terminal, and each job's whole log goes to its log file
(`fid --log-file`, fid.runtime.logs). Its console then shows only progress lines and results
(records logged with `extra=CONSOLE`) and every warning and error, each prefixed by the job
(its command and log file). Standard library only: the pure-Python stages log progress too.
"""

from __future__ import annotations

import logging

# `logger.info(..., extra=CONSOLE)`: a record that a workflow job also shows on the console
# (progress lines, results); every other INFO record goes to the job's log file only.
CONSOLE = {"console": True}

_active = False  # use_job_console was called: long loops show lines, not a terminal bar


class _JobConsole(logging.Filter):
    """Passes progress lines and results (marked CONSOLE) and every warning and error; names
    the job on each line, and the level on warnings and errors."""

    def __init__(self, job: str):
        super().__init__()
        self.job = job

    def filter(self, record: logging.LogRecord) -> bool:
        record.job = self.job
        record.tag = f"{record.levelname}: " if record.levelno >= logging.WARNING else ""
        return record.levelno >= logging.WARNING or getattr(record, "console", False)


def use_job_console(handler: logging.Handler, job: str | None) -> None:
    """Makes `handler` (the stderr one) a job console labelled `job`: "12:03:04 JOB: line";
    with None, records that the console is a plain one (a later run in the same process)."""
    global _active
    _active = job is not None
    if job is None:
        return
    handler.addFilter(_JobConsole(job))
    handler.setFormatter(logging.Formatter("%(asctime)s %(job)s: %(tag)s%(message)s", "%H:%M:%S"))


def job_console() -> bool:
    """Whether the console is a workflow job's: long loops then show progress as lines there,
    never as a terminal bar that other jobs' lines would cut."""
    return _active
