"""A sharded BM25 index (issue 48.1) returns what one index over all passages returns.

Exact, not within a tolerance: every shard's bm25s score matrix is built from the corpus-wide
N, df and average length by bm25s's own functions, so the ranked passage ids AND the float32
scores must be bit-equal to today's `build_bm25` + `search_bm25` (compared with
`np.array_equal`), on the demo world and on the held-in real sets of samples/, at 1, 3 and 8
shards, ties (many in the demo's templated texts) broken by passage row as one index breaks them.
"""

from __future__ import annotations

from pathlib import Path

import bm25s
import numpy as np
import pytest
from bm25s.tokenization import Tokenizer

from fid.cli import main
from fid.config import BM25Config, WorldConfig
from fid.data.passages import iter_passages
from fid.data.questions import load_questions
from fid.demo.files import write_world
from fid.demo.world import build_world
from fid.retrieval.bm25 import build_bm25
from fid.retrieval.bm25_analysis import _tokenizer
from fid.retrieval.bm25_merge import merge_top_k, read_shard_lists, retrieve_bm25_shard
from fid.retrieval.bm25_search import search_bm25
from fid.retrieval.bm25_shard import build_bm25_shard
from fid.retrieval.bm25_stats import count_corpus_stats, load_stats

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
SQUAD = SAMPLES / "squad-open-tiny"
DPR = SAMPLES / "dpr"
# name -> (passages, questions); "demo" is written by the fixture
REAL_SETS = {
    "squad-open-tiny": (SQUAD / "psgs_w100.tsv", SQUAD / "questions.jsonl"),
    "dpr-nq": (DPR / "psgs_w100.subset.tsv", DPR / "nq-test.qas.head300.tsv"),
    "dpr-trivia": (DPR / "psgs_w100.subset.tsv", DPR / "trivia-test.qas.head300.tsv"),
}
SHARD_COUNTS = (1, 3, 8)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory) -> Path:
    """The demo world (2,400 passages, templated texts: many equal scores)."""
    folder = tmp_path_factory.mktemp("demo")
    write_world(build_world(WorldConfig()), folder)
    return folder


def _dataset(name: str, demo_dir: Path) -> tuple[Path, Path]:
    if name == "demo":
        return demo_dir / "passages.tsv", demo_dir / "dev.jsonl"
    return REAL_SETS[name]


@pytest.fixture(scope="module")
def unsharded(tmp_path_factory, demo_dir):
    """name -> (top_k) -> today's one index: (passage ids by row, rows (Q, k), scores (Q, k))."""
    cache: dict = {}

    def get(name: str, cfg: BM25Config):
        key = (name, cfg)
        if key not in cache:
            passages, questions = _dataset(name, demo_dir)
            index = tmp_path_factory.mktemp("whole") / "index"
            build_bm25(passages, index, cfg)
            ids, rows, scores = search_bm25(index, load_questions(questions), cfg)
            cache[key] = (index, ids, np.array(rows), np.array(scores))
        return cache[key]

    return get


def _sharded(tmp: Path, passages: Path, questions: Path, cfg: BM25Config, n_shards: int):
    """The sharded pipeline as library calls: stats, each shard's build and lists, merge."""
    count_corpus_stats(passages, tmp / "stats", cfg)
    lists = []
    for k in range(1, n_shards + 1):
        build_bm25_shard(passages, tmp / f"shard{k}", cfg, tmp / "stats", k, n_shards)
        retrieve_bm25_shard(cfg, tmp / f"shard{k}", questions, tmp / f"lists{k}.npz")
        lists.append(read_shard_lists(tmp / f"lists{k}.npz"))
    n_passages = sum(s.meta["shard"]["rows"] for s in lists)
    return merge_top_k(lists, min(cfg.top_k, n_passages))


@pytest.mark.parametrize("n_shards", SHARD_COUNTS)
@pytest.mark.parametrize("name, top_k", [("demo", 100), ("demo", 7), ("squad-open-tiny", 100),
                                         ("dpr-nq", 100), ("dpr-trivia", 20)])  # fmt: skip
