"""Retrieval from a sharded BM25 index: each shard's top k (`fid retrieve-bm25-shard`), then the
global top k of all shards (`fid merge-bm25-lists`), written as `fid retrieve-bm25` writes one
index's lists.

Ties: `top_k` of fid.retrieval.bm25_search orders one index's passages by score, then row. A
shard's top k are its first k in that order (its rows are a contiguous run of the file's), so the
first k of all shards' lists ordered by (score descending, global row) are the whole index's
first k: the same passages, in the same order, with the same float32 scores.

Shard lists (one .npz file a shard, written atomically): `meta` (a JSON string: the shard, its
rows, the statistics' fingerprint, top_k and the scoring), `question_ids` (Q,), `rows` (Q, k)
int64 global passage rows, best first, `scores` (Q, k) float32 and `passage_ids` (Q, k).

The merge reads the shards' metadata and question ids first and checks them all, then folds the
shards in one at a time into each question's running top k: it holds two shards' (Q, k) arrays at
most, whatever the shard count S (before: all S at once, ~95 B per question, shard and rank).

The merge refuses, naming the file: a shard whose lists are missing (its job failed or did not
run) or unreadable, one of another shard count, one counted twice, one built with other
statistics (a changed corpus: another fingerprint than the statistics given), and lists of other
questions, another top_k or another scoring. Nothing is written then.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fid.config import BM25Config
from fid.data.passage_store import PassageStore, open_store, passages_in_memory
from fid.data.passages import Passage, iter_passages
from fid.data.questions import load_questions
from fid.errors import DataError
from fid.retrieval.bm25_folder import SHARD_INDEX_FORMAT, _load_meta
from fid.retrieval.bm25_search import search_bm25
from fid.retrieval.bm25_stats import check_stats_config, load_stats_meta
from fid.retrieval.ranking import retrieval_records, write_compact_lists
from fid.runtime.fileio import atomic_path, atomic_write_json

logger = logging.getLogger(__name__)

LISTS_FORMAT = "fid-bm25-shard-lists/1"
# What a shard's lists must share with the merge's config (the scoring and the analysis).
_SCORING = ("k1", "b", "method", "token_pattern", "stopwords", "stemmer")


def retrieve_bm25_shard(cfg: BM25Config, index_dir: Path, questions_path: Path,
                        output: Path) -> None:  # fmt: skip
    """`fid retrieve-bm25-shard`: the top `cfg.top_k` passages of one shard for every question
    of a question file, written as shard lists (module docstring)."""
    index_dir = Path(index_dir)
    questions = load_questions(questions_path)
    ids, rows, scores = search_bm25(index_dir, questions, cfg, shard=True)
    index = _load_meta(index_dir, SHARD_INDEX_FORMAT)
    first_row = int(index["shard"]["first_row"])
    k = min(cfg.top_k, len(ids))
    local = np.array(rows, dtype=np.int64).reshape(len(questions), k)  # (Q, k) shard rows
    meta = {
        "format": LISTS_FORMAT,
        "shard": index["shard"],
        "fingerprint": index["fingerprint"],
        "corpus_passages": index["corpus_passages"],
        "top_k": cfg.top_k,
        "index": str(index_dir),
        "questions": str(questions_path),
        **{key: index[key] for key in _SCORING},
    }
    with atomic_path(output) as tmp, open(tmp, "wb") as handle:  # a handle: no ".npz" added
        np.savez(
            handle,
            meta=np.array(json.dumps(meta)),
            question_ids=np.array([str(q["id"]) for q in questions], dtype=np.str_),
            rows=local + first_row,
            scores=np.array(scores, dtype=np.float32).reshape(len(questions), k),
            passage_ids=ids[local] if k else np.zeros(local.shape, dtype=np.str_),
        )
    logger.info("BM25 shard %d of %d: top %d of %d questions -> %s", index["shard"]["index"],
                index["shard"]["count"], k, len(questions), output)  # fmt: skip


_RANKED = ("rows", "scores", "passage_ids")
_EXPECTED = "shard lists written by fid retrieve-bm25-shard (.npz)"


@dataclass(frozen=True)
class ShardLists:
    """One shard's lists, read and checked to be lists (not yet against the others); the
    ranked arrays are None until read (`read_shard_lists(..., ranked=False)`, `with_ranked`)."""

    path: Path
    meta: dict
    question_ids: np.ndarray  # (Q,)
    rows: np.ndarray | None = None  # (Q, k) global rows
    scores: np.ndarray | None = None  # (Q, k) float32
    passage_ids: np.ndarray | None = None  # (Q, k)

    @property
    def name(self) -> str:
        shard = self.meta["shard"]
        return f"shard {shard['index']} of {shard['count']} ({self.path})"


def _read(path: Path, keys: tuple[str, ...]) -> dict:
    """Those arrays of a shard's lists file; an unreadable one is refused by name."""
    try:
        with np.load(path, allow_pickle=False) as saved:
            return {key: saved[key] for key in keys}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as error:
        raise DataError(f"{path}: not {_EXPECTED} ({type(error).__name__}: {error})") from None


