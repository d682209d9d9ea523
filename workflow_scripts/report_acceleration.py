"""The report's speed / exact-match table and Pareto plot of accelerated evaluation: every
eval_reader_accelerations entry against the plain reader, per round and split, from the
predictions and metrics files that `fid eval-reader` wrote."""

import json
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from report_page import write_page

from fid.evaluation.bootstrap import paired_bootstrap_interval

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
inputs, params, output = snakemake.input, snakemake.params, snakemake.output


def exact_matches(path):
    """{question id: exact match 0/100} of the labeled questions of a predictions file."""
    lines = Path(path).read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return {r["id"]: r["exact_match"] for r in records if "exact_match" in r}


def speed(path):
    generation = json.loads(Path(path).read_text()).get("generation") or {}
    return generation.get("questions_per_second"), generation.get("cpu_seconds_per_question")


plain = {}
for (round_, split), predictions, metrics in zip(
    params.plain, inputs.plain, inputs.plain_metrics, strict=True
):
    plain[round_, split] = exact_matches(predictions), *speed(metrics)

rows = []
for key, (em, qps, cpu) in plain.items():
    rows.append({"reader": f"round {key[0]}", "split": key[1], "setting": "plain",
                 "exact match (%)": np.mean(list(em.values())) if em else None,
                 "EM difference": 0.0, "CI low": 0.0, "CI high": 0.0,
                 "questions/s": qps, "speed-up": 1.0, "CPU s/question": cpu})  # fmt: skip
for (round_, split, name), predictions, metrics in zip(
    params.fast, inputs.fast, inputs.fast_metrics, strict=True
):
    base, base_qps, _ = plain[round_, split]
    em = exact_matches(predictions)
    ids = sorted(base)
    if sorted(em) != ids:
        raise ValueError(f"{predictions}: not the questions of the plain evaluation")
    ours, theirs = np.array([em[i] for i in ids]), np.array([base[i] for i in ids])
    low, high = paired_bootstrap_interval(ours, theirs)
    qps, cpu = speed(metrics)
    rows.append({"reader": f"round {round_}", "split": split, "setting": name,
                 "exact match (%)": ours.mean() if len(ids) else None,
                 "EM difference": (ours - theirs).mean() if len(ids) else None,
                 "CI low": low, "CI high": high, "questions/s": qps,
                 "speed-up": qps / base_qps if qps and base_qps else None,
                 "CPU s/question": cpu})  # fmt: skip
table = pd.DataFrame(rows)
table.to_csv(output.table, index=False, float_format="%.4g")
write_page(output.page, "Faster answers: speed against exact match", [
    "Each round's reader on each split, with and without each acceleration of "
    "eval_reader_accelerations, on the same lists. Exact match in percent; 'EM difference': "
    "accelerated minus plain, with its paired bootstrap 95% interval (CI low, CI high); "
    "questions/s: the first rank's generation, wall clock, encoder included.",
], table, output.table)  # fmt: skip

splits = list(dict.fromkeys(table["split"]))
fig, axes = plt.subplots(1, len(splits), figsize=(5 * len(splits), 3.8), squeeze=False)
for ax, split in zip(axes[0], splits, strict=True):
    for reader, group in table[table["split"] == split].groupby("reader", sort=True):
        ax.scatter(group["speed-up"], group["exact match (%)"], label=reader)
        for _, row in group.iterrows():
            ax.annotate(row["setting"], (row["speed-up"], row["exact match (%)"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")  # fmt: skip
    ax.set(xlabel="speed-up over the plain reader (questions/s)", ylabel="exact match (%)",
           title=split)  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(output.plot, dpi=120)
