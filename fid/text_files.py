"""The one way fid decodes the text files it is given: UTF-8, a byte-order mark dropped, and a
byte that is not UTF-8 reported in one error naming the file, the line and the byte offset.

Every reader of a text input (questions in any format, FiD json, compact retrieval lists,
passage TSVs, YAML configs, the json of model, index and store folders) decodes through here,
so that all of them accept the same bytes and refuse the rest with the same message:

    FILE: line 7: not UTF-8 (byte 0xff at byte offset 523: invalid start byte): expected
    compact retrieval lists in UTF-8

- `read_text`: a whole file (json documents, YAML, question files); `read_json` parses it;
- `text_lines`: a file line by line, for files too large to hold (compact lists, passage
  TSVs): each line is decoded on its own, so the line and offset of a bad byte are known;
- `decode_line` and `not_utf8`: for readers that read bytes themselves (a shard's byte range
  of a passage TSV, the passage store's offsets) and know where the bytes came from.

A UTF-8 byte-order mark (EF BB BF) at the start of a file is dropped: Windows tools write one
(Notepad, Excel's "CSV UTF-8"), it means nothing in UTF-8, and left in place it breaks json
("Unexpected UTF-8 BOM") or sticks to the first value (a question text, a column name).
Anywhere else U+FEFF is a character of the data. The exception: a file that another library
reads after fid (a model folder's config.json, which transformers parses itself) is refused
with a byte-order mark, by name, rather than accepted here and failing there. Line endings are
the parsers' business: json, csv and YAML read `\\n` and `\\r\\n` alike, so both are accepted
everywhere.

Standard library only, below every stage package (fid.config reads YAML through it).
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fid.errors import DataError, InputError

_BOM = "\ufeff"
_UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)


def not_utf8(
    path: str | Path,
    what: str,
    error: UnicodeDecodeError,
    line: int,
    offset: int,
    kind: type[InputError] = DataError,
) -> InputError:
    """The error for bytes of a file that are not UTF-8.

    Args:
        path: the file.
        what: what the file should hold ("compact retrieval lists", "a YAML file of knobs").
        error: the decoding error of bytes read from the file (`error.object`).
        line: the 1-based line of the file that holds the bad byte.
        offset: the file's byte offset of `error.object`'s first byte (0: the whole file).
        kind: the error class to return (the caller's own: ConfigError for a config, ...).

    Returns:
        `kind("FILE: line L: not UTF-8 (byte 0xNN at byte offset O: reason): expected WHAT
        in UTF-8")`, for the caller to raise (`from None`: the codec's traceback says nothing
        more).
    """
    at = offset + error.start
    byte = error.object[error.start]
    hint = ""
    if at == 0 and error.object[:2] in _UTF16_BOMS:
        hint = ". Hint: the file is UTF-16 (it starts with its byte-order mark): save it as UTF-8"
    return kind(
        f"{path}: line {line}: not UTF-8 (byte 0x{byte:02x} at byte offset {at}: "
        f"{error.reason}): expected {what} in UTF-8{hint}"
    )


def decode_line(
    raw: bytes,
    path: str | Path,
    what: str,
    line: int,
    offset: int,
    kind: type[InputError] = DataError,
) -> str:
    """The text of bytes read from a file (a line, or any run of whole lines).

    Args:
        raw: the bytes, as read.
        path, what, kind: as `not_utf8`.
        line: the 1-based line `raw` starts on.
        offset: the file's byte offset of `raw[0]`; at 0, a byte-order mark is dropped.

    Raises:
        kind: naming the file, line and byte offset of the first byte that is not UTF-8.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        bad_line = line + raw.count(b"\n", 0, error.start)
        raise not_utf8(path, what, error, bad_line, offset, kind) from None
    return text.removeprefix(_BOM) if offset == 0 else text


def read_text(
    path: str | Path,
    what: str,
    kind: type[InputError] = DataError,
    bom_refused: str | None = None,
) -> str:
    """A whole text file, decoded (see the module docstring).

    Args:
        path: the file (missing: the OSError propagates; callers say "not found" first).
        what: what it should hold, for the message ("a question file").
        kind: the error class to raise (the caller's own: ConfigError for a config, ...).
        bom_refused: for a file that another library reads after fid, why a byte-order mark
            cannot be dropped ("transformers cannot read it"): it is refused, naming the
            reason; None: a byte-order mark is dropped.

    Raises:
        kind: naming the file, line and byte offset of the first byte that is not UTF-8 (or
            a byte-order mark that `bom_refused` refuses).
    """
    data = Path(path).read_bytes()
    if bom_refused is not None and data.startswith(codecs.BOM_UTF8):
        raise kind(
            f"{path}: line 1: starts with a UTF-8 byte-order mark, which {bom_refused}: expected "
            f"{what} in UTF-8 without one. Hint: save the file without the byte-order mark"
        )
    return decode_line(data, path, what, line=1, offset=0, kind=kind)


def read_json(
    path: str | Path,
    what: str,
    kind: type[InputError] = DataError,
    bom_refused: str | None = None,
) -> Any:
    """A whole JSON file, decoded as `read_text` decodes it and parsed; the callers check
    what the document holds.

    Raises:
        kind: text that is not UTF-8, or not JSON ("FILE: not valid JSON (reason at line L
            column C): expected WHAT").
    """
    text = read_text(path, what, kind, bom_refused)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise kind(
            f"{path}: not valid JSON ({error.msg} at line {error.lineno} column {error.colno}): "
            f"expected {what}"
        ) from None


def text_lines(
    path: str | Path, what: str, kind: type[InputError] = DataError
) -> Iterator[tuple[int, str]]:
    """A text file line by line: (1-based line number, the line with its `\\n` or `\\r\\n`).

    Lines are split at `\\n` (never inside a UTF-8 character) and decoded one at a time, so a
    file of any size streams; a byte-order mark at the start of line 1 is dropped.

    Args:
        path, what, kind: as `read_text`.

    Raises:
        kind: when a line is reached that is not UTF-8 (naming file, line and byte offset).
    """
    with open(path, "rb") as handle:
        offset = 0
        for number, raw in enumerate(handle, start=1):
            yield number, decode_line(raw, path, what, number, offset, kind)
            offset += len(raw)
