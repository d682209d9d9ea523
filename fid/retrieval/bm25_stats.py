"""The corpus-wide statistics of a sharded BM25 index (`fid bm25-stats`), counted in one streamed
pass over the passage file.

BM25 scores a (passage, token) pair with the token's idf (from N, the passages, and df, the
passages holding the token) and the passage's length against the average length. A shard indexed
with its own N, df and average would score differently from one index over every passage; each
shard is built with these global figures instead (fid.retrieval.bm25_shard), so its scores are
the whole index's, bit for bit.

The folder written:
- `meta.json`: format, the passage file (path, bytes, sha256), N, the tokens of all passages
  (their average length is `n_tokens / n_passages`), the analysis, the library versions that
  tokenize, and `fingerprint`, a digest of the corpus and the analysis that each shard and its
  lists carry, so that the merge refuses a shard of another corpus;
- `vocabulary.json`: the tokens (stems) in the order of their ids, which are the ids that one
  index over the whole file gives them (bm25s numbers tokens by first appearance);
- `doc_freqs.npy`: (V,) int64, df of token id t at [t];
- the corpus tokenized, so that no shard tokenizes its passages again (tokenizing is most of
  the CPU of both passes: ~90 us a passage): `token_ids.i32`, every passage's token ids (these
  global ids) concatenated, raw little-endian int32 (streamed, so no .npy header);
  `token_offsets.npy`, (N + 1,) int64, passage row r's ids are [offsets[r], offsets[r + 1]);
  `distinct_tokens.npy`, (N,) int32, its distinct ids (the entries of its score-matrix row).
  4 bytes a token and 12 a passage: ~6 GB for psgs_w100.

Memory: passages are never held; the vocabulary (as in any BM25 build), df, and 20 bytes a
passage (the duplicate-id check's hashes, the offsets and distinct counts).
"""

from __future__ import annotations

import array
import hashlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import bm25s
import numpy as np

from fid.config import BM25Config, ConfigError
from fid.data.passage_store import file_sha256
from fid.data.passages import check_unique_ids, count_passages, iter_passages
from fid.errors import DataError
from fid.retrieval.bm25_analysis import _pystemmer_version, _tokenizer
from fid.runtime.fileio import atomic_directory, atomic_write_json
from fid.runtime.progress import progress
from fid.text_files import read_json

logger = logging.getLogger(__name__)

STATS_FORMAT = "fid-bm25-stats/2"  # /2: with the tokenized corpus (/1 had none)
_META = "meta.json"
_VOCABULARY = "vocabulary.json"
_DOC_FREQS = "doc_freqs.npy"
_TOKEN_IDS = "token_ids.i32"
_TOKEN_OFFSETS = "token_offsets.npy"
_DISTINCT = "distinct_tokens.npy"
_TOKENS_FLUSH = 1 << 22  # token ids buffered (16 MiB) between two writes


def analysis_of(cfg: BM25Config) -> dict:
    """The analysis a config tokenizes with, as an index's meta.json records it."""
    return {"token_pattern": cfg.token_pattern, "stopwords": cfg.stopwords,
            "stemmer": cfg.stemmer}  # fmt: skip


def _tokenizer_versions(cfg: BM25Config) -> dict:
    """The library versions whose code tokenizes (another stemmer release may stem otherwise)."""
    return {"bm25s_version": bm25s.__version__,
            "pystemmer_version": _pystemmer_version() if cfg.stemmer else None}  # fmt: skip


def fingerprint(sha256: str, n_bytes: int, analysis: dict, versions: dict) -> str:
    """A digest of the corpus (its bytes) and how it is tokenized: equal fingerprints, equal
    statistics."""
    record = {"sha256": sha256, "bytes": n_bytes, "analysis": analysis, **versions}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


class DocFrequencyCounter:
    """df of every token id, counted a block of passages at a time.

    A Python increment per (passage, token) would cost minutes at 21M passages; each passage's
    distinct ids go to a buffer instead, which one `np.bincount` adds up.
    """

    _FLUSH = 1 << 22  # buffered ids (16 MiB) between two bincounts

    def __init__(self):
        self.counts = np.zeros(0, dtype=np.int64)  # (V,) df so far
        self.pairs = 0  # distinct (passage, token) pairs: the entries of the score matrix
        self._buffer = array.array("i")

    def add(self, token_ids: list[int]) -> int:
        """Counts one passage's ids; returns how many are distinct."""
        distinct = set(token_ids)
        self._buffer.extend(distinct)
        self.pairs += len(distinct)
        if len(self._buffer) >= self._FLUSH:
            self._flush()
        return len(distinct)

    def _flush(self) -> None:
        ids = np.frombuffer(self._buffer, dtype=np.int32)
        found = np.bincount(ids, minlength=len(self.counts))
        if len(found) > len(self.counts):
            self.counts = np.concatenate([self.counts, np.zeros(len(found) - len(self.counts),
                                                                dtype=np.int64)])  # fmt: skip
        self.counts += found
        self._buffer = array.array("i")

    def result(self, vocab_size: int) -> np.ndarray:
        """(vocab_size,) int64 df (tokens never counted, such as an unused empty token: 0)."""
        self._flush()
        counts = np.zeros(vocab_size, dtype=np.int64)
        counts[: len(self.counts)] = self.counts
        return counts


