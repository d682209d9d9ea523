"""`fid ask` and `fid serve` on a run whose system reads BM25's lists (round 0 of a run with
`first_retrieval: bm25`): the question is searched in the run's BM25 index, whole or sharded
(fid.retrieval.bm25_searcher), and reads the passages, order and float32 scores of the lists
`fid retrieve-bm25` wrote for it, which the report scored the reader on."""

from __future__ import annotations

import shutil
from pathlib import Path

import huggingface_hub.constants
import pytest
from tiny_run import assert_asks_as_listed, write_tiny_run

from fid.cli import main
from fid.errors import DataError
from fid.evaluation.run_folder import run_paths

SHARDS = 3


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def _fid(*args) -> None:
    assert main([*map(str, args)]) == 0, args


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir, toy_world) -> dict[str, Path]:
    """{"whole": a run with bm25/index, "sharded": the same run with bm25/shards/<k>/index},
    both with first_retrieval bm25, and BM25's dev lists as `fid retrieve-bm25` writes them."""
    whole = write_tiny_run(tmp_path_factory.mktemp("bm25_run"), tiny_model_dir, toy_world)
    (whole / "report").mkdir()
    (whole / "report/config.yaml").write_text("first_retrieval: bm25\n")
    (whole / "config/bm25.yaml").write_text("top_k: 10\n")
    passages = whole / "data/demo/world/passages.tsv"
    _fid("build-bm25", "--config", whole / "config/bm25.yaml", "--passages", passages,
         "--output", whole / "bm25/index")  # fmt: skip
    _fid("retrieve-bm25", "--config", whole / "config/bm25.yaml", "--index", whole / "bm25/index",
         "--passages", passages, "--questions", whole / "data/demo/world/dev.jsonl",
         "--output", whole / "bm25/retrieval/dev.json")  # fmt: skip
    sharded = whole.parent.parent / "sharded" / "results" / "demo"
    shutil.copytree(whole, sharded)
    shutil.rmtree(sharded / "bm25/index")
    passages = sharded / "data/demo/world/passages.tsv"
    _fid("bm25-stats", "--config", sharded / "config/bm25.yaml", "--passages", passages,
         "--output", sharded / "bm25/stats")  # fmt: skip
    for k in range(1, SHARDS + 1):
        _fid("build-bm25", "--config", sharded / "config/bm25.yaml", "--passages", passages,
             "--shard", f"{k}/{SHARDS}", "--stats", sharded / "bm25/stats",
             "--output", sharded / f"bm25/shards/{k}/index")  # fmt: skip
    return {"whole": whole, "sharded": sharded}


@pytest.mark.parametrize("layout", ["whole", "sharded"])
def test_round_0_asks_bm25_as_its_lists_ranked(runs, layout, toy_world, capsys, caplog):
    questions = [example.question for example in toy_world.splits["dev"]]
    # float32 scores, as the lists hold them
    assert_asks_as_listed(runs[layout], runs["whole"] / "bm25/retrieval/dev.json", questions,
                          capsys, rel=1e-6)  # fmt: skip
    assert "retriever none (BM25)" in caplog.text
    assert "reading the top 3 passages of the first retrieval, bm25" in caplog.text


def test_shards_of_two_indexes_are_refused(runs, tmp_path):
    """A shard folder of another sharded index (another statistics fingerprint, or a shard
    missing) is one error, before any model loads."""
    copy = tmp_path / "results" / "demo"
    shutil.copytree(runs["sharded"], copy)
    shutil.rmtree(copy / "bm25/shards/2")
    paths = run_paths(copy, 0, reader=None, retriever=None, index=None, passages=None)
    assert [p.parent.name for p in paths.bm25] == ["1", "3"]
    from fid.config import BM25Config
    from fid.retrieval.bm25_searcher import BM25Searcher

    with pytest.raises(DataError, match=r"expected the 3 shards of one BM25 index.*\[1, 3\]"):
        BM25Searcher(list(paths.bm25), BM25Config(top_k=10))
