"""benchmarks/gpu_check.py, the GPU path's acceptance run, on a CPU with tiny sizes: every check
a CPU can run passes (bf16 training against the fp32 run, the signal-and-resume bitwise check,
device-against-CPU inference, a one-rank process group with FSDP, the retriever, the
acceleration table, the MFU figure, the memory plan's smoke case, out-of-memory recovery under
a simulated error), so that the script works the day a GPU runs it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_the_acceptance_run_passes_on_a_cpu(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--small",
         "--out", str(tmp_path)], capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    checks = {row["check"]: row for row in report["checks"]}
    assert list(checks) == ["train_precisions", "resume", "inference", "process_group",
                            "train_retriever", "acceleration_speed", "mfu", "memory_plan",
                            "oom"]  # fmt: skip
    assert all(row["ok"] for row in checks.values()), checks
    assert "fp16" not in checks["train_precisions"]["detail"]  # CUDA only
    assert "bitwise equal" in checks["resume"]["detail"]
    assert checks["process_group"]["detail"].startswith("gloo, 2 ranks: collectives ok; FSDP")
    assert "| plain |" in (tmp_path / "acceleration_speed.txt").read_text()
    assert "Self CPU" in (tmp_path / "mfu_profile.txt").read_text()  # the step's profile
    assert checks["memory_plan"]["detail"].startswith("worst error ")
    assert len(json.loads((tmp_path / "memory_plan.json").read_text())) == 1
    # out of memory (simulated on a CPU): training and scoring split, and equal the unsplit runs
    assert re.fullmatch(r"training: batch 8: \d+ split\(s\), token limit none -> \d+, parameters "
                        r"within \S+ of the unsplit run's; scoring: batch 16: size 16 -> 8, "
                        r"\d+ scores within \S+ of the unsplit run's", checks["oom"]["detail"])  # fmt: skip
    print(result.stdout)
