"""Memory and CPU of sharded BM25 (issue 48.3) on synthetic psgs_w100-shaped corpora, fitted and
extrapolated to DPR's 21,015,324 passages and the NQ / TriviaQA question splits.

    python benchmarks/retrieval/bm25_scale.py                                   # 250k .. 2M, S = 4 and 8
    python benchmarks/retrieval/bm25_scale.py --sizes 250000 500000 --shards 4  # a quick look
    python benchmarks/retrieval/bm25_scale.py --no-run --json bm25_scale.json   # refit what was measured

Every job runs as the workflow runs it, a `fid` command in its own process (one CPU thread),
measured with os.wait4 on that child: its wall time, user + system CPU and peak RSS (ru_maxrss
of that process alone; this process stays small, so a fork shares nothing big). Per corpus size
N (`fid make-scale-data`: 100-word passages, Zipf words, DPR's quoting; not measured):

- `bm25-stats` over the whole file;
- for each shard count S, every shard's `build-bm25 --shard K/S --stats`, its
  `retrieve-bm25-shard` of Q synthetic questions (default 2,000) and of the first 20 of them (the
  difference gives the CPU a question costs, the 20 a job's start), and `merge-bm25-lists` of
  both (compact lists through a passage store, as nq.yaml's list_format);
- one index (`build-bm25`, `retrieve-bm25`) for N <= --unsharded-max, to compare.

The synthetic vocabulary is bounded (~0.2M stems), psgs_w100's is not: Pyserini's index of it
(Lucene's analysis, as ours: Porter stems, its stopwords) holds 5,345,463 terms and 1.51e9
tokens (pyserini.prebuilt_index_info, "wikipedia-dpr-100w"). What a job holds per term (the
vocabulary dict, df, idf, the CSC pointers) is measured by a vocabulary probe: the 250k corpus
plus passages of made-up words (no vowel, no s or y: stems of themselves) that lift its
vocabulary to that size, through the stats pass, a shard build and a shard retrieval.

The synthetic questions' words are rare (their terms' df / N sum to ~3e-5): shard 1 also
answers "heavy" questions of frequent terms, whose excess CPU gives what a posting costs. The
merge's arrays at 10-20k questions (past the list writer's 1,024-question chunk) are measured
alone (--merge-arrays Q S children). --sample-from N: from that size on, shards 1 and S only and
no merge (a loaded machine's time). benchmarks/retrieval/bm25_scale_laws.py fits and extrapolates (called
at the end). Jobs run `python -m fid`, the fid that PYTHONPATH finds first (a `git archive`
snapshot keeps others' edits out of a long run). Each job's result is appended to
WORKDIR/results.jsonl as it ends, so a rerun measures only what is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import record, write_record  # noqa: E402
from benchmarks.retrieval.bm25_scale_laws import LUCENE_TERMS, NQ_PASSAGES, SMALL_Q, report  # noqa: E402

FID = [sys.executable, "-m", "fid"]  # the fid on PYTHONPATH (module docstring)
CONSONANTS = "bcdfghjklmnpqrtvwxz"  # no vowel, s or y: Porter leaves such a word as it is
PROBE_BASE = 250_000
ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}


def measure(cmd: list[str], log: Path) -> dict:
    """Runs one job; its wall seconds, CPU seconds (user + system) and peak RSS (MB)."""
    started = time.perf_counter()
    with open(log, "w") as out:
        child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                 env={**os.environ, **ONE_THREAD})  # fmt: skip
        _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        tail = log.read_text()[-2000:]
        raise RuntimeError(f"{' '.join(cmd)} exited {child.returncode}:\n{tail}")
    return {"wall_s": time.perf_counter() - started, "cpu_s": usage.ru_utime + usage.ru_stime,
            "rss_mb": usage.ru_maxrss / 1024}  # fmt: skip


class Results:
    """results.jsonl: one line a measured job, keyed so a rerun skips it."""

    def __init__(self, path: Path):
        self.path = path
        self.rows = (
            [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        )

    def get(self, **key) -> dict | None:
        return next((r for r in self.rows if all(r.get(k) == v for k, v in key.items())), None)

    def save(self) -> None:
        """Rewrites the file (a row was completed after its job: the shard's passages)."""
        self.path.write_text("".join(json.dumps(r) + "\n" for r in self.rows))

    def run(self, cmd: list[str], log: Path, extra: dict | None = None, **key) -> dict:
        found = self.get(**key)
        if found is None:
            found = {**key, **measure(cmd, log), **(extra or {})}
            self.rows.append(found)
            with open(self.path, "a") as out:
                out.write(json.dumps(found) + "\n")
            print(f"  {key} {found['cpu_s']:.1f} CPU s, {found['rss_mb']:.0f} MB", flush=True)
        return found


def _meta(folder: Path) -> dict:
    return json.loads((folder / "meta.json").read_text())


def make_corpus(folder: Path, n: int, questions: int) -> None:
    """A synthetic corpus of n passages, `questions` train questions, and its passage store."""
    if (folder / "store").exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "scale.yaml").write_text(json.dumps(
        {"scale": min(1.0, n / NQ_PASSAGES), "n_passages": n, "n_train": questions, "n_dev": 0,
         "n_test": 0}))  # fmt: skip
    subprocess.run([*FID, "make-scale-data", "--config", str(folder / "scale.yaml"),
                    "--output", str(folder / "data")], check=True, capture_output=True)  # fmt: skip
    lines = (folder / "data" / "train.jsonl").read_text().splitlines()
    (folder / f"q{SMALL_Q}.jsonl").write_text("\n".join(lines[:SMALL_Q]) + "\n")
    subprocess.run([*FID, "build-passage-store", "--passages", str(folder / "data/psgs_w100.tsv"),
                    "--output", str(folder / "store")], check=True, capture_output=True)  # fmt: skip