def read_shard_lists(path: Path, ranked: bool = True) -> ShardLists:
    """A shard's lists file; a missing or unreadable one is refused by name. `ranked=False`:
    its metadata and question ids only (what `check_shards` reads)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: shard lists not found: its shard's retrieval (or build) "
                        "failed or has not run. Hint: run fid retrieve-bm25-shard for it.")  # fmt: skip
    arrays = _read(path, ("meta", "question_ids"))
    try:
        meta = json.loads(str(arrays.pop("meta")))
    except ValueError as error:
        raise DataError(f"{path}: not {_EXPECTED} (its meta: {error})") from None
    found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
    if found != LISTS_FORMAT:
        raise DataError(f"{path}: not {_EXPECTED}: format {found!r}")
    shard = ShardLists(path, meta, arrays["question_ids"])
    return with_ranked(shard) if ranked else shard


def with_ranked(shard: ShardLists) -> ShardLists:
    """The shard with its rows, scores and passage ids read, each checked to be (Q, k)."""
    arrays = _read(shard.path, _RANKED)
    q, k = len(shard.question_ids), arrays["rows"].shape[-1]
    if any(arrays[key].shape != (q, k) for key in _RANKED):
        raise DataError(f"{shard.path}: rows, scores and passage ids are not all ({q}, {k}) "
                        "arrays")  # fmt: skip
    return dataclasses.replace(shard, **arrays)


def check_shards(shards: list[ShardLists], stats_meta: dict, stats_dir: Path,
                 questions: list[dict], cfg: BM25Config) -> list[ShardLists]:  # fmt: skip
    """The shards in order, 1..S, each once, of the statistics given and over the file's rows
    one after another; their lists of these questions with this config's top_k and scoring."""
    if not shards:
        raise DataError("no shard lists given: expected the lists of every shard")
    counts = {s.meta["shard"]["count"] for s in shards}
    count = shards[0].meta["shard"]["count"]
    if len(counts) > 1:
        odd = next(s for s in shards if s.meta["shard"]["count"] != count)
        raise DataError(f"{odd.name}: a shard of {odd.meta['shard']['count']} shards, but "
                        f"{shards[0].name} is of {count}: all lists must come from one sharding")  # fmt: skip
    by_index: dict[int, ShardLists] = {}
    for shard in shards:
        index = shard.meta["shard"]["index"]
        if index in by_index:
            raise DataError(f"{shard.path}: shard {index} of {count} again (also "
                            f"{by_index[index].path}): each shard once")  # fmt: skip
        by_index[index] = shard
    missing = [k for k in range(1, count + 1) if k not in by_index]
    if missing:
        given = ", ".join(s.name for s in sorted(shards, key=lambda s: s.meta["shard"]["index"]))
        raise DataError(f"shard {missing[0]} of {count} is missing (given: {given}): every "
                        "shard's lists are needed. Hint: run its build and retrieval, then merge.")  # fmt: skip
    ordered = [by_index[k] for k in range(1, count + 1)]
    next_row = 0
    for shard in ordered:
        if shard.meta["fingerprint"] != stats_meta["fingerprint"]:
            raise DataError(
                f"{shard.name}: built with other BM25 statistics (fingerprint "
                f"{shard.meta['fingerprint'][:12]}..., but {stats_dir} has "
                f"{stats_meta['fingerprint'][:12]}...: the corpus or its analysis changed). "
                "Hint: rebuild the shard with these statistics and retrieve again."
            )
        first, rows = shard.meta["shard"]["first_row"], shard.meta["shard"]["rows"]
        if first != next_row:
            raise DataError(f"{shard.name}: starts at passage row {first}, expected {next_row} "
                            "(the rows after the previous shard's)")  # fmt: skip
        next_row = first + rows
        _check_lists(shard, questions, cfg)
    if next_row != stats_meta["n_passages"]:
        raise DataError(f"{ordered[-1].name}: the shards end at passage row {next_row}, but "
                        f"{stats_dir} counted {stats_meta['n_passages']} passages")  # fmt: skip
    return ordered


