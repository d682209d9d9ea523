"""`fid ask`: a trained run answers the questions a person types.

A run answers as the report scored it: the system it built (fid.evaluation.run_system: the last
round's reader and the retriever and index whose lists that reader was scored on) encodes the
question and searches the index (fid.retrieval.dense; BM25's index, fid.retrieval.bm25_searcher,
where the reader was scored on BM25's lists: round 0), and the reader generates the answer
from the top passages (fid.inference.generation), with the run's own knobs
(fid.evaluation.run_folder finds them). Models, index and passages are loaded once; a question
then costs one encoding, one search, a passage lookup and one generation: 0.03 s on the tiny
test run's models on one CPU thread. Loading takes 0.1-0.5 s; importing torch and transformers'
T5 takes about 4 CPU-seconds before that, once per call (the CLI checks the run folder and the
question words before it): ask many questions in one call (stdin), or keep the system loaded
with `fid serve` (fid.serving), which answers through `AskSystem` as ask does.

A question is decoded as UTF-8 (fid.evaluation.ask_inputs: an argument, or a line of stdin; a
byte that is not UTF-8 is one error naming it, after the answers to the lines before it), and
keeps at most half of the reader's passage input (`question_budget`): a longer one is cut, with
a warning saying how many tokens were kept, so that the reader still sees every passage it
lists as read.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

import torch

from fid.config import BM25Config, EvalReaderConfig, RetrieveConfig, load_config
from fid.data.examples import Example
from fid.data.passage_store import open_store
from fid.data.passages import fetch_passages
from fid.errors import DataError, InputError
from fid.evaluation.run_folder import RunPaths
from fid.inference.batching import reader_and_collator
from fid.inference.generation import generate_answers
from fid.models.loading import load_retriever
from fid.models.settings import ReaderSettings
from fid.retrieval.bm25_searcher import BM25Searcher
from fid.retrieval.dense import search_dense, set_search_knobs
from fid.retrieval.index import PassageIndex
from fid.retrieval.index_sources import check_index_sources
from fid.retrieval.ranking import retrieval_records
from fid.runtime.precision import autocast, resolve_precision

logger = logging.getLogger(__name__)

SNIPPET_CHARS = 100
# The share of each passage input (`question: Q title: T context: P`, passage_max_tokens long)
# a question may take: the rest is the passage's title and text, which the reader must see.
QUESTION_SHARE = 0.5
# A TSV is scanned once per question; above this size a passage store is worth building.
LARGE_TSV_BYTES = 100 << 20
# One question's progress lines (encode, search, generate) would outnumber its answer.
_CHATTY = ("fid.retrieval.dense", "fid.retrieval.index", "fid.retrieval.ranking",
           "fid.inference.generation")  # fmt: skip


def ask(
    paths: RunPaths, config: Path | None, n_passages: int | None, questions: Iterable[str],
    out: TextIO, as_json: bool, device: torch.device,
) -> int:  # fmt: skip
    """`fid ask`: answers each question and writes it to `out` with the passages the reader
    read, best first (rank, id, title, retrieval score, text).

    Args:
        paths: the reader, retriever, index, passages and the run's configs (`run_paths`).
        config: an EvalReaderConfig YAML; None: `paths.eval_config`, else the defaults.
        n_passages: passages retrieved and read per question; None: the config file's, or,
            with none, the number the reader was trained on (fid_reader.json), else 100.
        questions: the questions, blank ones skipped (stdin: one a line, answered as read).
        out: text blocks, or with `as_json` one JSON object a line:
            {question, answer, passages: [{rank, id, title, score, text}]}.
        device: where the models run.

    Returns:
        The number of questions answered.

    Raises:
        InputError: a missing or incomplete model, index or passage file, or no question.
    """
    system = AskSystem(paths, config, n_passages, device)
    if getattr(questions, "isatty", lambda: False)():
        logger.info("type one question a line (Ctrl-D ends)")
    answered = 0
    for line in questions:
        line = line.lstrip("\ufeff")  # a byte-order mark (Windows editors) is no question word
        if not line.strip():
            continue
        reply = system.answer(line.strip(), answered + 1)
        _write(out, reply, as_json)
        answered += 1
        logger.info("question %d answered in %.3f s", answered, reply.seconds)
    if not answered:
        raise InputError("fid ask: no question: give one as arguments, or one a line on stdin")
    return answered


@dataclass(frozen=True)
class Reply:
    """One question answered.

    Attributes:
        question: the question as asked (a cut one too: `AskSystem.answer`).
        answer: the reader's answer.
        ctxs: the passages read, best first: {id, title, text, score (the retrieval score)}.
        attention: (N,) each passage's share of the reader's cross-attention (summing to 1),
            in `ctxs` order; None when not asked for.
        seconds: wall seconds spent answering.
    """

    question: str
    answer: str
    ctxs: list[dict]
    attention: list[float] | None
    seconds: float

    def record(self) -> dict:
        """`fid ask --json`'s record: {question, answer, passages: [{rank, id, title, score,
        text}]}, each passage with its `attention` share when measured."""
        passages = []
        for rank, c in enumerate(self.ctxs, 1):
            passage = {"rank": rank, "id": c["id"], "title": c["title"], "score": c["score"],
                       "text": c["text"]}  # fmt: skip
            if self.attention is not None:
                passage["attention"] = self.attention[rank - 1]
            passages.append(passage)
        return {"question": self.question, "answer": self.answer, "passages": passages}


class AskSystem:
    """A run's retriever, index, passages and reader, loaded once (`fid ask`, `fid serve`),
    answering one question at a time. Not thread-safe: one question at a time (a server holds
    a lock around `answer`).

    Args: as `ask`'s (paths, config, n_passages, device).
    """

    def __init__(
        self, paths: RunPaths, config: Path | None, n_passages: int | None, device: torch.device
    ):
        started = time.perf_counter()
        cfg, search = _configs(paths, config, n_passages, device)
        if not paths.passages.exists():
            raise DataError(
                f"{paths.passages}: passage file not found: expected the DPR-style TSV (or "
                "passage store) the index was built from"
            )
        self.lookup = _passage_lookup(paths.passages)
        self.bm25 = self.retriever = None
        if paths.bm25:
            self.bm25 = BM25Searcher(list(paths.bm25), load_config(paths.bm25_config, BM25Config))
            self.search = search
        else:
            self.retriever, self.encode = load_retriever(
                paths.retriever, search.question_max_tokens, None, device,
                override=search.override_model_settings,
            )  # fmt: skip
            self.index = PassageIndex.load(paths.index, expected_dim=self.retriever.dim)
            check_index_sources(self.index, paths.index, paths.retriever, paths.passages)
            set_search_knobs(self.index, search)
            width = self.retriever.question_encoder.config.hidden_size
            self.search = _resolved(search, device, width)
        self.reader, self.tokenizer, self.collator = reader_and_collator(cfg, paths.reader, device)
        self.cfg = _resolved(cfg, device, self.reader.t5.config.d_model)
        self.device = device
        self.paths = paths
        logger.info(
            "loaded in %.1f s: reader %s, retriever %s, index %s, passages %s; each question "
            "reads its top %d passages", time.perf_counter() - started, paths.reader,
            paths.retriever or "none (BM25)", paths.index or ", ".join(map(str, paths.bm25)),
            paths.passages, self.cfg.n_passages,
        )  # fmt: skip
        if paths.system is not None and not paths.replaced:
            logger.info("the run's system (the report's headline scores it): %s",
                        paths.system.describe())  # fmt: skip

    @property
    def description(self) -> str:
        """One line: the run's system (`RunSystem.describe`), or the folders it reads."""
        paths = self.paths
        if paths.system is not None and not paths.replaced:
            return paths.system.describe()
        return (f"the reader {paths.reader} reading the top {self.cfg.n_passages} passages "
                f"of the index {paths.index} (retriever {paths.retriever})")  # fmt: skip

    @property
    def question_budget(self) -> int:
        """The reader tokens a question may take (`question_budget`)."""
        return question_budget(self.collator.passage_max_tokens)

    def question_tokens(self, question: str) -> int:
        """The reader tokens of `question`."""
        return len(self.tokenizer(question, add_special_tokens=False)["input_ids"])

    def answer(self, question: str, number: int = 1, attention: bool = False) -> Reply:
        """Answers one question: one encoding, one search, a passage lookup, one generation;
        with `attention`, one more encoder pass and one decoder step for the attention shares.

        Args:
            question: the question (non-blank); one over `question_budget` tokens is cut to
                it, with a warning naming it as question `number`.
            attention: measure each read passage's share of the reader's cross-attention.
        """
        started = time.perf_counter()
        text = _within_budget(question, self.tokenizer, self.collator.passage_max_tokens, number)
        asked = {"id": str(number - 1), "question": text}
        cfg = self.cfg
        with _quiet(_CHATTY):
            if self.bm25 is not None:
                ids, found = self.bm25.search(text, self.search.top_k)
                scores, ranked = [found], [ids]
            else:
                scores, ranked = search_dense(
                    self.retriever, self.encode, self.index, [asked], self.search, self.device
                )
            scores, ranked = [scores[0][: cfg.n_passages]], [ranked[0][: cfg.n_passages]]
            record = retrieval_records([asked], ranked, scores, self.lookup(ranked[0]))[0]
            example = Example(record["id"], record["question"], [], None, record["ctxs"], record)
            with torch.no_grad(), autocast(self.device, cfg.precision):
                answer = generate_answers(
                    self.reader, self.tokenizer, self.collator, [example], 1,
                    cfg.max_new_tokens, cfg.num_beams, self.device, acceleration=cfg,
                )[0]  # fmt: skip
                shares = self._attention(example) if attention else None
        return Reply(question, answer, record["ctxs"], shares, time.perf_counter() - started)

    def _attention(self, example: Example) -> list[float]:
        """(N,) each read passage's share of the reader's cross-attention at the first decoding
        step, averaged over layers and heads (FiDReader.passage_scores "attention_mass", the
        signal of Izacard & Grave 2021, https://arxiv.org/abs/2012.04584), in ctxs order."""
        batch = self.collator([example]).to(self.device)
        mass = self.reader.passage_scores(batch.input_ids, batch.attention_mask, "attention_mass")
        shares = [0.0] * len(example.ctxs)
        for slot, ctx in enumerate(batch.ctx_indices[0]):  # slot -> its passage in ctxs
            shares[ctx] = float(mass[0, slot])
        return shares


