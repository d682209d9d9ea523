"""Exact re-scoring of a compressed index's shortlist from full-precision vectors on disk.

A compressed faiss index (IVF-PQ, fast-scan PQ, SQ, PCA/OPQ + SQ) holds a few dozen bytes per
passage, so it ranks approximately. `PassageIndex` built with `rerank: true` also keeps every
passage vector as float16 in `vectors.npy` beside the index; a search then fetches a shortlist
of S candidates per query from the compressed index and re-scores them exactly here, keeping the
best k. RAM holds only the codes: the vectors are memory-mapped, and the pages that a query batch
touches are file-backed page cache, which the kernel can drop (21M x 768 float16 is 32 GB on disk,
of which ~S x 1.5 KB per query is read).

Why not faiss's `IndexRefineFlat` / `IndexRefine(base, IndexScalarQuantizer(fp16))`: they hold
the refinement vectors inside the index, in RAM, which is what this avoids. faiss 1.15 can map an
IndexFlatCodes read with IO_FLAG_MMAP_IFC, but its refinement gathers each query's candidates in
the base index's rank order (random pages on disk, one query at a time) and takes the shortlist
as a multiple of k (k_factor). Here the candidates of a whole query batch are read as one sorted
set of rows, front to back through the file, and the shortlist is a number of passages.
"""

from __future__ import annotations

import logging
import mmap
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fid.errors import DataError

logger = logging.getLogger(__name__)

VECTORS_FILE = "vectors.npy"
VECTORS_DTYPE = np.dtype(np.float16)

# Candidate rows gathered (as float32) per query batch: 32768 x 768 x 4 B = 100 MB at DPR's d,
# 33 MB at d = 256; a batch holds max(1, GATHER_ROWS // shortlist) queries.
GATHER_ROWS = 32768


class RowSource(Protocol):
    """(N, D) rows read on demand: an array, a `np.memmap`, or `ShardedEmbeddings`."""

    shape: tuple[int, int]

    def __getitem__(self, key: Any) -> np.ndarray: ...


def write_vectors(path: str | Path, source: RowSource, batch_size: int) -> None:
    """Writes the (N, D) rows of `source` to `path` as a float16 `.npy`, `batch_size` rows at a
    time (the file is memory-mapped for writing: memory holds one batch, whatever N)."""
    n, dim = source.shape
    out = np.lib.format.open_memmap(path, mode="w+", dtype=VECTORS_DTYPE, shape=(n, dim))
    for lo in range(0, n, batch_size):
        out[lo : lo + batch_size] = source[lo : lo + batch_size]
    out.flush()
    del out


def open_vectors(path: str | Path, count: int, dim: int) -> np.memmap:
    """Memory-maps the (count, dim) float16 vectors written by `write_vectors`.

    Raises:
        DataError: for a missing, truncated or foreign file, or one of another shape or dtype.
    """
    path = Path(path)
    hint = "Hint: rebuild the index with `fid build-index`"
    if not path.is_file():
        raise DataError(f"{path}: missing; the index was built with rerank: true. {hint}")
    try:
        vectors = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as error:  # not a .npy, or shorter than its header says (truncated)
        raise DataError(f"{path}: not a complete float16 .npy array: {error}. {hint}") from None
    if vectors.dtype != VECTORS_DTYPE or vectors.shape != (count, dim):
        raise DataError(
            f"{path}: holds {vectors.dtype} {vectors.shape}, but the index has {count} passages "
            f"of d={dim}: expected float16 ({count}, {dim}). {hint}"
        )
    advise_random_access(vectors)
    return vectors


def advise_random_access(mapped_array: np.memmap) -> None:
    """Tells the kernel that the map is read at random rows: without the hint its read-ahead
    turns the first touched row of a cold file into megabytes (measured: one row of a cold
    768 MB vectors.npy read the whole file, 1.0 s); with it a cold search reads the pages of its
    shortlisted rows (at most 2 pages a row), nothing more. Also for ids.npy, whose found rows
    are as scattered."""
    mapped = getattr(mapped_array, "_mmap", None)
    if mapped is not None and hasattr(mapped, "madvise") and hasattr(mmap, "MADV_RANDOM"):
        mapped.madvise(mmap.MADV_RANDOM)


