"""`fid convert-lists`: FiD json (passages with their text) <-> compact retrieval lists.

FiD json stays what other tools read and write (facebookresearch/FiD, DPR's outputs); compact
lists are what the pipeline keeps at scale. Converting either way is lossless for what both
formats hold: the question fields, each passage's id and its other fields (scores, flags), and
the text, which compact lists read back from the passage store. Passage ids become strings.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from fid.data.examples import load_examples
from fid.data.passage_store import PassageStore, open_passages
from fid.data.retrieval_lists import (
    is_compact_lists,
    lists_from_records,
    write_lists,
)
from fid.errors import DataError
from fid.runtime.fileio import atomic_path

logger = logging.getLogger(__name__)


def _check_texts(records: list[dict], passages: PassageStore, source: Path) -> None:
    """Compact lists keep ids only: a ctx whose text is not the store's would change."""
    for record in records:
        ctxs = record["ctxs"]
        stored = passages.get([str(c["id"]) for c in ctxs], str(source))
        for ctx, passage in zip(ctxs, stored, strict=True):
            if (ctx["title"], ctx["text"]) != (passage.title, passage.text):
                raise DataError(
                    f"{source}: question {record.get('id')!r}: passage {ctx['id']!r} has another "
                    f"title or text than in {passages.passages_path}; compact lists keep only ids, "
                    "so this text would be lost. Hint: give the passages these lists came from."
                )


def export_fid_json(lists_path: Path, passages: PassageStore, output: Path) -> int:
    """Writes compact lists as a FiD json list, one question at a time. Returns the count."""
    # loaded as every command loads them: question fields, ids and columns checked
    lists = load_examples(lists_path, passages=passages).lists
    with atomic_path(output) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        handle.write("[")
        for q in range(len(lists)):
            ctxs = lists.ctx_fields(q)
            stored = passages.get([c["id"] for c in ctxs], str(lists_path))
            full = [
                {"id": c["id"], "title": p.title, "text": p.text, **c}
                for c, p in zip(ctxs, stored, strict=True)
            ]
            record = {**lists.fields[q], "ctxs": full}
            handle.write(("\n" if q == 0 else ",\n") + json.dumps(record, ensure_ascii=False))
        handle.write("\n]\n")
    return len(lists)


def convert_lists(input_path: Path, passages_path: Path, output: Path) -> str:
    """`fid convert-lists`: writes `input_path` in the other format.

    Args:
        input_path: FiD json(l) with texts, or compact lists.
        passages_path: the passage store folder (or TSV) of the corpus the passages come from.
        output: the file to write (compact lists from FiD json, a FiD json list from compact).

    Returns:
        The format written: "compact" or "fid_json".

    Raises:
        DataError: a malformed input, compact lists of another corpus, or a FiD passage whose
            id the store lacks or whose text differs from the store's.
    """
    passages = open_passages(passages_path)
    if is_compact_lists(input_path):
        n = export_fid_json(input_path, passages, output)
        written = "fid_json"
    else:
        records = [{**e.record, "id": e.id} for e in load_examples(input_path)]
        _check_texts(records, passages, input_path)
        write_lists(output, lists_from_records(records, passages.fingerprint))
        n, written = len(records), "compact"
    logger.info("wrote %d questions of %s as %s lists into %s", n, input_path, written, output)
    return written
