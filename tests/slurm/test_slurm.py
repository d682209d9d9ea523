"""`fid` under a real SLURM (tests/slurm/harness.sh): multi-node DDP, requeued, preempted,
cancelled and time-limited training, and the SLURM profile end to end.

- 4 `srun` tasks over 2 emulated nodes train a reader to the same weights as 4 torchrun-style
  ranks started locally: fid takes its rank, world and rendezvous from SLURM's variables.
- A job requeued mid-training (by `scontrol requeue`, by fid itself after SIGUSR1 with
  FID_SLURM_REQUEUE=1, or by a preemption under PreemptMode=REQUEUE) restarts, resumes from its
  state folder and ends bitwise equal to an uninterrupted local run; `scancel` ends a job
  CANCELLED, checkpointed, never requeued; the time-limit signal checkpoints a step longer
  than KillWait.
- The SLURM profile end to end: `snakemake --profile profiles/slurm` runs the demo's DAG
  (tests/workflow/config.yaml at tiny sizes) on the test cluster. Round 0's reader, a 2-node
  srun DDP job, runs into its time limit and requeues itself until done (one job, no retry,
  weights bitwise equal to 4 local ranks); round 0's retriever is preempted under
  PreemptMode=CANCEL, Snakemake sees the failure and its retry resumes. A layout the cluster
  cannot hold is refused before any submission; a job over its partition's MaxTime, submitted
  with `slurm_preflight: warn`, fails instead of pending forever.

The test cluster emulates what it can of a production one: KillWait 30 s (SLURM's default),
three partitions on the same nodes with preemption by partition priority (`debug`: REQUEUE with
GraceTime 30 s; `spot`: CANCEL, GraceTime 0, MaxTime 30 min; `urgent`: preempts both), jobs
submitted by the real plugin with the real profile. What a production cluster still does that
this one forgives:
- cgroups (TaskPlugin=task/cgroup, ConstrainDevices/ConstrainRAMSpace): here a rank may use
  more memory or another rank's "GPU" (fake device files) unpunished; the jobs' real peaks are
  not enforced, only declared.
- a network file system under state/ and results/ (NFS, Lustre, GPFS): attribute caching and
  close-to-open consistency make a checkpoint written by one node visible later on another;
  here every node is the same local disk. Snakemake's latency-wait covers outputs, and fid's
  checkpoints are renamed into place, but a slow metadata server is not exercised.
- accounting (slurmdbd): no sacct, no QOS or association limits (sacctmgr), so the pending
  reasons of shared limits are tested on squeue's format only (tests/test_slurm_status.py);
  the status polls use squeue here, as the workflow chooses on such a cluster.
- real GPUs and NCCL: gloo on CPU; a rank's CUDA start-up time and GPU memory are not here.
- many users: queue waits, backfill and fair share; jobs here start within seconds, and a
  requeued job's ~120 s hold is cut short with `scontrol update StartTime=now`.
- separate hosts: the nodes share one kernel, so a signal, a port or a hostname resolves
  where it would not across hosts (/etc/hosts maps the node names to 127.0.0.1).

Every process runs on one thread. Each test prints its timings (`pytest -s` shows them). The
profile test runs ~8-12 minutes on 2 cores: each SLURM job costs 10-15 s however small (the
plugin's job step starts Snakemake twice, then `fid`), plus status polls and the reader's
starts (a time limit of 3 minutes each).

One file, so that pytest-xdist (make test: --dist loadfile) runs them in one worker, one
after the other, on the one test cluster.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import assert_same_weights, write_json
from safetensors.torch import load_file

from .conftest import ENDED, _unavailable, clean_env

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

PYTHON = sys.executable
JOB_TIMEOUT_S = 600  # a whole job, start to end
LAYOUT = "--nodes=2 --ntasks-per-node=2 --cpus-per-task=1"


ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv: snakemake, fid, python for the job steps
TINY = ROOT / "tests" / "workflow" / "config.yaml"
WORKFLOW_TIMEOUT_S = 1200
# Two nodes x 2 tasks, one fake GPU per task: the shape of config/nq.yaml's GPU rules (the
# plugin rejects an `mpi` job with tasks_per_node 1).
TWO_NODE_DDP = {"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 1, "gres": "gpu:2",
                "mpi": "srun", "mem_mb": 1000, "runtime": 20}  # fmt: skip


# Each optimizer step of the workflow's training jobs first sleeps this long (slow_steps.py,
# put before the venv's `fid` on PATH): steps of a known length however loaded the 2 cores are,
# so the time-limit signal and the preemption land while the jobs train.
STEP_SLEEP_S = 0.5
TWO_RANKS = {"nodes": 1, "tasks_per_node": 2, "cpus_per_task": 1, "gres": "gpu:2", "mpi": "srun",
             "mem_mb": 1000, "runtime": 20}  # fmt: skip
READER_STEPS, RETRIEVER_STEPS = 200, 60
# The reader's time limit and stop signal: SIGUSR1 120 s after each start. A start spends ~25 s
# in Snakemake's job step and ~25 s starting 4 ranks on 2 loaded cores (fid refuses to requeue
# a start that trained for less time than it took to start), then trains ~70-90 s (~100-150
# steps of >= 0.5 s), so the 200 steps take two starts or more.
READER_RUNTIME_MIN = 3


def _config(path: Path) -> Path:
    config = yaml.safe_load(TINY.read_text())
    # One round, one evaluated split and no warm-up stage keep the critical path at ~11 jobs
    # (~10-15 s each).
    config.update(rounds=1, eval_splits=["test"])
    config["data"]["curriculum"]["warmup"] = False
    config["reader"] = {**config["reader"], "max_steps": READER_STEPS, "save_every_steps": 20,
                        "eval_every_steps": READER_STEPS, "log_every_steps": 50}  # fmt: skip
    config["retriever"] = {**config["retriever"], "max_steps": RETRIEVER_STEPS,
                           "save_every_steps": 10, "eval_every_steps": RETRIEVER_STEPS,
                           "log_every_steps": 50}  # fmt: skip
    config["resources"] = {
        "default": {"threads": 1, "mem_mb": 500, "runtime": 20},
        # round 0's reader trains into its time limit, on 2 nodes x 2 ranks
        "train_reader": {**TWO_NODE_DDP, "runtime": READER_RUNTIME_MIN, "signal_lead_s": 60},
        # the retriever trains on 2 ranks in the partition whose jobs preemption cancels
        "train_retriever": {**TWO_RANKS, "slurm_partition": "spot"},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _jobs_of(slurm, workdir: Path, rule: str, wildcards: str) -> list[dict[str, str]]:
    """Every job of the workflow run in `workdir` (any state; squeue keeps ended ones MinJobAge
    s, earlier tests' too) whose comment names this rule and wildcards: the plugin writes
    `rule_<rule>_wildcards_<values joined by _>` into --comment, in job id order."""
    out = slurm.run("squeue", "-h", "-t", "all", "-o", "%i|%k|%T|%r|%N|%Z")
    jobs = []
    for line in out.splitlines():
        job, comment, state, reason, nodes, folder = line.split("|")
        if comment == f"rule_{rule}_wildcards_{wildcards}" and folder == str(workdir):
            jobs.append(dict(id=job, state=state, reason=reason, nodes=nodes))
    return sorted(jobs, key=lambda j: int(j["id"]))


def _release_held(slurm, released: set) -> None:
    """A requeued job is held ~120 s (BeginTime) before it may start again: release it now."""
    for line in slurm.run("squeue", "-h", "-t", "PD", "-o", "%i|%r").splitlines():
        job, reason = line.split("|")
        if reason == "BeginTime":
            slurm.run("scontrol", "update", f"jobid={job}", "StartTime=now")
            released.add(job)


def _wait(condition, timeout: float, what: str, workflow: subprocess.Popen, log: Path, slurm=None,
          released: set | None = None):  # fmt: skip
    deadline = time.monotonic() + timeout
    while (value := condition()) is None:
        if workflow.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}; Snakemake log:\n{log.read_text()[-4000:]}")
        if slurm is not None:
            _release_held(slurm, released)
        time.sleep(0.5)
    return value


def _slow_fid(folder: Path) -> Path:
    """A folder whose `fid` is the venv's fid with slowed steps (slow_steps.py)."""
    folder.mkdir()
    shim = folder / "fid"
    slow = Path(__file__).parent / "slow_steps.py"
    shim.write_text(f'#!/bin/sh\nexec {PYTHON} {slow} {STEP_SLEEP_S} --always "$@"\n')
    shim.chmod(0o755)
    return folder


def _profile_run(slurm, tmp_path: Path, config: Path, *extra: str, slow_steps: bool = False):
    """(working folder, environment, command) of `snakemake --profile profiles/slurm` on the
    test cluster: no accounting (no account to ask for), 2 real cores (2 jobs at once), and
    quick status polls so the short jobs do not wait for them. With `slow_steps`, the jobs'
    `fid` is _slow_fid's."""
    path = f"{BIN}:/usr/bin:/bin:/usr/sbin:/sbin"
    if slow_steps:
        path = f"{_slow_fid(tmp_path / 'slow-bin')}:{path}"
    workdir = tmp_path / "work"
    command = [
        str(BIN / "snakemake"), "-s", str(ROOT / "Snakefile"), "--directory", str(workdir),
        "--profile", str(ROOT / "profiles" / "slurm"), "--configfile", str(config),
        "--slurm-no-account", "--jobs", "2", "--slurm-init-seconds-before-status-checks", "2",
        *extra,
    ]  # fmt: skip
    return workdir, slurm.env(PATH=path, HF_HUB_OFFLINE="1"), command


def test_slurm_profile_runs_the_demo_dag_through_a_time_limit_and_a_preemption(slurm, tmp_path):
    """Issue 45.7 and 45.3: the whole chain, plugin to resume. `snakemake --profile
    profiles/slurm` runs the demo DAG (1 round) on the test cluster:
    - round 0's reader, a 2-node x 2-rank srun DDP job submitted by the plugin, runs into its
      time limit: SIGUSR1 `signal_lead_s` before it, a checkpoint, a requeue by fid itself, a
      resume, as often as it takes; Snakemake sees one job, no retry spent, and the weights
      equal an uninterrupted run's, bit for bit;
    - round 0's retriever, a 2-rank job in the `spot` partition (PreemptMode=CANCEL, GraceTime
      30 s), is preempted while it trains: it checkpoints in its grace time and ends
      PREEMPTED, which the plugin alone reports as running forever; the workflow's status
      review makes it a failure, Snakemake's retry resumes the checkpoint, the run completes.
    """
    if Path("/etc/slurm/slurm.conf").resolve() != slurm.conf.resolve():
        # the plugin strips SLURM_CONF from its jobs: their srun reads only the default path,
        # which harness.sh links to the test cluster unless a real SLURM config is there
        _unavailable("/etc/slurm/slurm.conf is not the test cluster's (harness.sh status)")
    config = _config(tmp_path / "config.yaml")
    log = tmp_path / "snakemake.log"
    workdir, env, command = _profile_run(slurm, tmp_path, config, "--slurm-keep-successful-logs",
                                         slow_steps=True)  # fmt: skip
    started = time.monotonic()
    released: set[str] = set()
    with open(log, "w") as out:
        workflow = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        # round 0's retriever (after the reader's starts): in `spot`, with a checkpoint
        state = workdir / "state" / "tiny" / "iter0" / "retriever"
        retriever = _wait(
            lambda: next((j for j in _jobs_of(slurm, workdir, "train_retriever", "tiny_0")
                          if j["state"] == "RUNNING"), None),
            WORKFLOW_TIMEOUT_S, "round 0's train_retriever job", workflow, log, slurm, released,
        )  # fmt: skip
        _wait(lambda: next(state.glob("*/step-*"), None), 300, "its first checkpoint",
              workflow, log, slurm, released)  # fmt: skip
        # a job of the higher-priority partition takes all of the retriever's node
        urgent = slurm.sbatch(
            _script(tmp_path / "urgent.sh", "sleep 2\n"),
            ["--partition=urgent", f"--nodelist={retriever['nodes']}", "--nodes=1",
             "--ntasks=4", "--cpus-per-task=1", "--time=2", "--job-name=urgent",
             f"--output={tmp_path / 'urgent.out'}"],
        )  # fmt: skip
        preempted_at = time.monotonic() - started
        _wait(lambda: workflow.poll(), WORKFLOW_TIMEOUT_S, "the workflow to end", workflow, log,
              slurm, released)  # fmt: skip
        returncode = workflow.wait()
    finally:
        if workflow.poll() is None:
            workflow.kill()
            slurm.run("scancel", "--full", "--signal=KILL", "--user=root")
    wall = time.monotonic() - started
    output = log.read_text()
    assert returncode == 0, output[-6000:]
    readers = _jobs_of(slurm, workdir, "train_reader", "tiny_0_reader")
    retrievers = _jobs_of(slurm, workdir, "train_retriever", "tiny_0")
    print(f"\n[slurm] demo DAG under the SLURM profile: {wall:.0f} s; round 0's retriever "
          f"(job {retriever['id']}) preempted at {preempted_at:.0f} s by job {urgent}; "
          f"released from their hold: {sorted(released)}")  # fmt: skip

    # The reader: one job, 4 tasks on 2 nodes, restarted by its own requeues, COMPLETED
    (reader,) = readers
    info = slurm.job(reader["id"])
    assert info["NumNodes"] == "2" and info["NumTasks"] == "4", info
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) >= 1, info
    run_log = (workdir / "logs/train_reader/tiny/iter0/reader.log").read_text()
    starts = int(info["Restarts"]) + 1
    assert run_log.count(f"requeued SLURM job {reader['id']}") == starts - 1, run_log[-4000:]
    # (every rank says it stops; rank 0 alone resumes, requeues and numbers the starts)
    assert len(re.findall(r"\[rank 0\] .*stopping at step \d+ on a signal", run_log)) == starts - 1
    for n in range(2, starts + 1):
        assert f"start {n} of this run (SLURM job {reader['id']}" in run_log, run_log[-4000:]
    resumed = re.findall(r"\[rank 0\] .*resumed from", run_log)
    assert "starting a new run" in run_log and len(resumed) == starts - 1, run_log[-4000:]
    assert "rank 0 of 4 (slurm)" in run_log, run_log[-3000:]
    # the SLURM log of the job (--open-mode=append) keeps every start's output
    slurm_log = next((workdir / "logs/slurm/rule_train_reader").rglob(f"{reader['id']}.log"))
    assert slurm_log.read_text().count("Building DAG of jobs") >= starts
    # the same training, uninterrupted, as 4 local ranks: the same weights
    shell = re.search(r"train-reader (--config .*)$", output, re.MULTILINE).group(1)
    args = shlex.split(shell)
    args[args.index("--output") + 1] = str(tmp_path / "straight-model")
    args[args.index("--state-root") + 1] = str(tmp_path / "straight-state")
    launch_local(["train-reader", *args], world_size=4, cwd=workdir)
    assert_same_weights(tmp_path / "straight-model" / "model.safetensors",
                        workdir / "results/tiny/iter0/reader/model/model.safetensors")  # fmt: skip

    # The retriever: preempted and cancelled, a failure Snakemake saw, its retry resumed
    assert [j["state"] for j in retrievers] == ["PREEMPTED", "COMPLETED"], retrievers
    assert retrievers[0]["id"] == retriever["id"]
    assert (f"SLURM job {retriever['id']} (rule train_retriever, wildcards tiny_0) was "
            "preempted and cancelled (partition spot: PreemptMode=CANCEL") in output  # fmt: skip
    assert output.count("Trying to restart job") == 1, output[-6000:]
    retriever_log = (workdir / "logs/train_retriever/tiny/iter0.log").read_text()
    stop = re.search(r"\[rank 0\] .*stopping at step (\d+) on a signal", retriever_log)
    assert stop, retriever_log[-4000:]
    assert "not by the time-limit warning: not requeued, the checkpoint is kept" in retriever_log
    resumed = re.search(rf"resumed from \S*step-{stop.group(1)}\b", retriever_log)
    assert resumed, retriever_log[-4000:]

    # every job of the demo DAG ran, the report's inputs included
    report = workdir / "results" / "tiny" / "report"
    for name in ("exact_match.csv", "retrieval.csv", "exact_match.png", "retrieval_topk.png"):
        assert (report / name).stat().st_size > 0, name
    assert "Nothing to be done" in subprocess.run(
        [*command[:5], "--configfile", str(config), "-n"], env=env, capture_output=True,
        text=True, check=True,
    ).stdout  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fid(*args) -> str:
    """The fid command line (one thread), quoted for a job script."""
    return shlex.join([PYTHON, "-m", "fid", "--threads", "1", *map(str, args)])


