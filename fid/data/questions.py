"""Question files in the formats users bring, read into one shape.

`load_questions` returns `{"id": str, "question": str, "answers": list[str]}` records, with
`"target": str` where the file fixes a training target, from:

- NQ-open jsonl: `{"question": ..., "answer": [...]}` per line (google-research-datasets/
  natural-questions, `nq_open/`);
- FiD json (a list) or jsonl: `{"id"?, "question", "answers"?, "target"?, "ctxs"?}` (the format
  of facebookresearch/FiD; DPR's retriever-training json has the same keys); ctxs are ignored,
  a target is kept;
- DPR qas TSV (`.tsv` or DPR's `.csv`): `question<TAB>python-list-of-answers`, csv quoting, no
  header (facebookresearch/DPR `data.retriever.qas.*`);
- TriviaQA's raw json: `{"Data": [{"Question", "QuestionId", "Answer": {"Aliases", "Value"}}]}`;
  the answers are the Aliases (the list DPR and FiD evaluate against), duplicates dropped, and
  the target is FiD's (`triviaqa_target="value"`): `Answer.Value`, title-cased when it is all
  upper case (facebookresearch/FiD, src/preprocess.py, select_examples_TQA).

The suffix picks json or TSV (other suffixes are sniffed) and the content picks the rest.
Answers may be missing (unlabeled questions get []); retrieval needs none. A record without an
id gets "{file stem}-{index}" (0-based).
"""

from __future__ import annotations

import ast
import csv
import io
import logging
from pathlib import Path
from typing import Any, Literal

from fid.data.json_records import JsonSyntaxError, parse_json_records
from fid.errors import DataError
from fid.text_files import read_text

logger = logging.getLogger(__name__)

EXPECTED_FORMATS = (
    "NQ-open jsonl ({question, answer: [...]}), FiD json/jsonl ({id?, question, answers?}), "
    "DPR qas TSV (question<TAB>['answer', ...]) or TriviaQA json "
    "({Data: [{Question, QuestionId, Answer: {Aliases}}]})"
)
_JSON_SUFFIXES = (".json", ".jsonl")
# Where a record was read ("FILE: line 3"), kept while loading for messages about two records.
_WHERE = "_where"
_TSV_SUFFIXES = (".tsv", ".csv")


def _unknown_format(path: Path, where: str, found: str) -> DataError:
    return DataError(f"{path}: {where}: expected one of {EXPECTED_FORMATS}; found {found}")


