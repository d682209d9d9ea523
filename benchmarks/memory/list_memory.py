"""Memory and time of retrieval lists in both formats, and of the passage store (issue 13).

What it measures, each in a fresh subprocess (one at a time, one CPU thread) so that one
measurement's heap never pollutes the next one's RSS:

1. train-reader's training data at 1/10 of NQ's questions (7,917 x 100 passages, over a
   210,000-passage corpus), loaded by `fid.data.examples.load_examples(path,
   require_answers=True, passages=STORE)` from FiD json (every passage's text in every list) and
   from compact lists (ids + score columns, the text read by id from the passage store): the
   time of the load, its peak RSS (VmHWM, reset with /proc/self/clear_refs right after the
   imports, minus the RSS at that moment) and the RSS still held afterwards; for compact lists
   also the time of one batch of examples (examples[0..7], whose passages are read from the
   store then), and how the held memory splits into numpy columns and question fields; the
   files' sizes on disk.
2. The passage store of a 2,000,000-passage corpus: wall and CPU time and peak RSS of
   `build_passage_store(tsv, folder)`, the store's size on disk, and the lookup speed of
   `store.get(ids)` for random ids in batches of 100 (passages/s; the TSV is in the page cache,
   as it is right after the store was built).
3. `fid score-passages`-like use of compact lists: load, then build every example in turn
   (all 791,700 passages read from the store), peak RSS and time.

The data is made once and kept in --workdir (reruns only measure): `make_scale_data` corpora
(NQ-shaped psgs_w100.tsv and NQ-open questions), a passage store, a BM25 index (default
`BM25Config`), the train split's top-100 retrieved as compact lists, and those lists converted
to FiD json (as `fid convert-lists` does). Making it takes ~10 min on a loaded 2-core machine
and ~2 GB of disk (2M corpus: 1.2 GB, FiD json: 0.54 GB). Prints a markdown table.

    .venv/bin/python benchmarks/memory/list_memory.py
    .venv/bin/python benchmarks/memory/list_memory.py --workdir /tmp/fid_list_memory --skip-store
    .venv/bin/python benchmarks/memory/list_memory.py --questions 2000 --store-passages 500000

A job's address space is capped at --memory-limit-gb (default 12): a load that would exceed it
fails with MemoryError (reported) instead of exhausting the machine; rerun with fewer
--questions and extrapolate (the loads grow linearly with the number of lists).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

# One thread (set before numpy is imported): every job is meant to be one-core work.
for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_name] = "1"

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `benchmarks.*` from anywhere
from benchmarks.harness import (  # noqa: E402
    MIB,
    memory_now,
    memory_peak,
    peak_memory,
    record,
    table_header,
    table_row,
    timed,
    write_record,
)

NQ_TRAIN_TENTH = 7_917  # round(79,168 / 10)
RESULT = "LIST_MEMORY_RESULT "  # prefix of the line a job prints its result on
BATCH = 8  # examples in "one batch" of the compact loader
HEADER = ["measurement", "size", "wall", "CPU", "peak RSS (over imports)", "held after", "on disk"]
HEADER += ["notes"]


def _size_mb(path: Path) -> float:
    """A file's or a folder's size in MB."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6
    return path.stat().st_size / 1e6


def _paths(workdir: Path, params: dict) -> dict[str, Path]:
    """Where the data of these sizes lives in the workdir (the sizes name the folders)."""
    lists = workdir / f"lists_q{params['questions']}_p{params['corpus_passages']}"
    corpus = workdir / f"corpus_{params['store_passages']}"
    return {
        "lists": lists,
        "lists_corpus": lists / "corpus",
        "lists_store": lists / "store",
        "bm25": lists / "bm25",
        "compact": lists / "train.compact.jsonl",
        "fid_json": lists / "train.fid.json",
        "corpus": corpus,
        "tsv": corpus / "psgs_w100.tsv",
        "store": workdir / f"store_{params['store_passages']}",
    }


# ---- jobs: each runs in its own process and returns a dict of figures ----


