"""Passage embeddings on disk and the faiss index that searches them.

Two formats live here:

- Embedding shards, written by `fid embed-passages` (one job per shard). Shard `k` of `n` with
  path prefix `P` is three files: `P.npy` (float16, (n_k, D)), `P.ids.npy` (the passage ids, a
  numpy unicode array) and `P.json` ({"shard", "n_shards", "count", "dim", "model"}). The arrays
  are saved with `allow_pickle=False`, so loading them runs no code.
- A `PassageIndex` folder: `index.faiss` (`faiss.write_index`), `ids.npy` (row i of the faiss
  index is passage `ids[i]`) and `meta.json` (dim, metric, count, model, factory, search knobs,
  faiss version, build time).

Any faiss `index_factory` string can be built ("Flat", "HNSW32", "IVF4096,PQ64", "SQ8", ...); see
https://github.com/facebookresearch/faiss/wiki/The-index-factory and, for choosing one,
https://github.com/facebookresearch/faiss/wiki/Guidelines-to-choose-an-index.
Scores are always "higher is better": inner products as they are, and for the l2 metric the
negated squared distance.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import faiss
import numpy as np

from fid.config import ConfigError, _check_range
from fid.data import DataError
from fid.fileio import atomic_directory, atomic_path, atomic_write_json
from fid.logs import progress

logger = logging.getLogger(__name__)

METRICS = {"inner_product": faiss.METRIC_INNER_PRODUCT, "l2": faiss.METRIC_L2}

# faiss's k-means wants at least this many training points per centroid and warns below it
# (faiss.ClusteringParameters().min_points_per_centroid).
MIN_POINTS_PER_CENTROID = 39

INDEX_FILE, IDS_FILE, META_FILE = "index.faiss", "ids.npy", "meta.json"
_META_KEYS = ("dim", "metric", "count", "model", "factory", "nprobe", "ef_search")


def _faiss_message(error: Exception) -> str:
    """The readable part of a faiss C++ error ("Error in <signature> at <file>:<line>: <text>")."""
    text = str(error).strip()
    match = re.search(r" at \S+:\d+: (.*)", text, flags=re.DOTALL)
    return match.group(1).strip() if match else text


# ---------------------------------------------------------------------------------------------
# Embedding shards


def _shard_paths(prefix: str | Path) -> tuple[Path, Path, Path]:
    """(embeddings, ids, meta) paths of a shard; suffixes are appended, never substituted."""
    prefix = str(prefix)
    return Path(prefix + ".npy"), Path(prefix + ".ids.npy"), Path(prefix + ".json")


def _save_npy(path: Path, array: np.ndarray) -> None:
    # Write through a handle: np.save appends ".npy" to a path name, which would miss the
    # temporary file that atomic_path moves into place.
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        np.save(handle, array, allow_pickle=False)


def _load_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as error:
        # Raised for object arrays (which need pickle) and for files that are not .npy at all.
        raise DataError(f"{path}: not a plain numpy array file: {error}") from None


def save_embedding_shard(
    prefix: str | Path,
    embeddings: np.ndarray,
    ids: Sequence[str],
    shard: int,
    n_shards: int,
    model: str,
) -> None:
    """Writes one shard of passage embeddings (`{prefix}.npy`, `.ids.npy`, `.json`), atomically.

    Each file is replaced atomically; the `.json` is written last, and `load_embedding_shard`
    checks it against the arrays, so a shard that a crash left half-rewritten is detected.

    Args:
        prefix: path prefix of the three files (e.g. `.../embeddings/shard0`).
        embeddings: (n, D) passage embeddings, stored as float16.
        ids: the n passage ids, in the row order of `embeddings`.
        shard: this shard's number, 0 <= shard < n_shards.
        n_shards: how many shards the passages were split into.
        model: name or path of the encoder, checked when shards are merged and queries encoded.

    Raises:
        ValueError: for a bad shape, an id count that differs from the row count, a duplicate
            or non-string id, a shard number out of range, or values float16 cannot hold.
    """
    if embeddings.ndim != 2:
        raise DataError(f"embeddings must be a 2-D (n, D) array, got shape {embeddings.shape}")
    ids = list(ids)
    if len(ids) != embeddings.shape[0]:
        raise DataError(f"{len(ids)} ids for {embeddings.shape[0]} embeddings: they must match")
    if not all(isinstance(i, str) for i in ids):
        raise DataError("passage ids must be strings")
    if len(set(ids)) != len(ids):
        raise DataError(f"duplicate passage ids in shard {shard}: {_first_duplicate(ids)!r}")
    if not 0 <= shard < n_shards:
        raise DataError(f"shard = {shard} is out of range: expected 0 <= shard < {n_shards}")
    with np.errstate(over="ignore"):  # overflow becomes inf, reported just below
        half = embeddings.astype(np.float16)
    if not np.isfinite(half).all():
        raise DataError(
            "embeddings hold values that are not finite in float16 (|x| > 65504, inf or nan)"
        )
    emb_path, ids_path, meta_path = _shard_paths(prefix)
    _save_npy(emb_path, half)
    _save_npy(ids_path, np.array(ids, dtype=str))
    meta = {
        "shard": shard,
        "n_shards": n_shards,
        "count": len(ids),
        "dim": int(embeddings.shape[1]),
        "model": model,
    }
    atomic_write_json(meta_path, meta)
    logger.info(
        "wrote shard %d/%d: %d embeddings of d=%d to %s", shard, n_shards, *half.shape, prefix
    )


def _first_duplicate(ids: Sequence[str]) -> str:
    seen = set()
    for i in ids:
        if i in seen:
            return i
        seen.add(i)
    raise AssertionError("no duplicate")


def _read_shard(prefix: str | Path) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """(float16 embeddings, ids, meta) of one shard, checked against each other."""
    paths = _shard_paths(prefix)
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise DataError(
            f"embedding shard {prefix}: missing {', '.join(missing)}. "
            "Hint: run `fid embed-passages` for this shard"
        )
    emb_path, ids_path, meta_path = paths
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as error:
        raise DataError(f"{meta_path}: invalid JSON: {error}") from None
    required = ("shard", "n_shards", "count", "dim", "model")
    if not isinstance(meta, dict) or any(key not in meta for key in required):
        raise DataError(f"{meta_path}: expected an object with keys {', '.join(required)}")
    embeddings, ids = _load_npy(emb_path), _load_npy(ids_path)
    if embeddings.ndim != 2 or embeddings.dtype != np.float16:
        raise DataError(
            f"{emb_path}: expected a float16 (n, D) array, "
            f"got {embeddings.dtype} of shape {embeddings.shape}"
        )
    if ids.ndim != 1 or ids.dtype.kind != "U":
        raise DataError(f"{ids_path}: expected a 1-D unicode array, got {ids.dtype} {ids.shape}")
    if not len(ids) == embeddings.shape[0] == meta["count"] or embeddings.shape[1] != meta["dim"]:
        raise DataError(
            f"embedding shard {prefix}: {meta_path.name} says {meta['count']} x {meta['dim']}, "
            f"the arrays hold {embeddings.shape[0]} x {embeddings.shape[1]} embeddings and "
            f"{len(ids)} ids. Hint: the files come from different runs; re-embed this shard"
        )
    return embeddings, ids, meta


def load_embedding_shard(prefix: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Loads one shard written by `save_embedding_shard`.

    Args:
        prefix: the path prefix the shard was saved under.

    Returns:
        (embeddings, ids): float16 (n, D) and a unicode array of n passage ids.

    Raises:
        DataError: for missing files or files that do not agree with each other.
    """
    embeddings, ids, _ = _read_shard(prefix)
    return embeddings, ids


