"""DPR passage files (`psgs_w100.tsv`), streamed: the full file has 21M rows (13 GB).

Format: a header line naming the columns `id`, `text` and `title` (DPR's order is
`id<TAB>text<TAB>title`; any order and extra columns are accepted), then one passage per line,
tab-separated with csv quoting (texts are double-quoted, `""` inside is a quote), in UTF-8
(fid.text_files: a byte-order mark is dropped, `\r\n` endings are read as `\n`). Ids are kept as
strings: DPR's are integers, other corpora use any token.

Nothing here holds a whole large file in memory: `iter_passages` streams rows, optionally those
of one byte range (a shard), so that N workers can each read 1/N of the file without any of them
reading the rest. Line numbers in error messages are physical lines of the file (header = 1).

Sharding assumes what is true of DPR's files: no row holds a newline inside quotes, so every
physical line after the header is exactly one passage and a line start is a row start.
"""

from __future__ import annotations

import csv
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from fid.errors import DataError, InputError
from fid.text_files import decode_line, not_utf8, text_lines

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("id", "text", "title")
PASSAGE_FILE = "a DPR-style passage TSV (id<TAB>text<TAB>title)"  # for messages
# Passages of fewer words (DPR-style chunk tails) are kept, counted and reported in the log.
SHORT_PASSAGE_WORDS = 5
_READ_CHUNK_BYTES = 1 << 24

# Wikipedia passages are far below the csv module's default 128 KiB field limit, but other
# corpora are not; the limit guards against runaway quotes, which the column checks catch anyway.
csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


@dataclass(frozen=True)
class Passage:
    """One passage of a DPR-style corpus."""

    id: str
    title: str
    text: str


@dataclass(frozen=True)
class _Header:
    columns: list[str]
    end: int  # byte offset of the first data line

    def index(self, name: str) -> int:
        return self.columns.index(name)


def _check_file(path: Path) -> None:
    if not path.is_file():
        raise DataError(f"{path}: passage file not found")


def read_header(path: Path) -> _Header:
    """Reads and checks line 1; returns its columns and where the data starts."""
    _check_file(path)
    with open(path, "rb") as handle:
        raw = handle.readline()
    line = decode_line(raw, path, PASSAGE_FILE, line=1, offset=0)  # (a byte-order mark dropped)
    columns = next(csv.reader([line], delimiter="\t"), [])
    found = line.rstrip("\r\n")
    missing = [name for name in REQUIRED_COLUMNS if name not in columns]
    if missing:
        raise DataError(
            f"{path}: line 1: expected a header naming the columns id, text and title "
            f"(DPR: 'id<TAB>text<TAB>title'), found {found[:200]!r} "
            f"(missing: {', '.join(missing)})"
        )
    duplicated = sorted({name for name in columns if columns.count(name) > 1} & {*REQUIRED_COLUMNS})
    if duplicated:
        raise DataError(f"{path}: line 1: header names column(s) {duplicated} more than once")
    return _Header(columns=columns, end=len(raw))


def _lines_before(path: Path, offset: int) -> int:
    """Number of newlines in the first `offset` bytes (to turn shard positions into lines)."""
    count = 0
    with open(path, "rb") as handle:
        remaining = offset
        while remaining > 0:
            chunk = handle.read(min(_READ_CHUNK_BYTES, remaining))
            if not chunk:
                break
            count += chunk.count(b"\n")
            remaining -= len(chunk)
    return count


def _next_line_start(handle, offset: int, floor: int) -> int:
    """The first line start at or after `offset` (never before `floor`, the data start)."""
    if offset <= floor:
        return floor
    handle.seek(offset - 1)
    if handle.read(1) == b"\n":
        return offset
    handle.readline()  # the rest of the line that `offset` falls inside
    return handle.tell()


