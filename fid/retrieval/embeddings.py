"""Passage embeddings: one shard of the passage file embedded by the retriever, and its files.

`embed_passages` reads one contiguous shard of the passage file (so shards run as separate jobs),
sorts passages by token length within chunks, so each batch is padded only to its own longest,
and returns float16 embeddings with the passage ids. A batch that runs out of memory is redone
in two halves (fid.runtime.oom_batch_halving).

Embedding shards are written by `fid embed-passages` (one job per shard). Shard `k` of `n` with
path prefix `P` is three files: `P.npy` (float16, (n_k, D)), `P.ids.npy` (the passage ids, a
numpy unicode array) and `P.json` ({"shard", "n_shards", "count", "dim", "model", "encoder",
"corpus"}: `encoder` the fingerprint of the model's weights, `corpus` the size and sampled
sha256 of the passage file, which the index records and `fid retrieve` / `fid ask` check). The
arrays are saved with `allow_pickle=False`, so loading them runs no code.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import replace
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fid.config import EmbedPassagesConfig
from fid.data.passage_store import passages_identity
from fid.data.passages import Passage, count_lines, iter_passages, passage_shard_bounds
from fid.errors import DataError
from fid.models.fingerprint import model_fingerprint
from fid.runtime import distributed
from fid.runtime.fileio import atomic_paths, warn_if_short_of_space
from fid.runtime.oom_batch_halving import BatchSplitter
from fid.runtime.oom_injection import Injection
from fid.runtime.precision import autocast, resolve_precision
from fid.runtime.progress import progress
from fid.text_files import read_json

if TYPE_CHECKING:  # transformers (~2 s of CPU) only where a model is loaded: build-index,
    # retrieve and ask read shards through this module (issue 46.3)
    from fid.models.retriever import DualEncoder, RetrieverTokenizer

logger = logging.getLogger(__name__)

# What a shard records of the model and the corpus it came from (every shard the same).
SOURCES = ("encoder", "corpus")


def _chunks(items: Iterator, size: int) -> Iterator[list]:
    while chunk := list(islice(items, size)):
        yield chunk


@torch.no_grad()
def passage_embeddings(
    model: DualEncoder,
    encode: RetrieverTokenizer,
    passages: Iterator[Passage],
    cfg: EmbedPassagesConfig,
    device: torch.device,
    total: int | None = None,
    injection: Injection | None = None,
) -> tuple[np.ndarray, list[str]]:
    """Embeds passages in input order; a batch out of memory is redone in halves, the batch
    size lowered for the rest of the run (fid.runtime.oom_batch_halving).

    Args:
        model: the retriever (its passage encoder is used).
        encode: the model's passage inputs (its format, prefix and length).
        passages: the passages of one shard.
        cfg: batch size, chunking for length sorting, precision.
        device: where the model is.
        total: passage count for the progress log (its percentage and ETA), when known.
        injection: simulated out-of-memory errors (a testing aid), or None.

    Returns:
        (n, D) float16 embeddings and the n passage ids.
    """
    model.eval()
    parts, ids = [], []
    bar = progress(desc="embed", unit="passages", total=total, log=logger)
    amp = autocast(device, cfg.precision)
    chunk: list[Passage] = []

    def prepare(rows):
        # pad_to_max_length: the fixed-padding baseline of the benchmark
        titles, texts = [chunk[i].title for i in rows], [chunk[i].text for i in rows]
        return encode.passages(titles, texts, cfg.pad_to_max_length)

    def forward(batch):
        with amp:
            vectors = model.encode_passages(
                batch["input_ids"].to(device), batch["attention_mask"].to(device)
            )
        return vectors.float().cpu().numpy()

    splitter = BatchSplitter(
        "embed-passages", device, lambda i: f"passage {chunk[i].id!r}", cfg.batch_size, injection
    )
    for chunk in _chunks(iter(passages), cfg.sort_chunk):
        order = list(range(len(chunk)))
        if cfg.sort_by_length:
            lengths = encode.passage_lengths([p.title for p in chunk], [p.text for p in chunk])
            order.sort(key=lambda i: lengths[i])
        embedded = np.empty((len(chunk), model.dim), dtype=np.float16)
        batches = [order[i : i + cfg.batch_size] for i in range(0, len(order), cfg.batch_size)]
        for rows, vectors in splitter.run(batches, prepare, forward):
            embedded[rows] = vectors
            bar.update(len(rows))
        parts.append(embedded)
        ids.extend(p.id for p in chunk)
    bar.close()
    if not parts:
        return np.empty((0, model.dim), dtype=np.float16), []
    return np.concatenate(parts), ids


def _shard_paths(prefix: str | Path) -> tuple[Path, Path, Path]:
    """(embeddings, ids, meta) paths of a shard; suffixes are appended, never substituted."""
    prefix = str(prefix)
    return Path(prefix + ".npy"), Path(prefix + ".ids.npy"), Path(prefix + ".json")


def _save_npy(path: Path, array: np.ndarray) -> None:
    # Write through a handle: np.save appends ".npy" to a path name, which would miss the
    # temporary file that is moved into place.
    with open(path, "wb") as handle:
        np.save(handle, array, allow_pickle=False)


def load_npy(path: Path, mmap: bool = False) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False, mmap_mode="r" if mmap else None)
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
    precision: str | None = None,
    sources: dict | None = None,
) -> None:
    """Writes one shard of passage embeddings (`{prefix}.npy`, `.ids.npy`, `.json`), atomically.

    The three files are written under temporary names and moved into place together (a
    failure before the last move leaves none); `load_embedding_shard` also checks the `.json`
    against the arrays.

    Args:
        prefix: path prefix of the three files (e.g. `.../embeddings/shard0`).
        embeddings: (n, D) passage embeddings, stored as float16.
        ids: the n passage ids, in the row order of `embeddings`.
        shard: this shard's number, 0 <= shard < n_shards.
        n_shards: how many shards the passages were split into.
        model: name or path of the encoder, checked when shards are merged and queries encoded.
        precision: the precision the passages were embedded in (recorded).
        sources: what identifies the encoder and the corpus (`{"encoder": ..., "corpus":
            ...}`: fid.models.fingerprint, fid.data.passage_store.passages_identity),
            recorded for the index to check its users against.

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
        raise DataError(f"duplicate passage ids in shard {shard}: {first_duplicate(ids)!r}")
    if not 0 <= shard < n_shards:
        raise DataError(f"shard = {shard} is out of range: expected 0 <= shard < {n_shards}")
    with np.errstate(over="ignore"):  # overflow becomes inf, reported just below
        half = embeddings.astype(np.float16)
    if not np.isfinite(half).all():
        raise DataError(
            "embeddings hold values that are not finite in float16 (|x| > 65504, inf or nan)"
        )
    meta = {
        "shard": shard,
        "n_shards": n_shards,
        "count": len(ids),
        "dim": int(embeddings.shape[1]),
        "model": model,
    }
    if precision is not None:
        meta["precision"] = precision
    meta.update(sources or {})
    # the three files appear together or not at all (a full disk at the last leaves none)
    with atomic_paths(*_shard_paths(prefix)) as (emb_tmp, ids_tmp, meta_tmp):
        _save_npy(emb_tmp, half)
        _save_npy(ids_tmp, np.array(ids, dtype=str))
        meta_tmp.write_text(json.dumps(meta, indent=2) + "\n")
    logger.info(
        "wrote shard %d/%d: %d embeddings of d=%d to %s", shard, n_shards, *half.shape, prefix
    )


