"""The report's training curves and training table, from each exported model's metrics.jsonl
and train_config.yaml: the training loss, and the dev metric that selected the exported model,
measured on that model's own dev lists (params.dev_lists says which), which is why a reader's
curve can sit far above the exact match table, where it reads the retrieved lists."""

import json
import textwrap
from pathlib import Path

import matplotlib
import pandas as pd
import yaml
from report_page import write_figure_page, write_page

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
inputs, params, output = snakemake.input, snakemake.params, snakemake.output

# At most 3 models side by side, each a loss panel over a dev panel: the figure is ~1000 px wide
# (dpi 100), the width the report shows it at, so its 9-10 pt text is read at its size (6
# models in one row made a 2,600 px image shown at ~1,000 px, axis text ~7 px).
COLUMNS = min(3, len(params.models))
ROWS = 2 * -(-len(params.models) // COLUMNS)
fig, grid = plt.subplots(ROWS, COLUMNS, figsize=(10, 3.3 * ROWS), squeeze=False)
rows = []
for index, (name, folder) in enumerate(zip(params.models, inputs.models, strict=True)):
    row, column = 2 * (index // COLUMNS), index % COLUMNS
    axes = [grid[row], grid[row + 1]]
    records = [json.loads(line) for line in (Path(folder) / "metrics.jsonl").open()]
    train = pd.DataFrame([r for r in records if r["kind"] == "train"])
    dev = pd.DataFrame([r for r in records if r["kind"] == "dev"])
    # The metric that selected the exported model: select_on (retriever; candidate_*@k rank
    # each dev question's candidate passages) or exact match. All in percent.
    metric = yaml.safe_load((Path(folder) / "train_config.yaml").read_text()).get(
        "select_on", "exact_match"
    )
    best = dev.loc[dev[metric].idxmax()]
    axes[0][column].plot(train["step"], train["loss"])
    axes[0][column].set(title=name, ylabel="training loss")
    axes[1][column].plot(dev["step"], dev[metric], marker="o")
    axes[1][column].annotate(f"best {best[metric]:.1f}%", (best["step"], best[metric]),
                             fontsize=8, xytext=(-40, -14), textcoords="offset points")  # fmt: skip
    label = metric.replace("_", " ").replace("candidate ", "candidate\n")
    lists = textwrap.fill(f"dev: {params.dev_lists[name]}", 30)  # under its own panel
    axes[1][column].set(xlabel=f"step\n{lists}", ylabel=f"dev {label} (%)")
    rows.append({"model": name, "dev lists": params.dev_lists[name], "dev questions": best["n"],
                 "dev metric": metric, "best (%)": best[metric], "at step": int(best["step"]),
                 "steps": int(train["step"].max()),
                 "last training loss": train["loss"].iloc[-1]})  # fmt: skip
for index in range(len(params.models), (ROWS // 2) * COLUMNS):  # a last row not full
    row, column = 2 * (index // COLUMNS), index % COLUMNS
    grid[row][column].axis("off")
    grid[row + 1][column].axis("off")
fig.tight_layout()
fig.savefig(output.curves, dpi=100)
write_figure_page(output.curves_page, "Training curves", params.caption, output.curves)
table = pd.DataFrame(rows)
table.to_csv(output.table, index=False, float_format="%.4g")
write_page(output.page, "Training: the dev metric that chose each exported model", [
    "Each model is validated on the lists it is trained on ('dev lists'), which is not what "
    "the exact match and retrieval tables measure: there a reader answers from the retrieved "
    "lists of the whole split, and a retriever searches the whole corpus. The retriever's "
    "candidate_agreement@k (the reader's top passage is in the retriever's top k) and "
    "candidate_answer_recall@k (the top k holds an answer) re-rank each dev question's candidates.",
], table, output.table)  # fmt: skip
