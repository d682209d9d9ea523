"""The report's figures: exact match per round and split (with the baseline), full-corpus top-k
accuracy per retriever, and the training curves read from each exported model's metrics.jsonl
(the retriever's dev metrics re-rank each question's candidates: not the top-k above)."""

import json
from pathlib import Path

import matplotlib
import pandas as pd
import yaml

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
inputs, params, output = snakemake.input, snakemake.params, snakemake.output

em = pd.read_csv(inputs.exact_match)
ax = em.pivot(index="reader", columns="split", values="exact match (%)").plot.barh(figsize=(7, 3.5))
ax.set_xlabel("exact match (%)")
ax.figure.tight_layout()
ax.figure.savefig(output.exact_match, dpi=120)

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

fig, axes = plt.subplots(2, len(params.models), figsize=(3.2 * len(params.models), 5),
                         squeeze=False)  # fmt: skip
for column, (name, folder) in enumerate(zip(params.models, inputs.models, strict=True)):
    records = [json.loads(line) for line in (Path(folder) / "metrics.jsonl").open()]
    train = pd.DataFrame([r for r in records if r["kind"] == "train"])
    dev = pd.DataFrame([r for r in records if r["kind"] == "dev"])
    axes[0][column].plot(train["step"], train["loss"])
    axes[0][column].set(title=name, ylabel="training loss")
    # The metric that selected the exported model: select_on (retriever; candidate_*@k rank
    # each dev question's candidate passages) or exact match. All in percent.
    trained = yaml.safe_load((Path(folder) / "train_config.yaml").read_text())
    metric = trained.get("select_on", "exact_match")
    axes[1][column].plot(dev["step"], dev[metric], marker="o")
    label = metric.replace("_", " ").replace("candidate ", "candidate\n")
    axes[1][column].set(xlabel="step", ylabel=f"dev {label} (%)")
fig.tight_layout()
fig.savefig(output.curves, dpi=120)
