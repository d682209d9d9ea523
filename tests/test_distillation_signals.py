"""benchmarks/reader/distillation_signals.py --small on the demo world (issue 49): a row per signal
with the temperature its dev sweep chose, the two no-teacher controls (uniform, in_batch), and
every row against each control with a paired bootstrap interval, p-value and Holm's adjusted
p-value over the table's comparisons."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROWS = ["mean_logit", "pdist_mean", "uniform", "in_batch"]
NUMBER = r"[+-]?\d+\.\d"


def _table(lines: list[str]) -> dict[str, list[str]]:
    return {cells[0]: cells[1:] for cells in
            ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:])}  # fmt: skip


@pytest.mark.slow
def test_small_demo_tables(tmp_path):
    command = [sys.executable, str(ROOT / "benchmarks/reader/distillation_signals.py"), "--data",
               "demo", "--small", "--seeds", "0", "--rows", *ROWS, "--out", str(tmp_path)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    first = lines.index(next(line for line in lines if line.startswith("| signal | T (dev)")))
    means = _table(lines[first : first + 2 + len(ROWS)])
    assert list(means) == ROWS
    # a swept row: its chosen temperature is the best of its two dev scores
    chosen, *top, dev = means["pdist_mean"]
    scores = dict(pair.split(": ") for pair in dev.split(", "))
    assert list(scores) == ["0.03", "0.1"]
    assert float(scores[chosen]) == max(map(float, scores.values()))
    assert means["uniform"][0] == means["in_batch"][0] == "1 (fixed)"
    assert all(0 <= float(x) <= 100 for row in means.values() for x in row[1:4])
    header = next(i for i, line in enumerate(lines) if line.startswith("| signal | vs |"))
    pairs = [line for line in lines[header + 2 :] if line.startswith("|")]
    expected = [(r, c) for r in ROWS for c in ("uniform", "in_batch")
                if r != c and (r, c) != ("in_batch", "uniform")]  # fmt: skip
    assert [tuple(c.strip() for c in line.strip("|").split("|")[:2]) for line in pairs] == expected
    cell = rf"({NUMBER}) \[({NUMBER}), ({NUMBER})\] (\d\.\d+) \((\d\.\d+)( \*)?\)"
    for line in pairs:
        row, control, *cells = [c.strip() for c in line.strip("|").split("|")]
        for j, text in enumerate(cells):
            diff, low, high, p, holm, star = re.fullmatch(cell, text).groups()
            gap = float(means[row][1 + j]) - float(means[control][1 + j])
            assert float(diff) == pytest.approx(gap, abs=0.11)
            assert float(low) - 0.05 <= float(diff) <= float(high) + 0.05
            assert float(p) <= float(holm) <= 1
            assert float(holm) <= 0.05 if star else float(holm) >= 0.0495  # shown rounded
    assert f"{3 * len(expected)} comparisons; * Holm-adjusted p < 0.05:" in result.stdout
    assert "questions per CPU-second" in result.stdout