def rescore(
    vectors: RowSource,
    queries: np.ndarray,
    candidates: np.ndarray,
    k: int,
    metric: str,
) -> tuple[np.ndarray, np.ndarray]:
    """Scores each query's candidate rows exactly and keeps the best k.

    Args:
        vectors: (N, D) passage vectors (float16 on disk; float32 rows of the same values).
        queries: (Q, D) float32 query embeddings.
        candidates: (Q, S) int64 rows from the compressed index, -1 for none (S >= k).
        k: results kept per query.
        metric: "inner_product" (score q.x) or "l2" (score -|q - x|^2).

    Returns:
        (scores, rows): (Q, k) float32 scores, best first, -inf past the candidates found, and
        (Q, k) int64 rows, -1 there. Equal scores keep the compressed index's order.
    """
    return best_of_shortlists(
        candidates, k, lambda part: _exact_scores(vectors, queries[part], candidates[part], metric)
    )


def best_of_shortlists(candidates: np.ndarray, k: int, score) -> tuple[np.ndarray, np.ndarray]:
    """The best k of each query's candidates, scored a group of queries at a time (the group's
    candidates, GATHER_ROWS rows at most, are gathered at once).

    Args:
        candidates: (Q, S) int64 rows, -1 for none (S >= k).
        k: results kept per query.
        score: score(part) -> (B, S) float32 scores of candidates[part] (a slice of queries),
            -inf where there is no candidate.

    Returns:
        (scores, rows): (Q, k) float32 scores, best first, -inf past the candidates found, and
        (Q, k) int64 rows, -1 there. Equal scores keep the candidates' order.
    """
    n_queries, shortlist = candidates.shape
    k = min(k, shortlist)
    scores = np.full((n_queries, k), -np.inf, dtype=np.float32)
    rows = np.full((n_queries, k), -1, dtype=np.int64)
    step = max(1, GATHER_ROWS // max(1, shortlist))
    for lo in range(0, n_queries, step):
        part = slice(lo, lo + step)
        scored = score(part)  # (B, S)
        order = np.argsort(-scored, axis=1, kind="stable")[:, :k]  # (B, k)
        scores[part] = np.take_along_axis(scored, order, axis=1)
        picked = np.take_along_axis(candidates[part], order, axis=1)
        picked[~np.isfinite(scores[part])] = -1
        rows[part] = picked
    return scores, rows


def _exact_scores(vectors, queries, candidates, metric) -> np.ndarray:
    """(B, S) exact scores of a group's candidates, -inf where none."""
    found = candidates >= 0  # (B, S)
    # The batch's candidates as one sorted set: the mapped file is read front to back, and a
    # passage shortlisted by several queries is read once.
    unique = np.unique(candidates[found])  # (U,)
    gathered = np.asarray(vectors[unique], dtype=np.float32)  # (U, D)
    where = np.searchsorted(unique, np.where(found, candidates, unique[0] if len(unique) else 0))
    exact = np.full(candidates.shape, -np.inf, dtype=np.float32)  # (B, S)
    if metric == "l2":
        norms = np.einsum("ud,ud->u", gathered, gathered)  # (U,)
    for b, query in enumerate(queries):
        mine = where[b, found[b]]  # positions in `unique` of query b's candidates
        dots = gathered[mine] @ query  # (S_b,)
        if metric == "l2":
            dots = 2 * dots - norms[mine] - np.float32(query @ query)
        exact[b, found[b]] = dots
    return exact


__all__ = [
    "GATHER_ROWS",
    "VECTORS_FILE",
    "best_of_shortlists",
    "open_vectors",
    "rescore",
    "write_vectors",
]
