"""What Snakemake's SLURM plugin (2.8) cannot tell from its job-status polls, told: a job that
was preempted and cancelled has failed, a job waiting on a limit that never lifts has failed, a
job waiting on a limit that other jobs hold is named in a warning, and the status command is
one that works on this cluster.

The plugin takes each poll's states from one `squeue` or `sacct` call and
- reports PREEMPTED as still running ("we leave it to SLURM to resume"): right under
  PreemptMode=REQUEUE, where the job comes back PENDING, but under PreemptMode=CANCEL the job
  has ended and Snakemake waits for it forever;
- reports PENDING as running whatever the reason: a job over a QOS or association limit, or
  over its partition's MaxTime, waits without a word, forever where the limit is per job;
- defaults to `sacct` wherever the command exists, which fails on every poll where the cluster
  has no accounting database ("Slurm accounting storage is disabled").

`StatusReview.review_poll` wraps the plugin's poll (`install`, from rules/slurm.smk): a
PREEMPTED that `scontrol` confirms has ended becomes CANCELLED, which the plugin reports as a
failure (the rule's retry resumes from its checkpoint); a job pending for a per-job limit is
cancelled and reported likewise; a shared-limit reason is logged once per job and reason.
Written here rather than in the plugin: the plugin is pinned (pyproject.toml), and
tests/test_slurm_status.py fails if the function this wraps moves.

Only the standard library: the workflow calls it while Snakemake runs.
"""

from __future__ import annotations

import logging
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field

logger = logging.getLogger("fid")

# Pending reasons (squeue %r) that no other job's end can lift: the job asks more than one job
# may have, or names what does not exist. SLURM keeps such a job PENDING until an administrator
# changes the limit.
NEVER_CLEARS = re.compile(
    r"^(PartitionTimeLimit|PartitionNodeLimit|PartitionConfig|BadConstraints|InvalidAccount"
    r"|InvalidQOS|DependencyNeverSatisfied|(QOS|Assoc)Max\w*Per(Job|Node)\w*)$"
)
# Reasons that lift when the user's or group's other jobs end: a warning, the job waits.
SHARED_LIMIT = re.compile(r"^((QOS|Assoc)\w*(Grp|PerUser|PerAccount|MaxJobs|MaxSubmit)\w*)$")
# What the plugin reports as a failure (its fail_stati); the reviewed states use this one.
FAILED_STATE = "CANCELLED"


def _run(args: list[str]) -> str:
    try:
        result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    return result.stdout if result.returncode == 0 else ""


