"""The SLURM profile end to end: `snakemake --profile profiles/slurm` runs the whole DAG of the
demo (tests/workflow/config.yaml: the demo's rules at tiny sizes) on the test cluster (2
emulated nodes, fake GPUs). Every reader training is a 2-node `srun` DDP job with the layout of
config/nq.yaml; round 0's is requeued while it trains (`scontrol requeue`, what preemption with
PreemptMode=REQUEUE does), and the workflow still completes, that job resuming its checkpoint.

Runs ~5 minutes on 2 cores: each SLURM job costs 10-15 s however small (the plugin's job step
starts Snakemake twice, then `fid`), plus status polls. `pytest -s` prints the timings.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from .conftest import _unavailable

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv: snakemake, fid, python for the job steps
TINY = ROOT / "tests" / "workflow" / "config.yaml"
WORKFLOW_TIMEOUT_S = 1200
# Two nodes x 2 tasks, one fake GPU per task: the shape of config/nq.yaml's GPU rules (the
# plugin rejects an `mpi` job with tasks_per_node 1).
TWO_NODE_DDP = {"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 1, "gres": "gpu:2",
                "mpi": "srun", "mem_mb": 1000, "runtime": 20}  # fmt: skip


def _config(path: Path) -> Path:
    config = yaml.safe_load(TINY.read_text())
    # One round, one evaluated split and no warm-up stage keep the critical path at ~11 jobs
    # (~10-15 s each).
    config.update(rounds=1, eval_splits=["test"])
    config["data"]["curriculum"]["warmup"] = False
    # Round 0's reader trains long enough (a checkpoint every 10 steps) to be requeued while it
    # runs.
    config["reader"] = {**config["reader"], "max_steps": 150, "save_every_steps": 10,
                        "eval_every_steps": 150, "log_every_steps": 50}  # fmt: skip
    config["resources"] = {
        "default": {"threads": 1, "mem_mb": 500, "runtime": 20},
        "train_reader": TWO_NODE_DDP,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _train_reader_job(slurm, wildcards: str) -> str | None:
    """The id of the (not yet ended) train_reader job whose comment names these wildcards; the
    plugin writes `rule_<rule>_wildcards_<values joined by _>` into --comment."""
    out = slurm.run("squeue", "-h", "-t", "all", "-o", "%i|%k|%T")
    for line in out.splitlines():
        job, comment, state = line.split("|")
        if comment == f"rule_train_reader_wildcards_{wildcards}" and state == "RUNNING":
            return job
    return None


def _wait(condition, timeout: float, what: str, workflow: subprocess.Popen, log: Path):
    deadline = time.monotonic() + timeout
    while (value := condition()) is None:
        if workflow.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}; Snakemake log:\n{log.read_text()[-4000:]}")
        time.sleep(0.2)
    return value


def test_slurm_profile_runs_the_demo_dag_and_survives_a_requeue(slurm, tmp_path):
    if Path("/etc/slurm/slurm.conf").resolve() != slurm.conf.resolve():
        # the plugin strips SLURM_CONF from its jobs: their srun reads only the default path,
        # which harness.sh links to the test cluster unless a real SLURM config is there
        _unavailable("/etc/slurm/slurm.conf is not the test cluster's (harness.sh status)")
    config = _config(tmp_path / "config.yaml")
    workdir = tmp_path / "work"
    log = tmp_path / "snakemake.log"
    env = slurm.env(PATH=f"{BIN}:/usr/bin:/bin:/usr/sbin:/sbin", HF_HUB_OFFLINE="1")
    command = [
        str(BIN / "snakemake"), "-s", str(ROOT / "Snakefile"), "--directory", str(workdir),
        "--profile", str(ROOT / "profiles" / "slurm"), "--configfile", str(config),
        # the test cluster: no accounting (no account to ask for), 2 real cores (2 jobs at
        # once), and quick status polls so the short jobs do not wait for them
        "--slurm-no-account", "--jobs", "2", "--slurm-init-seconds-before-status-checks", "2",
        "--slurm-keep-successful-logs",
    ]  # fmt: skip
    started = time.monotonic()
    with open(log, "w") as out:
        workflow = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        # round 0's reader (after the warm-up stage): running as a SLURM job with a checkpoint
        state = workdir / "state" / "tiny" / "iter0" / "reader"
        job = _wait(lambda: _train_reader_job(slurm, "tiny_0_reader"), WORKFLOW_TIMEOUT_S,
                    "round 0's train_reader job", workflow, log)  # fmt: skip
        _wait(lambda: next(state.glob("*/step-*"), None), 300, "its first checkpoint",
              workflow, log)  # fmt: skip
        before = slurm.job(job)
        slurm.run("scontrol", "requeue", job)
        requeued_at = time.monotonic() - started
        slurm.wait(job, lambda info: info["JobState"] == "PENDING", 120)
        # SLURM holds a requeued job ~120 s before it may start again; release it now
        slurm.run("scontrol", "update", f"jobid={job}", "StartTime=now")
        returncode = workflow.wait(timeout=WORKFLOW_TIMEOUT_S)
    finally:
        if workflow.poll() is None:
            workflow.kill()
            slurm.run("scancel", "--full", "--signal=KILL", "--partition=debug")
    wall = time.monotonic() - started
    output = log.read_text()
    assert returncode == 0, output[-6000:]
    print(f"\n[slurm] demo DAG under the SLURM profile: {wall:.0f} s; requeued round 0's "
          f"reader (job {job}) at {requeued_at:.0f} s")  # fmt: skip

    # the requeued job was a 2-node, 4-task job and ran twice
    after = slurm.job(job)
    assert before["NumNodes"] == "2" and before["NumTasks"] == "4", before
    assert after["Restarts"] == "1" and after["JobState"] == "COMPLETED", after
    # the second run (Snakemake rewrote the log) resumed the first one's checkpoint, as rank 0
    # of the 4 srun tasks
    run_log = (workdir / "logs/train_reader/tiny/iter0/reader.log").read_text()
    assert "resumed from" in run_log and "starting a new run" not in run_log, run_log[-3000:]
    assert "rank 0 of 4 (slurm)" in run_log, run_log[-3000:]
    # every job of the demo DAG ran, the report's inputs included
    report = workdir / "results" / "tiny" / "report"
    for name in ("exact_match.csv", "retrieval.csv", "exact_match.png", "retrieval_topk.png"):
        assert (report / name).stat().st_size > 0, name
    assert "Nothing to be done" in subprocess.run(
        [*command[:5], "--configfile", str(config), "-n"], env=env, capture_output=True,
        text=True, check=True,
    ).stdout  # fmt: skip
