"""The SLURM job a training command runs in, as its environment says: which attempt this is,
how long before the time limit its stop signal comes, and the requeue after a clean stop.

The workflow's training rules (rules/slurm.smk) submit with `--signal=USR1@LEAD` and export
FID_SIGNAL_LEAD_S=LEAD and FID_SLURM_REQUEUE=0|1 to the ranks (srun --export).

Only the standard library: read by the command before torch is imported.
"""

from __future__ import annotations

import logging
import os
import subprocess

logger = logging.getLogger(__name__)

SIGNAL_LEAD_ENV = "FID_SIGNAL_LEAD_S"
REQUEUE_ENV = "FID_SLURM_REQUEUE"


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


def requeue_after_stop(is_main: bool) -> bool:
    """With FID_SLURM_REQUEUE=1 inside a SLURM job, rank 0 requeues the job after its
    checkpoint is written: SLURM starts it again (the same id, a fresh time limit) and the
    training resumes, without ending the job as failed (which would spend one of Snakemake's
    retries). True when the job was requeued."""
    job = job_id()
    if os.environ.get(REQUEUE_ENV) != "1" or job is None or not is_main:
        return False
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
