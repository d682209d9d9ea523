"""The laws of benchmarks/retrieval/bm25_scale.py's measurements (issue 48.3), fitted and extrapolated to
psgs_w100 (21,015,324 passages, 5,345,463 terms) and NQ's / TriviaQA's question splits; and the
resources of the workflow's sharded BM25 rules at a chosen shard count S.

    python benchmarks/retrieval/bm25_scale_laws.py /tmp/fid_bm25_scale/results.jsonl [--choose 16]

bm25_scale.py measures and calls `report` when it is done; this script refits a results file.
Laws (least squares, printed with each point's relative residual): a job's peak RSS and CPU =
a + b x the passages it holds, plus what each vocabulary term beyond the synthetic corpus's
costs (the vocabulary probe's excess over the law); a question's CPU in a shard = c + d x the
shard's passages, plus its postings at psgs_w100's share (the heavy questions' excess per
posting); the merge = a + b x questions + c x questions x shards (its memory past the list
writer's 1,024-question chunk grown from the largest merge measured by the law of its arrays,
and c of its CPU, the fold of one shard's lists, from the arrays alone).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import table  # noqa: E402

NQ_PASSAGES = 21_015_324
LUCENE_TERMS = 5_345_463  # unique terms of Pyserini's wikipedia-dpr-100w index
SPLITS = {"nq": {"train": 79_168, "dev": 8_757, "test": 3_610},
          "tqa": {"train": 78_785, "dev": 8_837, "test": 11_313}}  # fmt: skip
SMALL_Q = 20  # the questions of a retrieval that measures a job's start
# Sum of a question's terms' df / N assumed for NQ / TriviaQA on psgs_w100: over samples/dpr's 751
# rows it is 0.084 (NQ test) and 0.056 (TriviaQA test); rounded up.
REAL_POSTINGS = 0.1
# CPU s a shard build spends per passage of the whole file, whatever its slice: the file's
# sha256 (checked against the statistics') and, on average, half the file's lines counted to
# find its first row. Measured on the 1M corpus (594 MB, 2026-12-05): sha256 0.47 s, lines
# 0.06 s (shard 1 of 8) to 0.52 s (shard 8 of 8).
WHOLE_FILE_CPU_S = 0.47e-6 + 0.29e-6


def fit(x: list[list[float]], y: list[float]) -> tuple[list[float], list[float]]:
    """Least squares y = a + b . x (x: one row of regressors a point): the coefficients
    [a, b...] and each point's residual relative to its y."""
    import numpy as np

    design = np.column_stack([np.ones(len(y)), np.array(x, dtype=float)])
    coef = np.linalg.lstsq(design, np.array(y, dtype=float), rcond=None)[0]
    return coef.tolist(), ((np.array(y) - design @ coef) / np.array(y)).tolist()


def law(name: str, coef: list[float], residuals: list[float], terms: str) -> str:
    worst = max(abs(r) for r in residuals) if residuals else float("nan")
    parts = " + ".join(f"{c:.4g}{t}" for c, t in zip(coef, ["", *terms.split(",")], strict=True))
    return f"{name} = {parts}   ({len(residuals)} points, worst residual {worst:.1%})"


