"""The BM25 search of a saved index folder: each question's top k passage rows and their
float32 scores, ties by row number (`top_k`). Questions are analysed as the index's passages
were (fid.retrieval.bm25_analysis); the folder's meta.json and the config are checked first
(fid.retrieval.bm25_folder). What the rows become (FiD records, compact lists, a shard's
lists) is the caller's: fid.retrieval.bm25 and bm25_merge.
"""

from __future__ import annotations

import logging
from pathlib import Path

import bm25s
import numpy as np

from fid.config import BM25Config
from fid.retrieval.bm25_analysis import _query_tokens
from fid.retrieval.bm25_folder import (
    _IDS,
    INDEX_FORMAT,
    SHARD_INDEX_FORMAT,
    _check_index_matches,
    _load_meta,
)
from fid.runtime.progress import progress

logger = logging.getLogger(__name__)


def search_bm25(
    index_dir: str | Path, questions: list[dict], cfg: BM25Config, shard: bool = False
) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """The BM25 search alone: (the index's passage ids by row, each question's top rows best
    first, their scores). Raises as fid.retrieval.bm25.rank_bm25. `shard`: the index is one
    shard of a sharded index (rows are the shard's; any other index is refused), else a whole
    one."""
    index_dir = Path(index_dir)
    meta = _load_meta(index_dir, SHARD_INDEX_FORMAT if shard else INDEX_FORMAT)
    _check_index_matches(meta, cfg, index_dir)
    for position, question in enumerate(questions):
        if not isinstance(question.get("question"), str) or "id" not in question:
            raise ValueError(
                f"question {position} needs an 'id' and a 'question' string: {question!r:.100}"
            )
    retriever = bm25s.BM25.load(index_dir, mmap=True, show_progress=False)
    ids = np.load(index_dir / _IDS, allow_pickle=False)
    k = min(cfg.top_k, len(ids))
    rows: list[np.ndarray] = []  # (Q, k) passage row numbers, best first
    scores: list[np.ndarray] = []  # (Q, k)
    bar = progress(desc="BM25 search", unit="questions", total=len(questions), log=logger)
    for start in range(0, len(questions), cfg.batch_size):
        batch = questions[start : start + cfg.batch_size]
        for tokens in _query_tokens([q["question"] for q in batch], meta):
            # (N,) every passage's score; bm25s's own top-k partitions the raw scores, which
            # is ~30x slower than on their negation when most are 0 (57 vs 1.8 ms at 210k
            # passages: minutes per thousand questions at 21M), and orders ties arbitrarily.
            top, top_scores = top_k(query_scores(retriever, tokens, len(ids)), k)
            rows.append(top)
            scores.append(top_scores)
        bar.update(len(batch))
    bar.close()
    return ids, rows, scores


def query_scores(retriever: bm25s.BM25, tokens: list[str], n_passages: int) -> np.ndarray:
    """(n_passages,) float32 BM25 score of every passage for one analysed question; all 0 when
    none of its tokens is in the vocabulary."""
    return retriever.get_scores(tokens) if tokens else np.zeros(n_passages, dtype=np.float32)


def top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, scores) of the k highest of (N,) `scores`, best first, ties by row number.

    One partition of the negated scores, then only the k (and the rows tied with the k-th)
    are sorted: O(N + k log k), deterministic whatever the ties.
    """
    negated = -scores
    if k < len(scores):
        kth = negated[np.argpartition(negated, k - 1)[:k]].max()
        above = np.flatnonzero(negated < kth)
        tied = np.flatnonzero(negated == kth)[: k - len(above)]
        rows = np.concatenate([above, tied])
    else:
        rows = np.arange(len(scores))
    rows = rows[np.lexsort((rows, negated[rows]))]
    return rows, scores[rows]
