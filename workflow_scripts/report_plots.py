"""The report's figures: exact match per round and split (with the baseline) and full-corpus
top-k accuracy per retriever (training curves: report_training.py), each a PNG and a page that
shows it under its caption."""

import matplotlib
import pandas as pd
from report_page import write_figure_page

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
inputs, params, output = snakemake.input, snakemake.params, snakemake.output

em = pd.read_csv(inputs.exact_match)
ax = em.pivot(index="reader", columns="split", values="exact match (%)").plot.barh(figsize=(7, 3.5))
ax.set_xlabel("exact match (%)")
ax.figure.tight_layout()
ax.figure.savefig(output.exact_match, dpi=120)
write_figure_page(output.exact_match_page, "Reader exact match (%)",
                  params.captions["exact_match"], output.exact_match)  # fmt: skip

topk = pd.read_csv(inputs.retrieval)
splits = list(dict.fromkeys(topk["split"]))
fig, axes = plt.subplots(1, len(splits), figsize=(5 * len(splits), 3.5), squeeze=False)
for ax, split in zip(axes[0], splits, strict=True):
    for _, row in topk[topk["split"] == split].iterrows():
        ks = [c for c in topk.columns if c.startswith("top-")]  # "top-5 (%)"
        x = [int(k[4:-4]) for k in ks]
        ax.plot(x, [row[k] for k in ks], marker="o", label=row["retriever"])
    ax.set(xscale="log", xlabel="k", ylabel="top-k accuracy (%)", title=split, ylim=(0, 100))
    ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(output.topk, dpi=120)
write_figure_page(output.topk_page, "Retrieval top-k accuracy (%)", params.captions["topk"],
                  output.topk)  # fmt: skip
