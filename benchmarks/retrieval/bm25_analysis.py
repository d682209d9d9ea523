"""BM25 top-k accuracy by text analysis, on a real open-domain set (samples/squad-open-tiny:
200 SQuAD questions over their 167 Wikipedia passages).

    python benchmarks/retrieval/bm25_analysis.py [--passages P.tsv --questions Q.jsonl]

Rows: fid 0.1's default analysis (bm25s's token pattern `\\w\\w+`, which drops 1-character
tokens, its "en" stopwords, no stemmer), Snowball stemming, and today's default, as Anserini's
and Pyserini's BM25 (DPR's and FiD's BM25 baselines): Lucene's tokens (`\\w+`), its 33
English stopwords, Porter stems. k1 0.9, b 0.4, bm25s's `lucene` scoring throughout.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `benchmarks.harness` however this file is run

from benchmarks.harness import record, table_header, table_row, write_record  # noqa: E402

SQUAD = ROOT / "samples" / "squad-open-tiny"
ANALYSES = {
    "fid 0.1 (\\w\\w+, bm25s en stopwords, no stemmer)": dict(
        token_pattern=r"(?u)\b\w\w+\b", stopwords="en", stemmer=None
    ),
    "\\w\\w+, en stopwords, Snowball": dict(
        token_pattern=r"(?u)\b\w\w+\b", stopwords="en", stemmer="english"
    ),
    "\\w+, Lucene stopwords, no stemmer": dict(stemmer=None),
    "default: \\w+, Lucene stopwords, Porter (Pyserini)": dict(),
}
KS = (1, 5, 10, 20)


def main() -> None:
    from fid.config import BM25Config
    from fid.data.questions import load_questions
    from fid.metrics.retrieval import retrieval_accuracy
    from fid.retrieval.bm25 import build_bm25, rank_bm25

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=Path, default=SQUAD / "psgs_w100.tsv")
    parser.add_argument("--questions", type=Path, default=SQUAD / "questions.jsonl")
    parser.add_argument("--json", type=Path, help="also write the run's record here")
    args = parser.parse_args()
    questions = load_questions(args.questions)
    print(f"{len(questions)} questions, {args.passages}\n")
    print(table_header(["analysis", *(f"top-{k}" for k in KS)]))
    rows = []
    for name, knobs in ANALYSES.items():
        cfg = BM25Config(top_k=max(KS), **knobs)
        with tempfile.TemporaryDirectory() as tmp:
            build_bm25(args.passages, Path(tmp) / "index", cfg)
            records = rank_bm25(Path(tmp) / "index", args.passages, questions, cfg)
        accuracy = retrieval_accuracy(
            [q["answers"] for q in questions], [r["ctxs"] for r in records], KS
        )["accuracy"]
        rows.append({"analysis": name, "accuracy": {k: accuracy[str(k)] for k in KS}})
        print(table_row([name, *(f"{accuracy[str(k)]:.1f}" for k in KS)]))
    if args.json:
        write_record(args.json, record(__file__, rows))


if __name__ == "__main__":
    main()