def load_embedding_shards(
    prefixes: Sequence[str | Path],
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Loads and concatenates every shard of one embedding run, in the given order.

    Args:
        prefixes: the path prefixes of all `n_shards` shards (any order; rows follow it).

    Returns:
        (embeddings, ids, meta): float32 (N, D) embeddings, a unicode array of the N ids, and
        {"n_shards", "count", "dim", "model", "shards": [prefixes]}.

    Raises:
        DataError: for a missing file, shards of different dims, models or shard counts, a
            shard number missing or given twice, or a passage id found twice.
    """
    if not prefixes:
        raise DataError("no embedding shards given")
    shards = [_read_shard(prefix) for prefix in prefixes]
    first_prefix, (_, _, first) = prefixes[0], shards[0]
    for prefix, (_, _, meta) in zip(prefixes, shards, strict=True):
        for key in ("dim", "model", "n_shards"):
            if meta[key] != first[key]:
                raise DataError(
                    f"embedding shards disagree on {key}: {first_prefix} has {first[key]!r}, "
                    f"{prefix} has {meta[key]!r}. Hint: all shards must come from one "
                    "`fid embed-passages` run"
                )
    n_shards = first["n_shards"]
    by_number: dict[int, str | Path] = {}
    for prefix, (_, _, meta) in zip(prefixes, shards, strict=True):
        if meta["shard"] in by_number:
            raise DataError(
                f"shard {meta['shard']} of {n_shards} given twice: "
                f"{by_number[meta['shard']]} and {prefix}"
            )
        by_number[meta["shard"]] = prefix
    missing = sorted(set(range(n_shards)) - set(by_number))
    if missing:
        raise DataError(
            f"embedding shards {', '.join(map(str, missing))} of {n_shards} are missing "
            f"(got {len(prefixes)}: {', '.join(map(str, prefixes))})"
        )

    ids = np.concatenate([shard_ids for _, shard_ids, _ in shards])
    _check_unique_ids(ids, [len(shard_ids) for _, shard_ids, _ in shards], prefixes)
    # Filled shard by shard: no float16 copy of the whole corpus on the way to float32.
    embeddings = np.empty((len(ids), first["dim"]), dtype=np.float32)
    row = 0
    for shard_embeddings, _, _ in shards:
        embeddings[row : row + len(shard_embeddings)] = shard_embeddings
        row += len(shard_embeddings)
    meta = {
        "n_shards": n_shards,
        "count": len(ids),
        "dim": first["dim"],
        "model": first["model"],
        "shards": [str(prefix) for prefix in prefixes],
    }
    logger.info("loaded %d embeddings of d=%d from %d shards", len(ids), first["dim"], n_shards)
    return embeddings, ids, meta


def _check_unique_ids(ids: np.ndarray, counts: list[int], prefixes: Sequence[str | Path]) -> None:
    """Raises DataError naming a duplicate id and the shards that hold it."""
    # Sorting is O(N log N) in numpy; a Python set of 21M ids would take minutes and gigabytes.
    sorted_ids = np.sort(ids)
    duplicates = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
    if duplicates.size == 0:
        return
    duplicate = sorted_ids[duplicates[0]]
    shard_of_row = np.repeat(np.arange(len(counts)), counts)
    holders = sorted(set(shard_of_row[ids == duplicate].tolist()))
    raise DataError(
        f"passage id {str(duplicate)!r} appears more than once, in shards "
        f"{', '.join(str(prefixes[i]) for i in holders)} "
        f"({len(np.unique(sorted_ids[duplicates]))} duplicated ids in all). "
        "Hint: the shards must split the passages without overlap"
    )


# ---------------------------------------------------------------------------------------------
# Index


@dataclass(frozen=True)
class IndexConfig:
    """`fid build-index`: which faiss index to build and how to search it.

    Attributes:
        factory: a faiss `index_factory` string ("Flat" is exact; "HNSW32", "IVF4096,PQ64",
            "SQ8", "IVF256,Flat", ... trade accuracy for speed or memory). Checked when the
            index is built, because whether it is valid depends on the embedding dim.
        metric: "inner_product" (what the retriever scores with) or "l2".
        train_sample: vectors sampled (seeded) to train indexes that need training (IVF, PQ,
            SQ); all vectors when there are fewer.
        add_batch_size: vectors converted to float32 and added to the index at a time.
        nprobe: inverted lists visited per query by IVF indexes.
        ef_search: candidate list size of HNSW graphs (also an HNSW coarse quantizer's).
        seed: seeds the training sample.
    """

    factory: str = "Flat"
    metric: Literal["inner_product", "l2"] = "inner_product"
    train_sample: int = 262144
    add_batch_size: int = 65536
    nprobe: int = 16
    ef_search: int = 128
    seed: int = 0

    def __post_init__(self):
        if not isinstance(self.factory, str) or not self.factory.strip():
            raise ConfigError(
                f"factory = {self.factory!r} is not allowed: expected a faiss index_factory "
                "string such as 'Flat', 'HNSW32' or 'IVF4096,PQ64'"
            )
        if self.metric not in METRICS:
            raise ConfigError(
                f"metric = {self.metric!r} is not allowed: expected one of "
                + ", ".join(repr(m) for m in METRICS)
            )
        _check_range("train_sample", self.train_sample, low=1)
        _check_range("add_batch_size", self.add_batch_size, low=1)
        _check_range("nprobe", self.nprobe, low=1)
        _check_range("ef_search", self.ef_search, low=1)


class PassageIndex:
    """A faiss index over passage embeddings, with the passage id of every row.

    Args:
        index: a trained, filled faiss index; row i holds the embedding of `ids[i]`.
        ids: (count,) unicode array of passage ids.
        cfg: the index configuration (its search knobs are applied at every search).
        model: name or path of the encoder that produced the embeddings.
        build_seconds: how long building took (None if unknown).
    """

    def __init__(
        self,
        index: faiss.Index,
        ids: np.ndarray,
        cfg: IndexConfig,
        model: str,
        build_seconds: float | None = None,
    ):
        assert index.ntotal == len(ids), (index.ntotal, len(ids))
        self.index = index
        self.ids = np.asarray(ids, dtype=str)
        self.cfg = cfg
        self.model = model
        self.build_seconds = build_seconds
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
        return (
            f"PassageIndex(factory={self.cfg.factory!r}, metric={self.metric!r}, "
            f"dim={self.dim}, count={self.count}, model={self.model!r})"
        )

    @classmethod
    def build(
        cls, embeddings: np.ndarray, ids: Sequence[str], cfg: IndexConfig, model: str
    ) -> PassageIndex:
        """Builds an index: create from `cfg.factory`, train if needed, add every vector.

        Args:
            embeddings: (N, D) float16 or float32 passage embeddings.
            ids: the N passage ids, unique, in the row order of `embeddings`.
            cfg: the index configuration.
            model: name or path of the encoder that produced the embeddings.

        Raises:
            ConfigError: for a factory string faiss cannot build for this D, or an index that
                needs more training vectors than there are (e.g. IVF with more lists).
            ValueError: for a bad shape, no vectors, or ids that do not match the rows.
        """
        if embeddings.ndim != 2:
            raise DataError(f"embeddings must be a 2-D (N, D) array, got shape {embeddings.shape}")
        n, dim = embeddings.shape
        ids = np.asarray(ids, dtype=str)
        if n == 0:
            raise DataError("cannot build an index of zero passages")
        if ids.shape != (n,):
            raise DataError(f"{len(ids)} ids for {n} embeddings: they must match")
        if len(np.unique(ids)) != n:
            raise DataError(f"duplicate passage ids, e.g. {_first_duplicate(ids.tolist())!r}")
        start = time.perf_counter()
        try:
            index = faiss.index_factory(dim, cfg.factory, METRICS[cfg.metric])
        except RuntimeError as error:
            raise ConfigError(
                f"factory = {cfg.factory!r} cannot be built for d={dim}: {_faiss_message(error)}. "
                "Expected a faiss index_factory string such as 'Flat', 'HNSW32', "
                "'IVF4096,PQ64' or 'SQ8' (PQ<M> needs d divisible by M); see "
                "https://github.com/facebookresearch/faiss/wiki/The-index-factory"
            ) from None
        _skip_polysemous_training(index)
        if not index.is_trained:
            _train(index, embeddings, cfg)
        with progress(desc="index", unit="passages", total=n, log=logger) as bar:
            for lo in range(0, n, cfg.add_batch_size):
                batch = np.ascontiguousarray(embeddings[lo : lo + cfg.add_batch_size], np.float32)
                index.add(batch)
                bar.update(len(batch))
        seconds = time.perf_counter() - start
        logger.info(
            "built %s index (%s) of %d passages, d=%d, in %.1f s",
            cfg.factory,
            cfg.metric,
            n,
            dim,
            seconds,
        )
        return cls(index, ids, cfg, model, build_seconds=seconds)

    def set_search_params(self, nprobe: int | None = None, ef_search: int | None = None) -> None:
        """Changes the search knobs (e.g. of a loaded index) without rebuilding.

        Raises:
            ConfigError: for values out of range.
        """
        changes = {"nprobe": nprobe, "ef_search": ef_search}
        self.cfg = replace(self.cfg, **{k: v for k, v in changes.items() if v is not None})

    def _apply_search_params(self) -> None:
        # Stored on the index itself, so set them before every search: cheap, and `cfg` may
        # have changed since the last one.
        values = {
            "nprobe": self.cfg.nprobe,
            "efSearch": self.cfg.ef_search,
            "quantizer_efSearch": self.cfg.ef_search,
        }
        for name, value in values.items():
            if name in self._knobs:
                self._space.set_index_parameter(self.index, name, value)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        """Finds the k best passages of each query.

        Args:
            queries: (Q, D) float16 or float32 query embeddings.
            k: passages wanted per query; more than the index holds gives all of them.

        Returns:
            (scores, ids): scores (Q, K) float32 with K = min(k, count), best first ("higher is
            better": the inner product, or minus the squared L2 distance), and for each query
            the list of its passage ids. An approximate index can find fewer than K passages
            for a query (IVF with a small nprobe): its list is then shorter and the missing
            scores are -inf.

        Raises:
            ValueError: for queries that are not (Q, D) with the index's D, or k < 1.
        """
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            dims = f"d={queries.shape[-1]}" if queries.ndim == 2 else f"shape {queries.shape}"
            raise DataError(f"index built for d={self.dim}, queries have {dims}")
        if k < 1:
            raise ValueError(f"k = {k} is out of range: expected >= 1")
        k = min(k, self.count)
        self._apply_search_params()
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
                    parts.append(self.index.search(chunk, k))
                    bar.update(len(chunk))
        finally:
            faiss.cvar.distance_compute_blas_threshold = previous
        scores = np.concatenate([s for s, _ in parts]) if parts else np.empty((0, k), np.float32)
        rows = np.concatenate([r for _, r in parts]) if parts else np.empty((0, k), np.int64)
        # (Q, K) each
        if self.cfg.metric == "l2":
            scores = -scores
        found = rows >= 0  # faiss pads missing results with row -1 at the end of each list
        scores[~found] = -np.inf
        passage_ids = self.ids[np.where(found, rows, 0)]
        ids = [row[mask].tolist() for row, mask in zip(passage_ids, found, strict=True)]
        return scores, ids

    def save(self, folder: str | Path) -> None:
        """Writes `index.faiss`, `ids.npy` and `meta.json` to `folder`, atomically.

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
            "faiss_version": faiss.__version__,
            "build_seconds": self.build_seconds,
        }
        with atomic_directory(folder) as tmp:
            faiss.write_index(self.index, str(tmp / INDEX_FILE))
            with open(tmp / IDS_FILE, "wb") as handle:
                np.save(handle, self.ids, allow_pickle=False)
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
            DataError: for a missing folder or file, files that disagree, or a dim other than
                `expected_dim`.
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
        try:
            meta = json.loads((folder / META_FILE).read_text())
        except json.JSONDecodeError as error:
            raise DataError(f"{folder / META_FILE}: invalid JSON: {error}") from None
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
            raise DataError(
                f"{folder / INDEX_FILE}: cannot read: {_faiss_message(error)}"
            ) from None
        ids = _load_npy(folder / IDS_FILE)
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
        cfg = IndexConfig(
            factory=meta["factory"],
            metric=meta["metric"],
            nprobe=meta["nprobe"],
            ef_search=meta["ef_search"],
        )
        loaded = cls(index, ids, cfg, meta["model"], build_seconds=meta.get("build_seconds"))
        logger.info("loaded %r from %s", loaded, folder)
        return loaded


def _skip_polysemous_training(index: faiss.Index) -> None:
    """Turns off the polysemous training that index_factory enables for PQ codes.

    It only reorders each PQ codebook so that Hamming distances between codes approximate real
    distances, which helps only polysemous search (the "ht" parameter, never set here); on one
    thread it made training IVF16,PQ8 on 2000 vectors 50x slower (13 s instead of 0.25 s).
    """
    # Keep `index` referenced while these views of its sub-indexes are used (a faiss view does
    # not own its C++ object).
    found = [faiss.downcast_index(index)]
    while isinstance(found[-1], faiss.IndexPreTransform):
        found.append(faiss.downcast_index(found[-1].index))
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        found.append(faiss.downcast_index(ivf))
    for sub in found:
        if getattr(sub, "do_polysemous_training", False):
            sub.do_polysemous_training = False


def _train(index: faiss.Index, embeddings: np.ndarray, cfg: IndexConfig) -> None:
    """Trains `index` on a seeded sample of min(cfg.train_sample, N) of the embeddings."""
    n = embeddings.shape[0]
    n_train = min(cfg.train_sample, n)
    limit = f"min(train_sample={cfg.train_sample}, passages={n})"
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        nlist = ivf.nlist
        wanted = MIN_POINTS_PER_CENTROID * nlist
        # The largest power of two that k-means can train well from this many points.
        fewer = 2 ** max(0, int(np.log2(max(1, n_train // MIN_POINTS_PER_CENTROID))))
        hint = f"Hint: use fewer lists (e.g. IVF{fewer} in factory = {cfg.factory!r})"
        if n_train < nlist:
            raise ConfigError(
                f"factory = {cfg.factory!r} has {nlist} inverted lists but only {n_train} "
                f"training vectors ({limit}); faiss needs at least one per list and "
                f"~{MIN_POINTS_PER_CENTROID} x nlist = {wanted} to train well. {hint}"
            )
        if n_train < wanted:
            logger.warning(
                "%s: %d training vectors (%s) for %d lists; faiss trains well from ~%d x nlist "
                "= %d. %s",
                cfg.factory,
                n_train,
                limit,
                nlist,
                MIN_POINTS_PER_CENTROID,
                wanted,
                hint,
            )
    if n_train < n:
        rng = np.random.default_rng(cfg.seed)
        # Sorted rows read the (possibly memory-mapped) array front to back.
        rows = np.sort(rng.choice(n, size=n_train, replace=False))
        sample = np.ascontiguousarray(embeddings[rows], np.float32)
    else:
        sample = np.ascontiguousarray(embeddings, np.float32)
    start = time.perf_counter()
    try:
        index.train(sample)
    except RuntimeError as error:
        raise ConfigError(
            f"factory = {cfg.factory!r} could not be trained on {n_train} vectors ({limit}): "
            f"{_faiss_message(error)}. Hint: use a smaller index (fewer lists, fewer PQ bits) "
            "or more training vectors"
        ) from None
    logger.info(
        "trained %s on %d vectors in %.1f s", cfg.factory, n_train, time.perf_counter() - start
    )


__all__ = [
    "IndexConfig",
    "PassageIndex",
    "load_embedding_shard",
    "load_embedding_shards",
    "save_embedding_shard",
]
