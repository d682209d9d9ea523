"""The disk plan under the workflow: printed when the workflow loads, and a run that does not fit
the free space of its file system stops before its first job with the table, unless
`disk_check: warn`. The plan's figures against finished runs are checked where those runs are
made (test_rebuild.py, test_scale_rehearsal.py, test_end_to_end.py)."""

from __future__ import annotations

import hashlib

import yaml
from workflow_helpers import ROOT, SAMPLES, disk_plan, dry_run, snakemake

TARGET = "results/own/config/bm25.yaml"
PETABYTES = 10**16


def _config(workdir, **over):
    """config/own_data.yaml on squad-open-tiny with built models (no hub) and a download of
    10 PB that no target here needs: the plan counts it."""
    config = yaml.safe_load((ROOT / "config" / "own_data.yaml").read_text())
    config["models"] = {"reader": "init", "retriever": "init", "continue": True}
    config["pretrained"], config["compare"] = {}, []
    config["data"]["downloads"] = {
        "huge.tsv.gz": {
            "url": "https://example.org/huge.tsv.gz",
            "checksum": "sha256:" + hashlib.sha256(b"").hexdigest(),
            "bytes": PETABYTES,
            "checksum_source": "the test",
        }
    }
    config.update(over)
    data = workdir / "data" / "own"
    data.mkdir(parents=True, exist_ok=True)
    for name in ("psgs_w100.tsv", "questions.jsonl"):
        (data / name).write_bytes((SAMPLES / "squad-open-tiny" / name).read_bytes())
    path = workdir / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_run_that_does_not_fit_stops_before_any_job(tmp_path):
    config = _config(tmp_path)
    # a dry run shows the plan and says a run would stop
    output = dry_run(tmp_path, TARGET, "--configfile", str(config))
    rows = {stage: planned for stage, planned, _ in disk_plan(output)}
    assert rows["downloads"] >= PETABYTES * 0.99 and "bm25 index" in rows
    assert "a run would stop here unless disk_check: warn" in output
    # the run: refused at once, the table and the way out in the error, nothing written
    result = snakemake(tmp_path, TARGET, "--configfile", str(config), "--cores", "1")
    message = result.stdout + result.stderr
    assert result.returncode != 0
    assert "the run does not fit on disk" in message and "DOES NOT FIT" in message
    assert "disk_check: warn" in message and "resources/own/downloads" in message
    assert not (tmp_path / "results").exists()
    # disk_check: warn runs it, with the warning
    config = _config(tmp_path, disk_check="warn")
    result = snakemake(tmp_path, TARGET, "--configfile", str(config), "--cores", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the run does not fit on disk" in result.stdout + result.stderr
    assert (tmp_path / TARGET).is_file()


def test_what_is_there_is_not_asked_for_again(tmp_path):
    """A resumed run needs only the rest: the downloads' row counts the file already there."""
    config = _config(tmp_path)
    spec = yaml.safe_load(config.read_text())
    spec["data"]["downloads"]["huge.tsv.gz"]["bytes"] = 5_000_000
    config.write_text(yaml.safe_dump(spec))
    before = dry_run(tmp_path, TARGET, "--configfile", str(config))
    downloads = tmp_path / "resources" / "own" / "downloads"
    downloads.mkdir(parents=True)
    (downloads / "huge.tsv.gz").write_bytes(b"\0" * 4_000_000)
    after = dry_run(tmp_path, TARGET, "--configfile", str(config))

    def needed(output):
        line = next(line for line in output.splitlines() if "still needs" in line)
        return float(line.split("still needs ")[1].split(" ")[0])

    assert round(needed(before) - needed(after), 1) == round(4_000_000 / 2**20, 1)
