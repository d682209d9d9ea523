"""Full runs (slow): the embedded demo against its bars, and config/own_data.yaml on a real
open-domain sample (samples//squad-open-tiny)."""

from __future__ import annotations

import csv
import json
import shutil
import time
from pathlib import Path

import pytest
import yaml
from workflow_helpers import ROOT, SAMPLES, check_disk_plan, report_pages, snakemake, table_rows

pytestmark = pytest.mark.slow


def _rows(path: Path) -> list[dict]:
    with open(path) as handle:
        return list(csv.DictReader(handle))


def _benchmarks(workdir: Path) -> dict[str, float]:
    """Wall seconds per rule, summed over its jobs (benchmark files)."""
    seconds: dict[str, float] = {}
    for tsv in (workdir / "logs" / "benchmarks").rglob("*.tsv"):
        rule = tsv.relative_to(workdir / "logs" / "benchmarks").parts[0]
        seconds[rule] = seconds.get(rule, 0.0) + float(_rows_tsv(tsv)["s"])
    return seconds


def _rows_tsv(path: Path) -> dict:
    with open(path) as handle:
        return next(csv.DictReader(handle, delimiter="\t"))


def test_demo_reaches_its_bars(tmp_path):
    started = time.perf_counter()
    result = snakemake(tmp_path, "--cores", "2", timeout=3 * 3600)
    wall = time.perf_counter() - started
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    print(f"demo wall time {wall:.0f} s; per rule: {_benchmarks(tmp_path)}")
    # the disk plan printed before the first job: each stage within 20% of what it holds
    print("\n".join(check_disk_plan(result.stdout + result.stderr, tmp_path)))
    report = snakemake(tmp_path, "--report", "report.html")
    assert report.returncode == 0 and (tmp_path / "report.html").stat().st_size > 10_000

    em = {(r["reader"], r["split"]): float(r["exact match (%)"]) for r in
          _rows(tmp_path / "results/demo/report/exact_match.csv")}  # fmt: skip
    baseline = next(
        v for (reader, split), v in em.items() if reader.startswith("most") and split == "test"
    )
    print("exact match:", em)
    # The reader far above answering the most common training answer every time, in both
    # rounds (3 seeds of the world, session 5, top-5 lists: round 0 16.7/11.7/20.0%, round 1
    # 19.3/18.3/33.0%, baseline 1.0/1.3/0.3%). Round 1 (the reader retrained on the distilled
    # retriever's lists) gained on all 3 seeds, by 2.7 to 13 points: not asserted, DESIGN.md 7
    # found no gain in the prototype.
    assert em[("round 0", "test")] >= max(10.0, 5 * baseline)
    assert em[("round 1", "test")] >= 5 * baseline

    top = {
        (r["source"], r["split"]): r for r in _rows(tmp_path / "results/demo/report/retrieval.csv")
    }
    print("retrieval:", top)

    def beats_bm25(source, k):
        column = f"top-{k} (%)"
        return float(top[(source, "test")][column]) > float(top[("bm25", "test")][column])

    # Both distilled retrievers above BM25 at top-1 and top-5, and round 1's above round 0's at
    # top-1 (3 seeds, session 5, test top-1/5: round 0 22.3/68.3, 11.3/57.3, 32.3/81.3; round 1
    # 31.0/74.3, 24.3/68.7, 52.7/86.0; BM25 8.7/45.3, 6.7/51.0, 11.0/53.3).
    assert beats_bm25("iter1", 1) and beats_bm25("iter1", 5)
    assert beats_bm25("iter0", 1) and beats_bm25("iter0", 5)
    assert float(top[("iter1", "test")]["top-1 (%)"]) > float(top[("iter0", "test")]["top-1 (%)"])
    report_dir = tmp_path / "results/demo/report"
    for name in ("exact_match.png", "retrieval_topk.png", "training_curves.png", "config.yaml",
                 "acceleration.png"):  # fmt: skip
        assert (report_dir / name).stat().st_size > 0
    # the faster-answer plot's setting and the numbers of the tables, in report.html itself
    pages = report_pages(tmp_path / "report.html")
    assert "prune2" in pages["results/demo/report/acceleration.html"]
    shown = {(row[0], row[1]): row[2] for row in
             table_rows(pages["results/demo/report/exact_match.html"])}  # fmt: skip
    assert shown == {key: f"{value:.2f}" for key, value in em.items()}
    runtimes = _rows(report_dir / "runtimes.csv")
    print("run time per rule:", runtimes)
    assert runtimes[-1]["rule"] == "all jobs"


def test_own_data_config_on_squad_open_tiny(tmp_path):
    squad = SAMPLES / "squad-open-tiny"
    (tmp_path / "data" / "own").mkdir(parents=True)
    shutil.copy(squad / "psgs_w100.tsv", tmp_path / "data" / "own" / "psgs_w100.tsv")
    shutil.copy(squad / "questions.jsonl", tmp_path / "data" / "own" / "questions.jsonl")
    # One round: the demo test covers the second (the config's 2 rounds plan in test_plan.py).
    # No hub here: the tiny random reader instead of t5-base, the config's smoke test.
    own = yaml.safe_load((ROOT / "config" / "own_data.yaml").read_text())
    own.update(rounds=1, models={**own["models"], "reader": "init"})
    # Fine-tuning MiniLM costs ~17 s a step on one CPU thread at the config's sizes: a few
    # short steps prove the chain (its spec, its flags) without the minutes.
    own["retriever"].update(max_steps=4, eval_every_steps=4, save_every_steps=4,
                            batch_size_per_device=4, passage_max_tokens=64)  # fmt: skip
    config = tmp_path / "own_data.yaml"
    config.write_text(yaml.safe_dump(own, sort_keys=False))
    result = snakemake(tmp_path, "--configfile", str(config), "--cores", "2", timeout=3600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    top = {
        (r["source"], r["split"]): r for r in _rows(tmp_path / "results/own/report/retrieval.csv")
    }
    print("own data retrieval:", top)
    print("own data reader:", _rows(tmp_path / "results/own/report/exact_match.csv"))
    # a real pretrained encoder and BM25 find answers on real text (has-answer of DPR)
    assert float(top[("bm25", "test")]["top-10 (%)"]) >= 70.0
    assert float(top[("minilm", "test")]["top-10 (%)"]) >= 70.0
    # the distilled retriever starts from MiniLM (its spec: plain text, cosine) ...
    spec = json.loads(
        (tmp_path / "results/own/iter0/retriever/model/dual_encoder.json").read_text()
    )
    assert (spec["input_format"], spec["normalize"]) == ("plain", True)
    # ... and the report flags the random reader, which learns nothing in this smoke test
    flags = _rows(tmp_path / "results/own/report/flags.csv")
    print("own data flags:", flags)
    assert any(f["model"] == "reader, round 0" and f["split"] == "test" for f in flags), flags
    questions = (tmp_path / "results/own/data/test.jsonl").read_text().count("\n")
    assert questions == 30  # 15% of 200