def _iter_rows(path: Path, start: int, end: int | None) -> Iterator[tuple[int, Passage]]:
    """Yields (k, passage) for the data lines starting in [start, end), where the passage starts
    on the k-th line (0-based) after the first line of the range; errors name physical lines.
    """
    header = read_header(path)
    id_col, text_col, title_col = (header.index(name) for name in ("id", "text", "title"))
    n_columns = len(header.columns)
    with open(path, "rb") as handle:
        first = _next_line_start(handle, start, header.end)
        handle.seek(first)
        # Physical line numbers are only needed for error messages; counting the newlines before
        # a shard's start means reading that part of the file, so it is done only on an error.
        base: list[int] = []

        def line_number(relative: int) -> int:
            if not base:
                base.append(_lines_before(path, first) + 1)
            return base[0] + relative

        consumed = 0  # data lines handed to the csv reader so far

        def lines() -> Iterator[str]:
            nonlocal consumed
            position = first
            for raw in handle:
                if end is not None and position >= end:
                    return
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    line = line_number(consumed)
                    raise not_utf8(path, PASSAGE_FILE, error, line, position) from None
                position += len(raw)
                consumed += 1
                yield text

        reader = csv.reader(lines(), delimiter="\t")
        n_short, first_short = 0, ""  # passages of fewer than SHORT_PASSAGE_WORDS words
        while True:
            row_start = consumed  # the lines of earlier rows; this row starts on the next one
            try:
                row = next(reader)
            except StopIteration:
                _log_short_passages(path, n_short, first_short)
                return
            except csv.Error as error:
                raise DataError(f"{path}: line {line_number(row_start)}: {error}") from None
            if not row:
                continue  # a blank line (e.g. a trailing one) holds no passage
            if len(row) != n_columns or not row[id_col].strip() or not row[text_col].strip():
                _raise_row_error(row, header, f"{path}: line {line_number(row_start)}")
            # split stops after a few words: no cost on long texts
            if len(row[text_col].split(maxsplit=SHORT_PASSAGE_WORDS - 1)) < SHORT_PASSAGE_WORDS:
                n_short += 1
                first_short = first_short or row[id_col]
            yield row_start, Passage(id=row[id_col], title=row[title_col], text=row[text_col])


def _log_short_passages(path: Path, n_short: int, first_id: str) -> None:
    if n_short:
        logger.warning(
            "%s: %d passages have fewer than %d words (e.g. id %r): kept, but they hold little "
            "to retrieve or read (DPR-style chunk tails?)",
            path, n_short, SHORT_PASSAGE_WORDS, first_id,
        )  # fmt: skip


def _raise_row_error(row: list[str], header: _Header, where: str) -> NoReturn:
    """Raises the DataError that says what is wrong with a row that failed the checks."""
    n_columns = len(header.columns)
    if len(row) != n_columns:
        raise DataError(
            f"{where}: expected {n_columns} tab-separated columns "
            f"({', '.join(header.columns)}), found {len(row)}"
        )
    id_ = row[header.index("id")]
    if not id_.strip():
        raise DataError(f"{where}: empty passage id")
    raise DataError(f"{where}: passage {id_!r} has an empty text")


def iter_passages(path: str | Path, start: int = 0, end: int | None = None) -> Iterator[Passage]:
    """Streams the passages of a DPR TSV file, validating each row.

    Args:
        path: the passage file (header line, then one passage per line).
        start: byte offset; only passages whose line starts at or after it are read (a line
            that `start` falls inside belongs to the previous range).
        end: byte offset; only passages whose line starts before it are read (None: to the end).
            Use `passage_shard_bounds` to cut a file into shards.

    Yields:
        The passages in file order.

    Raises:
        DataError: a missing file, a header without the id/text/title columns, or a row with
            the wrong number of columns, an empty id or an empty text (naming file and line).
    """
    for _, passage in _iter_rows(Path(path), start, end):
        yield passage