def _yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/bash\n" + body)
    return path


def launch_local(args: list, world_size: int, cwd: Path, timeout: int = 600) -> None:
    """Runs `python -m fid ARGS` as `world_size` local gloo ranks with torchrun's variables."""
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [PYTHON, "-m", "fid", "--threads", "1", *map(str, args)],
            env=clean_env(
                RANK=str(rank),
                WORLD_SIZE=str(world_size),
                LOCAL_RANK=str(rank),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
            ),
            cwd=cwd,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world_size)
    ]
    try:
        logs = [p.communicate(timeout=timeout)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, (p, log) in enumerate(zip(procs, logs, strict=True)):
        assert p.returncode == 0, f"local rank {rank} failed:\n{log[-3000:]}"


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_four_srun_tasks_on_two_nodes_equal_four_local_ranks(
    slurm, tmp_path, tiny_model_dir, toy_records
):
    # Equal-length targets: each rank's mean loss then averages to the global mean.
    train = write_json(tmp_path / "train.json",
                       [dict(r, target="x y") for r in toy_records["train"][:32]])  # fmt: skip
    dev = write_json(tmp_path / "dev.json", toy_records["dev"][:5])
    config = _yaml(tmp_path / "train.yaml", dict(
        n_passages=3, passage_max_tokens=32, batch_size_per_device=2, max_steps=4, lr=1e-3,
        warmup_steps=1, eval_every_steps=2, save_every_steps=2, log_every_steps=1, eval_batch_size=2,
        max_new_tokens=3, precision="fp32", tensorboard=False, dropout=0.0,
    ))  # fmt: skip

    def args(name):
        return ["train-reader", "--config", config, "--train", train, "--dev", dev,
                "--init-model", tiny_model_dir, "--output", tmp_path / f"model-{name}",
                "--state-dir", tmp_path / f"state-{name}"]  # fmt: skip

    started = time.perf_counter()
    launch_local(args("local"), 4, tmp_path)
    local_s = time.perf_counter() - started

    port = _free_port()
    # The workflow's srun line (rules/common.smk), started as the SLURM plugin's job step
    # starts a rule's shell: with the job's SLURM_*/SRUN_* variables stripped but its id.
    srun = f"srun {LAYOUT} --kill-on-bad-exit=1"
    plugin_env = "env -u SLURM_NTASKS -u SLURM_NNODES -u SLURM_TASKS_PER_NODE -u SLURM_JOB_GPUS"
    script = _script(tmp_path / "ddp.sh", f"""set -euo pipefail
# One line per task: where SLURM put it (checked by the test).
{plugin_env} {srun} bash -c 'echo "$SLURM_PROCID $SLURMD_NODENAME $SLURM_LOCALID ${{CUDA_VISIBLE_DEVICES:-}}"' > layout.txt
{plugin_env} {srun} {_fid(*args("slurm"))}
""")  # fmt: skip
    log = tmp_path / "ddp.out"
    started = time.perf_counter()
    job = slurm.sbatch(
        script,
        [*LAYOUT.split(), "--gres=gpu:2", "--time=10", "--job-name=fid-ddp",
         f"--output={log}", f"--chdir={tmp_path}"],
        env=slurm.env(FID_MASTER_PORT=str(port)),
    )  # fmt: skip
    info = slurm.wait_ended(job, JOB_TIMEOUT_S, log)
    slurm_s = time.perf_counter() - started
    print(f"\n[slurm] 4 local ranks {local_s:.1f} s; 4 srun tasks on 2 nodes {slurm_s:.1f} s")
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), log.read_text()[-3000:]

    layout = sorted(
        tuple(line.split()) for line in (tmp_path / "layout.txt").read_text().splitlines()
    )
    assert [row[:3] for row in layout] == [("0", "fidnode1", "0"), ("1", "fidnode1", "1"),
                                           ("2", "fidnode2", "0"), ("3", "fidnode2", "1")], layout  # fmt: skip
    # every rank sees all of its node's GPUs (NVLink/CUDA IPC between them: no per-task
    # device cgroup from --gpus-per-task) and binds its own, cuda:LOCAL_RANK
    assert {row[3] for row in layout} == {"0,1"}, f"each task should see both GPUs: {layout}"
    run_log = (tmp_path / "state-slurm" / "train.log").read_text()
    assert f"rank 0 of 4 (slurm) on cpu, master fidnode1:{port}" in run_log

    local = load_file(tmp_path / "model-local" / "model.safetensors")
    remote = load_file(tmp_path / "model-slurm" / "model.safetensors")
    assert local.keys() == remote.keys()
    for name in local:
        torch.testing.assert_close(remote[name], local[name], atol=1e-5, rtol=1e-4, msg=name)
    dev_local = [
        r for r in _records(tmp_path / "model-local" / "metrics.jsonl") if r["kind"] == "dev"
    ]
    dev_slurm = [
        r for r in _records(tmp_path / "model-slurm" / "metrics.jsonl") if r["kind"] == "dev"
    ]
    assert [r["exact_match"] for r in dev_slurm] == [r["exact_match"] for r in dev_local]


