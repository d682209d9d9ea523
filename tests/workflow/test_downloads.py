"""The data stage of a real run, on file:// downloads: downloads are keyed by what they fetch.

One run downloads, extracts and prepares three splits (~30 s on 2 cores); then, on that
working folder: pinning the digest that the first download recorded plans nothing (and a wrong
pin stops the DAG, naming both digests); a second run on the same dataset with other download
knobs plans no download nor extraction; a changed URL downloads again. Under the SLURM profile
the data rules are local rules unless data.download_on_compute_nodes says otherwise.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile

import pytest
import yaml
from workflow_helpers import (
    ROOT,
    SAMPLES,
    disk_plan,
    dry_run,
    local_rules,
    planned_jobs,
    snakemake,
)

TINY = ROOT / "tests" / "workflow" / "config.yaml"
SPLITS = ("train", "dev", "test")
TARGETS = [f"results/r1/data/{split}.jsonl" for split in SPLITS]


def _sha256(path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def _sources(folder):
    """What the config downloads: passages (.gz), NQ-open questions, FiD-style index archive."""
    folder.mkdir()
    passages = (SAMPLES / "squad-open-tiny" / "psgs_w100.tsv").read_bytes()
    (folder / "psgs.tsv.gz").write_bytes(gzip.compress(passages, mtime=0))
    lines = (SAMPLES / "nq-open" / "NQ-open.dev.jsonl").read_text().splitlines()[:30]
    (folder / "questions.jsonl").write_text("\n".join(lines) + "\n")
    with tarfile.open(folder / "index.tar.gz", "w:gz") as tar:
        for split, positions in zip(
            SPLITS, ([*range(20)], [*range(20, 25)], [*range(25, 30)]), strict=True
        ):
            data = json.dumps(positions).encode()
            info = tarfile.TarInfo(f"Q.{split}.idx.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _config(workdir, src, run="r1", download=None, urls=None, pin=None, sizes=(20, 5, 6),
            accept=("test",)):  # fmt: skip
    """A files config whose data all come from file:// downloads (tiny models otherwise)."""
    config = yaml.safe_load(TINY.read_text())
    urls = {name: f"file://{src / name}" for name in ("psgs.tsv.gz", "questions.jsonl")} | (
        urls or {}
    )
    downloads = {
        name: {"url": urls[name], "checksum": _sha256(src / name)}
        for name in ("psgs.tsv.gz", "questions.jsonl")
    }
    downloads["index.tar.gz"] = {
        "url": f"file://{src / 'index.tar.gz'}",
        "checksum": pin,
        "no_checksum_because": "the test's own archive, pinned after the first download",
    }
    extract = {"psgs.tsv": {"archive": "psgs.tsv.gz"}}
    extract |= {f"Q.{s}.idx.json": {"archive": "index.tar.gz", "member": f"Q.{s}.idx.json"}
                for s in SPLITS}  # fmt: skip
    questions = {
        split: {"input": "resources/ds/downloads/questions.jsonl",
                "index": f"resources/ds/extracted/Q.{split}.idx.json"}
        for split in SPLITS
    }  # fmt: skip
    for split, size in zip(SPLITS, sizes or (), strict=False):
        questions[split]["expected_size"] = size
    for split in accept:  # a split of another size is written, with a warning
        questions[split]["prepare"] = {"accept_other_size": True}
    config.update(run=run, dataset="ds", download=download or {"timeout_s": 30, "retries": 2})
    config["data"] = {
        "source": "files",
        "passages": "resources/ds/extracted/psgs.tsv",
        "questions": questions,
        "downloads": downloads,
        "extract": extract,
    }
    path = workdir / f"{run}-{len(list(workdir.glob('*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _planned(workdir, config, *targets) -> list[str]:
    output = dry_run(workdir, *targets, "--configfile", str(config))  # targets first
    if "Nothing to be done" in output:
        return []
    return sorted(job["rule"] for job in planned_jobs(output))


