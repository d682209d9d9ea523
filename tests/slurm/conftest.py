"""A real SLURM for the tests in this folder: 2 emulated nodes x 4 CPUs x 2 fake GPUs.

The session fixture `slurm` runs `harness.sh up` (which apt-installs SLURM and munge when they
are missing), hands the tests a `Slurm` handle whose commands talk to that cluster, and runs
`harness.sh down` at the end of the session if it started the cluster (a cluster that was
already up is reused and left up). When SLURM cannot be started (not root, not Linux, no
apt-get, daemons that do not come up) the tests are SKIPPED with the reason, unless
FID_REQUIRE_SLURM=1 is set (CI on a machine that must run them): then they fail.

    pytest tests/slurm                       # or: pytest -m slurm
    FID_REQUIRE_SLURM=1 pytest tests/slurm   # a missing SLURM is an error
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parent / "harness.sh"
STARTUP_TIMEOUT_S = 600  # apt-get install included
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE", "PREEMPTED"}  # fmt: skip


def pytest_configure(config):
    config.addinivalue_line("markers", "slurm: runs jobs on a real SLURM (tests/slurm/harness.sh)")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without a surrounding job's SLURM_* variables (the tests may
    themselves run inside a SLURM job) and with one thread per process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


class Slurm:
    """Commands against the test cluster; every call has a timeout, and every wait a deadline,
    so a stuck SLURM fails a test instead of hanging it."""

    def __init__(self, conf: Path, startup_s: float):
        self.conf = conf
        self.startup_s = startup_s

    def env(self, **extra: str) -> dict[str, str]:
        """The environment for SLURM commands and jobs (sbatch exports it into the job)."""
        return clean_env(SLURM_CONF=str(self.conf), **extra)

    def run(self, *args: str, timeout: float = 30, env: dict | None = None) -> str:
        result = subprocess.run(
            args, env=env or self.env(), capture_output=True, text=True, timeout=timeout
        )
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result.stdout

    def sbatch(self, script: Path, options: Iterable[str], env: dict | None = None) -> str:
        """Submits `script`; returns the job id."""
        return self.run("sbatch", "--parsable", *options, str(script), env=env).strip()

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict: JobState, Reason, ExitCode, Restarts, BeginTime, ..."""
        line = self.run("scontrol", "show", "job", "--oneliner", job_id)
        return dict(re.findall(r"(\w+)=(\S*)", line))

    def wait(self, job_id: str, until, timeout: float, log: Path | None = None) -> dict[str, str]:
        """Polls the job until `until(info)` is true; on the deadline cancels it and fails."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if until(info):
                return info
            if time.monotonic() > deadline:
                self.cancel(job_id)
                tail = log.read_text()[-3000:] if log and log.exists() else "(no output)"
                pytest.fail(f"job {job_id} still {info.get('JobState')} ({info.get('Reason')}) "
                            f"after {timeout:.0f} s; cancelled. Output:\n{tail}")  # fmt: skip
            time.sleep(0.5)

    def wait_ended(self, job_id: str, timeout: float, log: Path | None = None) -> dict[str, str]:
        return self.wait(job_id, lambda info: info["JobState"] in ENDED, timeout, log)

    def cancel(self, job_id: str) -> None:
        subprocess.run(["scancel", "--full", "--signal=KILL", job_id], env=self.env(),
                       capture_output=True, timeout=30)  # fmt: skip


def _unavailable(reason: str):
    if os.environ.get("FID_REQUIRE_SLURM") == "1":
        pytest.fail(f"FID_REQUIRE_SLURM=1 but SLURM is unavailable: {reason}", pytrace=False)
    pytest.skip(f"SLURM unavailable: {reason} (set FID_REQUIRE_SLURM=1 to make this an error)")


def _harness(command: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(HARNESS), command], env=clean_env(), capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


@pytest.fixture(scope="session")
def slurm() -> Iterator[Slurm]:
    if not sys.platform.startswith("linux"):
        _unavailable(f"the harness needs Linux, not {sys.platform}")
    if os.geteuid() != 0:
        _unavailable("the harness must run as root (it installs and starts SLURM daemons)")
    if shutil.which("bash") is None:
        _unavailable("no bash")
    already_up = _harness("status", 30).returncode == 0
    started = time.perf_counter()
    try:
        result = _harness("up", STARTUP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        if not already_up:
            _harness("down", 60)
        _unavailable(f"`harness.sh up` did not finish within {STARTUP_TIMEOUT_S} s")
    startup_s = time.perf_counter() - started
    if result.returncode != 0:
        if not already_up:
            _harness("down", 60)  # whatever part of it did start
        _unavailable(f"`harness.sh up` failed:\n{result.stderr[-2000:]}")
    conf = Path(_harness("env", 30).stdout.strip().split("=", 1)[1])
    print(f"\n[slurm] cluster up in {startup_s:.1f} s ({'reused' if already_up else 'started'})")
    try:
        yield Slurm(conf, startup_s)
    finally:
        if not already_up:
            _harness("down", 120)
