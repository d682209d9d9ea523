"""BM25 on a real open-domain set (squad-open-tiny), and retrieval top-k accuracy."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from fid.config import BM25Config, ConfigError
from fid.data.passages import load_passages
from fid.data.questions import load_questions
from fid.errors import DataError
from fid.metrics.has_answer import has_answer
from fid.metrics.retrieval import topk_accuracy
from fid.retrieval.bm25 import build_bm25, rank_bm25

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
SQUAD = SAMPLES / "squad-open-tiny"
PASSAGES = SQUAD / "psgs_w100.tsv"

logger = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("bm25") / "index"
    build_bm25(PASSAGES, path, BM25Config())
    return path


@pytest.fixture(scope="module")
def questions():
    return load_questions(SQUAD / "questions.jsonl")


@pytest.fixture(scope="module")
def records(index_dir, questions):
    return rank_bm25(index_dir, PASSAGES, questions, BM25Config(top_k=100))


def hits(records):
    return [[ctx["has_answer"] for ctx in record["ctxs"]] for record in records]


@pytest.mark.parametrize(
    "table, ks, expected",
    [
        ([[True, False], [False, True], [False, False], [False]], [1, 2, 5], {1: 25, 2: 50, 5: 50}),
        ([[False, False, True]], [1, 3], {1: 0, 3: 100}),
        ([[], [True]], [1, 100], {1: 50, 100: 50}),  # few passages count with what they have
    ],
)
def test_topk_accuracy(table, ks, expected):
    assert topk_accuracy(table, ks) == pytest.approx(expected)


def test_topk_accuracy_rejects_bad_input():
    with pytest.raises(ValueError, match="no questions to score"):
        topk_accuracy([], [1])
    with pytest.raises(ValueError, match=">= 1"):
        topk_accuracy([[True]], [0])


def test_index_folder(index_dir):
    meta = json.loads((index_dir / "meta.json").read_text())
    assert meta["n_passages"] == 167
    assert (meta["k1"], meta["b"], meta["method"]) == (0.9, 0.4, "lucene")
    # Anserini/Pyserini's analysis: Lucene's tokens and stopwords, Porter stems
    assert (meta["token_pattern"], meta["stopwords"], meta["stemmer"]) == (
        r"(?u)\b\w+\b",
        "lucene",
        "porter",
    )
    assert meta["source"] == str(PASSAGES) and meta["bm25s_version"]
    ids = np.load(index_dir / "passage_ids.npy", allow_pickle=False)
    assert ids.tolist() == list(load_passages(PASSAGES))


def test_records_are_fid_format(records, questions):
    passages = load_passages(PASSAGES)
    assert [r["id"] for r in records] == [q["id"] for q in questions]
    for record, question in zip(records, questions, strict=True):
        assert record["question"] == question["question"]
        assert record["answers"] == question["answers"]
        assert len(record["ctxs"]) == 100
        scores = [ctx["score"] for ctx in record["ctxs"]]
        assert scores == sorted(scores, reverse=True)
        assert len({ctx["id"] for ctx in record["ctxs"]}) == 100
    for ctx in records[0]["ctxs"][:5]:
        passage = passages[ctx["id"]]
        assert (ctx["title"], ctx["text"]) == (passage.title, passage.text)
        assert ctx["has_answer"] == has_answer(records[0]["answers"], passage.text)
    assert records[0]["ctxs"][0]["score"] > records[0]["ctxs"][-1]["score"]


def test_accuracy_on_squad_open_tiny(records):
    accuracy = topk_accuracy(hits(records), [1, 5, 20, 100])
    logger.info("BM25 top-k accuracy on squad-open-tiny: %s", accuracy)
    assert accuracy[20] >= 90.0
    assert accuracy[1] <= accuracy[5] <= accuracy[20] <= accuracy[100]


def test_reloaded_and_rebuilt_index_give_identical_results(index_dir, questions, records, tmp_path):
    cfg = BM25Config(top_k=100)
    assert rank_bm25(index_dir, PASSAGES, questions, cfg) == records
    rebuilt = tmp_path / "rebuilt"
    build_bm25(PASSAGES, rebuilt, BM25Config())
    assert rank_bm25(rebuilt, PASSAGES, questions, cfg) == records


def test_a_second_question_file_reuses_the_index(index_dir, questions, records, tmp_path):
    before = {p.name: p.stat().st_mtime_ns for p in index_dir.iterdir()}
    subset = [{"id": f"other-{i}", **q} for i, q in enumerate(questions[10:15])]
    for q in subset:
        q["id"] = q["id"].replace("questions", "other")
    path = tmp_path / "other.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in subset))
    other = rank_bm25(index_dir, PASSAGES, load_questions(path), BM25Config(top_k=20))
    assert [r["ctxs"] for r in other] == [r["ctxs"][:20] for r in records[10:15]]
    assert {p.name: p.stat().st_mtime_ns for p in index_dir.iterdir()} == before


def test_unlabeled_and_empty_questions(index_dir):
    questions = [
        {"id": "u1", "question": "Who won Super Bowl 50?"},
        {"id": "u2", "question": "the of and", "answers": []},  # only stopwords: no tokens
        {"id": "u3", "question": "zyxwvut qqqq"},  # no token in the vocabulary
    ]
    records = rank_bm25(index_dir, PASSAGES, questions, BM25Config(top_k=5))
    assert [len(r["ctxs"]) for r in records] == [5, 5, 5]
    assert all(r["answers"] == [] for r in records)
    assert not any(ctx["has_answer"] for r in records for ctx in r["ctxs"])
    assert records[0]["ctxs"][0]["score"] > 0
    assert records[2]["ctxs"][0]["score"] == 0


def test_top_k_beyond_the_corpus_and_no_questions(index_dir, questions):
    records = rank_bm25(index_dir, PASSAGES, questions[:2], BM25Config(top_k=1000))
    assert [len(r["ctxs"]) for r in records] == [167, 167]
    assert rank_bm25(index_dir, PASSAGES, [], BM25Config()) == []


def test_config_must_match_the_index(index_dir, questions):
    with pytest.raises(ConfigError, match="k1 = 1.2, but the BM25 index .* k1 = 0.9"):
        rank_bm25(index_dir, PASSAGES, questions[:1], BM25Config(k1=1.2))
    with pytest.raises(ConfigError, match="stopwords"):
        rank_bm25(index_dir, PASSAGES, questions[:1], BM25Config(stopwords=None))
    with pytest.raises(ConfigError, match="stemmer = None, but the BM25 index .* 'porter'"):
        rank_bm25(index_dir, PASSAGES, questions[:1], BM25Config(stemmer=None))


def test_analysis_stems_keeps_short_tokens_and_drops_lucene_stopwords(tmp_path):
    passages = tmp_path / "p.tsv"
    passages.write_text(
        "id\ttext\ttitle\n1\tThe runners were running in the city\tA\n"
        "2\tVitamin C is found in oranges\tB\n3\tnothing to see here at all\tC\n"
    )
    build_bm25(passages, tmp_path / "index", BM25Config())
    questions = [
        {"id": "q1", "question": "who runs in cities?"},  # Porter: runs/running -> run
        {"id": "q2", "question": "where is vitamin c"},  # "c" is a token of its own
        {"id": "q3", "question": "the and is"},  # Lucene stopwords only
    ]
    records = rank_bm25(tmp_path / "index", passages, questions, BM25Config(top_k=1))
    assert [r["ctxs"][0]["id"] for r in records[:2]] == ["1", "2"]
    assert records[2]["ctxs"][0]["score"] == 0


def test_an_index_of_fid_0_1_reads_its_stemmer(index_dir, questions, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(index_dir, old)
    meta = json.loads((old / "meta.json").read_text())
    meta["stemmer"] = "porter (PyStemmer 2.2.0)"  # how fid 0.1 recorded it
    (old / "meta.json").write_text(json.dumps(meta))
    assert rank_bm25(old, PASSAGES, questions[:3], BM25Config()) == rank_bm25(
        index_dir, PASSAGES, questions[:3], BM25Config()
    )


@pytest.mark.parametrize(
    "key, value, allowed",
    [
        ("k1", -0.1, ">= 0.0"),
        ("b", 1.5, "<= 1.0"),
        ("b", "0.4", "not a number"),
        ("method", "bm26", "robertson"),
        ("stopwords", "klingon", "en"),
        ("token_pattern", "(", "no regular expression"),
        ("token_pattern", "\\w*", "matches the empty string"),
        ("top_k", 0, "integer >= 1"),
        ("batch_size", 2.5, "integer >= 1"),
    ],
)
def test_config_validation(key, value, allowed):
    with pytest.raises(ConfigError, match=f"{key} = .*{allowed}"):
        BM25Config(**{key: value})


def test_wrong_passage_file_or_index(index_dir, questions, tmp_path):
    other = tmp_path / "other.tsv"
    other.write_text("id\ttext\ttitle\n1\tSuper Bowl 50\tA\nx2\tDenver Broncos\tB\n")
    with pytest.raises(DataError, match="passage 1 .* has id 'x2', but the BM25 index has '2'"):
        rank_bm25(index_dir, other, questions, BM25Config())
    with pytest.raises(DataError, match="not a BM25 index"):
        rank_bm25(tmp_path, PASSAGES, questions, BM25Config())


def test_failed_build_leaves_the_old_index(index_dir, tmp_path):
    target = tmp_path / "index"
    shutil.copytree(index_dir, target)
    bad = tmp_path / "bad.tsv"
    bad.write_text("id\ttext\ttitle\n1\tone\tA\n1\tagain\tB\n")
    with pytest.raises(DataError, match="duplicate id '1'"):
        build_bm25(bad, target, BM25Config())
    assert sorted(p.name for p in target.iterdir()) == sorted(p.name for p in index_dir.iterdir())
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    with pytest.raises(DataError, match="no passages"):
        build_bm25(_header_only(tmp_path), tmp_path / "empty", BM25Config())
    assert not (tmp_path / "empty").exists()


def _header_only(tmp_path: Path) -> Path:
    path = tmp_path / "header.tsv"
    path.write_text("id\ttext\ttitle\n")
    return path


@pytest.mark.parametrize("k", [1, 5, 37, 200, 500])
def test_top_k_is_the_sort_by_score_then_row(k):
    from fid.retrieval.bm25_search import top_k

    rng = np.random.default_rng(k)
    scores = rng.integers(0, 6, size=200).astype(np.float32)  # many ties, many zeros
    rows, values = top_k(scores, k)
    expected = sorted(range(200), key=lambda r: (-scores[r], r))[:k]
    assert rows.tolist() == expected
    assert values.tolist() == scores[expected].tolist()
