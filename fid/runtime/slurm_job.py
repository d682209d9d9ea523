"""The SLURM job a training command runs in, as its environment says: which attempt this is,
how long before the time limit its stop signal comes, and the requeue after a clean stop.

The workflow's training rules (rules/slurm.smk) submit with `--signal=USR1@LEAD` and export
FID_SIGNAL_LEAD_S=LEAD and FID_SLURM_REQUEUE=0|1 to the ranks (srun --export).

Only the standard library: read by the command before torch is imported.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import time

logger = logging.getLogger(__name__)

SIGNAL_LEAD_ENV = "FID_SIGNAL_LEAD_S"
REQUEUE_ENV = "FID_SLURM_REQUEUE"
MAX_REQUEUES_ENV = "FID_SLURM_MAX_REQUEUES"
# A 2-day run in 4-hour jobs requeues 11 times: room for that, a bound on a job that stops and
# requeues without end.
DEFAULT_MAX_REQUEUES = 20


def job_id() -> str | None:
    return os.environ.get("SLURM_JOB_ID") or None


def describe() -> str | None:
    """ "SLURM job 1234" (", requeued 2 times" where SLURM says so), or None outside a job.
    SLURM counts a requeued job's restarts in SLURM_RESTART_COUNT, which the workflow's ranks
    do not see (the SLURM plugin's job step drops SLURM_* variables): the run numbers its
    starts itself (fid.cli.commands)."""
    job = job_id()
    if job is None:
        return None
    restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    requeued = f", requeued {restarts} time{'s' if restarts != 1 else ''}" if restarts else ""
    return f"SLURM job {job}{requeued}"


def signal_lead_s() -> float | None:
    """Seconds between the stop signal and the time limit, when the job was given one."""
    value = os.environ.get(SIGNAL_LEAD_ENV)
    if not value:
        return None
    try:
        lead = float(value)
    except ValueError:
        logger.warning("%s=%r is not a number of seconds: ignored", SIGNAL_LEAD_ENV, value)
        return None
    return lead if lead > 0 else None


def process_age_s() -> float:
    """Seconds since this process started, as the kernel records its start (psutil)."""
    import psutil  # here: the module itself is read before anything but the standard library

    return time.time() - psutil.Process().create_time()


def max_requeues() -> int:
    """How many times a job may requeue itself (FID_SLURM_MAX_REQUEUES; the workflow exports the
    rule's `max_requeues`)."""
    value = os.environ.get(MAX_REQUEUES_ENV, "")
    try:
        return int(value) if value else DEFAULT_MAX_REQUEUES
    except ValueError:
        logger.warning("%s=%r is not a count: %d used", MAX_REQUEUES_ENV, value,
                       DEFAULT_MAX_REQUEUES)  # fmt: skip
        return DEFAULT_MAX_REQUEUES


def requeue_after_stop(
    is_main: bool,
    signals: frozenset[int] = frozenset(),
    steps: int = 0,
    trained_s: float = 0.0,
    startup_s: float = 0.0,
) -> bool:
    """With FID_SLURM_REQUEUE=1 inside a SLURM job, rank 0 requeues the job after its
    checkpoint is written: SLURM starts it again (the same id, a fresh time limit) and the
    training resumes, without ending the job as failed (which would spend one of Snakemake's
    retries). True when the job was requeued.

    Only the time-limit warning requeues (SIGUSR1, `--signal=USR1@LEAD`), and a preemption
    under PreemptMode=REQUEUE. Other SIGTERMs do not: `scancel` (a user's, or Snakemake's on
    Ctrl-C) and the time limit itself send SIGTERM, and SLURM accepts a requeue of a job being
    cancelled, which brought a cancelled job back. A preemption also sends SIGTERM, at the
    start of the partition's GraceTime (scontrol shows a PreemptTime): SLURM requeues the job
    only if it still runs when the grace time ends, and a job that checkpointed and exited
    before ends FAILED; so under REQUEUE rank 0 requeues it at once, under CANCEL it does not
    (the exit is a failure whose retry resumes). Nor does a start
    of a job given a lead (FID_SIGNAL_LEAD_S: the workflow's jobs) that trained for less time
    than it took to start (loading, building, resuming: each requeue would cost more than it
    trains; a lead close to the runtime, or a time limit that comes seconds after the start,
    requeued without end, a step or two each time; without a lead, the USR1 is somebody's
    explicit request and is honoured), a job requeued `max_requeues()` times already, or a job
    SLURM no longer shows RUNNING. Each refusal is one line in the log; the command then exits
    non-zero (75), which Snakemake sees as a failure whose retry resumes.

    Args:
        signals: the stop signals this rank received.
        steps: optimizer steps this start made; trained_s: seconds it trained; startup_s:
            seconds from the process's start to its first step.
    """
    job = job_id()
    if os.environ.get(REQUEUE_ENV) != "1" or job is None or not is_main:
        return False
    if signal.SIGTERM in signals or signal.SIGUSR1 not in signals:
        mode = _preemption_mode(job)
        if mode == "REQUEUE":
            logger.warning(
                "SLURM job %s is being preempted (PreemptMode=REQUEUE): requeued now, its "
                "checkpoint written in the grace time (a job that ends before the grace time "
                "does would end FAILED, not requeued)",
                job,
            )
            return _requeue(job)
        logger.warning(
            "SLURM job %s: stopped by SIGTERM (%s), not by the time-limit warning: not "
            "requeued, the checkpoint is kept",
            job,
            f"a preemption under PreemptMode={mode}"
            if mode
            else "scancel, a preemption or the time limit itself",
        )
        return False
    if steps == 0 or (signal_lead_s() is not None and trained_s < startup_s):
        logger.error(
            "SLURM job %s: this start trained %.0f s (%d steps) before its stop signal, less "
            "than the %.0f s it took to start: not requeued again (each requeue would cost "
            "more than it trains); give the job a longer runtime or a smaller signal_lead_s",
            job, trained_s, steps, startup_s,
        )  # fmt: skip
        return False
    record = _job_record(job)
    state, restarts = record.get("JobState"), record.get("Restarts")
    restarts = int(restarts) if restarts and restarts.isdigit() else None
    if state is not None and state != "RUNNING":
        logger.warning("SLURM job %s is %s: not requeued", job, state)
        return False
    most = max_requeues()
    if restarts is not None and restarts >= most:
        logger.error(
            "SLURM job %s was requeued %d times already (max_requeues %d): not again; "
            "Snakemake's retry, or a rerun, resumes it", job, restarts, most,
        )  # fmt: skip
        return False
    return _requeue(job)


def _requeue(job: str) -> bool:
    try:
        result = subprocess.run(
            ["scontrol", "requeue", job], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError) as error:
        logger.error("scontrol requeue %s failed: %s", job, error)
        return False
    if result.returncode != 0:
        logger.error("scontrol requeue %s failed: %s", job, result.stderr.strip())
        return False
    logger.warning("requeued SLURM job %s: it starts again and resumes", job)
    return True


def _scontrol_show(*what: str) -> dict[str, str]:
    """`scontrol show ...` as {key: value} ({} when it cannot be asked): a job's or a
    partition's `Key=Value` fields, or the config's `Key = Value` lines."""
    try:
        result = subprocess.run(
            ["scontrol", "show", *what], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    return dict(re.findall(r"(\w+) *= *(\S*)", result.stdout))


def _job_record(job: str) -> dict[str, str]:
    """The job as `scontrol show job` tells: JobState, Restarts, Partition, PreemptTime, ..."""
    return _scontrol_show("job", "-o", job)


def _preemption_mode(job: str) -> str | None:
    """The PreemptMode (REQUEUE, CANCEL, ...) under which this running job is being preempted,
    or None when it is not (no PreemptTime). REQUEUE only for a job that may be requeued."""
    record = _job_record(job)
    if record.get("PreemptTime", "None") in ("None", "Unknown", "") or (
        record.get("JobState") != "RUNNING"
    ):
        return None
    mode = _scontrol_show("partition", record.get("Partition", "")).get("PreemptMode", "")
    if mode in ("", "OFF"):  # the partition follows the cluster's
        mode = _scontrol_show("config").get("PreemptMode", "CANCEL")
    mode = mode.split(",")[0].upper()  # e.g. "REQUEUE,GANG"
    return "CANCEL" if mode == "REQUEUE" and record.get("Requeue") == "0" else mode
