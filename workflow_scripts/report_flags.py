"""The report's warnings: every round whose reader or retriever is worse than the one before it
(round 0's reader: than the most-common-answer baseline; round 0's retriever: than the first
retrieval it was distilled on), per split, from the report's tables. No rows: nothing worse.
The HTML page says so in words, with the number of comparisons made."""

import pandas as pd
from report_page import write_page

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
inputs, params, output = snakemake.input, snakemake.params, snakemake.output
em, topk = pd.read_csv(inputs.exact_match), pd.read_csv(inputs.retrieval)
rows = []
compared = []


def compare(what, before, split, metric, value, previous):
    compared.append(what)
    # a reader no better than always giving the most common answer learned nothing
    if value < previous or (before == "the most common answer" and value <= previous):
        rows.append({"model": what, "split": split, "metric": metric, "value": value,
                     "compared with": before, "its value": previous,
                     "flag": f"worse than {before}"})  # fmt: skip


for split in sorted(set(em["split"])):
    here = em[em["split"] == split]
    baseline = here[here["reader"].str.startswith("most common answer")]
    previous = ("the most common answer", baseline["exact match (%)"].max())
    for i in range(params.rounds):
        value = here[here["reader"] == f"round {i}"]["exact match (%)"].iloc[0]
        compare(f"reader, round {i}", previous[0], split, "exact match (%)", value, previous[1])
        previous = (f"the round {i} reader", value)
    before = params.first
    for i in range(params.rounds):
        for column in [c for c in topk.columns if c.startswith("top-")]:
            now = topk[(topk["source"] == f"iter{i}") & (topk["split"] == split)][column]
            old = topk[(topk["source"] == before) & (topk["split"] == split)][column]
            if len(now) and len(old):
                compare(f"retriever, round {i}", before, split, column, now.iloc[0], old.iloc[0])
        before = f"iter{i}"
flags = pd.DataFrame(rows, columns=["model", "split", "metric", "value", "compared with",
                                   "its value", "flag"])  # fmt: skip
flags.to_csv(output.table, index=False)
write_page(output.page, "Warnings: rounds worse than the one before", [
    f"{len(compared)} comparisons: each round's reader (exact match, %) and retriever (every "
    "top-k, %) against the one before it on each split (round 0's reader against the most "
    "common answer, round 0's retriever against the first retrieval).",
], flags, output.table, empty="No warnings: every round is at least as good as the one before.")  # fmt: skip