def test_sharded_lists_equal_one_index(name, top_k, n_shards, unsharded, demo_dir, tmp_path):
    cfg = BM25Config(top_k=top_k)
    _, ids, rows, scores = unsharded(name, cfg)
    merged_rows, merged_scores, merged_ids = _sharded(tmp_path, *_dataset(name, demo_dir), cfg,
                                                      n_shards)  # fmt: skip
    assert np.array_equal(merged_rows, rows)
    assert np.array_equal(merged_ids, ids[rows])
    assert merged_scores.dtype == scores.dtype == np.float32
    assert np.array_equal(merged_scores, scores)  # exact: no tolerance
    # the comparison means something: ties inside the lists and at their cut-off
    if name == "demo":
        assert (scores[:, 1:] == scores[:, :-1]).any()


@pytest.mark.parametrize("method", ["robertson", "atire", "bm25l", "bm25+"])
def test_every_bm25s_variant_shards_exactly(method, unsharded, demo_dir, tmp_path):
    """bm25l and bm25+ add a non-occurrence score of every query token to every passage: the
    shards take it from the global df too."""
    cfg = BM25Config(top_k=30, method=method)
    _, ids, rows, scores = unsharded("squad-open-tiny", cfg)
    merged_rows, merged_scores, _ = _sharded(tmp_path, *REAL_SETS["squad-open-tiny"], cfg, 3)
    assert np.array_equal(merged_rows, rows)
    assert np.array_equal(merged_scores, scores)


def test_each_shard_holds_its_rows_of_the_whole_score_matrix(unsharded, demo_dir, tmp_path):
    """The reason for the equality: a shard's CSC matrix is its passages' rows of the whole
    index's matrix, entry for entry (same vocabulary ids, same float32 scores)."""
    cfg = BM25Config()
    index = unsharded("dpr-nq", cfg)[0]
    whole = bm25s.BM25.load(index).scores
    columns = np.repeat(np.arange(len(whole["indptr"]) - 1), np.diff(whole["indptr"]))
    passages = REAL_SETS["dpr-nq"][0]
    count_corpus_stats(passages, tmp_path / "stats", cfg)
    first = 0
    for k in range(1, 4):
        build_bm25_shard(passages, tmp_path / f"s{k}", cfg, tmp_path / "stats", k, 3)
        shard = bm25s.BM25.load(tmp_path / f"s{k}").scores
        mine = (first <= whole["indices"]) & (whole["indices"] < first + shard["num_docs"])
        assert np.array_equal(shard["indptr"], np.concatenate([[0], np.cumsum(
            np.bincount(columns[mine], minlength=len(whole["indptr"]) - 1))]))  # fmt: skip
        assert np.array_equal(shard["indices"], whole["indices"][mine] - first)
        assert np.array_equal(shard["data"], whole["data"][mine])
        first += shard["num_docs"]
    assert first == whole["num_docs"]


@pytest.mark.parametrize("list_format", ["fid_json", "compact"])
def test_the_commands_write_retrieve_bm25s_file(list_format, demo_dir, tmp_path):
    """`fid bm25-stats`, `build-bm25 --shard`, `retrieve-bm25-shard`, `merge-bm25-lists`: the
    merged output is the file `fid retrieve-bm25` writes from one index, byte for byte."""
    passages, questions = _dataset("demo", demo_dir)
    config = tmp_path / "bm25.yaml"
    config.write_text(f"top_k: 10\nlist_format: {list_format}\n")
    run = ["--config", str(config)]
    assert main(["build-bm25", *run, "--passages", str(passages), "--output",
                 str(tmp_path / "whole")]) == 0  # fmt: skip
    assert main(["retrieve-bm25", *run, "--index", str(tmp_path / "whole"), "--passages",
                 str(passages), "--questions", str(questions), "--output",
                 str(tmp_path / "whole.out")]) == 0  # fmt: skip
    assert main(["bm25-stats", *run, "--passages", str(passages), "--output",
                 str(tmp_path / "stats")]) == 0  # fmt: skip
    for k in (1, 2, 3):
        assert main(["build-bm25", *run, "--passages", str(passages), "--shard", f"{k}/3",
                     "--stats", str(tmp_path / "stats"), "--output",
                     str(tmp_path / f"shard{k}")]) == 0  # fmt: skip
        assert main(["retrieve-bm25-shard", *run, "--index", str(tmp_path / f"shard{k}"),
                     "--questions", str(questions), "--output",
                     str(tmp_path / f"lists{k}.npz")]) == 0  # fmt: skip
    assert main(["merge-bm25-lists", *run, "--stats", str(tmp_path / "stats"), "--shard-lists",
                 *(str(tmp_path / f"lists{k}.npz") for k in (3, 1, 2)), "--passages",
                 str(passages), "--questions", str(questions), "--output",
                 str(tmp_path / "merged.out")]) == 0  # fmt: skip
    assert (tmp_path / "merged.out").read_bytes() == (tmp_path / "whole.out").read_bytes()


