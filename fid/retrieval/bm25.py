"""BM25 retrieval over a DPR passage file with the bm25s library (the pipeline's first retriever).

`build_bm25` streams the passages once, tokenizes `title + " " + text` with bm25s's
tokenizer (lowercase, a token pattern, stopwords removed, stems) and saves a bm25s index plus
the passage ids and a `meta.json` to a folder, atomically (its layout: fid.retrieval.bm25_folder).
`retrieve_bm25` (`rank_bm25` for questions in memory) searches that folder
(fid.retrieval.bm25_search) for any number of question files (each split reuses the same
index), returning FiD-format records whose ctxs carry DPR's has-answer flag, or compact lists.

Analysis (fid.retrieval.bm25_analysis), by default as Anserini's and Pyserini's BM25 (the published BM25 baselines of DPR
and FiD): Lucene's StandardTokenizer keeps 1-character tokens (token pattern `(?u)\\b\\w+\\b`),
Lucene's 33 English stopwords are removed and tokens are Porter-stemmed (PyStemmer, a
dependency). The index's `meta.json` records the analysis, and questions are analysed the same
way at retrieval. Measured on samples/squad-open-tiny (200 questions, 167 passages) by
benchmarks/retrieval/bm25_analysis.py: see its docstring.

Memory: passages are never held as objects. Token ids are collected in one flat int32 array
(4 bytes a token) while the file streams; bm25s then builds its sparse score matrix, which for
DPR's 21M passages needs tens of GB (12 bytes per distinct (passage, token) pair, roughly
1.2e9 pairs, plus sorting). Build the full-size index on a large-memory node, or in shards of
bounded memory that rank exactly as one index (fid.retrieval.bm25_stats, bm25_shard, bm25_merge).

Ranking: bm25s's `lucene` variant by default, k1 = 0.9 and b = 0.4 (Anserini's and Pyserini's
defaults, which DPR's BM25 numbers used). Reference: Kamphuis et al. 2020, "Which BM25 Do You
Mean? A Large-Scale Reproducibility Study of Scoring Variants" (the variants bm25s implements).
"""

from __future__ import annotations

import array
import logging
import math
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import bm25s
import numpy as np
from bm25s.tokenization import Tokenizer

from fid.config import BM25Config
from fid.data.passage_store import PassageStore, open_store, passages_in_memory
from fid.data.passages import Passage, check_unique_ids, count_passages, iter_passages
from fid.data.questions import load_questions
from fid.errors import DataError
from fid.retrieval.bm25_analysis import _pystemmer_version, _tokenizer
from fid.retrieval.bm25_folder import _IDS, _META, INDEX_FORMAT
from fid.retrieval.bm25_search import search_bm25
from fid.retrieval.ranking import retrieval_records, write_compact_lists
from fid.runtime.fileio import atomic_directory, atomic_write_json
from fid.runtime.progress import progress

logger = logging.getLogger(__name__)

# How often bm25s's index builder reads the documents (bm25s 0.2/0.3: lengths, document
# frequencies, scores): the denominator of its progress lines only.
_BUILD_PASSES = 3


class _FlatDocs:
    """Every passage's token ids in one int32 array, iterable as lists the way bm25s wants.

    bm25s's index builder only takes `len()` and iterates the documents (three times); lists of
    Python ints would cost ~10x the memory of this array.
    """

    def __init__(self, flat: np.ndarray, offsets: np.ndarray, total_passes: int = _BUILD_PASSES):
        self.flat = flat  # (T,) token ids of all passages, concatenated
        self.offsets = offsets  # (P + 1,) passage p's ids are flat[offsets[p] : offsets[p + 1]]
        self.passes = 0  # how often the builder has read them (its progress: 3 passes)
        self.total_passes = total_passes  # (a shard's build reads them once: bm25_shard)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __iter__(self) -> Iterator[list[int]]:
        self.passes += 1
        # bm25s reads the documents for their lengths, document frequencies and scores
        desc = f"BM25 index, pass {self.passes} of {self.total_passes}"
        with progress(desc=desc, unit="passages", total=len(self), log=logger) as bar:
            # Offsets become Python ints a block at a time: all 21M at once would cost GBs.
            for block in range(0, len(self), 1 << 16):
                bounds = self.offsets[block : block + (1 << 16) + 1].tolist()
                for start, end in zip(bounds[:-1], bounds[1:], strict=True):
                    yield self.flat[start:end].tolist()
                bar.update(len(bounds) - 1)