def measured_table(rows: list[dict], pick) -> str:
    """Per corpus and S: a shard's build (CPU s, the mean of those measured · the largest peak
    RSS), its retrieval (CPU ms a question, from Q and 20 questions · peak RSS), the merge of
    Q questions; and bm25-stats and one index (CPU · peak RSS)."""
    lines = []
    for n in sorted({r["n"] for r in pick("stats")}):
        stats = pick("stats", n=n)[0]
        one, one_q = pick("build_one", n=n), pick("retrieve_one", n=n)
        for s in sorted({r["s"] for r in pick("build", n=n)}):
            builds, full = pick("build", n=n, s=s), pick("retrieve", n=n, s=s)
            q = max(r["q"] for r in full)
            per_q = [(r["cpu_s"] - small[0]["cpu_s"]) / (q - SMALL_Q) * 1e3 for r in full
                     if r["q"] == q and (small := pick("retrieve", n=n, s=s, k=r["k"], q=SMALL_Q))]  # fmt: skip
            merge = pick("merge", n=n, s=s, q=q)
            lines.append([
                f"{n:,}", f"{stats['vocab']:,}", f"{stats['cpu_s']:.0f} · {stats['rss_mb']:,.0f}",
                f"{s} ({len(builds)} measured)", f"{builds[0]['passages']:,}",
                f"{sum(r['cpu_s'] for r in builds) / len(builds):.1f} · "
                f"{max(r['rss_mb'] for r in builds):,.0f}",
                f"{sum(per_q) / max(1, len(per_q)):.2f} · {max(r['rss_mb'] for r in full):,.0f}",
                f"{merge[0]['cpu_s']:.1f} · {merge[0]['rss_mb']:,.0f}" if merge else "-",
                f"{one[0]['cpu_s']:.0f} · {one[0]['rss_mb']:,.0f}" if one else "-",
                f"{one_q[0]['cpu_s']:.1f} · {one_q[0]['rss_mb']:,.0f}" if one_q else "-",
            ])  # fmt: skip
    header = ["passages N", "terms", "bm25-stats s · MB", "S", "shard passages",
              "shard build s · MB", "shard retrieval ms/question · MB", "merge (Q) s · MB",
              "one index: build s · MB", "retrieve (Q) s · MB"]  # fmt: skip
    return table(header, lines, "rrrlrrrrrr")