def first_duplicate(ids: Sequence[str]) -> str:
    seen = set()
    for i in ids:
        if i in seen:
            return i
        seen.add(i)
    raise AssertionError("no duplicate")


def _read_shard(
    prefix: str | Path, mmap: bool = False
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """(float16 embeddings, ids, meta) of one shard, checked against each other; with `mmap`
    the embeddings stay on disk (memory-mapped) until rows are read."""
    paths = _shard_paths(prefix)
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise DataError(
            f"embedding shard {prefix}: missing {', '.join(missing)}. "
            "Hint: run `fid embed-passages` for this shard"
        )
    emb_path, ids_path, meta_path = paths
    meta = read_json(meta_path, "an embedding shard's record (json)")
    required = ("shard", "n_shards", "count", "dim", "model")
    if not isinstance(meta, dict) or any(key not in meta for key in required):
        raise DataError(f"{meta_path}: expected an object with keys {', '.join(required)}")
    embeddings, ids = load_npy(emb_path, mmap), load_npy(ids_path)
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


class ShardedEmbeddings:
    """The (N, D) float32 embeddings of several memory-mapped float16 shards, read when rows
    are asked for: `x[lo:hi]` and `x[rows]` (sorted row numbers) give float32 arrays, so that
    building an index holds the index and one batch, not a second copy of the corpus."""

    def __init__(self, shards: Sequence[np.ndarray]):
        self.shards = list(shards)
        self.starts = np.cumsum([0] + [len(s) for s in self.shards])  # (S + 1,)
        self.shape = (int(self.starts[-1]), int(self.shards[0].shape[1]))
        self.ndim, self.dtype = 2, np.dtype(np.float32)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key) -> np.ndarray:
        if isinstance(key, slice):
            key = np.arange(*key.indices(self.shape[0]))
        rows = np.asarray(key)
        out = np.empty((len(rows), self.shape[1]), dtype=np.float32)
        shard_of = np.searchsorted(self.starts, rows, side="right") - 1
        for s in np.unique(shard_of):
            mine = shard_of == s
            out[mine] = self.shards[s][rows[mine] - self.starts[s]]
        return out

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        whole = self[:]
        return whole if dtype is None else whole.astype(dtype)


