"""Hub models under the workflow: fetched once by the local rule fetch_model (where Snakemake
runs: the login node of a cluster), recorded with their commit, and read by every job from
that folder with no network; a model that cannot be fetched stops the run before any job,
naming the command that fetches it elsewhere. The hub is a loopback one (tests/loopback_hub.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from workflow_helpers import ROOT, snakemake, write_config

sys.path.insert(0, str(ROOT / "tests"))
from loopback_hub import LoopbackHub  # noqa: E402

from fid.cli import main  # noqa: E402

TINY = ROOT / "tests" / "workflow" / "config.yaml"
NAME = "org/tiny-t5"
FOLDER = "resources/models/org--tiny-t5"
READER = "results/tiny/iter0/reader/model"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The loopback hub with `org/tiny-t5`: a tiny reader whose tokenizer learnt the tiny
    config's demo world (made here as the workflow makes it)."""
    tmp = tmp_path_factory.mktemp("hub_model")
    knobs = yaml.safe_load(TINY.read_text())
    (tmp / "world.yaml").write_text(yaml.safe_dump(knobs["demo_data"]))
    (tmp / "init.yaml").write_text(yaml.safe_dump(knobs["init_reader"]))
    assert main(["make-demo-data", "--config", str(tmp / "world.yaml"),
                 "--output", str(tmp / "world")]) == 0  # fmt: skip
    assert main(["init-reader", "--config", str(tmp / "init.yaml"), "--corpus",
                 str(tmp / "world" / "passages.tsv"), "--output", str(tmp / "reader")]) == 0  # fmt: skip
    server = LoopbackHub()
    server.sha = server.add_folder(NAME, tmp / "reader")
    yield server
    server.close()


def _config(workdir: Path) -> Path:
    return write_config(workdir / "c.yaml", TINY, rounds=1,
                        models={"reader": NAME, "retriever": "init", "continue": True})  # fmt: skip


def _online(hub: LoopbackHub, workdir: Path) -> dict:
    """The environment of a login node that reaches the (loopback) hub."""
    return {"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": None, "HF_HOME": str(workdir / "hf")}


def test_fetched_once_then_read_offline(hub, tmp_path):
    """The fetch (a local rule) brings the model at its commit, recorded in the run; the
    training jobs read that folder and ask the hub nothing."""
    config = _config(tmp_path)
    result = snakemake(tmp_path, "--cores", "2", FOLDER, "results/tiny/report/config.yaml",
                       "--configfile", str(config), env=_online(hub, tmp_path), timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = json.loads((tmp_path / FOLDER / "fetched.json").read_text())
    assert record["name"] == NAME and record["commit"] == hub.sha
    ran = yaml.safe_load((tmp_path / "results/tiny/report/config.yaml").read_text())
    assert ran["fetched_models"][NAME]["commit"] == hub.sha  # recorded in the run
    # the training jobs, the hub still reachable and HF_HUB_OFFLINE unset where Snakemake
    # runs: they ask the hub nothing (every job inherits HF_HUB_OFFLINE=1)
    asked = len(hub.requests)
    result = snakemake(tmp_path, "--cores", "2", READER, "--configfile", str(config),
                       env=_online(hub, tmp_path), timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "rule fetch_model" not in result.stdout + result.stderr
    assert hub.requests[asked:] == []
    # the first training started from the fetched folder (its state's record of the start
    # model lists the folder's files, fetched.json among them)
    (state,) = (tmp_path / "state/tiny/iter0/reader_warmup").glob("*/state.json")
    assert "fetched.json" in json.loads(state.read_text())["init_model"]["files"]
    assert "fetched org/tiny-t5 at" in (tmp_path / "logs/fetch_model/org--tiny-t5.log").read_text()


def test_a_model_that_cannot_be_fetched_stops_the_run_before_any_job(tmp_path):
    """No hub (offline) and nothing cached: a dry run warns; a run stops before its first job,
    naming the model and the command that fetches it elsewhere."""
    config = _config(tmp_path)
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    result = snakemake(tmp_path, "-n", "--cores", "1", READER, "--configfile", str(config),
                       env=env)  # fmt: skip
    said = result.stdout + result.stderr
    assert result.returncode == 0 and "a run would stop here" in said, said[-3000:]
    result = snakemake(tmp_path, "--cores", "1", READER, "--configfile", str(config), env=env)
    said = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"fid fetch-model --name {NAME} --output {FOLDER}" in said, said[-3000:]
    assert not (tmp_path / "results").exists() and not (tmp_path / "resources").exists()