def _check_lists(shard: ShardLists, questions: list[dict], cfg: BM25Config) -> None:
    ids = [str(q["id"]) for q in questions]
    if shard.question_ids.tolist() != ids:
        raise DataError(f"{shard.name}: lists of other questions ({len(shard.question_ids)}) "
                        f"than the {len(ids)} given: retrieve the shard for these questions")  # fmt: skip
    if shard.meta["top_k"] != cfg.top_k:
        raise DataError(f"{shard.name}: retrieved with top_k = {shard.meta['top_k']}, but the "
                        f"config has top_k = {cfg.top_k}: retrieve the shard with this config")  # fmt: skip
    for key in _SCORING:
        if shard.meta[key] != getattr(cfg, key):
            raise DataError(f"{shard.name}: built with {key} = {shard.meta[key]!r}, but the "
                            f"config has {key} = {getattr(cfg, key)!r}: rebuild the shard")  # fmt: skip


def merge_top_k(shards: Iterable[ShardLists], k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The global top k of every question: (rows, scores, passage ids), each (Q, <= k), best
    first, ties by global row (as one index's `top_k`).

    The shards are folded in one at a time (an iterator may read each when its turn comes):
    the top k of (the top k so far + the next shard's) is the top k of all shards so far, as
    (score descending, row) is a total order (rows are unique). Holds two shards' arrays at
    most."""
    merged = None
    for shard in shards:
        part = (shard.rows, shard.scores, shard.passage_ids)  # each (Q, the shard's k)
        if merged is not None:
            part = tuple(np.concatenate(pair, axis=1) for pair in zip(merged, part, strict=True))
        order = np.lexsort((part[0], -part[1]), axis=-1)[:, :k]  # score descending, then row
        merged = tuple(np.take_along_axis(a, order, axis=1) for a in part)
    if merged is None:
        raise ValueError("merge_top_k: no shards")
    return merged


def _fetch_rows(passages_path: Path, expected: dict[int, str]) -> dict[int, Passage]:
    """The passages at these rows, each checked to carry the id the shard's index has there."""
    found: dict[int, Passage] = {}
    last = max(expected, default=-1)
    for row, passage in enumerate(iter_passages(passages_path)):
        if row > last:
            break
        if row in expected:
            if passage.id != expected[row]:
                raise DataError(
                    f"{passages_path}: passage {row} (0-based, after the header) has id "
                    f"{passage.id!r}, but the BM25 shards have {expected[row]!r} there: this is "
                    "not the file they were built from. Hint: pass the indexed passages."
                )
            found[row] = passage
    if len(found) < len(expected):
        raise DataError(f"{passages_path}: ends before passage row {last}, which the BM25 shards "
                        "ranked: pass the file they were built from")  # fmt: skip
    return found


def merge_bm25_lists(cfg: BM25Config, stats_dir: Path, shard_paths: list[Path],
                     passages_path: Path, questions_path: Path, output: Path) -> None:  # fmt: skip
    """`fid merge-bm25-lists`: the global top `cfg.top_k` of every question from all shards'
    lists, written as `fid retrieve-bm25` writes one index's (`cfg.list_format`).

    Raises:
        DataError: a shard refused (module docstring), or passages that are not the indexed.
        ConfigError: a config whose analysis is not the statistics'.
    """
    stats_dir, passages_path = Path(stats_dir), Path(passages_path)
    stats_meta = load_stats_meta(stats_dir)
    check_stats_config(stats_meta, cfg, stats_dir)
    questions = load_questions(questions_path)
    shards = check_shards([read_shard_lists(p, ranked=False) for p in shard_paths], stats_meta,
                          stats_dir, questions, cfg)  # fmt: skip
    k = min(cfg.top_k, int(stats_meta["n_passages"]))
    rows, scores, ids = merge_top_k((with_ranked(shard) for shard in shards), k)
    if cfg.list_format == "compact":
        store = _passage_store(passages_path, rows, ids)
        write_compact_lists(output, questions, ids.tolist(), scores.tolist(), store)
    else:
        expected = dict(zip(rows.ravel().tolist(), ids.ravel().tolist(), strict=True))
        found = _fetch_rows(passages_path, expected)
        records = retrieval_records(questions, rows.tolist(), scores.tolist(), found)
        atomic_write_json(output, records)
    logger.info("merged %d BM25 shards: top %d of %d questions -> %s", len(shards), k,
                len(questions), output)  # fmt: skip


def _passage_store(passages_path: Path, rows: np.ndarray, ids: np.ndarray) -> PassageStore:
    """A store folder as it is, or the ranked rows read from the TSV (checked by id)."""
    if passages_path.is_dir():
        return open_store(passages_path)
    expected = dict(zip(rows.ravel().tolist(), ids.ravel().tolist(), strict=True))
    found = _fetch_rows(passages_path, expected)
    return passages_in_memory(passages_path, {p.id: p for p in found.values()})