def _tokenize_corpus(passages_path: Path, tokenizer: Tokenizer) -> tuple[_FlatDocs, list[str]]:
    """Streams the passage file once: (token ids of every passage, passage ids in order)."""
    ids: list[str] = []
    flat = array.array("i")
    offsets = array.array("q", [0])

    total = count_passages(passages_path)  # newlines counted (~0.3 s a GB): an ETA

    def texts() -> Iterator[str]:
        with progress(desc="tokenize", unit="passages", total=total, log=logger) as bar:
            for passage in iter_passages(passages_path):
                ids.append(passage.id)
                yield f"{passage.title} {passage.text}"
                bar.update()

    # allow_empty: a passage left with no tokens (all stopwords) gets bm25s's empty token, so
    # document numbers stay aligned with the file's rows.
    for token_ids in tokenizer.streaming_tokenize(texts(), update_vocab=True, allow_empty=True):
        flat.extend(token_ids)
        offsets.append(len(flat))
    docs = _FlatDocs(np.frombuffer(flat, dtype=np.int32), np.frombuffer(offsets, dtype=np.int64))
    return docs, ids


def text_statistics(passages: str | Path | Iterable[Passage], cfg: BM25Config,
                    max_bytes: int = 4 << 20) -> dict:  # fmt: skip
    """How passages tokenize for this BM25 config, from the first `max_bytes` of a passage file
    (or of the passages given): what the disk plan sizes an index by
    (fid.memory.disk_sizes.TextStats): the index's entries (a passage's distinct terms) and
    its tokens per byte of the file, and Heaps' law of the vocabulary (terms = k x
    tokens^beta) fitted between the sample's first half and whole."""
    if isinstance(passages, str | Path):
        sample = min(max_bytes, Path(passages).stat().st_size)
        passages = iter_passages(passages)
    else:
        passages = list(passages)
        sample = min(max_bytes, sum(len(p.id) + len(p.title) + len(p.text) + 3 for p in passages))
    analysis = {"token_pattern": cfg.token_pattern, "stopwords": cfg.stopwords,
                "stemmer": cfg.stemmer}  # fmt: skip
    tokenizer = _tokenizer(analysis)
    read = entries = tokens = 0
    halfway = None
    for passage in passages:
        (ids,) = tokenizer.tokenize([f"{passage.title} {passage.text}"], update_vocab=True,
                                    return_as="ids", show_progress=False)  # fmt: skip
        read += len(passage.id) + len(passage.title) + len(passage.text) + 3  # a line's bytes
        entries, tokens = entries + len(set(ids)), tokens + len(ids)
        if halfway is None and read >= sample // 2:
            halfway = (tokens, len(tokenizer.get_vocab_dict()))
        if read >= max_bytes:
            break
    vocab = len(tokenizer.get_vocab_dict())
    if not read:
        raise DataError("no passages to measure")
    beta = 1.0
    if halfway and tokens > halfway[0] and vocab > halfway[1] > 0:
        beta = math.log(vocab / halfway[1]) / math.log(tokens / halfway[0])
    return {"entries_per_byte": entries / read, "tokens_per_byte": tokens / read,
            "heaps_k": vocab / max(1, tokens) ** beta, "heaps_beta": beta}  # fmt: skip


