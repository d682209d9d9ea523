"""Overhead of `fid.retrieval.dense.retrieve` over encoding + a raw faiss search, one CPU thread.

`retrieve` (encode + search + fetch passages + has_answer + records) against question encoding
(pretrained MiniLM) + a raw faiss search of the same Flat index, on the SQuAD-open passages (167)
of samples/ with their 200 questions and on a --pipeline-size synthetic index with 200 NQ
questions (wall and CPU seconds, median of --repeats); with a step breakdown, the raw search with
faiss's BLAS kernel forced, and a cProfile of one `retrieve` call. Prints markdown tables. The
synthetic vectors, their passage texts and what --workdir caches: synthetic_vectors.py.

    python benchmarks/retrieval/retrieval_pipeline_speed.py
    python benchmarks/retrieval/retrieval_pipeline_speed.py --pipeline-size 20000
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import pstats
import statistics
import sys
from pathlib import Path

# the repository root first: `benchmarks.*` imports however this file is run
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import Timing, record, table_header, table_row, timed, write_record
from benchmarks.retrieval.synthetic_vectors import (
    DPR_PASSAGES,
    NQ_QUESTIONS,
    SQUAD_PASSAGES,
    SQUAD_QUESTIONS,
    WORKDIR,
    load_model,
    load_rows,
    passage_ids,
    prepare_data,
    print_resemblance,
)

# Queries of the resemblance table: index_speed.py's default --queries, so its cache is reused.
RESEMBLANCE_QUERIES = 1000


def _write_synthetic_passages(path: Path, anchors, real_passages) -> None:
    """A DPR TSV whose passage i (id "i") has the title and text of real passage anchors[i]."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(["id", "text", "title"])
        for i, anchor in enumerate(anchors):
            passage = real_passages[anchor]
            writer.writerow([str(i), passage.text, passage.title])


def _profile_table(profile: cProfile.Profile, top: int) -> list[str]:
    stats = pstats.Stats(profile)
    total = stats.total_tt
    entries = sorted(stats.stats.items(), key=lambda item: item[1][2], reverse=True)[:top]
    lines = [
        f"cProfile of one retrieve call ({total:.3f} s in all), top {top} by own time:",
        "",
        "| function | calls | own s | cumulative s |",
        "|---|---|---|---|",
    ]
    for (file, line, name), (_, calls, own, cumulative, _) in entries:
        where = f"{Path(file).name}:{line} {name}" if line else name
        lines.append(f"| `{where}` | {calls} | {own:.3f} | {cumulative:.3f} |")
    return lines


def _seconds(times: dict[str, Timing]) -> dict[str, tuple[float, float]]:
    """Each step's (wall, CPU) seconds."""
    return {key: (timing.wall_s, timing.cpu_s) for key, timing in times.items()}


def pipeline_case(model, encode, name, index, passages_path, questions, repeats) -> dict:
    """Times (i) encode + raw faiss search and (ii) `retrieve`, and the steps of (ii)."""
    import faiss
    import torch

    from fid.config import RetrieveConfig
    from fid.data.passages import fetch_passages
    from fid.retrieval.dense import encode_questions, rank_dense, retrieval_records

    cfg = RetrieveConfig()  # top_k 100, batch 64, "auto" = fp32 on a CPU
    device = torch.device("cpu")
    texts = [q["question"] for q in questions]
    k = min(cfg.top_k, index.count)

    def raw():
        times = {}
        with timed() as times["encode"]:
            vectors = encode_questions(model, encode, texts, cfg.batch_size, device, cfg.precision)
        with timed() as times["raw_search"]:
            index.index.search(vectors, k)
        threshold = faiss.cvar.distance_compute_blas_threshold
        faiss.cvar.distance_compute_blas_threshold = 0  # force the BLAS kernel (Flat only)
        try:
            with timed() as times["raw_search_blas"]:
                index.index.search(vectors, k)
        finally:
            faiss.cvar.distance_compute_blas_threshold = threshold
        return _seconds(times)

    def steps():
        times = {}
        with timed() as times["step_encode"]:
            vectors = encode_questions(model, encode, texts, cfg.batch_size, device, cfg.precision)
        with timed() as times["step_search"]:
            scores, ranked = index.search(vectors, cfg.top_k)
        with timed() as times["step_fetch"]:
            passages = fetch_passages(passages_path, {i for ids in ranked for i in ids})
        with timed() as times["step_records"]:
            retrieval_records(questions, ranked, scores, passages, cfg.has_answer_mode)
        return _seconds(times)

    def full():
        times = {}
        with timed() as times["retrieve"]:
            rank_dense(model, encode, index, passages_path, questions, cfg, device)
        return _seconds(times)

    raw(), full()  # warm-up (the has-answer tokenizer pattern is built on first use, ~0.5 s)
    runs = [raw() | full() | steps() for _ in range(repeats)]
    profile = cProfile.Profile()
    profile.enable()
    rank_dense(model, encode, index, passages_path, questions, cfg, device)
    profile.disable()

    row = {
        "case": name,
        "passages": index.count,
        "questions": len(questions),
        "passage_file_mb": passages_path.stat().st_size / 2**20,
        "blas_threshold": faiss.cvar.distance_compute_blas_threshold,
        "profile": _profile_table(profile, 15),
    }
    for key in runs[0]:
        row[key] = tuple(statistics.median(run[key][i] for run in runs) for i in (0, 1))
    for i, clock in enumerate(("wall", "cpu")):
        row[f"i_{clock}"] = statistics.median(
            run["encode"][i] + run["raw_search"][i] for run in runs
        )
        row[f"ratio_{clock}"] = row["retrieve"][i] / row[f"i_{clock}"]
    return row


