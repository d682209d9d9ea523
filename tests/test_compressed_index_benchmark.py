"""benchmarks/retrieval/compressed_index.py's honest distractors (--distractors near / below): on a small
world, Flat ranks an answer first for every question asked, so a compressed search can only
lose to it, and the near copies make it lose some."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import faiss
import numpy as np
import pytest

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "retrieval" / "compressed_index.py"


@pytest.fixture(scope="module")
def bench():
    # importing the benchmark pins one thread and offline mode in os.environ and puts
    # the repository root first on sys.path (for its own runs): keep both from the other tests
    saved_environ, saved_path = dict(os.environ), list(sys.path)
    try:
        spec = importlib.util.spec_from_file_location("compressed_index", BENCHMARK)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
    finally:
        os.environ.clear()
        os.environ.update(saved_environ)
        sys.path[:] = saved_path
    return module


def _world(n_real=40, d=16, questions_per_passage=2):
    """Unit passage vectors, noisy questions about them, and each question's answer row."""
    rng = np.random.default_rng(0)
    real = rng.standard_normal((n_real, d)).astype(np.float32)
    real /= np.linalg.norm(real, axis=1, keepdims=True)
    rows = np.arange(n_real * questions_per_passage) % n_real
    queries = real[rows] + 0.4 * rng.standard_normal((len(rows), d)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return real, queries, [[int(r)] for r in rows]


def test_near_copies_keep_flat_first_and_compression_can_only_lose(bench):
    real, queries, answers = _world()
    pool, _ = bench._near_copies(real, 8000, 0.3)
    real16, pool16 = real.astype(np.float16), pool.astype(np.float16)  # as the shards store them
    asked, answer_scores = bench._answered_first(real16, queries, answers)
    kept, near = bench._below_answers(pool16, queries[asked], answer_scores[asked], 2000)
    assert 0 < asked.sum() < len(asked)  # a question whose best passage is another is not asked
    assert len(kept) == 2000
    assert near[0].sum() > 0  # copies within 1% of an answer's score: the set is not trivial

    corpus = np.concatenate([real16, pool16[kept]]).astype(np.float32)
    questions = queries[asked]
    asked_answers = [a for a, keep in zip(answers, asked, strict=True) if keep]
    flat = faiss.IndexFlatIP(corpus.shape[1])
    flat.add(corpus)
    _, flat_top = flat.search(questions, 1)
    assert all(t in a for t, a in zip(flat_top[:, 0], asked_answers, strict=True))

    compressed = faiss.index_factory(corpus.shape[1], "IVF8,PQ4x4", faiss.METRIC_INNER_PRODUCT)
    compressed.train(corpus)
    compressed.add(corpus)
    compressed.nprobe = 2
    _, top = compressed.search(questions, 5)
    hits = np.array([bool(set(t) & set(a)) for t, a in zip(top, asked_answers, strict=True)])
    assert 0 < hits.mean() < 1  # it loses some of Flat's hits (and can gain none: Flat has all)


def test_questions_whose_runner_up_is_too_close_are_not_asked(bench):
    real = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    queries = np.array([[1.0, 0.5], [1.0, 1.0 - 1e-6]], np.float32)
    asked, scores = bench._answered_first(real, queries, [[0], [0]])
    assert asked.tolist() == [True, False]  # 1e-6 of the score apart: rounding could swap them
    assert scores[0] == pytest.approx(1.0)


def test_the_21m_state_of_residual_refinements_counts_their_codes(bench):
    """The extrapolation to 21M counts a refine_residual's codes with the base's and the id:
    a budget scales with d (the same bits a dimension), stages' sub-quantizers too."""
    assert bench._analogue("IVF1024,PQ32 +res(144 B)", 256, 256) == (
        "IVF16384,PQ32 +res(144 B)",
        32 + 8 + 144,
    )
    assert bench._analogue("IVF1024,PQ32 +res(150 B)", 768, 384) == (
        "IVF16384,PQ64 +res(300 B)",
        64 + 8 + 300,
    )
    assert bench._analogue("IVF1024,PQ16 +res(PQ128x10)", 256, 256) == (
        "IVF16384,PQ16 +res(PQ128x10)",
        16 + 8 + 160,
    )
    assert bench._analogue("IVF1024,PQ32 +res(PQ128+PQ16)", 768, 256)[1] == 96 + 8 + 384 + 48
    choice = bench._choices(256)["res_budget"]
    assert (choice.factory, choice.refine_residual) == ("IVF1024,PQ32", 144)
    assert choice.label == "IVF1024,PQ32 +res(144 B)"


@pytest.mark.parametrize("factory", ["IVF8,PQ4", "OPQ4_16,IVF8,PQ4"])
def test_an_index_repeated_to_scale_searches_as_its_copies(bench, tmp_path, factory):
    """--repeat-to: the copy holds every passage's codes (and refinement codes) 3 times, loads
    through fid's own path, and each result of the small index comes back 3 times with the same
    score and id; an on-disk re-rank is refused (its cold reads need the whole file)."""
    from fid.config import IndexConfig
    from fid.retrieval.index import PassageIndex
    from fid.retrieval.index_build import build_passage_index

    real, queries, _ = _world(n_real=400)
    ids = [f"p{i}" for i in range(400)]
    cfg = IndexConfig(factory, nprobe=8, train_sample=400, shortlist=60, refine_residual=16)
    build_passage_index(real, ids, cfg, "tiny").save(tmp_path / "index")
    repeated = bench.repeat_index(tmp_path / "index", 3)
    small, big = PassageIndex.load(tmp_path / "index"), PassageIndex.load(repeated)
    assert big.index.ntotal == len(big.ids) == 1200 and big.refinement.codes.shape[0] == 1200
    scores, ranked = small.search_rows(queries[:5], 4)
    big_scores, big_ranked = big.search_rows(queries[:5], 12)
    np.testing.assert_allclose(big_scores, np.repeat(scores, 3, axis=1), rtol=1e-5)
    assert set(big_ranked.rows[0] % 400) == set(ranked.rows[0])
    np.testing.assert_array_equal(
        big.ids[big_ranked.rows], np.repeat(small.ids[ranked.rows], 3, axis=1)
    )

    build_passage_index(real, ids, IndexConfig("IVF8,PQ4", train_sample=400, rerank=True),
                        "tiny").save(tmp_path / "reranked")  # fmt: skip
    with pytest.raises(ValueError, match="an on-disk re-rank"):
        bench.repeat_index(tmp_path / "reranked", 3)
