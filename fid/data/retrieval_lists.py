"""Compact retrieval lists: each question with its ranked passage ids and their scores, no text.

The FiD json that retrieval used to write repeats every passage's text in every list that holds
it: 830 MB for 10,570 questions x 100 passages, ~6 GB per NQ split, and some 35 GB of Python
objects once loaded. A compact list names passages by id; their text is read from a passage
store (fid.data.passage_store) when a batch is built. Format (jsonl, UTF-8):

    {"format": "fid-retrieval-lists", "version": 1, "corpus": {"sha256": ..., "n_passages": N}}
    {"id": "q1", "question": "...", "answers": ["..."], "passages": ["17", "4", ...],
     "columns": {"score": [71.2, 70.9, ...], "has_answer": [true, false, ...]}}
    ...

Line 1 says what the ids refer to (the corpus fingerprint, checked against the store used to
read them; null when unknown). Every other line is one question: its fields as in a FiD record
(id, question, answers, target, ...), its passages best first, and one list per passage field
(`score`, `has_answer`, `reader_score` once scored, any other ctx key; null where a passage has
none). Why jsonl rather than Parquet: one question per line streams, greps and diffs like the
other files of the pipeline, needs no new dependency, and at ~25 bytes per passage id and score
the lists are small enough that a columnar file would save little.

In memory (`RetrievalLists`) the passages are numpy columns: ids as fixed-width bytes, numbers
as float64 (NaN for null), flags as int8 (-1 for null): ~20 bytes per (question, passage)
instead of a dict of Python objects.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fid.errors import DataError
from fid.runtime.fileio import atomic_path
from fid.text_files import text_lines

LISTS_FORMAT = "fid-retrieval-lists"
LISTS_VERSION = 1
# Passage fields that the store holds, never columns of a list.
PASSAGE_FIELDS = ("id", "title", "text")
_CHUNK = 4096  # questions per numpy chunk while reading


def is_compact_lists(path: str | Path) -> bool:
    """True when the file's first line is a compact-lists header."""
    try:
        with open(path, "rb") as handle:
            first = handle.readline(4096)
    except OSError:
        return False
    return f'"format": "{LISTS_FORMAT}"'.encode() in first or (
        f'"format":"{LISTS_FORMAT}"'.encode() in first
    )


@dataclass
class Column:
    """One passage field of every list: flags as int8 (-1 null), numbers as float64 (NaN
    null), anything else as Python values; `present` (Q,) marks the questions that have the
    field at all (None: every question), so that a field missing stays missing and a null
    stays null."""

    kind: str  # "flag" | "number" | "object"
    values: np.ndarray | list
    present: np.ndarray | None = None

    def get(self, position: int) -> Any:
        value = self.values[position]
        if self.kind == "flag":
            return None if value < 0 else bool(value)
        if self.kind == "number":
            return None if math.isnan(value) else float(value)
        return value


def _column_kind(values: list) -> str:
    """ "null" (no value), "flag", "number" or "object" (anything else, or a mix)."""
    present = [v for v in values if v is not None]
    if not present:
        return "null"
    if all(isinstance(v, bool) for v in present):
        return "flag"
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
        return "number"
    return "object"


def _column_array(kind: str, values: list) -> np.ndarray | list:
    if kind == "flag":
        return np.asarray([-1 if v is None else int(v) for v in values], dtype=np.int8)
    if kind in ("number", "null"):
        return np.asarray([math.nan if v is None else v for v in values], dtype=np.float64)
    return list(values)


def _pack(values: list) -> tuple[str, np.ndarray | list | int]:
    """A chunk of a column as (kind, payload): flags and numbers as numpy right away (a list of
    Python floats costs ~30 bytes a value), a null chunk as its length, anything else as is."""
    kind = _column_kind(values)
    if kind == "null":
        return kind, len(values)
    return kind, values if kind == "object" else _column_array(kind, values)


def _unpack(kind: str, payload) -> list:
    if kind == "null":
        return [None] * payload
    if kind == "object":
        return payload
    return [Column(kind, payload).get(i) for i in range(len(payload))]


def _join_column(
    name: str, parts: list[tuple[str, np.ndarray | list | int]], source: str
) -> Column:
    """One column from its packed chunks; null chunks take the column's kind, and a column of
    mixed kinds keeps its Python values (so it survives a round trip)."""
    kinds = {kind for kind, _ in parts} - {"null"}
    if "object" in kinds or len(kinds) > 1:  # a mix of kinds is kept as it is
        return Column("object", [v for kind, payload in parts for v in _unpack(kind, payload)])
    kind = kinds.pop() if kinds else "number"
    arrays = [
        _column_array(kind, [None] * payload) if part_kind == "null" else payload
        for part_kind, payload in parts
    ]
    return Column(kind, np.concatenate(arrays))


def _length(kind: str, payload) -> int:
    return payload if kind == "null" else len(payload)