def test_the_corpus_is_tokenized_once(demo_dir, tmp_path, monkeypatch):
    """bm25-stats keeps every passage's token ids (the ids of one tokenization of the whole
    file); a shard build reads its rows of them and tokenizes nothing (issue 48: tokenizing
    twice made sharding cost 1.4x one index's CPU)."""
    passages, _ = _dataset("demo", demo_dir)
    cfg = BM25Config()
    count_corpus_stats(passages, tmp_path / "stats", cfg)
    stats = load_stats(tmp_path / "stats", cfg)
    tokenizer = _tokenizer(stats.meta["analysis"])
    texts = [f"{p.title} {p.text}" for p in iter_passages(passages)]
    expected = list(tokenizer.streaming_tokenize(texts, update_vocab=True, allow_empty=True))
    assert tokenizer.get_vocab_dict() == stats.vocabulary
    for first, rows in [(0, len(texts)), (100, 7)]:
        flat, offsets, pairs = stats.passage_tokens(first, rows)
        assert [ids.tolist() for ids in np.split(flat, offsets[1:-1])] == expected[
            first : first + rows
        ]
        assert pairs == sum(len(set(ids)) for ids in expected[first : first + rows])

    def no_tokenizing(*args, **kwargs):
        raise AssertionError("a shard build tokenized passages")

    monkeypatch.setattr(Tokenizer, "streaming_tokenize", no_tokenizing)
    monkeypatch.setattr(Tokenizer, "tokenize", no_tokenizing)
    for k in (1, 2, 3):
        build_bm25_shard(passages, tmp_path / f"shard{k}", cfg, tmp_path / "stats", k, 3)


def test_the_merge_folds_one_shard_at_a_time(monkeypatch):
    """merge_top_k takes the shards one at a time (merge-bm25-lists reads each when its turn
    comes, so it holds two shards' lists, not S) and gives what sorting all at once gives,
    ties (equal scores, many here) by row."""
    from fid.retrieval.bm25_merge import ShardLists

    rng, k, q = np.random.default_rng(0), 7, 50
    shards = []
    for i, size in enumerate([7, 3, 7, 7, 5]):  # a shard may hold fewer than k passages
        own = np.tile(np.arange(i * 100, (i + 1) * 100), (q, 1))  # the shard's rows
        rows = rng.permuted(own, axis=1)[:, :size]  # distinct rows a question
        scores = rng.integers(0, 4, (q, size)).astype(np.float32)  # few values: ties
        order = np.lexsort((rows, -scores), axis=-1)  # a shard's lists: best first, by row
        rows, scores = (np.take_along_axis(a, order, axis=1) for a in (rows, scores))
        shards.append(ShardLists(Path(str(i)), {}, np.arange(q).astype(str), rows, scores,
                                 rows.astype(str)))  # fmt: skip
    read, folds, lexsort = [], [], np.lexsort

    def one_at_a_time():
        for shard in shards:
            read.append(shard)
            yield shard

    def counted(*args, **kwargs):
        folds.append(len(read))  # shards read when this fold sorts
        return lexsort(*args, **kwargs)

    monkeypatch.setattr(np, "lexsort", counted)
    rows, scores, ids = merge_top_k(one_at_a_time(), k)
    assert folds == [1, 2, 3, 4, 5]
    everything = [np.concatenate([getattr(s, a) for s in shards], axis=1)
                  for a in ("rows", "scores")]  # fmt: skip
    order = lexsort((everything[0], -everything[1]), axis=-1)[:, :k]
    assert np.array_equal(rows, np.take_along_axis(everything[0], order, axis=1))
    assert np.array_equal(scores, np.take_along_axis(everything[1], order, axis=1))
    assert np.array_equal(ids, rows.astype(str))