@pytest.fixture(scope="module")
def data_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("downloads")
    _sources(workdir / "src")
    config = _config(workdir, workdir / "src")
    result = snakemake(workdir, "--cores", "2", *TARGETS, "resources/ds/extracted/psgs.tsv",
                       "--configfile", str(config), timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (workdir / "console.txt").write_text(result.stdout + result.stderr)
    return workdir


def test_the_data_stage_runs(data_run):
    test = [json.loads(line) for line in (data_run / TARGETS[2]).read_text().splitlines()]
    assert len(test) == 5 and all(q["answers"] for q in test)
    # the test split's expected size (6) is not what its index selects, and the config accepts
    # it: a warning, on the console
    console = (data_run / "console.txt").read_text()
    assert "selects 5 questions, but this split should hold 6" in console
    assert "should hold 20" not in console and "should hold 5" not in console
    record = json.loads(
        (data_run / "resources/ds/downloads/checksums/index.tar.gz.json").read_text()
    )
    assert record["expected"] is None and len(record["sha256"]) == 64
    assert _planned(data_run, _config(data_run, data_run / "src"), *TARGETS) == []


def test_a_split_of_another_size_stops_the_run(data_run, tmp_path):
    """Without accept_other_size the split is refused: the job fails naming the file, both
    numbers and the key that accepts it."""
    config = _config(data_run, data_run / "src", run="r3", accept=())
    target = TARGETS[2].replace("/r1/", "/r3/")
    result = snakemake(data_run, "--cores", "1", target, "--configfile", str(config),
                       timeout=300)  # fmt: skip
    message = result.stdout + result.stderr
    assert result.returncode != 0
    assert "the split selects 5 questions, but this split should hold 6" in message
    assert "data.questions.<split>.prepare.accept_other_size" in message
    assert not (data_run / target).exists()


def test_pinning_the_recorded_digest_reruns_nothing(data_run):
    """config/nq.yaml says to pin dataindex.tar.gz's digest after the first download: doing so
    must not plan the download again, nor the extraction and splits built from it."""
    record = json.loads(
        (data_run / "resources/ds/downloads/checksums/index.tar.gz.json").read_text()
    )
    pinned = _config(data_run, data_run / "src", pin=f"sha256:{record['sha256']}")
    assert _planned(data_run, pinned, *TARGETS) == []
    # a pin that is not the file's stops the DAG before any job, naming both digests
    wrong = _config(data_run, data_run / "src", pin="sha256:" + "0" * 64)
    result = snakemake(data_run, "-n", "--cores", "1", *TARGETS, "--configfile", str(wrong))
    message = result.stdout + result.stderr
    assert result.returncode != 0
    assert "config key 'data.downloads.index.tar.gz'" in message
    assert "0" * 64 in message and record["sha256"] in message


def test_a_second_run_and_other_knobs_download_nothing(data_run):
    """Another run on the same dataset, with other download knobs, reuses the downloads and
    extractions: it plans only its own stage configs and splits."""
    second = _config(data_run, data_run / "src", run="r2", download={"timeout_s": 7, "retries": 9})
    targets = [t.replace("/r1/", "/r2/") for t in TARGETS]
    assert set(_planned(data_run, second, *targets)) == {"prepare_questions", "stage_config"}
    same_run = _config(data_run, data_run / "src", download={"timeout_s": 999, "retries": 0},
                       sizes=(20, 5, 5))  # fmt: skip
    # nor does correcting an expected split size rerun the split
    assert _planned(data_run, same_run, *TARGETS, "resources/ds/extracted/psgs.tsv") == []


def test_a_new_url_downloads_again(data_run):
    (data_run / "src" / "moved.jsonl").write_bytes(
        (data_run / "src" / "questions.jsonl").read_bytes()
    )
    moved = _config(data_run, data_run / "src",
                    urls={"questions.jsonl": f"file://{data_run / 'src' / 'moved.jsonl'}"})  # fmt: skip
    planned = _planned(data_run, moved, *TARGETS)
    assert planned.count("download") == 1 and planned.count("prepare_questions") == 3


@pytest.mark.parametrize("name", ["nq.yaml", "tqa.yaml"])
def test_data_rules_are_local_under_the_slurm_profile(tmp_path, name):
    """Compute nodes of most clusters have no internet: under profiles/slurm the downloads (and
    extractions) run where Snakemake runs, unless data.download_on_compute_nodes is true."""
    config = ROOT / "config" / name
    cfg = yaml.safe_load(config.read_text())
    target = f"results/{cfg['run']}/data/test.jsonl"  # the data stage only: a quick plan
    output = dry_run(tmp_path, "--profile", str(ROOT / "profiles" / "slurm"), "--slurm-no-account",
                     target, "--configfile", str(config))  # fmt: skip
    assert {"download", "extract"} <= {job["rule"] for job in planned_jobs(output)}
    assert {"download", "extract"} <= local_rules(tmp_path, config)
    # the plan names the hub models to fetch and what every stage will hold on disk
    rows = {stage: planned for stage, planned, _ in disk_plan(output)}
    assert {f"model {cfg['models']['reader']}", "model bert-base-uncased"} <= set(rows)
    # BM25 in bm25.shards shards (issue 48): the statistics, then the shard indexes (each with
    # the whole vocabulary) and their lists
    bm25 = f"bm25 shard indexes and lists ({cfg['bm25']['shards']})"
    assert cfg["bm25"]["shards"] > 1 and rows["bm25 statistics"] > 0
    assert rows["downloads"] > 4e9 and rows[bm25] > 8e9 and rows["iter2 index"] > 1e10
    cfg["data"]["download_on_compute_nodes"] = True
    (tmp_path / "compute.yaml").write_text(yaml.safe_dump(cfg))
    assert not {"download", "extract"} & local_rules(tmp_path, tmp_path / "compute.yaml")
