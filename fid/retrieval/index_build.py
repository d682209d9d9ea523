"""Building a faiss passage index (`fid build-index`): created from any faiss `index_factory`
string, trained on a seeded sample of `train_sample` vectors when it needs training, and filled
`add_batch_size` vectors at a time from memory-mapped embedding shards, so that memory holds
the index and one batch. fid.retrieval.index holds the built index, its search and its folder.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

import faiss
import numpy as np

from fid.config import ConfigError, IndexConfig
from fid.errors import DataError
from fid.retrieval.embeddings import (
    SOURCES,
    ShardedEmbeddings,
    first_duplicate,
    load_embedding_shards,
)
from fid.retrieval.faiss_errors import faiss_message
from fid.retrieval.index import METRICS, PassageIndex
from fid.retrieval.residual_layout import code_bytes
from fid.retrieval.residual_training import add_passages, check_base, train_refinement
from fid.runtime.fileio import warn_if_short_of_space
from fid.runtime.progress import progress

logger = logging.getLogger(__name__)

# faiss's k-means wants at least this many training points per centroid and warns below it
# (faiss.ClusteringParameters().min_points_per_centroid).
MIN_POINTS_PER_CENTROID = 39


def build_index(cfg: IndexConfig, shards: Sequence[Path], output: Path) -> PassageIndex:
    """`fid build-index`: the embedding shards (prefixes) in one faiss index folder."""
    embeddings, ids, meta = load_embedding_shards(shards)
    rows, dim = embeddings.shape
    # what is knowable before the build: Flat's vectors, the re-ranking copy, the ids
    refine = code_bytes(cfg.refine_residual, dim) if cfg.refine_residual else 0
    needed = rows * (4 * dim * (cfg.factory.strip() == "Flat") + 2 * dim * cfg.rerank + refine + 16)
    warn_if_short_of_space(Path(output).parent, needed, f"an index of {rows:,} passages")
    index = build_passage_index(embeddings, ids, cfg, model=meta["model"])
    index.sources = {key: meta[key] for key in SOURCES if key in meta}
    index.save(output)
    logger.info("indexed %d passages (%s) into %s", index.count, cfg.factory, output)
    return index


def build_passage_index(
    embeddings: np.ndarray | ShardedEmbeddings,
    ids: Sequence[str],
    cfg: IndexConfig,
    model: str,
) -> PassageIndex:
    """Builds an index: create from `cfg.factory`, train if needed, add every vector.

    Args:
        embeddings: (N, D) float16 or float32 passage embeddings, or memory-mapped shards
            (rows are read a batch at a time). With `cfg.rerank` the index keeps them for
            re-scoring (an array as float16, shards as they are) until `save` writes them.
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
        raise DataError(f"duplicate passage ids, e.g. {first_duplicate(ids.tolist())!r}")
    start = time.perf_counter()
    try:
        index = faiss.index_factory(dim, cfg.factory, METRICS[cfg.metric])
    except RuntimeError as error:
        raise ConfigError(
            f"factory = {cfg.factory!r} cannot be built for d={dim}: {faiss_message(error)}. "
            "Expected a faiss index_factory string such as 'Flat', 'HNSW32', "
            "'IVF4096,PQ64' or 'SQ8' (PQ<M> needs d divisible by M); see "
            "https://github.com/facebookresearch/faiss/wiki/The-index-factory"
        ) from None
    _skip_polysemous_training(index)
    sample = None
    if not index.is_trained:
        sample = _train(index, embeddings, cfg)
    refinement = None
    if cfg.refine_residual:
        # passages the base did not train on: on its own training sample the base's codes fit
        # closer than on the rest (an IVF16384's k-means puts a centroid among every ~40), so
        # their residuals would be too small a sample of what the refinement must code
        sample = _training_sample(embeddings, cfg, held_out=sample is not None)
        refinement = train_refinement(cfg.refine_residual, index, sample)
        check_base(index, cfg.factory, sample)
    del sample
    codes = []
    with progress(desc="index", unit="passages", total=n, log=logger) as bar:
        for lo in range(0, n, cfg.add_batch_size):
            batch = np.ascontiguousarray(embeddings[lo : lo + cfg.add_batch_size], np.float32)
            if refinement is None:
                index.add(batch)
            else:
                codes.append(add_passages(refinement, index, batch))
            bar.update(len(batch))
    if refinement is not None:
        refinement.codes = np.concatenate(codes)
        del codes
    seconds = time.perf_counter() - start
    logger.info(
        "built %s index (%s) of %d passages, d=%d, in %.1f s",
        cfg.factory,
        cfg.metric,
        n,
        dim,
        seconds,
    )
    vectors = None
    if cfg.rerank and isinstance(faiss.downcast_index(index), faiss.IndexRefine):
        raise ConfigError(
            f"rerank: true with factory = {cfg.factory!r}: the index refines its shortlist "
            "in RAM already (Refine/RFlat); drop rerank, or the refinement from the factory"
        )
    if cfg.rerank:
        if cfg.factory.strip() == "Flat":
            logger.warning("rerank: true with factory = 'Flat': Flat is exact already")
        # Float16 values, as `save` writes and `load` maps them: a built and a loaded index
        # score alike. Shards are float16 already (read as float32 rows of those values).
        vectors = embeddings
        if not isinstance(embeddings, ShardedEmbeddings):
            vectors = np.asarray(embeddings, dtype=np.float16)
    return PassageIndex(
        index, ids, cfg, model, build_seconds=seconds, vectors=vectors, refinement=refinement
    )


