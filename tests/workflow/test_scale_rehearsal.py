"""The scale rehearsal (config/scale.yaml) end to end at 1/1000 of NQ under the local profile:
NQ's DAG shape (100 passages per question, 16 embedding shards, 2 rounds, every split) on the
NQ-shaped synthetic set, with compact lists read through a passage store in every stage."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from workflow_helpers import ROOT, check_disk_plan, snakemake

from fid.data.retrieval_lists import is_compact_lists, read_lists


def _peak_rss_mb(workdir: Path) -> dict[str, float]:
    """The largest max_rss (MB) of any job of each rule (Snakemake's benchmark files)."""
    peaks: dict[str, float] = {}
    for path in (workdir / "logs" / "benchmarks").rglob("*.tsv"):
        rule = path.relative_to(workdir / "logs" / "benchmarks").parts[0]
        row = next(csv.DictReader(path.open(), delimiter="\t"))
        peaks[rule] = max(peaks.get(rule, 0.0), float(row["max_rss"]))
    return peaks


@pytest.mark.slow
def test_scale_rehearsal_at_one_thousandth_of_nq(tmp_path):
    result = snakemake(tmp_path, "--configfile", str(ROOT / "config" / "scale.yaml"),
                       "--cores", "2", timeout=3600)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # the disk plan printed before the first job: each stage within 20% of what it holds
    print("\n".join(check_disk_plan(result.stdout + result.stderr, tmp_path)))
    results = tmp_path / "results" / "scale"
    stats = json.loads((results / "data/scale/stats.json").read_text())
    assert stats["passages"] == 21_015 and stats["questions"] == {"train": 79, "dev": 9, "test": 4}
    # every list the pipeline wrote is compact, 100 passages per question, on the store's corpus
    store = json.loads((results / "passages/store/store.json").read_text())
    for path in [*results.glob("*/retrieval/*.json"), *results.glob("iter*/reader/scores/*.json")]:
        assert is_compact_lists(path), path
        lists = read_lists(path)
        assert lists.corpus == {"sha256": store["sha256"], "n_passages": store["n_passages"]}
        assert set(lists.offsets[1:] - lists.offsets[:-1]) == {100}, path
    scored = read_lists(results / "iter1/reader/scores/train.json")
    assert "reader_score" in scored.columns
    # evaluation ran on every split and source; answers are planted, so BM25 finds them
    for source in ("bm25", "iter0", "iter1"):
        for split in ("dev", "test"):
            metrics = json.loads((results / source / "eval" / f"{split}.json").read_text())
            assert metrics["n_scored"] == {"dev": 9, "test": 4}[split]
    bm25 = json.loads((results / "bm25/eval/dev.json").read_text())
    assert bm25["accuracy"]["100"] == 100.0
    peaks = _peak_rss_mb(tmp_path)
    print("peak RSS (MB) per rule:", peaks)
    assert {"train_reader", "score_passages", "embed_passages", "build_index"} <= set(peaks)
