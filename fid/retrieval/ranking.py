"""Retrieval output: each question with its ranked passages as FiD `ctxs` (or compact lists,
fid.data.retrieval_lists), with DPR's has-answer.

Shared by BM25 and dense retrieval. A passage that many questions retrieve is tokenized once for
all of them (DPR's rule compares token sequences), which keeps the has-answer check far cheaper
than the search itself at 100 passages per question.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Mapping, Sequence

from fid.data.passage_store import PassageStore
from fid.data.passages import Passage
from fid.data.retrieval_lists import write_lines
from fid.metrics.has_answer import AnswerMatcher, tokenize
from fid.runtime.progress import progress

logger = logging.getLogger(__name__)


def has_answer_flags(
    answers: Sequence[Sequence[str]],
    ranked: Sequence[Sequence[Hashable]],
    texts: Mapping[Hashable, str],
    mode: str = "string",
) -> list[list[bool]]:
    """DPR's has-answer flag of every ranked passage of every question.

    Args:
        answers: each question's gold answers (none: every flag is False).
        ranked: each question's passage keys, best first.
        texts: passage text by key.
        mode: "string" (DPR's token rule) or "regex".

    Returns:
        flags[q][r] for question q and rank r.
    """
    matchers = [AnswerMatcher(gold, mode) if gold else None for gold in answers]
    flags = [[False] * len(keys) for keys in ranked]
    if mode != "string":
        for q, keys in enumerate(progress(ranked, desc="has-answer", unit="questions", log=logger)):
            if matchers[q] is not None:
                flags[q] = [matchers[q].matches(texts[key]) for key in keys]
        return flags
    readers: dict[Hashable, list[tuple[int, int]]] = {}  # passage -> (question, rank)
    for q, keys in enumerate(ranked):
        if matchers[q] is not None:
            for rank, key in enumerate(keys):
                readers.setdefault(key, []).append((q, rank))
    for key, refs in progress(readers.items(), desc="has-answer", unit="passages", log=logger):
        tokens = tokenize(texts[key])
        for q, rank in refs:
            flags[q][rank] = matchers[q].matches_tokens(tokens)
    return flags


def retrieval_records(
    questions: Sequence[dict],
    ranked: Sequence[Sequence[Hashable]],
    scores: Sequence[Sequence[float]],
    passages: Mapping[Hashable, Passage],
    mode: str = "string",
) -> list[dict]:
    """FiD records `{id, question, answers, target?, ctxs: [{id, title, text, score,
    has_answer}]}`.

    Args:
        questions: {"id", "question", "answers"} dicts (with the "target" the reader trains
            on, where the question file fixes one: kept).
        ranked: each question's passage keys, best first.
        scores: the matching retrieval scores.
        passages: the passages by key.
        mode: the has-answer rule ("string" or "regex").
    """
    answers = [q.get("answers") or [] for q in questions]
    texts = {key: passages[key].text for keys in ranked for key in keys}
    flags = has_answer_flags(answers, ranked, texts, mode)
    records = []
    for question, gold, keys, row, row_flags in zip(
        questions, answers, ranked, scores, flags, strict=True
    ):
        ctxs = [
            {
                "id": passages[key].id,
                "title": passages[key].title,
                "text": passages[key].text,
                "score": float(score),
                "has_answer": flag,
            }
            for key, score, flag in zip(keys, row, row_flags, strict=False)
        ]
        records.append(
            {"id": str(question["id"]), "question": question["question"],
             "answers": list(gold), **_target(question), "ctxs": ctxs}
        )  # fmt: skip
    return records


def _target(question: dict) -> dict:
    """The training target of a question (TriviaQA's `Answer.Value`), when it has one."""
    return {"target": question["target"]} if question.get("target") is not None else {}


def write_compact_lists(
    output,
    questions: Sequence[dict],
    ranked: Sequence[Sequence[str]],
    scores: Sequence[Sequence[float]],
    passages: PassageStore,
    mode: str = "string",
    chunk: int = 1024,
) -> int:
    """Writes compact lists (passage ids, `score`, `has_answer`) atomically, streaming.

    Passages are read a chunk of questions at a time, for the has-answer check only, so memory
    holds one chunk's texts whatever the number of questions.

    Args:
        output: the file to write.
        questions: {"id", "question", "answers", "target"?} dicts.
        ranked: each question's passage ids, best first.
        scores: the matching retrieval scores (an approximate index's missing ones, past the
            end of a shorter list, are dropped).
        passages: the store the ids refer to (its fingerprint goes into the header).
        mode: the has-answer rule ("string" or "regex").

    Returns:
        The number of questions written.
    """

    def lines():
        for start in range(0, len(questions), chunk):
            part = range(start, min(len(questions), start + chunk))
            needed = sorted({str(key) for q in part for key in ranked[q]})
            texts = {p.id: p.text for p in passages.get(needed, str(passages.passages_path))}
            answers = [questions[q].get("answers") or [] for q in part]
            ids = [[str(key) for key in ranked[q]] for q in part]
            flags = has_answer_flags(answers, ids, texts, mode)
            for q, gold, row, row_flags in zip(part, answers, ids, flags, strict=True):
                question = questions[q]
                yield {
                    "id": str(question["id"]), "question": question["question"],
                    "answers": list(gold), **_target(question), "passages": row,
                    "columns": {"score": [float(s) for s in scores[q][: len(row)]],
                                "has_answer": row_flags},
                }  # fmt: skip

    return write_lines(output, passages.fingerprint, lines())