def passage_shard_bounds(path: str | Path, shard: int, n_shards: int) -> tuple[int, int]:
    """The byte range [start, end) of shard `shard` out of `n_shards` of a passage file.

    The data lines (after the header) are cut into `n_shards` contiguous ranges of about equal
    size in bytes; every boundary is moved forward to the next line start, so each line falls in
    exactly one shard (assuming, as holds for DPR's files, that no quoted text spans lines).
    A shard can be empty when the file has fewer lines than shards.

    Args:
        path: the passage file.
        shard: which shard, 0 <= shard < n_shards.
        n_shards: how many shards.

    Returns:
        (start, end) byte offsets for `iter_passages(path, start, end)`.

    Raises:
        InputError: shard or n_shards out of range (a ValueError).
        DataError: a missing file or a bad header.
    """
    if isinstance(n_shards, bool) or not isinstance(n_shards, int) or n_shards < 1:
        raise InputError(f"--n-shards must be an integer >= 1, got {n_shards!r}")
    if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < n_shards:
        raise InputError(f"--shard must be an integer in [0, {n_shards}), got {shard!r}")
    path = Path(path)
    header = read_header(path)
    size = os.path.getsize(path)
    data_bytes = size - header.end
    with open(path, "rb") as handle:
        start, end = (
            _next_line_start(handle, header.end + data_bytes * k // n_shards, header.end)
            for k in (shard, shard + 1)
        )
    return start, min(end, size)


def count_lines(path: str | Path, start: int, end: int) -> int:
    """The lines that end in the byte range [start, end) of a file (a shard's passages, from
    `passage_shard_bounds`): newlines counted in 16 MiB reads, nothing parsed (~0.3 s a GB)."""
    count = 0
    with open(path, "rb") as handle:
        handle.seek(start)
        left = end - start
        while left > 0 and (chunk := handle.read(min(left, 1 << 24))):
            count += chunk.count(b"\n")
            left -= len(chunk)
    return count


def count_passages(path: str | Path) -> int:
    """The number of passages in a file: its non-blank lines after the header.

    Counts lines without parsing them (fast on the 13 GB file); rows are validated only when
    they are read with `iter_passages`.

    Raises:
        DataError: a missing file or a bad header.
    """
    path = Path(path)
    header = read_header(path)
    count = 0
    with open(path, "rb") as handle:
        handle.seek(header.end)
        for line in handle:
            if line.strip(b"\r\n"):
                count += 1
    return count


def load_passages(path: str | Path) -> dict[str, Passage]:
    """All passages of a small file by id (tests, the demo); stream large files instead.

    Raises:
        DataError: as `iter_passages`, and for an id that occurs twice (naming both lines).
    """
    path = Path(path)
    passages: dict[str, Passage] = {}
    lines: dict[str, int] = {}
    for k, passage in _iter_rows(path, 0, None):
        line = k + 2  # reading from the start, the range's first line is line 2
        if passage.id in lines:
            raise DataError(
                f"{path}: line {line}: duplicate passage id {passage.id!r} "
                f"(first on line {lines[passage.id]})"
            )
        lines[passage.id] = line
        passages[passage.id] = passage
    logger.info("loaded %d passages from %s", len(passages), path)
    return passages


def check_unique_ids(ids: Sequence[str], source: str) -> None:
    """Raises DataError naming the first id that occurs twice in `ids`.

    Args:
        ids: passage (or question) ids in order.
        source: what the ids come from (a file name), for the message.
    """
    first_seen: dict[str, int] = {}
    for position, id_ in enumerate(ids):
        if id_ in first_seen:
            raise DataError(
                f"{source}: duplicate id {id_!r} at positions {first_seen[id_]} and {position} "
                "(0-based); ids must be unique"
            )
        first_seen[id_] = position


def fetch_passages(path: str | Path, ids: set[str]) -> dict[str, Passage]:
    """The passages with the given ids, streaming the file once (stopping when all are found).

    For retrieval output: a top-k list names a few passages of a file too large to load. Only
    the id of each line is looked at (the text before its first tab, when `id` is the first
    column, as in DPR's files); just the wanted lines are parsed, so a pass over the 21M-row
    file costs a line split per row rather than a csv parse.

    Raises:
        DataError: an id that the file does not hold (the index was built from another file),
            or a line before the last one wanted that is not UTF-8.
    """
    path = Path(path)
    wanted = set(ids)
    found: dict[str, Passage] = {}
    header = read_header(path)
    if wanted and header.index("id") == 0:
        id_col, text_col, title_col = (header.index(name) for name in REQUIRED_COLUMNS)
        lines = text_lines(path, PASSAGE_FILE)
        next(lines)  # the header
        for _, line in lines:
            key = line.split("\t", 1)[0]
            if key.startswith('"'):  # a quoted id: let csv unquote it
                key = next(csv.reader([key], delimiter="\t"))[0]
            if key in wanted:
                row = next(csv.reader([line], delimiter="\t"))
                found[key] = Passage(id=key, title=row[title_col], text=row[text_col])
                if len(found) == len(wanted):
                    break
    elif wanted:
        for passage in iter_passages(path):
            if passage.id in wanted:
                found[passage.id] = passage
                if len(found) == len(wanted):
                    break
    missing = wanted - found.keys()
    if missing:
        example = sorted(missing)[0]
        raise DataError(
            f"{path}: holds no passage with id {example!r} ({len(missing)} retrieved ids are "
            "missing). Hint: pass the passage file that the index was built from."
        )
    return found
