"""The report's speed / exact-match table and Pareto plot of accelerated evaluation: every
eval_reader_accelerations entry against the plain reader, per round and split, from the
predictions and metrics files that `fid eval-reader` wrote."""

import json
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from report_page import write_figure_page, write_page

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


# A wall-clock figure of a job that got less than this share of its threads' time measures the
# machine's load more than the reader (the demo's round 0 once got ~10% of a CPU).
FAIR_CPU_SHARE = 0.5


def generation(path):
    """The `generation` record of an eval-reader metrics file: CPU and wall time per question,
    the CPU share the job got."""
    return json.loads(Path(path).read_text()).get("generation") or {}


def timing(gen):
    """The table's speed columns of one evaluation. CPU time per question in milliseconds
    (seconds rounded to 0.01 hid the demo's differences); the wall-clock figure flagged when the
    job got well under its CPUs."""
    share = gen.get("cpu_share")
    cpu = gen.get("cpu_seconds_per_question")
    unfair = share is not None and share < FAIR_CPU_SHARE
    return {"CPU ms/question": cpu * 1000 if cpu is not None else None,
            "questions/s (wall)": gen.get("questions_per_second"),
            "CPU share": share,
            "wall clock": f"loaded: {share:.0%} of its CPUs" if unfair else ""}  # fmt: skip


def speed_up(base, gen):
    """Plain CPU time per question over this one's: the same work on the same machine,
    whatever else ran beside it (wall clock is not: one job may get a tenth of a CPU)."""
    ours, theirs = gen.get("cpu_seconds_per_question"), base.get("cpu_seconds_per_question")
    return theirs / ours if ours and theirs else None


plain = {}
for (round_, split), predictions, metrics in zip(
    params.plain, inputs.plain, inputs.plain_metrics, strict=True
):
    plain[round_, split] = exact_matches(predictions), generation(metrics)

rows = []
for key, (em, gen) in plain.items():
    rows.append({"reader": f"round {key[0]}", "split": key[1], "setting": "plain",
                 "exact match (%)": np.mean(list(em.values())) if em else None,
                 "EM difference": 0.0, "CI low": 0.0, "CI high": 0.0, "speed-up": 1.0,
                 **timing(gen)})  # fmt: skip
for (round_, split, name), predictions, metrics in zip(
    params.fast, inputs.fast, inputs.fast_metrics, strict=True
):
    base, base_gen = plain[round_, split]
    em = exact_matches(predictions)
    ids = sorted(base)
    if sorted(em) != ids:
        raise ValueError(f"{predictions}: not the questions of the plain evaluation")
    ours, theirs = np.array([em[i] for i in ids]), np.array([base[i] for i in ids])
    low, high = paired_bootstrap_interval(ours, theirs)
    gen = generation(metrics)
    rows.append({"reader": f"round {round_}", "split": split, "setting": name,
                 "exact match (%)": ours.mean() if len(ids) else None,
                 "EM difference": (ours - theirs).mean() if len(ids) else None,
                 "CI low": low, "CI high": high, "speed-up": speed_up(base_gen, gen),
                 **timing(gen)})  # fmt: skip
table = pd.DataFrame(rows)
table.to_csv(output.table, index=False, float_format="%.4g")
write_page(output.page, "Faster answers: speed against exact match", [
    "Each round's reader on each split, with and without each acceleration of "
    "eval_reader_accelerations, on the same lists. Exact match in percent; 'EM difference': "
    "accelerated minus plain, with its paired bootstrap 95% interval (CI low, CI high). "
    "speed-up: the plain reader's CPU time per question over the setting's (the first rank's "
    "generation, encoder included): the same work on the same machine, whatever ran beside it. "
    "questions/s (wall) is what a user waits for, but it measures the machine's load too: "
    "'CPU share' is the share of its threads' time the job got, and 'wall clock' flags a job "
    f"that got under {FAIR_CPU_SHARE:.0%} of it (on a GPU the host waits on the device: a low "
    "share is normal there).",
], table, output.table)  # fmt: skip

splits = list(dict.fromkeys(table["split"]))
fig, axes = plt.subplots(1, len(splits), figsize=(5 * len(splits), 3.8), squeeze=False)
for ax, split in zip(axes[0], splits, strict=True):
    for reader, group in table[table["split"] == split].groupby("reader", sort=True):
        ax.scatter(group["speed-up"], group["exact match (%)"], label=reader)
        for _, row in group.iterrows():
            ax.annotate(row["setting"], (row["speed-up"], row["exact match (%)"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")  # fmt: skip
    ax.set(xlabel="speed-up over the plain reader (CPU time per question)",
           ylabel="exact match (%)",
           title=split)  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(output.plot, dpi=120)
write_figure_page(output.plot_page, "Faster answers: speed against exact match", params.caption,
                  output.plot)  # fmt: skip
