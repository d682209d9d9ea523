"""Speed and memory of `fid.demo.scale_data.make_scale_data` (`fid make-scale-data`).

Writes --passages passages (default 1,000,000; the questions scaled as NQ's, 3.8 per 1,000
passages) with one CPU thread into --output (default: a temporary folder, deleted afterwards)
and prints passages/s by wall and by CPU time (the machine is shared: on one thread, CPU time is
close to what the wall time would be on an idle machine), the MB written, the peak RSS (VmHWM)
and what it had grown since before the call. The fixed vocabulary is built first and timed on
its own (once per process: ~1 s).

    python benchmarks/data/scale_data_speed.py
    python benchmarks/data/scale_data_speed.py --passages 100000 --integer-ids false
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

# One thread (set before numpy is imported): the generator is meant to be one-core work.
for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_name] = "1"

from fid.config import ScaleDataConfig  # noqa: E402
from fid.config.demo import NQ_PASSAGES  # noqa: E402
from fid.demo.scale_data import _vocabulary, make_scale_data  # noqa: E402


def _status_mb(key: str) -> float:
    """A /proc/self/status memory line (VmRSS, VmHWM) in MB."""
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{key}:\s+(\d+) kB", text, re.M).group(1)) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--integer-ids", choices=["true", "false"], default="true")
    parser.add_argument("--output", type=Path, help="keep the files here (default: deleted)")
    args = parser.parse_args()

    began, cpu = time.perf_counter(), time.process_time()
    _vocabulary()
    vocab_s, vocab_cpu = time.perf_counter() - began, time.process_time() - cpu
    cfg = ScaleDataConfig(
        seed=args.seed,
        scale=min(1.0, args.passages / NQ_PASSAGES),
        n_passages=args.passages,
        integer_ids=args.integer_ids == "true",
    )
    output = args.output or Path(tempfile.mkdtemp(prefix="scale_data_speed."))
    rss_before = _status_mb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS, to measure this call alone
    began, cpu = time.perf_counter(), time.process_time()
    try:
        stats = make_scale_data(cfg, output)
        wall, cpu = time.perf_counter() - began, time.process_time() - cpu
        peak = _status_mb("VmHWM")
    finally:
        if args.output is None:
            shutil.rmtree(output, ignore_errors=True)
    n, mb = stats["passages"], sum(stats["bytes"].values()) / 1e6
    print(f"vocabulary: {vocab_s:.1f} s wall, {vocab_cpu:.1f} s CPU (once per process)")
    print(f"passages: {n:,}, questions: {stats['questions']}, articles: {stats['articles']:,}")
    print(f"wall: {wall:.1f} s = {n / wall:,.0f} passages/s")
    print(f"CPU:  {cpu:.1f} s = {n / cpu:,.0f} passages/s")
    print(f"written: {mb:,.1f} MB ({stats['bytes']['psgs_w100.tsv'] / n:.0f} bytes a passage row)")
    print(
        f"peak RSS: {peak:,.0f} MB ({peak - rss_before:+,.0f} MB over the {rss_before:,.0f} MB before)"
    )


if __name__ == "__main__":
    main()
