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
import shutil
import sys
import tempfile
from pathlib import Path

# One thread (set before numpy is imported): the generator is meant to be one-core work.
for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_name] = "1"

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `benchmarks.*` from anywhere
from benchmarks.harness import MIB, peak_memory, record, timed, write_record  # noqa: E402
from fid.config import ScaleDataConfig  # noqa: E402
from fid.config.demo import NQ_PASSAGES  # noqa: E402
from fid.demo.scale_data import _vocabulary, make_scale_data  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--integer-ids", choices=["true", "false"], default="true")
    parser.add_argument("--output", type=Path, help="keep the files here (default: deleted)")
    parser.add_argument("--json", type=Path, help="also write the run's record here")
    args = parser.parse_args()

    with timed() as vocabulary:
        _vocabulary()
    cfg = ScaleDataConfig(
        seed=args.seed,
        scale=min(1.0, args.passages / NQ_PASSAGES),
        n_passages=args.passages,
        integer_ids=args.integer_ids == "true",
    )
    output = args.output or Path(tempfile.mkdtemp(prefix="scale_data_speed."))
    try:
        with peak_memory() as peak, timed() as clock:  # this call alone
            stats = make_scale_data(cfg, output)
    finally:
        if args.output is None:
            shutil.rmtree(output, ignore_errors=True)
    n, mb = stats["passages"], sum(stats["bytes"].values()) / 1e6
    wall, cpu = clock.wall_s, clock.cpu_s
    rss_before, peak_mb = peak.start_bytes / MIB, (peak.start_bytes + peak.above_bytes) / MIB
    print(f"vocabulary: {vocabulary.wall_s:.1f} s wall, {vocabulary.cpu_s:.1f} s CPU "
          "(once per process)")  # fmt: skip
    print(f"passages: {n:,}, questions: {stats['questions']}, articles: {stats['articles']:,}")
    print(f"wall: {wall:.1f} s = {n / wall:,.0f} passages/s")
    print(f"CPU:  {cpu:.1f} s = {n / cpu:,.0f} passages/s")
    print(f"written: {mb:,.1f} MB ({stats['bytes']['psgs_w100.tsv'] / n:.0f} bytes a passage row)")
    print(f"peak RSS: {peak_mb:,.0f} MB ({peak.above_mb:+,.0f} MB over the {rss_before:,.0f} MB "
          "before)")  # fmt: skip
    if args.json:
        figures = dict(stats, wall_s=wall, cpu_s=cpu, vocabulary_wall_s=vocabulary.wall_s,
                       vocabulary_cpu_s=vocabulary.cpu_s, rss_before_mb=rss_before,
                       peak_rss_mb=peak_mb, written_mb=mb)  # fmt: skip
        write_record(args.json, record(__file__, figures))


if __name__ == "__main__":
    main()
