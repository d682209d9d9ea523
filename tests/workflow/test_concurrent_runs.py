"""Two `snakemake` runs at once on one working folder: the second refuses through Snakemake's
lock with one clear error, the first finishes, and what it built is whole."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from workflow_helpers import BIN, ROOT, snakemake

pytestmark = pytest.mark.slow
TINY = ROOT / "tests" / "workflow" / "config.yaml"
TARGET = "results/tiny/iter0/reader_warmup/model"


def test_a_second_run_on_the_same_folder_refuses(tmp_path):
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "HF_HUB_OFFLINE": "1"}
    command = [str(BIN / "snakemake"), "-s", str(ROOT / "Snakefile"), "--directory",
               str(tmp_path), "--configfile", str(TINY), "--cores", "1", TARGET]  # fmt: skip
    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)  # fmt: skip
    locks = tmp_path / ".snakemake" / "locks"
    deadline = time.monotonic() + 120
    while not (locks.is_dir() and any(locks.iterdir())):
        assert first.poll() is None and time.monotonic() < deadline, "the first run took no lock"
        time.sleep(0.1)
    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    output = second.stdout + second.stderr
    assert second.returncode != 0 and "cannot be locked" in output, output[-3000:]
    assert "Traceback" not in output
    out, _ = first.communicate(timeout=900)
    assert first.returncode == 0, out[-3000:]
    assert (tmp_path / TARGET / "model.safetensors").is_file()
    plan = snakemake(tmp_path, "--configfile", str(TINY), "-n", "--cores", "1", TARGET)
    assert "Nothing to be done" in plan.stdout + plan.stderr
    assert not list(Path(tmp_path / ".snakemake" / "locks").iterdir())  # released