def _skip_polysemous_training(index: faiss.Index) -> None:
    """Turns off the polysemous training that index_factory enables for PQ codes.

    It only reorders each PQ codebook so that Hamming distances between codes approximate real
    distances, which helps only polysemous search (the "ht" parameter, never set here); on one
    thread it made training IVF16,PQ8 on 2000 vectors 50x slower (13 s instead of 0.25 s).
    """
    # Keep `index` referenced while these views of its sub-indexes are used (a faiss view does
    # not own its C++ object).
    found = [faiss.downcast_index(index)]
    while isinstance(found[-1], faiss.IndexPreTransform | faiss.IndexRefine):
        if isinstance(found[-1], faiss.IndexRefine):
            # "...,Refine(PQ64)": a PQ refinement trains polysemously too (40 s instead of
            # 0.1 s for a PQ16 of 2,000 vectors)
            found.append(faiss.downcast_index(found[-1].refine_index))
            found.append(faiss.downcast_index(found[-2].base_index))
        else:
            found.append(faiss.downcast_index(found[-1].index))
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        found.append(faiss.downcast_index(ivf))
    for sub in found:
        if getattr(sub, "do_polysemous_training", False):
            sub.do_polysemous_training = False


def _training_sample(
    embeddings: np.ndarray, cfg: IndexConfig, held_out: bool = False
) -> np.ndarray:
    """A seeded sample of min(cfg.train_sample, N) of the embeddings, (S, D) float32; with
    `held_out`, of the rows that sample left out (as many of them as there are, up to
    train_sample), or the sample itself where it took every row."""
    n = embeddings.shape[0]
    if cfg.train_sample >= n:
        return np.ascontiguousarray(embeddings, np.float32)
    rng = np.random.default_rng(cfg.seed)
    # Sorted rows read the (possibly memory-mapped) array front to back.
    rows = np.sort(rng.choice(n, size=cfg.train_sample, replace=False))
    if held_out:
        rest = np.setdiff1d(np.arange(n), rows)  # (N - S,)
        rows = np.sort(rng.choice(rest, size=min(cfg.train_sample, len(rest)), replace=False))
    return np.ascontiguousarray(embeddings[rows], np.float32)


def _train(index: faiss.Index, embeddings: np.ndarray, cfg: IndexConfig) -> np.ndarray:
    """Trains `index` on a seeded sample of min(cfg.train_sample, N) of the embeddings;
    returns the sample."""
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
    sample = _training_sample(embeddings, cfg)
    start = time.perf_counter()
    try:
        index.train(sample)
    except RuntimeError as error:
        raise ConfigError(
            f"factory = {cfg.factory!r} could not be trained on {n_train} vectors ({limit}): "
            f"{faiss_message(error)}. Hint: use a smaller index (fewer lists, fewer PQ bits) "
            "or more training vectors"
        ) from None
    logger.info(
        "trained %s on %d vectors in %.1f s", cfg.factory, n_train, time.perf_counter() - start
    )
    return sample