@dataclass(frozen=True)
class CorpusStats:
    """The statistics as a shard build reads them (`load_stats`)."""

    meta: dict
    vocabulary: dict[str, int]  # token -> id, ids 0..V-1
    doc_freqs: np.ndarray  # (V,) int64
    folder: Path

    def passage_tokens(self, first_row: int, rows: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Passage rows first_row .. first_row + rows - 1 as counted: ((T,) int32 token ids,
        (rows + 1,) int64 offsets into them from 0, their distinct (passage, token) pairs).
        Reads only those rows' bytes (memory-mapped)."""
        offsets = np.load(self.folder / _TOKEN_OFFSETS, mmap_mode="r")
        distinct = np.load(self.folder / _DISTINCT, mmap_mode="r")
        if len(offsets) != self.meta["n_passages"] + 1 or len(distinct) != len(offsets) - 1:
            raise DataError(f"{self.folder}: {_TOKEN_OFFSETS} or {_DISTINCT} does not hold the "
                            f"{self.meta['n_passages']} passages of {_META}: count the "
                            "statistics again")  # fmt: skip
        bounds = np.array(offsets[first_row : first_row + rows + 1], dtype=np.int64)
        path = self.folder / _TOKEN_IDS
        if path.stat().st_size != 4 * int(offsets[-1]):
            raise DataError(f"{path}: {path.stat().st_size} bytes, expected 4 a token for the "
                            f"{int(offsets[-1])} tokens of {_TOKEN_OFFSETS}: count the "
                            "statistics again")  # fmt: skip
        ids = np.fromfile(path, dtype="<i4", count=int(bounds[-1] - bounds[0]),
                          offset=4 * int(bounds[0]))  # fmt: skip
        pairs = int(np.sum(distinct[first_row : first_row + rows], dtype=np.int64))
        return ids.astype(np.int32, copy=False), bounds - bounds[0], pairs

    @property
    def avg_doc_len(self) -> np.float64:
        # bm25s averages the lengths with np.mean of an int64 array: the exact integer sum
        # divided by N, a float64. The same division here gives the same bits, and a numpy
        # float64 (not a Python float) keeps bm25s's float64 arithmetic in its tfc formula.
        return np.float64(self.meta["n_tokens"]) / np.float64(self.meta["n_passages"])


def count_corpus_stats(passages_path: str | Path, output: str | Path, cfg: BM25Config) -> None:
    """`fid bm25-stats`: streams the passage file once and writes its statistics folder
    (atomically; see the module docstring).

    Raises:
        DataError: a malformed passage file, duplicate passage ids, or no passages.
    """
    passages_path, output = Path(passages_path), Path(output)
    analysis = analysis_of(cfg)
    tokenizer = _tokenizer(analysis)
    counter = DocFrequencyCounter()
    id_hashes = array.array("q")  # 8 bytes a passage: duplicate ids without holding the ids
    offsets, distinct = array.array("q", [0]), array.array("i")
    total = count_passages(passages_path)

    def texts() -> Iterator[str]:
        with progress(desc="BM25 statistics", unit="passages", total=total, log=logger) as bar:
            for passage in iter_passages(passages_path):
                id_hashes.append(_id_hash(passage.id))
                yield f"{passage.title} {passage.text}"
                bar.update()

    with atomic_directory(output) as tmp:
        # The tokenizer, its calls and its vocabulary as build_bm25's: the same ids, in order.
        with open(tmp / _TOKEN_IDS, "wb") as tokens_file:
            buffer = array.array("i")
            for token_ids in tokenizer.streaming_tokenize(texts(), update_vocab=True,
                                                          allow_empty=True):  # fmt: skip
                buffer.extend(token_ids)
                offsets.append(offsets[-1] + len(token_ids))
                distinct.append(counter.add(token_ids))
                if len(buffer) >= _TOKENS_FLUSH:
                    _write_int32(tokens_file, buffer)
                    buffer = array.array("i")
            _write_int32(tokens_file, buffer)
        if not id_hashes:
            raise DataError(f"{passages_path}: no passages to index")
        _check_unique_ids(passages_path, np.frombuffer(id_hashes, dtype=np.int64))
        _write_stats(tmp, passages_path, cfg, tokenizer, counter, offsets, distinct)
    logger.info("BM25 statistics of %d passages (%d tokens) -> %s", len(id_hashes), offsets[-1],
                output)  # fmt: skip


def _write_int32(handle, values: array.array) -> None:
    """Raw int32 in little-endian order, whatever the machine's."""
    np.frombuffer(values, dtype=np.int32).astype("<i4", copy=False).tofile(handle)


def _write_stats(tmp: Path, passages_path: Path, cfg: BM25Config, tokenizer, counter,
                 offsets: array.array, distinct: array.array) -> None:  # fmt: skip
    """The statistics' files but the token ids (already written) into the folder `tmp`."""
    analysis = analysis_of(cfg)
    vocab = tokenizer.get_vocab_dict()
    tokens = sorted(vocab, key=vocab.__getitem__)
    if [vocab[token] for token in tokens] != list(range(len(tokens))):
        raise AssertionError("bm25s's vocabulary ids are not 0..V-1")  # what the shards rely on
    sha256 = file_sha256(passages_path)
    versions = _tokenizer_versions(cfg)
    meta = {
        "format": STATS_FORMAT,
        "source": str(passages_path),
        "bytes": passages_path.stat().st_size,
        "sha256": sha256,
        "n_passages": len(distinct),
        "n_tokens": offsets[-1],
        "vocab_size": len(tokens),
        "analysis": analysis,
        **versions,
        "fingerprint": fingerprint(sha256, passages_path.stat().st_size, analysis, versions),
    }
    np.save(tmp / _DOC_FREQS, counter.result(len(tokens)), allow_pickle=False)
    np.save(tmp / _TOKEN_OFFSETS, np.frombuffer(offsets, dtype=np.int64), allow_pickle=False)
    np.save(tmp / _DISTINCT, np.frombuffer(distinct, dtype=np.int32), allow_pickle=False)
    atomic_write_json(tmp / _VOCABULARY, tokens)
    atomic_write_json(tmp / _META, meta)


def _id_hash(passage_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(passage_id.encode(), digest_size=8).digest(), "little",
                          signed=True)  # fmt: skip


def _check_unique_ids(passages_path: Path, hashes: np.ndarray) -> None:
    """Duplicate passage ids refused, as build_bm25 refuses them: equal 64-bit hashes are
    looked up again in a second pass (a collision of distinct ids is no duplicate)."""
    ordered = np.sort(hashes)
    repeated = set(ordered[1:][ordered[1:] == ordered[:-1]].tolist())
    if not repeated:
        return
    suspects = [p.id for p in iter_passages(passages_path) if _id_hash(p.id) in repeated]
    check_unique_ids(suspects, str(passages_path))


def load_stats_meta(stats_dir: str | Path) -> dict:
    """A statistics folder's meta.json, checked to be one."""
    path = Path(stats_dir) / _META
    if not path.is_file():
        raise DataError(f"{stats_dir}: not BM25 statistics ({_META} not found). Hint: count them "
                        "with `fid bm25-stats --passages PASSAGES.tsv --output STATS`.")  # fmt: skip
    meta = read_json(path, "BM25 statistics (json): count them again with fid bm25-stats")
    if not isinstance(meta, dict) or meta.get("format") != STATS_FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise DataError(f"{path}: format {found!r}, expected {STATS_FORMAT!r} (fid bm25-stats)")
    return meta


def check_stats_config(meta: dict, cfg: BM25Config, stats_dir: str | Path) -> None:
    """The statistics were counted with the config's analysis (else every token id differs)."""
    for key, value in meta["analysis"].items():
        if value != getattr(cfg, key):
            raise ConfigError(
                f"{key} = {getattr(cfg, key)!r}, but the BM25 statistics at {stats_dir} were "
                f"counted with {key} = {value!r}. Hint: count them again with this config."
            )


def load_stats(stats_dir: str | Path, cfg: BM25Config) -> CorpusStats:
    """The statistics of a folder written by `count_corpus_stats`, for a shard build with `cfg`.

    Raises:
        DataError: no statistics folder, or files that disagree with its meta.json.
        ConfigError: the config's analysis is not the one counted.
    """
    stats_dir = Path(stats_dir)
    meta = load_stats_meta(stats_dir)
    check_stats_config(meta, cfg, stats_dir)
    versions = _tokenizer_versions(cfg)
    for key, value in versions.items():
        if meta.get(key) != value:
            raise DataError(
                f"{stats_dir}: counted with {key.removesuffix('_version')} {meta.get(key)}, but "
                f"this environment has {value}: tokens may differ. Hint: count the statistics "
                "again in this environment."
            )
    tokens = read_json(stats_dir / _VOCABULARY, "a BM25 vocabulary (json list of tokens)")
    try:
        doc_freqs = np.load(stats_dir / _DOC_FREQS, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise DataError(f"{stats_dir / _DOC_FREQS}: not a saved df array ({error})") from None
    if not isinstance(tokens, list) or not len(tokens) == meta["vocab_size"] == len(doc_freqs):
        raise DataError(f"{stats_dir}: {_VOCABULARY} and {_DOC_FREQS} do not hold the "
                        f"{meta['vocab_size']} tokens of {_META}: count the statistics again")  # fmt: skip
    return CorpusStats(meta, {token: i for i, token in enumerate(tokens)}, doc_freqs, stats_dir)
