"""The training log's per-interval peak memory on a CPU (fid.runtime.logs.PeakMemory, issue 46.3):
each interval's own peak, and the process's own high-water mark (VmHWM, ru_maxrss, what
`/usr/bin/time -v` and Snakemake's benchmarks read) left at the run's peak."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

MIB = 2**20

# A fresh process: its peaks are its own (the test process's VmHWM is whatever earlier tests
# reached). A device of type "cpu" without importing torch (~3 s).
SCRIPT = textwrap.dedent(
    """
    import json, resource, time, types
    from pathlib import Path
    from fid.runtime.logs import PeakMemory

    def hwm():
        status = Path("/proc/self/status").read_text()
        return next(int(l.split()[1]) * 1024 for l in status.splitlines() if l.startswith("VmHWM"))

    def rss():
        return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()

    def hold(mib):  # a step's activations: `mib` MiB resident for 0.1 s, then freed
        block = b"\\x01" * (mib << 20)
        time.sleep(0.1)
        del block

    memory = PeakMemory(types.SimpleNamespace(type="cpu"), sample_s=0.005)
    out = {"base": rss()}
    for interval, mib in enumerate([400, 20, 300, 0]):
        if interval:
            memory.reset()  # the interval log's, at the step after each line
        hold(mib)
        out[f"peak{interval}"] = memory.peak_mb() * 2**20
        out[f"hwm{interval}"] = hwm()
    out["maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out["rss"] = rss()
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def peaks() -> dict:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_process_peak_survives_the_logging_intervals(peaks):
    """fid reset VmHWM through /proc/self/clear_refs at every log line, so `/usr/bin/time -v`
    and ru_maxrss saw the last interval's peak (1,495 MiB for a run that peaked at 7,050)."""
    lifetime = peaks["hwm0"]
    assert lifetime >= peaks["base"] + 390 * MIB
    assert peaks["hwm3"] == lifetime  # three resets later
    assert peaks["maxrss"] >= lifetime
    assert peaks["rss"] < lifetime - 300 * MIB  # the block is gone: a reset would show this


def test_each_interval_reports_its_own_peak(peaks):
    """A 400 MiB block held and freed in interval 0 is its peak (a new lifetime high: VmHWM,
    exact) and not interval 1's; interval 2's 300 MiB (under the lifetime high: sampled) is
    its peak and not interval 3's."""
    base = peaks["base"]
    assert peaks["peak0"] >= base + 390 * MIB
    assert peaks["peak1"] < base + 100 * MIB
    assert peaks["peak2"] >= base + 290 * MIB
    assert peaks["peak2"] < peaks["hwm0"] - 50 * MIB  # its own, not the lifetime high
    assert peaks["peak3"] < base + 100 * MIB