def report(rows: list[dict], chosen: int) -> dict:
    """Prints the measured table, the fitted laws with their residuals and the extrapolation."""
    import numpy as np

    def pick(step: str, probe: bool = False, heavy: bool = False, **key) -> list[dict]:
        return [r for r in rows if r["step"] == step and r.get("probe", False) == probe
                and r.get("heavy", False) == heavy
                and all(r.get(k) == v for k, v in key.items())]  # fmt: skip

    print(measured_table(rows, pick))
    laws, out = {}, {}
    stats = pick("stats")
    for y in ("rss_mb", "cpu_s"):
        laws[f"stats {y}"] = fit([[r["corpus"]] for r in stats], [r[y] for r in stats])
    builds = pick("build")
    for y in ("rss_mb", "cpu_s"):
        # CPU: the law of what the shard's passages cost, after WHOLE_FILE_CPU_S x N
        whole = WHOLE_FILE_CPU_S if y == "cpu_s" else 0.0
        laws[f"build {y}"] = fit([[r["passages"]] for r in builds],
                                 [r[y] - whole * r["corpus"] for r in builds])  # fmt: skip
    full_q = max((r["q"] for r in pick("retrieve")), default=0)
    pairs = [(r, pick("retrieve", q=SMALL_Q, n=r["n"], s=r["s"], k=r["k"]))
             for r in pick("retrieve", q=full_q)]  # fmt: skip
    pairs = [(r, small[0]) for r, small in pairs if small]
    per_q = [(r["cpu_s"] - small["cpu_s"]) / (full_q - SMALL_Q) for r, small in pairs]
    laws["retrieve cpu_s a question"] = fit([[r["passages"]] for r, _ in pairs], per_q)
    laws["retrieve cpu_s start"] = fit([[r["passages"]] for r, _ in pairs],
                                       [s["cpu_s"] - SMALL_Q * q for (_, s), q in zip(pairs, per_q, strict=True)])  # fmt: skip
    searches = [r for pair in pairs for r in pair]
    laws["retrieve rss_mb"] = fit([[r["passages"], r["q"]] for r in searches],
                                  [r["rss_mb"] for r in searches])  # fmt: skip
    merges = pick("merge")
    laws["merge rss_mb"] = fit([[r["q"], r["q"] * r["s"]] for r in merges],
                               [r["rss_mb"] for r in merges])  # fmt: skip
    # CPU: per question (DPR's has-answer, the writer) from the merges; per question and shard
    # (folding a shard's lists in) from the arrays alone, whose Q x S reach 320k (the merges'
    # S = 4 vs 8 at 2,000 questions differ by less than their noise)
    laws["merge cpu_s"] = fit([[r["q"]] for r in merges], [r["cpu_s"] for r in merges])
    # The merge's memory past the writer's 1,024-question chunk grows with its arrays alone:
    # the largest measured merge plus the arrays' law (merge_arrays) from there on.
    arrays = pick("merge_arrays")
    for y in ("rss_mb", "cpu_s"):
        laws[f"merge arrays {y}"] = fit([[r["q"], r["q"] * r["s"]] for r in arrays],
                                        [r[y] for r in arrays])  # fmt: skip
    anchor = max(merges, key=lambda r: (r["q"], -r["s"]))
    ones = pick("build_one")
    for y in ("rss_mb", "cpu_s"):
        laws[f"one index build {y}"] = fit([[r["corpus"]] for r in ones], [r[y] for r in ones])
    terms = {"stats": "·N", "build": "·P", "retrieve": "·P", "merge": "·Q,·QS", "one": "·N",
             "retrieve rss_mb": "·P,·Q", "merge cpu_s": "·Q"}  # fmt: skip
    print("\nLaws (N corpus passages, P a job's passages, Q questions, S shards; MB, CPU s):")
    for name, (coef, res) in laws.items():
        print("  " + law(name, coef, res, terms.get(name, terms[name.split()[0]])))
    out["laws"] = {name: {"coef": c, "residuals": r} for name, (c, r) in laws.items()}

    # The vocabulary probe: what a job holds and spends per term beyond the laws' synthetic ~0.2M.
    def predict(name: str, *x: float) -> float:
        coef = laws[name][0]
        return coef[0] + sum(c * v for c, v in zip(coef[1:], x, strict=True))

    per_term = {}
    base_vocab = float(np.mean([r["vocab"] for r in stats]))
    for step, rows_of, x in (("stats", pick("stats", True), "corpus"),
                             ("build", pick("build", True), "passages")):  # fmt: skip
        for y in ("rss_mb", "cpu_s"):
            if rows_of:
                r = rows_of[0]
                whole = WHOLE_FILE_CPU_S * r["corpus"] if (step, y) == ("build", "cpu_s") else 0
                per_term[f"{step} {y}"] = (r[y] - whole - predict(f"{step} {y}", r[x])) / (
                    r["vocab"] - base_vocab
                )
    probe_r = pick("retrieve", True, q=full_q)
    if probe_r:
        r = probe_r[0]
        expected = predict("retrieve cpu_s start", r["passages"]) + full_q * predict(
            "retrieve cpu_s a question", r["passages"]
        )
        per_term["retrieve cpu_s"] = (r["cpu_s"] - expected) / (r["vocab"] - base_vocab)
        per_term["retrieve rss_mb"] = (
            r["rss_mb"] - predict("retrieve rss_mb", r["passages"], r["q"])
        ) / (r["vocab"] - base_vocab)
    heavy = [(r, pick("retrieve", n=r["n"], s=r["s"], k=r["k"], q=r["q"])) for r in
             pick("retrieve", heavy=True)]  # fmt: skip
    per_posting = [(r["cpu_s"] - light[0]["cpu_s"]) / r["q"] / r["postings"] for r, light in heavy
                   if light]  # fmt: skip
    per_term["posting cpu_s"] = float(np.mean(per_posting)) if per_posting else 0.0
    print(
        f"\nCPU s per posting a question touches: {per_term['posting cpu_s']:.3g} (from "
        f"{len(per_posting)} shards: {', '.join(f'{v:.3g}' for v in per_posting)})"
    )
    print(f"\nPer vocabulary term beyond the synthetic {base_vocab:,.0f} (vocabulary probe):")
    for name, value in per_term.items():
        if name == "posting cpu_s":
            continue
        print(f"  {name}: {value * 1e6:.3g} per million terms")
    out["per_term"], out["synthetic_vocab"] = per_term, base_vocab

    def merge_rss(q: float, s: int) -> float:
        b, c = laws["merge arrays rss_mb"][0][1:]
        return anchor["rss_mb"] + b * (q - anchor["q"]) + c * (q * s - anchor["q"] * anchor["s"])

    def merge_cpu(q: float, s: int) -> float:
        return predict("merge cpu_s", q) + laws["merge arrays cpu_s"][0][2] * q * s

    out["extrapolation"] = extrapolate(predict, merge_rss, merge_cpu, per_term, base_vocab, chosen)
    return out


