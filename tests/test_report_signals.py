"""workflow_scripts/report_signals.py on hand-made lists (issue 49.1, 49.5): with the no-teacher
controls (score_passages mode uniform; with train_n_passages 1, the in-batch control) compared,
every row is also read against each, question by question, with a paired bootstrap interval
and p-value; a signal's seeds are averaged per question; Holm adjusts the table's p-values."""

from __future__ import annotations

import json
import runpy
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "workflow_scripts"


def _lists(path: Path, first_hits: list[bool]) -> str:
    """FiD json lists of len(first_hits) questions whose top passage holds the answer or not."""
    records = [
        {"id": f"q{i}", "question": f"question {i}?", "answers": ["yes"],
         "ctxs": [{"id": f"p{i}", "title": "t", "text": "yes" if hit else "no",
                   "has_answer": hit}]}
        for i, hit in enumerate(first_hits)
    ]  # fmt: skip
    path.write_text(json.dumps(records))
    return str(path)


def _report(tmp_path: Path, teachers: dict, seeds: int = 1) -> pd.DataFrame:
    """The report's table of `teachers` (name -> (mode, objective, control)); each signal's
    retriever per seed hits the questions below (seed s: the list moved s questions on)."""
    hits = {"iter1": [q % 2 == 0 for q in range(40)],  # 50%
            "pdist": [q % 10 < 7 for q in range(40)],  # 70%
            "uniform": [q % 10 < 3 for q in range(40)],  # 30%
            "in_batch": [q % 10 in (3, 4) for q in range(40)]}  # 20%, not uniform's  # fmt: skip
    signals = [name for name in teachers if name != "iter1"]
    lists = [_lists(tmp_path / f"{name}{s}.json", hits[name][s:] + hits[name][:s])
             for name in signals for s in range(seeds)]  # fmt: skip
    (tmp_path / "eval.yaml").write_text("{}\n")
    output = types.SimpleNamespace(table=str(tmp_path / "signals.csv"),
                                   page=str(tmp_path / "signals.html"),
                                   plot=str(tmp_path / "signals.png"),
                                   plot_page=str(tmp_path / "signals_plot.html"))  # fmt: skip
    snakemake = types.SimpleNamespace(
        input=types.SimpleNamespace(
            own=[_lists(tmp_path / "own.json", hits["iter1"])],
            signals=lists,
            config=str(tmp_path / "eval.yaml"), store=[]),
        params=types.SimpleNamespace(splits=["dev"], own="iter1", signals=signals, ks=[1],
                                     seeds=seeds,
                                     teachers=teachers, caption="The *plot*."),
        output=output,
    )  # fmt: skip
    sys.path.insert(0, str(SCRIPTS))
    try:
        runpy.run_path(str(SCRIPTS / "report_signals.py"), init_globals={"snakemake": snakemake})
    finally:
        sys.path.remove(str(SCRIPTS))
    return pd.read_csv(output.table).set_index("retriever")


def test_every_signal_is_read_against_the_no_teacher_control(tmp_path):
    table = _report(tmp_path, {"iter1": ("attention_mass", "kl", ""), "pdist": ("pdist", "kl", ""),
                               "uniform": ("uniform", "kl", "uniform")})  # fmt: skip
    assert table.loc["pdist", "top-1 (%)"] == 70 and table.loc["uniform", "top-1 (%)"] == 30
    assert table.loc["pdist", "top-1 vs control"] == pytest.approx(40)
    assert table.loc["iter1", "top-1 vs control"] == pytest.approx(20)
    assert table.loc["uniform", "top-1 vs control"] == 0
    low, high = table.loc["pdist", ["top-1 vs control CI low", "top-1 vs control CI high"]]
    assert 0 < low < 40 < high
    assert "no-teacher control" in (tmp_path / "signals.html").read_text()


def test_without_a_control_there_are_no_control_columns(tmp_path):
    table = _report(tmp_path, {"iter1": ("attention_mass", "kl", ""), "pdist": ("pdist", "kl", "")})
    assert not [column for column in table.columns if "control" in column]
    assert table.loc["pdist", "top-1 difference"] == pytest.approx(20)


def test_both_controls_seeds_averaged_and_holm_over_the_table(tmp_path):
    teachers = {"iter1": ("attention_mass", "kl", ""), "pdist": ("pdist", "kl", ""),
                "uniform": ("uniform", "kl", "uniform"),
                "in_batch": ("uniform", "kl", "in_batch")}  # fmt: skip
    table = _report(tmp_path, teachers, seeds=2)
    # the seeds hit the same share of questions (70%), on other questions: averaged per question
    assert table.loc["pdist", "top-1 (%)"] == pytest.approx(70)
    assert table.loc["pdist", "top-1 vs in-batch control"] == pytest.approx(50)
    assert table.loc["uniform", "top-1 vs in-batch control"] == pytest.approx(10)
    assert table.loc["in_batch", "top-1 vs control"] == pytest.approx(-10)  # the same pair
    assert table.loc["in_batch", "top-1 vs in-batch control"] == 0
    assert pd.isna(table.loc["in_batch", "top-1 vs in-batch control p"])
    # the family: iter1, pdist, uniform against the other three or fewer, each pair once:
    # (iter1, pdist), (iter1, uniform), (iter1, in_batch), (pdist, uniform), (pdist, in_batch),
    # (uniform, in_batch) = 6 comparisons at top-1
    p = table.loc["pdist", "top-1 vs in-batch control p"]
    holm = table.loc["pdist", "top-1 vs in-batch control Holm p"]
    assert p < 0.001 and p < holm <= 6 * p
    low = table.loc["pdist", "top-1 vs in-batch control CI low"]
    assert low > 0
    uniform = table.loc[
        "uniform", ["top-1 vs in-batch control p", "top-1 vs in-batch control Holm p"]
    ]
    assert list(uniform) == list(
        table.loc["in_batch", ["top-1 vs control p", "top-1 vs control Holm p"]]
    )
    page = (tmp_path / "signals.html").read_text()
    assert "over all 6 comparisons" in page and "pdist vs in_batch top-1 (dev, +50.0)" in page
    assert "uniform vs in_batch" not in page  # 10 points over 40 questions: not after Holm