class Training:
    """One reader run's inputs: long enough (120 steps of ~20-150 ms) for a signal to land
    mid-training; dropout on, so a resume must restore the RNGs to end bitwise equal."""

    def __init__(self, root: Path, model_dir: Path, records: dict):
        self.train = write_json(root / "train.json", records["train"][:40])
        self.dev = write_json(root / "dev.json", records["dev"][:3])
        self.max_steps = 120
        self.config = _yaml(root / "train.yaml", dict(
            n_passages=3, passage_max_tokens=32, batch_size_per_device=4,
            max_steps=self.max_steps, lr=1e-3, warmup_steps=5, eval_every_steps=60,
            save_every_steps=40, keep_last_checkpoints=2, log_every_steps=10, eval_batch_size=3,
            max_new_tokens=3, precision="fp32", tensorboard=False, dropout=0.1,
        ))  # fmt: skip
        self.model_dir = model_dir

    def args(self, output: Path, state: Path) -> list:
        return ["train-reader", "--config", self.config, "--train", self.train, "--dev", self.dev,
                "--init-model", self.model_dir, "--output", output, "--state-dir", state]  # fmt: skip

    def weights(self, output: Path, state: Path) -> dict[str, dict]:
        """The exported model and the last checkpoint's weights."""
        return {
            "exported": load_file(output / "model.safetensors"),
            "last step": load_file(state / f"step-{self.max_steps}" / "model.safetensors"),
        }


