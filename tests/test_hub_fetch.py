"""`fid fetch-model` against a loopback hub (tests/loopback_hub.py): what fid reads of a model
at one commit, recorded; a pinned revision; the local cache when the hub is out of reach; one
clear error for an unknown model, a model without safetensors, and no hub nor cache. A folder
fetched so loads with the network gone (HF_HUB_OFFLINE=1, the hub shut)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest
from loopback_hub import LoopbackHub

from fid.cli import main
from fid.models.hub_fetch import RECORD, fetchable


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """A loopback hub holding the tiny reader as `org/tiny-t5` (with a pytorch_model.bin and an
    onnx/ file that fid does not read); HF_ENDPOINT points at it, the cache is empty."""
    server = LoopbackHub()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    # huggingface_hub reads these when it is imported: set them where it keeps them
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", server.url)
    template = server.url + "/{repo_id}/resolve/{revision}/{filename}"  # (made at import)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    yield server
    server.close()


@pytest.fixture
def tiny_repo(hub, tiny_model_dir):
    files = {p.name: p.read_bytes() for p in tiny_model_dir.iterdir() if p.is_file()}
    files["pytorch_model.bin"] = b"not read by fid"
    files["onnx/model.json"] = b"{}"
    return hub.add("org/tiny-t5", files), files


def _fetch(output, *flags) -> int:
    return main(["fetch-model", "--name", "org/tiny-t5", "--output", str(output), *flags])


def test_fetches_config_weights_and_tokenizer_at_one_commit(hub, tiny_repo, tmp_path):
    sha, files = tiny_repo
    out = tmp_path / "models" / "org--tiny-t5"
    assert _fetch(out) == 0
    record = json.loads((out / RECORD).read_text())
    assert record["name"] == "org/tiny-t5" and record["commit"] == sha
    kept = sorted(f for f in files if "/" not in f and f != "pytorch_model.bin")
    assert sorted(record["files"]) == kept
    assert sorted(p.name for p in out.iterdir()) == sorted([*kept, RECORD])
    for name in kept:
        assert record["files"][name]["sha256"] == hashlib.sha256(files[name]).hexdigest()


def test_a_pinned_revision_is_what_is_fetched(hub, tiny_repo, tmp_path, tiny_model_dir):
    first, _ = tiny_repo
    changed = {p.name: p.read_bytes() for p in tiny_model_dir.iterdir() if p.is_file()}
    changed["config.json"] = changed["config.json"].replace(b"{", b'{"note": "v2", ', 1)
    second = hub.add("org/tiny-t5", changed)
    assert _fetch(tmp_path / "pinned", "--revision", first) == 0
    assert json.loads((tmp_path / "pinned" / RECORD).read_text())["commit"] == first
    assert b"v2" not in (tmp_path / "pinned" / "config.json").read_bytes()
    assert _fetch(tmp_path / "newest") == 0
    assert json.loads((tmp_path / "newest" / RECORD).read_text())["commit"] == second


def test_the_local_cache_serves_when_the_hub_cannot_be_reached(hub, tiny_repo, tmp_path,
                                                               monkeypatch):  # fmt: skip
    """A login node that lost its network, with the model downloaded before: the cache's
    snapshot is copied, recorded as such."""
    from huggingface_hub import constants, snapshot_download

    sha, _ = tiny_repo
    snapshot_download("org/tiny-t5")  # into the (test's) cache
    hub.close()
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens
    assert fetchable("org/tiny-t5") is None
    assert _fetch(tmp_path / "from-cache") == 0
    record = json.loads((tmp_path / "from-cache" / RECORD).read_text())
    assert record["commit"] == sha and record["source"].startswith("local cache")


def test_no_hub_and_no_cache_names_the_command(hub, tmp_path, monkeypatch, caplog):
    from huggingface_hub import constants

    hub.close()
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    said = fetchable("org/tiny-t5")
    assert "fid fetch-model --name org/tiny-t5 --output resources/models/org--tiny-t5" in said
    assert _fetch(tmp_path / "m") == 1 and not (tmp_path / "m").exists()
    assert "cannot be reached" in caplog.text


def test_an_unknown_model_or_one_without_safetensors(hub, tmp_path, caplog, tiny_model_dir):
    assert main(["fetch-model", "--name", "org/nothing", "--output", str(tmp_path / "a")]) == 1
    assert "'org/nothing': no such model" in caplog.text
    hub.add("org/bin-only", {"config.json": (tiny_model_dir / "config.json").read_bytes(),
                             "pytorch_model.bin": b"weights"})  # fmt: skip
    caplog.clear()
    assert main(["fetch-model", "--name", "org/bin-only", "--output", str(tmp_path / "b")]) == 1
    assert "has no safetensors weights" in caplog.text
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_fetched_folder_loads_with_no_network(hub, tiny_repo, tmp_path, toy_records):
    """The job's side: the hub gone and HF_HUB_OFFLINE=1, `fid eval-reader` on the fetched
    folder runs and asks nothing of any network."""
    out = tmp_path / "models" / "org--tiny-t5"
    assert _fetch(out) == 0
    hub.close()
    questions = tmp_path / "q.json"
    questions.write_text(json.dumps(toy_records["dev"][:2]))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    result = subprocess.run(
        [sys.executable, "-m", "fid", "--threads", "1", "eval-reader", "--model", str(out),
         "--questions", str(questions), "--predictions", str(tmp_path / "p.jsonl"),
         "--metrics", str(tmp_path / "m.json")],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "m.json").read_text())["n_questions"] == 2


def test_the_workflow_takes_its_jobs_offline(monkeypatch):
    """What rules/common.smk calls: every job the process starts inherits HF_HUB_OFFLINE=1;
    the setting it was started with is returned (for the fetch alone)."""
    from fid.models.hub_fetch import take_jobs_offline

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert take_jobs_offline() == "0" and os.environ["HF_HUB_OFFLINE"] == "1"
    child = subprocess.run([sys.executable, "-c", "import os; print(os.environ['HF_HUB_OFFLINE'])"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert child.stdout.strip() == "1"
    assert take_jobs_offline() == "1"  # a job step that reads the Snakefile again
