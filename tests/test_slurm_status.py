"""fid.runtime.slurm_status: the SLURM plugin's job-status polls reviewed (issue 45.3, 45.4, 45.6).

SLURM's answers are fakes here, in the formats SLURM 22.05 prints them; tests/slurm runs the
review on a real cluster (a job preempted under PreemptMode=CANCEL, one over a partition's
MaxTime).
"""

from __future__ import annotations

import asyncio
import logging
import types
from pathlib import Path

import pytest
import snakemake_executor_plugin_slurm as plugin
import yaml

from fid.runtime import slurm_status
from fid.runtime.slurm_status import StatusReview, install, status_command_for

ROOT = Path(__file__).resolve().parents[1]
RUN = "6f1c1b1e-run-uuid"


class FakeSlurm:
    """Answers `scontrol show job`, `squeue -t PD` and `scancel` from tables; records calls."""

    def __init__(self, jobs: dict[str, str] | None = None, pending: list[str] | None = None):
        self.jobs = jobs or {}  # job id -> scontrol's one-line record
        self.pending = pending or []  # squeue lines: id|reason|comment|partition
        self.calls: list[list[str]] = []

    def __call__(self, args: list[str]) -> str:
        self.calls.append(args)
        if args[:3] == ["scontrol", "show", "job"]:
            return self.jobs.get(args[-1], "")
        if args[0] == "squeue":
            assert args[args.index("--name") + 1] == RUN
            return "\n".join(self.pending) + "\n"
        return ""

    def cancelled(self) -> list[str]:
        return [args[1] for args in self.calls if args[0] == "scancel"]


def _job(job: str, state: str, partition: str = "spot") -> str:
    return (
        f"JobId={job} JobName={RUN} JobState={state} Reason=None Partition={partition} "
        f"Restarts=0 Comment=rule_train_retriever_wildcards_tiny_0"
    )


def test_a_job_preempted_and_cancelled_is_a_failure_the_plugin_reports(caplog):
    slurm = FakeSlurm(jobs={"17": _job("17", "PREEMPTED")})
    review = StatusReview(RUN, run=slurm)
    with caplog.at_level(logging.WARNING, logger="fid"):
        reviewed = review.review_poll({"17": "PREEMPTED", "18": "RUNNING"})
    assert reviewed == {"17": "CANCELLED", "18": "RUNNING"}
    assert reviewed["17"] in _plugin_failure_states()
    (message,) = [r.getMessage() for r in caplog.records]
    assert "SLURM job 17 (rule train_retriever, wildcards tiny_0) was preempted and cancelled" in (
        message
    )
    assert "partition spot: PreemptMode=CANCEL" in message and "resumes" in message
    # the plugin may poll once more before it reports: the job stays failed
    assert review.review_poll({"17": "PREEMPTED"}) == {"17": "CANCELLED"}


def test_a_preempted_job_that_slurm_requeues_is_left_to_slurm():
    """PreemptMode=REQUEUE: by the time scontrol is asked the job is PENDING again."""
    slurm = FakeSlurm(jobs={"17": _job("17", "PENDING", "debug")})
    assert StatusReview(RUN, run=slurm).review_poll({"17": "PREEMPTED"}) == {"17": "PREEMPTED"}
    assert slurm.cancelled() == []


@pytest.mark.parametrize(
    "reason",
    ["PartitionTimeLimit", "QOSMaxGRESPerJob", "QOSMaxWallDurationPerJobLimit",
     "AssocMaxNodesPerJobLimit", "InvalidQOS", "BadConstraints"],
)  # fmt: skip
def test_a_job_pending_on_a_limit_that_never_lifts_is_cancelled_and_failed(reason, caplog):
    slurm = FakeSlurm(pending=[f"21|{reason}|rule_train_reader_wildcards_nq_0_reader|gpu"])
    review = StatusReview(RUN, run=slurm)
    with caplog.at_level(logging.ERROR, logger="fid"):
        reviewed = review.review_poll({"21": "PENDING", "22": "RUNNING"})
    assert reviewed == {"21": "CANCELLED", "22": "RUNNING"}
    assert slurm.cancelled() == ["21"]
    (message,) = [r.getMessage() for r in caplog.records]
    assert f"SLURM job 21 (rule train_reader, wildcards nq_0_reader) pends for {reason}" in message
    assert "partition gpu" in message and "Hint:" in message