@pytest.fixture(scope="module")
def straight(slurm, tmp_path_factory, tiny_model_dir, toy_records):
    """An uninterrupted single-process local run: what every requeued job must end equal to."""
    root = tmp_path_factory.mktemp("straight")
    training = Training(root, tiny_model_dir, toy_records)
    output, state = root / "model", root / "state"
    started = time.perf_counter()
    result = subprocess.run([PYTHON, "-m", "fid", "--threads", "1", *map(str, training.args(output, state))],
                            env=clean_env(), capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    print(f"\n[slurm] straight local run of {training.max_steps} steps: "
          f"{time.perf_counter() - started:.1f} s")  # fmt: skip
    return training, training.weights(output, state)


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def _eligible_time(info: dict) -> float:
    """When the job may start (`EligibleTime`, slurmctld's local time), as a Unix time."""
    return time.mktime(time.strptime(info["EligibleTime"], "%Y-%m-%dT%H:%M:%S"))


def _wait_until_training(slurm, job: str, state: Path, log: Path) -> None:
    """Until the job's run logs its first training steps (failing if the job ends first)."""

    def training_under_way() -> bool:
        info = slurm.job(job)
        assert info["JobState"] in ("PENDING", "RUNNING"), (info, log.read_text()[-3000:])
        metrics = state / "metrics.jsonl"
        return metrics.exists() and '"kind": "train"' in metrics.read_text()

    _wait_for(training_under_way, 300, f"job {job} to log its first training steps")


@pytest.mark.parametrize("how", ["scontrol-requeue", "usr1-then-fid-requeues", "preempted"])
def test_requeued_job_resumes_and_ends_bitwise_equal(slurm, straight, tmp_path, how):
    """(a) `scontrol requeue JOB` while it trains: SLURM stops the task with SIGTERM; (b)
    `scancel --signal=USR1 JOB` (without --batch, which would signal only the batch shell, not
    the srun tasks): fid checkpoints, exits 75 and, with FID_SLURM_REQUEUE=1, requeues its own
    job; (c) a job of the `urgent` partition takes the node (issue 45.3): under the `debug`
    partition's PreemptMode=REQUEUE, GraceTime 30 s, the task gets SIGTERM, fid checkpoints in
    the grace time and requeues the job (SLURM requeues only a job still running when the
    grace time ends: one whose ranks exited ended FAILED). Either way the job restarts (after
    SLURM's hold, cut short here with `scontrol update StartTime=now`) and resumes from the
    state folder, from the checkpoint written at the stop."""
    training, expected = straight
    # The state folder lives outside the job's declared outputs: nothing deletes it on requeue.
    output, state, log = tmp_path / "model", tmp_path / "state", tmp_path / "job.out"
    script = _script(tmp_path / "job.sh", f"""
echo "job start, restart ${{SLURM_RESTART_COUNT:-0}}"
srun --ntasks=1 --cpus-per-task=1 {_fid(*training.args(output, state))}
status=$?
echo "fid exit status $status"
exit $status
""")  # fmt: skip
    # the workflow's training jobs tell fid to requeue after a time-limit signal
    extra = {"FID_SLURM_REQUEUE": "1"} if how != "scontrol-requeue" else {}
    started = time.perf_counter()
    job = slurm.sbatch(
        script,
        ["--ntasks=1", "--cpus-per-task=1", "--requeue", "--open-mode=append", "--time=15",
         "--job-name=fid-requeue", f"--output={log}", f"--chdir={tmp_path}"],
        env=slurm.env(**extra),
    )  # fmt: skip

    _wait_until_training(slurm, job, state, log)
    signalled = time.time()
    if how == "scontrol-requeue":
        slurm.run("scontrol", "requeue", job)
    elif how == "usr1-then-fid-requeues":
        slurm.run("scancel", "--signal=USR1", job)
    else:  # every CPU of the job's node, for a job of the preempting partition
        node = slurm.job(job)["NodeList"]
        slurm.sbatch(_script(tmp_path / "urgent.sh", "sleep 2\n"),
                     ["--partition=urgent", f"--nodelist={node}", "--ntasks=4",
                      "--cpus-per-task=1", "--time=2", f"--output={tmp_path / 'urgent.out'}"])  # fmt: skip
    held = slurm.wait(
        job, lambda i: i["JobState"] == "PENDING" and int(i["Restarts"]) >= 1
        or i["JobState"] in ENDED, 120, log,
    )  # fmt: skip
    assert held["JobState"] == "PENDING", f"job not requeued: {held}\n{log.read_text()[-3000:]}"
    requeued_s = time.time() - signalled
    hold_s = _eligible_time(held) - signalled
    slurm.run("scontrol", "update", f"jobid={job}", "StartTime=now")
    restarted = time.time()
    slurm.wait(job, lambda i: i["JobState"] != "PENDING", 60, log)
    restart_s = time.time() - restarted
    info = slurm.wait_ended(job, JOB_TIMEOUT_S, log)
    total_s = time.perf_counter() - started
    job_log = log.read_text()
    # How srun saw the first run end ("Exited with exit code 75", or "Terminated" when the
    # requeue's SIGTERM arrived first).
    first_end = next((line for line in job_log.splitlines() if "task 0:" in line), "-")
    print(f"\n[slurm] {how}: requeued (PENDING) {requeued_s:.1f} s after the signal; "
          f"SLURM holds it until {hold_s:.0f} s after the signal; running again {restart_s:.1f} s "
          f"after `scontrol update StartTime=now`; whole job {total_s:.1f} s; first run: "
          f"{first_end}")  # fmt: skip

    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "1"), (
        f"{info}\n{job_log[-3000:]}"
    )
    run_log = (state / "train.log").read_text()
    stop = re.search(r"stopping at step (\d+) on a signal", run_log)
    assert stop, f"the first run did not stop cleanly on the signal:\n{run_log[-3000:]}"
    assert f"resumed from {state / ('step-' + stop.group(1))}" in run_log, run_log[-3000:]
    assert "fid exit status 0" in job_log
    assert (f"requeued SLURM job {job}" in run_log) == (how != "scontrol-requeue")
    if how == "preempted":
        assert f"SLURM job {job} is being preempted (PreemptMode=REQUEUE): requeued now" in run_log
    got = training.weights(output, state)
    for which, tensors in expected.items():
        assert got[which].keys() == tensors.keys()
        for name, tensor in tensors.items():
            assert torch.equal(got[which][name], tensor), f"{which}: {name}"


