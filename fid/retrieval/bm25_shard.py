"""One shard of a sharded BM25 index (`fid build-bm25 --shard K/S --stats STATS`): a contiguous
slice of the passage file indexed with the corpus-wide statistics (fid.retrieval.bm25_stats).

Shard K of S is the K-th (1-based) of S byte ranges of about equal size, cut at line starts
(`passage_shard_bounds`, as embed-passages cuts), so its passages are rows
first_row .. first_row + rows - 1 of the file. Its bm25s score matrix is built from bm25s's own
functions (`bm25s.scoring`, what `BM25.build_index_from_ids` calls), given the global N, df and
average length where that method would compute them from the documents at hand, and the whole
vocabulary with the ids one index over the whole file gives: every entry, every float32 score
and every query's sum is then the whole index's (a shard's matrix holds its passages' rows of
the whole matrix). The folder has the layout of build_bm25's, so `search_bm25(..., shard=True)`
searches it; its meta.json (format SHARD_INDEX_FORMAT) records the shard, its rows and the
statistics' fingerprint, which the merge checks (fid.retrieval.bm25_merge).

The shard does not tokenize: its passages' token ids are read from the statistics folder,
which tokenized the corpus once (`CorpusStats.passage_tokens`); the passage file gives the
passage ids and is checked to be the one counted.

Memory: the shard's token ids (4 bytes a token), its score matrix (12 bytes a distinct
(passage, token) pair), and the global vocabulary and df (the size of any BM25 build's).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import bm25s
import numpy as np
from bm25s.scoring import (
    _build_idf_array,
    _build_nonoccurrence_array,
    _build_scores_and_indices_for_matrix,
    _select_idf_scorer,
    _select_tfc_scorer,
)

from fid.config import BM25Config
from fid.data.passage_store import file_sha256
from fid.data.passages import check_unique_ids, iter_passages, passage_shard_bounds, read_header
from fid.errors import DataError, InputError
from fid.retrieval.bm25 import _FlatDocs
from fid.retrieval.bm25_folder import _IDS, _META, SHARD_INDEX_FORMAT
from fid.retrieval.bm25_stats import CorpusStats, load_stats
from fid.runtime.fileio import atomic_directory, atomic_write_json

logger = logging.getLogger(__name__)


def _passage_lines(path: Path, start: int, end: int) -> tuple[int, int]:
    """(passages before byte `start`, passages in [start, end)), counting non-blank lines as
    `count_passages` does (a line a passage, as in DPR's files; checked against the read)."""
    before = inside = 0
    position = read_header(path).end
    with open(path, "rb") as handle:
        handle.seek(position)
        for line in handle:
            if position >= end:
                break
            if line.strip(b"\r\n"):
                before, inside = (before + 1, inside) if position < start else (before, inside + 1)
            position += len(line)
    return before, inside


def _check_corpus(passages_path: Path, stats: CorpusStats, stats_dir: Path) -> None:
    """The passage file is the one the statistics were counted on (its size, then sha256)."""
    meta = stats.meta
    size = passages_path.stat().st_size
    sha256 = file_sha256(passages_path) if size == meta["bytes"] else None
    if sha256 != meta["sha256"]:
        raise DataError(
            f"{passages_path}: not the passage file the BM25 statistics {stats_dir} were counted "
            f"on ({meta['source']}, {meta['bytes']} bytes, sha256 {meta['sha256'][:12]}...; "
            f"this one has {size} bytes{f', sha256 {sha256[:12]}...' if sha256 else ''}). Hint: "
            "count the statistics of this file with fid bm25-stats, then rebuild every shard."
        )


def shard_score_matrix(retriever: bm25s.BM25, docs: _FlatDocs, pairs: int,
                       stats: CorpusStats) -> dict:  # fmt: skip
    """bm25s's score matrix of a shard's passages (`docs`, token ids of the global vocabulary)
    under the corpus-wide statistics: `BM25.build_index_from_ids`'s steps, with the global N,
    df and average length where it would take the shard's own. Sets the retriever's
    non-occurrence array (bm25l, bm25+: from the global df, as the whole index's).

    Returns: {"data": (E,) float32, "indices": (E,) int32 passage rows, "indptr": (V + 1,) int64,
    "num_docs": the shard's passages}, the CSC layout `BM25.scores` holds.
    """
    n_docs = int(stats.meta["n_passages"])
    avg_doc_len = stats.avg_doc_len
    global_df = dict(enumerate(stats.doc_freqs.tolist()))  # token id -> df, what bm25s takes
    idf_fn = _select_idf_scorer(retriever.idf_method)
    retriever.nonoccurrence_array = None
    if retriever.method in retriever.methods_requiring_nonoccurrence:
        retriever.nonoccurrence_array = _build_nonoccurrence_array(
            doc_frequencies=global_df, n_docs=n_docs, compute_idf_fn=idf_fn,
            calculate_tfc_fn=_select_tfc_scorer(retriever.method), l_d=avg_doc_len,
            l_avg=avg_doc_len, k1=retriever.k1, b=retriever.b, delta=retriever.delta,
            dtype=retriever.dtype,
        )  # fmt: skip
    idf_array = _build_idf_array(doc_frequencies=global_df, n_docs=n_docs,
                                 compute_idf_fn=idf_fn, dtype=retriever.dtype)  # fmt: skip
    # doc_frequencies only sizes the entry arrays here: their sum, the shard's distinct
    # (passage, token) pairs, is each array's length (bm25s fills every entry, trims none).
    scores_flat, doc_idx, vocab_idx = _build_scores_and_indices_for_matrix(
        corpus_token_ids=docs, idf_array=idf_array, avg_doc_len=avg_doc_len,
        doc_frequencies={0: pairs}, k1=retriever.k1, b=retriever.b,
        delta=retriever.delta, nonoccurrence_array=retriever.nonoccurrence_array,
        method=retriever.method, dtype=retriever.dtype, int_dtype=retriever.int_dtype,
        show_progress=False,
    )  # fmt: skip
    # The CSC builder of bm25s's default csc_backend ("numpy"), as build_bm25's index uses.
    data, indices, indptr = retriever._np_csc(
        data=scores_flat, rows=doc_idx, cols=vocab_idx, shape=(len(docs), len(global_df))
    )
    return {"data": data.astype(retriever.dtype), "indices": indices, "indptr": indptr,
            "num_docs": len(docs)}  # fmt: skip


def build_bm25_shard(passages_path: str | Path, index_dir: str | Path, cfg: BM25Config,
                     stats_dir: str | Path, shard: int, n_shards: int) -> None:  # fmt: skip
    """Builds shard `shard` (1-based) of `n_shards` of a BM25 index of a passage file with the
    statistics counted by `fid bm25-stats`, and saves it to a folder (atomically).

    Raises:
        InputError: a shard number out of range.
        DataError: statistics of another file, a shard without passages, duplicate ids.
        ConfigError: a config whose analysis is not the statistics'.
    """
    passages_path, index_dir, stats_dir = Path(passages_path), Path(index_dir), Path(stats_dir)
    started = time.perf_counter()
    if not 1 <= shard <= n_shards:
        raise InputError(f"--shard {shard}/{n_shards}: expected 1 <= K <= S")
    stats = load_stats(stats_dir, cfg)
    _check_corpus(passages_path, stats, stats_dir)
    start, end = passage_shard_bounds(passages_path, shard - 1, n_shards)
    first_row, lines = _passage_lines(passages_path, start, end)
    n_total = int(stats.meta["n_passages"])

    ids = [passage.id for passage in iter_passages(passages_path, start, end)]
    if not ids:
        raise DataError(
            f"{passages_path}: shard {shard} of {n_shards} holds no passages (the file has "
            f"{n_total} passages; each shard holds 1/{n_shards} of its bytes). Hint: use fewer shards."
        )
    if len(ids) != lines:
        raise DataError(
            f"{passages_path}: shard {shard} of {n_shards} read {len(ids)} passages from {lines} "
            "lines: a quoted passage spans lines, and shards number rows by lines. Hint: build "
            "one index (no --shard) for this file."
        )
    check_unique_ids(ids, f"{passages_path} (shard {shard} of {n_shards})")
    flat, offsets, pairs = stats.passage_tokens(first_row, len(ids))
    docs = _FlatDocs(flat, offsets, total_passes=1)

    retriever = bm25s.BM25(k1=cfg.k1, b=cfg.b, method=cfg.method)
    retriever.scores = shard_score_matrix(retriever, docs, pairs, stats)
    retriever.vocab_dict = stats.vocabulary
    retriever.unique_token_ids_set = set(stats.vocabulary.values())
    meta = {
        "format": SHARD_INDEX_FORMAT,
        "shard": {
            "index": shard,
            "count": n_shards,
            "first_row": first_row,
            "rows": len(ids),
            "bytes": [start, end],
        },  # fmt: skip
        "n_passages": len(ids),
        "corpus_passages": n_total,
        "fingerprint": stats.meta["fingerprint"],
        "stats": str(stats_dir),
        "n_tokens": int(len(docs.flat)),
        "vocab_size": len(stats.vocabulary),
        "source": str(passages_path),
        "bm25s_version": bm25s.__version__,
        "k1": cfg.k1,
        "b": cfg.b,
        "method": cfg.method,
        "delta": retriever.delta,
        "lowercase": True,
        **stats.meta["analysis"],
        "pystemmer_version": stats.meta["pystemmer_version"],
        "document": "title + ' ' + text",
    }
    with atomic_directory(index_dir) as tmp:
        retriever.save(tmp, show_progress=False)
        np.save(tmp / _IDS, np.array(ids, dtype=np.str_), allow_pickle=False)
        atomic_write_json(tmp / _META, meta)
    logger.info("BM25 shard %d of %d: passages %d-%d (%d tokens) in %.1f s -> %s", shard,
                n_shards, first_row, first_row + len(ids) - 1, meta["n_tokens"],
                time.perf_counter() - started, index_dir)  # fmt: skip
