"""Raw question files into the pipeline's question splits.

`prepare_questions` reads any format `fid.data.questions.load_questions` knows (NQ-open jsonl,
TriviaQA json, DPR qas TSV/CSV, FiD json/jsonl), optionally keeps the records an index file
lists (facebookresearch/FiD's `dataindex.tar.gz` holds `NQ.{train,dev,test}.idx.json` and
`TQA.*.idx.json`: positions into NQ-open's train/dev files and TriviaQA's unfiltered web
train/dev files, which is how FiD and DPR cut their train/dev/test splits), or a seeded
fraction of the records (to cut one file of your own into train/dev/test), and writes
`{id, question, answers}` jsonl (with `target` where the input fixes one: TriviaQA's, as FiD's
src/preprocess.py makes it).

Answers are kept as the file gives them, as FiD keeps them: an answer that normalises to the
empty string ("A+" in NQ-open) is scored as FiD scores it (only a prediction that normalises to
the empty string matches it), so NQ's test split holds all of FiD's 3,610 questions. A split
whose size differs from the one expected (`--expected-size`, the split sizes of FiD and DPR in
config/nq.yaml and tqa.yaml) is refused, naming both numbers (`accept_other_size`: written,
with a warning).
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

from fid.config import PrepareQuestionsConfig, ReaderListsConfig
from fid.data.examples import load_examples
from fid.data.questions import load_questions
from fid.errors import DataError
from fid.runtime.fileio import atomic_write_jsonl
from fid.text_files import read_text

logger = logging.getLogger(__name__)


def _load_index(path: Path, n_records: int, source: Path) -> list[int]:
    """A json list of record positions (FiD's `*.idx.json`), each checked against the file."""
    if not path.is_file():
        raise DataError(f"{path}: index file not found")
    try:
        positions = json.loads(read_text(path, "a JSON list of record positions"))
    except json.JSONDecodeError as error:
        raise DataError(f"{path}: invalid JSON at line {error.lineno}: {error.msg}") from None
    if not isinstance(positions, list) or not all(
        isinstance(p, int) and not isinstance(p, bool) for p in positions
    ):
        raise DataError(f"{path}: expected a JSON list of record positions (integers)")
    bad = [p for p in positions if not 0 <= p < n_records]
    if bad:
        raise DataError(
            f"{path}: position {bad[0]} is outside {source}, which holds {n_records} records. "
            "Hint: is this the index of another file?"
        )
    return positions


def _log_unscoreable_answers(questions: list[dict], source: Path) -> None:
    """Says how many gold answers normalise to the empty string ("." in SQuAD, "A+" in
    NQ-open): kept, as FiD keeps them, they match only a prediction that normalises to the
    empty string too (SQuAD's and FiD's exact match)."""
    from fid.metrics.answers import normalize_answer

    empty = [a for q in questions for a in q["answers"] if not normalize_answer(a)]
    only = sum(bool(q["answers"]) and not any(map(normalize_answer, q["answers"]))
               for q in questions)  # fmt: skip
    if empty:
        logger.info(
            "%s: %d gold answers normalise to the empty string (e.g. %r), kept as FiD keeps "
            "them; %d questions have no other answer (scored: only an empty prediction matches)",
            source, len(empty), empty[0], only,
        )  # fmt: skip


def _check_size(n: int, expected: int | None, source: Path, accept: bool) -> None:
    """A split of another size than expected: refused (DataError) before it is written, or
    a warning with `accept_other_size`."""
    if expected is None or n == expected:
        return
    said = (f"{source}: the split selects {n} questions, but this split should hold {expected} "
            "(--expected-size; the workflow's data.questions.<split>.expected_size: FiD's and "
            "DPR's split sizes)")  # fmt: skip
    if accept:
        logger.warning("%s; written, as accept_other_size is set", said)
        return
    raise DataError(
        f"{said}. Nothing was written. Hint: check the question file and its index; to train "
        "on it as it is, set accept_other_size: true (the workflow: data.questions.<split>."
        "prepare.accept_other_size)"
    )


def prepare_questions(
    input_path: str | Path,
    output_path: str | Path,
    cfg: PrepareQuestionsConfig,
    index_path: str | Path | None = None,
    expected_size: int | None = None,
) -> int:
    """Writes one question split as `{id, question, answers, target?}` jsonl.

    Args:
        input_path: the raw question file (any format `load_questions` reads).
        output_path: the jsonl to write (atomically).
        cfg: fraction, shuffling and filtering, TriviaQA's target.
        index_path: optional json list of the positions to keep, in their order.
        expected_size: the questions the split should hold; another number is refused
            (a warning with `cfg.accept_other_size`).

    Returns:
        The number of questions written.

    Raises:
        DataError: an unreadable input or index, a selection that keeps no question, or a
            split of another size than `expected_size`.
    """
    input_path = Path(input_path)
    questions = load_questions(input_path, cfg.triviaqa_target)
    if index_path is not None:
        questions = [
            questions[p] for p in _load_index(Path(index_path), len(questions), input_path)
        ]
    if cfg.shuffle_seed is not None:
        random.Random(cfg.shuffle_seed).shuffle(questions)
    n = len(questions)
    questions = questions[round(cfg.select_from * n) : round(cfg.select_to * n)]
    _log_unscoreable_answers(questions, input_path)
    if cfg.drop_unlabeled:
        questions = [q for q in questions if q["answers"]]
    if cfg.max_questions is not None:
        questions = questions[: cfg.max_questions]
    if not questions:
        raise DataError(
            f"{input_path}: the selection keeps no question (from {cfg.select_from} to "
            f"{cfg.select_to} of {n}). Hint: widen the fraction."
        )
    _check_size(len(questions), expected_size, input_path, cfg.accept_other_size)
    atomic_write_jsonl(output_path, questions)
    logger.info("wrote %d of %d questions of %s to %s", len(questions), n, input_path, output_path)
    return len(questions)


def make_reader_lists(
    retrieved_path: str | Path,
    questions_path: str | Path,
    passages_path: str | Path,
    output_path: str | Path,
    cfg: ReaderListsConfig,
) -> int:
    """Writes FiD-format lists: each question's top retrieved passages with its gold one in.

    Args:
        retrieved_path: FiD-format retrieval output (json list with ctxs).
        questions_path: jsonl questions with "id" and "gold_passage_id" (the demo world's).
        passages_path: the passage TSV (for gold passages the retriever missed).
        output_path: json list to write (atomically).
        cfg: list size, shuffling.

    Returns:
        The number of lists in which the gold passage had to be added.

    Raises:
        DataError: a question without a gold passage id, or one the passage file lacks.
    """
    from fid.data.passages import fetch_passages
    from fid.runtime.fileio import atomic_write_json

    records = [{**example.record, "id": example.id} for example in load_examples(retrieved_path)]
    for record in records:
        if not all(isinstance(ctx.get("id"), str) for ctx in record["ctxs"]):
            raise DataError(f"{retrieved_path}: question {record['id']!r}: every ctx needs an 'id'")
    gold = {}
    text = read_text(questions_path, "jsonl questions with gold_passage_id")
    for line_number, line in enumerate(text.split("\n"), 1):  # (as fid.data.json_records)
        if line.strip():
            try:
                question = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataError(
                    f"{questions_path}: line {line_number}: invalid JSON at column "
                    f"{error.colno}: {error.msg}"
                ) from None
            if not isinstance(question, dict) or "id" not in question:
                raise DataError(
                    f"{questions_path}: line {line_number}: expected an object with an 'id'"
                )
            if not question.get("gold_passage_id"):
                raise DataError(
                    f"{questions_path}: line {line_number}: no 'gold_passage_id'. Hint: gold "
                    "lists need questions that name their gold passage (the demo world's)."
                )
            gold[str(question["id"])] = str(question["gold_passage_id"])
    missing = [r["id"] for r in records if r["id"] not in gold]
    if missing:
        raise DataError(f"{questions_path}: no question {missing[0]!r} of {retrieved_path}")
    known = {c["id"]: (c["title"], c["text"]) for r in records for c in r["ctxs"]}
    absent = {gold[r["id"]] for r in records} - known.keys()
    known |= {p.id: (p.title, p.text) for p in fetch_passages(passages_path, absent).values()}
    added, out = 0, []
    for record in records:
        gold_id = gold[record["id"]]
        ctxs = [dict(c) for c in record["ctxs"]]
        gold_ctx = next((c for c in ctxs if c["id"] == gold_id), None)
        if gold_ctx is None:
            added += 1
            title, text = known[gold_id]
            gold_ctx = {"id": gold_id, "title": title, "text": text}
        chosen = [c for c in ctxs if c["id"] != gold_id][: cfg.n_passages - 1] + [gold_ctx]
        if cfg.shuffle:
            random.Random(f"{cfg.seed}:{record['id']}").shuffle(chosen)
            for ctx in chosen:
                ctx.pop("score", None)
        out.append({**record, "gold_passage_id": gold_id, "ctxs": chosen})
    atomic_write_json(output_path, out)
    logger.info("wrote %d lists of %d passages to %s (gold passage added to %d)",
                len(out), cfg.n_passages, output_path, added)  # fmt: skip
    return added
