"""A BM25 index folder: its file names and format tags (one index's, written by build_bm25, and a
shard's, by fid.retrieval.bm25_shard), its meta.json read and checked for what the caller
expects, and the config checked against the scoring and analysis the index was built with.
"""

from __future__ import annotations

from pathlib import Path

from fid.config import BM25Config, ConfigError
from fid.errors import DataError
from fid.retrieval.bm25_analysis import _index_analysis
from fid.text_files import read_json

INDEX_FORMAT = "fid-bm25/1"
# One shard of a sharded index (fid.retrieval.bm25_shard): its lists are merged, never final.
SHARD_INDEX_FORMAT = "fid-bm25-shard/1"
_META = "meta.json"
_IDS = "passage_ids.npy"


def _load_meta(index_dir: Path, expected: str = INDEX_FORMAT) -> dict:
    path = index_dir / _META
    if not path.is_file():
        raise DataError(
            f"{index_dir}: not a BM25 index ({_META} not found). Hint: build it first with "
            "`fid build-bm25 --passages PASSAGES.tsv --output INDEX_FOLDER`."
        )
    meta = read_json(path, "a BM25 index record (json): rebuild the index")
    if not isinstance(meta, dict):
        raise DataError(f"{path}: expected a JSON object, found {type(meta).__name__}")
    if meta.get("format") == SHARD_INDEX_FORMAT != expected:
        shard = meta.get("shard", {})
        raise DataError(
            f"{index_dir}: shard {shard.get('index')} of {shard.get('count')} of a sharded BM25 "
            "index, which ranks its own passages only. Hint: retrieve from every shard with "
            "`fid retrieve-bm25-shard`, then `fid merge-bm25-lists`."
        )
    if meta.get("format") != expected:
        raise DataError(f"{path}: format {meta.get('format')!r}, expected {expected!r}")
    return meta


def _check_index_matches(meta: dict, cfg: BM25Config, index_dir: Path) -> None:
    """The index fixes the scoring and the analysis; a config that differs needs a rebuild."""
    built = {**{key: meta[key] for key in ("k1", "b", "method")}, **_index_analysis(meta)}
    for key, value in built.items():
        if value != getattr(cfg, key):
            raise ConfigError(
                f"{key} = {getattr(cfg, key)!r}, but the BM25 index at {index_dir} was built with "
                f"{key} = {value!r}. Hint: rebuild the index with this config, or use the "
                "index's value."
            )