def load_embedding_shards(
    prefixes: Sequence[str | Path],
) -> tuple[ShardedEmbeddings, np.ndarray, dict[str, Any]]:
    """Opens every shard of one embedding run (memory-mapped) and checks them together.

    Args:
        prefixes: the path prefixes of all `n_shards` shards (any order; rows follow it).

    Returns:
        (embeddings, ids, meta): the (N, D) embeddings as float32 rows on demand
        (`ShardedEmbeddings`; `np.asarray` reads them all), a unicode array of the N ids, and
        {"n_shards", "count", "dim", "model", "shards": [prefixes]}.

    Raises:
        DataError: for a missing file, shards of different dims, models or shard counts, a
            shard number missing or given twice, or a passage id found twice.
    """
    if not prefixes:
        raise DataError("no embedding shards given")
    shards = [_read_shard(prefix, mmap=True) for prefix in prefixes]
    first_prefix, (_, _, first) = prefixes[0], shards[0]
    for prefix, (_, _, meta) in zip(prefixes, shards, strict=True):
        for key in ("dim", "model", "n_shards", *SOURCES):
            if meta.get(key) != first.get(key):
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
    embeddings = ShardedEmbeddings([shard_embeddings for shard_embeddings, _, _ in shards])
    meta = {
        "n_shards": n_shards,
        "count": len(ids),
        "dim": first["dim"],
        "model": first["model"],
        "shards": [str(prefix) for prefix in prefixes],
        **{key: first[key] for key in SOURCES if key in first},
    }
    logger.info("opened %d embeddings of d=%d in %d shards", len(ids), first["dim"], n_shards)
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


def embed_passages(
    cfg: EmbedPassagesConfig,
    model_path: Path,
    passages_path: Path,
    shard: int,
    n_shards: int,
    output: Path,
    device: torch.device,
) -> None:
    """`fid embed-passages`: shard `shard` of `n_shards` of the passage file, embedded by the
    retriever's passage encoder and saved under the prefix `output` (see the module docstring)."""
    from fid.models.loading import load_retriever

    start, end = passage_shard_bounds(passages_path, shard, n_shards)
    retriever, encode = load_retriever(
        model_path, None, cfg.passage_max_tokens, device, override=cfg.override_model_settings
    )
    # float16 vectors and their ids, before the hours of embedding ([start, end) are bytes)
    rows = count_lines(passages_path, start, end)
    warn_if_short_of_space(Path(output).parent, rows * (2 * retriever.dim + 16),
                           f"about {rows:,} embeddings of d={retriever.dim}")  # fmt: skip
    # "auto": bf16 on a GPU, and on a CPU that computes it natively for a model wide enough
    width = retriever.question_encoder.config.hidden_size
    cfg = replace(cfg, precision=resolve_precision(cfg.precision, device, width))
    logger.info("embedding in %s", cfg.precision)
    embeddings, ids = passage_embeddings(
        retriever, encode, iter_passages(passages_path, start, end), cfg, device,
        injection=Injection.from_env(distributed.world()[0]),
    )  # fmt: skip
    sources = {"encoder": model_fingerprint(model_path), "corpus": passages_identity(passages_path)}
    save_embedding_shard(
        output, embeddings, ids, shard, n_shards, model=str(model_path), precision=cfg.precision,
        sources=sources,
    )  # fmt: skip
    logger.info("embedded %d passages (shard %d of %d)", len(ids), shard, n_shards)
