"""The report's tables, assembled from metrics JSON files written by `fid`: exact_match.csv
(each round's reader and the most-common-answer baseline, per split) and retrieval.csv
(full-corpus top-k accuracy of each retriever, per split), each also as an HTML page that the
report shows inline. Metrics are in percent, as in the files they come from. The headline, on
top of the exact match page and in system.json: the exact match of the system the run built
(fid.evaluation.run_system, the one `fid ask --run` answers with)."""

import json
from pathlib import Path

import pandas as pd
from report_page import write_page

from fid.evaluation.run_system import run_system

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


# The share of questions whose passages read hold an answer: the reader's ceiling, and the
# number behind the gap to the training curves' dev exact match (whose lists hold the gold
# passage). Retrieval's top-k at k = n_passages, where eval_retrieval measured that k.
recall = {
    (source, split): load(path)["accuracy"].get(str(params.n_passages))
    for (source, split), path in zip(params.retrieval, inputs.retrieval, strict=True)
}
rows = []
for (round_, split), path in zip(params.reader, inputs.reader, strict=True):
    m = load(path)
    rows.append({"reader": f"round {round_}", "split": split, "exact match (%)": m["exact_match"],
                 "F1 (%)": m["f1"], "questions": m["n_scored"],
                 "reads": f"top {params.n_passages} of {label(params.lists[round_])}",
                 "answer in what it reads (%)": recall.get((params.lists[round_], split))})  # fmt: skip
for split, path in zip(params.baseline, inputs.baseline, strict=True):
    m = load(path)
    rows.append({"reader": f"most common answer ({m['answer']})", "split": split,
                 "exact match (%)": m["exact_match"], "F1 (%)": m["f1"],
                 "questions": m["n_scored"], "reads": "nothing"})  # fmt: skip
em = pd.DataFrame(rows).round(2)
em.to_csv(output.exact_match, index=False)

system = run_system(Path(output.system).parents[1], first_retrieval=params.first)
scored = {Path(path): load(path) for path in inputs.reader}
headline = system.headline({split: scored[system.metrics(split)] for split in params.baseline})
Path(output.system).write_text(json.dumps(headline, indent=2) + "\n")
write_page(output.exact_match_page, "Reader exact match (%)", [
    headline["headline"],
    "Exact match and F1 in percent (SQuAD normalisation, best over the gold answers) of the "
    "questions of each split that have gold answers ('questions'). 'reads': the passages each "
    "reader answers from here: the top of the lists retrieved for the whole split, not the "
    "lists it was trained and validated on (the training curves' dev exact match, whose lists "
    "hold the gold passage). 'answer in what it reads': the share of questions whose passages "
    "read hold a gold answer (retrieval top-k at k = n_passages, where measured): no reader "
    "answers more than that from retrieval alone.",
], em, output.exact_match)  # fmt: skip

rows = []
for (source, split), path in zip(params.retrieval, inputs.retrieval, strict=True):
    m = load(path)
    top = {f"top-{k} (%)": value for k, value in m["accuracy"].items()}
    rows.append(dict(retriever=label(source), source=source, split=split, **top,
                     questions=m["n_scored"]))  # fmt: skip
top = pd.DataFrame(rows).round(2)
top.to_csv(output.retrieval, index=False)
write_page(output.retrieval_page, "Retrieval top-k accuracy (%)", [
    "Percent of a split's questions ('questions') with a passage holding a gold answer (DPR's "
    "string match) among the top k retrieved from the whole corpus.",
], top, output.retrieval)  # fmt: skip
