"""The report's tables, assembled from metrics JSON files written by `fid`:
exact_match.csv (each round's reader and the most-common-answer baseline, per split) and
retrieval.csv (full-corpus top-k accuracy of each retriever, per split). Metrics are in percent,
as in the files they come from; the column names say so."""

import json
from pathlib import Path

import pandas as pd

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
inputs, params, output = snakemake.input, snakemake.params, snakemake.output


def load(path):
    return json.loads(Path(path).read_text())


def label(source):
    if source == "bm25":
        return "BM25"
    if source.startswith("iter"):
        return f"distilled, round {source[4:]}"
    return f"{source} (zero-shot)"


rows = []
for (round_, split), path in zip(params.reader, inputs.reader, strict=True):
    m = load(path)
    rows.append({"reader": f"round {round_}", "split": split, "exact match (%)": m["exact_match"],
                 "F1 (%)": m["f1"], "questions": m["n_scored"]})  # fmt: skip
for split, path in zip(params.baseline, inputs.baseline, strict=True):
    m = load(path)
    rows.append({"reader": f"most common answer ({m['answer']})", "split": split,
                 "exact match (%)": m["exact_match"], "F1 (%)": m["f1"],
                 "questions": m["n_scored"]})  # fmt: skip
pd.DataFrame(rows).round(2).to_csv(output.exact_match, index=False)

rows = []
for (source, split), path in zip(params.retrieval, inputs.retrieval, strict=True):
    m = load(path)
    top = {f"top-{k} (%)": value for k, value in m["accuracy"].items()}
    rows.append(dict(retriever=label(source), source=source, split=split, **top,
                     questions=m["n_scored"]))  # fmt: skip
pd.DataFrame(rows).round(2).to_csv(output.retrieval, index=False)
