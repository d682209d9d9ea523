"""benchmarks/distillation_signals.py --small on the demo world: one table row per signal, the
mean top-1/5/20 and an interval of each difference against mean_logit that holds it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIGNALS = ["mean_logit", "attention_mass", "pdist", "loop", "pdist+emdr2"]
NUMBER = r"[+-]?\d+\.\d"


@pytest.mark.slow
def test_small_demo_table(tmp_path):
    command = [sys.executable, str(ROOT / "benchmarks/distillation_signals.py"), "--data",
               "demo", "--small", "--seeds", "0", "--out", str(tmp_path)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[:4] == ["signal", "top-1", "top-5", "top-20"] and len(header) == 7
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    assert list(rows) == SIGNALS
    base = [float(x) for x in rows["mean_logit"][:3]]
    assert rows["mean_logit"][3:] == ["—"] * 3
    for signal in SIGNALS[1:]:
        means = [float(x) for x in rows[signal][:3]]
        assert all(0 <= m <= 100 for m in means)
        for j, cell in enumerate(rows[signal][3:]):
            diff, low, high = map(float, re.fullmatch(
                rf"({NUMBER}) \[({NUMBER}), ({NUMBER})\]", cell).groups())  # fmt: skip
            assert diff == pytest.approx(means[j] - base[j], abs=0.11)
            assert low - 0.05 <= diff <= high + 0.05
    assert "questions per CPU-second" in result.stdout
