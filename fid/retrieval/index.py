"""The faiss index over passage embeddings: what a saved index folder holds, and its search
(built from the shards of fid.retrieval.embeddings by fid.retrieval.index_build).

A `PassageIndex` folder holds `index.faiss` (`faiss.write_index`), `ids.npy` (row i of the faiss
index is passage `ids[i]`), `meta.json` (dim, metric, count, model, factory, search knobs,
faiss version, build time, and what identifies the encoder and corpus: index_sources.py) and, for an index built with `rerank: true`, `vectors.npy`: every
passage vector as float16, memory-mapped when loaded (fid.retrieval.rerank); for one built with
`refine_residual`, `refine_codes.npy`, `refine_pq<i>.faiss`, `refine_layout.json` and (for a
byte budget) `refine_rotation.npy` and `refine_query_map.npy`: the residual codes that re-score a shortlist in RAM
(fid.retrieval.residual_codes; their files: fid.retrieval.residual_files).

Any faiss `index_factory` string can be built ("Flat", "HNSW32", "IVF4096,PQ64", "SQ8", ...); see
https://github.com/facebookresearch/faiss/wiki/The-index-factory and, for choosing one,
https://github.com/facebookresearch/faiss/wiki/Guidelines-to-choose-an-index. Compressed ones
keep a few dozen bytes per passage ("OPQ64_256,IVF65536_HNSW32,PQ64": an OPQ rotation, an IVF
whose 65536 centroids are searched by an HNSW graph, 64-byte PQ codes; "IVF4096,PQ64x4fs":
fast-scan 4-bit PQ, 32 bytes; "PCAR128,SQ8": 128 bytes). They are trained on a seeded sample
of `train_sample` vectors and filled `add_batch_size` vectors at a time, from memory-mapped
embedding shards: memory holds the index and one batch. With `rerank`, a search takes
`shortlist` candidates per query from the compressed index and re-scores them exactly from
`vectors.npy`; docs/index.md measures the choices.
Scores are always "higher is better": inner products as they are, and for the l2 metric the
negated squared distance.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import faiss
import numpy as np

from fid.config import ConfigError, IndexConfig
from fid.errors import DataError
from fid.retrieval.embeddings import load_npy
from fid.retrieval.faiss_errors import faiss_message
from fid.retrieval.rerank import (
    VECTORS_FILE,
    RowSource,
    advise_random_access,
    open_vectors,
    rescore,
    write_vectors,
)
from fid.retrieval.residual_codes import ResidualRefinement
from fid.retrieval.residual_files import load_refinement, save_refinement
from fid.runtime.fileio import atomic_directory
from fid.runtime.progress import progress
from fid.text_files import read_json

logger = logging.getLogger(__name__)

METRICS = {"inner_product": faiss.METRIC_INNER_PRODUCT, "l2": faiss.METRIC_L2}

INDEX_FILE, IDS_FILE, META_FILE = "index.faiss", "ids.npy", "meta.json"
_META_KEYS = ("dim", "metric", "count", "model", "factory", "nprobe", "ef_search")


class RankedIds(Sequence):
    """Each query's passage ids, best first, kept as index rows until read: (Q, K) int64 rows
    (-1 past the passages found) are 8 bytes a passage, so retrieval for a whole split holds
    0.06 GB at NQ's 79k x 100 where lists of id strings held 0.5 GB. `ranked[q]` is query q's
    ids as a list of strings."""

    def __init__(self, rows: np.ndarray, ids: np.ndarray) -> None:
        self.rows = rows  # (Q, K) int64
        self.ids = ids  # (count,) unicode: row i of the index is passage ids[i]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, q: int) -> list[str]:
        row = self.rows[q]
        return self.ids[row[row >= 0]].tolist()


class PassageIndex:
    """A faiss index over passage embeddings, with the passage id of every row.

    Args:
        index: a trained, filled faiss index; row i holds the embedding of `ids[i]`.
        ids: (count,) unicode array of passage ids.
        cfg: the index configuration (its search knobs are applied at every search).
        model: name or path of the encoder that produced the embeddings.
        build_seconds: how long building took (None if unknown).
        vectors: with `cfg.rerank`, the (count, D) passage vectors that re-score shortlists:
            float16 memory-mapped from `vectors.npy` once loaded; after `build`, the
            embeddings it was built from (float16 values), written out by `save`.
        refinement: with `cfg.refine_residual`, the residual codes (in RAM) that re-score
            shortlists.
        sources: what identifies the encoder and the corpus the embeddings came from
            ({"encoder", "corpus"}, fid.retrieval.index_sources); {} for an index from before
            they were recorded.
    """

    def __init__(
        self,
        index: faiss.Index,
        ids: np.ndarray,
        cfg: IndexConfig,
        model: str,
        build_seconds: float | None = None,
        vectors: RowSource | None = None,
        refinement: ResidualRefinement | None = None,
        sources: dict | None = None,
    ):
        assert index.ntotal == len(ids), (index.ntotal, len(ids))
        assert (vectors is not None) == cfg.rerank, "vectors are needed exactly when rerank"
        assert (refinement is not None) == bool(cfg.refine_residual), "refinement iff its codes"
        self.index = index
        self.vectors = vectors
        self.refinement = refinement
        self.ids = np.asarray(ids, dtype=str)
        self.cfg = cfg
        self.model = model
        self.build_seconds = build_seconds
        self.sources = dict(sources or {})
        # The knobs this index type has ("nprobe" for IVF, "efSearch" for HNSW,
        # "quantizer_efSearch" for an IVF with an HNSW quantizer), found through any wrapper
        # (IndexPreTransform, IndexRefine, ...).
        space = faiss.ParameterSpace()
        space.initialize(index)
        self._space = space
        self._knobs = {
            space.parameter_ranges.at(i).name for i in range(space.parameter_ranges.size())
        }

    @property
    def dim(self) -> int:
        """The embedding dimension D."""
        return self.index.d

    @property
    def count(self) -> int:
        """How many passages the index holds."""
        return self.index.ntotal

    @property
    def metric(self) -> str:
        """The metric of the scores: "inner_product" or "l2"."""
        return self.cfg.metric

    def __repr__(self) -> str:
        rerank = f", rerank shortlist={self.cfg.shortlist}" if self.cfg.rerank else ""
        if self.refinement is not None:
            rerank = (
                f", refine_residual={self.cfg.refine_residual!r} shortlist={self.cfg.shortlist}"
            )
        return (
            f"PassageIndex(factory={self.cfg.factory!r}, metric={self.metric!r}, "
            f"dim={self.dim}, count={self.count}, model={self.model!r}{rerank})"
        )

    def set_search_params(
        self,
        nprobe: int | None = None,
        ef_search: int | None = None,
        shortlist: int | None = None,
    ) -> None:
        """Changes the search knobs (e.g. of a loaded index) without rebuilding; None keeps one.

        Raises:
            ConfigError: for values out of range, or a shortlist for an index built without
                `rerank` (it has no vectors to re-score with).
        """
        if shortlist is not None and not self.rescores_shortlist:
            raise ConfigError(
                f"shortlist = {shortlist} needs an index that re-ranks (build_index.rerank: "
                "true or refine_residual, or a factory ending in Refine(...)), but this "
                f"{self.cfg.factory!r} index does not. Hint: drop retrieve.shortlist, or "
                "rebuild the index"
            )
        changes = {"nprobe": nprobe, "ef_search": ef_search, "shortlist": shortlist}
        self.cfg = replace(self.cfg, **{k: v for k, v in changes.items() if v is not None})

    @property
    def rescores_shortlist(self) -> bool:
        """Whether a search re-scores a shortlist of candidates: from vectors.npy (`rerank`),
        from residual codes (`refine_residual`) or inside faiss (`refines_in_memory`)."""
        return self.cfg.rerank or self.refinement is not None or self.refines_in_memory

    @property
    def refines_in_memory(self) -> bool:
        """A faiss refinement index (factory "...,Refine(SQ8)", "...,RFlat"): the shortlist is
        re-scored inside faiss from refinement codes held in RAM, no file read per search."""
        return "k_factor_rf" in self._knobs

    def _apply_search_params(self, k: int | None = None) -> None:
        # Stored on the index itself, so set them before every search: cheap, and `cfg` may
        # have changed since the last one.
        values = {
            "nprobe": self.cfg.nprobe,
            "efSearch": self.cfg.ef_search,
            "quantizer_efSearch": self.cfg.ef_search,
        }
        if k is not None and self.refines_in_memory:
            # faiss refines k x k_factor candidates of the base index: the shortlist
            values["k_factor_rf"] = max(1.0, self.cfg.shortlist / k)
        for name, value in values.items():
            if name in self._knobs:
                self._space.set_index_parameter(self.index, name, value)

    def candidates_for(self, k: int) -> int:
        """How many passages a search for the k best asks the faiss index for per query:
        min(k, count), or with `rerank` or `refine_residual` min(shortlist, count) (a faiss
        factory that refines in RAM fetches its shortlist itself and returns k).

        Raises:
            ConfigError: with a shortlist (`rerank`, `refine_residual`, or a refining factory)
                smaller than k.
        """
        if not self.rescores_shortlist:
            return min(k, self.count)
        if self.cfg.shortlist < min(k, self.count):
            raise ConfigError(
                f"shortlist = {self.cfg.shortlist} is smaller than the {k} passages wanted per "
                "query: expected shortlist >= top_k (set retrieve.shortlist, or "
                "build_index.shortlist for the index's default)"
            )
        if self.refines_in_memory:
            return min(k, self.count)  # faiss fetches the shortlist itself (k_factor_rf)
        return min(self.cfg.shortlist, self.count)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        """`search_rows` with each query's passage ids as a list (for a few queries: a list
        of Python strings costs ~60 bytes a passage, 0.5 GB for NQ's 79k x 100)."""
        scores, ranked = self.search_rows(queries, k)
        return scores, [ranked[q] for q in range(len(ranked))]

    def search_rows(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, RankedIds]:
        """Finds the k best passages of each query.

        Args:
            queries: (Q, D) float16 or float32 query embeddings.
            k: passages wanted per query; more than the index holds gives all of them.

        Returns:
            (scores, ranked): scores (Q, K) float32 with K = min(k, count), best first ("higher
            is better": the inner product, or minus the squared L2 distance), and each query's
            passage ids (`RankedIds`: index rows, mapped to ids when read). An approximate
            index can find fewer than K passages for a query (IVF with a small nprobe): its
            list is then shorter and the missing scores are -inf. With `rerank`, the scores
            are exact (from the float16 vectors) and the passages the best K of the
            compressed index's `shortlist` candidates; with `refine_residual`, the best K of
            the shortlist by base score + the residual codes' (fid.retrieval.residual_codes).

        Raises:
            ValueError: for queries that are not (Q, D) with the index's D, or k < 1.
            ConfigError: with `rerank`, for a shortlist smaller than k.
        """
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            dims = f"d={queries.shape[-1]}" if queries.ndim == 2 else f"shape {queries.shape}"
            raise DataError(f"index built for d={self.dim}, queries have {dims}")
        if k < 1:
            raise ValueError(f"k = {k} is out of range: expected >= 1")
        fetch = self.candidates_for(k)
        k = min(k, self.count)
        self._apply_search_params(fetch)
        # Exhaustive search uses faiss's BLAS kernel only for large query batches (faiss 1.15:
        # queries x D >= 128000); below that it is ~10x slower here (200 questions against
        # 100k passages: 1.9 s vs 0.18 s), so the BLAS path is forced for the call.
        previous = faiss.cvar.distance_compute_blas_threshold
        faiss.cvar.distance_compute_blas_threshold = 0
        # Queries go in chunks, for the progress log; a multiple of the block that exhaustive
        # search takes them in anyway (4096), so the BLAS calls and scores are the same as in
        # one search.
        size = 4 * faiss.cvar.distance_compute_blas_query_bs
        parts = []
        try:
            with progress(desc="search", unit="queries", total=len(queries), log=logger) as bar:
                for lo in range(0, len(queries), size):
                    chunk = np.ascontiguousarray(queries[lo : lo + size], np.float32)
                    found, rows = self.index.search(chunk, fetch)  # (C, fetch) each
                    if self.cfg.metric == "l2":
                        found = -found
                    if self.cfg.rerank:
                        # Exact scores of the chunk's shortlists: (C, k) each.
                        found, rows = rescore(self.vectors, chunk, rows, k, self.cfg.metric)
                    elif self.refinement is not None:
                        # Scores refined by the residual codes: (C, k) each.
                        found, rows = self.refinement.rescore(chunk, found, rows, k)
                    parts.append((found, rows))
                    bar.update(len(chunk))
        finally:
            faiss.cvar.distance_compute_blas_threshold = previous
        scores = np.concatenate([s for s, _ in parts]) if parts else np.empty((0, k), np.float32)
        rows = np.concatenate([r for _, r in parts]) if parts else np.empty((0, k), np.int64)
        # (Q, K) each
        found = rows >= 0  # faiss pads missing results with row -1 at the end of each list
        scores[~found] = -np.inf
        return scores, RankedIds(np.where(found, rows, -1), self.ids)

    def save(self, folder: str | Path) -> None:
        """Writes `index.faiss`, `ids.npy`, `meta.json`, with `rerank` `vectors.npy` (float16,
        `add_batch_size` rows at a time) and with `refine_residual` its codes and quantizers
        to `folder`, atomically.

        Args:
            folder: replaced as a whole: a reader sees the old index, the new one or none.
        """
        meta = {
            "dim": self.dim,
            "metric": self.cfg.metric,
            "count": self.count,
            "model": self.model,
            "factory": self.cfg.factory,
            "nprobe": self.cfg.nprobe,
            "ef_search": self.cfg.ef_search,
            "rerank": self.cfg.rerank,
            "shortlist": self.cfg.shortlist,
            "refine_residual": self.cfg.refine_residual,
            "faiss_version": faiss.__version__,
            "build_seconds": self.build_seconds,
            **self.sources,
        }
        with atomic_directory(folder) as tmp:
            faiss.write_index(self.index, str(tmp / INDEX_FILE))
            with open(tmp / IDS_FILE, "wb") as handle:
                np.save(handle, self.ids, allow_pickle=False)
            if self.cfg.rerank:
                write_vectors(tmp / VECTORS_FILE, self.vectors, self.cfg.add_batch_size)
            if self.refinement is not None:
                save_refinement(self.refinement, tmp)
            (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        logger.info("saved %r to %s", self, folder)

    @classmethod
    def load(
        cls,
        folder: str | Path,
        expected_dim: int | None = None,
        expected_model: str | None = None,
    ) -> PassageIndex:
        """Loads an index written by `save`.

        Args:
            folder: the index folder.
            expected_dim: D of the model that will encode the queries; checked if given.
            expected_model: that model's name or path; a different one is only warned about
                (the same weights may sit under another path).

        Raises:
            DataError: for a missing folder or file, files that disagree (a `vectors.npy` of
                another shape, or truncated, too), or a dim other than `expected_dim`.
        """
        folder = Path(folder)
        if not folder.is_dir():
            raise DataError(f"{folder}: index folder not found. Hint: run `fid build-index`")
        missing = [
            name for name in (INDEX_FILE, IDS_FILE, META_FILE) if not (folder / name).is_file()
        ]
        if missing:
            raise DataError(
                f"{folder}: index folder is missing {', '.join(missing)}. "
                "Hint: rebuild it with `fid build-index`"
            )
        meta = read_json(folder / META_FILE, "a dense index record (json)")
        if not isinstance(meta, dict) or any(key not in meta for key in _META_KEYS):
            raise DataError(
                f"{folder / META_FILE}: expected an object with keys {', '.join(_META_KEYS)}"
            )
        if expected_dim is not None and meta["dim"] != expected_dim:
            raise DataError(
                f"{folder}: index built for d={meta['dim']} (model {meta['model']!r}), but the "
                f"queries will have d={expected_dim}"
                + (f" (model {expected_model!r})" if expected_model else "")
                + ". Hint: rebuild the index with the retriever that encodes the queries"
            )
        if expected_model is not None and meta["model"] != expected_model:
            logger.warning(
                "%s: index built from embeddings of model %r, queries will be encoded by %r",
                folder,
                meta["model"],
                expected_model,
            )
        try:
            index = faiss.read_index(str(folder / INDEX_FILE))
        except RuntimeError as error:
            raise DataError(f"{folder / INDEX_FILE}: cannot read: {faiss_message(error)}") from None
        # Memory-mapped: a search reads only the ids of the rows it found, and at 21M passages
        # the array (unicode, 4 bytes a character: 32 B a DPR id) is 0.7 GB, half of what a
        # compressed index of 256-d vectors may take (docs/index.md).
        ids = load_npy(folder / IDS_FILE, mmap=True)
        advise_random_access(ids)  # a search reads the ids of the rows it found: scattered
        if ids.ndim != 1 or ids.dtype.kind != "U":
            raise DataError(f"{folder / IDS_FILE}: expected a 1-D unicode array, got {ids.dtype}")
        if not index.ntotal == len(ids) == meta["count"] or index.d != meta["dim"]:
            raise DataError(
                f"{folder}: files disagree: {INDEX_FILE} holds {index.ntotal} x d={index.d}, "
                f"{IDS_FILE} {len(ids)} ids, {META_FILE} says {meta['count']} x d={meta['dim']}"
            )
        if meta["metric"] not in METRICS or index.metric_type != METRICS[meta["metric"]]:
            raise DataError(
                f"{folder}: {META_FILE} says metric {meta['metric']!r}, "
                f"{INDEX_FILE} has faiss metric type {index.metric_type}"
            )
        # Folders written before re-ranking existed have neither key: no vectors.
        rerank = meta.get("rerank", False)
        cfg = IndexConfig(
            factory=meta["factory"],
            metric=meta["metric"],
            nprobe=meta["nprobe"],
            ef_search=meta["ef_search"],
            rerank=rerank,
            shortlist=meta.get("shortlist", IndexConfig.shortlist),
            refine_residual=meta.get("refine_residual"),
        )
        vectors = (
            open_vectors(folder / VECTORS_FILE, meta["count"], meta["dim"]) if rerank else None
        )
        refinement = None
        if cfg.refine_residual:
            refinement = load_refinement(folder, cfg.refine_residual, meta["count"], meta["dim"])
        loaded = cls(
            index,
            ids,
            cfg,
            meta["model"],
            build_seconds=meta.get("build_seconds"),
            vectors=vectors,
            refinement=refinement,
            sources={key: meta[key] for key in ("encoder", "corpus") if key in meta},
        )
        logger.info("loaded %r from %s", loaded, folder)
        return loaded


__all__ = ["INDEX_FILE", "METRICS", "PassageIndex", "RankedIds"]
