"""A training job under SLURM, as fid sees it: the layout against the cluster's partitions, the
stop's measured cost against the signal's lead, the requeue, and logs that keep every start."""

from __future__ import annotations

import logging
import os
import signal
import stat

import pytest

from fid.runtime import slurm_job
from fid.runtime.logs import copy_earlier_starts
from fid.runtime.slurm_layout import (
    gres_gpus,
    layout_of,
    layout_problems,
    layouts_refused,
    parse_sinfo,
    read_partitions,
)
from fid.training.stop_budget import StopBudget

# `sinfo -h -o "%P|%D|%c|%m|%G|%l"` of a cluster: a CPU default partition, typed GPU nodes
SINFO = """cpu*|40|64|256000|(null)|2-00:00:00
gpu|16|64|512000|gpu:a100:8(S:0-1)|3-00:00:00
gpu|4|32|256000|gpu:v100:4|3-00:00:00
short|8|64|512000|gpu:a100:8|1:00:00
"""
NQ_TRAIN_READER = {"nodes": 8, "tasks_per_node": 8, "gres": "gpu:8", "cpus_per_task": 8,
                   "mpi": "srun", "mem_mb": 480000, "runtime": 2880}  # fmt: skip


def test_sinfo_lines_become_node_groups():
    groups = parse_sinfo(SINFO)
    assert [(g.partition, g.default, g.nodes, g.cpus, g.mem_mb) for g in groups] == [
        ("cpu", True, 40, 64, 256000), ("gpu", False, 16, 64, 512000),
        ("gpu", False, 4, 32, 256000), ("short", False, 8, 64, 512000),
    ]  # fmt: skip
    assert groups[0].gpus == {} and groups[1].gpus == {"a100": 8} and groups[2].gpus == {"v100": 4}
    assert groups[1].max_minutes == 3 * 24 * 60 and groups[3].max_minutes == 60
    assert gres_gpus("gpu:8") == (None, 8) and gres_gpus("gpu:h100.80gb:4") == ("h100.80gb", 4)


@pytest.mark.parametrize(
    "change, problem",
    [
        ({}, None),  # nq.yaml's reader on 8 of the 16 A100 nodes
        ({"slurm_partition": None}, "asks for GPUs but partition 'cpu' (the default"),
        (
            {"slurm_partition": "gpus"},
            "partition 'gpus' does not exist (sinfo shows cpu, gpu, short)",
        ),
        (
            {"nodes": 17},
            "asks 17 node(s) with 64 CPUs, 480000 MB, 8 GPU(s) each; partition 'gpu' has 16",
        ),
        ({"gres": "gpu:v100:8"}, "8 GPU(s) of type v100 each; partition 'gpu' has 0 such node(s)"),
        ({"cpus_per_task": 9}, "asks 8 node(s) with 72 CPUs"),
        ({"mem_mb": 600000}, "600000 MB"),
        (
            {"slurm_partition": "short"},
            "runtime 2880 min exceeds partition 'short''s MaxTime 60 min",
        ),
    ],
)
def test_a_layout_that_cannot_run_is_named_with_its_numbers(change, problem):
    resources = {**NQ_TRAIN_READER, "slurm_partition": "gpu", **change}
    resources = {k: v for k, v in resources.items() if v is not None}
    problems = layout_problems(layout_of("train_reader", resources), parse_sinfo(SINFO))
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems


def test_a_cpu_job_fits_the_default_partition():
    layout = layout_of("build_bm25", {"threads": 16, "mem_mb": 200000, "runtime": 1440})
    assert layout_problems(layout, parse_sinfo(SINFO)) == []


def test_a_partition_list_fits_when_one_of_its_partitions_does():
    """`slurm_partition: short,gpu` (the schema allows a list; SLURM starts the job in the first
    that can) was refused as a partition "short,gpu" that does not exist (issue 45.4)."""
    groups = parse_sinfo(SINFO)
    fits = layout_of("train_reader", {**NQ_TRAIN_READER, "slurm_partition": "short,gpu"})
    assert layout_problems(fits, groups) == []  # short's MaxTime is 60 min; gpu holds it
    neither = layout_of("train_reader", {**NQ_TRAIN_READER, "slurm_partition": "short,gpu2"})
    problems = layout_problems(neither, groups)
    assert any("exceeds partition 'short''s MaxTime 60 min" in p for p in problems), problems
    assert any("partition 'gpu2' does not exist" in p for p in problems), problems
    refused = layouts_refused([fits, neither], groups)
    assert len(refused) == 1 and refused[0].startswith(
        "resources.train_reader: a job of this rule cannot run on this cluster: "
    )


