"""benchmarks/harness.py, what every benchmark measures the same way: a block's wall and CPU
seconds, its peak resident memory above its start, the JSON record of a run (machine, versions,
commit) and the markdown tables (issue 47.4)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def harness():
    spec = importlib.util.spec_from_file_location("harness", ROOT / "benchmarks" / "harness.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_timed_counts_cpu_for_work_and_wall_only_for_waiting(harness):
    calls = []
    with harness.timed(sync=lambda: calls.append("sync")) as busy:
        end = time.process_time() + 0.05
        while time.process_time() < end:
            pass
    assert calls == ["sync", "sync"]  # before the clocks start and before they stop
    assert 0.05 <= busy.cpu_s <= busy.wall_s + 0.01
    with harness.timed() as waiting:
        time.sleep(0.05)
    assert waiting.wall_s >= 0.05 and waiting.cpu_s < 0.03


def test_peak_memory_is_the_blocks_peak_above_its_start(harness):
    size = 64 * harness.MIB
    with harness.peak_memory() as peak:
        block = np.ones(size // 8)  # every page written: resident
        del block  # freed before the end: the peak remains
    assert peak.start_bytes == pytest.approx(harness.status_bytes("VmRSS"), rel=0.5)
    # (freed heap the block reused may already have been resident: a few pages less)
    assert 0.9 * size <= peak.above_bytes <= size + 32 * harness.MIB
    assert peak.above_mb == peak.above_bytes / 2**20
    with harness.peak_memory() as small:
        pass
    assert small.above_bytes < 8 * harness.MIB  # a new block starts its own peak


def test_a_record_says_which_run_on_what(harness, tmp_path):
    script = ROOT / "benchmarks" / "reader" / "reader_speed.py"
    run = harness.record(script, [{"step_s": np.float64(0.5), "ids": np.arange(3)}])
    assert run["benchmark"] == "reader/reader_speed.py"
    assert run["command"].startswith("python ")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", run["date"])
    assert set(run["machine"]) >= {"cpu", "cores", "usable_cores", "ram_gb"}
    assert run["machine"]["cores"] >= 1 and run["machine"]["ram_gb"] > 0
    assert set(run["versions"]) == {"python", "torch", "transformers", "faiss", "fid"}
    assert all(run["versions"].values())  # all installed here (make setup)
    assert re.fullmatch(r"[0-9a-f]{40}", run["git"]["commit"])
    assert isinstance(run["git"]["dirty"], bool)
    path = tmp_path / "out" / "run.json"
    harness.write_record(path, run)
    written = json.loads(path.read_text())  # numpy values written as numbers and lists
    assert written["results"] == [{"step_s": 0.5, "ids": [0, 1, 2]}]
    assert written["machine"] == run["machine"]
    assert [p.name for p in path.parent.iterdir()] == ["run.json"]  # no temporary file left


def test_tables_are_markdown(harness):
    assert harness.table_header(["N", "step s"]) == "| N | step s |\n|---|---|"
    assert harness.table_header(["N", "s"], align="lr") == "| N | s |\n|---|---:|"
    assert harness.table_row([10, "0.5"]) == "| 10 | 0.5 |"
    assert harness.table(["a"], [[1], [2]]) == "| a |\n|---|\n| 1 |\n| 2 |"
    with pytest.raises(ValueError, match="align 'l': expected one of l/r for each of 2 columns"):
        harness.table_header(["N", "s"], align="l")
