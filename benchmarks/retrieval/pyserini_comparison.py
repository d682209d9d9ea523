"""fid's BM25 (bm25s with Lucene's analysis) against Pyserini's own (Lucene) on the same passages:
top-20 / top-100 accuracy by DPR's has-answer rule (fid.metrics.has_answer) and the overlap of
the top-k passage ids, on the real held-in sets of samples/ (issue 48.4). A benchmark, not a
test: Pyserini needs a JDK (21+) and pulls torch, transformers and more, so it is no
dependency of fid. Put it in a virtualenv of its own and point --pyserini-python at it:

    python3 -m venv /tmp/pyserini-venv && /tmp/pyserini-venv/bin/pip install pyserini
    JAVA_HOME=/usr/lib/jvm/temurin-25-jdk-amd64 \\
        .venv/bin/python benchmarks/retrieval/pyserini_comparison.py --pyserini-python /tmp/pyserini-venv/bin/python

This process (fid's environment) builds fid's index (build_bm25, rank_bm25) and scores both
rankings; a child process in Pyserini's environment (this file with --worker) indexes the same
documents, `title + " " + text` as fid indexes them, as a JsonCollection with
`python -m pyserini.index.lucene` (one thread, DefaultLuceneDocumentGenerator: Lucene's
StandardAnalyzer-based English analysis with Porter stems, as Pyserini's wikipedia-dpr index)
and searches each question with LuceneSearcher at k1/b = 0.9/0.4 (Pyserini's defaults, the
project's too) and at 1.2/0.75 (Lucene's own defaults, as a sensitivity check).

pyserini 1.6 builds an OpenAI client when it is imported, which refuses to be built without an
API key; the child is given OPENAI_API_KEY=unused (nothing calls OpenAI).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETS = {  # name: (passages, questions), the real sets of samples/
    "squad-open-tiny": ("squad-open-tiny/psgs_w100.tsv", "squad-open-tiny/questions.jsonl"),
    "dpr-nq-test-300": ("dpr/psgs_w100.subset.tsv", "dpr/nq-test.qas.head300.tsv"),
    "dpr-trivia-test-300": ("dpr/psgs_w100.subset.tsv", "dpr/trivia-test.qas.head300.tsv"),
}
SETTINGS = ((0.9, 0.4), (1.2, 0.75))  # (k1, b)
KS = (20, 100)


def worker(job: Path) -> None:
    """In Pyserini's environment: index job["docs"] and rank job["questions"] per setting."""
    spec = json.loads(job.read_text())
    work = Path(spec["work"])
    collection = work / "collection"
    collection.mkdir()
    with open(collection / "docs.jsonl", "w") as out:
        for doc in spec["docs"]:
            out.write(json.dumps({"id": doc["id"], "contents": doc["contents"]}) + "\n")
    subprocess.run([sys.executable, "-m", "pyserini.index.lucene", "--collection", "JsonCollection",
                    "--input", str(collection), "--index", str(work / "index"), "--generator",
                    "DefaultLuceneDocumentGenerator", "--threads", "1"],
                   check=True, capture_output=True)  # fmt: skip
    from pyserini.analysis import Analyzer, get_lucene_analyzer
    from pyserini.search.lucene import LuceneSearcher

    analyzer = Analyzer(get_lucene_analyzer())  # English, Porter, Lucene's stopwords: the index's
    terms = {"docs": [analyzer.analyze(d["contents"]) for d in spec["docs"]],
             "questions": [analyzer.analyze(q) for q in spec["questions"]]}  # fmt: skip
    (work / "terms.json").write_text(json.dumps(terms))
    searcher = LuceneSearcher(str(work / "index"))
    ranked = {}
    for k1, b in spec["settings"]:
        searcher.set_bm25(k1, b)
        ranked[f"{k1}/{b}"] = [[[hit.docid, hit.score] for hit in searcher.search(q, k=spec["k"])]
                               for q in spec["questions"]]  # fmt: skip
    (work / "ranked.json").write_text(json.dumps(ranked))