def test_sinfo_is_asked_for_hidden_partitions_too(tmp_path, monkeypatch):
    """A hidden partition (or one of another group) that a job names was "does not exist":
    sinfo shows them only with -a (issue 45.4)."""
    sinfo = tmp_path / "sinfo"
    sinfo.write_text(
        f'#!/bin/sh\necho "$@" > "{tmp_path}/args"\nprintf "hidden|2|8|1000|(null)|1:00:00\\n"\n'
    )
    sinfo.chmod(sinfo.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert [g.partition for g in read_partitions()] == ["hidden"]
    assert (tmp_path / "args").read_text().split()[:2] == ["-a", "-h"]


def test_a_stop_that_outgrows_the_lead_is_said_once_with_the_figure(caplog):
    budget = StopBudget(lead_s=60)
    with caplog.at_level(logging.WARNING, logger="fid.training.stop_budget"):
        budget.step(5.0)
        budget.save(20.0)  # 25 s: fits
        assert not caplog.records
        budget.evaluation(40.0)
        budget.save(21.0)  # 5 + 40 + 21 = 66 s > 60 s
        budget.save(21.0)
    assert len(caplog.records) == 1, caplog.records
    message = caplog.records[0].getMessage()
    assert "needs up to 66 s" in message and "signal_lead_s to at least 82" in message
    quiet = StopBudget(lead_s=None)  # no signal comes: nothing to say
    quiet.step(1e6)
    quiet.save(1e6)


def test_the_job_says_which_slurm_job_it_is(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert slurm_job.describe() is None
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    assert slurm_job.describe() == "SLURM job 4242"
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    assert slurm_job.describe() == "SLURM job 4242, requeued 2 times"
    monkeypatch.setenv(slurm_job.SIGNAL_LEAD_ENV, "600")
    assert slurm_job.signal_lead_s() == 600
    monkeypatch.setenv(slurm_job.SIGNAL_LEAD_ENV, "0")
    assert slurm_job.signal_lead_s() is None


def _fake_scontrol(folder, status, state="RUNNING", restarts=0, preempt_time="None",
                   preempt_mode="REQUEUE", requeue=1):  # fmt: skip
    """scontrol on PATH: `show job` answers with the job's state, restarts and preemption time
    (in partition `debug`, SLURM 22.05's format); `show partition` with its PreemptMode;
    `requeue` exits `status` (saying "nope" on stderr); every call is written to `calls`."""
    script = folder / "scontrol"
    script.write_text(f"""#!/bin/sh
echo "$@" >> "{folder}/calls"
if [ "$2" = job ]; then echo "JobId=77 JobName=x JobState={state} Reason=None Requeue={requeue} Restarts={restarts} Partition=debug PreemptEligibleTime=2026-12-05T17:46:22 PreemptTime={preempt_time}"; exit 0; fi
if [ "$2" = partition ]; then echo "PartitionName=debug PriorityTier=1 PreemptMode={preempt_mode} GraceTime=30"; exit 0; fi
echo nope >&2
exit {status}
""")  # fmt: skip
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return folder / "calls"


USR1, TERM = frozenset({signal.SIGUSR1}), frozenset({signal.SIGTERM})


@pytest.mark.parametrize(
    "asked, status, requeued", [("1", 0, True), ("0", 0, False), ("1", 1, False)]
)
def test_rank_0_requeues_only_when_asked(tmp_path, monkeypatch, caplog, asked, status, requeued):
    calls = _fake_scontrol(tmp_path, status)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv(slurm_job.REQUEUE_ENV, asked)
    assert slurm_job.requeue_after_stop(False, USR1, steps=3) is False
    assert slurm_job.requeue_after_stop(True, USR1, steps=3) is requeued
    expected = "show job -o 77\nrequeue 77\n" if asked == "1" else ""
    assert (calls.read_text() if calls.exists() else "") == expected
    if status:
        assert "scontrol requeue 77 failed: nope" in caplog.text


@pytest.mark.parametrize(
    "signals, steps, state, restarts, said",
    [
        (TERM, 3, "RUNNING", 0, "stopped by SIGTERM (scancel"),  # a cancel, a preemption
        (USR1 | TERM, 3, "RUNNING", 0, "stopped by SIGTERM"),  # cancelled after the warning
        (USR1, 0, "RUNNING", 0, "this start trained 0 s (0 steps) before its stop signal"),
        (USR1, 3, "CANCELLED", 0, "SLURM job 77 is CANCELLED: not requeued"),
        (USR1, 3, "RUNNING", 20, "requeued 20 times already (max_requeues 20)"),
    ],
)
def test_a_cancel_a_stop_without_progress_and_too_many_requeues_do_not_requeue(
    tmp_path, monkeypatch, caplog, signals, steps, state, restarts, said
):
    """Issue 45.1/45.2: fid requeued after any stop, so a plain `scancel` (SIGTERM) put the
    job back to PENDING, and a job whose signal came before its first step requeued forever.
    Only the time-limit warning (SIGUSR1) of a start that made progress, in a job still
    RUNNING and requeued fewer than max_requeues times, requeues; each refusal says why."""
    calls = _fake_scontrol(tmp_path, 0, state, restarts)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv(slurm_job.REQUEUE_ENV, "1")
    monkeypatch.delenv(slurm_job.MAX_REQUEUES_ENV, raising=False)
    with caplog.at_level(logging.WARNING):
        assert slurm_job.requeue_after_stop(True, signals, steps) is False
    assert said in caplog.text
    assert "requeue 77" not in (calls.read_text() if calls.exists() else "")


def test_max_requeues_comes_from_the_workflow(tmp_path, monkeypatch):
    _fake_scontrol(tmp_path, 0, restarts=3)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv(slurm_job.REQUEUE_ENV, "1")
    monkeypatch.setenv(slurm_job.MAX_REQUEUES_ENV, "3")
    assert slurm_job.requeue_after_stop(True, USR1, steps=1) is False
    monkeypatch.setenv(slurm_job.MAX_REQUEUES_ENV, "4")
    assert slurm_job.requeue_after_stop(True, USR1, steps=1) is True


def test_a_start_that_trained_less_than_it_took_to_start_does_not_requeue(
    tmp_path, monkeypatch, caplog
):
    """A start whose stop signal came soon after it began (a lead close to the runtime, a slow
    start; in one run 2 s after the start) trained a step or two and requeued again, without
    end: each requeue cost more than it trained. It is not requeued again when it trained for
    less time than it took to start (issue 45.2; the loop always makes a step first)."""
    _fake_scontrol(tmp_path, 0)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv(slurm_job.REQUEUE_ENV, "1")
    monkeypatch.setenv(slurm_job.SIGNAL_LEAD_ENV, "600")  # a workflow job: the time limit's
    assert not slurm_job.requeue_after_stop(True, USR1, steps=2, trained_s=3.0, startup_s=40.0)
    assert "this start trained 3 s (2 steps) before its stop signal, less than the 40 s it " in (
        caplog.text
    )
    assert slurm_job.requeue_after_stop(True, USR1, steps=900, trained_s=7200.0, startup_s=40.0)
    # no lead: a USR1 sent by hand (scancel --signal=USR1) is honoured, however early
    monkeypatch.delenv(slurm_job.SIGNAL_LEAD_ENV)
    assert slurm_job.requeue_after_stop(True, USR1, steps=2, trained_s=3.0, startup_s=40.0)


def test_a_workflow_log_gets_the_earlier_starts(tmp_path):
    run_log, job_log = tmp_path / "state" / "train.log", tmp_path / "job.log"
    copy_earlier_starts(b"", run_log, job_log)  # a first start: nothing earlier
    assert not job_log.exists()
    job_log.write_text("start 2 first line\n")
    copy_earlier_starts(b"start 1 line\nstopping at step 40 on a signal\npartial", run_log, job_log)
    assert job_log.read_text() == (
        "start 2 first line\n"
        f"==== earlier starts of this run (from {run_log}) ====\n"
        "start 1 line\nstopping at step 40 on a signal\npartial\n"
        "==== this start ====\n"
    )


@pytest.mark.parametrize(
    "mode, requeue, requeued, said",
    [
        ("REQUEUE", 1, True, "SLURM job 77 is being preempted (PreemptMode=REQUEUE): requeued now"),
        ("CANCEL", 1, False, "stopped by SIGTERM (a preemption under PreemptMode=CANCEL)"),
        ("REQUEUE", 0, False, "stopped by SIGTERM (a preemption under PreemptMode=CANCEL)"),
    ],
)
def test_a_preemption_under_requeue_requeues_at_once(
    tmp_path, monkeypatch, caplog, mode, requeue, requeued, said
):
    """Issue 45.3, seen on the test cluster: a preempted job gets SIGTERM at the start of its
    GraceTime and SLURM requeues it only if it still runs when the grace time ends; fid's ranks
    checkpointed and exited within it, so the job ended FAILED and was not requeued. Rank 0
    now requeues it itself where the partition's PreemptMode is REQUEUE (and the job may be
    requeued), with no bound on progress: SLURM would requeue it anyway."""
    calls = _fake_scontrol(tmp_path, 0, preempt_time="2026-12-05T17:46:25",
                           preempt_mode=mode, requeue=requeue)  # fmt: skip
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv(slurm_job.REQUEUE_ENV, "1")
    monkeypatch.setenv(slurm_job.SIGNAL_LEAD_ENV, "600")
    with caplog.at_level(logging.WARNING):
        assert slurm_job.requeue_after_stop(True, TERM, steps=0) is requeued
    assert said in caplog.text
    assert ("requeue 77" in calls.read_text()) is requeued
