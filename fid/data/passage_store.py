"""Random access to the passages of a DPR TSV by id: a memory-mapped offsets index over the file.

Retrieval lists in the compact format (fid.data.retrieval_lists) name passages by id only; the
text is read from the corpus when a batch is built. `fid build-passage-store` reads the TSV once
and writes a folder:

    store.json    what it indexes: the TSV's path, size and sha256 (the corpus fingerprint),
                  the number of passages, and a cheap check (sha256 of the first and last MiB)
    offsets.npy   (N + 1,) uint64: passage r is the line(s) in bytes [offsets[r], offsets[r+1])
    ids.npy       (N,) the ids, sorted, as fixed-width bytes (binary search; DPR's ids are
                  1..21M, other corpora use any string)
    rows.npy      (N,) int64: the row of each sorted id

At DPR's 21M passages the three arrays take about 0.5 GB on disk and are memory-mapped: a
process touches only the pages of the ids it looks up. The text stays in the TSV (no second
13 GB copy); every read checks that the line holds the id asked for, so a TSV edited after the
store was built cannot hand out another passage's text. Why not a database (sqlite, Arrow):
the TSV is already the store's payload, and two numpy arrays are all a lookup needs.
"""

from __future__ import annotations

import csv
import hashlib
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fid.data.passages import (
    PASSAGE_FILE,
    Passage,
    count_passages,
    fetch_passages,
    load_passages,
    read_header,
)
from fid.errors import DataError
from fid.runtime.fileio import atomic_directory, atomic_write_json
from fid.runtime.progress import progress
from fid.text_files import decode_line, read_json

logger = logging.getLogger(__name__)

STORE_FORMAT = "fid-passage-store"
STORE_VERSION = 1
_META = "store.json"
_ARRAYS = ("offsets", "ids", "rows")
_SAMPLE_BYTES = 1 << 20
_HASH_CHUNK = 1 << 24


def sampled_sha256(path: Path) -> str:
    """sha256 of a file's size, first and last MiB: a check that costs two reads."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as handle:
        digest.update(handle.read(_SAMPLE_BYTES))
        handle.seek(max(0, size - _SAMPLE_BYTES))
        digest.update(handle.read(_SAMPLE_BYTES))
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    """sha256 of a whole file, read in 16 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _row_id(line: bytes, id_column: int, n_columns: int, where: str) -> bytes:
    """The id field of one TSV line (csv-unquoted when quoted), the line checked to hold the
    header's columns (a short row would be found only when a passage is read, and blamed on
    a changed file).

    Raises:
        DataError: naming `where` (file and line) and the columns found.
    """
    fields = line.rstrip(b"\r\n").split(b"\t")
    if len(fields) != n_columns or fields[id_column].startswith(b'"'):  # quoting: csv's rules
        fields = [f.encode("utf-8") for f in next(csv.reader([line.decode("utf-8")],
                                                             delimiter="\t"))]  # fmt: skip
    if len(fields) != n_columns:
        raise DataError(f"{where}: expected {n_columns} tab-separated columns (as the header "
                        f"line), found {len(fields)}")  # fmt: skip
    return fields[id_column]


def build_passage_store(passages_path: str | Path, output: str | Path) -> dict:
    """`fid build-passage-store`: the offsets index of a DPR TSV (see the module docstring).

    Reads the file once (hashing it on the way); only ids and offsets are held, as numpy
    arrays (about 25 bytes a passage).

    Returns:
        The store's record (store.json).

    Raises:
        DataError: a missing file, a bad header, a line that is not UTF-8, an empty id, or an
            id that occurs twice.
    """
    passages_path, output = Path(passages_path), Path(output)
    header = read_header(passages_path)
    id_column = header.index("id")
    digest = hashlib.sha256()
    offsets: list[np.ndarray] = []
    ids: list[np.ndarray] = []
    chunk_offsets: list[int] = []
    chunk_ids: list[bytes] = []

    def flush() -> None:
        offsets.append(np.asarray(chunk_offsets, dtype=np.uint64))
        ids.append(np.asarray(chunk_ids, dtype=np.bytes_))
        chunk_offsets.clear()
        chunk_ids.clear()

    size = passages_path.stat().st_size
    with open(passages_path, "rb") as handle, progress(
        desc="passage store", unit="B", total=size, log=logger
    ) as bar:  # fmt: skip
        first = handle.readline()
        digest.update(first)
        position = len(first)
        for line_number, line in enumerate(handle, start=2):
            digest.update(line)
            # Checked now, so that reading a passage later can only fail on a changed file.
            decode_line(line, passages_path, PASSAGE_FILE, line_number, position)
            if line.strip(b"\r\n"):
                where = f"{passages_path}: line {line_number}"
                key = _row_id(line, id_column, len(header.columns), where)
                if not key.strip():
                    raise DataError(f"{passages_path}: line {line_number}: empty passage id")
                chunk_offsets.append(position)
                chunk_ids.append(key)
                if len(chunk_ids) == 1 << 20:
                    flush()
            position += len(line)
            if line_number % 65536 == 0:
                bar.update(position - bar.n)
        bar.update(position - bar.n)
    flush()
    starts = np.concatenate(offsets)
    id_array = np.concatenate(ids)  # numpy widens to the longest id
    if len(id_array) == 0:
        raise DataError(f"{passages_path}: holds no passages")
    order = np.argsort(id_array, kind="stable")
    sorted_ids = id_array[order]
    repeated = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
    if len(repeated):
        key = sorted_ids[repeated[0]].decode("utf-8", "replace")
        raise DataError(f"{passages_path}: duplicate passage id {key!r}; ids must be unique")
    record = {
        "format": STORE_FORMAT,
        "version": STORE_VERSION,
        "passages": str(passages_path),
        "bytes": position,
        "sha256": digest.hexdigest(),
        "sampled_sha256": sampled_sha256(passages_path),
        "n_passages": len(id_array),
        "id_bytes": id_array.dtype.itemsize,
    }
    with atomic_directory(output) as tmp:
        np.save(tmp / "offsets.npy", np.append(starts, np.uint64(position)))
        np.save(tmp / "ids.npy", sorted_ids)
        np.save(tmp / "rows.npy", order.astype(np.int64))
        atomic_write_json(tmp / _META, record)
    logger.info("indexed %d passages of %s into %s", len(id_array), passages_path, output)
    return record