def build_bm25(passages_path: str | Path, index_dir: str | Path, cfg: BM25Config) -> None:
    """Builds a BM25 index of a DPR passage file and saves it to a folder (atomically).

    The folder holds bm25s's index files, `passage_ids.npy` (the passage ids in file order, a
    unicode array readable with `allow_pickle=False`) and `meta.json` (format, passage count,
    source, bm25s version, scoring and tokenizer parameters).

    Args:
        passages_path: a DPR TSV passage file (streamed once).
        index_dir: the output folder; replaced as a whole when the build succeeds.
        cfg: scoring parameters (k1, b, method, stopwords) are fixed into the index.

    Raises:
        DataError: a malformed passage file, duplicate passage ids, or no passages.
    """
    passages_path, index_dir = Path(passages_path), Path(index_dir)
    started = time.perf_counter()
    analysis = {"token_pattern": cfg.token_pattern, "stopwords": cfg.stopwords}
    analysis["stemmer"] = cfg.stemmer
    tokenizer = _tokenizer(analysis)
    docs, ids = _tokenize_corpus(passages_path, tokenizer)
    if not ids:
        raise DataError(f"{passages_path}: no passages to index")
    check_unique_ids(ids, str(passages_path))
    vocab = tokenizer.get_vocab_dict()  # token (or stem) -> id, ids 0..V-1
    tokenized = time.perf_counter()

    retriever = bm25s.BM25(k1=cfg.k1, b=cfg.b, method=cfg.method)
    # `BM25.index` takes token ids only as a list of lists; its documented low-level builder
    # takes any sized iterable, which lets the ids stay in one flat array. What `index` then
    # does is set these three attributes (the empty token is already in the vocabulary).
    retriever.scores = retriever.build_index_from_ids(
        unique_token_ids=list(vocab.values()), corpus_token_ids=docs, show_progress=False
    )
    retriever.vocab_dict = vocab
    retriever.unique_token_ids_set = set(vocab.values())

    meta = {
        "format": INDEX_FORMAT,
        "n_passages": len(ids),
        "n_tokens": int(len(docs.flat)),
        "vocab_size": len(vocab),
        "source": str(passages_path),
        "bm25s_version": bm25s.__version__,
        "k1": cfg.k1,
        "b": cfg.b,
        "method": cfg.method,
        "delta": retriever.delta,  # used by bm25l and bm25+ only
        "stopwords": cfg.stopwords,
        "lowercase": True,
        **analysis,
        "pystemmer_version": _pystemmer_version() if cfg.stemmer else None,
        "document": "title + ' ' + text",
    }
    with atomic_directory(index_dir) as tmp:
        retriever.save(tmp, show_progress=False)
        np.save(tmp / _IDS, np.array(ids, dtype=np.str_), allow_pickle=False)
        atomic_write_json(tmp / _META, meta)
    logger.info(
        "BM25 index of %d passages (%d tokens, vocabulary %d%s) in %.1f s "
        "(tokenizing %.1f s) -> %s",
        len(ids),
        meta["n_tokens"],
        len(vocab),
        f", stemmer {cfg.stemmer}" if cfg.stemmer else ", no stemmer",
        time.perf_counter() - started,
        tokenized - started,
        index_dir,
    )