def pyserini_rankings(python: str, docs: list[dict], questions: list[str],
                      k: int) -> tuple[dict, dict]:  # fmt: skip
    """Pyserini's top k per setting, {"k1/b": [[(passage id, score), ...] per question]}, and
    its analysis of every document and question, {"docs": [[term, ...], ...], "questions": ...}."""
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"work": tmp, "docs": docs, "questions": questions, "k": k,
                                   "settings": SETTINGS}))  # fmt: skip
        env = {**os.environ, "OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY", "unused")}
        done = subprocess.run([python, __file__, "--worker", str(job)], env=env,
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode:
            raise RuntimeError(f"the Pyserini worker failed:\n{done.stderr[-3000:]}")
        ranked = json.loads((Path(tmp) / "ranked.json").read_text())
        return ranked, json.loads((Path(tmp) / "terms.json").read_text())


def compare(name: str, passages_path: Path, questions_path: Path, python: str) -> list[list]:
    """Rows of the table for one set: fid, then Pyserini per setting."""
    from fid.config import BM25Config
    from fid.data.passages import iter_passages
    from fid.data.questions import load_questions
    from fid.metrics.has_answer import has_answer
    from fid.metrics.retrieval import topk_accuracy
    from fid.retrieval.bm25 import _tokenizer, build_bm25, rank_bm25

    passages = {p.id: p for p in iter_passages(passages_path)}
    questions = load_questions(questions_path)
    k = min(max(KS), len(passages))
    cfg = BM25Config(top_k=k)
    with tempfile.TemporaryDirectory() as tmp:
        build_bm25(passages_path, Path(tmp) / "index", cfg)
        records = rank_bm25(Path(tmp) / "index", passages_path, questions, cfg)
    ours = [[str(c["id"]) for c in r["ctxs"]] for r in records]
    docs = [{"id": p.id, "contents": f"{p.title} {p.text}"} for p in passages.values()]
    theirs, terms = pyserini_rankings(python, docs, [q["question"] for q in questions], k)
    # Where the two analyses differ: fid's terms (bm25s's tokenizer as fid configures it; its
    # empty token dropped) against Lucene's, as multisets, per document and per question.
    analysis = {"token_pattern": cfg.token_pattern, "stopwords": cfg.stopwords,
                "stemmer": cfg.stemmer}  # fmt: skip
    ours_terms = {
        part: _tokenizer(analysis).tokenize(texts, return_as="string", show_progress=False)
        for part, texts in (("docs", [d["contents"] for d in docs]),
                            ("questions", [q["question"] for q in questions]))
    }  # fmt: skip
    differ = {part: sum(Counter(t for t in a if t) != Counter(b) for a, b in
                        zip(ours_terms[part], terms[part], strict=True)) / len(terms[part])
              for part in ("docs", "questions")}  # fmt: skip

    def accuracy(ranked: list[list[str]]) -> list[str]:
        hits = [[has_answer(q["answers"], passages[pid].text) for pid in ids]
                for q, ids in zip(questions, ranked, strict=True)]  # fmt: skip
        return [f"{topk_accuracy(hits, KS)[c]:.1f}" for c in KS]

    def overlap(ranked: list[list[str]], c: int) -> str:
        shared = [len(set(a[:c]) & set(b[:c])) / max(1, min(c, len(a), len(b)))
                  for a, b in zip(ours, ranked, strict=True)]  # fmt: skip
        return f"{100 * sum(shared) / len(shared):.1f}"

    first = sum(a[:1] == b[:1] for a, b in zip(ours, [[d for d, _ in r] for r in
                                                      theirs["0.9/0.4"]], strict=True))  # fmt: skip
    rows = [[name, len(passages), len(questions), "fid (bm25s, lucene, 0.9/0.4)", *accuracy(ours),
             "", "", "", f"{100 * differ['docs']:.0f} / {100 * differ['questions']:.0f}"]]  # fmt: skip
    for setting, ranked in theirs.items():
        ids = [[d for d, _ in r] for r in ranked]
        same_top1 = f"{100 * first / len(questions):.1f}" if setting == "0.9/0.4" else ""
        rows.append([name, len(passages), len(questions), f"Pyserini {setting}", *accuracy(ids),
                     overlap(ids, 20), overlap(ids, 100), same_top1, ""])  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pyserini-python", default=sys.executable,
                        help="a Python that imports pyserini (default: this one)")  # fmt: skip
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="write the run's record here")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    sys.path.insert(0, str(ROOT))
    from benchmarks.harness import record, table, write_record

    rows = []
    for name, (passages, questions) in SETS.items():
        rows += compare(name, ROOT / "samples" / passages, ROOT / "samples" / questions,
                        args.pyserini_python)  # fmt: skip
    columns = ["set", "passages", "questions", "BM25", "top-20", "top-100",
               "top-20 ids shared %", "top-100 ids shared %", "same top-1 %",
               "analysis differs: passages / questions %"]  # fmt: skip
    print(table(columns, rows, "lrrlrrrrrr"))
    if args.json:
        write_record(args.json, record(__file__, rows))


if __name__ == "__main__":
    main()
