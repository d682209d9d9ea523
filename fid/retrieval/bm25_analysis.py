"""How text becomes BM25 tokens: the bm25s tokenizer of an analysis (token pattern, lowercase,
stopwords, PyStemmer stemmer), the analysis an index recorded, and questions analysed as an
index's passages were. Shared by the single index (fid.retrieval.bm25), its search
(fid.retrieval.bm25_search) and the sharded index's statistics and shards (bm25_stats,
bm25_shard), so all of them tokenize alike.

By default as Anserini's and Pyserini's BM25: the token pattern `(?u)\\b\\w+\\b`, Lucene's 33
English stopwords (fid.config.bm25.LUCENE_STOPWORDS) and Porter stems.
"""

from __future__ import annotations

from typing import Any

from bm25s.tokenization import Tokenizer

from fid.config.bm25 import LUCENE_STOPWORDS


def _stemmer(name: str | None) -> Any:
    """PyStemmer's stemmer of that algorithm ("porter", "english" = Snowball), or None."""
    if name is None:
        return None
    import Stemmer

    return Stemmer.Stemmer(name)


def _tokenizer(analysis: dict) -> Tokenizer:
    """The tokenizer of an analysis: {"token_pattern", "stopwords", "stemmer"} (a config's or
    an index's meta.json)."""
    stopwords = analysis["stopwords"]
    if stopwords == "lucene":
        stopwords = list(LUCENE_STOPWORDS)
    return Tokenizer(
        lower=True,
        splitter=analysis["token_pattern"],
        stopwords=stopwords or [],
        stemmer=_stemmer(analysis["stemmer"]),
    )


def _index_analysis(meta: dict) -> dict:
    """The analysis an index was built with (indexes of fid 0.1 named the stemmer with its
    version: "english (PyStemmer 2.2.0)")."""
    stemmer = meta.get("stemmer")
    if isinstance(stemmer, str) and " " in stemmer:
        stemmer = stemmer.split()[0]
    return {
        "token_pattern": meta["token_pattern"],
        "stopwords": meta["stopwords"],
        "stemmer": stemmer,
    }


def _query_tokens(questions: list[str], meta: dict) -> list[list[str]]:
    """Questions analysed exactly as the passages were (tokens or stems, as strings)."""
    tokenizer = _tokenizer(_index_analysis(meta))
    return tokenizer.tokenize(questions, update_vocab=True, return_as="string", show_progress=False)


def _pystemmer_version() -> str:
    from importlib.metadata import version

    return version("PyStemmer")