def _fetch_passages(passages_path: Path, ids: np.ndarray, needed: set[int]) -> dict[int, Passage]:
    """The passages at the given row numbers, reading the file once (and only up to the last).

    Every row read is checked against the index's id for that row, so a passage file other than
    the indexed one is caught instead of silently giving wrong texts.
    """
    found: dict[int, Passage] = {}
    last = max(needed, default=-1)
    row = -1
    bar = progress(desc="fetch passages", unit="rows", total=last + 1, log=logger)
    for row, passage in enumerate(iter_passages(passages_path)):
        if row > last:
            break
        if row % 10_000 == 9_999:  # an update per row would add ~7% to the read
            bar.update(10_000)
        if row >= len(ids) or passage.id != ids[row]:
            expected = str(ids[row]) if row < len(ids) else "no passage (the index is shorter)"
            raise DataError(
                f"{passages_path}: passage {row} (0-based, after the header) has id "
                f"{passage.id!r}, but the BM25 index has {expected!r} there: this is not the "
                "file the index was built from. Hint: rebuild the index or pass its passages."
            )
        if row in needed:
            found[row] = passage
    bar.update(min(row, last) + 1 - bar.n)
    bar.close()
    if len(found) < len(needed):
        raise DataError(
            f"{passages_path}: ends after {row + 1} passages, but the BM25 index has {len(ids)}. "
            "Hint: rebuild the index or pass the file it was built from."
        )
    return found


def _passage_store(passages_path: Path, ids: np.ndarray, rows: list[np.ndarray]) -> PassageStore:
    """The passages of compact lists: a store folder as it is, or the rows that the lists name
    read from the TSV (each checked against the index's id for its row)."""
    if passages_path.is_dir():
        return open_store(passages_path)
    found = _fetch_passages(passages_path, ids, {int(r) for rs in rows for r in rs})
    return passages_in_memory(passages_path, {p.id: p for p in found.values()})


def rank_bm25(
    index_dir: str | Path,
    passages_path: str | Path,
    questions: list[dict],
    cfg: BM25Config,
) -> list[dict]:
    """Ranks passages for each question with a saved BM25 index.

    Args:
        index_dir: a folder written by `build_bm25` (reusable for any question set).
        passages_path: the passage file the index was built from (texts are read from it).
        questions: dicts with "id", "question" and optionally "answers" (see
            `fid.data.questions.load_questions`).
        cfg: must agree with the index on k1, b, method and stopwords; gives top_k and
            batch_size.

    Returns:
        FiD-format records `{id, question, answers, ctxs}` in question order; ctxs are the top
        `cfg.top_k` passages (all when the corpus is smaller) by descending BM25 score, each
        `{id, title, text, score, has_answer}`; has_answer follows DPR's string rule and is
        False for questions without answers.

    Raises:
        DataError: a missing or foreign index, or a passage file that does not match it.
        ConfigError: cfg disagrees with the parameters the index was built with.
        ValueError: a question without an "id" or a "question" string.
    """
    started = time.perf_counter()
    ids, rows, scores = search_bm25(index_dir, questions, cfg)
    searched = time.perf_counter()
    found = _fetch_passages(Path(passages_path), ids, {int(r) for rs in rows for r in rs})
    records = retrieval_records(
        questions, [r.tolist() for r in rows], [s.tolist() for s in scores], found
    )
    logger.info(
        "BM25: %d questions x top %d in %.1f s (search %.1f s, fetching passages and has-answer "
        "%.1f s)",
        len(questions), min(cfg.top_k, len(ids)), time.perf_counter() - started,
        searched - started, time.perf_counter() - searched,
    )  # fmt: skip
    return records


def retrieve_bm25(
    cfg: BM25Config, index_dir: Path, passages_path: Path, questions_path: Path, output: Path
) -> None:
    """`fid retrieve-bm25`: the top `cfg.top_k` passages of every question of a question file
    (any format `load_questions` reads), written as FiD-format json or compact lists
    (`cfg.list_format`; `passages_path` may then be a passage store folder)."""
    questions = load_questions(questions_path)
    if cfg.list_format == "compact":
        ids, rows, scores = search_bm25(index_dir, questions, cfg)
        store = _passage_store(Path(passages_path), ids, rows)
        ranked = [[str(ids[r]) for r in row] for row in rows]
        write_compact_lists(output, questions, ranked, [s.tolist() for s in scores], store)
    else:
        atomic_write_json(output, rank_bm25(index_dir, passages_path, questions, cfg))
    logger.info("retrieved %d passages for %d questions into %s", cfg.top_k, len(questions), output)