def _answer_list(value: Any, where: str, key: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise DataError(f"{where}: field {key!r} must be a list of strings, got {value!r:.100}")
    return list(value)


def _dedupe(values: list[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _question_from_record(record: Any, where: str, default_id: str) -> dict:
    """One NQ-open or FiD record as a question dict (with its location under `_WHERE`)."""
    if not isinstance(record, dict) or "question" not in record:
        found = (
            f"keys {sorted(record)[:10]}"
            if isinstance(record, dict)
            else f"a {type(record).__name__}"
        )
        raise DataError(
            f"{where}: expected a question record with a 'question' field "
            f"(NQ-open or FiD format), found {found}"
        )
    question = record["question"]
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: field 'question' must be a non-empty string, got {question!r}")
    # FiD and DPR call the gold list "answers", NQ-open "answer"; a FiD record with only a
    # training "target" is labeled with that target.
    if record.get("answers") is not None:
        answers = _answer_list(record["answers"], where, "answers")
    elif record.get("answer") is not None:
        answers = _answer_list(record["answer"], where, "answer")
    elif isinstance(record.get("target"), str):
        answers = [record["target"]]
    else:
        answers = []
    id_ = record.get("id")
    question = {"id": default_id if id_ is None else str(id_), "question": question,
                "answers": answers, _WHERE: where}  # fmt: skip
    if isinstance(record.get("target"), str):
        question["target"] = record["target"]
    return question


def triviaqa_target(value: str) -> str:
    """FiD's training target from a TriviaQA `Answer.Value`: title-cased when it is all upper
    case ("ABBA" -> "Abba", str.isupper as FiD's src/preprocess.py tests it), else as it is."""
    return value.title() if value.isupper() else value


def _load_triviaqa(path: Path, data: dict, target: str) -> list[dict]:
    items = data["Data"]
    if not isinstance(items, list):
        raise DataError(
            f"{path}: TriviaQA field 'Data' must be a list, got a {type(items).__name__}"
        )
    questions = []
    for index, item in enumerate(items):
        where = f"{path}: Data[{index}]"
        if not isinstance(item, dict) or not isinstance(item.get("Question"), str):
            raise DataError(f"{where}: expected a TriviaQA record with a 'Question' string")
        if not item["Question"].strip():
            raise DataError(f"{where}: empty 'Question'")
        answer = item.get("Answer") or {}
        if not isinstance(answer, dict):
            raise DataError(f"{where}: 'Answer' must be an object, got {answer!r:.100}")
        aliases = _answer_list(answer.get("Aliases", []), where, "Answer.Aliases")
        value = answer.get("Value")
        if value is not None and not isinstance(value, str):
            raise DataError(f"{where}: 'Answer.Value' must be a string, got {value!r:.100}")
        if not aliases and value is not None:
            aliases = [value]
        question_id = item.get("QuestionId")
        question = {
            "id": f"{path.stem}-{index}" if question_id is None else str(question_id),
            "question": item["Question"],
            "answers": _dedupe(aliases),
            _WHERE: where,
        }
        if target == "value" and value is not None:
            question["target"] = triviaqa_target(value)
        questions.append(question)
    return questions


def _load_json(path: Path, text: str, target: str) -> list[dict]:
    """NQ-open jsonl, FiD json/jsonl or TriviaQA json, told apart by their content."""
    try:
        parsed = parse_json_records(text)
    except JsonSyntaxError as error:
        found = f"invalid JSON at column {error.column}: {error.message}"
        raise _unknown_format(path, f"line {error.line}", found) from None
    data = parsed.document
    if parsed.lines is not None:
        records = [(f"line {number}", record) for number, record in parsed.lines]
    elif isinstance(data, dict) and "Data" in data:
        return _load_triviaqa(path, data, target)
    elif isinstance(data, list):
        records = [(f"record {i}", record) for i, record in enumerate(data)]
    elif isinstance(data, dict):
        records = [("line 1", data)]  # a jsonl file holding one record
    else:
        raise _unknown_format(path, "line 1", f"a JSON {type(data).__name__}")
    if records and (not isinstance(records[0][1], dict) or "question" not in records[0][1]):
        location, record = records[0]
        found = f"keys {sorted(record)[:10]}" if isinstance(record, dict) else repr(record)[:80]
        raise _unknown_format(path, location, found)
    return [
        _question_from_record(record, f"{path}: {location}", f"{path.stem}-{index}")
        for index, (location, record) in enumerate(records)
    ]


def _parse_answers(cell: str, where: str) -> list[str]:
    """The python-literal answer list of a DPR qas row (literal_eval: never eval)."""
    if not cell.strip():
        return []
    try:
        value = ast.literal_eval(cell)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise DataError(
            f"{where}: expected a python list of answer strings in column 2 "
            f"(DPR qas format), found {cell!r:.100}"
        ) from None
    if isinstance(value, tuple):
        value = list(value)
    return _answer_list(value, where, "answers (column 2)")


def _load_qas_tsv(path: Path, text: str) -> list[dict]:
    questions = []
    # newline="": the csv module sees each line's own ending, as from a file opened so
    reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t")
    line_number = 1  # the line the next row starts on
    for row in reader:
        location = f"line {line_number}"
        where = f"{path}: {location}"
        line_number = reader.line_num + 1
        if not row:
            continue
        if len(row) > 2:
            found = f"{len(row)} tab-separated columns: {'<TAB>'.join(row)!r:.120}"
            raise _unknown_format(path, location, found)
        if not row[0].strip():
            raise DataError(f"{where}: empty question")
        try:
            answers = _parse_answers(row[1], where) if len(row) == 2 else []
        except DataError:
            if questions:
                raise
            # The first row decides whether this is a qas file at all.
            raise _unknown_format(path, location, f"{'<TAB>'.join(row)!r:.120}") from None
        index = len(questions)
        questions.append(
            {"id": f"{path.stem}-{index}", "question": row[0], "answers": answers, _WHERE: where}
        )
    return questions


def _check_unique_ids(questions: list[dict], path: Path) -> None:
    """Drops the records' locations; raises DataError naming both records of a repeated id."""
    first_seen: dict[str, str] = {}
    for question in questions:
        where = question.pop(_WHERE)
        if question["id"] in first_seen:
            raise DataError(
                f"{where}: duplicate id {question['id']!r} (first in "
                f"{first_seen[question['id']]}); question ids must be unique"
            )
        first_seen[question["id"]] = where.removeprefix(f"{path}: ")


def load_questions(
    path: str | Path, triviaqa: Literal["value", "random_alias"] = "value"
) -> list[dict]:
    """Reads a question file in any of the supported formats (see the module docstring).

    Args:
        path: a `.jsonl`/`.json` (NQ-open, FiD, TriviaQA) or `.tsv`/`.csv` (DPR qas) file;
            other suffixes are sniffed (json when the text starts with '[' or '{').
        triviaqa: the target of a raw TriviaQA question: "value" (FiD's, `triviaqa_target`)
            or "random_alias" (none: training draws one of the answers).

    Returns:
        `{"id", "question", "answers"}` dicts in file order, with a "target" where the file
        fixes one; answers are [] when the file has none.

    Raises:
        DataError: a missing or empty file, a file in none of the formats (naming the formats
            and what was found where), a malformed record, or a duplicate id.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: question file not found")
    suffix = path.suffix.lower()
    text = read_text(path, "a question file")
    if not text.strip():
        raise _unknown_format(path, "line 1", "an empty file")
    if suffix in _JSON_SUFFIXES or (
        suffix not in _TSV_SUFFIXES and text.lstrip()[:1] in ("[", "{")
    ):
        questions = _load_json(path, text, triviaqa)
    else:
        questions = _load_qas_tsv(path, text)
    if not questions:
        raise _unknown_format(path, "line 1", "no question records")
    _check_unique_ids(questions, path)
    n_unlabeled = sum(not q["answers"] for q in questions)
    logger.info(
        "loaded %d questions from %s (%d without answers)", len(questions), path, n_unlabeled
    )
    return questions