@dataclass
class RetrievalLists:
    """Questions and their ranked passages, column by column.

    Attributes:
        fields: each question's own fields (id, question, answers, target, ...).
        offsets: (Q + 1,) question q's passages are positions offsets[q]:offsets[q + 1].
        passage_ids: (P,) passage ids as UTF-8 bytes.
        columns: passage fields by name (score, has_answer, reader_score, ...), each (P,).
        corpus: the fingerprint of the corpus the ids refer to, or None.
    """

    fields: list[dict[str, Any]]
    offsets: np.ndarray
    passage_ids: np.ndarray
    columns: dict[str, Column] = field(default_factory=dict)
    corpus: dict | None = None

    def __len__(self) -> int:
        return len(self.fields)

    def ids_of(self, q: int) -> list[str]:
        """Question q's passage ids, best first."""
        start, end = self.offsets[q], self.offsets[q + 1]
        return [i.decode("utf-8") for i in self.passage_ids[start:end]]

    def ctx_fields(self, q: int) -> list[dict[str, Any]]:
        """Question q's passages as ctx dicts without title and text: {"id", column: value}."""
        start, end = int(self.offsets[q]), int(self.offsets[q + 1])
        ctxs = [{"id": i} for i in self.ids_of(q)]
        for name, column in self._columns_of(q):
            for ctx, position in zip(ctxs, range(start, end), strict=True):
                ctx[name] = column.get(position)
        return ctxs

    def _columns_of(self, q: int) -> list[tuple[str, Column]]:
        return [(n, c) for n, c in self.columns.items() if c.present is None or c.present[q]]

    def line(self, q: int) -> dict[str, Any]:
        """Question q as a line of the file."""
        start, end = int(self.offsets[q]), int(self.offsets[q + 1])
        columns = {
            name: [column.get(p) for p in range(start, end)] for name, column in self._columns_of(q)
        }
        return {**self.fields[q], "passages": self.ids_of(q), "columns": columns}

    def with_number_column(self, name: str, values: np.ndarray) -> RetrievalLists:
        """These lists with one more number column: (P,) float64 over all passages, NaN null."""
        if values.shape != self.passage_ids.shape:
            raise ValueError(
                f"column {name!r} has {len(values)} values for {len(self.passage_ids)}"
            )
        columns = {**self.columns, name: Column("number", np.asarray(values, dtype=np.float64))}
        return RetrievalLists(self.fields, self.offsets, self.passage_ids, columns, self.corpus)


def lists_from_records(records: Sequence[dict], corpus: dict | None = None) -> RetrievalLists:
    """FiD records `{..., ctxs: [{id, title, text, ...}]}` as compact lists (texts dropped).

    A ctx field becomes a column of the questions whose ctxs have it; a passage of such a
    question that lacks the field gets null there.
    """
    fields, ids, offsets = [], [], [0]
    keys_of: list[set[str]] = []  # each question's ctx fields
    for record in records:
        fields.append({k: v for k, v in record.items() if k != "ctxs"})
        keys_of.append({k for ctx in record["ctxs"] for k in ctx if k not in PASSAGE_FIELDS})
        ids.extend(str(ctx["id"]) for ctx in record["ctxs"])
        offsets.append(len(ids))
    columns = {}
    for name in dict.fromkeys(k for record in records for ctx in record["ctxs"] for k in ctx):
        if name in PASSAGE_FIELDS:
            continue
        values = [ctx.get(name) for record in records for ctx in record["ctxs"]]
        column = _join_column(name, [_pack(values)], "FiD records")
        present = np.asarray([name in keys for keys in keys_of])
        column.present = None if present.all() else present
        columns[name] = column
    return RetrievalLists(
        fields, np.asarray(offsets, dtype=np.int64),
        np.asarray([i.encode("utf-8") for i in ids], dtype=np.bytes_), columns, corpus,
    )  # fmt: skip


def _check_line(record: Any, where: str) -> None:
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a question object, got {type(record).__name__}")
    passages = record.get("passages")
    if not isinstance(passages, list) or not passages:
        raise DataError(f"{where}: field 'passages' must be a non-empty list of passage ids")
    columns = record.get("columns", {})
    if not isinstance(columns, dict):
        raise DataError(f"{where}: field 'columns' must be an object of per-passage lists")
    for name, values in columns.items():
        if not isinstance(values, list) or len(values) != len(passages):
            raise DataError(
                f"{where}: columns.{name} must be a list of {len(passages)} values (one per "
                "passage)"
            )
        wrong = next((v for v in values if v is not None and not _is_kind(name, v)), None)
        if wrong is not None:
            raise DataError(
                f"{where}: columns.{name} must hold {_COLUMN_TYPES[name]} or null, found "
                f"{wrong!r:.40}"
            )


# Columns that every reader of lists takes as one type: a string "no" as a has_answer flag
# would count as a hit (bool("no") is True), a string score would sort as text.
_COLUMN_TYPES = {
    "has_answer": "booleans (true/false)",
    "score": "numbers",
    "reader_score": "numbers",
}