def test_scancel_ends_a_training_job_checkpointed_and_not_requeued(slurm, straight, tmp_path):
    """Issue 45.1: `scancel JOB` (a user's, or the SLURM plugin's on Snakemake's Ctrl-C) sends
    SIGTERM to the job's tasks. fid treated it as the time-limit warning and rank 0 requeued
    the job, which SLURM accepted: the cancelled job came back PENDING. Submitted as the
    workflow submits its training jobs (`--signal=USR1@LEAD`, `--requeue`, FID_SLURM_REQUEUE=1
    to the ranks), the job now ends CANCELLED and stays ended; fid checkpointed before it
    exited and said why it did not requeue; a rerun resumes to the uninterrupted run's weights."""
    training, expected = straight
    output, state, log = tmp_path / "model", tmp_path / "state", tmp_path / "job.out"
    exports = "--export=ALL,FID_SIGNAL_LEAD_S=60,FID_SLURM_REQUEUE=1"
    script = _script(tmp_path / "job.sh", f"""
srun --ntasks=1 --cpus-per-task=1 {exports} {_fid(*training.args(output, state))}
echo "fid exit status $?"
""")  # fmt: skip
    job = slurm.sbatch(
        script,
        ["--ntasks=1", "--cpus-per-task=1", "--requeue", "--open-mode=append", "--time=15",
         "--signal=USR1@60", "--job-name=fid-scancel", f"--output={log}",
         f"--chdir={tmp_path}"],
    )  # fmt: skip

    _wait_until_training(slurm, job, state, log)
    slurm.run("scancel", job)
    info = slurm.wait_ended(job, 120, log)
    time.sleep(5)  # a requeue by the job's own rank 0 would show by now
    info = slurm.job(job)
    run_log = (state / "train.log").read_text()
    assert (info["JobState"], info["Restarts"]) == ("CANCELLED", "0"), f"{info}\n{run_log[-3000:]}"
    assert "stopping at step" in run_log, "fid did not checkpoint on scancel's SIGTERM"
    assert "not by the time-limit warning: not requeued, the checkpoint is kept" in run_log
    assert f"requeued SLURM job {job}" not in run_log
    rerun = subprocess.run([PYTHON, "-m", "fid", "--threads", "1",
                            *map(str, training.args(output, state))],
                           env=clean_env(), capture_output=True, text=True, timeout=600)  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "resumed from" in (state / "train.log").read_text()
    got = training.weights(output, state)
    for which, tensors in expected.items():
        for name, tensor in tensors.items():
            assert torch.equal(got[which][name], tensor), f"{which}: {name}"