def question_budget(passage_max_tokens: int) -> int:
    """The reader tokens a question may take of each passage input (`QUESTION_SHARE`)."""
    return max(1, int(passage_max_tokens * QUESTION_SHARE))


def _within_budget(question: str, tokenizer, passage_max_tokens: int, number: int) -> str:
    """`question`, cut to its first `question_budget` reader tokens when longer, with one
    warning (question `number`)."""
    budget = question_budget(passage_max_tokens)
    ids = tokenizer(question, add_special_tokens=False)["input_ids"]
    if len(ids) <= budget:
        return question
    kept = tokenizer.decode(ids[:budget], skip_special_tokens=True).strip()
    logger.warning(
        "question %d (%d characters): %d reader tokens, over its budget of %d (half of each "
        "%d-token passage input): kept the first %d tokens (%r), so that the reader sees "
        "the passages it reads", number, len(question), len(ids), budget, passage_max_tokens,
        budget,
        kept[:60] + ("..." if len(kept) > 60 else ""),
    )  # fmt: skip
    return kept


def _configs(paths: RunPaths, config: Path | None, n_passages: int | None, device):
    """(generation config, search config), with a precision that runs on `device`."""
    cfg = load_config(config or paths.eval_config, EvalReaderConfig)
    if n_passages is None and config is None and paths.eval_config is None:
        n_passages = ReaderSettings.load(paths.reader).n_passages
    if n_passages is not None:
        cfg = replace(cfg, n_passages=n_passages)
    # The search is the run's (its top_k: an approximate index may order its top n_passages
    # otherwise when asked for fewer), of which the reader reads the first n_passages, as
    # eval-reader read the run's lists; without the run's knobs, top_k is n_passages.
    search = load_config(paths.retrieve_config, RetrieveConfig)
    top_k = max(search.top_k, cfg.n_passages) if paths.retrieve_config else cfg.n_passages
    return _runnable(cfg, device), _runnable(replace(search, top_k=top_k), device)