def made_up_words(count: int, first: int) -> list[str]:
    """`count` distinct words of consonants (base 19 of first, first + 1, ...), prefixed "qz"."""
    words = []
    for number in range(first, first + count):
        digits = ""
        while True:
            number, digit = divmod(number, len(CONSONANTS))
            digits += CONSONANTS[digit]
            if not number:
                break
        words.append("qz" + digits)
    return words


def make_probe(base: Path, folder: Path, terms: int) -> None:
    """The base corpus plus passages of 100 made-up words each, `terms` words in all."""
    if (folder / "data" / "psgs_w100.tsv").exists():
        return
    (folder / "data").mkdir(parents=True, exist_ok=True)
    shutil.copy(base / "data" / "train.jsonl", folder / "data" / "train.jsonl")
    shutil.copy(base / f"q{SMALL_Q}.jsonl", folder / f"q{SMALL_Q}.jsonl")
    tmp = folder / "data" / "psgs_w100.tsv.tmp"
    shutil.copy(base / "data" / "psgs_w100.tsv", tmp)
    with open(tmp, "a") as out:
        for row in range(terms // 100):
            words = made_up_words(100, row * 100)
            out.write(f'{10_000_000 + row}\t"{" ".join(words)}"\tVocabulary probe {row}\n')
    tmp.rename(folder / "data" / "psgs_w100.tsv")


def heavy_questions(stats: Path, questions: Path, output: Path) -> float:
    """The synthetic questions touch almost no postings (their words are rare by design: the
    sum of their terms' df / N is ~3e-5), real ones do: over samples/dpr's 751 psgs_w100 rows
    NQ's test questions sum to 0.084, TriviaQA's to 0.056. Questions of 6 terms drawn from the
    corpus's with df / N in [0.05, 0.3] (their sum ~0.9: enough postings to stand out of the
    scan of every passage's score) measure what a posting costs.
    Returns the mean sum of df / N of the questions written."""
    import numpy as np

    frequency = np.load(stats / "doc_freqs.npy") / _meta(stats)["n_passages"]
    terms = json.loads((stats / "vocabulary.json").read_text())
    pool = np.flatnonzero((frequency >= 0.05) & (frequency <= 0.3))
    rng = np.random.default_rng(0)
    lines, sums = [], []
    for line in questions.read_text().splitlines():
        picked = rng.choice(pool, size=6, replace=False)
        lines.append(
            json.dumps({**json.loads(line), "question": " ".join(terms[t] for t in picked)})
        )
        sums.append(float(frequency[picked].sum()))
    if not output.exists():
        output.write_text("\n".join(lines) + "\n")
    return float(np.mean(sums))


def measure_size(results: Results, folder: Path, n: int, shard_counts: list[int],
                 unsharded: bool, probe: bool = False, sample: bool = False) -> None:  # fmt: skip
    """Every job of a corpus: stats, each S's shards (build, retrievals, merges), one index.
    `sample`: shards 1 and S only, no merge (shards are equal slices: a loaded machine's time)."""
    tsv, cfg = folder / "data" / "psgs_w100.tsv", folder / "bm25.yaml"
    cfg.write_text(json.dumps({"top_k": 100, "list_format": "compact"}))
    questions = {"full": folder / "data" / "train.jsonl", "small": folder / f"q{SMALL_Q}.jsonl"}
    n_questions = {name: len(path.read_text().splitlines()) for name, path in questions.items()}
    logs = folder / "logs"
    logs.mkdir(exist_ok=True)
    base = ["--config", str(cfg), "--passages", str(tsv)]
    stats = folder / "stats"
    if not stats.exists() or results.get(n=n, step="stats", probe=probe) is None:
        shutil.rmtree(stats, ignore_errors=True)
    results.run([*FID, "bm25-stats", *base, "--output", str(stats)], logs / "stats.log", None,
                n=n, step="stats", probe=probe)  # fmt: skip
    vocab_size, corpus = _meta(stats)["vocab_size"], _meta(stats)["n_passages"]
    if not probe:
        questions["heavy"] = folder / "heavy.jsonl"
        postings = heavy_questions(stats, questions["full"], questions["heavy"])
        n_questions["heavy"] = n_questions["full"]
    for s in shard_counts:
        for k in (1, s) if sample else range(1, s + 1):
            index = folder / f"S{s}" / f"{k}"
            key = dict(n=n, s=s, k=k, probe=probe)
            if results.get(step="retrieve", q=n_questions["full"], **key) and (
                    probe or results.get(step="retrieve", q=SMALL_Q, **key)) and (
                    probe or k != 1 or results.get(step="retrieve", heavy=True, **key)):  # fmt: skip
                continue
            shutil.rmtree(index, ignore_errors=True)
            results.rows = [r for r in results.rows if not (r.get("step") == "build" and
                                                            all(r.get(a) == b for a, b in key.items()))]  # fmt: skip
            built = results.run([*FID, "build-bm25", *base, "--shard", f"{k}/{s}", "--stats",
                                 str(stats), "--output", str(index / "index")],
                                logs / f"build_{s}_{k}.log", None, step="build", **key)  # fmt: skip
            built["passages"] = _meta(index / "index")["n_passages"]
            built["vocab"] = vocab_size
            results.save()
            for name, path in questions.items():
                if (probe and name == "small") or (name == "heavy" and k != 1):
                    continue
                heavy = {"heavy": True} if name == "heavy" else {}
                extra = {"passages": built["passages"], "vocab": vocab_size}
                extra.update({"postings": postings * built["passages"]} if heavy else {})
                results.run([*FID, "retrieve-bm25-shard", "--config", str(cfg), "--index",
                             str(index / "index"), "--questions", str(path), "--output",
                             str(index / f"{name}.npz")], logs / f"retrieve_{s}_{k}_{name}.log",
                            extra, step="retrieve", q=n_questions[name], **heavy, **key)  # fmt: skip
            shutil.rmtree(index / "index")  # disk: only the lists are kept
            if probe:
                break  # the probe measures one shard: a job's vocabulary part
        for name, path in questions.items():
            if probe or sample or name == "heavy":
                continue
            lists = [str(folder / f"S{s}" / f"{k}" / f"{name}.npz") for k in range(1, s + 1)]
            results.run([*FID, "merge-bm25-lists", "--config", str(cfg), "--stats", str(stats),
                         "--shard-lists", *lists, "--passages", str(folder / "store"),
                         "--questions", str(path), "--output", str(folder / f"S{s}_{name}.json")],
                        logs / f"merge_{s}_{name}.log", None, n=n, s=s, step="merge",
                        q=n_questions[name], probe=probe)  # fmt: skip
    if unsharded:
        index = folder / "index"
        if results.get(n=n, step="retrieve_one", probe=probe) is None:
            shutil.rmtree(index, ignore_errors=True)
            results.rows = [r for r in results.rows if not (r.get("n") == n and
                                                            r.get("step") == "build_one")]  # fmt: skip
            results.run([*FID, "build-bm25", *base, "--output", str(index)], logs / "one.log",
                        None, n=n, step="build_one", probe=probe)  # fmt: skip
            results.run([*FID, "retrieve-bm25", "--config", str(cfg), "--index", str(index),
                         "--passages", str(folder / "store"), "--questions",
                         str(questions["full"]), "--output", str(folder / "one.json")],
                        logs / "one_retrieve.log", None, n=n, step="retrieve_one",
                        q=n_questions["full"], probe=probe)  # fmt: skip
            shutil.rmtree(index)
    for row in results.rows:  # every row of this corpus knows its vocabulary
        if row.get("n") == n and row.get("probe") == probe:
            row.setdefault("vocab", vocab_size)
            row.setdefault("corpus", corpus)
    results.save()


def merge_arrays(q: int, s: int, k: int = 100) -> None:
    """(A child's work, --merge-arrays Q S.) What merge-bm25-lists holds beyond the list writer's
    chunk of 1,024 questions, at a question count no shard search here reaches: S shards' (Q, k)
    arrays as read_shard_lists returns them (one at a time), merge_top_k, and the lists the writer
    is given."""
    import numpy as np

    from fid.retrieval.bm25_merge import ShardLists, merge_top_k
    from fid.runtime.heap import return_freed_memory

    return_freed_memory()  # as every fid command starts (fid.cli): freed arrays go back

    rng = np.random.default_rng(0)

    def shards():  # read one at a time, as merge-bm25-lists reads them
        for i in range(s):
            rows = np.sort(rng.integers(i * 10**6, (i + 1) * 10**6, size=(q, k)), axis=1)
            yield ShardLists(Path(str(i)), {}, np.arange(q).astype("<U8"), rows,
                             rng.random((q, k), dtype=np.float32), rows.astype("<U8"))  # fmt: skip

    rows, scores, ids = merge_top_k(shards(), k)
    held = ids.tolist(), scores.tolist()
    assert len(held[0]) == q


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+",
                        default=[250_000, 500_000, 1_000_000, 2_000_000])  # fmt: skip
    parser.add_argument("--shards", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--questions", type=int, default=2000)
    parser.add_argument("--unsharded-max", type=int, default=1_000_000)
    parser.add_argument("--sample-from", type=int, default=10**9,
                        help="from this size on, measure shards 1 and S only, and no merge")  # fmt: skip
    parser.add_argument("--choose", type=int, default=16, help="S whose resources to print")
    parser.add_argument("--no-probe", action="store_true", help="skip the vocabulary probe")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fid_bm25_scale"))
    parser.add_argument("--no-run", action="store_true", help="fit what results.jsonl holds")
    parser.add_argument("--json", type=Path, help="write the run's record here")
    parser.add_argument("--merge-arrays", type=int, nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.merge_arrays:
        return merge_arrays(*args.merge_arrays)
    args.workdir.mkdir(parents=True, exist_ok=True)
    results = Results(args.workdir / "results.jsonl")
    if not args.no_run:
        for n in sorted(args.sizes):
            print(f"N = {n:,}", flush=True)
            folder = args.workdir / f"n{n}"
            make_corpus(folder, n, args.questions)
            measure_size(results, folder, n, args.shards, n <= args.unsharded_max,
                         sample=n >= args.sample_from)  # fmt: skip
        for q, s in ((10_000, 8), (10_000, 16), (20_000, 16)):  # the merge's arrays alone
            results.run([sys.executable, __file__, "--merge-arrays", str(q), str(s)],
                        args.workdir / f"merge_arrays_{q}_{s}.log", None, step="merge_arrays",
                        q=q, s=s)  # fmt: skip
        if not args.no_probe:
            print(f"vocabulary probe: {PROBE_BASE:,} passages + {LUCENE_TERMS:,} terms", flush=True)
            base = args.workdir / f"n{PROBE_BASE}"
            make_corpus(base, PROBE_BASE, args.questions)
            make_probe(base, args.workdir / "probe", LUCENE_TERMS)
            measure_size(results, args.workdir / "probe", PROBE_BASE, [8], False, probe=True)
    fitted = report(results.rows, args.choose)
    if args.json:
        write_record(args.json, record(__file__, {"rows": results.rows, **fitted}))


if __name__ == "__main__":
    main()
