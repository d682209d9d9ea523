"""The report's comparison of distillation signals: each signal's retriever against the last
round's own, question by question (paired bootstrap intervals of the top-k differences), from
the lists each retrieved (`fid.evaluation.retrieval.first_hit_ranks`: eval-retrieval's rule)."""

import matplotlib
import numpy as np
import pandas as pd
from report_page import write_figure_page, write_page

from fid.config import EvalRetrievalConfig, load_config
from fid.evaluation.paired_comparisons import by_pair, compare_to_references, with_holm
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


# The no-teacher controls, when compared (issue 49): score mode uniform over the candidates
# ("control") and with train_n_passages 1 ("in-batch control": no candidates). Every row is
# read against the round's own retriever and each control: column prefix -> reference.
CONTROLS = {"uniform": "vs control", "in_batch": "vs in-batch control"}
REFERENCES = {"": params.own}
REFERENCES |= {CONTROLS[c]: name for name, (_, _, c) in params.teachers.items() if c}
n_splits, n_seeds = len(params.splits), params.seeds
means, counts, found = {}, {}, []
for s, split in enumerate(params.splits):
    own = top_k_hits(inputs.own[s])
    ids = list(own)
    sources = {
        params.own: np.stack([own[q] for q in ids]) if ids else np.zeros((0, len(params.ks)))
    }
    for n, name in enumerate(params.signals):
        seeds = []  # each seed's (Q, len(ks)) hits, averaged per question: pairs by question
        for seed in range(n_seeds):
            path = inputs.signals[(n * n_seeds + seed) * n_splits + s]
            hits = top_k_hits(path)
            if sorted(hits) != sorted(ids):
                raise ValueError(f"{path}: not the questions of {inputs.own[s]}")
            seeds.append(np.stack([hits[q] for q in ids]) if ids else sources[params.own])
        sources[name] = np.mean(seeds, axis=0)
    means[split] = {
        name: h.mean(0) if ids else [None] * len(params.ks) for name, h in sources.items()
    }
    counts[split] = len(ids)
    found += [(split, c) for c in compare_to_references(sources, list(REFERENCES.values()))]
# one family, Holm over every comparison the table holds (all splits)
adjusted = with_holm([c for _, c in found])
pairs = {split: by_pair([c for (sp, _), c in zip(found, adjusted, strict=True) if sp == split])
         for split in params.splits}  # fmt: skip
rows = []
for split in params.splits:
    for name, mean in means[split].items():
        mode, objective, _ = params.teachers[name]
        row = {"split": split, "retriever": name, "teacher": mode, "objective": objective}
        for j, k in enumerate(params.ks):
            row[f"top-{k} (%)"] = mean[j]
            for prefix, reference in REFERENCES.items():
                c = pairs[split].get((name, reference, j))  # None: the row is the reference
                stem = f"top-{k} {prefix}" if prefix else f"top-{k}"
                row[stem if prefix else f"top-{k} difference"] = c.difference if c else 0.0
                row[f"{stem} CI low"], row[f"{stem} CI high"] = (c.low, c.high) if c else (0, 0)
                row[f"{stem} p"], row[f"{stem} Holm p"] = (c.p, c.holm) if c else (None, None)
        rows.append({**row, "questions": counts[split]})
table = pd.DataFrame(rows)
# 6 significant digits: a mean over seeds of a percentage (15.625 over 2 seeds) kept whole
table.to_csv(output.table, index=False, float_format="%.6g")
survivors = [f"{c.system} vs {c.reference} top-{params.ks[c.column]} ({split}, "
             f"{c.difference:+.1f})" for (split, _), c in zip(found, adjusted, strict=True)
             if c.holm < 0.05]  # fmt: skip
write_page(output.page, "Distillation signals: which teacher trains the retriever best", [
    f"Round {params.own[4:]}'s reader taught each retriever from the same lists and start: "
    f"{params.own} with the round's own teacher, every other row with a signal of "
    f"distillation_signals, each trained with {n_seeds} seed(s) (distillation_seeds) and its "
    "per-question hits averaged over them. Top-k answer accuracy in percent over the same "
    f"questions; 'difference': the row's minus {params.own}'s, with its paired bootstrap 95% "
    "interval over questions (CI low, CI high) and p-value; an interval that holds 0 decides "
    "nothing. With signals of mode uniform compared, the no-teacher controls (a uniform target "
    "over the candidates: 'vs control'; train_n_passages 1, the list's top passage against "
    "the batch's other questions': 'vs in-batch control'), every row's difference to each: "
    "a teacher that does not beat them taught the retriever nothing of the reader.",
    f"Holm p: the p-values adjusted (Holm-Bonferroni) over all {len(found)} comparisons of "
    "this table. Differences that survive it (Holm p < 0.05): "
    f"{'; '.join(survivors) or 'none'}.",
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
