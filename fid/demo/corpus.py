"""Texts of a corpus, for training a tokenizer: DPR passage TSVs and FiD question files."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from fid.data.examples import load_examples
from fid.data.passages import iter_passages
from fid.data.retrieval_lists import is_compact_lists, read_lists
from fid.errors import DataError


def corpus_texts(paths: Sequence[str | Path]) -> Iterator[str]:
    """Every text of the given files: passage titles and texts from `.tsv` passage files;
    questions, answers and passages from FiD-format `.json`/`.jsonl` files; questions and
    answers of compact lists (their passages' text is in the passage file)."""
    for path in map(Path, paths):
        if not path.is_file():
            raise DataError(f"{path}: file not found")
        if path.suffix == ".tsv":
            for passage in iter_passages(path):
                yield passage.title
                yield passage.text
            continue
        if is_compact_lists(path):
            for fields in read_lists(path).fields:
                yield fields["question"]
                yield from fields.get("answers", [])
            continue
        for example in load_examples(path):
            yield example.question
            yield from example.answers
            for ctx in example.ctxs:
                yield ctx["title"]
                yield ctx["text"]