@pytest.mark.parametrize(
    "reason", ["QOSMaxGRESPerUser", "AssocGrpGRES", "QOSGrpCpuLimit", "AssocMaxJobsLimit"]
)
def test_a_job_pending_on_a_shared_limit_is_named_once_and_waits(reason, caplog):
    slurm = FakeSlurm(pending=[f"21|{reason}|rule_train_reader_wildcards_nq_0_reader|gpu"])
    review = StatusReview(RUN, run=slurm)
    with caplog.at_level(logging.WARNING, logger="fid"):
        for _ in range(3):
            assert review.review_poll({"21": "PENDING"}) == {"21": "PENDING"}
    (message,) = [r.getMessage() for r in caplog.records]
    assert f"SLURM job 21 (rule train_reader, wildcards nq_0_reader) pends for {reason}" in message
    assert slurm.cancelled() == []


@pytest.mark.parametrize("reason", ["Priority", "Resources", "BeginTime", "Dependency", "None"])
def test_a_job_waiting_its_turn_is_left_alone(reason, caplog):
    slurm = FakeSlurm(pending=[f"21|{reason}|rule_train_reader|gpu"])
    with caplog.at_level(logging.WARNING, logger="fid"):
        assert StatusReview(RUN, run=slurm).review_poll({"21": "PENDING"}) == {"21": "PENDING"}
    assert not caplog.records and slurm.cancelled() == []


def test_squeue_is_asked_only_when_a_job_pends():
    slurm = FakeSlurm()
    StatusReview(RUN, run=slurm).review_poll({"1": "RUNNING", "2": "COMPLETED"})
    assert slurm.calls == []


CONFIG = "AccountingStorageType   = {storage}\nMinJobAge               = 600 sec\n"


@pytest.mark.parametrize(
    "chosen, storage, expected",
    [("sacct", "accounting_storage/none", "squeue"),
     ("sacct", "accounting_storage/slurmdbd", "sacct"),
     ("squeue", "accounting_storage/slurmdbd", "squeue"),
     ("squeue", "accounting_storage/none", "squeue")],
)  # fmt: skip
def test_sacct_is_used_where_the_cluster_keeps_accounts(chosen, storage, expected, caplog):
    def run(args):
        assert args == ["scontrol", "show", "config"]
        return CONFIG.format(storage=storage)

    with caplog.at_level(logging.WARNING, logger="fid"):
        assert status_command_for(chosen, run=run) == expected
    if chosen != expected:
        assert "no accounting database" in caplog.text and "MinJobAge=600 s" in caplog.text


def test_the_profile_leaves_the_status_command_to_the_cluster():
    """It forced squeue, so on a cluster with accounting an ended job that left squeue's view
    (MinJobAge) counted as running."""
    profile = yaml.safe_load((ROOT / "profiles" / "slurm" / "config.yaml").read_text())
    assert "slurm-status-command" not in profile


def test_install_wraps_the_plugins_poll_once(monkeypatch):
    polls = []

    async def query_job_status(command, logger):
        polls.append(command)
        return {"17": "PREEMPTED"}, 0.01

    module = types.SimpleNamespace(query_job_status=query_job_status)
    settings = types.SimpleNamespace(status_command="squeue")
    slurm = FakeSlurm(jobs={"17": _job("17", "PREEMPTED")})
    monkeypatch.setattr(slurm_status, "_run", slurm)
    install(module, settings)
    review = install(module, settings)  # a second install (a rerun in one process) wraps once
    assert module.query_job_status.wrapped is query_job_status
    command = f"squeue --format='%i|%T' --states=all --noheader --name {RUN}"
    states, duration = asyncio.run(module.query_job_status(command, logging.getLogger()))
    assert states == {"17": "CANCELLED"} and duration == 0.01
    assert polls == [command] and review.run_name == RUN


def test_the_pinned_plugin_polls_through_the_function_install_wraps():
    """The review works by replacing the plugin module's `query_job_status`, which its executor
    looks up at every poll; a plugin that moved it would silently bypass the review."""
    assert asyncio.iscoroutinefunction(getattr(plugin.query_job_status, "wrapped", None)
                                       or plugin.query_job_status)  # fmt: skip
    assert "query_job_status" in plugin.Executor.check_active_jobs.__code__.co_names
    assert "CANCELLED" in _plugin_failure_states()


def _plugin_failure_states() -> tuple:
    """The plugin's fail_stati: the constant tuple in check_active_jobs."""
    constants = plugin.Executor.check_active_jobs.__code__.co_consts
    return next(c for c in constants if isinstance(c, tuple) and "FAILED" in c)
