"""workflow_scripts/report_flags.py, the report's warnings, run on hand-made tables (issue 46.4).

The demo's report said "No warnings" while the zero-shot MiniLM beat both distilled retrievers
at every k (dev top-5 74.0 vs 59.3 / 66.3), which a newcomer reads as "distillation fails":
such a pretrained retriever is now a warning row, and the page says why it can happen.
"""

from __future__ import annotations

import runpy
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "workflow_scripts"

EXACT_MATCH = """reader,split,exact match (%)
most common answer (train),dev,1.0
round 0,dev,10.0
round 1,dev,12.0
"""
RETRIEVAL = """retriever,source,split,top-1 (%),top-5 (%),questions
BM25,bm25,dev,30.0,49.0,300
"distilled, round 0",iter0,dev,35.0,59.3,300
"distilled, round 1",iter1,dev,38.0,66.3,300
minilm (pretrained),minilm,dev,{top1},74.0,300
"""


def _flags(tmp_path: Path, top1: float) -> tuple[pd.DataFrame, str]:
    (tmp_path / "em.csv").write_text(EXACT_MATCH)
    (tmp_path / "topk.csv").write_text(RETRIEVAL.format(top1=top1))
    output = types.SimpleNamespace(table=str(tmp_path / "flags.csv"),
                                   page=str(tmp_path / "flags.html"))  # fmt: skip
    snakemake = types.SimpleNamespace(
        input=types.SimpleNamespace(exact_match=str(tmp_path / "em.csv"),
                                    retrieval=str(tmp_path / "topk.csv")),
        params=types.SimpleNamespace(rounds=2, first="bm25"),
        output=output,
    )  # fmt: skip
    sys.path.insert(0, str(SCRIPTS))  # report_page, beside the script
    try:
        runpy.run_path(str(SCRIPTS / "report_flags.py"), init_globals={"snakemake": snakemake})
    finally:
        sys.path.remove(str(SCRIPTS))
    return pd.read_csv(output.table), Path(output.page).read_text()


def test_a_pretrained_retriever_beating_every_distilled_one_is_a_warning(tmp_path):
    flags, page = _flags(tmp_path, top1=40.0)
    rows = flags[flags["flag"] == "a pretrained retriever beats every distilled one"]
    assert list(rows["metric"]) == ["top-1 (%)", "top-5 (%)"]
    top5 = rows[rows["metric"] == "top-5 (%)"].iloc[0]
    assert top5["model"] == "retriever minilm (pretrained)" and top5["value"] == 74.0
    assert top5["compared with"] == "the best distilled retriever (iter1)"
    assert top5["its value"] == pytest.approx(66.3)
    assert "No warnings" not in page and "start from scratch" in page
    assert "bert-base-uncased" in page


def test_a_pretrained_retriever_beaten_at_some_k_is_flagged_only_there(tmp_path):
    flags, _ = _flags(tmp_path, top1=37.0)  # under round 1's 38.0 at top-1
    rows = flags[flags["flag"] == "a pretrained retriever beats every distilled one"]
    assert list(rows["metric"]) == ["top-5 (%)"]
