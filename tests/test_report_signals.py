"""workflow_scripts/report_signals.py on hand-made lists (issue 49.1): with the no-teacher
control (a signal of score_passages mode uniform) compared, every row is also read against it,
question by question, with a paired bootstrap interval."""

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


def _report(tmp_path: Path, teachers: dict) -> pd.DataFrame:
    hits = {"iter1": [q % 2 == 0 for q in range(40)],  # 50%
            "pdist": [q % 10 < 7 for q in range(40)],  # 70%
            "uniform": [q % 10 < 3 for q in range(40)]}  # 30%  # fmt: skip
    signals = [name for name in teachers if name != "iter1"]
    (tmp_path / "eval.yaml").write_text("{}\n")
    output = types.SimpleNamespace(table=str(tmp_path / "signals.csv"),
                                   page=str(tmp_path / "signals.html"),
                                   plot=str(tmp_path / "signals.png"),
                                   plot_page=str(tmp_path / "signals_plot.html"))  # fmt: skip
    snakemake = types.SimpleNamespace(
        input=types.SimpleNamespace(
            own=[_lists(tmp_path / "own.json", hits["iter1"])],
            signals=[_lists(tmp_path / f"{name}.json", hits[name]) for name in signals],
            config=str(tmp_path / "eval.yaml"), store=[]),
        params=types.SimpleNamespace(splits=["dev"], own="iter1", signals=signals, ks=[1],
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
    table = _report(tmp_path, {"iter1": ("attention_mass", "kl"), "pdist": ("pdist", "kl"),
                               "uniform": ("uniform", "kl")})  # fmt: skip
    assert table.loc["pdist", "top-1 (%)"] == 70 and table.loc["uniform", "top-1 (%)"] == 30
    assert table.loc["pdist", "top-1 vs control"] == pytest.approx(40)
    assert table.loc["iter1", "top-1 vs control"] == pytest.approx(20)
    assert table.loc["uniform", "top-1 vs control"] == 0
    low, high = table.loc["pdist", ["top-1 vs control CI low", "top-1 vs control CI high"]]
    assert 0 < low < 40 < high
    assert "no-teacher control" in (tmp_path / "signals.html").read_text()


def test_without_a_control_there_are_no_control_columns(tmp_path):
    table = _report(tmp_path, {"iter1": ("attention_mass", "kl"), "pdist": ("pdist", "kl")})
    assert not [column for column in table.columns if "control" in column]
    assert table.loc["pdist", "top-1 difference"] == pytest.approx(20)
