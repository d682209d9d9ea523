"""Texts of a corpus, for training a tokenizer: DPR passage TSVs and FiD question files."""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from fid.data import DataError, load_examples


def _passage_tsv_texts(path: Path) -> Iterator[str]:
    try:
        yield from _passage_tsv_rows(path)
    except UnicodeDecodeError as error:
        raise DataError(
            f"{path}: not UTF-8 text ({error.reason}): expected a DPR passage TSV"
        ) from None


def _passage_tsv_rows(path: Path) -> Iterator[str]:
    csv.field_size_limit(sys.maxsize)
    with open(path, newline="", encoding="utf-8") as handle:
        rows = csv.reader(handle, delimiter="\t")
        header = next(rows, None)
        if header is None or not {"text", "title"} <= set(header):
            raise DataError(
                f"{path}: line 1: expected a DPR passage header with 'id', 'text' and 'title', "
                f"found {header!r}"
            )
        text_col, title_col = header.index("text"), header.index("title")
        for line, row in enumerate(rows, start=2):
            if len(row) != len(header):
                raise DataError(
                    f"{path}: line {line}: expected {len(header)} columns, got {len(row)}"
                )
            yield row[title_col]
            yield row[text_col]


def corpus_texts(paths: Sequence[str | Path]) -> Iterator[str]:
    """Every text of the given files: passage titles and texts from `.tsv` passage files;
    questions, answers and passages from FiD-format `.json`/`.jsonl` files."""
    for path in map(Path, paths):
        if not path.is_file():
            raise DataError(f"{path}: file not found")
        if path.suffix == ".tsv":
            yield from _passage_tsv_texts(path)
            continue
        for example in load_examples(path):
            yield example.question
            yield from example.answers
            for ctx in example.ctxs:
                yield ctx["title"]
                yield ctx["text"]