def test_the_time_limit_signal_checkpoints_a_step_longer_than_killwait(
    slurm, tmp_path, tiny_model_dir, toy_records
):
    """The workflow's training jobs: `--signal=USR1@LEAD` (to the job's steps, not B:) and the
    ranks told to requeue. Each step of the first start takes 32 s, longer than the cluster's
    KillWait (30 s, SLURM's default): at the time limit's SIGTERM the step could not finish
    before SIGKILL. The
    early signal comes while it trains; fid finishes its step, writes the checkpoint, requeues
    its job, and the second start resumes and ends bitwise equal to an uninterrupted run. The
    job's SLURM log (--open-mode=append, as the workflow submits) keeps both starts."""
    train = write_json(tmp_path / "train.json", toy_records["train"][:40])
    dev = write_json(tmp_path / "dev.json", toy_records["dev"][:3])
    max_steps, step_s, lead_s, limit_min = 8, 32, 100, 3
    config = _yaml(tmp_path / "train.yaml", dict(
        n_passages=3, passage_max_tokens=32, batch_size_per_device=4, max_steps=max_steps,
        lr=1e-3, warmup_steps=2, eval_every_steps=100, save_every_steps=100, log_every_steps=1,
        eval_batch_size=3, max_new_tokens=3, precision="fp32", tensorboard=False, dropout=0.1,
    ))  # fmt: skip

    def args(name):
        return ["train-reader", "--config", config, "--train", train, "--dev", dev,
                "--init-model", tiny_model_dir, "--output", tmp_path / f"model-{name}",
                "--state-dir", tmp_path / f"state-{name}"]  # fmt: skip

    straight = subprocess.run([PYTHON, "-m", "fid", "--threads", "1", *map(str, args("straight"))],
                              env=clean_env(), capture_output=True, text=True, timeout=600)  # fmt: skip
    assert straight.returncode == 0, straight.stderr[-3000:]

    state, log = tmp_path / "state-slurm", tmp_path / "job.out"
    slow = [PYTHON, str(Path(__file__).parent / "slow_steps.py"), str(step_s), "--threads", "1"]
    script = _script(tmp_path / "job.sh", f"""
echo "job start, restart ${{SLURM_RESTART_COUNT:-0}}"
srun --ntasks=1 --cpus-per-task=1 --export=ALL,FID_SIGNAL_LEAD_S={lead_s},FID_SLURM_REQUEUE=1 \\
  {shlex.join([*slow, *map(str, args("slurm"))])}
echo "fid exit status $?"
""")  # fmt: skip
    started = time.time()
    job = slurm.sbatch(
        script,
        ["--ntasks=1", "--cpus-per-task=1", "--requeue", "--open-mode=append",
         f"--time={limit_min}", f"--signal=USR1@{lead_s}", "--job-name=fid-time-limit",
         f"--output={log}", f"--chdir={tmp_path}"],
    )  # fmt: skip
    held = slurm.wait(
        job, lambda i: i["JobState"] == "PENDING" and int(i["Restarts"]) >= 1
        or i["JobState"] in ENDED, 60 * limit_min + 60, log,
    )  # fmt: skip
    stopped_s = time.time() - started
    assert held["JobState"] == "PENDING", f"not requeued: {held}\n{log.read_text()[-3000:]}"
    slurm.run("scontrol", "update", f"jobid={job}", "StartTime=now")
    info = slurm.wait_ended(job, JOB_TIMEOUT_S, log)
    job_log, run_log = log.read_text(), (state / "train.log").read_text()
    print(f"\n[slurm] time limit {limit_min} min, signal {lead_s} s before: requeued after "
          f"{stopped_s:.0f} s; whole job {time.time() - started:.0f} s")  # fmt: skip
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "1"), (
        f"{info}\n{job_log[-3000:]}"
    )
    # the first start stopped at the signal, well before the limit, after steps > KillWait
    stop = re.search(r"stopping at step (\d+) on a signal", run_log)
    assert stop and 0 < int(stop.group(1)) < max_steps, run_log[-3000:]
    assert stopped_s < 60 * limit_min - 10, "the stop came at the time limit, not at the signal"
    assert f"requeued SLURM job {job}" in run_log
    assert f"resumed from {state / ('step-' + stop.group(1))}" in run_log
    steps = [r for r in _records(state / "metrics.jsonl") if r["kind"] == "train"]
    kill_wait = re.search(r"KillWait\s*=\s*(\d+)", slurm.run("scontrol", "show", "config"))
    assert max(r["step_time_s"] for r in steps[: int(stop.group(1))]) > int(kill_wait.group(1))
    assert f"start 1 of this run (SLURM job {job})" in run_log
    assert f"start 2 of this run (SLURM job {job}, requeued 1 time)" in run_log
    # both starts in the job's SLURM log
    assert "restart 0" in job_log and "restart 1" in job_log and "fid exit status 0" in job_log
    assert_same_weights(tmp_path / "model-straight" / "model.safetensors",
                        tmp_path / "model-slurm" / "model.safetensors")  # fmt: skip