def job_prepare_lists(params: dict) -> dict:
    """Makes (once) the corpus, store, BM25 index and both list files of measurement 1."""
    from fid.config import BM25Config, ScaleDataConfig
    from fid.data.list_conversion import convert_lists
    from fid.data.passage_store import build_passage_store
    from fid.demo.scale_data import make_scale_data
    from fid.retrieval.bm25 import build_bm25, retrieve_bm25

    p = _paths(Path(params["workdir"]), params)
    steps = {}

    def step(name: str, output: Path, make: Callable[[], object]) -> None:
        if output.exists():
            return
        with timed() as clock:
            make()
        steps[name] = round(clock.wall_s, 1)

    cfg = ScaleDataConfig(
        n_passages=params["corpus_passages"], n_train=params["questions"], n_dev=0, n_test=0
    )
    tsv = p["lists_corpus"] / "psgs_w100.tsv"
    step("make_scale_data", p["lists_corpus"], lambda: make_scale_data(cfg, p["lists_corpus"]))
    step(
        "build_passage_store", p["lists_store"], lambda: build_passage_store(tsv, p["lists_store"])
    )
    step("build_bm25", p["bm25"], lambda: build_bm25(tsv, p["bm25"], BM25Config()))
    retrieve = BM25Config(top_k=100, list_format="compact")
    train = p["lists_corpus"] / "train.jsonl"
    step(
        "retrieve_bm25",
        p["compact"],
        lambda: retrieve_bm25(retrieve, p["bm25"], p["lists_store"], train, p["compact"]),
    )
    step(
        "convert_lists",
        p["fid_json"],
        lambda: convert_lists(p["compact"], p["lists_store"], p["fid_json"]),
    )
    return {"made_s": steps}


def job_load_fid_json(params: dict) -> dict:
    """load_examples of the FiD json lists: every ctx a dict holding its text."""
    from fid.data.examples import load_examples

    p = _paths(Path(params["workdir"]), params)
    with peak_memory() as peak, timed() as clock:
        examples = load_examples(p["fid_json"], require_answers=True, passages=p["lists_store"])
    return {
        "questions": len(examples),
        "passages": sum(len(e.ctxs) for e in examples),
        "wall_s": clock.wall_s,
        "cpu_s": clock.cpu_s,
        "base_mb": peak.start_bytes / MIB,
        "peak_mb": peak.above_mb,
        "held_mb": (memory_now() - peak.start_bytes) / MIB,
        "disk_mb": _size_mb(p["fid_json"]),
    }


def _deep_size(value: object) -> int:
    """Bytes of a json-like Python value (dicts, lists, strings, numbers), shared ones once."""
    seen: set[int] = set()
    stack, total = [value], 0
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return total


def job_load_compact(params: dict) -> dict:
    """load_examples of the compact lists (opens the store), then one batch of examples."""
    from fid.data.examples import load_examples

    p = _paths(Path(params["workdir"]), params)
    with peak_memory() as peak, timed() as clock:
        examples = load_examples(p["compact"], require_answers=True, passages=p["lists_store"])
    held = (memory_now() - peak.start_bytes) / MIB
    with timed() as batch_clock:
        batch = [examples[i] for i in range(BATCH)]
    lists = examples.lists
    n = len(lists.passage_ids)
    arrays = {
        "passage_ids": lists.passage_ids.nbytes,
        "offsets": lists.offsets.nbytes,
        **{
            f"column {name}": getattr(column.values, "nbytes", _deep_size(column.values))
            for name, column in lists.columns.items()
        },
    }
    return {
        "questions": len(examples),
        "passages": n,
        "wall_s": clock.wall_s,
        "cpu_s": clock.cpu_s,
        "base_mb": peak.start_bytes / MIB,
        "peak_mb": peak.above_mb,
        "held_mb": held,
        "batch_wall_s": batch_clock.wall_s,
        "batch_cpu_s": batch_clock.cpu_s,
        "batch_passages": sum(len(e.ctxs) for e in batch),
        # the peak since the load began (no reset in between): the load's or the batch's
        "batch_peak_mb": (memory_peak() - peak.start_bytes) / MIB,
        "array_bytes": arrays,
        "id_bytes": lists.passage_ids.dtype.itemsize,
        "fields_bytes": _deep_size(lists.fields),
        "disk_mb": _size_mb(p["compact"]),
        "store_disk_mb": _size_mb(p["lists_store"]),
        "lists_tsv_mb": _size_mb(p["lists_corpus"] / "psgs_w100.tsv"),
    }


def job_iterate_compact(params: dict) -> dict:
    """score-passages-like: load the compact lists, then build every example in turn."""
    from fid.data.examples import load_examples

    p = _paths(Path(params["workdir"]), params)
    with peak_memory() as peak, timed() as clock:
        examples = load_examples(p["compact"], passages=p["lists_store"])
        n_passages = 0
        for example in examples:
            n_passages += len(example.ctxs)
    return {
        "questions": len(examples),
        "passages": n_passages,
        "wall_s": clock.wall_s,
        "cpu_s": clock.cpu_s,
        "peak_mb": peak.above_mb,
        "held_mb": (memory_now() - peak.start_bytes) / MIB,
    }


def job_make_store_corpus(params: dict) -> dict:
    """Makes (once) the corpus of measurement 2 (questions scaled as NQ's)."""
    from fid.config import ScaleDataConfig
    from fid.config.demo import NQ_PASSAGES
    from fid.demo.scale_data import make_scale_data

    p = _paths(Path(params["workdir"]), params)
    if p["corpus"].exists():
        return {}
    n = params["store_passages"]
    with timed() as clock:
        cfg = ScaleDataConfig(scale=min(1.0, n / NQ_PASSAGES), n_passages=n)
        make_scale_data(cfg, p["corpus"])
    return {"made_wall_s": clock.wall_s, "made_cpu_s": clock.cpu_s}


