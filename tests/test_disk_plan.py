"""The disk plan's arithmetic (fid/memory/disk_sizes.py) and its check
(fid.runtime.disk_plan): faiss's own code sizes, the kept checkpoints, tar members read from their archive, and what a
file system still needs when part of the run is there."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import faiss
import numpy as np
import pytest

import fid.memory.disk_sizes as sizes
from fid.runtime.disk_plan import DiskRow, file_systems, folder_bytes, format_plan, short


@pytest.mark.parametrize("factory", ["Flat", "IVF16,PQ4", "HNSW8", "OPQ4_16,IVF16,PQ4"])
def test_index_bytes_equal_what_faiss_writes(tmp_path, factory):
    """The planned index of 2,000 vectors against faiss's own file, within the 20% the
    workflow's plan promises (its fixed parts: headers, the OPQ matrix, HNSW's upper levels)."""
    n, dim = 2000, 16
    vectors = np.random.default_rng(0).standard_normal((n, dim)).astype("float32")
    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    index.train(vectors)
    index.add(vectors)
    faiss.write_index(index, str(tmp_path / "index.faiss"))
    ids = np.array([f"p{i}" for i in range(n)])
    np.save(tmp_path / "ids.npy", ids)
    corpus = sizes.Corpus(n, 100, len(ids[-1]))
    planned, basis = sizes.index_bytes(corpus, dim, factory, rerank=False)
    held = folder_bytes(tmp_path)
    assert abs(planned - held) <= 0.2 * held, (planned, held, basis)


def test_kept_checkpoints():
    assert sizes.kept_checkpoints(15000, 500, 2) == 2
    assert sizes.kept_checkpoints(3, 3, 2) == 1  # one save before the end
    assert sizes.kept_checkpoints(10, 0, 2) == 1  # only at the end


def test_a_tar_member_is_read_from_its_archive(tmp_path):
    archive = tmp_path / "a.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("NQ.dev.idx.json")
        info.size = 1234
        tar.addfile(info, io.BytesIO(b"x" * 1234))
    assert sizes.extracted_bytes(archive, None, "NQ.dev.idx.json")[0] == 1234
    assert sizes.extracted_bytes(tmp_path / "absent.tar.gz", None, "x")[0] is None
    assert sizes.extracted_bytes(archive, 100, None)[0] == int(100 * sizes.GZIP_TEXT_RATIO)


def test_a_corpus_is_measured_when_it_is_there(tmp_path):
    path = tmp_path / "psgs.tsv"
    path.write_text("id\ttext\ttitle\n" + "".join(f"{i}\tsome text\tT\n" for i in range(1, 101)))
    corpus = sizes.corpus(path, None)
    assert corpus.passages == 100 and corpus.id_chars == 3
    assert sizes.corpus(tmp_path / "absent.tsv", 620_000).passages == 1000


def test_a_file_system_needs_only_what_is_not_there(tmp_path):
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "f").write_bytes(b"\0" * 1000)
    rows = [DiskRow("done", str(tmp_path / "done"), 1500, "x"),
            DiskRow("todo", str(tmp_path / "todo" / "deeper"), 700, "y"),
            DiskRow("unknown", str(tmp_path / "u"), None, "?")]  # fmt: skip
    (system,) = file_systems(rows)
    assert system.needed == 500 + 700 and not short(file_systems(rows))
    table = format_plan(rows, [system])
    assert "unknown" in table and "?" in table and "fits" in table
    huge = [DiskRow("huge", str(tmp_path / "h"), 10**18, "z")]
    assert short(file_systems(huge)) and "DOES NOT FIT" in format_plan(huge, file_systems(huge))


# ---------------------------------------------------------------- `fid plan-disk`
SQUAD = Path(__file__).parents[1] / "samples" / "squad-open-tiny"


def _planned(capsys) -> float:
    """The planned total `fid plan-disk` printed, in bytes."""
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("total"))
    value, unit = line.split()[1:3]
    return float(value) * {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]


def test_plan_disk_of_bm25_and_its_lists_equals_what_they_write(tmp_path, capsys):
    """Planned on real Wikipedia text (the corpus's own statistics), then built: within 20%."""
    from fid.cli import main

    passages, questions = SQUAD / "psgs_w100.tsv", SQUAD / "questions.jsonl"
    assert main(["plan-disk", "--for", "build-bm25", "--passages", str(passages)]) == 0
    planned = _planned(capsys)
    assert main(["build-bm25", "--passages", str(passages), "--output", str(tmp_path / "i")]) == 0
    held = folder_bytes(tmp_path / "i")
    assert abs(planned - held) <= 0.2 * held, (planned, held)
    capsys.readouterr()
    assert main(["plan-disk", "--for", "retrieve-bm25", "--passages", str(passages),
                 "--questions", str(questions)]) == 0  # fmt: skip
    planned = _planned(capsys)
    assert main(["retrieve-bm25", "--index", str(tmp_path / "i"), "--passages", str(passages),
                 "--questions", str(questions), "--output", str(tmp_path / "l.json")]) == 0  # fmt: skip
    held = folder_bytes(tmp_path / "l.json")
    assert abs(planned - held) <= 0.2 * held, (planned, held)


def test_plan_disk_refuses_what_does_not_fit_and_names_a_missing_input(tmp_path, capsys):
    """A thousand t5-base checkpoints (2.7 PB) fit nowhere: exit 1 with the table."""
    from fid.cli import main

    config = tmp_path / "reader.yaml"
    config.write_text("max_steps: 1000000\nsave_every_steps: 1\nkeep_last_checkpoints: 1000000\n")
    code = main(["plan-disk", "--for", "train-reader", "--model", "t5-base", "--config",
                 str(config), "--where", str(tmp_path)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 1 and "DOES NOT FIT" in out and "1000000 checkpoints" in out
    assert main(["plan-disk", "--for", "embed-passages", "--model", "t5-base"]) != 0
    assert main(["plan-disk", "--for", "build-bm25", "--passages", str(tmp_path / "no.tsv")]) != 0


def test_disk_plan_of_bm25_statistics_equals_what_they_write(tmp_path):
    """The sharded index's statistics folder (vocabulary, df and the tokenized corpus its
    shards read) as the workflow's disk plan sizes it: within 20% on real Wikipedia text."""
    from fid.config import BM25Config
    from fid.memory.disk_sizes import TextStats, bm25_stats_bytes, corpus
    from fid.retrieval.bm25 import text_statistics
    from fid.retrieval.bm25_stats import count_corpus_stats

    passages, cfg = SQUAD / "psgs_w100.tsv", BM25Config()
    text = TextStats(**text_statistics(passages, cfg))
    planned, _ = bm25_stats_bytes(corpus(passages, None), text)
    count_corpus_stats(passages, tmp_path / "stats", cfg)
    held = folder_bytes(tmp_path / "stats")
    assert abs(planned - held) <= 0.2 * held, (planned, held)