def part_pipeline(model, encode, args, real, vectors_path: Path) -> list[dict]:
    import numpy as np

    from fid.config import IndexConfig
    from fid.data.passages import iter_passages
    from fid.data.questions import load_questions
    from fid.retrieval.index_build import build_passage_index

    rows = []
    squad = list(iter_passages(SQUAD_PASSAGES))
    index = build_passage_index(
        real[-len(squad) :], [p.id for p in squad], IndexConfig(factory="Flat"), "MiniLM"
    )
    questions = load_questions(SQUAD_QUESTIONS)
    rows.append(
        pipeline_case(
            model, encode, "SQuAD-open tiny (real)", index, SQUAD_PASSAGES, questions, args.repeats
        )
    )
    n = args.pipeline_size
    if n:
        real_passages = list(iter_passages(DPR_PASSAGES)) + squad
        anchors = np.load(vectors_path.with_name(vectors_path.name.replace("vectors", "anchors")))
        tsv = args.workdir / f"passages_{n}.tsv"
        _write_synthetic_passages(tsv, anchors[:n], real_passages)
        vectors = load_rows(vectors_path, n)
        index = build_passage_index(
            vectors, passage_ids(n), IndexConfig(factory="Flat"), "synthetic"
        )
        del vectors
        questions = load_questions(NQ_QUESTIONS)[: args.pipeline_questions]
        rows.append(
            pipeline_case(
                model, encode, f"synthetic {n} (Flat)", index, tsv, questions, args.repeats
            )
        )

    print(
        f"\n### retrieve() vs encode + raw faiss search (Flat, k=100, median of {args.repeats}; "
        "seconds as wall / CPU)\n"
    )
    print(table_header(["case", "passages (file MB)", "questions", "encode", "raw search",
                        "(i) encode + raw search", "(ii) retrieve", "(ii)/(i) wall",
                        "(ii)/(i) CPU"]))  # fmt: skip

    def pair(value):
        return f"{value[0]:.3f} / {value[1]:.3f}"

    for row in rows:
        verdict = "ok" if row["ratio_cpu"] <= 1.2 else "> 1.2"
        print(table_row([
            row["case"], f"{row['passages']} ({row['passage_file_mb']:.1f})", row["questions"],
            pair(row["encode"]), pair(row["raw_search"]), f"{row['i_wall']:.3f} / {row['i_cpu']:.3f}",
            pair(row["retrieve"]), f"{row['ratio_wall']:.2f}", f"{row['ratio_cpu']:.2f} ({verdict})",
        ]))  # fmt: skip
    print("\nThe steps of retrieve(), timed one by one (median, CPU seconds):\n")
    steps = ["step_encode", "step_search", "step_fetch", "step_records"]
    print(table_header(["case", "encode_questions", "PassageIndex.search", "fetch_passages",
                        "retrieval_records"]))  # fmt: skip
    for row in rows:
        print(table_row([row["case"], *(f"{row[step][1]:.3f}" for step in steps)]))
    print()
    for row in rows:
        print(
            f"- {row['case']}: faiss runs a Flat search on its BLAS kernel only when "
            f"n_queries x d >= distance_compute_blas_threshold ({row['blas_threshold']}); "
            f"{row['questions']} x 384 = {row['questions'] * 384}. "
            f"Forced to BLAS (threshold 0) the raw search takes {pair(row['raw_search_blas'])} s "
            f"instead of {pair(row['raw_search'])} s."
        )
    for row in rows:
        print(f"\n{row['case']}: " + "\n".join(row["profile"]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline-size", type=int, default=100_000, help="0: real case only")
    parser.add_argument("--pipeline-questions", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3, help="pipeline timings (median)")
    parser.add_argument("--workdir", type=Path, default=WORKDIR)
    parser.add_argument("--json", type=Path, help="also write the run's record here")
    args = parser.parse_args()
    with timed() as total:
        model, encode = load_model()
        real, queries, vectors_path = prepare_data(
            model, encode, args.workdir, args.pipeline_size, RESEMBLANCE_QUERIES
        )
        print_resemblance(real, queries)
        rows = part_pipeline(model, encode, args, real, vectors_path)
    print(f"\nTotal wall time {total.wall_s:.0f} s")
    if args.json:
        write_record(args.json, record(__file__, {"pipeline": rows}))


if __name__ == "__main__":
    main()