def job_build_store(params: dict) -> dict:
    """build_passage_store of the big corpus (rebuilt on every run: it is the measurement)."""
    from fid.data.passage_store import build_passage_store

    p = _paths(Path(params["workdir"]), params)
    shutil.rmtree(p["store"], ignore_errors=True)
    with peak_memory() as peak, timed() as clock:
        built = build_passage_store(p["tsv"], p["store"])
    return {
        "passages": built["n_passages"],
        "wall_s": clock.wall_s,
        "cpu_s": clock.cpu_s,
        "peak_mb": peak.above_mb,
        "disk_mb": _size_mb(p["store"]),
        "tsv_mb": _size_mb(p["tsv"]),
    }


def job_store_lookups(params: dict) -> dict:
    """Random `store.get(ids)` in batches of 100 (ids 1..N: the corpus has DPR's integer ids)."""
    import numpy as np

    from fid.data.passage_store import open_store

    p = _paths(Path(params["workdir"]), params)
    with peak_memory() as peak:
        with timed() as opening:
            store = open_store(p["store"])
        rng = np.random.default_rng(0)
        wanted = (rng.integers(1, len(store) + 1, size=params["lookups"])).tolist()
        batches = [[str(i) for i in wanted[k : k + 100]] for k in range(0, len(wanted), 100)]
        with timed() as clock:
            n = sum(len(store.get(batch)) for batch in batches)
    return {
        "passages": n,
        "open_s": opening.wall_s,
        "wall_s": clock.wall_s,
        "cpu_s": clock.cpu_s,
        "peak_mb": peak.above_mb,
    }


JOBS: dict[str, Callable[[dict], dict]] = {
    "prepare_lists": job_prepare_lists,
    "load_fid_json": job_load_fid_json,
    "load_compact": job_load_compact,
    "iterate_compact": job_iterate_compact,
    "make_store_corpus": job_make_store_corpus,
    "build_store": job_build_store,
    "store_lookups": job_store_lookups,
}


# ---- the parent: runs the jobs one after another and prints the table ----


def _run_job(name: str, params: dict) -> dict:
    """Runs one job in a fresh interpreter; its result, or {"error": ...} when it failed."""
    print(f"[{time.strftime('%H:%M:%S')}] {name} ...", file=sys.stderr, flush=True)
    command = [sys.executable, __file__, "--job", name, "--params", json.dumps(params)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT) :])
    tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
    print(f"{name} failed (exit {done.returncode}):\n" + "\n".join(tail), file=sys.stderr)
    return {"error": (tail[-1] if tail else f"exit {done.returncode}")}


