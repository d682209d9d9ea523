"""The report's comparison of distillation signals: each signal's retriever against the last
round's own, question by question (paired bootstrap intervals of the top-k differences), from
the lists each retrieved (`fid.evaluation.retrieval.first_hit_ranks`: eval-retrieval's rule)."""

import matplotlib
import numpy as np
import pandas as pd
from report_page import write_figure_page, write_page

from fid.config import EvalRetrievalConfig, load_config
from fid.evaluation.bootstrap import paired_bootstrap_interval
from fid.evaluation.retrieval import first_hit_ranks

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
inputs, params, output = snakemake.input, snakemake.params, snakemake.output
cfg = load_config(inputs.config, EvalRetrievalConfig)
store = inputs.store[0] if inputs.store else None


def top_k_hits(path):
    """{question id: (len(ks),) 0/100 scores, 100 where an answer is among the first k}."""
    ranks = first_hit_ranks(cfg, path, store)
    return {
        q: np.array([100.0 * (r is not None and r < k) for k in params.ks])
        for q, r in ranks.items()
    }


rows = []
n_splits = len(params.splits)
for s, split in enumerate(params.splits):
    own = top_k_hits(inputs.own[s])
    ids = list(own)
    theirs = np.stack([own[q] for q in ids]) if ids else np.zeros((0, len(params.ks)))
    sources = [(params.own, theirs)]
    for n, name in enumerate(params.signals):
        path = inputs.signals[n * n_splits + s]
        hits = top_k_hits(path)
        if sorted(hits) != sorted(ids):
            raise ValueError(f"{path}: not the questions of {inputs.own[s]}")
        sources.append((name, np.stack([hits[q] for q in ids]) if ids else theirs))
    # The no-teacher control (score_passages mode uniform), when one is compared: every row is
    # also read against it, since a signal that does not beat it taught nothing of the reader.
    control = next((hits for name, hits in sources if params.teachers[name][0] == "uniform"),
                   None)  # fmt: skip
    for name, ours in sources:
        mode, objective = params.teachers[name]
        row = {"split": split, "retriever": name, "teacher": mode, "objective": objective}
        for j, k in enumerate(params.ks):
            low, high = paired_bootstrap_interval(ours[:, j], theirs[:, j])
            row[f"top-{k} (%)"] = ours[:, j].mean() if ids else None
            row[f"top-{k} difference"] = (ours[:, j] - theirs[:, j]).mean() if ids else None
            row[f"top-{k} CI low"], row[f"top-{k} CI high"] = low, high
            if control is not None:
                low, high = paired_bootstrap_interval(ours[:, j], control[:, j])
                row[f"top-{k} vs control"] = (ours[:, j] - control[:, j]).mean() if ids else None
                row[f"top-{k} vs control CI low"] = low
                row[f"top-{k} vs control CI high"] = high
        rows.append({**row, "questions": len(ids)})
table = pd.DataFrame(rows)
table.to_csv(output.table, index=False, float_format="%.4g")
write_page(output.page, "Distillation signals: which teacher trains the retriever best", [
    f"Round {params.own[4:]}'s reader taught each retriever from the same lists and start: "
    f"{params.own} with the round's own teacher, every other row with a signal of "
    "distillation_signals. Top-k answer accuracy in percent over the same questions; "
    f"'difference': the row's minus {params.own}'s, with its paired bootstrap 95% interval "
    "over questions (CI low, CI high); an interval that holds 0 decides nothing. With a "
    "signal of mode uniform compared (the no-teacher control: a uniform target, no reader "
    "information), 'vs control' gives every row's difference to it, with its interval: a "
    "teacher whose interval holds 0 there cannot be told from no teacher.",
], table, output.table)  # fmt: skip

fig, axes = plt.subplots(1, n_splits, figsize=(5 * n_splits, 3.8), squeeze=False)
width = 0.8 / max(1, len(params.signals))
for ax, split in zip(axes[0], params.splits, strict=True):
    part = table[(table["split"] == split) & (table["retriever"] != params.own)]
    for n, (_, row) in enumerate(part.iterrows()):
        x = np.arange(len(params.ks)) + (n - (len(part) - 1) / 2) * width
        diff = np.array([row[f"top-{k} difference"] for k in params.ks], dtype=float)
        low = np.array([row[f"top-{k} CI low"] for k in params.ks], dtype=float)
        high = np.array([row[f"top-{k} CI high"] for k in params.ks], dtype=float)
        ax.errorbar(x, diff, yerr=[diff - low, high - diff], fmt="o", capsize=3,
                    label=f"{row['retriever']} ({row['teacher']}, {row['objective']})")  # fmt: skip
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(params.ks)), [f"top-{k}" for k in params.ks])
    ax.set(ylabel=f"difference to {params.own} (points)", title=split)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(output.plot, dpi=120)
write_figure_page(output.plot_page, "Distillation signals: difference to the round's own teacher",
                  params.caption, output.plot)  # fmt: skip
