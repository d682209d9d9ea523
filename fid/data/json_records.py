"""One reader of json and jsonl record files, for every loader of question records.

A file is one JSON document (a list of records, or an object) or jsonl (one JSON value per
non-blank line). The content decides, not the suffix: when the whole text is not one JSON
document but its first line is, it is jsonl, and a later bad line is reported by its number.
The callers read the text with `fid.text_files.read_text` (UTF-8, a byte-order mark dropped).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass
class JsonSyntaxError(Exception):
    """Text that is neither one JSON document nor jsonl.

    Attributes:
        line, column: where the parser stopped (1-based).
        message: the parser's reason.
        jsonl: True when the text is jsonl and `line` is the line holding the bad record.
    """

    line: int
    column: int
    message: str
    jsonl: bool

    def where(self) -> str:
        """ "line L: invalid JSON at column C: ..." (jsonl) or "invalid JSON at line L column C"."""
        if self.jsonl:
            return f"line {self.line}: invalid JSON at column {self.column}: {self.message}"
        return f"invalid JSON at line {self.line} column {self.column}: {self.message}"


@dataclass
class JsonRecords:
    """A parsed file: `document` for one JSON document, else `lines` of a jsonl file.

    Attributes:
        document: the parsed document (a list of records, an object, ...), or None for jsonl.
        lines: (line number, record) for each non-blank line of a jsonl file, or None.
    """

    document: Any = None
    lines: list[tuple[int, Any]] | None = None


def _first_line_is_json(text: str) -> bool:
    first_line = text.lstrip().split("\n", 1)[0]
    try:
        json.loads(first_line)
    except json.JSONDecodeError:
        return False
    return True


def parse_json_records(text: str) -> JsonRecords:
    """Parses the text of a json or jsonl file (see the module docstring).

    Raises:
        JsonSyntaxError: where the text stops being JSON.
    """
    try:
        return JsonRecords(document=json.loads(text))
    except json.JSONDecodeError as error:
        if not _first_line_is_json(text):
            raise JsonSyntaxError(error.lineno, error.colno, error.msg, jsonl=False) from None
    lines = []
    # Lines end at "\n" only (a "\r" before it is JSON whitespace): str.splitlines would also
    # cut at U+2028, U+0085, form feeds, ..., which json.dumps(ensure_ascii=False) leaves raw
    # inside strings, and would number lines unlike the decoding errors (fid.text_files).
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            lines.append((number, json.loads(line)))
        except json.JSONDecodeError as error:
            raise JsonSyntaxError(number, error.colno, error.msg, jsonl=True) from None
    return JsonRecords(lines=lines)