def _worker(name: str, params: dict) -> None:
    limit = int(params["memory_limit_gb"] * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    result = JOBS[name](params)
    print(RESULT + json.dumps(result), flush=True)


def _mb(value: float) -> str:
    return f"{value:,.0f} MB" if value >= 10 else f"{value:,.1f} MB"


def _table(params: dict, results: dict[str, dict]) -> list[str]:
    lines = [table_header(HEADER)]
    q = params["questions"]
    shape = f"{q:,} q x 100"

    def failed(name: str) -> bool:
        result = results.get(name)
        if result is None:
            return True
        if "error" in result:
            lines.append(table_row([name, shape, "", "", "", "", "", f"failed: {result['error']}"]))
            return True
        return False

    if not failed("load_fid_json"):
        r = results["load_fid_json"]
        peak, held = (r[key] * 2**20 / r["passages"] for key in ("peak_mb", "held_mb"))
        lines.append(table_row([
            "load_examples, FiD json", shape, f"{r['wall_s']:.1f} s", f"{r['cpu_s']:.1f} s",
            _mb(r["peak_mb"]), _mb(r["held_mb"]), _mb(r["disk_mb"]),
            f"{peak:,.0f} B peak, {held:,.0f} B held per passage; imports {r['base_mb']:.0f} MB",
        ]))  # fmt: skip
    if not failed("load_compact"):
        r = results["load_compact"]
        per = r["held_mb"] * 2**20 / r["passages"]
        arrays = sum(r["array_bytes"].values())
        lines.append(table_row([
            "load_examples, compact", shape, f"{r['wall_s']:.1f} s", f"{r['cpu_s']:.1f} s",
            _mb(r["peak_mb"]), _mb(r["held_mb"]), _mb(r["disk_mb"]),
            f"{per:,.0f} B held per passage: numpy {arrays / r['passages']:.0f} B/passage "
            f"(ids {r['id_bytes']} B), question fields {r['fields_bytes'] / 2**20:.1f} MB "
            f"({r['fields_bytes'] / r['questions']:,.0f} B/question); imports "
            f"{r['base_mb']:.0f} MB",
        ]))  # fmt: skip
        lines.append(table_row([
            f"compact: one batch (examples[0..{BATCH - 1}])", f"{r['batch_passages']} passages",
            f"{r['batch_wall_s'] * 1e3:.0f} ms", f"{r['batch_cpu_s'] * 1e3:.0f} ms",
            _mb(r["batch_peak_mb"]), "", _mb(r["store_disk_mb"]),
            f"{r['batch_passages'] / r['batch_wall_s']:,.0f} passages/s; on disk: the store "
            f"of the {_mb(r['lists_tsv_mb'])} corpus",
        ]))  # fmt: skip
    if "iterate_compact" in results and not failed("iterate_compact"):
        r = results["iterate_compact"]
        lines.append(table_row([
            "compact: load + build every example", f"{r['passages']:,} passages",
            f"{r['wall_s']:.1f} s", f"{r['cpu_s']:.1f} s", _mb(r["peak_mb"]), _mb(r["held_mb"]),
            "", f"{r['passages'] / r['wall_s']:,.0f} passages/s (score-passages-like)",
        ]))  # fmt: skip
    n = f"{params['store_passages']:,} passages"
    if "build_store" in results and not failed("build_store"):
        r = results["build_store"]
        lines.append(table_row([
            "build_passage_store", n, f"{r['wall_s']:.1f} s", f"{r['cpu_s']:.1f} s",
            _mb(r["peak_mb"]), "", _mb(r["disk_mb"]),
            f"{r['passages'] / r['wall_s']:,.0f} passages/s wall, "
            f"{r['passages'] / r['cpu_s']:,.0f}/s CPU; TSV {_mb(r['tsv_mb'])}",
        ]))  # fmt: skip
    if "store_lookups" in results and not failed("store_lookups"):
        r = results["store_lookups"]
        lines.append(table_row([
            "store.get, random ids, batches of 100", f"{r['passages']:,} of {n}",
            f"{r['wall_s']:.1f} s", f"{r['cpu_s']:.1f} s", _mb(r["peak_mb"]), "", "",
            f"{r['passages'] / r['wall_s']:,.0f} passages/s wall, "
            f"{r['passages'] / r['cpu_s']:,.0f}/s CPU (page cache warm); open "
            f"{r['open_s'] * 1e3:.0f} ms",
        ]))  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fid_list_memory"))
    parser.add_argument("--questions", type=int, default=NQ_TRAIN_TENTH, help="lists to load")
    parser.add_argument("--corpus-passages", type=int, default=210_000, help="corpus of lists")
    parser.add_argument("--store-passages", type=int, default=2_000_000)
    parser.add_argument("--lookups", type=int, default=100_000, help="random store.get ids")
    parser.add_argument("--memory-limit-gb", type=float, default=12.0)
    parser.add_argument("--skip-store", action="store_true", help="skip measurement 2")
    parser.add_argument("--skip-iterate", action="store_true", help="skip measurement 3")
    parser.add_argument("--json", type=Path, help="also write the run's record here")
    parser.add_argument("--job", choices=sorted(JOBS), help=argparse.SUPPRESS)
    parser.add_argument("--params", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        _worker(args.job, json.loads(args.params))
        return
    params = {
        "workdir": str(args.workdir.resolve()),
        "questions": args.questions,
        "corpus_passages": args.corpus_passages,
        "store_passages": args.store_passages,
        "lookups": args.lookups,
        "memory_limit_gb": args.memory_limit_gb,
    }
    args.workdir.mkdir(parents=True, exist_ok=True)
    names = ["prepare_lists", "load_fid_json", "load_compact"]
    names += [] if args.skip_iterate else ["iterate_compact"]
    names += [] if args.skip_store else ["make_store_corpus", "build_store", "store_lookups"]
    results = {}
    for name in names:
        results[name] = _run_job(name, params)
        if name == "prepare_lists" and "error" in results[name]:
            sys.exit("could not make the lists: see above")
        if name == "make_store_corpus" and "error" in results[name]:
            break
    made = dict(results["prepare_lists"].get("made_s", {}))
    corpus = results.get("make_store_corpus", {})
    if "made_wall_s" in corpus:
        made[f"make_scale_data {params['store_passages']:,}"] = corpus["made_wall_s"]
    if made:
        print("data made now (wall s): " + ", ".join(f"{k} {v:.1f}" for k, v in made.items()))
    print("\n".join(_table(params, results)))
    if args.json:
        write_record(args.json, record(__file__, {"params": params, "jobs": results}))


if __name__ == "__main__":
    main()