def corpus_fingerprint(record: dict) -> dict:
    """What retrieval lists record of the corpus their ids refer to."""
    return {"sha256": record["sha256"], "n_passages": record["n_passages"]}


def passages_identity(path: str | Path) -> dict:
    """{"bytes", "sampled_sha256"} of a passage TSV, or of the TSV a store folder indexes (from
    its record): what an index of the corpus's embeddings records and is checked by. Cheap
    (a stat and two MiB read) where the full sha256 would read the whole 13 GB file.

    Raises:
        DataError: a missing file, or a folder that is no passage store.
    """
    path = Path(path)
    if path.is_dir():
        meta_path = path / _META
        if not meta_path.is_file():
            raise DataError(f"{path}: not a passage store (no {_META}); expected a folder "
                            "written by fid build-passage-store, or a passage TSV")  # fmt: skip
        record = read_json(meta_path, "a passage store record (json)")
        if not isinstance(record, dict) or "sampled_sha256" not in record:
            raise DataError(f"{meta_path}: not a passage store record (format {STORE_FORMAT!r})")
        return {"bytes": record["bytes"], "sampled_sha256": record["sampled_sha256"]}
    if not path.is_file():
        raise DataError(f"{path}: passage file not found")
    return {"bytes": path.stat().st_size, "sampled_sha256": sampled_sha256(path)}


@dataclass
class PassageStore:
    """Passages of a TSV by id, through an offsets index (`build_passage_store`).

    Attributes:
        path: the store folder (None for a TSV held in memory, see `open_passages`).
        passages_path: the TSV the text is read from.
        record: the store's store.json.
    """

    path: Path | None
    passages_path: Path
    record: dict
    _offsets: np.ndarray | None = None
    _ids: np.ndarray | None = None
    _rows: np.ndarray | None = None
    _columns: tuple[int, int, int] = (0, 1, 2)
    _fd: int | None = None
    _memory: dict[str, Passage] | None = None

    @property
    def fingerprint(self) -> dict:
        """The corpus fingerprint (sha256 and passage count) retrieval lists are checked by."""
        return corpus_fingerprint(self.record)

    def __len__(self) -> int:
        return int(self.record["n_passages"])

    def rows(self, ids: Sequence[str], source: str = "") -> np.ndarray:
        """(len(ids),) the store rows of passage ids; DataError naming an id it lacks."""
        wanted = np.asarray([str(i).encode("utf-8") for i in ids], dtype=np.bytes_)
        if len(wanted) == 0:
            return np.empty(0, dtype=np.int64)
        at = np.searchsorted(self._ids, wanted)
        found = at < len(self._ids)
        found[found] = self._ids[at[found]] == wanted[found]
        if not found.all():
            missing = wanted[~found][0].decode("utf-8", "replace")
            raise DataError(
                f"{source or 'retrieval list'}: names passage id {missing!r}, which the passage "
                f"store {self.path} ({self.passages_path}) does not hold "
                f"({int((~found).sum())} ids missing). Hint: use the store of the corpus the "
                "list was retrieved from."
            )
        return self._rows[at]

    def _read_row(self, row: int, expected_id: str) -> Passage:
        start, end = int(self._offsets[row]), int(self._offsets[row + 1])
        raw = os.pread(self._fd, end - start, start)
        try:
            fields = next(csv.reader([raw.decode("utf-8").strip("\r\n")], delimiter="\t"))
        except (UnicodeDecodeError, csv.Error, StopIteration):
            fields = []
        id_col, text_col, title_col = self._columns
        if len(fields) <= max(self._columns) or fields[id_col] != expected_id:
            raise DataError(
                f"{self.passages_path}: bytes {start}-{end} do not hold passage "
                f"{expected_id!r} as the passage store {self.path} says: the file changed after "
                "the store was built. Hint: rebuild it (fid build-passage-store)."
            )
        return Passage(id=expected_id, title=fields[title_col], text=fields[text_col])

    def get(self, ids: Iterable[str], source: str = "") -> list[Passage]:
        """The passages with these ids, in order (each read from the TSV).

        Raises:
            DataError: an id the store lacks (naming `source`), or a TSV that changed.
        """
        ids = [str(i) for i in ids]
        if self._memory is not None:
            missing = [i for i in ids if i not in self._memory]
            if missing:
                raise DataError(
                    f"{source or 'retrieval list'}: names passage id {missing[0]!r}, which "
                    f"{self.passages_path} does not hold ({len(missing)} ids missing)"
                )
            return [self._memory[i] for i in ids]
        rows = self.rows(ids, source)
        return [self._read_row(int(row), id_) for row, id_ in zip(rows, ids, strict=True)]

    def check_lists(self, fingerprint: dict | None, source: str) -> None:
        """Refuses lists retrieved from another corpus (their recorded fingerprint differs)."""
        if fingerprint is not None and fingerprint != self.fingerprint:
            raise DataError(
                f"{source}: was retrieved from a corpus with sha256 {fingerprint.get('sha256')!r} "
                f"and {fingerprint.get('n_passages')} passages, but the passages given "
                f"({self.path or self.passages_path}) have sha256 {self.record['sha256']!r} and "
                f"{len(self)} passages. Hint: pass the passage store of the corpus the lists "
                "were retrieved from."
            )

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _load_array(path: Path, name: str, length: int) -> np.ndarray:
    file = path / f"{name}.npy"
    try:
        array = np.load(file, mmap_mode="r")
    except (OSError, ValueError, EOFError) as error:
        raise DataError(
            f"{file}: not a readable numpy array ({error}). Hint: rebuild the store "
            "(fid build-passage-store)."
        ) from None
    if array.ndim != 1 or len(array) != length:
        raise DataError(
            f"{file}: holds {array.shape} values, expected {length} (store.json): a truncated "
            "or mixed-up store. Hint: rebuild it (fid build-passage-store)."
        )
    return array