def _is_kind(name: str, value: Any) -> bool:
    if name not in _COLUMN_TYPES:
        return True
    if name == "has_answer":
        return isinstance(value, bool)
    return isinstance(value, int | float) and not isinstance(value, bool)


def read_lists(path: str | Path) -> RetrievalLists:
    """Reads a compact lists file (see the module docstring).

    Lines are parsed one at a time and their passages packed into numpy chunks of a few
    thousand questions, so the Python objects of the whole file never exist at once.

    Raises:
        DataError: naming the file and line: bytes that are not UTF-8 (and their offset), no
            header, invalid JSON, a question without passages, a column of the wrong length.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    fields: list[dict] = []
    offsets = [0]
    id_chunks: list[np.ndarray] = []
    column_parts: dict[str, list[tuple[str, list]]] = {}
    pending_ids: list[str] = []
    pending: dict[str, list] = {}  # column -> values of the questions since the last flush
    present: dict[str, list[int]] = {}  # column -> the questions that have it
    header: dict | None = None

    def flush() -> None:
        id_chunks.append(np.asarray([i.encode("utf-8") for i in pending_ids], dtype=np.bytes_))
        for name in pending.keys() | column_parts.keys():
            values = pending.get(name, [])
            values += [None] * (len(pending_ids) - len(values))
            # A column first seen now is null for every earlier question.
            done = sum(_length(*part) for part in column_parts.get(name, []))
            earlier = offsets[-1] - len(pending_ids) - done
            column_parts.setdefault(name, []).extend([("null", earlier)] if earlier else [])
            column_parts[name].append(_pack(values))
        pending_ids.clear()
        pending.clear()

    for number, line in text_lines(path, "compact retrieval lists (jsonl)"):
        if not line.strip():
            continue
        where = f"{path}: line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(f"{where}: invalid JSON at column {error.colno}: {error.msg}") from None
        if header is None:
            if not isinstance(record, dict) or record.get("format") != LISTS_FORMAT:
                raise DataError(f'{where}: expected the header {{"format": {LISTS_FORMAT!r}}}')
            if record.get("version") != LISTS_VERSION:
                raise DataError(f"{where}: version {record.get('version')!r} is not "
                                f"{LISTS_VERSION}, the one this fid reads")  # fmt: skip
            header = record
            continue
        _check_line(record, where)
        ids = [str(i) for i in record.pop("passages")]
        before = len(pending_ids)
        for name, values in record.pop("columns", {}).items():
            column = pending.setdefault(name, [])
            column += [None] * (before - len(column)) + values
            present.setdefault(name, []).append(len(fields))
        pending_ids.extend(ids)
        offsets.append(offsets[-1] + len(ids))
        fields.append(record)
        if len(fields) % _CHUNK == 0:
            flush()
    if header is None:
        raise DataError(f"{path}: empty file; expected compact retrieval lists")
    flush()
    columns = {name: _join_column(name, parts, str(path)) for name, parts in column_parts.items()}
    for name, column in columns.items():
        if len(present[name]) < len(fields):
            column.present = np.zeros(len(fields), dtype=bool)
            column.present[present[name]] = True
    return RetrievalLists(
        fields, np.asarray(offsets, dtype=np.int64), np.concatenate(id_chunks), columns,
        header.get("corpus"),
    )  # fmt: skip


def repeated_passages(lists: RetrievalLists) -> tuple[int, tuple[int, str] | None]:
    """How many questions name a passage more than once in their list, and the first such
    (question position, passage id); (0, None) when none does. Vectorised: one sort of the
    (question, id) pairs, not a set per question."""
    lengths = np.diff(lists.offsets)
    questions = np.repeat(np.arange(len(lengths)), lengths)
    order = np.lexsort((lists.passage_ids, questions))
    ids, qs = lists.passage_ids[order], questions[order]
    repeated = np.flatnonzero((qs[1:] == qs[:-1]) & (ids[1:] == ids[:-1]))
    if not len(repeated):
        return 0, None
    first = repeated[np.argmin(qs[repeated])]
    return len(np.unique(qs[repeated])), (int(qs[first]), ids[first].decode("utf-8", "replace"))


def iter_lines(lists: RetrievalLists) -> Iterator[dict]:
    """The file's lines after the header."""
    for q in range(len(lists)):
        yield lists.line(q)


def write_lists(path: str | Path, lists: RetrievalLists) -> None:
    """Writes compact lists atomically."""
    write_lines(path, lists.corpus, iter_lines(lists))


def write_lines(path: str | Path, corpus: dict | None, lines: Iterator[dict]) -> int:
    """Writes a header and question lines (as `RetrievalLists.line` gives them) atomically;
    streams, so that a writer never holds more than one line. Returns the number written."""
    header = {"format": LISTS_FORMAT, "version": LISTS_VERSION, "corpus": corpus}
    count = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(header) + "\n")
        for line in lines:
            handle.write(json.dumps(line, ensure_ascii=False) + "\n")
            count += 1
    return count
