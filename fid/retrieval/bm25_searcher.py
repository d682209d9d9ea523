"""BM25 held in memory, one question at a time: what `fid ask` and `fid serve` search when the
run's system reads BM25's lists (round 0 of a run whose `first_retrieval` is bm25).

The index, or every shard of a sharded one (`bm25.shards` > 1: results/<run>/bm25/shards/<k>/
index), is loaded once (bm25s, memory-mapped); a question is then analysed as the passages were
and ranked as `fid retrieve-bm25` ranks it (fid.retrieval.bm25_search.top_k: score, then row),
the shards' top k merged as `fid merge-bm25-lists` merges them (score descending, then global
row), so that an asked question reads the passages, order and float32 scores of the lists the
report scored.
"""

from __future__ import annotations

from pathlib import Path

import bm25s
import numpy as np

from fid.config import BM25Config
from fid.errors import DataError
from fid.retrieval.bm25_analysis import _query_tokens
from fid.retrieval.bm25_folder import (
    _IDS,
    INDEX_FORMAT,
    SHARD_INDEX_FORMAT,
    _check_index_matches,
    _load_meta,
)
from fid.retrieval.bm25_search import query_scores, top_k


class BM25Searcher:
    """A whole BM25 index, or all shards of one, loaded for repeated searches.

    Args:
        index_dirs: one folder of `fid build-bm25`, or the S shard folders of `fid build-bm25
            --shard k/S` (any order: each records its rows).
        cfg: must agree with the index on k1, b, method and the analysis.

    Raises:
        DataError: a folder that is no index, shards that are not all of one sharded index.
        ConfigError: `cfg` disagrees with how the index was built.
    """

    def __init__(self, index_dirs: list[Path], cfg: BM25Config):
        sharded = len(index_dirs) > 1
        self.shards = []  # (first global row, passage ids by row, meta, bm25s index)
        for index_dir in index_dirs:
            meta = _load_meta(index_dir, SHARD_INDEX_FORMAT if sharded else INDEX_FORMAT)
            _check_index_matches(meta, cfg, index_dir)
            first_row = meta["shard"]["first_row"] if sharded else 0
            ids = np.load(index_dir / _IDS, allow_pickle=False)
            index = bm25s.BM25.load(index_dir, mmap=True, show_progress=False)
            self.shards.append((first_row, ids, meta, index))
        self.shards.sort(key=lambda shard: shard[0])
        if sharded:
            _check_complete(index_dirs, [shard[2] for shard in self.shards])
        self.n_passages = sum(len(shard[1]) for shard in self.shards)

    def search(self, question: str, k: int) -> tuple[list[str], list[float]]:
        """(passage ids, float32 scores) of `question`'s top k passages, best first."""
        found = []  # (score, global row, passage id) of each shard's top k
        for first_row, ids, meta, index in self.shards:
            scores = query_scores(index, _query_tokens([question], meta)[0], len(ids))
            rows, top_scores = top_k(scores, min(k, len(ids)))
            found += zip(
                top_scores.tolist(), (first_row + rows).tolist(), ids[rows].tolist(), strict=True
            )
        found.sort(key=lambda hit: (-hit[0], hit[1]))
        best = found[:k]
        return [str(hit[2]) for hit in best], [hit[0] for hit in best]


def _check_complete(index_dirs: list[Path], metas: list[dict]) -> None:
    """The shards (sorted by first row) are all S of one sharded index, each once."""
    count = metas[0]["shard"]["count"]
    fingerprints = {meta["fingerprint"] for meta in metas}
    numbers = sorted(meta["shard"]["index"] for meta in metas)
    if len(fingerprints) > 1 or numbers != list(range(1, count + 1)):
        raise DataError(
            f"{Path(index_dirs[0]).parent.parent}: expected the {count} shards of one BM25 index "
            f"(1..{count}, one statistics fingerprint), found shards {numbers} of "
            f"{len(fingerprints)} fingerprint(s). Hint: rebuild the run's BM25 (snakemake)"
        )
