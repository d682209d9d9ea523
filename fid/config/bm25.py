"""Knobs of the BM25 commands (`fid build-bm25`, `retrieve-bm25`, `bm25-stats`, the sharded
index's `retrieve-bm25-shard` and `merge-bm25-lists`): scoring, text analysis and search."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from fid.config.loading import ConfigError, check_range

METHODS = ("robertson", "lucene", "bm25+", "bm25l", "atire")

# Lucene's English stopword set (EnglishAnalyzer.ENGLISH_STOP_WORDS_SET), which Anserini's and
# Pyserini's default analyzer removes, and the lists bm25s ships, by the names it accepts.
LUCENE_STOPWORDS = (
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is",
    "it", "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there",
    "these", "they", "this", "to", "was", "will", "with",
)  # fmt: skip
STOPWORDS = ("lucene", "en", "en_plus", "da", "de", "es", "fr", "it", "ko", "nl", "no", "pt")
STOPWORDS += ("ru", "sv", "tr", "zh")


@dataclass(frozen=True)
class BM25Config:
    """`fid build-bm25` / `fid retrieve-bm25`: BM25 scoring and search knobs.

    Attributes:
        k1: term-frequency saturation (built into the index).
        b: document-length normalization, 0 (none) to 1 (full) (built into the index).
        method: the bm25s scoring variant (built into the index).
        stopwords: "lucene" (Lucene's 33-word English set, what Anserini/Pyserini's default
            analyzer removes), a bm25s list name ("en", ...) or None to keep all tokens.
        stemmer: "porter" (Anserini/Pyserini's default), "english" (Snowball) or None, through
            PyStemmer.
        token_pattern: the regular expression whose matches are the tokens (lowercased);
            `(?u)\b\\w+\b` keeps 1-character tokens as Lucene's StandardTokenizer does
            (bm25s's default `\\w\\w+` drops them).
        top_k: passages kept per question (fewer when the corpus is smaller).
        batch_size: questions searched per batch (bounds memory and paces the progress log).
        list_format: what retrieve-bm25 writes: "fid_json" (FiD records with every passage's
            text) or "compact" (passage ids and scores, fid.data.retrieval_lists; the text is
            read from a passage store when used).
        shards: the workflow's BM25 jobs. 1: one index (build-bm25) and one retrieval job per
            split. S > 1: a statistics pass over the whole corpus (bm25-stats), S shard
            builds with those global statistics (build-bm25 --shard K/S), S retrievals per
            split (retrieve-bm25-shard) and a merge per split (merge-bm25-lists): the lists
            equal one index's, each job holding a shard. The commands themselves ignore it.

    Everything but top_k, batch_size, list_format and shards is built into the index; retrieval
    reads it from there (a config that disagrees with the index is an error).
    """

    k1: float = 0.9
    b: float = 0.4
    method: Literal["robertson", "lucene", "bm25+", "bm25l", "atire"] = "lucene"
    stopwords: str | None = "lucene"
    stemmer: Literal["porter", "english"] | None = "porter"
    token_pattern: str = r"(?u)\b\w+\b"
    top_k: int = 100
    batch_size: int = 256
    list_format: Literal["fid_json", "compact"] = "fid_json"
    shards: int = 1

    def __post_init__(self):
        check_range("shards", self.shards, low=1)
        _check_number("k1", self.k1, low=0.0)
        _check_number("b", self.b, low=0.0, high=1.0)
        if self.method not in METHODS:
            raise ConfigError(f"method = {self.method!r} is not allowed: expected one of {METHODS}")
        if self.stopwords is not None and self.stopwords not in STOPWORDS:
            raise ConfigError(
                f"stopwords = {self.stopwords!r} is not allowed: expected null or one of "
                f"{STOPWORDS}"
            )
        try:
            if re.compile(self.token_pattern).match(""):
                raise ConfigError(
                    f"token_pattern = {self.token_pattern!r} matches the empty string: "
                    r"expected a pattern of tokens such as '(?u)\b\w+\b'"
                )
        except re.error as error:
            raise ConfigError(
                f"token_pattern = {self.token_pattern!r} is no regular expression: {error}"
            ) from None
        _check_int("top_k", self.top_k)
        _check_int("batch_size", self.batch_size)


def _check_number(name: str, value: Any, low: float, high: float | None = None) -> None:
    allowed = f">= {low}" + ("" if high is None else f" and <= {high}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name} = {value!r} is not a number: expected a number {allowed}")
    if value < low or (high is not None and value > high):
        raise ConfigError(f"{name} = {value!r} is out of range: expected {allowed}")


def _check_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} = {value!r} is not allowed: expected an integer >= 1")