def _runnable(cfg, device: torch.device):
    """`cfg` with a precision that runs on `device`: a GPU run's fp16 is "auto" on a CPU (so
    that a run trained and evaluated on GPUs can still be asked on a laptop); "auto" is
    resolved once the model's width is known (`_resolved`)."""
    if cfg.precision == "fp16" and device.type != "cuda":
        logger.warning("%s: precision fp16 needs CUDA; auto on %s", type(cfg).__name__, device)
        cfg = replace(cfg, precision="auto")
    return cfg


def _resolved(cfg, device: torch.device, width: int):
    """`cfg` with its precision resolved for inference with a model `width` wide."""
    return replace(cfg, precision=resolve_precision(cfg.precision, device, width))


def _passage_lookup(path: Path):
    """ids -> {id: Passage}: through a passage store, or a scan of the TSV per question."""
    if path.is_dir():
        store = open_store(path)
        return lambda ids: {p.id: p for p in store.get(ids, str(path))}
    if path.stat().st_size > LARGE_TSV_BYTES:
        logger.warning("%s: scanned per question. Hint: fid build-passage-store reads by id", path)
    return lambda ids: fetch_passages(path, set(ids))


@contextlib.contextmanager
def _quiet(names: Iterable[str]) -> Iterator[None]:
    """These loggers at WARNING for the block (their progress lines off)."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)


def _write(out: TextIO, reply: Reply, as_json: bool) -> None:
    """One question's answer and passages, as a text block or one JSON line."""
    record = reply.record()
    if as_json:
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
    else:
        passages = record["passages"]
        lines = [f"question: {reply.question}", f"answer: {reply.answer}",
                 f"passages read ({len(passages)}):"]  # fmt: skip
        for p in passages:
            text = " ".join(p["text"].split())
            text = text if len(text) <= SNIPPET_CHARS else text[: SNIPPET_CHARS - 3] + "..."
            lines.append(
                f"  {p['rank']}. [{p['id']}] {p['title']} (score {p['score']:.4f}): {text}"
            )
        out.write("\n".join(lines) + "\n\n")
    out.flush()  # answered as asked, also through a pipe
