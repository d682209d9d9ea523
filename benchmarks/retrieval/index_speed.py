"""faiss index build time, memory, search latency and recall on synthetic vectors, one CPU thread.

`build_passage_index` time, peak memory (VmHWM after writing 5 to /proc/self/clear_refs, minus the
RSS just before; one fresh process per setting, this script re-run with --index-worker), search
latency (a batch of --queries real NQ questions embedded by the pretrained MiniLM, k=100),
recall@100 against exact Flat (|found & exact top-100| / 100) and the share of the exact top-10
found in the top-100, for Flat, HNSW32 (efSearch 128, 256) and IVF{nlist},PQ48 (nprobe 16, 64;
nlist = 4 sqrt(n) rounded to a power of two) at --sizes (100k, 1M). The vectors are drawn to
resemble real MiniLM passage embeddings (synthetic_vectors.py, which also says what --workdir
caches). A setting is killed after --max-seconds, and HNSW is skipped at a size whose build,
extrapolated as n ** 1.4 from a smaller size's, would exceed it. Wall and CPU time are both given:
the machine is shared, and on one thread CPU time is close to what the wall time would be on an
idle machine. Prints markdown tables.

    python benchmarks/retrieval/index_speed.py
    python benchmarks/retrieval/index_speed.py --sizes 100000 --max-seconds 120
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from pathlib import Path

# the repository root first: `benchmarks.*` imports however this file is run
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import (
    memory_now,
    peak_memory,
    record,
    table_header,
    table_row,
    timed,
    write_record,
)
from benchmarks.retrieval.synthetic_vectors import (
    ROOT,
    WORKDIR,
    fmt_s,
    load_model,
    load_rows,
    one_thread,
    passage_ids,
    prepare_data,
    print_resemblance,
)

PQ_M = 48
# HNSW build time grows like n ** 1.4 on these vectors (18.8 s at 100k vs 1.9 s at 20k).
HNSW_GROWTH = 1.4


def _nlist(n: int) -> int:
    return 2 ** round(math.log2(4 * math.sqrt(n)))


def _factories(n: int, kinds: list[str]) -> list[str]:
    names = {"flat": "Flat", "hnsw": "HNSW32", "ivfpq": f"IVF{_nlist(n)},PQ{PQ_M}"}
    return [names[k] for k in kinds]


def _knobs(factory: str, ef_search: list[int], nprobe: list[int]) -> list[tuple[str, int | None]]:
    if factory.startswith("HNSW"):
        return [("efSearch", v) for v in ef_search]
    if factory.startswith("IVF"):
        return [("nprobe", v) for v in nprobe]
    return [("", None)]


def index_worker(factory: str, n: int, args) -> dict:
    """Builds one index in this process and measures it (main prints it as one JSON line)."""
    import gc

    import numpy as np

    from fid.config import IndexConfig
    from fid.retrieval.index_build import build_passage_index

    one_thread()
    vectors = load_rows(args.workdir / f"vectors_{args.vectors_n}.npy", n)
    queries = np.load(args.workdir / f"queries_{args.queries}.npy")
    ids = passage_ids(n)
    gt_path = args.workdir / f"gt_{n}_{args.queries}_{args.k}.npy"
    gc.collect()
    with peak_memory() as peak, timed() as build:
        index = build_passage_index(vectors, ids, IndexConfig(factory=factory), model="synthetic")
    held_mb = (memory_now() - peak.start_bytes) / 2**20
    results = []
    for knob, value in _knobs(factory, args.ef_search, args.nprobe):
        if knob == "efSearch":
            index.set_search_params(ef_search=value)
        elif knob == "nprobe":
            index.set_search_params(nprobe=value)
        index.search(queries[:10], args.k)  # warm-up
        with timed() as search:
            _, found = index.search(queries, args.k)
        ms = search.wall_s * 1000 / len(queries)
        cpu_ms = search.cpu_s * 1000 / len(queries)
        rows = [np.asarray(f, dtype=np.int64) for f in found]
        if factory == "Flat":
            np.save(gt_path, np.stack(rows))
        truth = np.load(gt_path)
        pairs = list(zip(rows, truth, strict=True))
        recall = float(np.mean([len(np.intersect1d(r, t)) / len(t) for r, t in pairs]))
        top10 = float(np.mean([len(np.intersect1d(r, t[:10])) / 10 for r, t in pairs]))
        results.append(
            {"knob": knob, "value": value, "ms_per_query": ms, "cpu_ms_per_query": cpu_ms}
            | {"recall": recall, "top10_in_topk": top10}
        )
    return {
        "factory": factory,
        "n": n,
        "build_s": build.wall_s,
        "build_cpu_s": build.cpu_s,
        "peak_mb": peak.above_mb,
        "held_mb": held_mb,
        "search": results,
    }


def _ground_truth(workdir: Path, vectors_path: Path, queries, n: int, k: int) -> None:
    """Exact top-k rows (what the Flat worker writes), when Flat is not among the settings."""
    import faiss
    import numpy as np

    path = workdir / f"gt_{n}_{len(queries)}_{k}.npy"
    if not path.is_file():
        index = faiss.IndexFlatIP(queries.shape[1])
        index.add(load_rows(vectors_path, n))
        np.save(path, index.search(queries, k)[1].astype(np.int64))


def part_index(args, queries, vectors_path: Path) -> list[dict]:
    sizes = sorted(args.sizes)
    print(
        f"\n### faiss indexes on synthetic vectors (d=384, inner product), {len(queries)} real NQ "
        f"queries, k={args.k}\n"
    )
    print(table_header(["n", "index", "build s wall (CPU)", "peak MB (build)", "held MB",
                        "search knob", f"ms/query wall (CPU), batch {len(queries)}",
                        f"recall@{args.k} vs Flat", f"exact top-10 in top-{args.k}"]))  # fmt: skip
    rows, done = [], {}
    note = (
        "Synthetic vectors drawn to resemble real MiniLM passage embeddings "
        "(synthetic_vectors.py), not real embeddings; queries are real. One thread; peak MB = "
        "VmHWM - RSS before the build, held MB = RSS after it - RSS before."
    )
    for n in sizes:
        if "flat" not in args.indexes:
            _ground_truth(args.workdir, vectors_path, queries, n, args.k)
        for factory in _factories(n, args.indexes):
            family = re.sub(r"\d.*", "", factory)
            skip = None
            if family == "HNSW" and family in done:
                n0, seconds = done[family]
                predicted = seconds * (n / n0) ** HNSW_GROWTH
                if predicted > args.max_seconds:
                    skip = (
                        f"skipped: build predicted ~{predicted:.0f} s from {n0} ({seconds:.0f} s) "
                        f"> --max-seconds {args.max_seconds}"
                    )
            if skip is None:
                command = [
                    sys.executable, __file__, "--index-worker", factory, str(n),
                    "--workdir", str(args.workdir), "--vectors-n", str(args.vectors_n),
                    "--queries", str(len(queries)), "--k", str(args.k),
                    "--ef-search", *map(str, args.ef_search), "--nprobe", *map(str, args.nprobe),
                ]  # fmt: skip
                with timed() as worker:
                    try:
                        out = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                                             timeout=args.max_seconds)  # fmt: skip
                    except subprocess.TimeoutExpired:
                        skip = f"stopped after --max-seconds {args.max_seconds} (build + searches)"
                    else:
                        if out.returncode != 0:
                            skip = "failed: " + out.stderr.strip().splitlines()[-1][:150]
            if skip is not None:
                rows.append({"factory": factory, "n": n, "note": skip})
                print(table_row([n, factory, "-", "-", "-", "-", "-", skip, "-"]), flush=True)
                continue
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["wall_s"] = worker.wall_s
            rows.append(row)
            done[family] = (n, row["build_s"])
            for result in row["search"]:
                knob = f"{result['knob']} {result['value']}" if result["knob"] else "exact"
                print(table_row([
                    n, factory, f"{fmt_s(row['build_s'])} ({fmt_s(row['build_cpu_s'])})",
                    f"{row['peak_mb']:.0f}", f"{row['held_mb']:.0f}", knob,
                    f"{result['ms_per_query']:.3f} ({result['cpu_ms_per_query']:.3f})",
                    f"{result['recall']:.4f}", f"{result['top10_in_topk']:.4f}",
                ]), flush=True)  # fmt: skip
    print(f"\n{note}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument(
        "--indexes", nargs="+", choices=["flat", "hnsw", "ivfpq"], default=["flat", "hnsw", "ivfpq"]
    )
    parser.add_argument("--ef-search", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--nprobe", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--queries", type=int, default=1000, help="NQ questions searched")
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--max-seconds", type=int, default=300, help="time box per index setting")
    parser.add_argument("--workdir", type=Path, default=WORKDIR)
    parser.add_argument("--json", type=Path, help="also write the run's record here")
    parser.add_argument("--index-worker", nargs=2, metavar=("FACTORY", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--vectors-n", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.index_worker:
        print(json.dumps(index_worker(args.index_worker[0], int(args.index_worker[1]), args)))
        return

    with timed() as total:
        model, encode = load_model()
        args.vectors_n = max(args.sizes)
        real, queries, vectors_path = prepare_data(
            model, encode, args.workdir, args.vectors_n, args.queries
        )
        print_resemblance(real, queries)
        rows = part_index(args, queries, vectors_path)
    print(f"\nTotal wall time {total.wall_s:.0f} s")
    if args.json:
        write_record(args.json, record(__file__, {"index": rows}))


if __name__ == "__main__":
    main()
