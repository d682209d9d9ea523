"""`make clean` removes everything a demo or workflow run leaves in the folder, and keeps
downloads; git ignores what a run writes."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_make_clean_removes_a_runs_leftovers_and_keeps_downloads(tmp_path):
    made = ["results/demo/report/x.csv", "state/demo/iter0/reader/k/step-1/m", "logs/x/y.log",
            ".snakemake/log/a.log", "report.html", "dag.svg", "demo/reader/x",
            "resources/pretrained/minilm/config.json", ".pytest_cache/v"]  # fmt: skip
    kept = ["resources/nq/downloads/psgs_w100.tsv.gz", "config/mine.yaml"]
    for name in made + kept:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    result = subprocess.run(["make", "-f", str(ROOT / "Makefile"), "-C", str(tmp_path), "clean"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == sorted(kept)


def test_git_ignores_what_a_run_writes():
    ignored = (ROOT / ".gitignore").read_text().split()
    for name in ("/results/", "/state/", "/logs/", "/.snakemake/", "/report.html", "/resources/"):
        assert name in ignored, name