def test_a_layout_the_cluster_cannot_hold_is_refused_before_any_submission(slurm, tmp_path):
    """With the SLURM profile, a job asking more of a node than the partition's nodes have (3
    GPUs on nodes of 2), or a partition that does not exist, stops the run before the first
    sbatch: one error naming the rule and the numbers, nothing in the queue, nothing run."""
    queued_before = slurm.run("squeue", "-h", "-o", "%i").split()
    for change, expected in [
        ({"tasks_per_node": 3, "gres": "gpu:3"},
         "asks 2 node(s) with 3 CPUs, 1000 MB, 3 GPU(s) each; partition 'debug' (the default: "
         "no slurm_partition) has 0 such node(s)"),
        ({"slurm_partition": "gpu"},
         "partition 'gpu' does not exist (sinfo shows debug, spot, urgent)"),
    ]:  # fmt: skip
        config = _config(tmp_path / "config.yaml")
        data = yaml.safe_load(config.read_text())
        data["resources"]["train_reader"].update(change)
        config.write_text(yaml.safe_dump(data))
        workdir, env, command = _profile_run(slurm, tmp_path, config)
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        message = result.stdout + result.stderr
        assert result.returncode != 0, message[-3000:]
        assert "resources.train_reader: a job of this rule cannot run on this cluster" in message
        assert expected in message, message[-3000:]
        assert slurm.run("squeue", "-h", "-o", "%i").split() == queued_before
        assert not (workdir / "results").exists() and not (workdir / "logs" / "slurm").exists()