def extrapolate(predict, merge_rss, merge_cpu, per_term: dict, base_vocab: float,
                chosen: int) -> list[dict]:  # fmt: skip
    """Each job at psgs_w100 (N, Lucene's vocabulary) and NQ's / TQA's splits, per S; and the
    resources of the S chosen: peak RSS x 1.3 and CPU x 2 (a slower core, a shared file system)."""
    extra = LUCENE_TERMS - base_vocab
    vocab = {key: per_term.get(key, 0.0) * extra for key in
             ("stats rss_mb", "stats cpu_s", "build rss_mb", "build cpu_s", "retrieve rss_mb",
              "retrieve cpu_s")}  # fmt: skip
    train = max(splits["train"] for splits in SPLITS.values())
    stats_rss = predict("stats rss_mb", NQ_PASSAGES) + vocab["stats rss_mb"]
    stats_cpu = predict("stats cpu_s", NQ_PASSAGES) + vocab["stats cpu_s"]
    found, jobs = [], {}
    for s in sorted({8, 16, 32, 64, chosen}):
        p = NQ_PASSAGES / s
        build_rss = predict("build rss_mb", p) + vocab["build rss_mb"]
        build_cpu = (
            predict("build cpu_s", p) + WHOLE_FILE_CPU_S * NQ_PASSAGES + vocab["build cpu_s"]
        )
        start = predict("retrieve cpu_s start", p) + vocab["retrieve cpu_s"]
        # the synthetic questions' CPU plus their postings at psgs_w100's share (REAL_POSTINGS)
        question = (
            predict("retrieve cpu_s a question", p) + per_term["posting cpu_s"] * REAL_POSTINGS * p
        )
        search_rss = predict("retrieve rss_mb", p, train) + vocab["retrieve rss_mb"]
        row = {"S": s, "stats GB": stats_rss / 1e3, "stats CPU h": stats_cpu / 3600,
               "shard build GB": build_rss / 1e3, "shard build CPU min": build_cpu / 60,
               "indexing CPU h": (stats_cpu + s * build_cpu) / 3600,
               "shard search GB (train)": search_rss / 1e3,
               "ms a question, all shards": s * question * 1e3}  # fmt: skip
        for data, splits in SPLITS.items():
            q = splits["train"]
            job = start + q * question  # one shard's train-split search, one thread
            merge = merge_cpu(q, s)
            row[f"{data} train: search job min"] = job / 60
            row[f"{data} train: merge min · GB"] = (
                merge / 60,
                merge_rss(q, s) / 1e3,
            )
            row[f"{data} train wall min, 16 cores"] = (-(-s // 16) * job + merge) / 60
        found.append(row)
        if s == chosen:
            jobs = {"bm25_stats": (stats_rss, stats_cpu), "build_bm25_shard": (build_rss, build_cpu),
                    "retrieve_bm25_shard": (search_rss, start + train * question),
                    "merge_bm25": (merge_rss(train, s), merge_cpu(train, s))}  # fmt: skip
    keys = list(found[0])

    def text(value: object) -> str:
        return " · ".join(f"{v:.3g}" for v in value) if isinstance(value, tuple) else f"{value:.3g}"

    print(f"\nExtrapolated to psgs_w100 ({NQ_PASSAGES:,} passages, {LUCENE_TERMS:,} terms):")
    print(table(keys, [[text(r[k]) for k in keys] for r in found], "r" * len(keys)))
    print(
        f"one index (build_bm25): {predict('one index build rss_mb', NQ_PASSAGES) / 1e3:.3g} GB, "
        f"{predict('one index build cpu_s', NQ_PASSAGES) / 3600:.3g} CPU h (synthetic vocabulary)"
    )
    print(f"\nresources at S = {chosen} (mem_mb: peak x 1.3; runtime: CPU x 2, one thread):")
    for rule, (rss, cpu) in jobs.items():
        mem_mb = -(-rss * 1.3 // 1000) * 1000
        runtime = -(-cpu * 2 / 60 // 10) * 10
        print(
            f"  {rule}: {{threads: 1, mem_mb: {mem_mb:.0f}, runtime: {runtime:.0f}}}"
            f"  # peak {rss / 1e3:.2f} GB, {cpu / 60:.1f} CPU min"
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="results.jsonl of bm25_scale.py")
    parser.add_argument("--choose", type=int, default=16, help="S whose resources to print")
    args = parser.parse_args()
    report([json.loads(line) for line in args.results.read_text().splitlines()], args.choose)


if __name__ == "__main__":
    main()