def open_store(path: str | Path) -> PassageStore:
    """Opens a passage store folder and checks it against its TSV.

    Raises:
        DataError: a folder that is no store, a truncated array, or a TSV that is missing or
            is no longer the file the store was built from (size or sampled content).
    """
    path = Path(path)
    meta_path = path / _META
    if not meta_path.is_file():
        raise DataError(f"{path}: not a passage store (no {_META}); expected a folder written "
                        "by fid build-passage-store")  # fmt: skip
    record = read_json(meta_path, "a passage store record (json)")
    if not isinstance(record, dict) or record.get("format") != STORE_FORMAT:
        raise DataError(f"{meta_path}: not a passage store record (format {STORE_FORMAT!r})")
    n = int(record["n_passages"])
    offsets = _load_array(path, "offsets", n + 1)
    ids, rows = (_load_array(path, name, n) for name in ("ids", "rows"))
    passages_path = Path(record["passages"])
    if not passages_path.is_file():
        raise DataError(
            f"{meta_path}: its passage file {passages_path} is missing (the store holds offsets "
            "into it, not the text)"
        )
    if (
        passages_path.stat().st_size != record["bytes"]
        or sampled_sha256(passages_path) != record["sampled_sha256"]
    ):
        raise DataError(
            f"{passages_path}: is not the file the passage store {path} was built from (its "
            "size or content changed). Hint: rebuild the store (fid build-passage-store)."
        )
    header = read_header(passages_path)
    columns = tuple(header.index(name) for name in ("id", "text", "title"))
    fd = os.open(passages_path, os.O_RDONLY)
    return PassageStore(path, passages_path, record, offsets, ids, rows, columns, fd)


def open_passages(path: str | Path) -> PassageStore:
    """The passages of a store folder, or of a (small) TSV file held in memory.

    A TSV is read whole and hashed: fine for a demo or test corpus; build a store for a large
    one (`fid build-passage-store`).
    """
    path = Path(path)
    if path.is_dir():
        return open_store(path)
    return passages_in_memory(path, load_passages(path))


def passages_in_memory(path: str | Path, passages: dict[str, Passage]) -> PassageStore:
    """A store of passages already read from the TSV `path` (hashed now for the lists'
    corpus fingerprint)."""
    path = Path(path)
    record = {
        "format": STORE_FORMAT,
        "passages": str(path),
        "sha256": file_sha256(path),
        "n_passages": count_passages(path),
    }
    return PassageStore(None, path, record, _memory=passages)


def passages_for(path: str | Path, ids: Iterable[str]) -> PassageStore:
    """The passages that retrieval lists name: a store folder opened as it is (`ids` unread),
    or, from a TSV, just these passages read in one pass (what retrieval needs of a file
    without a store)."""
    path = Path(path)
    if path.is_dir():
        return open_store(path)
    return passages_in_memory(path, fetch_passages(path, set(ids)))