@dataclass
class StatusReview:
    """One workflow's reviews across polls: what was said already is not said again."""

    run_name: str  # the plugin's --job-name for every job of this run (its run uuid)
    run: Callable[[list[str]], str] = _run  # a SLURM command's stdout ("" when it failed)
    failed: dict[str, str] = field(default_factory=dict)  # job id -> why it counts as failed
    warned: set[tuple[str, str]] = field(default_factory=set)  # (job id, reason) logged

    def review_poll(self, states: dict[str, str] | None) -> dict[str, str] | None:
        """The plugin's `{job id: state}` with the states it would misread corrected."""
        if not states:
            return states
        reviewed = dict(states)
        for job, state in states.items():
            # (a job counted failed stays so: the plugin may poll once more before it reports)
            if job in self.failed or (state == "PREEMPTED" and self._preempted_and_ended(job)):
                reviewed[job] = FAILED_STATE
        if any(state == "PENDING" for state in reviewed.values()):
            for job in self._stuck_pending(reviewed):
                reviewed[job] = FAILED_STATE
        return reviewed

    def _preempted_and_ended(self, job: str) -> bool:
        """A PREEMPTED job that SLURM will not requeue: `scontrol` still says PREEMPTED (under
        PreemptMode=REQUEUE the job is PENDING again by then)."""
        info = dict(re.findall(r"(\w+)=(\S*)", self.run(["scontrol", "show", "job", "-o", job])))
        if info.get("JobState", "PREEMPTED") != "PREEMPTED":
            return False
        why = (
            f"SLURM job {job} ({_rule_of(info.get('Comment', ''))}) was preempted and "
            f"cancelled (partition {info.get('Partition', '?')}: PreemptMode=CANCEL, SLURM "
            "does not requeue it): reported to Snakemake as failed; a retry resumes from the "
            "job's last checkpoint"
        )
        logger.warning(why)
        self.failed[job] = why
        return True

    def _stuck_pending(self, states: dict[str, str]) -> list[str]:
        """Jobs pending for a reason that never clears, cancelled (each with one error line);
        shared-limit reasons logged once. One squeue call for the run's pending jobs."""
        out = self.run(["squeue", "-h", "-t", "PD", "--name", self.run_name, "-o", "%i|%r|%k|%P"])
        stuck = []
        for line in out.splitlines():
            job, reason, comment, partition = (line.split("|") + ["", "", ""])[:4]
            if states.get(job) != "PENDING":
                continue
            rule = _rule_of(comment)
            if NEVER_CLEARS.match(reason):
                why = (
                    f"SLURM job {job} ({rule}) pends for {reason}, a limit no other job's end "
                    f"lifts (partition {partition}): cancelled and reported to Snakemake as "
                    "failed. Hint: lower that rule's resources (runtime, nodes, gres, mem_mb) "
                    "to the partition's or QOS's per-job limit, or name another "
                    "slurm_partition / qos"
                )
                logger.error(why)
                self.run(["scancel", job])
                self.failed[job] = why
                stuck.append(job)
            elif SHARED_LIMIT.match(reason) and (job, reason) not in self.warned:
                self.warned.add((job, reason))
                logger.warning(
                    "SLURM job %s (%s) pends for %s: a QOS or association limit that the "
                    "user's or account's other jobs hold; it starts when they end",
                    job,
                    rule,
                    reason,
                )
        return stuck


def _rule_of(comment: str) -> str:
    """ "rule train_reader, wildcards tiny_0_reader" from the plugin's --comment."""
    match = re.match(r"rule_(\w+?)_wildcards_(\S*)$", comment)
    if match:
        return f"rule {match.group(1)}, wildcards {match.group(2)}"
    match = re.match(r"rule_(\w+)$", comment)
    return f"rule {match.group(1)}" if match else "rule unknown"


def status_command_for(chosen: str, run: Callable[[list[str]], str] = _run) -> str:
    """`chosen` unless it is sacct on a cluster without an accounting database, where every
    sacct call fails: then squeue (which shows ended jobs for MinJobAge seconds)."""
    if chosen != "sacct":
        return chosen
    config = run(["scontrol", "show", "config"])
    storage = re.search(r"^AccountingStorageType\s*=\s*(\S+)", config, re.MULTILINE)
    if storage and storage.group(1) == "accounting_storage/none":
        age = re.search(r"^MinJobAge\s*=\s*(\d+)", config, re.MULTILINE)
        logger.warning(
            "this cluster has no accounting database (AccountingStorageType=%s): job states "
            "come from squeue, which keeps an ended job for MinJobAge=%s s",
            storage.group(1),
            age.group(1) if age else "?",
        )
        return "squeue"
    return chosen


def install(plugin_module, executor_settings) -> StatusReview:
    """Wraps the plugin's poll (`plugin_module.query_job_status`, looked up at every poll) with
    a review, and sets its status command to one the cluster answers. Installing twice wraps
    once."""
    executor_settings.status_command = status_command_for(executor_settings.status_command)
    poll = getattr(plugin_module.query_job_status, "wrapped", plugin_module.query_job_status)
    review = StatusReview(run_name="")

    async def reviewed_poll(command: str, plugin_logger):
        states, duration = await poll(command, plugin_logger)
        # the plugin names every job of the run after its run uuid and asks by that name
        review.run_name = review.run_name or _name_in(command)
        return review.review_poll(states), duration

    reviewed_poll.wrapped = poll
    plugin_module.query_job_status = reviewed_poll
    return review


def _name_in(command: str) -> str:
    match = re.search(r"--name[= ](\S+)", command)
    return match.group(1) if match else ""