def test_a_job_pending_on_a_limit_that_never_lifts_fails_instead_of_waiting(slurm, tmp_path):
    """Issue 45.4: with `slurm_preflight: warn` (the override for a pre-flight that reads a
    cluster wrong) a job over its partition's MaxTime is submitted, and SLURM keeps it PENDING
    (PartitionTimeLimit) forever, which the plugin reports as running. The workflow's status
    review cancels it and Snakemake sees a failure naming the rule, the reason and the
    partition."""
    config = _config(tmp_path / "config.yaml")
    data = yaml.safe_load(config.read_text())
    data["slurm_preflight"] = "warn"
    data["resources"]["default"].update(slurm_partition="spot", runtime=60)  # MaxTime 30
    config.write_text(yaml.safe_dump(data))
    _, env, command = _profile_run(slurm, tmp_path, config, "--retries", "0")
    started = time.monotonic()
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    message = result.stdout + result.stderr
    print(f"\n[slurm] a job over MaxTime failed after {time.monotonic() - started:.0f} s")
    assert result.returncode != 0, message[-3000:]
    assert "(slurm_preflight: warn: submitted anyway)" in message, message[-3000:]
    # slurmctld gives a job over MaxTime either reason: PartitionTimeLimit from the limits check
    # at submission, PartitionConfig once a scheduling pass has tested it against the
    # partition's nodes (both seen here; fid.runtime.slurm_layout's docstring): whichever is
    # set when the review reads squeue
    assert re.search(
        r"SLURM job \d+ \(rule \w+(, wildcards \S+)?\) pends for (PartitionTimeLimit|"
        r"PartitionConfig), a limit no other job's end lifts \(partition spot\): cancelled",
        message,
    ), message[-3000:]  # fmt: skip
    assert "no accounting database" in message  # squeue chosen over the plugin's default sacct
    assert slurm.run("squeue", "-h", "-t", "PD", "-o", "%i") == ""


def test_the_preflight_counts_the_memory_a_training_job_asks_for_its_lists(slurm, tmp_path):
    """Issue 45.4: a training rule without a mem_mb of its own asks for its plan's memory plus
    a share per byte of its training and dev lists; the pre-flight checked only the plan's
    floor, so a job whose lists outgrew the nodes was submitted and waited forever. Where the
    lists exist when the run starts, their size is counted: 10 GB of lists (a sparse file) ask
    more than the test cluster's 4096 MB nodes have, and nothing is submitted."""
    config = _config(tmp_path / "config.yaml")
    data = yaml.safe_load(config.read_text())
    del data["resources"]["train_reader"]["mem_mb"]  # the plan's request
    config.write_text(yaml.safe_dump(data))
    workdir, env, command = _profile_run(slurm, tmp_path, config)
    lists = workdir / "results/tiny/data/demo/world/reader"
    lists.mkdir(parents=True)
    for name in ("train.json", "dev.json"):
        with open(lists / name, "wb") as sparse:
            sparse.truncate(5 * 10**9)
    queued_before = slurm.run("squeue", "-h", "-o", "%i").split()
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    message = result.stdout + result.stderr
    assert result.returncode != 0, message[-3000:]
    asked = re.search(r"resources.train_reader: a job of this rule cannot run on this cluster: "
                      r"asks 2 node\(s\) with \d+ CPUs, (\d+) MB", message)  # fmt: skip
    assert asked and int(asked.group(1)) > 4096, message[-3000:]
    assert slurm.run("squeue", "-h", "-o", "%i").split() == queued_before


def test_ctrl_c_cancels_a_training_job_checkpointed_and_a_rerun_resumes(slurm, tmp_path):
    """Issue 45.1 through the profile: Snakemake's Ctrl-C has the plugin `scancel` its jobs,
    whose ranks get SIGTERM. fid took it for the time-limit warning and requeued the job, which
    came back PENDING after Snakemake had gone (a restarted Snakemake then submitted a second
    one). Now the job ends CANCELLED with its checkpoint and stays ended; the next `snakemake`
    resumes it."""
    config = _config(tmp_path / "config.yaml")
    data = yaml.safe_load(config.read_text())
    data["resources"]["train_reader"].update(runtime=20, signal_lead_s=600)  # no time limit here
    config.write_text(yaml.safe_dump(data))
    log = tmp_path / "snakemake.log"
    workdir, env, command = _profile_run(slurm, tmp_path, config,
                                         "results/tiny/iter0/reader/model", slow_steps=True)  # fmt: skip
    state = workdir / "state" / "tiny" / "iter0" / "reader"
    with open(log, "w") as out:
        workflow = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        reader = _wait(
            lambda: next((j for j in _jobs_of(slurm, workdir, "train_reader", "tiny_0_reader")
                          if j["state"] == "RUNNING"), None),
            WORKFLOW_TIMEOUT_S, "round 0's train_reader job", workflow, log,
        )  # fmt: skip
        _wait(lambda: next(state.glob("*/step-*"), None), 300, "its first checkpoint",
              workflow, log)  # fmt: skip
        workflow.send_signal(signal.SIGINT)  # Ctrl-C
        returncode = workflow.wait(timeout=180)
    finally:
        if workflow.poll() is None:
            workflow.kill()
            slurm.run("scancel", "--full", "--signal=KILL", "--user=root")
    assert returncode != 0
    slurm.wait_ended(reader["id"], 120)
    time.sleep(5)  # a requeue by the job's own rank 0 would show by now
    info = slurm.job(reader["id"])
    run_log = (workdir / "logs/train_reader/tiny/iter0/reader.log").read_text()
    assert (info["JobState"], info["Restarts"]) == ("CANCELLED", "0"), f"{info}\n{run_log[-3000:]}"
    assert re.search(r"\[rank 0\] .*stopping at step \d+ on a signal", run_log), run_log[-3000:]
    assert "not by the time-limit warning: not requeued, the checkpoint is kept" in run_log
    assert f"requeued SLURM job {reader['id']}" not in run_log

    rerun = subprocess.run(command, env=env, capture_output=True, text=True,
                           timeout=WORKFLOW_TIMEOUT_S)  # fmt: skip
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-4000:]
    run_log = (workdir / "logs/train_reader/tiny/iter0/reader.log").read_text()
    this_start = run_log.partition("==== this start ====")[2]
    assert re.search(r"\[rank 0\] .*resumed from", this_start), run_log[-3000:]
    readers = _jobs_of(slurm, workdir, "train_reader", "tiny_0_reader")
    assert [j["state"] for j in readers] == ["CANCELLED", "COMPLETED"], readers
